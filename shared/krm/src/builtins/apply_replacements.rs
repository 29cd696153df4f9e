//! apply-replacements, v0.1 series (spec §5.5): kustomize replacements —
//! copy a field of one object (or a fixed value) into fields of others.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Builtin, Failure, config_kind, typed_config};
use crate::resource::Resource;
use crate::resourcelist::{ResultItem, Results};
use crate::yaml::{Node, Value};

pub(crate) struct ApplyReplacements;

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(rename_all = "camelCase")]
struct Selector {
    #[serde(default)]
    group: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    label_selector: String,
    #[serde(default)]
    annotation_selector: String,
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(rename_all = "camelCase")]
struct Options {
    #[serde(default)]
    delimiter: String,
    #[serde(default)]
    index: i64,
    #[serde(default)]
    create: bool,
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(rename_all = "camelCase")]
struct Source {
    #[serde(flatten)]
    selector: Selector,
    #[serde(default)]
    field_path: String,
    #[serde(default)]
    options: Option<Options>,
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(rename_all = "camelCase")]
struct Target {
    #[serde(default)]
    select: Option<Selector>,
    #[serde(default)]
    reject: Vec<Selector>,
    #[serde(default)]
    field_paths: Vec<String>,
    #[serde(default)]
    options: Option<Options>,
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(rename_all = "camelCase")]
struct Replacement {
    #[serde(default)]
    source: Option<Source>,
    #[serde(default)]
    source_value: Option<String>,
    #[serde(default)]
    targets: Vec<Target>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Config {
    #[serde(default)]
    replacements: Vec<Replacement>,
}

/// `a=b,c!=d,e in (x,y),f notin (z),g,!h` over a string map.
fn selector_matches(selector: &str, values: &BTreeMap<String, String>) -> Result<bool, String> {
    let mut terms = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    for term in terms.into_iter().map(str::trim).filter(|t| !t.is_empty()) {
        let ok = if let Some((k, v)) = term.split_once("!=") {
            values.get(k.trim()).map(String::as_str) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            values.get(k.trim()).map(String::as_str) == Some(v.trim())
        } else if let Some((k, set)) = term.split_once(" notin ") {
            !parse_set(set)?.contains(&values.get(k.trim()).cloned().unwrap_or_default())
                || !values.contains_key(k.trim())
        } else if let Some((k, set)) = term.split_once(" in ") {
            values
                .get(k.trim())
                .is_some_and(|v| parse_set(set).is_ok_and(|s| s.contains(v)))
        } else if let Some(k) = term.strip_prefix('!') {
            !values.contains_key(k.trim())
        } else if term
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        {
            values.contains_key(term)
        } else {
            return Err(format!("unable to parse selector {selector:?}"));
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

fn parse_set(set: &str) -> Result<Vec<String>, String> {
    let inner = set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("unable to parse set {set:?}"))?;
    Ok(inner.split(',').map(|s| s.trim().to_owned()).collect())
}

fn string_map(r: &Resource, field: &str) -> BTreeMap<String, String> {
    r.object
        .lookup(&["metadata", field])
        .and_then(Node::as_mapping)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| {
                    Some((k.as_str()?.to_owned(), v.as_str().unwrap_or("").to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn selects(r: &Resource, s: &Selector) -> Result<bool, String> {
    let api = r.api_version();
    let (group, version) = api.rsplit_once('/').unwrap_or(("", api));
    let field = |want: &str, have: &str| want.is_empty() || want == have;
    Ok(field(&s.group, group)
        && field(&s.version, version)
        && field(&s.kind, r.kind())
        && field(&s.name, r.name())
        && field(&s.namespace, r.namespace())
        && (s.label_selector.is_empty()
            || selector_matches(&s.label_selector, &string_map(r, "labels"))?)
        && (s.annotation_selector.is_empty()
            || selector_matches(&s.annotation_selector, &string_map(r, "annotations"))?))
}

#[derive(Debug, Clone, PartialEq)]
enum Seg {
    Key(String),
    Match(String, String),
    Index(usize),
    All,
}

fn parse_field_path(path: &str) -> Vec<Seg> {
    let mut segs = Vec::new();
    let mut current = String::new();
    let mut in_brackets = false;
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'.') => {
                current.push('.');
                chars.next();
            }
            '[' => in_brackets = true,
            ']' => in_brackets = false,
            '.' if !in_brackets => {
                segs.push(std::mem::take(&mut current));
            }
            c => current.push(c),
        }
    }
    segs.push(current);
    segs.into_iter()
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s == "*" {
                Seg::All
            } else if let Some((k, v)) = s.split_once('=') {
                Seg::Match(k.to_owned(), v.to_owned())
            } else if let Ok(i) = s.parse() {
                Seg::Index(i)
            } else {
                Seg::Key(s)
            }
        })
        .collect()
}

/// Every node at a path; with `create`, missing map keys are created.
fn visit(node: &mut Node, path: &[Seg], create: bool, f: &mut dyn FnMut(&mut Node)) -> usize {
    let Some((seg, rest)) = path.split_first() else {
        f(node);
        return 1;
    };
    match seg {
        Seg::Key(k) => {
            if node.get(k).is_none() {
                if !create || node.as_mapping().is_none() {
                    return 0;
                }
                node.set(
                    k,
                    if rest.is_empty() {
                        Node::null()
                    } else {
                        Node::mapping()
                    },
                );
            }
            match node.get_mut(k) {
                Some(child) => visit(child, rest, create, f),
                None => 0,
            }
        }
        Seg::Index(i) => match node.as_sequence_mut().and_then(|s| s.get_mut(*i)) {
            Some(child) => visit(child, rest, create, f),
            None => 0,
        },
        Seg::All => node
            .as_sequence_mut()
            .map(|items| items.iter_mut().map(|c| visit(c, rest, create, f)).sum())
            .unwrap_or(0),
        Seg::Match(k, v) => node
            .as_sequence_mut()
            .map(|items| {
                items
                    .iter_mut()
                    .filter(|c| c.str_at(&[k]) == Some(v))
                    .map(|c| visit(c, rest, create, f))
                    .sum()
            })
            .unwrap_or(0),
    }
}

fn lookup(node: &Node, path: &[Seg]) -> Option<Node> {
    let mut copy = node.clone();
    let mut found = None;
    visit(&mut copy, path, false, &mut |n| {
        if found.is_none() {
            found = Some(n.clone());
        }
    });
    found
}

fn split_join(value: &str, options: &Options, replacement: &str) -> String {
    let mut parts: Vec<&str> = value.split(options.delimiter.as_str()).collect();
    let index = options.index;
    if index < 0 {
        parts.insert(0, replacement);
    } else if index as usize >= parts.len() {
        parts.push(replacement);
    } else {
        parts[index as usize] = replacement;
    }
    parts.join(&options.delimiter)
}

fn apply(items: &mut [Resource], replacement: &Replacement) -> Result<usize, String> {
    let value: Node = match (&replacement.source, &replacement.source_value) {
        (Some(_), Some(_)) => {
            return Err("value and resource selectors are mutually exclusive".into());
        }
        (None, Some(v)) => Node::string(v.clone()),
        (None, None) => return Err("replacement has neither source nor sourceValue".into()),
        (Some(source), None) => {
            let mut matched = Vec::new();
            for r in items.iter() {
                if selects(r, &source.selector)? {
                    matched.push(r);
                }
            }
            let describe = || format!("{:?}", source.selector);
            let r = match matched.as_slice() {
                [r] => *r,
                [] => return Err(format!("nothing selected by {}", describe())),
                _ => return Err(format!("multiple matches for selector {}", describe())),
            };
            let field_path = if source.field_path.is_empty() {
                "metadata.name"
            } else {
                &source.field_path
            };
            let mut node = lookup(&r.object, &parse_field_path(field_path)).ok_or_else(|| {
                format!(
                    "fieldPath `{field_path}` is missing for replacement source {}",
                    describe()
                )
            })?;
            if let Some(options) = &source.options
                && !options.delimiter.is_empty()
            {
                let text = node.as_str().unwrap_or("").to_owned();
                let parts: Vec<&str> = text.split(options.delimiter.as_str()).collect();
                let part = usize::try_from(options.index)
                    .ok()
                    .and_then(|i| parts.get(i))
                    .ok_or_else(|| {
                        format!(
                            "options.index {} is out of bounds for value {text}",
                            options.index
                        )
                    })?;
                node = Node::string(*part);
            }
            node.head_comment.clear();
            node.line_comment = None;
            node.foot_comment.clear();
            node
        }
    };
    let mut changed = 0;
    for target in &replacement.targets {
        let Some(select) = &target.select else {
            return Err("target must specify resources to select".into());
        };
        let options = target.options.clone().unwrap_or_default();
        let paths: Vec<String> = if target.field_paths.is_empty() {
            vec!["metadata.name".into()]
        } else {
            target.field_paths.clone()
        };
        for r in items.iter_mut() {
            if !selects(r, select)? {
                continue;
            }
            let mut rejected = false;
            for reject in &target.reject {
                if selects(r, reject)? {
                    rejected = true;
                }
            }
            if rejected {
                continue;
            }
            for path in &paths {
                let segs = parse_field_path(path);
                let hits = visit(&mut r.object, &segs, options.create, &mut |slot| {
                    let was_null = slot.is_null();
                    match (&value.value, &mut slot.value) {
                        (Value::Scalar(v), Value::Scalar(current)) => {
                            let new = if options.delimiter.is_empty() {
                                v.clone()
                            } else {
                                split_join(current, &options, v)
                            };
                            // The target keeps its type and style; only the text changes.
                            if was_null {
                                *slot = Node::string(new);
                            } else {
                                *current = new;
                            }
                        }
                        _ => {
                            let comment = slot.line_comment.take();
                            *slot = value.clone();
                            slot.line_comment = comment;
                        }
                    }
                });
                if hits == 0 {
                    return Err(format!(
                        "unable to find field \"{path}\" in replacement target"
                    ));
                }
                changed += hits;
            }
        }
    }
    Ok(changed)
}

impl Builtin for ApplyReplacements {
    fn name(&self) -> &'static str {
        "apply-replacements"
    }

    fn series(&self) -> &'static [&'static str] {
        &["v0.1"]
    }

    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure> {
        let Some(config) = config else {
            return Err(Failure::new(
                "functionConfig is missing; expected ApplyReplacements.v1alpha1.fn.kpt.dev",
            ));
        };
        match config_kind(config) {
            ("fn.kpt.dev/v1alpha1", "ApplyReplacements") => {}
            (api, kind) => {
                return Err(Failure::new(format!(
                    "unknown functionConfig Kind={kind} ApiVersion={api}; expected ApplyReplacements.v1alpha1.fn.kpt.dev"
                )));
            }
        }
        let config: Config = typed_config(config)?;
        let mut changed = 0;
        for replacement in &config.replacements {
            changed += apply(items, replacement)
                .map_err(|e| Failure::new(format!("failed to apply replacements: {e}")))?;
        }
        Ok(vec![ResultItem::info(format!(
            "{changed} field(s) replaced"
        ))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_and_paths_parse_like_kustomize() {
        let labels: BTreeMap<String, String> = [
            ("app".to_owned(), "web".to_owned()),
            ("tier".to_owned(), "1".to_owned()),
        ]
        .into();
        assert_eq!(selector_matches("app=web,tier in (1,2)", &labels), Ok(true));
        assert_eq!(selector_matches("app!=web", &labels), Ok(false));
        assert_eq!(selector_matches("!missing,app", &labels), Ok(true));
        assert!(selector_matches("app ~ x", &labels).is_err());
        assert_eq!(
            parse_field_path("spec.containers.[name=web].image"),
            vec![
                Seg::Key("spec".into()),
                Seg::Key("containers".into()),
                Seg::Match("name".into(), "web".into()),
                Seg::Key("image".into())
            ]
        );
        assert_eq!(
            parse_field_path("metadata.annotations.a\\.b"),
            vec![
                Seg::Key("metadata".into()),
                Seg::Key("annotations".into()),
                Seg::Key("a.b".into())
            ]
        );
        assert_eq!(
            split_join(
                "a.b.c",
                &Options {
                    delimiter: ".".into(),
                    index: 1,
                    create: false
                },
                "x"
            ),
            "a.x.c"
        );
        assert_eq!(
            split_join(
                "a.b",
                &Options {
                    delimiter: ".".into(),
                    index: -1,
                    create: false
                },
                "x"
            ),
            "x.a.b"
        );
    }
}
