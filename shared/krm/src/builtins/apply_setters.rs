//! apply-setters, v0.2 series (spec §5.4): fields marked with a
//! `# kpt-set: <pattern>` line comment get the pattern with the setter
//! values filled in.

use std::collections::BTreeMap;

use super::{Builtin, Failure, config_data};
use crate::resource::Resource;
use crate::resourcelist::{Field, FileRef, ResultItem, Results};
use crate::yaml::{self, Node, Style, Value};

pub(crate) struct ApplySetters;

const MARKER: &str = "# kpt-set: ";

/// `${name}` placeholders of a pattern, in order.
fn placeholders(pattern: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = pattern;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            break;
        };
        out.push(&after[..end]);
        rest = &after[end + 1..];
    }
    out
}

/// Values of the placeholders the setters did not give, read from the
/// current value by matching the pattern (each placeholder is `(.*)`).
fn derive(pattern: &str, current: &str) -> Option<BTreeMap<String, String>> {
    // Split the pattern into literal pieces and placeholder names.
    let mut pieces = Vec::new();
    let mut names = Vec::new();
    let mut rest = pattern;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = after.find('}')?;
        pieces.push(&rest[..start]);
        names.push(&after[..end]);
        rest = &after[end + 1..];
    }
    pieces.push(rest);
    // Like a regex with greedy `(.*)` groups: longest capture first.
    fn matches<'a>(s: &'a str, pieces: &[&str], out: &mut Vec<&'a str>) -> bool {
        let Some(rest) = s.strip_prefix(pieces[0]) else {
            return false;
        };
        if pieces.len() == 1 {
            return rest.is_empty();
        }
        for end in (0..=rest.len()).rev().filter(|&i| rest.is_char_boundary(i)) {
            out.push(&rest[..end]);
            if matches(&rest[end..], &pieces[1..], out) {
                return true;
            }
            out.pop();
        }
        false
    }
    let mut captures = Vec::new();
    if !matches(current, &pieces, &mut captures) {
        return None;
    }
    Some(
        names
            .iter()
            .zip(captures)
            .map(|(n, c)| ((*n).to_owned(), c.to_owned()))
            .collect(),
    )
}

struct Applier<'a> {
    setters: &'a BTreeMap<String, String>,
    results: Vec<ResultItem>,
    error: Option<String>,
}

