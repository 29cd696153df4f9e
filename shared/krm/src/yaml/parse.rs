//! Text to [`Node`] trees, keeping comments where kyaml keeps them.
//!
//! Files are split into documents the way kyaml's reader splits them (on
//! `---` lines, CRLF first turned into LF), so a comment on a `---` line is
//! dropped and a document holding only comments disappears, as with kpt.
//! Comments are then attached by position: a comment after content on the same
//! line is the line comment of the last node that starts on that line; a
//! comment on a line of its own is the head comment of the next key or item
//! when it is not indented deeper than it, and otherwise the foot comment of
//! the deepest entry it is indented under.

use std::collections::HashSet;

use granit_parser::{Event, Options, Parser, Placement, ScalarStyle, StructureStyle, Tag};

use super::YamlError;
use super::node::{Node, Style, Value};

/// One document of a file.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    pub root: Node,
    /// 1-based line of the document's first line in the file.
    pub line: usize,
    /// The document's source text (for the sequence indent style).
    pub text: String,
}

/// Splits a multi-document YAML text and parses each non-empty document.
///
/// # Errors
/// Syntax errors (with the file line), duplicate keys, text after `---`.
pub fn parse_documents(text: &str) -> Result<Vec<Document>, YamlError> {
    // a line break is CR LF, LF or a lone CR, each read as LF (YAML 1.2
    // §5.4); a separator after a lone CR is a separator too
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut documents = Vec::new();
    for (line, chunk) in split_documents(&text)? {
        if let Some(root) = parse_one(&chunk, line)? {
            documents.push(Document {
                root,
                line,
                text: chunk,
            });
        }
    }
    Ok(documents)
}

/// Parses a text that holds one document (or none: `Ok(None)`).
///
/// # Errors
/// As [`parse_documents`], and more than one document.
pub fn parse_document(text: &str) -> Result<Option<Node>, YamlError> {
    let mut docs = parse_documents(text)?;
    match docs.len() {
        0 => Ok(None),
        1 => Ok(docs.pop().map(|d| d.root)),
        n => Err(YamlError::Syntax {
            line: docs[1].line,
            message: format!("expected one document, found {n}"),
        }),
    }
}

fn split_documents(text: &str) -> Result<Vec<(usize, String)>, YamlError> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if let Some(rest) = line.strip_prefix("---") {
            let rest = rest.trim();
            if rest.is_empty() || rest.starts_with('#') {
                chunks.push((start, std::mem::take(&mut current)));
                start = i + 2;
                continue;
            }
            if rest.starts_with(['-', '.']) {
                // `----` is a plain scalar line, not a separator.
            } else if i > 0 || !rest.is_empty() {
                return Err(YamlError::Syntax {
                    line: i + 1,
                    message: format!("unexpected text after document separator: {rest:?}"),
                });
            }
        }
        current.push_str(line);
    }
    chunks.push((start, current));
    Ok(chunks)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Item(usize),
    Key(usize),
    Value(usize),
}

#[derive(Debug, Clone)]
struct Anchor {
    line: usize,
    col: usize,
    path: Vec<Step>,
    /// Path of the outermost flow collection containing this node.
    flow_root: Option<Vec<Step>>,
    /// A key or sequence item: a node that can carry head and foot comments.
    entry: bool,
}

impl Anchor {
    fn new(
        line: usize,
        col: usize,
        path: &[Step],
        flow_root: &Option<Vec<Step>>,
        entry: bool,
    ) -> Self {
        Anchor {
            line,
            col,
            path: path.to_vec(),
            flow_root: flow_root.clone(),
            entry,
        }
    }
}

#[derive(Debug)]
struct Frame {
    node: Node,
    path: Vec<Step>,
    key: Option<Node>,
    /// The scalar keys of a mapping so far, for the duplicate check.
    keys: HashSet<String>,
}

#[derive(Debug)]
struct CommentAt {
    line: usize,
    col: usize,
    text: String,
    right: bool,
}

#[derive(Debug)]
enum Last {
    Scalar,
    Start,
    Other,
}

