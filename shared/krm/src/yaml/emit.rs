//! [`Node`] trees to text, formatted as kpt formats package files: two-space
//! indentation, no line wrapping, sequences compact or wide per document,
//! scalar styles kept unless the value cannot be written in them, folded
//! scalars written double-quoted, comments on their nodes, blank lines gone.

use super::node::{Node, STR_TAG, Style, Value};
use super::resolve::{is_base60_float, is_old_bool, resolve_plain};

/// How block sequences are indented under their key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SeqIndent {
    /// `- x` at the key's indentation.
    #[default]
    Compact,
    /// `- x` two spaces deeper than the key.
    Wide,
}

impl SeqIndent {
    /// The value of kpt's `internal.config.kubernetes.io/seqindent`.
    pub fn as_str(self) -> &'static str {
        match self {
            SeqIndent::Compact => "compact",
            SeqIndent::Wide => "wide",
        }
    }

    pub fn from_annotation(value: &str) -> Self {
        if value == "wide" {
            SeqIndent::Wide
        } else {
            SeqIndent::Compact
        }
    }

    /// The style of a document's text, as kyaml derives it: that of the
    /// first block sequence item whose key line (the line above it,
    /// comment lines skipped, a trailing comment dropped) ends in `:` at
    /// the same indent (compact) or two less (wide); compact when none is.
    pub fn derive(text: &str) -> Self {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            // an empty item is written as a bare `-`: counted too, or a
            // document whose first item is empty would change style
            let Some(spaces) = line
                .split_once("- ")
                .map(|(spaces, _)| spaces)
                .or_else(|| line.strip_suffix('-'))
            else {
                continue;
            };
            if !spaces.chars().all(|c| c == ' ') {
                continue;
            }
            let Some(key_line) = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim_matches(' ').starts_with('#'))
                .map(|l| l.split('#').next().unwrap_or(""))
            else {
                continue;
            };
            let key = key_line.trim_matches(' ');
            // kyaml also wants a single `:` on the line; a key written after
            // an anchor ending in `:` (`k: &a:`) would then change the style
            // of a document each time it is written
            if !key.ends_with(':') {
                continue;
            }
            // the key's column: a key in an item (`- k:`) starts after its
            // dash, or a compact sequence under it would read as wide, be
            // written wide, and read as compact again
            let key_indent = {
                let mut rest = key_line.trim_start_matches(' ');
                while let Some(after) = rest.strip_prefix("- ") {
                    rest = after.trim_start_matches(' ');
                }
                key_line.len() - rest.len()
            };
            match spaces.len().checked_sub(key_indent) {
                Some(0) => return SeqIndent::Compact,
                Some(2) => return SeqIndent::Wide,
                _ => {}
            }
        }
        SeqIndent::Compact
    }
}

/// Writes one document (without a `---` separator).
pub fn emit_document(root: &Node, seq: SeqIndent) -> String {
    let mut e = Emitter {
        out: String::new(),
        seq,
        keep_end: usize::MAX,
    };
    e.comments(&root.head_comment, 0);
    match &root.value {
        Value::Mapping(entries) if !entries.is_empty() && root.style != Style::Flow => {
            e.properties_line(root);
            e.mapping(entries, 0, false);
        }
        Value::Sequence(items) if !items.is_empty() && root.style != Style::Flow => {
            e.properties_line(root);
            e.sequence(items, 0, false);
        }
        _ => {
            // a block scalar's body indented, or a comment after it at
            // column 0 would be read as more of its lines
            let text = e.inline(root, 2, false);
            match text.split_once('\n') {
                Some((header, body)) if is_block_scalar(root, &text) => {
                    e.out.push_str(header);
                    e.line_comment(root.line_comment.as_deref());
                    e.out.push('\n');
                    e.out.push_str(body);
                    e.kept_breaks(header);
                }
                _ => {
                    e.out.push_str(&text);
                    e.line_comment(root.line_comment.as_deref());
                    e.out.push('\n');
                }
            }
        }
    }
    e.comments(&root.foot_comment, 0);
    e.out
}

/// Writes documents separated by `---` lines, each as it reads back (see
/// [`emit_settled`]): what a package write produces, the next write of what
/// was read from it produces again.
pub fn emit_documents<'a>(docs: impl IntoIterator<Item = (&'a Node, SeqIndent)>) -> String {
    let mut out = String::new();
    for (i, (node, seq)) in docs.into_iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&emit_settled(node, seq));
    }
    out
}

/// Rounds of re-reading [`emit_settled`] allows; a text that still changes
/// after them is written as the last round left it.
const SETTLE_ROUNDS: usize = 4;

/// Writes one document the way its text reads back. Comments are kept on
/// the node they were read with, but a few placements (a comment after a
/// bare indicator, between properties and content) have more than one
/// reading: the written text then attaches such a comment to a
/// neighbouring node, and writing what was read from it would move the
/// comment a second time. Reading the text back (with the sequence style
/// derived from it, as a package read does) and writing again until the
/// text stops changing makes a write of the re-read document a no-op.
/// Values never change: every round writes what the last one read.
pub fn emit_settled(root: &Node, seq: SeqIndent) -> String {
    let mut text = emit_document(root, seq);
    for _ in 0..SETTLE_ROUNDS {
        let Ok(Some(reread)) = super::parse::parse_document(&text) else {
            break;
        };
        let again = emit_document(&reread, SeqIndent::derive(&text));
        if again == text {
            break;
        }
        text = again;
    }
    text
}

