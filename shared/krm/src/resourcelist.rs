//! The ResourceList wire format (spec §2.1–§2.3): what functions read on
//! stdin or over gRPC and write back, with kpt's annotations.

pub use porch_api::v1alpha1::{FieldRef as Field, FileRef, ResourceRef};

use crate::resource::{
    ID_ANNOTATION, INDEX_ANNOTATION, LEGACY_ID_ANNOTATION, LEGACY_INDEX_ANNOTATION,
    LEGACY_PATH_ANNOTATION, MIGRATION_ID_ANNOTATION, Origin, PACKAGE_PATH_ANNOTATION,
    PATH_ANNOTATION, Resource, SEQINDENT_ANNOTATION,
};
use crate::yaml::{self, Node, SeqIndent, Style, Value};

/// `apiVersion` kpt writes on ResourceLists.
pub const RESOURCE_LIST_API_VERSION: &str = "config.kubernetes.io/v1";

/// One structured result of a function (the type Porch's API carries), with
/// the constructors functions use ([`Results`]).
pub use porch_api::v1alpha1::ResultItem;

/// Constructors and checks for [`ResultItem`].
pub trait Results: Sized {
    fn info(message: impl Into<String>) -> Self;
    fn warning(message: impl Into<String>) -> Self;
    fn error(message: impl Into<String>) -> Self;
    /// Adds the field path and the resource's file.
    #[must_use]
    fn at(self, resource: &Resource, field_path: &str) -> Self;
    /// Adds a reference to the resource.
    #[must_use]
    fn about(self, resource: &Resource) -> Self;
    /// Error severity (the default when none is given).
    fn is_error(&self) -> bool;
}

impl Results for ResultItem {
    fn info(message: impl Into<String>) -> Self {
        ResultItem {
            message: message.into(),
            severity: "info".into(),
            ..Default::default()
        }
    }

    fn warning(message: impl Into<String>) -> Self {
        ResultItem {
            severity: "warning".into(),
            ..ResultItem::info(message)
        }
    }

    fn error(message: impl Into<String>) -> Self {
        ResultItem {
            severity: "error".into(),
            ..ResultItem::info(message)
        }
    }

    /// Adds the field path and the resource's file.
    fn at(mut self, resource: &Resource, field_path: &str) -> Self {
        if !field_path.is_empty() {
            self.field = Some(Field {
                path: field_path.to_owned(),
                ..Default::default()
            });
        }
        if !resource.origin.path.is_empty() {
            self.file = Some(FileRef {
                path: resource.origin.path.clone(),
                index: resource.origin.index.unwrap_or(0) as i64,
            });
        }
        self
    }

    /// Adds a reference to the resource.
    fn about(mut self, resource: &Resource) -> Self {
        self.resource_ref = Some(ResourceRef {
            api_version: resource.api_version().to_owned(),
            kind: resource.kind().to_owned(),
            name: resource.name().to_owned(),
            namespace: resource.namespace().to_owned(),
        });
        self
    }

    fn is_error(&self) -> bool {
        self.severity == "error" || self.severity.is_empty()
    }
}

/// Why a function's output could not be read.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum WireError {
    #[error("failed to parse function output: {0}")]
    Yaml(#[from] yaml::YamlError),
    #[error("function output is not a ResourceList: {0}")]
    Shape(String),
}

fn quoted(value: impl Into<String>) -> Node {
    let mut node = Node::string(value);
    node.style = Style::SingleQuoted;
    node
}

