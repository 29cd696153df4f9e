//! Catalog functions in-process (spec §5): the same behaviour as the
//! `ghcr.io/kptdev/krm-functions-catalog` images, without a container.
//!
//! A builtin answers for its catalog name under the known registry prefixes
//! and for the tags of the series it implements; other tags go to the next
//! runtime (the function runner), so a pinned older version still runs the
//! image.

mod apply_replacements;
mod apply_setters;
mod ensure_name_substring;
mod scope;
mod search_replace;
mod set_annotations;
mod set_image;
mod set_labels;
mod set_namespace;
mod starlark;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::resource::Resource;
use crate::resourcelist::{ResultItem, Results};
use crate::runtime::{Call, FunctionError, FunctionOutput, FunctionRef, FunctionRuntime};
use crate::yaml::{self, Node};

/// Registry prefixes under which catalog images are known.
pub const CATALOG_PREFIXES: &[&str] = &["ghcr.io/kptdev/krm-functions-catalog/", "gcr.io/kpt-fn/"];

/// A function that failed: its results and a message.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub message: String,
    pub results: Vec<ResultItem>,
}

impl Failure {
    /// A failure with one error result carrying the message.
    pub fn new(message: impl Into<String>) -> Self {
        let message = message.into();
        Failure {
            results: vec![ResultItem::error(message.clone())],
            message,
        }
    }
}

/// One catalog function implemented in Rust.
pub trait Builtin: Send + Sync {
    /// Catalog name (`set-namespace`).
    fn name(&self) -> &'static str;
    /// Tag series implemented (`v0.4` answers `v0.4`, `v0.4.5`, …).
    fn series(&self) -> &'static [&'static str];
    /// Runs over the items in place.
    ///
    /// # Errors
    /// The function's failure, with its results.
    fn run(
        &self,
        items: &mut Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<Vec<ResultItem>, Failure>;
}

/// The builtin functions, looked up by image.
#[derive(Clone, Default)]
pub struct BuiltinRuntime {
    functions: BTreeMap<&'static str, Arc<dyn Builtin>>,
}

impl std::fmt::Debug for BuiltinRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltinRuntime")
            .field("functions", &self.functions.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl BuiltinRuntime {
    /// Every builtin of this crate.
    pub fn catalog() -> Self {
        let all: Vec<Arc<dyn Builtin>> = vec![
            Arc::new(set_namespace::SetNamespace),
            Arc::new(set_labels::SetLabels),
            Arc::new(set_annotations::SetAnnotations),
            Arc::new(apply_setters::ApplySetters),
            Arc::new(ensure_name_substring::EnsureNameSubstring),
            Arc::new(set_image::SetImage),
            Arc::new(search_replace::SearchReplace),
            Arc::new(apply_replacements::ApplyReplacements),
            Arc::new(starlark::Starlark),
        ];
        BuiltinRuntime {
            functions: all.into_iter().map(|f| (f.name(), f)).collect(),
        }
    }

    /// The builtin for an image, if there is one for its name and tag.
    pub fn lookup(&self, image: &str) -> Option<&Arc<dyn Builtin>> {
        let rest = CATALOG_PREFIXES
            .iter()
            .find_map(|p| image.strip_prefix(p))
            .unwrap_or(image);
        if rest.contains('/') || rest.contains('@') {
            return None;
        }
        let (name, tag) = rest.split_once(':').unwrap_or((rest, "latest"));
        let function = self.functions.get(name)?;
        let known = tag == "latest"
            || function
                .series()
                .iter()
                .any(|s| tag == *s || tag.strip_prefix(s).is_some_and(|r| r.starts_with('.')));
        known.then_some(function)
    }

    /// Catalog names of the builtins.
    pub fn names(&self) -> Vec<&'static str> {
        self.functions.keys().copied().collect()
    }

    /// Runs a builtin by catalog name (the exec mode of the function runner).
    ///
    /// # Errors
    /// Unknown name, or the function's failure.
    pub fn run_named(
        &self,
        name: &str,
        mut items: Vec<Resource>,
        config: Option<&Node>,
    ) -> Result<FunctionOutput, FunctionError> {
        let function = self
            .functions
            .get(name)
            .ok_or_else(|| FunctionError::NotFound(name.to_owned()))?;
        execute(function.as_ref(), &mut items, config).map(|results| FunctionOutput {
            items,
            results,
            stderr: String::new(),
        })
    }
}

fn execute(
    function: &dyn Builtin,
    items: &mut Vec<Resource>,
    config: Option<&Node>,
) -> Result<Vec<ResultItem>, FunctionError> {
    // A panic in a builtin is a function failure, not a crash of the host.
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| function.run(items, config)));
    match outcome {
        Ok(Ok(results)) => Ok(results),
        Ok(Err(failure)) => Err(FunctionError::Failed {
            message: failure.message,
            results: failure.results,
            stderr: String::new(),
            exit_code: 1,
        }),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(FunctionError::Runtime(format!(
                "KRM function panicked with: {what}"
            )))
        }
    }
}

impl FunctionRuntime for BuiltinRuntime {
    fn handles(&self, function: &FunctionRef) -> bool {
        matches!(function, FunctionRef::Image(image) if self.lookup(image).is_some())
    }

    fn run(&self, call: Call<'_>) -> Result<FunctionOutput, FunctionError> {
        let FunctionRef::Image(image) = call.function else {
            return Err(FunctionError::NotFound(call.function.display().to_owned()));
        };
        let Some(function) = self.lookup(image) else {
            return Err(FunctionError::NotFound(image.clone()));
        };
        let mut items = call.items;
        let results = execute(function.as_ref(), &mut items, call.config)?;
        Ok(FunctionOutput {
            items,
            results,
            stderr: String::new(),
        })
    }
}

