//! Files ⇄ resources, the way kpt reads and writes a package (spec §2.4, §2.5).
//!
//! A package is a map of slash paths to bytes. Directories holding a `Kptfile`
//! are packages; every KRM file (`Kptfile`, `*.yaml`, `*.yml`, `*.json`)
//! belongs to its nearest package. Other files are never read or changed.

use std::collections::{BTreeMap, BTreeSet};

use crate::resource::{Origin, Resource};
use crate::yaml::{self, Node, SeqIndent, Value};

/// The files of a package revision: slash path → content.
pub type Files = BTreeMap<String, Vec<u8>>;

/// Largest file read as KRM.
pub const MAX_FILE_BYTES: usize = porch_api::limits::MAX_FILE_BYTES;

/// Why a package could not be read or written.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum PackageError {
    #[error("invalid file path {path:?}: {reason}")]
    BadPath { path: String, reason: &'static str },
    #[error("failed to read {path}: {source}")]
    Yaml {
        path: String,
        #[source]
        source: yaml::YamlError,
    },
    #[error("failed to read {path}: file is not UTF-8")]
    NotUtf8 { path: String },
    #[error("failed to read {path}: file has {size} bytes, more than the limit of {limit}")]
    TooLarge {
        path: String,
        size: usize,
        limit: usize,
    },
    #[error("failed to write {path}: {reason}")]
    Write { path: String, reason: String },
}

/// Whether kpt reads a file as KRM.
pub fn is_krm_file(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base == "Kptfile"
        || base.ends_with(".yaml")
        || base.ends_with(".yml")
        || base.ends_with(".json")
}

/// Checks a package file path: relative, slash-separated, no `.`/`..`
/// segments, no empty segments, no NUL or backslash.
///
/// # Errors
/// The first rule the path breaks.
pub fn check_path(path: &str) -> Result<(), PackageError> {
    let bad = |reason| PackageError::BadPath {
        path: path.to_owned(),
        reason,
    };
    if path.is_empty() {
        return Err(bad("empty path"));
    }
    if path.starts_with('/') {
        return Err(bad("absolute path"));
    }
    if path.contains('\0') || path.contains('\\') {
        return Err(bad("NUL or backslash in path"));
    }
    for segment in path.split('/') {
        match segment {
            "" => return Err(bad("empty path segment")),
            "." | ".." => return Err(bad("`.` or `..` path segment")),
            _ => {}
        }
    }
    Ok(())
}

/// The package directories (`""` for the root), parents before children.
pub fn package_dirs(files: &Files) -> Vec<String> {
    let mut dirs: Vec<String> = files
        .keys()
        .filter_map(|p| {
            if p == "Kptfile" {
                Some(String::new())
            } else {
                p.strip_suffix("/Kptfile").map(str::to_owned)
            }
        })
        .filter(|d| !d.split('/').any(|s| s == ".git"))
        .collect();
    dirs.sort_by(|a, b| path_order(a, b));
    dirs
}

/// The nearest package directory that owns a file.
fn owner<'a>(path: &str, dirs: &'a [String]) -> Option<&'a String> {
    dirs.iter()
        .filter(|d| d.is_empty() || path.starts_with(&format!("{d}/")))
        .max_by_key(|d| d.len())
}

/// Order of a directory walk: component by component.
pub fn path_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.split('/').cmp(b.split('/'))
}

/// A package's `.krmignore` (gitignore syntax, the common subset): blank
/// lines and `#` comments skipped; `dir/` matches directories; a pattern
/// with a `/` is anchored to the package, one without matches any name;
/// `*`, `?` and `**` globs; `!` re-includes.
#[derive(Debug, Default, Clone)]
struct Ignore {
    rules: Vec<(bool, bool, bool, String)>,
}