impl Applier<'_> {
    fn visit(
        &mut self,
        node: &mut Node,
        path: &str,
        file: &Option<FileRef>,
        key_comment: Option<&str>,
    ) {
        if self.error.is_some() {
            return;
        }
        let comment = node.line_comment.clone().or(key_comment.map(str::to_owned));
        match &mut node.value {
            Value::Mapping(entries) => {
                for (key, value) in entries.iter_mut() {
                    let child = match key.as_str() {
                        Some(k) if path.is_empty() => k.to_owned(),
                        Some(k) => format!("{path}.{k}"),
                        None => continue,
                    };
                    let key_comment = key.line_comment.clone();
                    self.visit(value, &child, file, key_comment.as_deref());
                }
            }
            Value::Sequence(_) => {
                if let Some(pattern) = comment.as_deref().and_then(|c| c.strip_prefix(MARKER)) {
                    self.array(node, pattern.trim(), path, file);
                    return;
                }
                if let Value::Sequence(items) = &mut node.value {
                    for (i, item) in items.iter_mut().enumerate() {
                        self.visit(item, &format!("{path}[{i}]"), file, None);
                    }
                }
            }
            Value::Scalar(_) => {
                if let Some(pattern) = node
                    .line_comment
                    .as_deref()
                    .and_then(|c| c.strip_prefix(MARKER))
                {
                    let pattern = pattern.trim().to_owned();
                    self.scalar(node, &pattern, path, file);
                }
            }
            Value::Alias(_) => {}
        }
    }

    fn scalar(&mut self, node: &mut Node, pattern: &str, path: &str, file: &Option<FileRef>) {
        let names = placeholders(pattern);
        if !names.iter().any(|n| self.setters.contains_key(*n)) {
            return;
        }
        let current = node.as_str().unwrap_or("").to_owned();
        let derived = derive(pattern, &current).unwrap_or_default();
        let mut value = pattern.to_owned();
        let mut missing = Vec::new();
        for name in &names {
            let given = self.setters.get(*name).or(derived.get(*name));
            match given {
                Some(v) => value = value.replace(&format!("${{{name}}}"), v),
                None => missing.push(format!("${{{name}}}")),
            }
        }
        if !missing.is_empty() {
            self.error = Some(format!(
                "values for setters [{}] must be provided",
                missing.join(" ")
            ));
            return;
        }
        if value == current && node.tag.is_none() {
            self.record(path, &value, file);
            return;
        }
        node.value = Value::Scalar(value.clone());
        node.tag = None;
        node.explicit_tag = false;
        if value.is_empty() {
            node.style = Style::DoubleQuoted;
        }
        self.record(path, &value, file);
    }

    fn array(&mut self, node: &mut Node, pattern: &str, path: &str, file: &Option<FileRef>) {
        let names = placeholders(pattern);
        let [name] = names.as_slice() else {
            return;
        };
        if pattern != format!("${{{name}}}") {
            return;
        }
        let Some(raw) = self.setters.get(*name) else {
            return;
        };
        let parsed = match yaml::parse_document(raw) {
            Ok(Some(n)) => n,
            Ok(None) => Node::sequence(),
            Err(e) => {
                self.error = Some(format!(
                    "input to array setter must be an array of values: {e}"
                ));
                return;
            }
        };
        let Value::Sequence(items) = parsed.value else {
            self.error = Some(format!(
                "input to array setter must be an array of values, but found {raw}"
            ));
            return;
        };
        let style = if items.is_empty() {
            Style::Flow
        } else {
            node.style
        };
        node.value = Value::Sequence(items);
        node.style = style;
        self.record(path, raw, file);
    }

    fn record(&mut self, path: &str, value: &str, file: &Option<FileRef>) {
        self.results.push(ResultItem {
            message: format!("set field value to {value:?}"),
            severity: "info".into(),
            field: Some(Field {
                path: path.to_owned(),
                ..Default::default()
            }),
            file: file.clone(),
            ..Default::default()
        });
    }
}

impl Builtin for ApplySetters {
    fn name(&self) -> &'static str {
        "apply-setters"
    }

    fn series(&self) -> &'static [&'static str] {
        &["v0.2"]
    }

    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure> {
        let setters = config.map(config_data).unwrap_or_default();
        let mut applier = Applier {
            setters: &setters,
            results: Vec::new(),
            error: None,
        };
        for r in items.iter_mut() {
            let file = (!r.origin.path.is_empty()).then(|| FileRef {
                path: r.origin.path.clone(),
                index: r.origin.index.unwrap_or(0) as i64,
            });
            applier.visit(&mut r.object, "", &file, None);
            if let Some(error) = applier.error.take() {
                return Err(Failure::new(format!("failed to apply setters: {error}")));
            }
        }
        if applier.results.is_empty() {
            return Ok(vec![ResultItem::info("no matches for input setter(s)")]);
        }
        Ok(applier.results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_derive_missing_values_from_the_current_value() {
        let d = derive("${image}:${tag}", "nginx:1.25").unwrap_or_default();
        assert_eq!(d.get("image").map(String::as_str), Some("nginx"));
        assert_eq!(d.get("tag").map(String::as_str), Some("1.25"));
        let d = derive("prefix-${name}-suffix", "prefix-a-b-suffix").unwrap_or_default();
        assert_eq!(d.get("name").map(String::as_str), Some("a-b"));
        assert!(derive("x-${a}", "y-1").is_none());
        assert_eq!(placeholders("${a}/${b}"), vec!["a", "b"]);
    }
}
