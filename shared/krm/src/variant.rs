//! The changes a PackageVariant makes to the package of its downstream draft
//! (packagevariants spec §2.6), as one pure function over the package's files:
//! the package context (§2.6.1), the variant's KRM functions (§2.6.2) and
//! config injection from in-cluster objects (§2.6.3), then whether anything
//! changed.
//!
//! The package is changed as YAML trees, never as text patches: files keep
//! their comments, key order and sequence indentation, and a file whose tree
//! the mutations leave as it was keeps its bytes. Errors carry the
//! reference's messages. Where this differs from the reference (injection
//! points in path order, lists refused as documents, gates and conditions
//! sorted only when they change, names with `.` refused), `docs/krm.md`
//! says why.

use std::collections::{BTreeSet, HashMap, HashSet};

use porch_api::kptfile::{Function, Pipeline};
use porch_api::variant::{InjectionSelector, PackageContext, PackageVariantSpec};
use serde_json::Value as Json;

use crate::package::{self, Files, MAX_FILE_BYTES, PackageError};
use crate::yaml::{self, Node, SeqIndent, Value};

/// Marks an object of the package as an injection point (`required` or
/// `optional`).
pub const CONFIG_INJECTION_ANNOTATION: &str = "kpt.dev/config-injection";
/// Names the in-cluster object injected into an injection point.
pub const INJECTED_RESOURCE_ANNOTATION: &str = "kpt.dev/injected-resource";
/// The file holding the package context.
pub const PACKAGE_CONTEXT_FILE: &str = "package-context.yaml";
/// The name of the package context ConfigMap.
pub const PACKAGE_CONTEXT_NAME: &str = "kptfile.kpt.dev";
/// First part of the names of the functions a variant adds.
pub const FUNCTION_NAME_PREFIX: &str = "PackageVariant";

const KPTFILE: &str = "Kptfile";
/// Reason of the condition of an injected point.
const INJECTED_REASON: &str = "ConfigInjected";
/// Reason of the condition of a point nothing was injected into.
const NOT_INJECTED_REASON: &str = "NoResourceSelected";
const NOT_INJECTED_MESSAGE: &str =
    "no resource matched any injection selector for this injection point";

/// Field order of a Kptfile, of its `info`, `pipeline` and `status` (kpt's
/// Go structs): where a field this module adds goes.
const KPTFILE_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "upstream",
    "upstreamLock",
    "info",
    "pipeline",
    "inventory",
    "status",
];
const INFO_FIELDS: &[&str] = &[
    "site",
    "emails",
    "license",
    "licenseFile",
    "description",
    "keywords",
    "man",
    "readinessGates",
];
const PIPELINE_FIELDS: &[&str] = &["mutators", "validators"];
const STATUS_FIELDS: &[&str] = &["conditions", "renderStatus"];
/// Field order of a function's selector (kpt's Go struct).
const SELECTOR_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "name",
    "namespace",
    "labels",
    "annotations",
];

/// The package after the variant's mutations.
#[derive(Clone, Debug, PartialEq)]
pub struct Mutated {
    /// All files of the package; those the mutations did not change keep
    /// their bytes.
    pub files: Files,
    /// Whether the package differs from the input: a file added, removed or
    /// changed, the root Kptfile compared by content, not text.
    pub changed: bool,
    /// What happened at each injection point, in file and document order.
    pub injection_points: Vec<InjectionPoint>,
}

/// One injection point of the package and its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectionPoint {
    /// The file, relative to the package root.
    pub file: String,
    pub kind: String,
    pub name: String,
    /// `config.injection.<Kind>.<name>`: the Kptfile condition and, for a
    /// required point, readiness gate.
    pub condition_type: String,
    pub required: bool,
    /// The in-cluster object injected, if one was.
    pub injected: Option<String>,
    /// Why nothing was injected.
    pub errors: Vec<String>,
}

/// Why a variant's mutations could not be applied. `package` is the name the
/// caller gave for the package (the PackageRevisionResources'
/// `<namespace>/<name>`), so the messages read as the reference's.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum VariantError {
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error(
        "variant name {0:?} contains '.': the functions it adds could not be recognised on the next pass"
    )]
    VariantName(String),
    #[error(
        "function name {0:?} contains '.': the function could not be recognised on the next pass"
    )]
    FunctionName(String),
    #[error("{file:?} not found in PackageRevisionResources '{package}'")]
    NotFound { file: String, package: String },
    #[error("failed to parse {file:?} of PackageRevisionResources {package}: {reason}")]
    Parse {
        file: String,
        package: String,
        reason: String,
    },
    #[error("{file:?} does not contain kind {kind:?} in PackageRevisionResources '{package}'")]
    Kind {
        file: String,
        kind: String,
        package: String,
    },
    #[error(
        "{file:?} does not contain resource named {name:?} in PackageRevisionResources '{package}'"
    )]
    Name {
        file: String,
        name: String,
        package: String,
    },
    #[error("PackageRevisionResources {package} PackageContext no data field found")]
    NoContextData { package: String },
    #[error("PackageRevisionResources {package} PackageContext invalid data field: {reason}")]
    ContextData { package: String, reason: String },
    #[error("{file:?} of PackageRevisionResources {package} is invalid: {reason}")]
    Invalid {
        file: String,
        package: String,
        reason: String,
    },
    /// A KRM file read for injection points that is not a list of objects.
    #[error("{file}: {reason}")]
    Objects { file: String, reason: String },
    #[error("errors in injection points: {}", .0.join(", "))]
    InjectionPoints(Vec<String>),
}

