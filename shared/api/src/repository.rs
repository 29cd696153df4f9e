//! `config.porch.kpt.dev/v1alpha1` Repository (packagevariants spec §4).

use crate::common::{RepositoryType, SecretRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A git (or OCI) repository that holds packages.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "config.porch.kpt.dev",
    version = "v1alpha1",
    kind = "Repository",
    plural = "repositories",
    singular = "repository",
    shortname = "repo",
    category = "porch",
    namespaced,
    status = "RepositoryStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A repository of kpt packages registered with the package orchestrator.",
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63").message("metadata.name must be a DNS-1123 label of at most 63 characters"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Content", type_ = "string", json_path = ".spec.content"),
    printcolumn(name = "Sync Schedule", type_ = "string", json_path = ".spec.sync.schedule"),
    printcolumn(name = "Deployment", type_ = "boolean", json_path = ".spec.deployment"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.git.repo"),
    printcolumn(name = "Branch", type_ = "string", json_path = ".spec.git.branch"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(oldSelf.type) || (has(self.type) && self.type == oldSelf.type)", "message": "spec.type is immutable"},
    {"rule": "!has(self.content) || self.content == 'Package'", "message": "spec.content must be Package"}
]))]
pub struct RepositorySpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deployment: bool,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<RepositoryType>,
    /// Deprecated; `Package` is the only value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<RepositorySync>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitRepository>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciRepository>,
}

/// `spec.sync`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RepositorySync {
    /// Five-field cron schedule for full syncs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub schedule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_once_at: Option<Time>,
}

/// `spec.git`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.repo == oldSelf.repo", "message": "spec.git.repo is immutable"},
    {"rule": "(has(self.branch) ? self.branch : 'main') == (has(oldSelf.branch) ? oldSelf.branch : 'main')", "message": "spec.git.branch is immutable"},
    {"rule": "(has(self.directory) ? self.directory : '') == (has(oldSelf.directory) ? oldSelf.directory : '')", "message": "spec.git.directory is immutable"}
]))]
pub struct GitRepository {
    pub repo: String,
    #[serde(default = "default_branch")]
    #[schemars(length(min = 1))]
    pub branch: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub create_branch: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub directory: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub author: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub email: String,
}

fn default_branch() -> String {
    "main".to_owned()
}

/// `spec.oci` (experimental in the reference; types only here).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.registry == oldSelf.registry", "message": "spec.oci.registry is immutable"}
]))]
pub struct OciRepository {
    pub registry: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
}

/// `status` of a Repository.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_full_sync_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_full_sync_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_run_once_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_count: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub git_commit_hash: String,
}