/// A field of some kinds a function also edits (`additional…Fields`,
/// `fieldSpecs`): the kind by group/version/kind (empty matches any), the
/// field by a slash path.
#[derive(serde::Deserialize, Debug, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FieldSpec {
    #[serde(default)]
    pub(crate) group: String,
    #[serde(default)]
    pub(crate) version: String,
    #[serde(default)]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) path: String,
    #[serde(default)]
    pub(crate) create: bool,
}

impl FieldSpec {
    /// The path segments, if the spec applies to this object.
    pub(crate) fn segments_for(&self, r: &Resource) -> Option<Vec<&str>> {
        (is_gvk(r, &self.group, &self.version, &self.kind) && !self.path.is_empty())
            .then(|| self.path.split('/').collect())
    }
}

/// `data` of a ConfigMap-like functionConfig as strings (any kind is read
/// through its `data`).
pub(crate) fn config_data(config: &Node) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(entries) = config.get("data").and_then(Node::as_mapping) {
        for (k, v) in entries {
            if let (Some(k), Some(v)) = (k.as_str(), v.as_str()) {
                out.insert(k.to_owned(), v.to_owned());
            }
        }
    }
    out
}

/// `(apiVersion, kind)` of a functionConfig.
pub(crate) fn config_kind(config: &Node) -> (&str, &str) {
    (
        config.str_at(&["apiVersion"]).unwrap_or(""),
        config.str_at(&["kind"]).unwrap_or(""),
    )
}

/// Decodes a typed functionConfig.
pub(crate) fn typed_config<T: serde::de::DeserializeOwned>(config: &Node) -> Result<T, Failure> {
    let json = yaml::to_json(config)
        .map_err(|e| Failure::new(format!("failed to read functionConfig: {e}")))?;
    serde_json::from_value(json)
        .map_err(|e| Failure::new(format!("failed to read functionConfig: {e}")))
}

/// SDK `IsGVK`: empty arguments or empty object values match anything.
pub(crate) fn is_gvk(r: &Resource, group: &str, version: &str, kind: &str) -> bool {
    let api = r.api_version();
    let (g, v) = match api.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api),
    };
    let ok = |want: &str, have: &str| want.is_empty() || have.is_empty() || want == have;
    ok(group, g) && ok(version, v) && ok(kind, r.kind())
}

/// Runs a builtin as a KRM function over a ResourceList text, as an
/// executable function does: objects keep every annotation kpt sent, and the
/// output ResourceList carries the results. Returns the output and whether
/// the function succeeded.
///
/// # Errors
/// An input that is not a ResourceList, or an unknown function.
pub fn process_resource_list(
    runtime: &BuiltinRuntime,
    name: &str,
    input: &str,
) -> Result<(String, bool), FunctionError> {
    let decoded =
        crate::resourcelist::decode(input).map_err(|e| FunctionError::Runtime(e.to_string()))?;
    let config = decoded.function_config;
    let mut items: Vec<Resource> = decoded
        .items
        .into_iter()
        .map(|object| {
            let mut probe = object.clone();
            let wire = crate::resourcelist::strip_wire_annotations(&mut probe);
            let origin = wire.origin(None, "").unwrap_or_default();
            Resource::new(object, origin)
        })
        .collect();
    let function = runtime
        .functions
        .get(name)
        .ok_or_else(|| FunctionError::NotFound(name.to_owned()))?;
    let (results, ok) = match execute(function.as_ref(), &mut items, config.as_ref()) {
        Ok(results) => (results, true),
        Err(FunctionError::Failed { results, .. }) => (results, false),
        Err(other) => (vec![ResultItem::error(other.to_string())], false),
    };
    let mut list = Node::mapping();
    list.set(
        "apiVersion",
        Node::plain(crate::resourcelist::RESOURCE_LIST_API_VERSION),
    );
    list.set("kind", Node::plain("ResourceList"));
    let mut seq = Node::sequence();
    seq.value = yaml::Value::Sequence(items.into_iter().map(|r| r.object).collect());
    if seq.as_sequence().is_some_and(Vec::is_empty) {
        seq.style = yaml::Style::Flow;
    }
    list.set("items", seq);
    if let Some(config) = config {
        list.set("functionConfig", config);
    }
    if !results.is_empty() {
        let node = crate::render::typed_to_node(&results).map_err(FunctionError::Runtime)?;
        list.set("results", node);
    }
    Ok((yaml::emit_document(&list, yaml::SeqIndent::Compact), ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_find_builtins_by_name_and_series() {
        let rt = BuiltinRuntime::catalog();
        assert!(
            rt.lookup("ghcr.io/kptdev/krm-functions-catalog/set-namespace:v0.4.5")
                .is_some()
        );
        assert!(rt.lookup("gcr.io/kpt-fn/set-labels:v0.2").is_some());
        assert!(
            rt.lookup("ghcr.io/kptdev/krm-functions-catalog/set-namespace:latest")
                .is_some()
        );
        // Other series and other registries go to the next runtime.
        assert!(
            rt.lookup("ghcr.io/kptdev/krm-functions-catalog/set-namespace:v0.2.0")
                .is_none()
        );
        assert!(
            rt.lookup("ghcr.io/kptdev/krm-functions-catalog/set-namespace:v0.40")
                .is_none()
        );
        assert!(rt.lookup("example.com/fns/set-namespace:v0.4").is_none());
        assert!(
            rt.lookup("ghcr.io/kptdev/krm-functions-catalog/unknown:v1")
                .is_none()
        );
    }
}