impl Ignore {
    fn parse(text: &str) -> Self {
        let mut rules = Vec::new();
        for line in text.lines() {
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (negate, line) = match line.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, line),
            };
            let (dir_only, line) = match line.strip_suffix('/') {
                Some(rest) => (true, rest),
                None => (false, line),
            };
            let anchored = line.contains('/');
            rules.push((
                negate,
                dir_only,
                anchored,
                line.trim_start_matches('/').to_owned(),
            ));
        }
        Ignore { rules }
    }

    /// Whether a path relative to the package is ignored.
    fn ignores(&self, rel: &str) -> bool {
        let segments: Vec<&str> = rel.split('/').collect();
        let mut ignored = false;
        for (negate, dir_only, anchored, pattern) in &self.rules {
            // Every directory prefix, then (unless dir-only) the file itself.
            let candidates = (1..=segments.len()).filter(|&n| !*dir_only || n < segments.len());
            let hit = candidates.into_iter().any(|n| {
                if *anchored {
                    glob(pattern, &segments[..n].join("/"))
                } else {
                    glob(pattern, segments[n - 1])
                }
            });
            if hit {
                ignored = !negate;
            }
        }
        ignored
    }
}

/// A glob over slash paths: `*` and `?` within a segment, `**` across.
///
/// Matched as an automaton: the set of text positions the pattern so far
/// can end at, one pattern token at a time, so a hostile `.krmignore` line
/// of many stars costs its length times the path's, never an exponential
/// search.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), text.as_bytes());
    let mut at = vec![false; s.len() + 1];
    let mut next = vec![false; s.len() + 1];
    at[0] = true;
    let mut k = 0;
    while k < p.len() {
        next.fill(false);
        match p[k] {
            b'*' if p.get(k + 1) == Some(&b'*') => {
                k += 2;
                if p.get(k) == Some(&b'/') {
                    k += 1;
                }
                if let Some(first) = at.iter().position(|r| *r) {
                    next[first..].fill(true);
                }
            }
            b'*' => {
                k += 1;
                let mut open = false;
                for j in 0..=s.len() {
                    open = at[j] || (open && s[j - 1] != b'/');
                    next[j] = open;
                }
            }
            c => {
                k += 1;
                for j in 0..s.len() {
                    next[j + 1] = at[j] && if c == b'?' { s[j] != b'/' } else { s[j] == c };
                }
            }
        }
        std::mem::swap(&mut at, &mut next);
        if !at.contains(&true) {
            return false;
        }
    }
    at[s.len()]
}

/// All resources of the package tree, each package's in file order, packages
/// in walk order.
///
/// # Errors
/// Bad paths, non-UTF-8 or oversized KRM files, YAML syntax errors.
pub fn read_resources(files: &Files) -> Result<Vec<Resource>, PackageError> {
    let dirs = package_dirs(files);
    let mut paths: Vec<&String> = files.keys().filter(|p| is_krm_file(p)).collect();
    paths.sort_by(|a, b| path_order(a, b));
    let ignores: BTreeMap<&String, Ignore> = dirs
        .iter()
        .filter_map(|d| {
            let file = if d.is_empty() {
                ".krmignore".to_owned()
            } else {
                format!("{d}/.krmignore")
            };
            let text = std::str::from_utf8(files.get(&file)?).ok()?;
            Some((d, Ignore::parse(text)))
        })
        .collect();
    let mut out = Vec::new();
    for path in paths {
        check_path(path)?;
        if path.split('/').any(|s| s == ".git") {
            continue;
        }
        let Some(package) = owner(path, &dirs) else {
            continue;
        };
        let rel_to_package = if package.is_empty() {
            path.as_str()
        } else {
            &path[package.len() + 1..]
        };
        if rel_to_package != "Kptfile"
            && ignores
                .get(package)
                .is_some_and(|i| i.ignores(rel_to_package))
        {
            continue;
        }
        let bytes = &files[path];
        if bytes.len() > MAX_FILE_BYTES {
            return Err(PackageError::TooLarge {
                path: path.clone(),
                size: bytes.len(),
                limit: MAX_FILE_BYTES,
            });
        }
        let text =
            std::str::from_utf8(bytes).map_err(|_| PackageError::NotUtf8 { path: path.clone() })?;
        let docs = yaml::parse_documents(text).map_err(|source| PackageError::Yaml {
            path: path.clone(),
            source,
        })?;
        let rel = if package.is_empty() {
            path.clone()
        } else {
            path[package.len() + 1..].to_owned()
        };
        for (index, mut doc) in docs.into_iter().enumerate() {
            let seq_indent = SeqIndent::derive(&doc.text);
            ensure_annotations(&mut doc.root);
            out.push(Resource::new(
                doc.root,
                Origin {
                    package: package.clone(),
                    path: rel.clone(),
                    index: Some(index),
                    seq_indent,
                },
            ));
        }
    }
    Ok(out)
}

