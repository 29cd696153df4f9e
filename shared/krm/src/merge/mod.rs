//! Package upgrade (spec §6): merge what changed upstream (`original` →
//! `updated`) into the local copy, with kpt's four strategies.
//!
//! - `resource-merge`: per package, a three-way merge of the Kptfile and of
//!   every KRM object, non-KRM files synchronised, subpackages added or
//!   removed by the existence matrix;
//! - `fast-forward`: only when the local copy is unchanged, then replace;
//! - `force-delete-replace`: the Kptfile merged, everything else replaced;
//! - `copy-merge`: upstream files copied over local ones, files upstream
//!   deleted removed, local-only files kept.

mod three_way;

use std::collections::{BTreeMap, BTreeSet};

pub use three_way::{ListRule, merge, same};

use crate::package::{self, Files, PackageError};
use crate::resource::{Origin, Resource};
use crate::yaml::{self, Node, SeqIndent};

/// The four strategies of `kpt pkg update` / Porch's upgrade task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Strategy {
    #[default]
    ResourceMerge,
    FastForward,
    ForceDeleteReplace,
    CopyMerge,
}

impl Strategy {
    /// The strategy of a name; unknown names are resource-merge, as Porch
    /// does.
    pub fn from_name(name: &str) -> Self {
        match name {
            "fast-forward" => Strategy::FastForward,
            "force-delete-replace" => Strategy::ForceDeleteReplace,
            "copy-merge" => Strategy::CopyMerge,
            _ => Strategy::ResourceMerge,
        }
    }
}

/// Why an upgrade could not be done.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum MergeError {
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error("subpackage {0:?} added in both upstream and local")]
    SubpackageAddedInBoth(String),
    #[error(
        "found duplicate {which:?} resources in file {path:?}, please refer to \"update\" documentation for the fix"
    )]
    Duplicate { which: &'static str, path: String },
    #[error("local package files have been modified: [{}].\n  use a different update --strategy.", .0.join(" "))]
    LocalChanges(Vec<String>),
    #[error("failed to merge the Kptfile: {0}")]
    Kptfile(String),
}

/// Merges `original` → `updated` into `local`; returns the new local files.
///
/// # Errors
/// Conflicts the strategy cannot resolve, and unreadable packages.
pub fn update(
    original: &Files,
    updated: &Files,
    local: &Files,
    strategy: Strategy,
) -> Result<Files, MergeError> {
    match strategy {
        Strategy::ResourceMerge => resource_merge(original, updated, local),
        Strategy::FastForward => {
            let changed = local_changes(original, local);
            if !changed.is_empty() {
                return Err(MergeError::LocalChanges(changed));
            }
            let mut out = replace(original, updated, local)?;
            clear_render_status(&mut out)?;
            Ok(out)
        }
        Strategy::ForceDeleteReplace => replace(original, updated, local),
        Strategy::CopyMerge => copy_merge(original, updated, local),
    }
}

/// The package directories (`""` for the root) of a tree.
fn packages(files: &Files) -> BTreeSet<String> {
    package::package_dirs(files).into_iter().collect()
}

/// The files of one package (not of its subpackages), relative to it.
fn package_files(
    files: &Files,
    dir: &str,
    all_dirs: &BTreeSet<String>,
) -> BTreeMap<String, Vec<u8>> {
    let owner = |path: &str| -> String {
        all_dirs
            .iter()
            .filter(|d| d.is_empty() || path.starts_with(&format!("{d}/")))
            .max_by_key(|d| d.len())
            .cloned()
            .unwrap_or_default()
    };
    files
        .iter()
        .filter(|(p, _)| owner(p) == dir)
        .map(|(p, b)| {
            let rel = if dir.is_empty() {
                p.clone()
            } else {
                p[dir.len() + 1..].to_owned()
            };
            (rel, b.clone())
        })
        .collect()
}

fn join(dir: &str, rel: &str) -> String {
    if dir.is_empty() {
        rel.to_owned()
    } else {
        format!("{dir}/{rel}")
    }
}

fn is_merge_krm(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base != "Kptfile" && (base.ends_with(".yaml") || base.ends_with(".yml"))
}

fn under(path: &str, dir: &str) -> bool {
    dir.is_empty() || path == dir || path.starts_with(&format!("{dir}/"))
}