struct Emitter {
    out: String,
    seq: SeqIndent,
    /// Where the output ended after a block scalar that keeps its final
    /// line breaks (`|+`): a blank line written there would be read as
    /// one more of them.
    keep_end: usize,
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

/// Whether `text`, what [`Emitter::inline`] wrote for `node`, is a block
/// scalar: its header (`|`, `>`) after the node's anchor and tag.
fn is_block_scalar(node: &Node, text: &str) -> bool {
    text.strip_prefix(properties(node).as_str())
        .is_some_and(|rest| rest.trim_start().starts_with(['|', '>']))
}

fn is_block_collection(node: &Node) -> bool {
    node.style != Style::Flow
        && match &node.value {
            Value::Mapping(m) => !m.is_empty(),
            Value::Sequence(s) => !s.is_empty(),
            _ => false,
        }
}

impl Emitter {
    /// Notes the end of a block scalar written with `header`.
    fn kept_breaks(&mut self, header: &str) {
        if header.ends_with('+') {
            self.keep_end = self.out.len();
        }
    }

    fn comments(&mut self, lines: &[String], indent: usize) {
        for line in lines {
            if line.is_empty() {
                // a blank line right after `|+` would be its content
                if self.out.len() != self.keep_end {
                    self.out.push('\n');
                }
                continue;
            }
            pad(&mut self.out, indent);
            self.out.push_str(line);
            self.out.push('\n');
        }
    }

    fn line_comment(&mut self, comment: Option<&str>) {
        if let Some(c) = comment {
            self.out.push(' ');
            self.out.push_str(c);
        }
    }

    /// Anchor and tag of a block collection at the start of its line.
    fn properties_line(&mut self, node: &Node) {
        let props = properties(node);
        if !props.is_empty() {
            self.out.push_str(&props);
            self.out.push('\n');
        }
    }

    fn mapping(&mut self, entries: &[(Node, Node)], indent: usize, inline_first: bool) {
        for (i, (key, value)) in entries.iter().enumerate() {
            let complex = needs_complex_key(key);
            if !(inline_first && i == 0) {
                self.comments(&key.head_comment, indent);
                if complex {
                    self.comments(explicit_line_comment(key), indent);
                }
                pad(&mut self.out, indent);
            }
            if complex {
                self.explicit('?', key, indent);
                // a comment between the key and its `:` is read as the
                // value's head
                self.comments(&value.head_comment, indent);
                self.comments(explicit_line_comment(value), indent);
                pad(&mut self.out, indent);
                self.explicit(':', value, indent);
            } else {
                let key_text = self.inline(key, indent, true);
                self.out.push_str(&key_text);
                self.out.push(':');
                self.value(value, key, indent, indent + 2);
            }
            self.comments(&key.foot_comment, indent);
            self.comments(&value.foot_comment, indent);
        }
    }

    /// One half of an explicit entry, `? key` or `: value`, after its head
    /// comments and [`explicit_line_comment`] were written on the lines
    /// above: a comment written again after the indicator would be read
    /// back as a second head comment, and one after a bare indicator (the
    /// line of a block collection) would not be read back at all.
    fn explicit(&mut self, indicator: char, node: &Node, indent: usize) {
        self.out.push(indicator);
        let mut bare = node.clone();
        bare.head_comment.clear();
        if is_block_collection(node) {
            bare.line_comment = None;
        }
        self.value(&bare, &Node::null(), indent, indent + 2);
    }

    /// A mapping value or sequence item after its `key:` / `-`.
    fn value(&mut self, value: &Node, key: &Node, indent: usize, content_indent: usize) {
        if is_block_collection(value) {
            let props = properties(value);
            if !props.is_empty() {
                self.out.push(' ');
                self.out.push_str(&props);
            }
            self.line_comment(
                key.line_comment
                    .as_deref()
                    .or(value.line_comment.as_deref()),
            );
            self.out.push('\n');
            match &value.value {
                Value::Mapping(entries) => {
                    self.comments(&value.head_comment, content_indent);
                    self.mapping(entries, content_indent, false);
                }
                Value::Sequence(items) => {
                    let seq_indent = match self.seq {
                        SeqIndent::Compact => indent,
                        SeqIndent::Wide => indent + 2,
                    };
                    self.comments(&value.head_comment, seq_indent);
                    self.sequence(items, seq_indent, false);
                }
                _ => {}
            }
            return;
        }
        let text = self.inline(value, content_indent, false);
        if !text.is_empty() {
            self.out.push(' ');
        }
        match text.split_once('\n') {
            // A block scalar: the comment goes after its header.
            Some((header, body)) if is_block_scalar(value, &text) => {
                self.out.push_str(header);
                self.line_comment(
                    value
                        .line_comment
                        .as_deref()
                        .or(key.line_comment.as_deref()),
                );
                self.out.push('\n');
                self.out.push_str(body);
                self.kept_breaks(header);
            }
            _ => {
                self.out.push_str(&text);
                self.line_comment(
                    value
                        .line_comment
                        .as_deref()
                        .or(key.line_comment.as_deref()),
                );
                self.out.push('\n');
            }
        }
    }

