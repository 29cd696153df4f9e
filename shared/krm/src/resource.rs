//! One KRM object of a package, with where it came from.

use crate::yaml::{Node, SeqIndent};

/// kpt's path annotation (relative to the owning package while rendering).
pub const PATH_ANNOTATION: &str = "internal.config.kubernetes.io/path";
/// Position of the document in its file.
pub const INDEX_ANNOTATION: &str = "internal.config.kubernetes.io/index";
/// Legacy copy of [`PATH_ANNOTATION`].
pub const LEGACY_PATH_ANNOTATION: &str = "config.kubernetes.io/path";
/// Legacy copy of [`INDEX_ANNOTATION`].
pub const LEGACY_INDEX_ANNOTATION: &str = "config.kubernetes.io/index";
/// Sequence indentation of the document (`compact` / `wide`).
pub const SEQINDENT_ANNOTATION: &str = "internal.config.kubernetes.io/seqindent";
/// Absolute path of the owning package (`/`, `/sub`).
pub const PACKAGE_PATH_ANNOTATION: &str = "internal.config.kubernetes.io/package-path";
/// Per-call id used to map function output back to its input.
pub const ID_ANNOTATION: &str = "internal.config.kubernetes.io/id";
/// Legacy copy of [`ID_ANNOTATION`].
pub const LEGACY_ID_ANNOTATION: &str = "config.k8s.io/id";
/// Per-filter id kyaml adds to reconcile legacy and new annotations.
pub const MIGRATION_ID_ANNOTATION: &str =
    "internal.config.kubernetes.io/annotations-migration-resource-id";
/// "Not deployed": many functions skip such objects.
pub const LOCAL_CONFIG_ANNOTATION: &str = "config.kubernetes.io/local-config";

/// Where a resource lives: its package, file and position in the file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Origin {
    /// The owning package, relative to the root package (`""` for the root).
    pub package: String,
    /// The file, relative to the owning package. Empty for a generated object.
    pub path: String,
    /// Position of the document among the file's documents.
    pub index: Option<usize>,
    pub seq_indent: SeqIndent,
}

impl Origin {
    /// The file relative to the root package.
    pub fn root_path(&self) -> String {
        if self.package.is_empty() {
            self.path.clone()
        } else {
            format!("{}/{}", self.package, self.path)
        }
    }

    /// kpt's package-path annotation value (`/`, `/sub`).
    pub fn package_path(&self) -> String {
        format!("/{}", self.package)
    }
}

/// A KRM object with its origin.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub object: Node,
    pub origin: Origin,
}

impl Resource {
    pub fn new(object: Node, origin: Origin) -> Self {
        Resource { object, origin }
    }

    pub fn api_version(&self) -> &str {
        self.object.str_at(&["apiVersion"]).unwrap_or("")
    }

    pub fn kind(&self) -> &str {
        self.object.str_at(&["kind"]).unwrap_or("")
    }

    pub fn name(&self) -> &str {
        self.object.str_at(&["metadata", "name"]).unwrap_or("")
    }

    pub fn namespace(&self) -> &str {
        self.object.str_at(&["metadata", "namespace"]).unwrap_or("")
    }

    /// The API group (`""` for the core group).
    pub fn group(&self) -> &str {
        group_of(self.api_version())
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.object.str_at(&["metadata", "annotations", key])
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.object.str_at(&["metadata", "labels", key])
    }

    /// Whether the object is marked `config.kubernetes.io/local-config`
    /// (any value but `"false"`).
    pub fn is_local_config(&self) -> bool {
        self.annotation(LOCAL_CONFIG_ANNOTATION)
            .is_some_and(|v| v != "false")
    }

    /// Sets an annotation, creating `metadata.annotations` when needed.
    pub fn set_annotation(&mut self, key: &str, value: &str) {
        set_string_map_entry(&mut self.object, "annotations", key, value);
    }

    /// Sets a label, creating `metadata.labels` when needed.
    pub fn set_label(&mut self, key: &str, value: &str) {
        set_string_map_entry(&mut self.object, "labels", key, value);
    }

    /// Removes an annotation; drops `annotations` and `metadata` when they
    /// become empty, as kpt does.
    pub fn remove_annotation(&mut self, key: &str) {
        let Some(metadata) = self.object.get_mut("metadata") else {
            return;
        };
        let Some(annotations) = metadata.get_mut("annotations") else {
            return;
        };
        if annotations.remove(key).is_none() {
            return;
        }
        if annotations.as_mapping().is_some_and(Vec::is_empty) {
            metadata.remove("annotations");
        }
        if metadata.as_mapping().is_some_and(Vec::is_empty) {
            self.object.remove("metadata");
        }
    }

    /// Why this is not a KRM object, if it is not.
    pub fn krm_problem(&self) -> Option<&'static str> {
        if self.object.as_mapping().is_none() {
            return Some("resource must be a mapping");
        }
        if self.api_version().is_empty() {
            return Some("resource must have `apiVersion`");
        }
        if self.kind().is_empty() {
            return Some("resource must have `kind`");
        }
        if self.name().is_empty() {
            return Some("resource must have `metadata.name`");
        }
        None
    }

    /// Kustomization objects are exempt from the KRM check.
    pub fn is_kustomization(&self) -> bool {
        let base = self.origin.path.rsplit('/').next().unwrap_or("");
        matches!(
            base,
            "kustomization.yaml" | "kustomization.yml" | "Kustomization"
        ) || self.api_version().starts_with("kustomize.config.k8s.io/")
            || (self.kind() == "Kustomization" && self.api_version().is_empty())
    }
}

/// The group of an `apiVersion` (`apps/v1` → `apps`, `v1` → `""`).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

fn set_string_map_entry(object: &mut Node, field: &str, key: &str, value: &str) {
    let Some(metadata) = object.mapping_at("metadata") else {
        return;
    };
    let Some(map) = metadata.mapping_at(field) else {
        return;
    };
    match map.get_mut(key) {
        Some(existing) => existing.set_string(value),
        None => map.set(key, Node::string(value)),
    }
}