/// Applies a PackageVariant's mutations to a package (spec §2.6): the
/// package context, then the variant's functions in the Kptfile pipeline,
/// then config injection from `cluster` (the objects of the variant's
/// namespace that may be injected, any kinds, in the API version the package
/// uses them in). `package` names the package in error messages.
///
/// # Errors
/// Bad file paths; a variant or function name with `.`; a missing or
/// malformed Kptfile or `package-context.yaml`; a KRM file that does not
/// parse into objects; invalid or duplicate injection points.
///
/// # Example
/// ```
/// use porch_api::variant::{PackageContext, PackageVariantSpec};
/// use porch_krm::package::Files;
/// use porch_krm::variant::mutate_package;
///
/// let kptfile = b"apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: app\n";
/// let context = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kptfile.kpt.dev\ndata:\n  name: app # the package\n";
/// let files = Files::from([
///     ("Kptfile".to_owned(), kptfile.to_vec()),
///     ("package-context.yaml".to_owned(), context.to_vec()),
/// ]);
/// let spec = PackageVariantSpec {
///     package_context: Some(PackageContext {
///         data: [("region".to_owned(), "edge".to_owned())].into(),
///         ..PackageContext::default()
///     }),
///     ..PackageVariantSpec::default()
/// };
/// let mutated = mutate_package("app-edge", &spec, "default/app", &files, &[])?;
/// assert!(mutated.changed);
/// assert_eq!(
///     String::from_utf8_lossy(&mutated.files["package-context.yaml"]),
///     "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kptfile.kpt.dev\ndata:\n  name: app # the package\n  region: edge\n"
/// );
/// assert_eq!(mutated.files["Kptfile"], kptfile);
///
/// // a second pass finds nothing to do
/// let again = mutate_package("app-edge", &spec, "default/app", &mutated.files, &[])?;
/// assert!(!again.changed);
/// # Ok::<(), porch_krm::variant::VariantError>(())
/// ```
pub fn mutate_package(
    pv_name: &str,
    spec: &PackageVariantSpec,
    package: &str,
    files: &Files,
    cluster: &[Json],
) -> Result<Mutated, VariantError> {
    for path in files.keys() {
        package::check_path(path)?;
    }
    if pv_name.contains('.') {
        return Err(VariantError::VariantName(pv_name.to_owned()));
    }
    let mut work = Work::new(files, package);
    if let Some(context) = &spec.package_context {
        apply_package_context(&mut work, context)?;
    }
    apply_functions(&mut work, pv_name, spec.pipeline.as_ref())?;
    let injection_points = apply_injection(&mut work, &spec.injectors, cluster)?;
    let mut out = work.finish()?;
    let mut changed = out.len() != files.len() || files.keys().any(|p| !out.contains_key(p));
    for (path, bytes) in out.iter_mut() {
        let Some(before) = files.get(path) else {
            continue;
        };
        if before == bytes {
            continue;
        }
        if path == KPTFILE && same_content(before, bytes) {
            bytes.clone_from(before);
            continue;
        }
        changed = true;
    }
    Ok(Mutated {
        files: out,
        changed,
        injection_points,
    })
}

/// The name under which a variant adds a function:
/// `PackageVariant.<variant>.<function>.<position>`.
pub fn function_name(pv_name: &str, function: &str, position: usize) -> String {
    format!("{FUNCTION_NAME_PREFIX}.{pv_name}.{function}.{position}")
}

/// Whether a pipeline entry's name is one this variant gave: four
/// `.`-separated parts, the prefix, the variant's name, any function name
/// and an integer.
pub fn is_variant_function(name: &str, pv_name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    matches!(parts.as_slice(), [prefix, pv, _, position]
        if *prefix == FUNCTION_NAME_PREFIX && *pv == pv_name && position.parse::<i64>().is_ok())
}

/// One document of a file.
#[derive(Debug)]
struct Doc {
    node: Node,
    seq: SeqIndent,
}

/// The files being changed: parsed on first use, written back by
/// [`Work::finish`] when their trees differ from the original.
#[derive(Debug)]
struct Work<'a> {
    files: &'a Files,
    package: &'a str,
    parsed: std::collections::BTreeMap<String, Vec<Doc>>,
    touched: BTreeSet<String>,
}