/// A tag as it is written back: the parser hands out its suffix with `%`
/// escapes decoded, so whatever may not appear literally in a tag (control
/// characters, spaces, `%` itself, flow indicators in a shorthand) is
/// escaped again, or the tag written would not read back the same.
fn tag_text(tag: &Tag) -> String {
    if let Some(core) = tag.core_suffix() {
        return format!("!!{core}");
    }
    let (handle, suffix) = tag.original_parts();
    if handle.is_empty() && suffix == "!" {
        // the non-specific tag `!`
        return "!".to_owned();
    }
    match handle {
        "!" | "!!" => format!("{handle}{}", escape_tag(suffix, "-#;/?:@&=+$_.~*'()")),
        // verbatim, or a named handle: its `%TAG` directive is not written
        // back, so the tag is written resolved
        _ => {
            let (prefix, suffix) = tag.parts();
            let uri = format!("{prefix}{suffix}");
            format!("!<{}>", escape_tag(&uri, "-#;/?:@&=+$,_.!~*'()[]"))
        }
    }
}

/// Percent-encodes every byte of `text` except ASCII letters, digits and
/// `literal`.
fn escape_tag(text: &str, literal: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || literal.contains(c) {
            out.push(c);
        } else {
            let mut bytes = [0u8; 4];
            for b in c.encode_utf8(&mut bytes).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

fn parse_one(text: &str, first_line: usize) -> Result<Option<Node>, YamlError> {
    let mut options = Options::default();
    options.emit_anchor_events = true;
    options.max_buffered_comment_events = usize::MAX / 2;
    let parser = Parser::new_from_str_with_options(text, options);
    let lines: Vec<&str> = text.lines().collect();

    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Node> = None;
    let mut anchors: Vec<Anchor> = Vec::new();
    let mut comments: Vec<CommentAt> = Vec::new();
    let mut anchor_names: std::collections::HashMap<usize, String> = Default::default();
    let mut pending: Option<Node> = None;
    let mut last = Last::Other;
    let mut flow_depth_root: Option<Vec<Step>> = None;
    let mut documents = 0;

    let syntax = |line: usize, message: String| YamlError::Syntax {
        line: first_line + line.saturating_sub(1),
        message,
    };

    for event in parser {
        let (event, span) = event.map_err(|e| syntax(e.marker().line(), e.info()))?;
        let (line, col) = (span.start.line(), span.start.col());
        if let Event::Anchor(id, name) = &event {
            anchor_names.insert(*id, name.to_string());
            match last {
                Last::Scalar => {
                    if let Some(node) = pending.as_mut() {
                        node.anchor = Some(name.to_string());
                    }
                }
                Last::Start => {
                    if let Some(frame) = stack.last_mut() {
                        frame.node.anchor = Some(name.to_string());
                    }
                }
                Last::Other => {}
            }
            continue;
        }
        if let Event::Comment(body, placement) = &event {
            comments.push(CommentAt {
                line,
                col,
                text: format!("#{}", body.trim_end()),
                right: matches!(placement, Placement::Right),
            });
            continue;
        }
        if let Event::DocumentStart(..) = &event {
            // the chunk was split at every separator: a second document
            // here would replace the first, not follow it
            documents += 1;
            if documents > 1 {
                return Err(syntax(
                    line,
                    "a document separator not at the start of a line".into(),
                ));
            }
        }
        if let Some(node) = pending.take() {
            insert(&mut stack, &mut root, node, first_line)?;
        }
        last = Last::Other;
        let next_path = |stack: &[Frame]| -> (Vec<Step>, bool) {
            match stack.last() {
                None => (Vec::new(), false),
                Some(frame) => {
                    let mut path = frame.path.clone();
                    match &frame.node.value {
                        Value::Sequence(items) => {
                            path.push(Step::Item(items.len()));
                            (path, true)
                        }
                        Value::Mapping(entries) => {
                            if frame.key.is_some() {
                                path.push(Step::Value(entries.len()));
                                (path, false)
                            } else {
                                path.push(Step::Key(entries.len()));
                                (path, true)
                            }
                        }
                        _ => (path, false),
                    }
                }
            }
        };
        let is_sequence = matches!(event, Event::SequenceStart(..));
        match event {
            Event::Scalar(value, style, _, tag) => {
                let (path, entry) = next_path(&stack);
                // a block scalar's span starts at its body: placed at its
                // header instead, where the emitter writes comments around it
                let (line, col) = if matches!(style, ScalarStyle::Literal | ScalarStyle::Folded) {
                    block_header(&lines, line, col).unwrap_or((line, col))
                } else {
                    (line, col)
                };
                anchors.push(Anchor::new(line, col, &path, &flow_depth_root, entry));
                // An empty value comes as `~` with an empty span.
                let empty = style == ScalarStyle::Plain && span.start.index() == span.end.index();
                let mut node = Node::plain(if empty {
                    String::new()
                } else {
                    value.into_owned()
                });
                node.style = match style {
                    ScalarStyle::Plain => Style::Plain,
                    ScalarStyle::SingleQuoted => Style::SingleQuoted,
                    ScalarStyle::DoubleQuoted => Style::DoubleQuoted,
                    ScalarStyle::Literal => Style::Literal,
                    ScalarStyle::Folded => Style::Folded,
                };
                if let Some(tag) = tag {
                    node.tag = Some(tag_text(&tag));
                    node.explicit_tag = true;
                }
                pending = Some(node);
                last = Last::Scalar;
            }
            Event::Alias(id) => {
                let (path, entry) = next_path(&stack);
                anchors.push(Anchor::new(line, col, &path, &flow_depth_root, entry));
                let name = anchor_names.get(&id).cloned().unwrap_or_default();
                let mut node = Node::null();
                node.value = Value::Alias(name);
                pending = Some(node);
            }
            Event::SequenceStart(style, _, tag) | Event::MappingStart(style, _, tag) => {
                let (path, entry) = next_path(&stack);
                anchors.push(Anchor::new(line, col, &path, &flow_depth_root, entry));
                let mut node = if is_sequence {
                    Node::sequence()
                } else {
                    Node::mapping()
                };
                if style == StructureStyle::Flow {
                    node.style = Style::Flow;
                    if flow_depth_root.is_none() {
                        flow_depth_root = Some(path.clone());
                    }
                }
                if let Some(tag) = tag {
                    node.tag = Some(tag_text(&tag));
                    node.explicit_tag = true;
                }
                stack.push(Frame {
                    node,
                    path,
                    key: None,
                    keys: HashSet::new(),
                });
                last = Last::Start;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(frame) = stack.pop() else {
                    return Err(syntax(line, "unbalanced collection end".into()));
                };
                if flow_depth_root.as_ref() == Some(&frame.path) {
                    flow_depth_root = None;
                }
                insert(&mut stack, &mut root, frame.node, first_line)?;
            }
            _ => {}
        }
    }
    let Some(mut root) = root else {
        return Ok(None);
    };
    attach_comments(&mut root, &anchors, comments, text);
    Ok(Some(root))
}

/// The line and column of the `|` or `>` header of a block scalar whose
/// body starts at `line`, `col` (1-based line): the last token of the
/// nearest non-blank line above, a comment after it aside.
fn block_header(lines: &[&str], line: usize, col: usize) -> Option<(usize, usize)> {
    let is_header = |token: &str| {
        token.starts_with(['|', '>'])
            && token[1..]
                .chars()
                .all(|c| matches!(c, '+' | '-' | '1'..='9'))
    };
    let header_col = |text: &str| -> Option<usize> {
        let code = match text.find(" #") {
            Some(i) => &text[..i],
            None => text,
        };
        let code = code.trim_end();
        let start = code.rfind([' ', '\t']).map_or(0, |i| i + 1);
        is_header(&code[start..]).then(|| code[..start].chars().count())
    };
    // the span already at the header (an empty scalar at the end)
    if let Some(text) = line.checked_sub(1).and_then(|i| lines.get(i)) {
        let before: String = text.chars().take(col).collect();
        if header_col(&before).is_some() {
            return None;
        }
    }
    let mut at = line.checked_sub(1)?;
    while at > 0 {
        let text = lines.get(at - 1)?;
        if !text.trim().is_empty() {
            return header_col(text).map(|c| (at, c));
        }
        at -= 1;
    }
    None
}

fn insert(
    stack: &mut [Frame],
    root: &mut Option<Node>,
    node: Node,
    first_line: usize,
) -> Result<(), YamlError> {
    let Some(frame) = stack.last_mut() else {
        *root = Some(node);
        return Ok(());
    };
    match &mut frame.node.value {
        Value::Sequence(items) => items.push(node),
        Value::Mapping(entries) => match frame.key.take() {
            None => {
                if let Some(key) = node.as_str()
                    && !frame.keys.insert(key.to_owned())
                {
                    return Err(YamlError::Syntax {
                        line: first_line,
                        message: format!("mapping key {key:?} already defined"),
                    });
                }
                frame.key = Some(node);
            }
            Some(key) => entries.push((key, node)),
        },
        _ => {}
    }
    Ok(())
}

fn node_at_mut<'a>(root: &'a mut Node, path: &[Step]) -> Option<&'a mut Node> {
    let mut node = root;
    for step in path {
        node = match (step, &mut node.value) {
            (Step::Item(i), Value::Sequence(items)) => items.get_mut(*i)?,
            (Step::Key(i), Value::Mapping(entries)) => &mut entries.get_mut(*i)?.0,
            (Step::Value(i), Value::Mapping(entries)) => &mut entries.get_mut(*i)?.1,
            _ => return None,
        };
    }
    Some(node)
}