/// A resource as kpt sends it: its origin in annotations, plus the call id.
pub fn to_wire(resource: &Resource, id: usize, migration_id: usize) -> Node {
    let mut object = resource.object.clone();
    if object.as_mapping().is_none() {
        return object;
    }
    let origin = &resource.origin;
    let Some(metadata) = object.mapping_at("metadata") else {
        return object;
    };
    let Some(annotations) = metadata.mapping_at("annotations") else {
        return object;
    };
    let mut put = |key: &str, value: String| annotations.set(key, quoted(value));
    if let Some(index) = origin.index {
        put(LEGACY_INDEX_ANNOTATION, index.to_string());
    }
    if !origin.path.is_empty() {
        put(LEGACY_PATH_ANNOTATION, origin.path.clone());
    }
    if let Some(index) = origin.index {
        put(INDEX_ANNOTATION, index.to_string());
    }
    put(PACKAGE_PATH_ANNOTATION, origin.package_path());
    if !origin.path.is_empty() {
        put(PATH_ANNOTATION, origin.path.clone());
    }
    put(SEQINDENT_ANNOTATION, origin.seq_indent.as_str().to_owned());
    put(MIGRATION_ID_ANNOTATION, migration_id.to_string());
    put(ID_ANNOTATION, id.to_string());
    put(LEGACY_ID_ANNOTATION, id.to_string());
    object
}

/// Serialises a ResourceList the way kpt does: `apiVersion`, `kind`,
/// `items`, then `functionConfig`. Ids are 1-based positions.
pub fn encode(items: &[Resource], function_config: Option<&Node>) -> String {
    let mut list = Node::mapping();
    list.set("apiVersion", Node::plain(RESOURCE_LIST_API_VERSION));
    list.set("kind", Node::plain("ResourceList"));
    let mut seq = Node::sequence();
    seq.value = Value::Sequence(
        items
            .iter()
            .enumerate()
            .map(|(i, r)| to_wire(r, i + 1, i))
            .collect(),
    );
    if items.is_empty() {
        seq.style = Style::Flow;
    }
    list.set("items", seq);
    if let Some(config) = function_config {
        let mut config = config.clone();
        config.head_comment.clear();
        config.foot_comment.clear();
        list.set("functionConfig", config);
    }
    yaml::emit_document(&list, SeqIndent::Compact)
}

/// A decoded function output.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// Output objects, still carrying the wire annotations.
    pub items: Vec<Node>,
    pub results: Vec<ResultItem>,
    pub function_config: Option<Node>,
}

/// Parses a function's output ResourceList.
///
/// # Errors
/// Bad YAML, not a mapping, `items` not a list, malformed `results`.
pub fn decode(text: &str) -> Result<Decoded, WireError> {
    let Some(mut root) = yaml::parse_document(text)? else {
        return Err(WireError::Shape("empty output".into()));
    };
    if root.as_mapping().is_none() {
        return Err(WireError::Shape("the document is not a mapping".into()));
    }
    let kind = root.str_at(&["kind"]).unwrap_or("");
    if kind != "ResourceList" && kind != "List" {
        return Err(WireError::Shape(format!(
            "kind is {kind:?}, expected ResourceList"
        )));
    }
    let items = match root.remove("items") {
        None => Vec::new(),
        Some(n) if n.is_null() => Vec::new(),
        Some(n) => match n.value {
            Value::Sequence(items) => items,
            _ => return Err(WireError::Shape("`items` is not a list".into())),
        },
    };
    let function_config = root.remove("functionConfig").filter(|c| !c.is_null());
    let results = match root.get("results") {
        None => Vec::new(),
        Some(n) if n.is_null() => Vec::new(),
        Some(n) => {
            // The legacy framework wrapped results as {name, items}.
            let list = n.get("items").unwrap_or(n);
            let json = yaml::to_json(list).map_err(|e| WireError::Shape(e.to_string()))?;
            let mut results: Vec<ResultItem> = Vec::new();
            for value in json.as_array().cloned().unwrap_or_default() {
                results.push(decode_result(value)?);
            }
            results
        }
    };
    Ok(Decoded {
        items,
        results,
        function_config,
    })
}

fn decode_result(mut value: serde_json::Value) -> Result<ResultItem, WireError> {
    // The legacy resourceRef form {apiVersion, kind, metadata: {name, namespace}}.
    if let Some(reference) = value.get_mut("resourceRef")
        && let Some(metadata) = reference.get("metadata").cloned()
        && let Some(map) = reference.as_object_mut()
    {
        for key in ["name", "namespace"] {
            if let Some(v) = metadata.get(key) {
                map.insert(key.to_owned(), v.clone());
            }
        }
        map.remove("metadata");
    }
    // The legacy `suggestedValue` is `proposedValue`.
    if let Some(field) = value
        .get_mut("field")
        .and_then(serde_json::Value::as_object_mut)
        && let Some(suggested) = field.remove("suggestedValue")
    {
        field.entry("proposedValue").or_insert(suggested);
    }
    serde_json::from_value(value).map_err(|e| WireError::Shape(format!("bad result: {e}")))
}