/// The objects of a KRM file: every document must be a mapping.
fn parse_objects(bytes: &[u8]) -> Result<Vec<Doc>, String> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(format!(
            "file has {} bytes, more than the limit of {MAX_FILE_BYTES}",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "file is not UTF-8".to_owned())?;
    let docs =
        yaml::parse_documents(text).map_err(|e| format!("failed to parse input bytes: {e}"))?;
    docs.into_iter()
        .enumerate()
        .map(|(i, doc)| match &doc.root.value {
            Value::Mapping(_) => Ok(Doc {
                seq: SeqIndent::derive(&doc.text),
                node: doc.root,
            }),
            Value::Sequence(_) => Err(format!(
                "failed to extract objects: document {} is a list, not an object",
                i + 1
            )),
            // yaml.v3's node kinds, as the reference reports them
            Value::Scalar(_) => Err("failed to extract objects: unhandled node kind 8".into()),
            Value::Alias(_) => Err("failed to extract objects: unhandled node kind 16".into()),
        })
        .collect()
}

impl<'a> Work<'a> {
    fn new(files: &'a Files, package: &'a str) -> Self {
        Work {
            files,
            package,
            parsed: Default::default(),
            touched: BTreeSet::new(),
        }
    }

    /// The only object of a file, of a kind and name when given; the file
    /// is written back if it changes.
    fn object(
        &mut self,
        file: &str,
        kind: Option<&str>,
        name: Option<&str>,
    ) -> Result<&mut Node, VariantError> {
        let package = self.package.to_owned();
        if !self.parsed.contains_key(file) {
            let Some(bytes) = self.files.get(file) else {
                return Err(VariantError::NotFound {
                    file: file.to_owned(),
                    package,
                });
            };
            let docs = parse_objects(bytes).map_err(|reason| VariantError::Parse {
                file: file.to_owned(),
                package: package.clone(),
                reason,
            })?;
            self.parsed.insert(file.to_owned(), docs);
        }
        self.touched.insert(file.to_owned());
        let docs = self
            .parsed
            .get_mut(file)
            .expect("the file was parsed above");
        let count = docs.len();
        let [doc] = docs.as_mut_slice() else {
            return Err(VariantError::Parse {
                file: file.to_owned(),
                package,
                reason: format!("expected exactly one object, got {count}"),
            });
        };
        let object = &mut doc.node;
        if let Some(kind) = kind
            && object.str_at(&["kind"]) != Some(kind)
        {
            return Err(VariantError::Kind {
                file: file.to_owned(),
                kind: kind.to_owned(),
                package,
            });
        }
        if let Some(name) = name
            && object.str_at(&["metadata", "name"]) != Some(name)
        {
            return Err(VariantError::Name {
                file: file.to_owned(),
                name: name.to_owned(),
                package,
            });
        }
        Ok(object)
    }

    /// The objects of a KRM file.
    fn objects(&mut self, file: &str) -> Result<&mut Vec<Doc>, VariantError> {
        if !self.parsed.contains_key(file) {
            let bytes = self.files.get(file).map_or(&[][..], Vec::as_slice);
            let docs = parse_objects(bytes).map_err(|reason| VariantError::Objects {
                file: file.to_owned(),
                reason,
            })?;
            self.parsed.insert(file.to_owned(), docs);
        }
        Ok(self
            .parsed
            .get_mut(file)
            .expect("the file was parsed above"))
    }

    /// The files with the changed ones written back.
    fn finish(self) -> Result<Files, VariantError> {
        let mut out = self.files.clone();
        for file in &self.touched {
            let (Some(docs), Some(bytes)) = (self.parsed.get(file), self.files.get(file)) else {
                continue;
            };
            let unchanged = parse_objects(bytes).is_ok_and(|original| {
                original.len() == docs.len()
                    && original.iter().zip(docs).all(|(a, b)| a.node == b.node)
            });
            if unchanged {
                continue;
            }
            let text = if file.ends_with(".json") && docs.len() == 1 {
                package::json_file(&docs[0].node, file)?
            } else {
                yaml::emit_documents(docs.iter().map(|d| (&d.node, d.seq))).into_bytes()
            };
            out.insert(file.clone(), text);
        }
        Ok(out)
    }
}