/// The column a block sequence item or an explicit key starts at for its
/// comments: its `-` or `?`, where the emitter writes its head and foot
/// comments, not the column of the node after it (`- name: c` starts at
/// the `n`; an empty item, after the comment that follows its dash; an
/// explicit key on a line of its own, the `?` above it).
fn entry_column(anchor: &Anchor, lines: &[&str], outermost: bool) -> usize {
    let on_line = indicator_column(anchor, lines);
    if outermost
        && on_line == anchor.col
        && matches!(anchor.path.last(), Some(Step::Key(_)))
        && anchor.flow_root.is_none()
    {
        // an empty key (`?` then an entry at its column) is not this one
        return bare_indicator_above(anchor, lines, '?')
            .filter(|(_, col)| *col < anchor.col)
            .map_or(on_line, |(_, col)| col);
    }
    on_line
}

/// The column of the `-` or `?` on an entry's own line, or its own column.
fn indicator_column(anchor: &Anchor, lines: &[&str]) -> usize {
    let indicator = match anchor.path.last() {
        _ if anchor.flow_root.is_some() => return anchor.col,
        Some(Step::Item(_)) => '-',
        Some(Step::Key(_)) => '?',
        _ => return anchor.col,
    };
    let Some(line) = anchor.line.checked_sub(1).and_then(|i| lines.get(i)) else {
        return anchor.col;
    };
    let mut before: Vec<char> = line.chars().take(anchor.col).collect();
    // an empty item (`- # note`) is placed after the comment on its line
    if let Some(hash) =
        (0..before.len()).find(|&i| before[i] == '#' && (i == 0 || before[i - 1] == ' '))
    {
        before.truncate(hash);
    }
    // back over blanks and the node's properties (`- &a !t x`) to the dash
    // (an empty node at the end of its line starts right after them: `- -`)
    // A key with properties and no `?` (`! a: 1`, `- &k a: 1`) starts at
    // them: the emitter writes its comments at the mapping's indent.
    let mut end = before.len();
    let mut adjacent = anchor.col >= line.chars().count();
    let mut properties = None;
    let not_found = |properties: Option<usize>| match indicator {
        '?' => properties.unwrap_or(anchor.col),
        _ => anchor.col,
    };
    loop {
        let blanks = before[..end]
            .iter()
            .rev()
            .take_while(|c| **c == ' ')
            .count();
        if blanks == 0 && !std::mem::take(&mut adjacent) {
            return if end == 0 {
                not_found(properties)
            } else {
                anchor.col
            };
        }
        end -= blanks;
        if end == 0 {
            return not_found(properties);
        }
        let start = before[..end]
            .iter()
            .rposition(|c| *c == ' ')
            .map_or(0, |i| i + 1);
        match before[start..end] {
            [c] if c == indicator => return start,
            ['&' | '!', ..] => {
                properties = Some(start);
                end = start;
            }
            _ => return not_found(properties),
        }
    }
}