/// The wire annotations of an output object, removed from it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WireAnnotations {
    pub id: Option<usize>,
    pub path: Option<String>,
    pub legacy_path: Option<String>,
    pub index: Option<String>,
    pub legacy_index: Option<String>,
    pub package_path: Option<String>,
    pub seq_indent: Option<String>,
}

/// Takes kpt's internal annotations off an object.
pub fn strip_wire_annotations(object: &mut Node) -> WireAnnotations {
    let mut found = WireAnnotations::default();
    let Some(metadata) = object.get_mut("metadata") else {
        return found;
    };
    let Some(annotations) = metadata.get_mut("annotations") else {
        return found;
    };
    let mut take = |key: &str| {
        annotations
            .remove(key)
            .and_then(|n| n.as_str().map(str::to_owned))
    };
    found.legacy_index = take(LEGACY_INDEX_ANNOTATION);
    found.legacy_path = take(LEGACY_PATH_ANNOTATION);
    found.index = take(INDEX_ANNOTATION);
    found.package_path = take(PACKAGE_PATH_ANNOTATION);
    found.path = take(PATH_ANNOTATION);
    found.seq_indent = take(SEQINDENT_ANNOTATION);
    take(MIGRATION_ID_ANNOTATION);
    let id = take(ID_ANNOTATION);
    let legacy_id = take(LEGACY_ID_ANNOTATION);
    found.id = id.or(legacy_id).and_then(|s| s.parse().ok());
    if annotations.as_mapping().is_some_and(Vec::is_empty) {
        metadata.remove("annotations");
    }
    if metadata.as_mapping().is_some_and(Vec::is_empty) {
        object.remove("metadata");
    }
    found
}

impl WireAnnotations {
    /// The origin these annotations describe, given the package the function
    /// ran in and the input object's origin (if the id matched one).
    ///
    /// # Errors
    /// Legacy and new annotations that disagree after a change.
    pub fn origin(&self, input: Option<&Origin>, running_package: &str) -> Result<Origin, String> {
        let path = reconcile(&self.path, &self.legacy_path, input.map(|o| o.path.clone()))
            .map_err(|()| {
                "resource input to function has mismatched legacy and internal path annotations"
                    .to_owned()
            })?;
        let index = reconcile(
            &self.index,
            &self.legacy_index,
            input.and_then(|o| o.index).map(|i| i.to_string()),
        )
        .map_err(|()| {
            "resource input to function has mismatched legacy and internal index annotations"
                .to_owned()
        })?;
        let package = match &self.package_path {
            Some(p) => p.trim_start_matches('/').to_owned(),
            None => running_package.to_owned(),
        };
        Ok(Origin {
            package,
            path: path.unwrap_or_default(),
            index: index.and_then(|i| i.parse().ok()),
            seq_indent: self
                .seq_indent
                .as_deref()
                .map(SeqIndent::from_annotation)
                .or(input.map(|o| o.seq_indent))
                .unwrap_or_default(),
        })
    }
}

/// kpt's rule: if a function changed only one of the pair, the other
/// follows; if both changed to different values, it is an error.
fn reconcile(
    new: &Option<String>,
    legacy: &Option<String>,
    before: Option<String>,
) -> Result<Option<String>, ()> {
    match (new, legacy) {
        (None, None) => Ok(None),
        (Some(v), None) | (None, Some(v)) => Ok(Some(v.clone())),
        (Some(n), Some(l)) if n == l => Ok(Some(n.clone())),
        (Some(n), Some(l)) => match before {
            Some(b) if *l == b => Ok(Some(n.clone())),
            Some(b) if *n == b => Ok(Some(l.clone())),
            _ => Err(()),
        },
    }
}