/// Whether two Kptfile texts hold the same values.
fn same_content(a: &[u8], b: &[u8]) -> bool {
    let values = |bytes: &[u8]| -> Option<Vec<Json>> {
        let text = std::str::from_utf8(bytes).ok()?;
        yaml::parse_documents(text)
            .ok()?
            .iter()
            .map(|d| yaml::to_json(&d.root).ok())
            .collect()
    };
    match (values(a), values(b)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// Whether a node is a scalar that reads as this string.
fn reads_as(node: &Node, value: &str) -> bool {
    matches!(&node.value, Value::Scalar(_))
        && matches!(yaml::to_json(node), Ok(Json::String(s)) if s == value)
}

/// Sets a scalar to a string, leaving it as it is when it already reads as
/// that string (so its quoting stays).
fn set_str(node: &mut Node, value: &str) {
    if !reads_as(node, value) {
        *node = Node {
            head_comment: std::mem::take(&mut node.head_comment),
            line_comment: node.line_comment.take(),
            foot_comment: std::mem::take(&mut node.foot_comment),
            ..Node::string(value)
        };
    }
}

/// Sets a string entry of a mapping, appending it when missing.
fn set_entry(map: &mut Node, key: &str, value: &str) {
    match map.get_mut(key) {
        Some(existing) => set_str(existing, value),
        None => {
            if let Some(entries) = map.as_mapping_mut() {
                entries.push((Node::string(key), Node::string(value)));
            }
        }
    }
}

/// Inserts a key into a mapping at its place in `order` (before the first
/// key that comes later), or at the end when it has none.
fn insert_ordered(entries: &mut Vec<(Node, Node)>, key: &str, value: Node, order: &[&str]) {
    let rank = |k: &str| order.iter().position(|o| *o == k);
    let position = rank(key).and_then(|mine| {
        entries.iter().position(|(k, _)| {
            k.as_str()
                .and_then(&rank)
                .is_some_and(|theirs| theirs > mine)
        })
    });
    entries.insert(position.unwrap_or(entries.len()), (Node::plain(key), value));
}

/// The mapping at `key`, created in its place when missing; a null value
/// becomes an empty mapping. `None` when the value is not a mapping.
fn upsert_mapping<'n>(node: &'n mut Node, key: &str, order: &[&str]) -> Option<&'n mut Node> {
    let entries = node.as_mapping_mut()?;
    let index = match entries.iter().position(|(k, _)| k.as_str() == Some(key)) {
        Some(i) => i,
        None => {
            insert_ordered(entries, key, Node::mapping(), order);
            entries.iter().position(|(k, _)| k.as_str() == Some(key))?
        }
    };
    let value = &mut entries[index].1;
    if value.is_null() {
        let comment = value.line_comment.take();
        *value = Node::mapping();
        value.line_comment = comment;
    }
    value.as_mapping().is_some().then_some(value)
}

/// The items of a list field; a missing or null field is empty. `None` when
/// the value is not a list. A comment before the first item is read as that
/// item's, so it moves with the item when the list is reordered.
fn list_items(node: &Node, key: &str) -> Option<Vec<Node>> {
    match node.get(key) {
        None => Some(Vec::new()),
        Some(value) if value.is_null() => Some(Vec::new()),
        Some(value) => {
            let mut items = value.as_sequence()?.clone();
            if let Some(first) = items.first_mut() {
                let mut head = value.head_comment.clone();
                head.append(&mut first.head_comment);
                first.head_comment = head;
            }
            Some(items)
        }
    }
}

/// Puts a list into a mapping: replaces the value of an existing key
/// (keeping its comments; those before the first item are in the items) or
/// inserts the key in its place. A list that is still what [`list_items`]
/// read is left as it was.
fn put_list(map: &mut Node, key: &str, items: Vec<Node>, order: &[&str]) {
    if list_items(map, key).is_some_and(|old| old == items) && map.get(key).is_some() {
        return;
    }
    match map.get_mut(key) {
        Some(existing) => {
            existing.head_comment.clear();
            existing.value = Value::Sequence(items);
            existing.style = yaml::Style::Plain;
            existing.tag = None;
            existing.explicit_tag = false;
        }
        None => {
            if let Some(entries) = map.as_mapping_mut() {
                let mut list = Node::sequence();
                list.value = Value::Sequence(items);
                insert_ordered(entries, key, list, order);
            }
        }
    }
}

/// A YAML tree for a JSON value with mapping keys sorted (as Go writes
/// maps), `priority` keys first at the top.
fn json_node(value: &Json, priority: &[&str]) -> Node {
    fn sort_all(node: &mut Node) {
        sort_keys(node, &[]);
        match &mut node.value {
            Value::Mapping(entries) => entries.iter_mut().for_each(|(_, v)| sort_all(v)),
            Value::Sequence(items) => items.iter_mut().for_each(sort_all),
            _ => {}
        }
    }
    let mut node = yaml::from_json(value);
    sort_all(&mut node);
    sort_keys(&mut node, priority);
    node
}

/// Sorts a mapping's keys: `priority` keys first in that order, then the
/// others by name.
fn sort_keys(node: &mut Node, priority: &[&str]) {
    if let Value::Mapping(entries) = &mut node.value {
        let key = |n: &Node| {
            let text = n.as_str().unwrap_or("");
            let rank = priority
                .iter()
                .position(|p| *p == text)
                .unwrap_or(usize::MAX);
            (rank, text.to_owned())
        };
        entries.sort_by_cached_key(|(k, _)| key(k));
    }
}

// §2.6.1 ----------------------------------------------------------------