fn resource_merge(original: &Files, updated: &Files, local: &Files) -> Result<Files, MergeError> {
    let (o_dirs, u_dirs, l_dirs) = (packages(original), packages(updated), packages(local));
    let mut out = local.clone();
    let all: BTreeSet<&String> = o_dirs.iter().chain(&u_dirs).chain(&l_dirs).collect();
    for dir in all {
        if dir.is_empty() {
            continue;
        }
        let (o, u, l) = (
            o_dirs.contains(dir),
            u_dirs.contains(dir),
            l_dirs.contains(dir),
        );
        match (o, u, l) {
            (false, true, true) => return Err(MergeError::SubpackageAddedInBoth(dir.clone())),
            (false, true, false) => {
                for (p, b) in updated.iter().filter(|(p, _)| under(p, dir)) {
                    out.insert(p.clone(), b.clone());
                }
            }
            (true, false, true) => {
                let unchanged =
                    package_files(original, dir, &o_dirs) == package_files(local, dir, &l_dirs);
                if unchanged {
                    out.retain(|p, _| !under(p, dir));
                }
            }
            _ => {}
        }
    }
    // Packages in all three are merged, parents first.
    let mut dirs: Vec<&String> = l_dirs
        .iter()
        .filter(|d| o_dirs.contains(*d) && u_dirs.contains(*d))
        .collect();
    dirs.sort_by(|a, b| package::path_order(a, b));
    for dir in dirs {
        merge_package(
            original,
            updated,
            local,
            dir,
            (&o_dirs, &u_dirs, &l_dirs),
            &mut out,
        )?;
    }
    Ok(out)
}

type Dirs<'a> = (
    &'a BTreeSet<String>,
    &'a BTreeSet<String>,
    &'a BTreeSet<String>,
);

fn merge_package(
    original: &Files,
    updated: &Files,
    local: &Files,
    dir: &str,
    dirs: Dirs<'_>,
    out: &mut Files,
) -> Result<(), MergeError> {
    let o = package_files(original, dir, dirs.0);
    let u = package_files(updated, dir, dirs.1);
    let l = package_files(local, dir, dirs.2);

    // The Kptfile: upstream fields follow upstream only for subpackages.
    let kptfile = merge_kptfile(
        o.get("Kptfile"),
        u.get("Kptfile"),
        l.get("Kptfile"),
        !dir.is_empty(),
    )?;
    if let Some(k) = kptfile {
        out.insert(join(dir, "Kptfile"), k);
    }

    // KRM objects.
    let read = |files: &BTreeMap<String, Vec<u8>>,
                source: &'static str|
     -> Result<Vec<Resource>, MergeError> {
        let krm: Files = files
            .iter()
            .filter(|(p, _)| is_merge_krm(p))
            .map(|(p, b)| (p.clone(), b.clone()))
            .collect();
        let mut with_root = krm;
        with_root.insert(
            "Kptfile".into(),
            b"apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: x\n".to_vec(),
        );
        let mut resources = package::read_resources(&with_root)?;
        resources.retain(|r| r.origin.path != "Kptfile");
        for r in &mut resources {
            package::tidy_metadata(&mut r.object);
        }
        let mut seen = BTreeSet::new();
        for r in &resources {
            if !seen.insert(identity(r)) {
                return Err(MergeError::Duplicate {
                    which: source,
                    path: r.origin.path.clone(),
                });
            }
        }
        Ok(resources)
    };
    let (ro, ru, rl) = (
        read(&o, "original")?,
        read(&u, "updated")?,
        read(&l, "dest")?,
    );
    let find = |list: &[Resource], id: &Identity| list.iter().find(|r| &identity(r) == id).cloned();
    let mut merged: Vec<Resource> = Vec::new();
    for d in &rl {
        let id = identity(d);
        let (orig, upd) = (find(&ro, &id), find(&ru, &id));
        match (orig, upd) {
            (None, None) => merged.push(d.clone()),
            (Some(orig), None) => {
                if !objects_equal(&orig.object, &d.object) {
                    merged.push(d.clone());
                }
            }
            (orig, Some(upd)) => {
                let object = merge(
                    orig.as_ref().map(|r| &r.object),
                    Some(&upd.object),
                    Some(&d.object),
                    "",
                    ListRule::Schema,
                )
                .unwrap_or_else(|| d.object.clone());
                merged.push(Resource::new(object, d.origin.clone()));
            }
        }
    }
    for upd in &ru {
        let id = identity(upd);
        if rl.iter().any(|d| identity(d) == id) {
            continue;
        }
        // Present upstream and locally deleted: stays deleted.
        if find(&ro, &id).is_some() {
            continue;
        }
        let mut r = upd.clone();
        r.origin = Origin {
            index: None,
            ..r.origin
        };
        merged.push(r);
    }
    // Write the merged objects into their files; files left empty go.
    let mut by_file: BTreeMap<String, Vec<Resource>> = BTreeMap::new();
    for r in merged {
        by_file.entry(r.origin.path.clone()).or_default().push(r);
    }
    for path in l.keys().filter(|p| is_merge_krm(p)) {
        if !by_file.contains_key(path) {
            out.remove(&join(dir, path));
        }
    }
    for (path, items) in by_file {
        let text = yaml::emit_documents(items.iter().map(|r| (&r.object, r.origin.seq_indent)));
        out.insert(join(dir, &path), text.into_bytes());
    }

    // Non-KRM files: local changes stay, the rest follows upstream.
    let names: BTreeSet<&String> = o.keys().chain(u.keys()).chain(l.keys()).collect();
    for name in names {
        if name == "Kptfile" || is_merge_krm(name) {
            continue;
        }
        let (ob, ub, lb) = (o.get(name), u.get(name), l.get(name));
        let locally_changed = lb != ob;
        if locally_changed {
            continue;
        }
        match ub {
            Some(bytes) => {
                out.insert(join(dir, name), bytes.clone());
            }
            None => {
                out.remove(&join(dir, name));
            }
        }
    }
    Ok(())
}

