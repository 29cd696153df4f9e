//! The YAML tree: nodes that keep what kpt keeps (comments, key order, scalar
//! styles, anchors, explicit tags), so a package can be changed and written
//! back the way `kpt fn render` writes it.

/// How a scalar was written, or whether a collection is in flow style.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Style {
    /// Plain scalar or block collection.
    #[default]
    Plain,
    SingleQuoted,
    DoubleQuoted,
    /// `|`
    Literal,
    /// `>`
    Folded,
    /// `[a, b]` / `{a: b}`
    Flow,
}

/// The content of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Scalar(String),
    Sequence(Vec<Node>),
    Mapping(Vec<(Node, Node)>),
    /// `*name`
    Alias(String),
}

/// One YAML node with its presentation.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub value: Value,
    pub style: Style,
    /// The tag as written (`!!str`, `!custom`), or the tag a function asked for
    /// (`!!str` for string values it sets). `None`: resolved from the value.
    pub tag: Option<String>,
    /// Whether the tag was written in the source and must be written back.
    pub explicit_tag: bool,
    pub anchor: Option<String>,
    /// Comment lines before the node, each starting with `#`.
    pub head_comment: Vec<String>,
    /// The comment after the node on its line, starting with `#`.
    pub line_comment: Option<String>,
    /// Comment lines after the node's content, each starting with `#`.
    pub foot_comment: Vec<String>,
}

/// The tag of string scalars.
pub const STR_TAG: &str = "!!str";

impl Default for Node {
    fn default() -> Self {
        Node::null()
    }
}

impl Node {
    fn with_value(value: Value) -> Self {
        Node {
            value,
            style: Style::Plain,
            tag: None,
            explicit_tag: false,
            anchor: None,
            head_comment: Vec::new(),
            line_comment: None,
            foot_comment: Vec::new(),
        }
    }

    /// A plain scalar whose type is resolved from its text (`1`, `true`, `x`).
    pub fn plain(value: impl Into<String>) -> Self {
        Node::with_value(Value::Scalar(value.into()))
    }

    /// A string scalar: written plain when that reads back as the same string,
    /// double-quoted otherwise (`"1"`, `"true"`), as kyaml does.
    pub fn string(value: impl Into<String>) -> Self {
        let mut node = Node::plain(value);
        node.tag = Some(STR_TAG.to_owned());
        node
    }

    /// An empty plain scalar: YAML null.
    pub fn null() -> Self {
        Node::plain("")
    }

    /// An empty block mapping.
    pub fn mapping() -> Self {
        Node::with_value(Value::Mapping(Vec::new()))
    }

    /// An empty block sequence.
    pub fn sequence() -> Self {
        Node::with_value(Value::Sequence(Vec::new()))
    }

    /// The scalar text, if this is a scalar.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// Whether this is a null scalar (`~`, `null`, empty plain).
    pub fn is_null(&self) -> bool {
        match &self.value {
            Value::Scalar(s) => {
                self.style == Style::Plain
                    && self.tag.as_deref().is_none_or(|t| t == "!!null")
                    && matches!(s.as_str(), "" | "~" | "null" | "Null" | "NULL")
            }
            _ => false,
        }
    }