/// kpt adds its annotations to every object when it reads a package, so
/// `metadata.annotations` exists from then on, in the place it was created.
fn ensure_annotations(object: &mut Node) {
    if object.as_mapping().is_none() {
        return;
    }
    if let Some(metadata) = object.mapping_at("metadata") {
        metadata.mapping_at("annotations");
    }
}

/// Removes `metadata.annotations` when empty, then `metadata` when empty, as
/// kpt does when it takes its annotations off.
pub fn tidy_metadata(object: &mut Node) {
    let Some(metadata) = object.get_mut("metadata") else {
        return;
    };
    if metadata
        .get("annotations")
        .is_some_and(|a| a.as_mapping().is_some_and(Vec::is_empty))
    {
        metadata.remove("annotations");
    }
    if metadata.as_mapping().is_some_and(Vec::is_empty) {
        object.remove("metadata");
    }
}

/// The file name kpt gives an object a function created without a path:
/// `<namespace>/<kind>_<name>.yaml`, relative to the package.
pub fn default_path(resource: &Resource) -> String {
    let file = format!(
        "{}_{}.yaml",
        resource.kind().to_lowercase(),
        resource.name()
    );
    match resource.namespace() {
        "" => file,
        ns => format!("{ns}/{file}"),
    }
}

/// Writes resources back into the file map: every file that held resources
/// before (`previous`) or holds them now is re-encoded; files left without
/// resources are removed. Other files are kept as they are.
///
/// # Errors
/// A resource whose path leaves its package or collides with a non-KRM file.
pub fn write_resources(
    files: &Files,
    resources: Vec<Resource>,
    previous: &BTreeSet<String>,
) -> Result<Files, PackageError> {
    let mut by_file: BTreeMap<String, Vec<Resource>> = BTreeMap::new();
    for resource in resources {
        let path = resource.origin.root_path();
        check_path(&path).map_err(|_| PackageError::Write {
            path: path.clone(),
            reason: "function must not modify resources outside of package".into(),
        })?;
        by_file.entry(path).or_default().push(resource);
    }
    let mut out = files.clone();
    for path in previous {
        if !by_file.contains_key(path) {
            out.remove(path);
        }
    }
    for (path, mut items) in by_file {
        for r in &mut items {
            tidy_metadata(&mut r.object);
        }
        if out.contains_key(&path) && !is_krm_file(&path) && !previous.contains(&path) {
            return Err(PackageError::Write {
                path,
                reason: "a function wrote a resource over a file that is not KRM".into(),
            });
        }
        // Stable: objects without an index first, then by index.
        items.sort_by_key(|r| r.origin.index.map_or(0, |i| i + 1));
        let bytes = if path.ends_with(".json") && items.len() == 1 {
            json_file(&items[0].object, &path)?
        } else {
            yaml::emit_documents(items.iter().map(|r| (&r.object, r.origin.seq_indent)))
                .into_bytes()
        };
        out.insert(path, bytes);
    }
    Ok(out)
}

/// A single-object JSON file: indented, keys sorted, as kpt writes it.
pub(crate) fn json_file(object: &Node, path: &str) -> Result<Vec<u8>, PackageError> {
    let value = yaml::to_json(object).map_err(|e| PackageError::Write {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let sorted = sort_json(value);
    let mut text = serde_json::to_string_pretty(&sorted).map_err(|e| PackageError::Write {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    text.push('\n');
    Ok(text.into_bytes())
}

fn sort_json(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let sorted: BTreeMap<String, serde_json::Value> =
                map.into_iter().map(|(k, v)| (k, sort_json(v))).collect();
            serde_json::Value::Object(sorted.into_iter().collect())
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sort_json).collect())
        }
        other => other,
    }
}