/// Identity of an object for the merge: group, kind, namespace and name (from
/// the `kpt-merge` comment when there is one) and its file.
type Identity = (String, String, String, String, String);

fn identity(r: &Resource) -> Identity {
    let (mut namespace, mut name) = (r.namespace().to_owned(), r.name().to_owned());
    if let Some((key, _)) = r
        .object
        .as_mapping()
        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some("metadata")))
        && let Some(comment) = key.line_comment.as_deref()
        && let Some(rest) = comment.strip_prefix("# kpt-merge: ")
        && let Some((ns, n)) = rest.trim().split_once('/')
    {
        namespace = ns.to_owned();
        name = n.to_owned();
    }
    (
        r.group().to_owned(),
        r.kind().to_owned(),
        namespace,
        name,
        r.origin.path.clone(),
    )
}

/// Equal for the merge: the same tree apart from comments, styles and the
/// attribution annotation.
fn objects_equal(a: &Node, b: &Node) -> bool {
    let strip = |n: &Node| {
        let mut n = n.clone();
        let mut r = Resource::new(n.clone(), Origin::default());
        r.remove_annotation("cnrm.cloud.google.com/blueprint");
        n = r.object;
        n
    };
    same(&strip(a), &strip(b))
}

/// Names functions `_kpt-merge_<image>` for the merge when none has a name
/// and no image repeats, so pipelines merge by function.
fn name_functions(kptfiles: &mut [&mut Node]) -> bool {
    let mut any = false;
    for k in kptfiles.iter() {
        for list in ["mutators", "validators"] {
            for f in k
                .lookup(&["pipeline", list])
                .and_then(Node::as_sequence)
                .into_iter()
                .flatten()
            {
                if f.get("name").is_some() {
                    return false;
                }
                any = true;
            }
        }
    }
    for k in kptfiles.iter_mut() {
        for list in ["mutators", "validators"] {
            let mut seen = BTreeSet::new();
            if let Some(items) = k.lookup(&["pipeline", list]).and_then(Node::as_sequence) {
                for f in items {
                    let image = f.str_at(&["image"]).or(f.str_at(&["exec"])).unwrap_or("");
                    if !seen.insert(image.split(':').next().unwrap_or(image).to_owned()) {
                        return false;
                    }
                }
            }
        }
    }
    for k in kptfiles.iter_mut() {
        for list in ["mutators", "validators"] {
            if let Some(items) = k
                .lookup_mut(&["pipeline", list])
                .and_then(Node::as_sequence_mut)
            {
                for f in items {
                    let image = f
                        .str_at(&["image"])
                        .or(f.str_at(&["exec"]))
                        .unwrap_or("")
                        .to_owned();
                    let name = format!("_kpt-merge_{}", image.split(':').next().unwrap_or(&image));
                    f.set("name", Node::string(name));
                }
            }
        }
    }
    any
}

