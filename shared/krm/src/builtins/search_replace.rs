//! search-replace, v0.2 series (spec §5.6): find scalar fields by value,
//! regex, path and file, and report or replace them.
//!
//! Difference from the catalog: `by-value-regex` must match the whole value,
//! as the catalog documents (its code matches anywhere in the value).

use std::collections::BTreeMap;

use regex::Regex;

use super::{Builtin, Failure, config_data};
use crate::resource::Resource;
use crate::resourcelist::{Field, FileRef, ResultItem, Results};
use crate::yaml::{Node, Style, Value};

pub(crate) struct SearchReplace;

const KEYS: [&str; 6] = [
    "by-value",
    "by-value-regex",
    "by-path",
    "by-file-path",
    "put-value",
    "put-comment",
];

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    AnyKey,
    Index(usize),
    AnyIndex,
    AnyDepth,
}

#[derive(Debug, Clone, PartialEq)]
enum Elem {
    Key(String),
    Index(usize),
}

fn parse_path(pattern: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for segment in pattern.split('.') {
        let (name, brackets) = match segment.find('[') {
            Some(i) => (&segment[..i], &segment[i..]),
            None => (segment, ""),
        };
        match name {
            "" if brackets.is_empty() => return Err(format!("empty segment in path {pattern:?}")),
            "" => {}
            "**" => steps.push(Step::AnyDepth),
            "*" => steps.push(Step::AnyKey),
            key => steps.push(Step::Key(key.to_owned())),
        }
        let mut rest = brackets;
        while let Some(inner) = rest.strip_prefix('[') {
            let Some(end) = inner.find(']') else {
                return Err(format!("unclosed `[` in path {pattern:?}"));
            };
            let index = &inner[..end];
            steps.push(if index == "*" {
                Step::AnyIndex
            } else {
                Step::Index(
                    index
                        .parse()
                        .map_err(|_| format!("bad list index {index:?} in path {pattern:?}"))?,
                )
            });
            rest = &inner[end + 1..];
        }
        if !rest.is_empty() {
            return Err(format!("unexpected {rest:?} in path {pattern:?}"));
        }
    }
    Ok(steps)
}

fn path_matches(steps: &[Step], path: &[Elem]) -> bool {
    match (steps.first(), path.first()) {
        (None, None) => true,
        (Some(Step::AnyDepth), _) => {
            path_matches(&steps[1..], path) || (!path.is_empty() && path_matches(steps, &path[1..]))
        }
        (None, Some(_)) | (Some(_), None) => false,
        (Some(step), Some(elem)) => {
            let ok = match (step, elem) {
                (Step::Key(k), Elem::Key(e)) => k == e,
                (Step::AnyKey, Elem::Key(_)) => true,
                (Step::Index(i), Elem::Index(e)) => i == e,
                (Step::AnyIndex, Elem::Index(_)) => true,
                _ => false,
            };
            ok && path_matches(&steps[1..], &path[1..])
        }
    }
}