    fn sequence(&mut self, items: &[Node], indent: usize, inline_first: bool) {
        for (i, item) in items.iter().enumerate() {
            if !(inline_first && i == 0) {
                self.comments(&item.head_comment, indent);
                pad(&mut self.out, indent);
            }
            self.out.push('-');
            match &item.value {
                Value::Mapping(entries) if is_block_collection(item) => {
                    self.out.push(' ');
                    let props = properties(item);
                    if props.is_empty() {
                        self.mapping(entries, indent + 2, true);
                    } else {
                        self.out.push_str(&props);
                        self.line_comment(item.line_comment.as_deref());
                        self.out.push('\n');
                        self.mapping(entries, indent + 2, false);
                    }
                }
                Value::Sequence(children) if is_block_collection(item) => {
                    let props = properties(item);
                    self.out.push(' ');
                    if props.is_empty() {
                        self.sequence(children, indent + 2, true);
                    } else {
                        self.out.push_str(&props);
                        self.line_comment(item.line_comment.as_deref());
                        self.out.push('\n');
                        self.sequence(children, indent + 2, false);
                    }
                }
                _ => {
                    let empty_key = Node::null();
                    self.value(item, &empty_key, indent, indent + 2);
                }
            }
            self.comments(&item.foot_comment, indent);
        }
    }