fn unname_functions(kptfile: &mut Node) {
    for list in ["mutators", "validators"] {
        if let Some(items) = kptfile
            .lookup_mut(&["pipeline", list])
            .and_then(Node::as_sequence_mut)
        {
            for f in items {
                if f.str_at(&["name"])
                    .is_some_and(|n| n.starts_with("_kpt-merge_"))
                {
                    f.remove("name");
                }
            }
        }
    }
}

fn parse_kptfile(bytes: Option<&Vec<u8>>) -> Result<Option<(Node, SeqIndent)>, MergeError> {
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    let text = std::str::from_utf8(bytes)
        .map_err(|_| MergeError::Kptfile("Kptfile is not UTF-8".into()))?;
    let node = yaml::parse_document(text).map_err(|e| MergeError::Kptfile(e.to_string()))?;
    Ok(node.map(|n| (n, SeqIndent::derive(text))))
}

/// The Kptfile three-way merge (spec §6.3): `upstream`/`upstreamLock` from
/// updated when `update_upstream`; name and namespace stay local; the rest
/// merged with list inference, upstream winning conflicts.
fn merge_kptfile(
    original: Option<&Vec<u8>>,
    updated: Option<&Vec<u8>>,
    local: Option<&Vec<u8>>,
    update_upstream: bool,
) -> Result<Option<Vec<u8>>, MergeError> {
    let Some((mut l, seq)) = parse_kptfile(local)? else {
        return Ok(updated.cloned());
    };
    let mut o = parse_kptfile(original)?
        .map(|(n, _)| n)
        .unwrap_or_else(Node::mapping);
    let mut u = parse_kptfile(updated)?
        .map(|(n, _)| n)
        .unwrap_or_else(Node::mapping);
    let named = name_functions(&mut [&mut o, &mut u, &mut l]);
    let mut merged =
        merge(Some(&o), Some(&u), Some(&l), "", ListRule::Inference).unwrap_or_else(|| l.clone());
    for key in ["upstream", "upstreamLock"] {
        let value = if update_upstream {
            u.get(key)
        } else {
            l.get(key)
        };
        match value {
            Some(v) => merged.set(key, v.clone()),
            None => {
                merged.remove(key);
            }
        }
    }
    for key in ["name", "namespace"] {
        let local_value = l.lookup(&["metadata", key]).cloned();
        if let Some(metadata) = merged.get_mut("metadata") {
            match local_value {
                Some(v) => metadata.set(key, v),
                None => {
                    metadata.remove(key);
                }
            }
        }
    }
    if named {
        unname_functions(&mut merged);
    }
    Ok(Some(yaml::emit_document(&merged, seq).into_bytes()))
}

fn krm_content(files: &Files) -> BTreeMap<&String, &Vec<u8>> {
    files
        .iter()
        .filter(|(p, _)| p.as_str() != "Kptfile")
        .collect()
}

/// Files of the package that differ between original and local (the root
/// Kptfile compared without upstream fields, status and name).
fn local_changes(original: &Files, local: &Files) -> Vec<String> {
    let mut changed: Vec<String> = Vec::new();
    let (o, l) = (krm_content(original), krm_content(local));
    for path in o.keys().chain(l.keys()).collect::<BTreeSet<_>>() {
        if o.get(path) != l.get(path) {
            changed.push((*path).clone());
        }
    }
    let normalise = |bytes: Option<&Vec<u8>>| -> Option<Node> {
        let (mut node, _) = parse_kptfile(bytes).ok().flatten()?;
        for key in ["upstream", "upstreamLock", "status"] {
            node.remove(key);
        }
        if let Some(metadata) = node.get_mut("metadata") {
            metadata.remove("name");
        }
        Some(node)
    };
    let (ok, lk) = (
        normalise(original.get("Kptfile")),
        normalise(local.get("Kptfile")),
    );
    let kptfile_same = match (&ok, &lk) {
        (Some(a), Some(b)) => same(a, b),
        (None, None) => true,
        _ => false,
    };
    if !kptfile_same {
        changed.insert(0, "Kptfile".into());
    }
    changed
}

/// force-delete-replace: the root Kptfile merged (upstream fields from
/// updated), everything else replaced by the updated package.
fn replace(original: &Files, updated: &Files, local: &Files) -> Result<Files, MergeError> {
    let mut out: Files = updated.clone();
    out.remove("Kptfile");
    if let Some(k) = merge_kptfile(
        original.get("Kptfile"),
        updated.get("Kptfile"),
        local.get("Kptfile"),
        true,
    )? {
        out.insert("Kptfile".into(), k);
    }
    Ok(out)
}