/// The line and column of a `?` or `:` alone (but for properties and a
/// comment) on the nearest line with content above the node at `anchor`:
/// an explicit key or value that starts on a line of its own, whose
/// comments the emitter writes around that indicator.
fn bare_indicator_above(
    anchor: &Anchor,
    lines: &[&str],
    indicator: char,
) -> Option<(usize, usize)> {
    let (index, above) = lines[..anchor.line.checked_sub(1)?]
        .iter()
        .enumerate()
        .rev()
        .find(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))?;
    let chars: Vec<char> = above.chars().collect();
    let code = (0..chars.len())
        .find(|&i| chars[i] == '#' && i > 0 && chars[i - 1] == ' ')
        .unwrap_or(chars.len());
    let mut tokens = chars[..code]
        .split(|c| *c == ' ')
        .scan(0, |start, token| {
            let at = *start;
            *start += token.len() + 1;
            Some((at, token))
        })
        .filter(|(_, token)| !token.is_empty());
    let (col, _) = tokens.find(|(_, token)| *token == [indicator])?;
    let properties_only = tokens.all(|(_, token)| matches!(token.first(), Some('&' | '!')));
    // a block sequence may start at the indicator's column
    (properties_only && col <= anchor.col).then_some((index + 1, col))
}

/// A block mapping or sequence with no anchor or tag: its first line is
/// that of its first entry.
fn is_bare_block_collection(node: &Node) -> bool {
    let filled = match &node.value {
        Value::Mapping(entries) => !entries.is_empty(),
        Value::Sequence(items) => !items.is_empty(),
        _ => false,
    };
    filled && node.style != Style::Flow && node.anchor.is_none() && !node.explicit_tag
}