fn display_path(path: &[Elem]) -> String {
    let mut out = String::new();
    for elem in path {
        match elem {
            Elem::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Elem::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

struct Config {
    by_value: Option<String>,
    by_regex: Option<Regex>,
    by_path: Option<Vec<Step>>,
    by_file: Option<String>,
    put_value: Option<String>,
    put_comment: Option<String>,
}

fn read_config(config: Option<&Node>) -> Result<Config, Failure> {
    let data: BTreeMap<String, String> = config.map(config_data).unwrap_or_default();
    if let Some(key) = data.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(Failure::new(format!(
            "key {key:?} is not one of {}",
            KEYS.join(", ")
        )));
    }
    let get = |k: &str| data.get(k).filter(|v| !v.is_empty()).cloned();
    if get("by-value").is_some() && get("by-value-regex").is_some() {
        return Err(Failure::new(
            "only one of [\"by-value\", \"by-value-regex\"] can be provided",
        ));
    }
    let by_regex = match get("by-value-regex") {
        Some(r) => Some(
            Regex::new(&format!("^(?:{r})$"))
                .map_err(|e| Failure::new(format!("failed to compile by-value-regex: {e}")))?,
        ),
        None => None,
    };
    let by_path = match &get("by-path") {
        Some(p) => Some(parse_path(p).map_err(Failure::new)?),
        None => None,
    };
    let config = Config {
        by_value: get("by-value"),
        by_regex,
        by_path,
        by_file: get("by-file-path"),
        put_value: data.get("put-value").cloned(),
        put_comment: get("put-comment"),
    };
    if config.by_value.is_none() && config.by_regex.is_none() && config.by_path.is_none() {
        return Err(Failure::new(
            "at least one of [\"by-value\", \"by-value-regex\", \"by-path\"] must be provided",
        ));
    }
    Ok(config)
}

/// `${N}` in a template filled from capture groups.
fn fill(template: &str, captures: &[String]) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let name = &after[..end];
        // Only `${N}` refers to a capture group; `${name}` (a setter) stays.
        match name.parse::<usize>() {
            Ok(i) => match captures.get(i) {
                Some(v) => out.push_str(v),
                None => return Err(format!("unable to resolve capture group ${{{name}}}")),
            },
            Err(_) => out.push_str(&rest[start..start + 2 + end + 1]),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

struct Search<'a> {
    config: &'a Config,
    results: Vec<ResultItem>,
    error: Option<String>,
}

impl Search<'_> {
    fn walk(&mut self, node: &mut Node, path: &mut Vec<Elem>, file: &Option<FileRef>) {
        match &mut node.value {
            Value::Mapping(entries) => {
                for (key, value) in entries.iter_mut() {
                    let Some(k) = key.as_str().map(str::to_owned) else {
                        continue;
                    };
                    path.push(Elem::Key(k));
                    if let (Value::Sequence(_), Some(comment), None, None) = (
                        &value.value,
                        &self.config.put_comment,
                        &self.config.by_value,
                        &self.config.by_regex,
                    ) && self
                        .config
                        .by_path
                        .as_ref()
                        .is_some_and(|p| path_matches(p, path))
                    {
                        key.line_comment = Some(format!("# {comment}"));
                        value.style = Style::Plain;
                        self.record(
                            "Mutated field value to",
                            value.as_str().unwrap_or(""),
                            path,
                            file,
                        );
                    }
                    self.walk(value, path, file);
                    path.pop();
                }
            }
            Value::Sequence(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    path.push(Elem::Index(i));
                    self.walk(item, path, file);
                    path.pop();
                }
            }
            Value::Scalar(current) => {
                let current = current.clone();
                self.scalar(node, &current, path, file);
            }
            Value::Alias(_) => {}
        }
    }

    fn scalar(&mut self, node: &mut Node, current: &str, path: &[Elem], file: &Option<FileRef>) {
        if self.error.is_some() {
            return;
        }
        let mut captures = vec![current.to_owned()];
        let value_match = match (&self.config.by_value, &self.config.by_regex) {
            (Some(v), _) => Some(v == current),
            (None, Some(re)) => Some(match re.captures(current) {
                Some(c) => {
                    captures = c
                        .iter()
                        .map(|m| m.map(|m| m.as_str().to_owned()).unwrap_or_default())
                        .collect();
                    true
                }
                None => false,
            }),
            (None, None) => None,
        };
        let path_match = self.config.by_path.as_ref().map(|p| path_matches(p, path));
        let matched = match (value_match, path_match) {
            (Some(v), Some(p)) => v && p,
            (Some(v), None) => v,
            (None, Some(p)) => p,
            (None, None) => false,
        };
        if !matched {
            return;
        }
        let mut mutated = false;
        if let Some(put) = &self.config.put_value {
            match fill(put, &captures) {
                Ok(value) => {
                    node.value = Value::Scalar(value);
                    node.tag = None;
                    node.explicit_tag = false;
                    if matches!(node.style, Style::Literal | Style::Folded) {
                        node.style = Style::Plain;
                    }
                    mutated = true;
                }
                Err(e) => {
                    self.error = Some(e);
                    return;
                }
            }
        }
        if let Some(comment) = &self.config.put_comment {
            match fill(comment, &captures) {
                Ok(c) => {
                    node.line_comment = Some(format!("# {c}"));
                    mutated = true;
                }
                Err(e) => {
                    self.error = Some(e);
                    return;
                }
            }
        }
        let value = node.as_str().unwrap_or("").to_owned();
        if mutated {
            self.record("Mutated field value to", &value, path, file);
        } else {
            self.record("Matched field value", &value, path, file);
        }
    }

    fn record(&mut self, what: &str, value: &str, path: &[Elem], file: &Option<FileRef>) {
        self.results.push(ResultItem {
            message: format!("{what} {value:?}"),
            severity: "info".into(),
            field: Some(Field {
                path: display_path(path),
                ..Default::default()
            }),
            file: file.clone(),
            ..Default::default()
        });
    }
}