/// The KRM files of a package tree that hold at least one resource.
pub fn resource_files(resources: &[Resource]) -> BTreeSet<String> {
    resources.iter().map(|r| r.origin.root_path()).collect()
}

/// Turns a node built from JSON (flow collections, quoted strings) into the
/// block form kpt writes typed objects in.
pub fn to_block_style(node: &mut Node) {
    node.style = match (&node.value, node.style) {
        (Value::Scalar(_), yaml::Style::DoubleQuoted) => {
            node.tag = Some(yaml::STR_TAG.to_owned());
            yaml::Style::Plain
        }
        (Value::Scalar(_), style) => style,
        _ => yaml::Style::Plain,
    };
    match &mut node.value {
        Value::Sequence(items) => items.iter_mut().for_each(to_block_style),
        Value::Mapping(entries) => entries.iter_mut().for_each(|(k, v)| {
            to_block_style(k);
            k.tag = None;
            to_block_style(v);
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn krmignore_follows_gitignore_rules() {
        let ignore =
            Ignore::parse("# comment\n\nbuild/\n*.tmp.yaml\n/docs/*.yaml\n!docs/keep.yaml\n");
        assert!(ignore.ignores("build/out.yaml"));
        assert!(ignore.ignores("a/build/out.yaml"));
        assert!(!ignore.ignores("build"));
        assert!(ignore.ignores("x.tmp.yaml"));
        assert!(ignore.ignores("docs/a.yaml"));
        assert!(!ignore.ignores("docs/keep.yaml"));
        assert!(!ignore.ignores("other/docs/a.yaml"));
        assert!(!ignore.ignores("app.yaml"));
    }

    /// The backtracking matcher `glob` replaced, as the reference.
    fn backtracking(p: &[u8], s: &[u8]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some(b'*') if p.get(1) == Some(&b'*') => {
                let rest = p[2..].strip_prefix(b"/").unwrap_or(&p[2..]);
                (0..=s.len()).any(|i| backtracking(rest, &s[i..]))
            }
            Some(b'*') => (0..=s.len())
                .take_while(|&i| i == 0 || s[i - 1] != b'/')
                .any(|i| backtracking(&p[1..], &s[i..])),
            Some(b'?') => !s.is_empty() && s[0] != b'/' && backtracking(&p[1..], &s[1..]),
            Some(c) => s.first() == Some(c) && backtracking(&p[1..], &s[1..]),
        }
    }

    #[test]
    fn globs_match_as_the_backtracking_matcher_did() {
        // every pattern and text of up to four symbols from a small alphabet
        fn words(alphabet: &[u8], max: usize) -> Vec<Vec<u8>> {
            let mut out = vec![Vec::new()];
            let mut last = vec![Vec::new()];
            for _ in 0..max {
                last = last
                    .iter()
                    .flat_map(|w: &Vec<u8>| {
                        alphabet.iter().map(move |c| {
                            let mut w = w.clone();
                            w.push(*c);
                            w
                        })
                    })
                    .collect();
                out.extend(last.iter().cloned());
            }
            out
        }
        let patterns = words(b"a*?/", 5);
        let texts = words(b"ab/", 4);
        for p in &patterns {
            for t in &texts {
                let (ps, ts) = (
                    std::str::from_utf8(p).expect("ascii"),
                    std::str::from_utf8(t).expect("ascii"),
                );
                assert_eq!(glob(ps, ts), backtracking(p, t), "{ps:?} on {ts:?}");
            }
        }
    }

    #[test]
    fn a_hostile_glob_is_matched_in_time() {
        // backtracking took minutes on a fuzz input of this shape
        let pattern = format!("{}x", "*a".repeat(40));
        let started = std::time::Instant::now();
        assert!(!glob(&pattern, &"a".repeat(200)));
        let ignore = Ignore::parse(&format!("{}\n", "**a*".repeat(200)));
        assert!(!ignore.ignores(&format!("{}/b", "a".repeat(100))));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }
}