/// copy-merge: updated's files over local's, files deleted upstream removed,
/// local-only files kept.
fn copy_merge(original: &Files, updated: &Files, local: &Files) -> Result<Files, MergeError> {
    let mut out = local.clone();
    for (path, bytes) in updated {
        if path != "Kptfile" {
            out.insert(path.clone(), bytes.clone());
        }
    }
    for path in original.keys() {
        if !updated.contains_key(path) && path != "Kptfile" {
            out.remove(path);
        }
    }
    if let Some(k) = merge_kptfile(
        original.get("Kptfile"),
        updated.get("Kptfile"),
        local.get("Kptfile"),
        true,
    )? {
        out.insert("Kptfile".into(), k);
    }
    Ok(out)
}

/// Removes the `Rendered` condition and `renderStatus` from the root Kptfile.
fn clear_render_status(files: &mut Files) -> Result<(), MergeError> {
    let Some((mut node, seq)) = parse_kptfile(files.get("Kptfile"))? else {
        return Ok(());
    };
    if let Some(status) = node.get_mut("status") {
        status.remove("renderStatus");
        if let Some(conditions) = status.get_mut("conditions").and_then(Node::as_sequence_mut) {
            conditions.retain(|c| c.str_at(&["type"]) != Some("Rendered"));
        }
        if status
            .get("conditions")
            .and_then(Node::as_sequence)
            .is_some_and(Vec::is_empty)
        {
            status.remove("conditions");
        }
    }
    if node
        .get("status")
        .and_then(Node::as_mapping)
        .is_some_and(Vec::is_empty)
    {
        node.remove("status");
    }
    files.insert(
        "Kptfile".into(),
        yaml::emit_document(&node, seq).into_bytes(),
    );
    Ok(())
}

/// Porch's merge keys (spec §6.5): on every object with a name, namespace or
/// labels, the `# kpt-merge: <namespace>/<name>` comment on `metadata` and the
/// `internal.kpt.dev/upstream-identifier` annotation, where missing.
///
/// # Errors
/// Unreadable packages.
pub fn add_merge_keys(files: &Files, include_kptfiles: bool) -> Result<Files, MergeError> {
    let resources = package::read_resources(files)?;
    let previous = package::resource_files(&resources);
    let mut out = Vec::with_capacity(resources.len());
    for mut r in resources {
        let is_kptfile = r.kind() == "Kptfile" && r.group() == "kpt.dev";
        let has_identity = !r.name().is_empty()
            || !r.namespace().is_empty()
            || r.object.lookup(&["metadata", "labels"]).is_some();
        if has_identity && (include_kptfiles || !is_kptfile) {
            let (namespace, name) = (r.namespace().to_owned(), r.name().to_owned());
            let mut comment_ns = namespace.clone();
            if let Some(entries) = r.object.as_mapping_mut()
                && let Some((key, _)) = entries
                    .iter_mut()
                    .find(|(k, _)| k.as_str() == Some("metadata"))
            {
                match key
                    .line_comment
                    .as_deref()
                    .and_then(|c| c.strip_prefix("# kpt-merge: "))
                {
                    Some(existing) => {
                        if let Some((ns, _)) = existing.split_once('/') {
                            comment_ns = ns.to_owned();
                        }
                    }
                    None => key.line_comment = Some(format!("# kpt-merge: {namespace}/{name}")),
                }
            }
            if r.annotation(UPSTREAM_IDENTIFIER).is_none() {
                let ns = if comment_ns.is_empty() {
                    "default".to_owned()
                } else {
                    comment_ns
                };
                let value = format!("{}|{}|{ns}|{name}", r.group(), r.kind());
                r.set_annotation(UPSTREAM_IDENTIFIER, &value);
                // kyaml writes annotation values it sets single-quoted.
                if let Some(slot) =
                    r.object
                        .lookup_mut(&["metadata", "annotations", UPSTREAM_IDENTIFIER])
                {
                    slot.style = crate::yaml::Style::SingleQuoted;
                }
            }
        }
        out.push(r);
    }
    Ok(package::write_resources(files, out, &previous)?)
}

/// Annotation naming the upstream object a local one came from.
pub const UPSTREAM_IDENTIFIER: &str = "internal.kpt.dev/upstream-identifier";