/// Sets the context's `data` keys in `package-context.yaml` (existing keys in
/// place, new ones appended in key order), then removes `removeKeys`.
fn apply_package_context(
    work: &mut Work<'_>,
    context: &PackageContext,
) -> Result<(), VariantError> {
    if context.data.is_empty() && context.remove_keys.is_empty() {
        return Ok(());
    }
    let package = work.package.to_owned();
    let config_map = work.object(
        PACKAGE_CONTEXT_FILE,
        Some("ConfigMap"),
        Some(PACKAGE_CONTEXT_NAME),
    )?;
    let Some(data) = config_map.get_mut("data").filter(|d| !d.is_null()) else {
        return Err(VariantError::NoContextData { package });
    };
    let Some(entries) = data.as_mapping_mut() else {
        return Err(VariantError::ContextData {
            package,
            reason: "`data` is not a map".into(),
        });
    };
    let mut index: HashMap<String, usize> = HashMap::with_capacity(entries.len());
    for (i, (key, value)) in entries.iter().enumerate() {
        let Some(key) = key.as_str() else {
            return Err(VariantError::ContextData {
                package,
                reason: format!("key {} of `data` is not a string", i + 1),
            });
        };
        if !matches!(value.value, Value::Scalar(_)) {
            return Err(VariantError::ContextData {
                package,
                reason: format!("the value of {key:?} is not a string"),
            });
        }
        index.insert(key.to_owned(), i);
    }
    for (key, value) in &context.data {
        match index.get(key) {
            Some(&i) => set_str(&mut entries[i].1, value),
            None => entries.push((Node::string(key.as_str()), Node::string(value.as_str()))),
        }
    }
    let remove: HashSet<&str> = context.remove_keys.iter().map(String::as_str).collect();
    entries.retain(|(key, _)| key.as_str().is_none_or(|k| !remove.contains(k)));
    Ok(())
}

// §2.6.2 ----------------------------------------------------------------

/// Replaces this variant's functions in the Kptfile pipeline with the ones
/// of its spec, first in each list; other entries stay as they are.
fn apply_functions(
    work: &mut Work<'_>,
    pv_name: &str,
    pipeline: Option<&Pipeline>,
) -> Result<(), VariantError> {
    let empty = Pipeline::default();
    let pipeline = pipeline.unwrap_or(&empty);
    for function in pipeline.mutators.iter().chain(&pipeline.validators) {
        if function.name.contains('.') {
            return Err(VariantError::FunctionName(function.name.clone()));
        }
    }
    let lists = [
        ("mutators", function_nodes(pv_name, &pipeline.mutators)),
        ("validators", function_nodes(pv_name, &pipeline.validators)),
    ];
    let package = work.package.to_owned();
    let kptfile = work.object(KPTFILE, None, None)?;
    set_functions(kptfile, pv_name, lists).map_err(|reason| VariantError::Invalid {
        file: KPTFILE.into(),
        package,
        reason,
    })
}

fn set_functions(
    kptfile: &mut Node,
    pv_name: &str,
    lists: [(&str, Vec<(String, Node)>); 2],
) -> Result<(), String> {
    let pipe =
        upsert_mapping(kptfile, "pipeline", KPTFILE_FIELDS).ok_or("`pipeline` is not a mapping")?;
    for (field, wanted) in lists {
        let existing =
            list_items(pipe, field).ok_or_else(|| format!("`pipeline.{field}` is not a list"))?;
        let (ours, theirs): (Vec<Node>, Vec<Node>) = existing.into_iter().partition(|entry| {
            entry
                .str_at(&["name"])
                .is_some_and(|name| is_variant_function(name, pv_name))
        });
        let mut items: Vec<Node> = wanted
            .into_iter()
            .map(|(name, node)| {
                // An entry written on an earlier pass stays as it is.
                let value = yaml::to_json(&node).ok();
                ours.iter()
                    .find(|old| {
                        old.str_at(&["name"]) == Some(name.as_str())
                            && yaml::to_json(old).ok() == value
                    })
                    .cloned()
                    .unwrap_or(node)
            })
            .collect();
        items.extend(theirs);
        if items.is_empty() {
            pipe.remove(field);
        } else {
            put_list(pipe, field, items, PIPELINE_FIELDS);
        }
    }
    if pipe.as_mapping().is_some_and(Vec::is_empty) {
        kptfile.remove("pipeline");
    }
    Ok(())
}