    pub fn as_mapping(&self) -> Option<&Vec<(Node, Node)>> {
        match &self.value {
            Value::Mapping(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_mapping_mut(&mut self) -> Option<&mut Vec<(Node, Node)>> {
        match &mut self.value {
            Value::Mapping(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_sequence(&self) -> Option<&Vec<Node>> {
        match &self.value {
            Value::Sequence(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_sequence_mut(&mut self) -> Option<&mut Vec<Node>> {
        match &mut self.value {
            Value::Sequence(s) => Some(s),
            _ => None,
        }
    }

    /// The value of a mapping key.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_mapping()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        self.as_mapping_mut()?
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// The node at a path of mapping keys.
    pub fn lookup(&self, path: &[&str]) -> Option<&Node> {
        path.iter().try_fold(self, |node, key| node.get(key))
    }

    pub fn lookup_mut(&mut self, path: &[&str]) -> Option<&mut Node> {
        let mut node = self;
        for key in path {
            node = node.get_mut(key)?;
        }
        Some(node)
    }

    /// The scalar text at a path, when it is a non-null scalar.
    pub fn str_at(&self, path: &[&str]) -> Option<&str> {
        self.lookup(path)
            .filter(|n| !n.is_null())
            .and_then(Node::as_str)
    }

    /// Sets a key of a mapping, keeping the key's position and comments when it
    /// exists and appending it otherwise. Does nothing on a non-mapping.
    pub fn set(&mut self, key: &str, value: Node) {
        let Some(entries) = self.as_mapping_mut() else {
            return;
        };
        if let Some((_, existing)) = entries.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
            let head = std::mem::take(&mut existing.head_comment);
            let line = existing.line_comment.take();
            let foot = std::mem::take(&mut existing.foot_comment);
            *existing = value;
            if existing.head_comment.is_empty() {
                existing.head_comment = head;
            }
            if existing.line_comment.is_none() {
                existing.line_comment = line;
            }
            if existing.foot_comment.is_empty() {
                existing.foot_comment = foot;
            }
        } else {
            entries.push((Node::plain(key), value));
        }
    }

    /// Sets a scalar value in place, keeping comments; replaces a non-scalar.
    pub fn set_string(&mut self, value: &str) {
        if self.as_str() == Some(value) && !self.is_null() {
            return;
        }
        self.value = Value::Scalar(value.to_owned());
        self.style = Style::Plain;
        self.tag = Some(STR_TAG.to_owned());
        self.explicit_tag = false;
    }

    /// The mapping at `key`, created (empty) when missing or null.
    /// Returns `None` when `self` is not a mapping or `key` holds a non-mapping.
    pub fn mapping_at(&mut self, key: &str) -> Option<&mut Node> {
        let entries = self.as_mapping_mut()?;
        let index = match entries.iter().position(|(k, _)| k.as_str() == Some(key)) {
            Some(i) => {
                if entries[i].1.is_null() {
                    let comments = std::mem::take(&mut entries[i].1.line_comment);
                    entries[i].1 = Node::mapping();
                    entries[i].1.line_comment = comments;
                }
                i
            }
            None => {
                entries.push((Node::plain(key), Node::mapping()));
                entries.len() - 1
            }
        };
        let node = &mut entries[index].1;
        node.as_mapping().is_some().then_some(node)
    }

    /// Removes a key from a mapping, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<Node> {
        let entries = self.as_mapping_mut()?;
        let index = entries.iter().position(|(k, _)| k.as_str() == Some(key))?;
        Some(entries.remove(index).1)
    }

    /// Visits every scalar of the tree (keys excluded) with its dotted path.
    pub fn walk_scalars_mut(&mut self, f: &mut dyn FnMut(&str, &mut Node)) {
        fn walk(node: &mut Node, path: &mut String, f: &mut dyn FnMut(&str, &mut Node)) {
            match &mut node.value {
                Value::Scalar(_) | Value::Alias(_) => f(path, node),
                Value::Sequence(items) => {
                    for (i, item) in items.iter_mut().enumerate() {
                        let len = path.len();
                        path.push_str(&format!("[{i}]"));
                        walk(item, path, f);
                        path.truncate(len);
                    }
                }
                Value::Mapping(entries) => {
                    for (k, v) in entries.iter_mut() {
                        let len = path.len();
                        if !path.is_empty() {
                            path.push('.');
                        }
                        path.push_str(k.as_str().unwrap_or(""));
                        walk(v, path, f);
                        path.truncate(len);
                    }
                }
            }
        }
        walk(self, &mut String::new(), f);
    }
}