fn attach_comments(root: &mut Node, anchors: &[Anchor], comments: Vec<CommentAt>, text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let anchors: Vec<Anchor> = anchors
        .iter()
        .enumerate()
        .map(|(i, a)| {
            // of the nodes starting at one place, only the outermost can
            // follow a `?` on the line above
            let outermost = i == 0 || (anchors[i - 1].line, anchors[i - 1].col) != (a.line, a.col);
            Anchor {
                col: entry_column(a, &lines, outermost),
                ..a.clone()
            }
        })
        .collect();
    for comment in comments {
        // Anchors are in source order: find the first one after the line.
        let after = anchors.partition_point(|a| a.line <= comment.line);
        if comment.right {
            // The last node starting on the comment's line, or the flow
            // collection around it.
            let on_line =
                &anchors[..after][anchors[..after].partition_point(|a| a.line < comment.line)..];
            // After a bare `-` (`- # note` above an item's first key), the
            // comment stays with the node on its line, if any: kyaml
            // writes a resource's head comment there in a ResourceList, and
            // keeping it off the item keeps kpt from copying it back in
            // beside one already there.
            let after_dash = lines
                .get(comment.line.wrapping_sub(1))
                .map(|l| l.chars().take(comment.col).collect::<String>())
                .is_some_and(|before| before.trim_end().ends_with('-'));
            if let Some(anchor) = on_line.last() {
                let path = anchor.flow_root.as_ref().unwrap_or(&anchor.path);
                if let Some(node) = node_at_mut(root, path)
                    && (after_dash || !is_bare_block_collection(node))
                {
                    node.line_comment = Some(comment.text);
                    continue;
                }
            }
            if after_dash {
                continue;
            }
            // After a bare `?` or `:`, or properties: a block collection
            // without properties has no line of its own to carry it, so it
            // is the head of the first entry on its line, or else of the
            // node after it, where it is written back.
            let owner = on_line
                .iter()
                .find(|a| a.entry && a.flow_root.is_none())
                .or_else(|| anchors.get(after).filter(|a| a.flow_root.is_none()));
            if let Some(owner) = owner
                && let Some(node) = node_at_mut(root, &owner.path)
            {
                node.head_comment.push(comment.text);
            }
            continue;
        }
        let mut next = anchors[after..].iter().find(|a| a.flow_root.is_none());
        // After a bare `?` or `:`, above the block collection that is its
        // key or value: the head of the collection's first entry. The
        // key's or value's own head is written above the indicator, so the
        // comment would move up.
        if let Some(value) = next
            && let Some(indicator) = match value.path.last() {
                Some(Step::Key(_)) => Some('?'),
                Some(Step::Value(_)) => Some(':'),
                _ => None,
            }
            && node_at_mut(root, &value.path).is_some_and(|n| is_bare_block_collection(n))
            && bare_indicator_above(value, &lines, indicator)
                .is_some_and(|(line, _)| line < comment.line)
        {
            next = anchors[after..]
                .iter()
                .find(|a| {
                    a.entry
                        && a.path.len() == value.path.len() + 1
                        && a.path.starts_with(&value.path)
                })
                .or(next);
        }
        if let Some(next) = next
            && comment.col <= next.col
        {
            if let Some(node) = node_at_mut(root, &next.path) {
                node.head_comment.push(comment.text);
            }
            continue;
        }
        // A comment at the end of the document, not indented: the document's
        // foot, keeping one blank line before it as kpt does.
        if next.is_none() && comment.col == 0 {
            let blank_before = comment.line >= 2
                && lines
                    .get(comment.line - 2)
                    .is_some_and(|l| l.trim().is_empty());
            // a blank line between foot comments too: the emitter writes
            // an item's foot at column 0 as well, and without the blank
            // line the two read back as one foot
            if blank_before && root.foot_comment.last().is_none_or(|l| !l.is_empty()) {
                root.foot_comment.push(String::new());
            }
            root.foot_comment.push(comment.text);
            continue;
        }
        // A foot comment: the nearest entry before the comment that is not
        // indented deeper than it.
        let owner = anchors[..after]
            .iter()
            .rev()
            .find(|a| a.entry && a.flow_root.is_none() && a.col <= comment.col);
        match owner {
            Some(owner) => {
                if let Some(node) = node_at_mut(root, &owner.path) {
                    node.foot_comment.push(comment.text);
                }
            }
            None => root.foot_comment.push(comment.text),
        }
    }
}
