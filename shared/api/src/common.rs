//! Types shared by both PackageRevision versions (spec §1.2, §1.3, §2.1).

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The lifecycle of a package revision.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    Draft,
    Proposed,
    Published,
    DeletionProposed,
}

impl Lifecycle {
    /// Every lifecycle value, in the order of the state machine.
    pub const ALL: [Lifecycle; 4] = [
        Lifecycle::Draft,
        Lifecycle::Proposed,
        Lifecycle::Published,
        Lifecycle::DeletionProposed,
    ];

    /// Published and DeletionProposed revisions have a tag in git (spec §8 item 3).
    pub fn is_published(self) -> bool {
        matches!(self, Lifecycle::Published | Lifecycle::DeletionProposed)
    }

    /// The exact string used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Draft => "Draft",
            Lifecycle::Proposed => "Proposed",
            Lifecycle::Published => "Published",
            Lifecycle::DeletionProposed => "DeletionProposed",
        }
    }
}

impl fmt::Display for Lifecycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Deserializes an optional lifecycle where the empty string means "not set",
/// as Go's `omitempty` string enums do.
pub(crate) fn lifecycle_opt<'de, D>(de: D) -> Result<Option<Lifecycle>, D::Error>
where
    D: Deserializer<'de>,
{
    let raw: Option<String> = Option::deserialize(de)?;
    match raw.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => serde_json::from_value(serde_json::Value::String(s.to_owned()))
            .map(Some)
            .map_err(|_| {
                serde::de::Error::custom(format!(
                    "unknown lifecycle {s:?}: expected one of Draft, Proposed, Published, DeletionProposed"
                ))
            }),
    }
}

/// `spec.readinessGates[]`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessGate {
    #[serde(default)]
    pub condition_type: String,
}

/// `spec.packageMetadata`: mirror of the Kptfile's labels and annotations.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PackageMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Where a package came from or lives (`status.upstreamLock`, `status.selfLock`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Locator {
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitLock>,
}

/// The resolved git location of a package.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GitLock {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repo: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub directory: String,
    #[serde(default, rename = "ref", skip_serializing_if = "String::is_empty")]
    pub ref_: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit: String,
}

/// Status of a kpt-style condition.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// A kpt-style condition: Kptfile `status.conditions`, v1alpha1 `status.conditions`,
/// v1alpha2 `status.packageConditions`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PackageCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A reference by name to a PackageRevision in the same namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
pub struct NameRef {
    #[serde(default)]
    pub name: String,
}

/// A reference by name to a Secret in the same namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
pub struct SecretRef {
    #[serde(default)]
    pub name: String,
}

/// A package in an unregistered git repository.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GitPackage {
    pub repo: String,
    #[serde(rename = "ref")]
    pub ref_: String,
    pub directory: String,
    /// Always serialised, as the reference does.
    #[serde(default)]
    pub secret_ref: SecretRef,
}

/// Merge strategy of an upgrade.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeStrategy {
    #[default]
    ResourceMerge,
    FastForward,
    ForceDeleteReplace,
    CopyMerge,
}

/// Repository type of an upstream.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RepositoryType {
    Git,
    Oci,
}