/// The mapping at a path of keys, created where missing.
fn descend<'a>(node: &'a mut Node, keys: &[String]) -> Option<&'a mut Node> {
    match keys.split_first() {
        None => Some(node),
        Some((key, rest)) => descend(node.mapping_at(key)?, rest),
    }
}

/// `by-path: a.b.c` with `put-value` and nothing else creates the field.
fn plain_path(config: &Config) -> Option<Vec<String>> {
    let steps = config.by_path.as_ref()?;
    if config.by_value.is_some() || config.by_regex.is_some() || config.put_value.is_none() {
        return None;
    }
    steps
        .iter()
        .map(|s| match s {
            Step::Key(k) => Some(k.clone()),
            _ => None,
        })
        .collect()
}

impl Builtin for SearchReplace {
    fn name(&self) -> &'static str {
        "search-replace"
    }

    fn series(&self) -> &'static [&'static str] {
        &["v0.2"]
    }

    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure> {
        let config = read_config(config)?;
        let mut search = Search {
            config: &config,
            results: Vec::new(),
            error: None,
        };
        let create = plain_path(&config);
        for r in items.iter_mut() {
            if let Some(glob) = &config.by_file
                && !crate::package::glob(glob, &r.origin.path)
            {
                continue;
            }
            let file = (!r.origin.path.is_empty()).then(|| FileRef {
                path: r.origin.path.clone(),
                index: r.origin.index.unwrap_or(0) as i64,
            });
            if let (Some(keys), Some(value)) = (&create, &config.put_value) {
                let (parents, last) = keys.split_at(keys.len().saturating_sub(1));
                if let (Some(target), Some(last)) = (descend(&mut r.object, parents), last.first())
                {
                    match target.get_mut(last) {
                        Some(existing) if existing.as_str() == Some(value) => {}
                        Some(existing) => {
                            existing.value = Value::Scalar(value.clone());
                            existing.tag = None;
                        }
                        None => target.set(last, Node::plain(value.clone())),
                    }
                    let path: Vec<Elem> = keys.iter().map(|k| Elem::Key(k.clone())).collect();
                    search.record("Mutated field value to", value, &path, &file);
                }
                continue;
            }
            search.walk(&mut r.object, &mut Vec::new(), &file);
            if let Some(e) = search.error.take() {
                return Err(Failure::new(e));
            }
        }
        if search.results.is_empty() {
            return Ok(vec![ResultItem::info("no matches")]);
        }
        Ok(search.results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_globs_match_like_the_catalog() {
        let p = parse_path("spec.**.image").unwrap_or_default();
        let path = [
            Elem::Key("spec".into()),
            Elem::Key("containers".into()),
            Elem::Index(0),
            Elem::Key("image".into()),
        ];
        assert!(path_matches(&p, &path));
        let p = parse_path("spec.containers[*].image").unwrap_or_default();
        assert!(path_matches(&p, &path));
        let p = parse_path("spec.containers[1].image").unwrap_or_default();
        assert!(!path_matches(&p, &path));
        let p = parse_path("*.containers[0].*").unwrap_or_default();
        assert!(path_matches(&p, &path));
        assert!(parse_path("a..b").is_err());
        assert!(parse_path("a[x]").is_err());
        assert!(crate::package::glob("**/*.yaml", "a/b/c.yaml"));
        assert!(crate::package::glob("*.yaml", "c.yaml"));
        assert!(!crate::package::glob("*.yaml", "a/c.yaml"));
        assert_eq!(
            fill("x-${1}", &["all".into(), "one".into()]).as_deref(),
            Ok("x-one")
        );
        assert!(fill("${2}", &["all".into()]).is_err());
        assert_eq!(
            fill("kpt-set: ${tag}", &[]).as_deref(),
            Ok("kpt-set: ${tag}")
        );
    }
}