/// The variant's functions as pipeline entries, renamed, with their names:
/// `name` and `image` first, the other fields sorted, selectors in kpt's
/// field order.
fn function_nodes(pv_name: &str, functions: &[Function]) -> Vec<(String, Node)> {
    functions
        .iter()
        .enumerate()
        .map(|(i, function)| {
            let name = function_name(pv_name, &function.name, i);
            let mut node = Node::mapping();
            node.set("name", Node::string(name.as_str()));
            if !function.image.is_empty() {
                node.set("image", Node::string(function.image.as_str()));
            }
            let mut rest = Node::mapping();
            let strings = [
                ("configPath", &function.config_path),
                ("exec", &function.exec),
                ("tag", &function.tag),
            ];
            for (key, value) in strings {
                if !value.is_empty() {
                    rest.set(key, Node::string(value.as_str()));
                }
            }
            if !function.config_map.is_empty() {
                let mut map = Node::mapping();
                map.value = Value::Mapping(
                    function
                        .config_map
                        .iter()
                        .map(|(k, v)| (Node::string(k.as_str()), Node::string(v.as_str())))
                        .collect(),
                );
                rest.set("configMap", map);
            }
            for (key, selectors) in [
                ("selectors", &function.selectors),
                ("exclude", &function.exclude),
            ] {
                if selectors.is_empty() {
                    continue;
                }
                let items = selectors
                    .iter()
                    .map(|selector| {
                        let value = serde_json::to_value(selector)
                            .expect("a selector is strings and maps of strings");
                        json_node(&value, SELECTOR_FIELDS)
                    })
                    .collect();
                let mut list = Node::sequence();
                list.value = Value::Sequence(items);
                rest.set(key, list);
            }
            sort_keys(&mut rest, &[]);
            if let (Some(entries), Value::Mapping(more)) = (node.as_mapping_mut(), rest.value) {
                entries.extend(more);
            }
            (name, node)
        })
        .collect()
}

// §2.6.3 ----------------------------------------------------------------

/// An injection point while it is being worked on.
#[derive(Debug)]
struct Point {
    doc: usize,
    api_version: String,
    report: InjectionPoint,
}

/// An in-cluster object that may be injected.
#[derive(Debug)]
struct ClusterObject<'a> {
    api_version: &'a str,
    kind: &'a str,
    name: &'a str,
    object: &'a serde_json::Map<String, Json>,
}

fn text(value: Option<&Json>) -> Option<&str> {
    value.and_then(Json::as_str)
}

/// The objects of the list that have an apiVersion, a kind and a name;
/// anything else is passed over.
fn cluster_objects(cluster: &[Json]) -> Vec<ClusterObject<'_>> {
    cluster
        .iter()
        .filter_map(|value| {
            let object = value.as_object()?;
            let name = text(object.get("metadata").and_then(|m| m.get("name")))?;
            Some(ClusterObject {
                api_version: text(object.get("apiVersion"))?,
                kind: text(object.get("kind"))?,
                name,
                object,
            })
            .filter(|o| !o.name.is_empty())
        })
        .collect()
}

/// `(group, version)` of an `apiVersion` (`v1` → `("", "v1")`).
fn group_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

/// The injection annotation's value as text (a non-string value as JSON).
fn injection_annotation(object: &Node) -> Option<String> {
    let value = object
        .lookup(&["metadata", "annotations"])?
        .get(CONFIG_INJECTION_ANNOTATION)?;
    Some(match &value.value {
        Value::Scalar(_) if value.is_null() => String::new(),
        Value::Scalar(text) => text.clone(),
        _ => yaml::to_json(value).map_or_else(|_| "<alias>".to_owned(), |j| j.to_string()),
    })
}

/// Finds the injection points of every KRM file, injects the first object a
/// selector picks into each, and records conditions and readiness gates in
/// the Kptfile.
fn apply_injection(
    work: &mut Work<'_>,
    injectors: &[InjectionSelector],
    cluster: &[Json],
) -> Result<Vec<InjectionPoint>, VariantError> {
    let krm_files: Vec<&String> = work
        .files
        .keys()
        .filter(|p| package::is_krm_file(p) && !p.split('/').any(|s| s == ".git"))
        .collect();
    let mut points: Vec<Point> = Vec::new();
    for file in krm_files {
        for (index, doc) in work.objects(file)?.iter().enumerate() {
            let Some(annotation) = injection_annotation(&doc.node) else {
                continue;
            };
            let kind = doc.node.str_at(&["kind"]).unwrap_or("").to_owned();
            let name = doc
                .node
                .str_at(&["metadata", "name"])
                .unwrap_or("")
                .to_owned();
            let mut errors = Vec::new();
            let required = match annotation.as_str() {
                "required" => true,
                "optional" => false,
                other => {
                    errors.push(format!(
                        "{file}: {kind}/{name} has invalid {CONFIG_INJECTION_ANNOTATION:?} annotation value of {other:?}"
                    ));
                    false
                }
            };
            points.push(Point {
                doc: index,
                api_version: doc.node.str_at(&["apiVersion"]).unwrap_or("").to_owned(),
                report: InjectionPoint {
                    file: file.clone(),
                    condition_type: format!("config.injection.{kind}.{name}"),
                    kind,
                    name,
                    required,
                    injected: None,
                    errors,
                },
            });
        }
    }
    validate_points(&points)?;
    let cluster = cluster_objects(cluster);
    for point in &mut points {
        inject(work, point, injectors, &cluster)?;
    }
    let reports: Vec<InjectionPoint> = points.into_iter().map(|p| p.report).collect();
    record_in_kptfile(work, &reports)?;
    Ok(reports)
}