    /// A node on one line (scalars, aliases, flow or empty collections); block
    /// scalars return their header, a newline and their indented body.
    fn inline(&mut self, node: &Node, indent: usize, simple_key: bool) -> String {
        let mut out = properties(node);
        let body = match &node.value {
            Value::Alias(name) => format!("*{name}"),
            Value::Scalar(value) => scalar(node, value, indent, false, simple_key),
            Value::Mapping(_) | Value::Sequence(_) => flow(node),
        };
        if !out.is_empty() && !body.is_empty() {
            out.push(' ');
        }
        out.push_str(&body);
        out
    }
}

/// The line comment of a block collection in an explicit entry, which is
/// written above its `?` or `:` as one more head comment.
fn explicit_line_comment(node: &Node) -> &[String] {
    match &node.line_comment {
        Some(comment) if is_block_collection(node) => std::slice::from_ref(comment),
        _ => &[],
    }
}

/// Keys that cannot be written as `key:` (libyaml's simple key check).
fn needs_complex_key(key: &Node) -> bool {
    let props = properties(key).len();
    match &key.value {
        Value::Scalar(v) => v.contains('\n') || props + v.len() > 128,
        Value::Alias(name) => props + name.len() > 128,
        Value::Mapping(m) => !m.is_empty(),
        Value::Sequence(s) => !s.is_empty(),
    }
}

/// `&anchor !tag`, as written before a node.
fn properties(node: &Node) -> String {
    let mut out = String::new();
    if let Some(anchor) = &node.anchor {
        out.push('&');
        out.push_str(anchor);
    }
    if node.explicit_tag
        && let Some(tag) = &node.tag
    {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(tag);
    }
    out
}

fn flow(node: &Node) -> String {
    match &node.value {
        Value::Sequence(items) => {
            let parts: Vec<String> = items.iter().map(flow_item).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Mapping(entries) => {
            let parts: Vec<String> = entries
                .iter()
                .map(|(k, v)| {
                    // a key too long for `key:` (parsers refuse implicit keys
                    // over 1024 characters) is written explicitly, as libyaml does
                    let key = if needs_complex_key(k) {
                        format!("? {}", flow_key(k))
                    } else {
                        flow_key(k)
                    };
                    let value = flow_item(v);
                    if value.is_empty() {
                        format!("{key}:")
                    } else {
                        format!("{key}: {value}")
                    }
                })
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::Scalar(v) => scalar(node, v, 0, true, false),
        Value::Alias(name) => format!("*{name}"),
    }
}

fn with_properties(node: &Node, body: String) -> String {
    let props = properties(node);
    match (props.is_empty(), body.is_empty()) {
        (true, _) => body,
        (false, true) => props,
        (false, false) => format!("{props} {body}"),
    }
}

fn flow_item(node: &Node) -> String {
    let body = match &node.value {
        Value::Scalar(v) => scalar(node, v, 0, true, false),
        _ => flow(node),
    };
    with_properties(node, body)
}

fn flow_key(node: &Node) -> String {
    let body = match &node.value {
        Value::Scalar(v) => scalar(node, v, 0, true, true),
        _ => flow(node),
    };
    with_properties(node, body)
}

struct Analysis {
    flow_plain: bool,
    block_plain: bool,
    single_quoted: bool,
    block: bool,
}

fn is_printable(c: char) -> bool {
    matches!(c, '\n' | '\u{85}')
        || ('\u{20}'..='\u{7e}').contains(&c)
        || ('\u{a0}'..='\u{d7ff}').contains(&c)
        || (('\u{e000}'..='\u{fffd}').contains(&c) && c != '\u{feff}')
        || c >= '\u{10000}'
}

fn is_break(c: char) -> bool {
    matches!(c, '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_blank_or_end(c: Option<char>) -> bool {
    match c {
        None => true,
        Some(c) => c == ' ' || c == '\t' || is_break(c),
    }
}

/// libyaml's scalar analysis: which styles can hold the value.
fn analyze(value: &str) -> Analysis {
    if value.is_empty() {
        return Analysis {
            flow_plain: false,
            block_plain: true,
            single_quoted: true,
            block: false,
        };
    }
    let mut block_indicators = false;
    let mut flow_indicators = false;
    if value.starts_with("---") || value.starts_with("...") {
        block_indicators = true;
        flow_indicators = true;
    }
    let (mut line_breaks, mut special) = (false, false);
    let (mut leading_space, mut leading_break, mut trailing_space, mut trailing_break) =
        (false, false, false, false);
    let (mut break_space, mut space_break) = (false, false);
    let (mut previous_space, mut previous_break) = (false, false);
    let chars: Vec<char> = value.chars().collect();
    let mut preceded_by_whitespace = true;
    for (i, &c) in chars.iter().enumerate() {
        let next = chars.get(i + 1).copied();
        let followed_by_whitespace = is_blank_or_end(next);
        let first = i == 0;
        let last = i + 1 == chars.len();
        if first {
            match c {
                '#' | ',' | '[' | ']' | '{' | '}' | '&' | '*' | '!' | '|' | '>' | '\'' | '"'
                | '%' | '@' | '`' => {
                    flow_indicators = true;
                    block_indicators = true;
                }
                '?' | ':' => {
                    flow_indicators = true;
                    if followed_by_whitespace {
                        block_indicators = true;
                    }
                }
                '-' if followed_by_whitespace => {
                    flow_indicators = true;
                    block_indicators = true;
                }
                _ => {}
            }
        } else {
            match c {
                ',' | '?' | '[' | ']' | '{' | '}' => flow_indicators = true,
                ':' => {
                    flow_indicators = true;
                    if followed_by_whitespace {
                        block_indicators = true;
                    }
                }
                '#' if preceded_by_whitespace => {
                    flow_indicators = true;
                    block_indicators = true;
                }
                _ => {}
            }
        }
        if !is_printable(c) {
            special = true;
        }
        if is_break(c) {
            line_breaks = true;
        }
        if c == ' ' {
            if first {
                leading_space = true;
            }
            if last {
                trailing_space = true;
            }
            if previous_break {
                break_space = true;
            }
            previous_space = true;
            previous_break = false;
        } else if is_break(c) {
            if first {
                leading_break = true;
            }
            if last {
                trailing_break = true;
            }
            if previous_space {
                space_break = true;
            }
            previous_break = true;
            previous_space = false;
        } else {
            previous_space = false;
            previous_break = false;
        }
        preceded_by_whitespace = c == ' ' || c == '\t' || is_break(c);
    }
    let mut a = Analysis {
        flow_plain: true,
        block_plain: true,
        single_quoted: true,
        block: true,
    };
    if leading_space || leading_break || trailing_space || trailing_break {
        a.flow_plain = false;
        a.block_plain = false;
    }
    if trailing_space {
        a.block = false;
    }
    if break_space {
        a.flow_plain = false;
        a.block_plain = false;
        a.single_quoted = false;
    }
    if space_break || special {
        a.flow_plain = false;
        a.block_plain = false;
        a.single_quoted = false;
        a.block = false;
    }
    if line_breaks {
        a.flow_plain = false;
        a.block_plain = false;
    }
    if flow_indicators {
        a.flow_plain = false;
    }
    if block_indicators {
        a.block_plain = false;
    }
    a
}

/// The style a scalar is written in.
fn select_style(node: &Node, value: &str, flow: bool, simple_key: bool) -> Style {
    let mut force_quoting = false;
    if let Some(tag) = node.tag.as_deref()
        && !node.explicit_tag
        && tag == STR_TAG
        && node.style == Style::Plain
    {
        let resolved = resolve_plain(value);
        if resolved != STR_TAG || is_old_bool(value) || is_base60_float(value) {
            force_quoting = true;
        }
    }
    let mut style = match node.style {
        Style::Plain | Style::Flow if value.contains('\n') => Style::Literal,
        Style::Plain | Style::Flow if force_quoting => Style::DoubleQuoted,
        Style::Flow => Style::Plain,
        // The YAML library kpt uses writes folded scalars double-quoted.
        Style::Folded => Style::DoubleQuoted,
        other => other,
    };
    let a = analyze(value);
    if style == Style::Plain {
        if (flow && !a.flow_plain) || (!flow && !a.block_plain) {
            style = Style::SingleQuoted;
        }
        if value.is_empty() && (flow || simple_key) {
            style = Style::SingleQuoted;
        }
    }
    if style == Style::SingleQuoted && !a.single_quoted {
        style = Style::DoubleQuoted;
    }
    if style == Style::Literal && (!a.block || flow || simple_key) {
        style = Style::DoubleQuoted;
    }
    style
}

fn scalar(node: &Node, value: &str, indent: usize, flow: bool, simple_key: bool) -> String {
    // An empty plain scalar is a null. kpt's YAML library writes it as `''`
    // where it cannot be left empty (`{b}` becomes `{b: ''}`), which turns
    // a null value into an empty string; `null` keeps the value. Keys keep
    // `''`: a key is read as a string either way.
    if value.is_empty()
        && node.tag.is_none()
        && matches!(node.style, Style::Plain | Style::Flow)
        && flow
        && !simple_key
    {
        return "null".to_owned();
    }
    match select_style(node, value, flow, simple_key) {
        Style::SingleQuoted => single_quoted(value, indent),
        Style::DoubleQuoted => double_quoted(value),
        Style::Literal => literal(value, indent),
        // The YAML library kpt uses writes the merge key with its tag.
        _ if value == "<<" && node.tag.is_none() => "!!merge <<".to_owned(),
        _ => value.to_owned(),
    }
}

fn single_quoted(value: &str, indent: usize) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    let mut breaks = false;
    for c in value.chars() {
        if is_break(c) {
            if !breaks && c == '\n' {
                out.push('\n');
            }
            out.push('\n');
            breaks = true;
        } else {
            if breaks {
                pad(&mut out, indent);
                breaks = false;
            }
            if c == '\'' {
                out.push('\'');
            }
            out.push(c);
        }
    }
    out.push('\'');
    out
}

fn double_quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if !is_printable(c) || c == '\u{feff}' || is_break(c) || c == '"' || c == '\\' {
            out.push('\\');
            match c {
                '\0' => out.push('0'),
                '\u{7}' => out.push('a'),
                '\u{8}' => out.push('b'),
                '\t' => out.push('t'),
                '\n' => out.push('n'),
                '\u{b}' => out.push('v'),
                '\u{c}' => out.push('f'),
                '\r' => out.push('r'),
                '\u{1b}' => out.push('e'),
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                '\u{85}' => out.push('N'),
                '\u{a0}' => out.push('_'),
                '\u{2028}' => out.push('L'),
                '\u{2029}' => out.push('P'),
                c if (c as u32) <= 0xff => out.push_str(&format!("x{:02X}", c as u32)),
                c if (c as u32) <= 0xffff => out.push_str(&format!("u{:04X}", c as u32)),
                c => out.push_str(&format!("U{:08X}", c as u32)),
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

fn literal(value: &str, indent: usize) -> String {
    let mut out = String::from("|");
    if value.starts_with(' ') || value.starts_with('\n') {
        out.push('2');
    }
    let chars: Vec<char> = value.chars().collect();
    match chars.as_slice() {
        [] => out.push('-'),
        [.., last] if !is_break(*last) => out.push('-'),
        [_] => out.push('+'),
        [.., before, _] if is_break(*before) => out.push('+'),
        _ => {}
    }
    out.push('\n');
    let mut at_line_start = true;
    for c in chars {
        if is_break(c) {
            out.push('\n');
            at_line_start = true;
        } else {
            if at_line_start {
                pad(&mut out, indent);
                at_line_start = false;
            }
            out.push(c);
        }
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::yaml::{
        SeqIndent, emit_document, emit_documents, emit_settled, parse_documents, to_json,
    };

    fn round_trip(text: &str) -> (String, serde_json::Value, serde_json::Value) {
        let docs = parse_documents(text).expect("parses");
        let out = emit_documents(docs.iter().map(|d| (&d.root, SeqIndent::derive(&d.text))));
        let again = parse_documents(&out).expect("what was written parses");
        (
            out,
            to_json(&docs[0].root).expect("JSON"),
            to_json(&again[0].root).expect("JSON"),
        )
    }

    #[test]
    fn tags_are_written_with_their_escapes_so_they_read_back_the_same() {
        for (text, tag) in [
            // a control character, a `%` and a flow indicator, escaped
            ("a: !x%0A%25y%2Cz v\n", "!x%0A%25y%2Cz"),
            ("a: !!x%01 v\n", "!!x%01"),
            (
                "a: !<tag:e.com,2000:a%7Fb[]> v\n",
                "!<tag:e.com,2000:a%7Fb[]>",
            ),
            (
                "a: !<tag:e.com,2000:%C3%A9> v\n",
                "!<tag:e.com,2000:%C3%A9>",
            ),
            ("a: ! v\n", "!"),
            ("a: !!str v\n", "!!str"),
        ] {
            let docs = parse_documents(text).expect("parses");
            let out = emit_documents(docs.iter().map(|d| (&d.root, SeqIndent::derive(&d.text))));
            assert!(
                !out.chars().any(|c| c.is_control() && c != '\n'),
                "{text:?} was written with a raw control character: {out:?}"
            );
            let again = parse_documents(&out).expect("what was written parses");
            let tag_of = |root: &crate::yaml::Node| match &root.value {
                crate::yaml::Value::Mapping(entries) => entries[0].1.tag.clone(),
                other => panic!("not a mapping: {other:?}"),
            };
            assert_eq!(tag_of(&docs[0].root).as_deref(), Some(tag), "{text:?}");
            assert_eq!(
                tag_of(&again[0].root).as_deref(),
                Some(tag),
                "{text:?} -> {out:?}"
            );
            let twice = emit_documents(again.iter().map(|d| (&d.root, SeqIndent::derive(&d.text))));
            assert_eq!(out, twice, "{text:?}");
        }
    }

    #[test]
    fn a_comment_under_an_empty_value_in_a_sequence_item_stays_put() {
        // the comment is the foot of `ports`, deeper than the next item's
        // dash: it was read as the next item's head on the second write
        // (the item's mapping starts at column 4) and moved left
        let text = "kind: A\nl:\n  - name: c\n    ports:\n     # note\n  - name: c2\n";
        let written = "kind: A\nl:\n  - name: c\n    ports:\n    # note\n  - name: c2\n";
        let once = round_trip(text).0;
        assert_eq!(once, written);
        assert_eq!(round_trip(&once).0, written);
        // a comment at the next item's dash stays its head comment
        let head = "l:\n  - a: 1\n  # about b\n  - b: 2\n";
        assert_eq!(round_trip(head).0, head);
    }

    #[test]
    fn a_block_scalar_with_an_anchor_or_a_tag_keeps_its_line_breaks() {
        // the header after `&a` was not recognised as a block scalar's, so
        // a line break was added after its body, and `|+` kept it
        for text in [
            "items:\n- &a |2+\n\nb: 1\n",
            "a: !!str |+\n  x\n\nb: 1\n",
            "a: &x |-\n  y\nb: 1\n",
        ] {
            let (out, before, after) = round_trip(text);
            assert_eq!(before, after, "{text:?} was written as {out:?}");
            assert_eq!(out, text);
        }
        // CR line breaks read as line breaks, written as LF
        let (out, before, after) = round_trip("items:\n- &a   |+\r\rr x:\n- b\n");
        assert_eq!(before, after, "written as {out:?}");
        assert_eq!(before["items"][0], "\n");
    }

    #[test]
    fn an_empty_item_after_a_comment_keeps_the_comment_where_it_was_written() {
        // an empty item's node is placed after the comment on its line;
        // its dash is where its comments are written
        let once = round_trip("k:\n- s:\n  # note\n- # after\n#x\n").0;
        assert_eq!(round_trip(&once).0, once);
        assert!(once.contains("  # note\n"), "{once:?}");
    }

    #[test]
    fn the_sequence_indent_is_derived_as_kyaml_does() {
        // `#ontainers:` looks like a key; the items are indented under
        // `spec:`, so the document is wide
        let text = "spec:\n  #ontainers:\n    - name: c\n      ports:\n        - 1\n";
        assert_eq!(SeqIndent::derive(text), SeqIndent::Wide);
        assert_eq!(SeqIndent::derive("a:\n  # c\n  - x\n"), SeqIndent::Wide);
        assert_eq!(SeqIndent::derive("a:\n# c\n- x\n"), SeqIndent::Compact);
        // a blank line is no key line
        assert_eq!(SeqIndent::derive("a:\n\n  - x\n"), SeqIndent::Compact);
        // a key after an anchor ending in `:` keeps the style it was read in
        let anchored = "p:\n  &a:\n    - x\n";
        let once = round_trip(anchored).0;
        assert_eq!(once, "p: &a:\n  - x\n");
        assert_eq!(round_trip(&once).0, once);
        let once = round_trip(text).0;
        assert_eq!(round_trip(&once).0, once);
        // a key in an item starts after its dash (fuzz finding: the style
        // flipped on every write)
        assert_eq!(SeqIndent::derive("- a\n- k:\n  - x\n"), SeqIndent::Compact);
        assert_eq!(SeqIndent::derive("- a\n- k:\n    - x\n"), SeqIndent::Wide);
        assert_eq!(SeqIndent::derive("- - k:\n    - x\n"), SeqIndent::Compact);
        let items = "- a\n- k:j:\n  - x\n";
        let once = round_trip(items).0;
        assert_eq!(round_trip(&once).0, once);
    }

    #[test]
    fn a_comment_between_a_complex_key_and_its_colon_is_kept() {
        // read as the head of the value, which was not written: the comment
        // was lost on the second write
        let write = |text: &str| {
            let docs = parse_documents(text).expect("parses");
            emit_documents(docs.iter().map(|d| (&d.root, SeqIndent::derive(&d.text))))
        };
        let once = write("a: 1\n? - b\n  # foo\n");
        assert_eq!(once, "a: 1\n?\n- b\n# foo\n:\n");
        assert_eq!(write(&once), once);
    }

    #[test]
    fn a_document_that_is_a_block_scalar_keeps_its_foot_comment_apart() {
        // written at column 0, the body took the comment after it in
        let (once, before, after) = round_trip("a\r\rb\r\n# c\n");
        assert_eq!(before, "a\nb");
        assert_eq!(after, before, "written as {once:?}");
        assert_eq!(once, "|-\n  a\n  b\n# c\n");
        assert_eq!(round_trip(&once).0, once);
    }

    #[test]
    fn explicit_entries_keep_their_comments_and_write_the_same_twice() {
        let write = |text: &str| {
            let docs = parse_documents(text).expect("parses");
            let json: Vec<_> = docs.iter().map(|d| to_json(&d.root).ok()).collect();
            let out = emit_documents(docs.iter().map(|d| (&d.root, SeqIndent::derive(&d.text))));
            (out, json)
        };
        let long = "k".repeat(130);
        for text in [
            // the fuzz finding: a block mapping key after a head comment
            "m:\n  a: 1 # c\n  # before\n  ? bels: {a: b}\n\nd: 1\n",
            "? a\n# c\n:\n  x: 1\n",
            "? # c\n  a: b\n: v\n",
            "? &k # c\n  a: b\n: # d\n  x: 1\n",
            "? - a # c\n  - b\n# d\n: - x\n",
            "- ? a: b\n  : c\n",
            "- x: 1\n  # c\n  ? a: b\n  # d\n  : c # e\n",
            "? |\n  multi\n  line\n: v # c\n",
            "? a: b\n  # foot\n: v\n# after\n",
            "? a:\n    ? b: c\n    # d\n    : e\n: f\n",
            &format!("# h\n? {long} # c\n# d\n: v # e\n"),
            // the fuzz finding: a foot comment above a `?` whose key starts
            // on the next line was read back as the key's head
            "m:\n  n: 1 # a\n  # f\n? # c\n n: \"2\"\nb: {x\n  y}\n",
            "m:\n  n: 1\n  # f\n? &k # c\n  # d\n  - x\n: v\n",
            "?\n  a: 1\n  # f\n: v\n",
            // after properties: kept as a head comment
            "- &a # c\n  x: 1\n",
            "&r # c\nx: 1\n",
            // an item that is a sequence keeps its anchor and tag
            "- &a # c\n  - x\n- *a\n",
            "- !!seq\n  - x: 1\n",
        ] {
            let (once, before) = write(text);
            let (twice, after) = write(&once);
            assert_eq!(after, before, "{text:?} was written as {once:?}");
            assert_eq!(twice, once, "{text:?} changed on a second write");
            for comment in text.split('#').skip(1) {
                let comment = comment.split('\n').next().unwrap_or_default();
                assert!(
                    once.contains(&format!("#{comment}\n")),
                    "{text:?} lost #{comment}: {once:?}"
                );
            }
        }
    }

    #[test]
    fn a_comment_after_a_bare_indicator_stays_after_it() {
        // it was read as the head of the value (or key), which is written
        // above the `:` (or `?`), so the comment moved up on a first write
        let long = "k".repeat(130);
        for text in [
            format!("? {long}\n:\n# c\n- x\n"),
            format!("? {long}\n# a\n:\n# c\n- '': # b\n- y # d\n"),
            format!("? {long}\n:\n  # c\n  a: 1\n"),
            format!("? {long}\n# c\n:\n- x\n"),
        ] {
            let (once, before, after) = round_trip(&text);
            assert_eq!(after, before, "{text:?} was written as {once:?}");
            assert_eq!(once, text);
        }
        // the same after a bare `?`, above a block collection key
        for text in ["?\n# c\n- x\n: v\n", "?\n  # c\n  a: 1\n: v\n"] {
            let docs = parse_documents(text).expect("parses");
            let once = emit_documents(docs.iter().map(|d| (&d.root, SeqIndent::derive(&d.text))));
            assert_eq!(once, text);
        }
    }

    #[test]
    fn no_blank_line_follows_a_block_scalar_that_keeps_its_line_breaks() {
        // the blank line of `|+` was read as its content and as a blank
        // before the comment too; written back, it was one more line break
        for (text, value) in [
            ("k: |2+\n\n# c\n", "\n"),
            ("k: |+\n  x\n\n# c\n", "x\n\n"),
            ("- |+\n  x\n\n# c\n", "x\n\n"),
        ] {
            let docs = parse_documents(text).expect("parses");
            let once = emit_documents(docs.iter().map(|d| (&d.root, SeqIndent::derive(&d.text))));
            let again = parse_documents(&once).expect("what was written parses");
            let json = to_json(&again[0].root).expect("JSON");
            let read = json.get("k").or_else(|| json.get(0)).cloned();
            assert_eq!(read, Some(serde_json::json!(value)), "{text:?} → {once:?}");
            assert_eq!(once, text);
        }
    }

    #[test]
    fn a_written_document_is_what_its_text_reads_back_to() {
        // reduced from a fuzz input: the comment under the empty key is
        // written at the key's value indent, read back as a foot comment of
        // the item and then written at column 0
        let text = "-\n :\n-\n &- #\n-\n  #\n e\n";
        let docs = parse_documents(text).expect("parses");
        let seq = SeqIndent::derive(&docs[0].text);
        let unsettled = emit_document(&docs[0].root, seq);
        let reread = parse_documents(&unsettled).expect("what was written parses");
        assert_ne!(
            emit_document(&reread[0].root, SeqIndent::derive(&unsettled)),
            unsettled,
            "the example no longer moves a comment; find another"
        );
        let settled = emit_settled(&docs[0].root, seq);
        let reread = parse_documents(&settled).expect("what was written parses");
        assert_eq!(
            emit_settled(&reread[0].root, SeqIndent::derive(&settled)),
            settled
        );
        assert_eq!(
            to_json(&reread[0].root).expect("JSON"),
            to_json(&docs[0].root).expect("JSON")
        );
        assert_eq!(settled.matches('#').count(), 2, "{settled:?}");
    }

    #[test]
    fn a_comment_after_a_bare_dash_stays_off_the_item() {
        // kyaml writes a resource's head comment after the dash of its
        // ResourceList item; read as the item's head, kpt would copy the
        // input's comment in beside it after each function
        for text in [
            "items:\n- # The web tier.\n  apiVersion: v1\n",
            "items:\n- a: 1\n- # The web tier.\n  apiVersion: v1\n",
            "- - # c\n    x: 1\n",
            "k:\n- - - # c\n      x: 1\n",
        ] {
            let docs = parse_documents(text).expect("parses");
            let out = emit_documents(docs.iter().map(|d| (&d.root, SeqIndent::derive(&d.text))));
            assert!(
                !out.lines().any(|l| l.trim_start().starts_with('#')),
                "{text:?} was written as {out:?}"
            );
            assert_eq!(
                round_trip(&out).0,
                out,
                "{text:?} changed on a second write"
            );
        }
    }

    #[test]
    fn a_comment_before_a_block_scalar_item_stays_with_the_item_before() {
        // the scalar's span starts at its body, so the comment was read as
        // the block scalar's head, not the foot of the key above it
        for text in [
            "a:\n- k:\n  # h\n- |-\n  x\n",
            "a:\n- k:\n  # h\n- >\n\n  x\n",
            "- k: v\n  # h\n- |+ # c\n  x\n",
        ] {
            let (once, before, after) = round_trip(text);
            assert_eq!(after, before, "{text:?} was written as {once:?}");
            assert!(
                once.contains("\n  # h\n"),
                "{text:?} was written as {once:?}"
            );
            assert_eq!(
                round_trip(&once).0,
                once,
                "{text:?} changed on a second write"
            );
        }
    }

    #[test]
    fn an_entry_is_placed_at_its_dash_or_question_mark_for_comments() {
        // the node after `- &a ` starts past its anchor: a comment between
        // two such items was read as the next one's head, then its foot
        for text in [
            "- &a\n  x\n  # h\n- &b y\n",
            "- !!str &a\n  x\n  # h\n- !t &b y\n",
            "k:\n- - &a x\n    # h\n  - &b y\n",
            // an empty item at the end of its line (`- -`) starts right
            // after its dash: a comment under it was read as the outer
            // item's foot
            "- a\n- -\n   # h\n# d\n",
            "- - -\n     # h\n",
            // the same for an explicit key and its `?`
            "- ? k\n  :\n  # h\n- &a y\n",
        ] {
            let (once, before, after) = round_trip(text);
            assert_eq!(after, before, "{text:?} was written as {once:?}");
            assert!(once.contains("# h"), "{text:?} was written as {once:?}");
            assert_eq!(
                round_trip(&once).0,
                once,
                "{text:?} changed on a second write"
            );
        }
    }

    #[test]
    fn a_key_with_properties_starts_at_them_for_comments() {
        // the key was placed past its tag, so a foot comment at the
        // mapping's indent was read as the foot of the item around it
        for text in [
            "- ! a: 1\n  # h\n- b\n",
            "- &k a: 1\n  # h\n- b\n",
            "m:\n  !t a: 1\n  # h\nb: 2\n",
        ] {
            let (once, before, after) = round_trip(text);
            assert_eq!(after, before, "{text:?} was written as {once:?}");
            assert_eq!(once, text);
        }
    }

    #[test]
    fn a_blank_line_before_a_document_foot_comment_is_kept_after_another_foot() {
        let text = "k:\n- a\n# item foot\n\n# document foot\n";
        let (once, before, after) = round_trip(text);
        assert_eq!(after, before);
        assert_eq!(once, text);
        assert_eq!(round_trip(&once).0, once);
    }

    #[test]
    fn a_sequence_whose_first_item_is_empty_keeps_its_indent() {
        let text = "a:\n  b:\n    - \nc: 1\n";
        let (once, before, after) = round_trip(text);
        assert_eq!(once, "a:\n  b:\n    -\nc: 1\n");
        assert_eq!(after, before);
        assert_eq!(round_trip(&once).0, once);
    }

    #[test]
    fn a_lone_carriage_return_breaks_lines_and_ends_documents() {
        // read as one chunk, the empty document after `---` replaced the
        // scalar before it
        let docs = parse_documents("apiVm\r\r|-\r---\rb: 1\r").expect("parses");
        let roots: Vec<_> = docs
            .iter()
            .map(|d| to_json(&d.root).expect("JSON"))
            .collect();
        assert_eq!(
            roots,
            [serde_json::json!("apiVm\n|-"), serde_json::json!({"b": 1})]
        );
        let (once, before, after) = round_trip("apiVm\r\r|-\r");
        assert_eq!(after, before, "written as {once:?}");
        assert_eq!(round_trip(&once).0, once);
        // two documents in what is read as one are refused, not merged
        let err = parse_documents("a\n...\nb\n").expect_err("a second document");
        assert!(err.to_string().contains("document separator"), "{err}");
    }

    #[test]
    fn a_null_in_a_flow_collection_stays_null() {
        for text in [
            "a: {x: 1, b, c: 2}\n",
            "a: {b}\n",
            "a: [b: , c]\n",
            "a: {? b}\n",
        ] {
            let (out, before, after) = round_trip(text);
            assert_eq!(before, after, "{text:?} was written as {out:?}");
        }
        assert_eq!(round_trip("a: {b}\n").0, "a: {b: null}\n");
        // an empty key is written as the empty string it is read as
        assert_eq!(round_trip("a: {: b}\n").0, "a: {'': b}\n");
        assert_eq!(round_trip(": b\n").0, "'': b\n");
        // a key too long to be implicit is written explicitly
        let long = "k".repeat(1100);
        let (out, before, after) = round_trip(&format!("a: {{? \"{long}\" : 1, b: 2}}\n"));
        assert!(out.starts_with("a: {? "), "{out}");
        assert_eq!(before, after);
        // an empty string stays an empty string
        let (out, before, after) = round_trip("a: {b: ''}\n");
        assert_eq!(out, "a: {b: ''}\n");
        assert_eq!(before, after);
    }
}
