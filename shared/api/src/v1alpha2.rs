//! `porch.kpt.dev/v1alpha2` PackageRevision: the storage version (spec §1).
// `printcolumn(.., type_ = "string", ..)` repeats by design.
#![allow(clippy::duplicated_attributes)]

use crate::common::{
    GitPackage, Lifecycle, Locator, NameRef, PackageCondition, PackageMetadata, ReadinessGate,
    RepositoryType, UpgradeStrategy, lifecycle_opt,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a package revision.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "porch.kpt.dev",
    version = "v1alpha2",
    kind = "PackageRevision",
    plural = "packagerevisions",
    singular = "packagerevision",
    shortname = "rpkg",
    category = "porch",
    namespaced,
    status = "PackageRevisionStatus",
    derive = "PartialEq",
    derive = "Default",
    storage = true,
    served = true,
    doc = "A revision of a kpt package in a registered repository.",
    printcolumn(name = "Package", type_ = "string", json_path = ".spec.packageName"),
    printcolumn(
        name = "WorkspaceName",
        type_ = "string",
        json_path = ".spec.workspaceName"
    ),
    printcolumn(name = "Revision", type_ = "string", json_path = ".status.revision"),
    printcolumn(
        name = "Latest",
        type_ = "string",
        json_path = ".metadata.labels['porch\\.kpt\\.dev/latest-revision']"
    ),
    printcolumn(name = "Lifecycle", type_ = "string", json_path = ".spec.lifecycle"),
    printcolumn(name = "Repository", type_ = "string", json_path = ".spec.repository"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    selectable = ".spec.lifecycle",
    selectable = ".spec.repository",
    selectable = ".spec.packageName",
    selectable = ".spec.workspaceName",
    selectable = ".status.revision"
)]
#[serde(rename_all = "camelCase")]
pub struct PackageRevisionSpec {
    /// Package path inside the repository, relative to the repository directory.
    #[serde(default)]
    pub package_name: String,
    /// Name of the Repository in the same namespace.
    #[serde(default)]
    pub repository: String,
    /// Short unique name of this revision within the package.
    #[serde(default)]
    pub workspace_name: String,
    /// Desired lifecycle; empty means Draft on create.
    #[serde(
        default,
        deserialize_with = "lifecycle_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub lifecycle: Option<Lifecycle>,
    /// How the revision is created. Exactly one member may be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PackageSource>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readiness_gates: Vec<ReadinessGate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_metadata: Option<PackageMetadata>,
}

/// The one way a revision is created.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.init), has(self.cloneFrom), has(self.copyFrom), has(self.upgrade)].filter(x, x).size() == 1",
    "message": "exactly one of init, cloneFrom, copyFrom, or upgrade must be set"
}]))]
pub struct PackageSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_from: Option<CloneSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_from: Option<NameRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeSpec>,
}

impl PackageSource {
    /// Names of the members that are set, in declaration order.
    pub fn members(&self) -> Vec<&'static str> {
        let mut set = Vec::new();
        if self.init.is_some() {
            set.push("init");
        }
        if self.clone_from.is_some() {
            set.push("cloneFrom");
        }
        if self.copy_from.is_some() {
            set.push("copyFrom");
        }
        if self.upgrade.is_some() {
            set.push("upgrade");
        }
        set
    }

    /// The value of `status.creationSource` this source produces.
    pub fn creation_source(&self) -> Option<&'static str> {
        match self.members().as_slice() {
            ["init"] => Some("init"),
            ["cloneFrom"] => Some("clone"),
            ["copyFrom"] => Some("copy"),
            ["upgrade"] => Some("upgrade"),
            _ => None,
        }
    }
}

/// A new package from scratch.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InitSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subpackage: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keywords: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub site: String,
}

/// The first revision of a package, copied from an upstream.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CloneSpec {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<RepositoryType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitPackage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ref: Option<NameRef>,
}

/// A three-way merge of a new upstream into the current package.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeSpec {
    #[serde(default)]
    pub old_upstream: NameRef,
    #[serde(default)]
    pub new_upstream: NameRef,
    #[serde(default)]
    pub current_package: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<UpgradeStrategy>,
}

/// Observed state of a package revision.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PackageRevisionStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// >0 published, 0 or absent for drafts, -1 for the branch placeholder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_lock: Option<Locator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_lock: Option<Locator>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub published_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at: Option<Time>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deployment: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub observed_prr_resource_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rendering_prr_resource_version: String,
    /// `init`, `clone`, `copy` or `upgrade`, once the source has been applied.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub creation_source: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub package_conditions: Vec<PackageCondition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