/// Point errors and duplicate condition types (each compared with the
/// previous point of the type), in point order.
fn validate_points(points: &[Point]) -> Result<(), VariantError> {
    let mut errors = Vec::new();
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for point in points {
        let report = &point.report;
        errors.extend(report.errors.iter().cloned());
        if let Some(previous) = seen.insert(&report.condition_type, &report.file) {
            errors.push(format!(
                "duplicate injection conditionType {:?} ({previous} and {})",
                report.condition_type, report.file
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(VariantError::InjectionPoints(errors))
    }
}

fn inject(
    work: &mut Work<'_>,
    point: &mut Point,
    injectors: &[InjectionSelector],
    cluster: &[ClusterObject<'_>],
) -> Result<(), VariantError> {
    let report = &mut point.report;
    if injectors.is_empty() {
        report.errors.push("no injectors defined".into());
        return Ok(());
    }
    let candidates: Vec<&ClusterObject<'_>> = cluster
        .iter()
        .filter(|o| o.api_version == point.api_version && o.kind == report.kind)
        .collect();
    if candidates.is_empty() {
        report.errors.push(format!(
            "no in-cluster resources of type {}.{}",
            point.api_version, report.kind
        ));
        return Ok(());
    }
    let (group, version) = group_version(&point.api_version);
    let applies = |s: &InjectionSelector| {
        s.group.as_deref().is_none_or(|g| g == group)
            && s.version.as_deref().is_none_or(|v| v == version)
            && s.kind.as_deref().is_none_or(|k| k == report.kind)
    };
    let Some(chosen) = injectors
        .iter()
        .filter(|s| applies(s))
        .find_map(|s| candidates.iter().find(|o| o.name == s.name))
    else {
        return Ok(());
    };
    let field = if group.is_empty() && report.kind == "ConfigMap" {
        "data"
    } else {
        "spec"
    };
    let Some(value) = chosen.object.get(field) else {
        report.errors.push(format!(
            "field {field:?} not found in resource {:?}",
            chosen.name
        ));
        return Ok(());
    };
    let docs = work.objects(&report.file)?;
    let object = &mut docs[point.doc].node;
    if object
        .get(field)
        .and_then(|f| yaml::to_json(f).ok())
        .as_ref()
        != Some(value)
    {
        object.set(field, json_node(value, &[]));
    }
    if let Some(annotations) = object.lookup_mut(&["metadata", "annotations"]) {
        set_entry(annotations, INJECTED_RESOURCE_ANNOTATION, chosen.name);
    }
    work.touched.insert(report.file.clone());
    report.injected = Some(chosen.name.to_owned());
    Ok(())
}

/// The desired Kptfile condition of a point: `(status, reason, message)`.
fn condition_of(report: &InjectionPoint) -> (&'static str, &'static str, String) {
    match &report.injected {
        Some(name) => (
            "True",
            INJECTED_REASON,
            format!("injected resource {name:?} from cluster"),
        ),
        None if report.errors.is_empty() => {
            ("False", NOT_INJECTED_REASON, NOT_INJECTED_MESSAGE.into())
        }
        None => ("False", NOT_INJECTED_REASON, report.errors.join(", ")),
    }
}

/// A readiness gate for each required point and a condition for each point
/// in the Kptfile. The lists are left as they are when they already say so;
/// otherwise they are updated and sorted by condition type, keeping the
/// other entries.
fn record_in_kptfile(work: &mut Work<'_>, reports: &[InjectionPoint]) -> Result<(), VariantError> {
    if reports.is_empty() {
        return Ok(());
    }
    let package = work.package.to_owned();
    let kptfile = work.object(KPTFILE, None, None)?;
    let required: BTreeSet<&str> = reports
        .iter()
        .filter(|r| r.required)
        .map(|r| r.condition_type.as_str())
        .collect();
    let gates = if required.is_empty() {
        Ok(())
    } else {
        set_gates(kptfile, &required)
    };
    gates
        .and_then(|()| set_conditions(kptfile, reports))
        .map_err(|reason| VariantError::Invalid {
            file: KPTFILE.into(),
            package,
            reason,
        })
}

fn set_gates(kptfile: &mut Node, required: &BTreeSet<&str>) -> Result<(), String> {
    let info = upsert_mapping(kptfile, "info", KPTFILE_FIELDS).ok_or("`info` is not a mapping")?;
    let gates = list_items(info, "readinessGates").ok_or("`info.readinessGates` is not a list")?;
    let mut present: HashSet<String> = HashSet::new();
    for (i, gate) in gates.iter().enumerate() {
        let Some(condition_type) = gate.str_at(&["conditionType"]) else {
            return Err(format!("`info.readinessGates[{i}]` has no `conditionType`"));
        };
        present.insert(condition_type.to_owned());
    }
    if required.iter().all(|r| present.contains(*r)) {
        return Ok(());
    }
    let mut seen: HashSet<String> = HashSet::new();
    let mut items: Vec<(String, Node)> = Vec::new();
    for gate in gates {
        let condition_type = gate.str_at(&["conditionType"]).unwrap_or("").to_owned();
        if seen.insert(condition_type.clone()) {
            items.push((condition_type, gate));
        }
    }
    for condition_type in required {
        if seen.insert((*condition_type).to_owned()) {
            let mut gate = Node::mapping();
            gate.set("conditionType", Node::string(*condition_type));
            items.push(((*condition_type).to_owned(), gate));
        }
    }
    items.sort_by(|a, b| a.0.cmp(&b.0));
    put_list(
        info,
        "readinessGates",
        items.into_iter().map(|(_, gate)| gate).collect(),
        INFO_FIELDS,
    );
    Ok(())
}

fn set_conditions(kptfile: &mut Node, reports: &[InjectionPoint]) -> Result<(), String> {
    let status =
        upsert_mapping(kptfile, "status", KPTFILE_FIELDS).ok_or("`status` is not a mapping")?;
    let mut conditions =
        list_items(status, "conditions").ok_or("`status.conditions` is not a list")?;
    for (i, condition) in conditions.iter().enumerate() {
        if condition.as_mapping().is_none() || condition.str_at(&["type"]).is_none() {
            return Err(format!("`status.conditions[{i}]` has no `type`"));
        }
    }
    let mut changed = false;
    for report in reports {
        let (state, reason, message) = condition_of(report);
        let wanted = [("status", state), ("reason", reason), ("message", &message)];
        let existing = conditions
            .iter_mut()
            .find(|c| c.str_at(&["type"]) == Some(report.condition_type.as_str()));
        match existing {
            Some(condition) => {
                for (key, value) in wanted {
                    if !condition.get(key).is_some_and(|v| reads_as(v, value)) {
                        set_entry(condition, key, value);
                        changed = true;
                    }
                }
            }
            None => {
                let mut condition = Node::mapping();
                condition.set("type", Node::string(report.condition_type.as_str()));
                for (key, value) in wanted {
                    condition.set(key, Node::string(value));
                }
                conditions.push(condition);
                changed = true;
            }
        }
    }
    if changed {
        conditions.sort_by(|a, b| a.str_at(&["type"]).cmp(&b.str_at(&["type"])));
        put_list(status, "conditions", conditions, STATUS_FIELDS);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_names_follow_the_reference() {
        assert_eq!(
            function_name("my-pv", "my-func", 3),
            "PackageVariant.my-pv.my-func.3"
        );
        assert_eq!(function_name("my-pv", "", 0), "PackageVariant.my-pv..0");
        for (name, pv, ours) in [
            ("PackageVariant.my-pv.my-func.0", "my-pv", true),
            ("PackageVariant.my-pv..0", "my-pv", true),
            ("PackageVariant.my-pv.my-func.-1", "my-pv", true),
            ("PackageVariant.too.many.dots.0", "too", false),
            ("PackageVariant.not-enough.dots", "not-enough", false),
            ("noprefix.my-pv.my-func.0", "my-pv", false),
            (
                "PackageVariant.my-pv.my-func.0",
                "actually-a-different-pv",
                false,
            ),
            ("PackageVariant.my-pv.my-func.str", "my-pv", false),
            ("", "my-pv", false),
        ] {
            assert_eq!(is_variant_function(name, pv), ours, "{name} of {pv}");
        }
    }

    #[test]
    fn keys_go_in_their_place() {
        let mut node = yaml::parse_document("apiVersion: v\nkind: K\nstatus: {}\n")
            .expect("parses")
            .expect("a document");
        let entries = node.as_mapping_mut().expect("mapping");
        insert_ordered(entries, "info", Node::mapping(), KPTFILE_FIELDS);
        insert_ordered(entries, "bogus", Node::mapping(), KPTFILE_FIELDS);
        let keys: Vec<&str> = entries.iter().filter_map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["apiVersion", "kind", "info", "status", "bogus"]);
    }

    #[test]
    fn strings_keep_their_quoting_when_unchanged() {
        let mut node = yaml::parse_document("a: 'x'\nb: \"True\"\nc: 3\n")
            .expect("parses")
            .expect("a document");
        let before = node.clone();
        set_entry(&mut node, "a", "x");
        set_entry(&mut node, "b", "True");
        assert_eq!(node, before);
        set_entry(&mut node, "c", "3");
        assert_eq!(
            yaml::emit_document(&node, SeqIndent::Compact),
            "a: 'x'\nb: \"True\"\nc: \"3\"\n"
        );
    }

    #[test]
    fn objects_are_mappings() {
        assert_eq!(
            parse_objects(b"baddata\n").err().as_deref(),
            Some("failed to extract objects: unhandled node kind 8")
        );
        assert_eq!(
            parse_objects(b"a: 1\n---\n- a: 1\n").err().as_deref(),
            Some("failed to extract objects: document 2 is a list, not an object")
        );
        assert!(
            parse_objects(b"a: [\n")
                .err()
                .is_some_and(|e| e.starts_with("failed to parse input bytes: yaml: line"))
        );
        assert_eq!(
            parse_objects(&[0xff, 0xfe]).err().as_deref(),
            Some("file is not UTF-8")
        );
        assert_eq!(parse_objects(b"# only a comment\n").map(|d| d.len()), Ok(0));
    }
}
