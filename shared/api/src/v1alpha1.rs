//! `porch.kpt.dev/v1alpha1` PackageRevision, served as a CRD version beside
//! v1alpha2 and converted by the webhook (spec §2.1).
// `printcolumn(.., type_ = "string", ..)` repeats by design.
#![allow(clippy::duplicated_attributes)]

use crate::common::{
    GitPackage, Lifecycle, Locator, NameRef, PackageCondition, PackageMetadata, ReadinessGate,
    RepositoryType, UpgradeStrategy, lifecycle_opt,
};
use crate::schema::any_value;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Desired state of a package revision, v1alpha1 shape.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "porch.kpt.dev",
    version = "v1alpha1",
    kind = "PackageRevision",
    plural = "packagerevisions",
    singular = "packagerevision",
    shortname = "rpkg",
    category = "porch",
    namespaced,
    status = "PackageRevisionStatus",
    derive = "PartialEq",
    derive = "Default",
    storage = false,
    served = true,
    doc = "A revision of a kpt package (v1alpha1 shape, converted from v1alpha2).",
    printcolumn(name = "Package", type_ = "string", json_path = ".spec.packageName"),
    printcolumn(
        name = "WorkspaceName",
        type_ = "string",
        json_path = ".spec.workspaceName"
    ),
    printcolumn(name = "Revision", type_ = "integer", json_path = ".spec.revision"),
    printcolumn(
        name = "Latest",
        type_ = "string",
        json_path = ".metadata.labels['kpt\\.dev/latest-revision']"
    ),
    printcolumn(name = "Lifecycle", type_ = "string", json_path = ".spec.lifecycle"),
    printcolumn(name = "Repository", type_ = "string", json_path = ".spec.repository"),
    selectable = ".spec.revision",
    selectable = ".spec.packageName",
    selectable = ".spec.repository",
    selectable = ".spec.workspaceName",
    selectable = ".spec.lifecycle"
)]
#[serde(rename_all = "camelCase")]
pub struct PackageRevisionSpec {
    #[serde(default)]
    pub package_name: String,
    #[serde(default)]
    pub repository: String,
    #[serde(default)]
    pub workspace_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Deprecated; kept for round trips only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<NameRef>,
    #[serde(
        default,
        deserialize_with = "lifecycle_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub lifecycle: Option<Lifecycle>,
    /// At most one task is accepted on create; the first one is the source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<Task>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readiness_gates: Vec<ReadinessGate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_metadata: Option<PackageMetadata>,
}

/// Kind of a task.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum TaskType {
    Init,
    Clone,
    Edit,
    Upgrade,
    Render,
    Push,
    #[default]
    #[serde(rename = "")]
    Unspecified,
}

/// One operation in a revision's history.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    #[serde(rename = "type", default)]
    pub type_: TaskType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitTaskSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<CloneTaskSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit: Option<EditTaskSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeTaskSpec>,
}

/// `tasks[].init`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InitTaskSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subpackage: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keywords: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub site: String,
}

/// `tasks[].clone`: the JSON key `upstreamRef` holds the whole upstream.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CloneTaskSpec {
    #[serde(default, rename = "upstreamRef")]
    pub upstream: UpstreamPackage,
}

/// An upstream given directly (git, oci) or by reference to a registered revision.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamPackage {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<RepositoryType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitPackage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciPackage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ref: Option<NameRef>,
}

/// An OCI image upstream (never implemented by the reference; kept for round trips).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
pub struct OciPackage {
    #[serde(default)]
    pub image: String,
}

/// `tasks[].edit`: a copy of a published revision of the same package.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EditTaskSpec {
    #[serde(default, rename = "sourceRef", skip_serializing_if = "Option::is_none")]
    pub source: Option<NameRef>,
}

/// `tasks[].upgrade`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeTaskSpec {
    #[serde(default)]
    pub old_upstream_ref: NameRef,
    #[serde(default)]
    pub new_upstream_ref: NameRef,
    #[serde(default)]
    pub local_package_revision_ref: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<UpgradeStrategy>,
}

/// Observed state, v1alpha1 shape.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PackageRevisionStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_lock: Option<Locator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_lock: Option<Locator>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub published_by: String,
    /// JSON name `publishTimestamp` (v1alpha2: `publishedAt`).
    #[serde(
        default,
        rename = "publishTimestamp",
        skip_serializing_if = "Option::is_none"
    )]
    pub publish_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deployment: bool,
    /// kpt-style conditions copied from the Kptfile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PackageCondition>,
    /// Result of the last render of this revision's resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub render_status: Option<RenderStatus>,
}

/// The result of rendering a package.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RenderStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ResultList>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// kpt `FunctionResultList`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResultList {
    #[serde(default)]
    pub exit_code: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<FunctionResult>,
}

/// The results of one function.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FunctionResult {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub exec: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr: String,
    #[serde(default)]
    pub exit_code: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<ResultItem>,
}

/// One message of a function.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResultItem {
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub severity: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_ref: Option<ResourceRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<FieldRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileRef>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// The resource a result is about.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRef {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// The field a result is about; values may be any YAML.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FieldRef {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value")]
    pub current_value: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value")]
    pub proposed_value: Option<serde_json::Value>,
}

/// The file a result is about.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FileRef {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(default)]
    pub index: i64,
}
