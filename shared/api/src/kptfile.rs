//! The Kptfile, `kpt.dev/v1` (krm-functions spec §3.1).
//!
//! Field order follows kpt's Go struct, so serialising gives kpt's key order.
//! Decoding is strict like kpt's: unknown fields and other versions are errors.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::common::{GitLock, PackageCondition, ReadinessGate, UpgradeStrategy};

/// `apiVersion` of the only Kptfile version kpt accepts.
pub const KPTFILE_API_VERSION: &str = "kpt.dev/v1";
/// `kind` of a Kptfile.
pub const KPTFILE_KIND: &str = "Kptfile";
/// Kptfile annotation: render subpackages after their parent (top-down).
pub const BFS_RENDERING_ANNOTATION: &str = "kpt.dev/bfs-rendering";
/// Kptfile annotation: keep partially rendered output when the pipeline fails.
pub const SAVE_ON_RENDER_FAILURE_ANNOTATION: &str = "kpt.dev/save-on-render-failure";

/// A decoded Kptfile.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Kptfile {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: KptfileMetadata,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Upstream>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_lock: Option<UpstreamLock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<PackageInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<Pipeline>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<Inventory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<KptfileStatus>,
}

/// Why a Kptfile could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum KptfileError {
    #[error("failed to parse Kptfile: {0}")]
    Parse(String),
    #[error(
        "Kptfile has apiVersion {found:?}: only {KPTFILE_API_VERSION} is supported (older versions are deprecated)"
    )]
    Version { found: String },
    #[error("Kptfile has kind {found:?}, expected {KPTFILE_KIND}")]
    Kind { found: String },
}

impl Kptfile {
    /// Decodes a Kptfile strictly, as kpt does.
    ///
    /// # Errors
    /// Bad YAML, unknown fields, another `apiVersion` or `kind`.
    pub fn from_yaml(text: &str) -> Result<Self, KptfileError> {
        let kptfile: Kptfile =
            serde_saphyr::from_str(text).map_err(|e| KptfileError::Parse(e.to_string()))?;
        if kptfile.api_version != KPTFILE_API_VERSION {
            return Err(KptfileError::Version {
                found: kptfile.api_version,
            });
        }
        if kptfile.kind != KPTFILE_KIND {
            return Err(KptfileError::Kind {
                found: kptfile.kind,
            });
        }
        Ok(kptfile)
    }

    /// Whether an annotation of the Kptfile is set to "true" (case-insensitive).
    pub fn annotation_is_true(&self, key: &str) -> bool {
        self.metadata
            .annotations
            .get(key)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

/// `metadata` of a Kptfile.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KptfileMetadata {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Where the package was fetched from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Upstream {
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<UpstreamGit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpgradeStrategy>,
}

/// `upstream.git`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamGit {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repo: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub directory: String,
    #[serde(default, rename = "ref", skip_serializing_if = "String::is_empty")]
    pub ref_: String,
}

/// `upstreamLock`: the resolved upstream of the last fetch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamLock {
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitLock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generic: Option<GenericLock>,
}

/// `upstreamLock.generic` (database-backed repositories).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GenericLock {
    #[serde(default, rename = "storeID", skip_serializing_if = "String::is_empty")]
    pub store_id: String,
    #[serde(
        default,
        rename = "resourceID",
        skip_serializing_if = "String::is_empty"
    )]
    pub resource_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
}

/// `info`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PackageInfo {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub site: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub emails: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub license: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub license_file: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keywords: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub man: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readiness_gates: Vec<ReadinessGate>,
}

/// `mutators:` with no value is an empty list, as kpt reads it.
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

/// `pipeline`: mutators run before validators.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pipeline {
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub mutators: Vec<Function>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub validators: Vec<Function>,
}

/// One step of a pipeline: exactly one of `image`/`exec`, at most one of
/// `configPath`/`configMap`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Function {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub exec: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config_path: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_map: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tag: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<Selector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<Selector>,
}

/// Which resources a function sees.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selector {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `inventory`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inventory {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(
        default,
        rename = "inventoryID",
        skip_serializing_if = "String::is_empty"
    )]
    pub inventory_id: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `status`, written by render.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KptfileStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PackageCondition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub render_status: Option<KptRenderStatus>,
}

/// `status.renderStatus`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KptRenderStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mutation_steps: Vec<PipelineStepResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_steps: Vec<PipelineStepResult>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_summary: String,
}

/// The outcome of one pipeline step.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PipelineStepResult {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub exec: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub execution_error: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr: String,
    /// Always emitted, as kpt does.
    #[serde(default)]
    pub exit_code: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<StepResultItem>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_results: Vec<StepResultItem>,
}

/// A function result as recorded in the Kptfile (values stringified).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepResultItem {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub severity: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_ref: Option<crate::v1alpha1::ResourceRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<StepField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<crate::v1alpha1::FileRef>,
}

/// `field` of a Kptfile result item.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepField {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub current_value: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub proposed_value: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_kpt_init_kptfile() {
        let text = "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: basens\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\ninfo:\n  description: sample\npipeline:\n  mutators:\n    - image: set-namespace:v0.4\n      configMap:\n        namespace: ns1\n";
        let k = Kptfile::from_yaml(text).expect("valid Kptfile");
        assert_eq!(k.metadata.name, "basens");
        let pipeline = k.pipeline.expect("pipeline");
        assert_eq!(pipeline.mutators[0].config_map["namespace"], "ns1");
        let empty = "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: x\npipeline:\n  mutators:\n  validators: ~\n";
        let kptfile = Kptfile::from_yaml(empty).expect("null lists are empty");
        assert!(
            kptfile
                .pipeline
                .is_some_and(|p| p.mutators.is_empty() && p.validators.is_empty())
        );
        assert_eq!(k.info.expect("info").description, "sample");
    }

    #[test]
    fn rejects_unknown_fields_versions_and_kinds() {
        let unknown = "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: x\nbogus: 1\n";
        let err = Kptfile::from_yaml(unknown).expect_err("unknown field");
        assert!(err.to_string().contains("bogus"), "{err}");
        let old = "apiVersion: kpt.dev/v1alpha2\nkind: Kptfile\nmetadata:\n  name: x\n";
        assert!(matches!(
            Kptfile::from_yaml(old),
            Err(KptfileError::Version { .. })
        ));
        let kind = "apiVersion: kpt.dev/v1\nkind: ConfigMap\nmetadata:\n  name: x\n";
        assert!(matches!(
            Kptfile::from_yaml(kind),
            Err(KptfileError::Kind { .. })
        ));
        assert!(matches!(
            Kptfile::from_yaml(": : :\n\t-"),
            Err(KptfileError::Parse(_))
        ));
    }

    #[test]
    fn bfs_annotation_is_case_insensitive() {
        let text = "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: x\n  annotations:\n    kpt.dev/bfs-rendering: \"TRUE\"\n";
        let k = Kptfile::from_yaml(text).expect("valid");
        assert!(k.annotation_is_true(BFS_RENDERING_ANNOTATION));
        assert!(!k.annotation_is_true(SAVE_ON_RENDER_FAILURE_ANNOTATION));
    }
}
