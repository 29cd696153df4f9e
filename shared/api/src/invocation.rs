//! The contract between the watch relay and the handlers (DESIGN
//! "Contracts"): an [`Invocation`] names the operation and carries the
//! objects as the relay saw them; an [`Outcome`] says what to change in the
//! API, and the relay applies it with optimistic concurrency.

use json_patch::{Patch, PatchOperation, TestOperation};
use serde::{Deserialize, Serialize};

use crate::repository::Repository;
use crate::v1alpha2::PackageRevision;
use crate::variant::{PackageVariant, PackageVariantSet};

/// The work a handler does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub enum Operation {
    /// Add the finalizer and the Repository owner reference.
    Adopt,
    /// Apply `spec.source` (init, clone, copy, upgrade) as a new draft.
    Source,
    /// Render a draft.
    Render,
    /// Bring git to `spec.lifecycle` (propose, reject, publish, …).
    Lifecycle,
    /// Clean up git for a revision being deleted, then release it.
    Delete,
    /// Discover a repository's revisions and reconcile the objects.
    Sync,
    /// Keep a PackageVariant's downstream package in step with its
    /// upstream (packagevariants spec §2).
    Variant,
    /// Generate a PackageVariantSet's PackageVariants (packagevariants
    /// spec §3).
    #[serde(rename = "variant-set")]
    VariantSet,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Adopt => "adopt",
            Operation::Source => "source",
            Operation::Render => "render",
            Operation::Lifecycle => "lifecycle",
            Operation::Delete => "delete",
            Operation::Sync => "sync",
            Operation::Variant => "variant",
            Operation::VariantSet => "variant-set",
        }
    }
}

/// What the relay hands a handler. Credentials never travel here: the
/// Repository names its Secret and the handler resolves it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Invocation {
    pub operation: Operation,
    /// The revision as the relay saw it (absent for repository sync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_revision: Option<PackageRevision>,
    pub repository: Repository,
    /// The upstream revision, for clone and upgrade sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<PackageRevision>,
    /// The upstream's Repository, when it is not `repository` (a clone
    /// from another repository).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_repository: Option<Repository>,
    /// Other revisions the operation needs (upgrade sources, the package's
    /// revisions for the latest-revision labels).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<PackageRevision>,
    /// The PackageVariant, for `variant`; `repository` is then its
    /// downstream Repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_variant: Option<PackageVariant>,
    /// The PackageVariantSet, for `variantSet`, with the variants it made
    /// (`variants`) and the Repositories of its namespace
    /// (`repositories`); `repository` is then its upstream Repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_variant_set: Option<PackageVariantSet>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<PackageVariant>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repositories: Vec<Repository>,
    /// In-cluster objects a variant may inject into its package (the
    /// objects its injectors name), or the objects a variant set's object
    /// selectors choose from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_objects: Vec<serde_json::Value>,
    /// When the relay planned this work. Redeliveries carry the same time,
    /// and handlers write it (not their own clock) into conditions and
    /// commits, so a redelivered Invocation gets the same Outcome, byte for
    /// byte. Without it, handlers use the current time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// 1 for the first delivery.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    #[serde(default)]
    pub request_id: String,
}

fn first_attempt() -> u32 {
    1
}

/// Why an Invocation could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InvocationError {
    #[error("invalid invocation: {0}")]
    Json(#[from] serde_json::Error),
    #[error("invalid invocation: unknown field(s) {0}")]
    UnknownFields(String),
    #[error("invalid invocation: {field} must be {expected}, got {found}")]
    Version {
        field: &'static str,
        expected: &'static str,
        found: String,
    },
}

impl Invocation {
    /// Decodes an Invocation, checking that every object has the
    /// `apiVersion` and `kind` of its type (typed decoding alone does not).
    ///
    /// # Errors
    /// Malformed JSON, unknown fields, objects of another version or kind.
    pub fn from_json(bytes: &[u8]) -> Result<Self, InvocationError> {
        let raw: serde_json::Value = serde_json::from_slice(bytes)?;
        let check = |field: &'static str, value: &serde_json::Value, expected: &'static str| {
            let found = format!(
                "{}/{}",
                value["apiVersion"].as_str().unwrap_or(""),
                value["kind"].as_str().unwrap_or("")
            );
            if found == expected {
                Ok(())
            } else {
                Err(InvocationError::Version {
                    field,
                    expected,
                    found,
                })
            }
        };
        const REVISION: &str = "porch.kpt.dev/v1alpha2/PackageRevision";
        check(
            "repository",
            &raw["repository"],
            "config.porch.kpt.dev/v1alpha1/Repository",
        )?;
        if !raw["upstreamRepository"].is_null() {
            check(
                "upstreamRepository",
                &raw["upstreamRepository"],
                "config.porch.kpt.dev/v1alpha1/Repository",
            )?;
        }
        for field in ["packageRevision", "upstream"] {
            if !raw[field].is_null() {
                check(
                    if field == "upstream" {
                        "upstream"
                    } else {
                        "packageRevision"
                    },
                    &raw[field],
                    REVISION,
                )?;
            }
        }
        if !raw["packageVariantSet"].is_null() {
            check(
                "packageVariantSet",
                &raw["packageVariantSet"],
                "config.porch.kpt.dev/v1alpha2/PackageVariantSet",
            )?;
        }
        for item in raw["variants"].as_array().into_iter().flatten() {
            check(
                "variants",
                item,
                "config.porch.kpt.dev/v1alpha1/PackageVariant",
            )?;
        }
        for item in raw["repositories"].as_array().into_iter().flatten() {
            check(
                "repositories",
                item,
                "config.porch.kpt.dev/v1alpha1/Repository",
            )?;
        }
        if !raw["packageVariant"].is_null() {
            check(
                "packageVariant",
                &raw["packageVariant"],
                "config.porch.kpt.dev/v1alpha1/PackageVariant",
            )?;
        }
        for item in raw["related"].as_array().into_iter().flatten() {
            check("related", item, REVISION)?;
        }
        // A field this build does not know means the objects come from a
        // newer API than the handler: refuse rather than drop it.
        let mut unknown = Vec::new();
        let invocation: Self = serde_ignored::deserialize(raw, |path| {
            let path = path.to_string();
            // the objects' own apiVersion and kind, checked above
            // (`?` marks an Option's content)
            let parts: Vec<&str> = path.split('.').filter(|p| *p != "?").collect();
            let type_field = match parts.as_slice() {
                [_, last] | ["related" | "variants" | "repositories", _, last] => {
                    *last == "apiVersion" || *last == "kind"
                }
                _ => false,
            };
            if !type_field {
                unknown.push(path);
            }
        })?;
        if !unknown.is_empty() {
            return Err(InvocationError::UnknownFields(unknown.join(", ")));
        }
        Ok(invocation)
    }
}

/// An object an Outcome talks about.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

impl ObjectRef {
    /// The reference to a PackageRevision.
    pub fn package_revision(pr: &PackageRevision) -> Self {
        ObjectRef {
            api_version: "porch.kpt.dev/v1alpha2".into(),
            kind: "PackageRevision".into(),
            namespace: pr.metadata.namespace.clone().unwrap_or_default(),
            name: pr.metadata.name.clone().unwrap_or_default(),
            uid: pr.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

/// Which part of an object a patch changes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum Subresource {
    /// The object itself (metadata, spec).
    #[default]
    Main,
    Status,
}

/// An RFC 6902 patch of one object. It starts with a `test` of
/// `metadata.resourceVersion` (or `uid`), so a stale patch fails instead of
/// overwriting: the relay then re-reads and re-plans.
///
/// The patches of one Outcome are one change: every guard names the version
/// the handler saw, so once the relay has written an object for this
/// Outcome (a status patch moves the resourceVersion too), it checks later
/// patches of the same object against the version its own write produced.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectPatch {
    pub target: ObjectRef,
    #[serde(default)]
    pub subresource: Subresource,
    pub patch: Patch,
}

impl ObjectPatch {
    /// A patch guarded by the resourceVersion the handler saw.
    pub fn guarded(
        target: ObjectRef,
        subresource: Subresource,
        resource_version: &str,
        mut operations: Vec<PatchOperation>,
    ) -> Self {
        operations.insert(
            0,
            PatchOperation::Test(TestOperation {
                path: "/metadata/resourceVersion".try_into().unwrap_or_default(),
                value: serde_json::Value::String(resource_version.to_owned()),
            }),
        );
        ObjectPatch {
            target,
            subresource,
            patch: Patch(operations),
        }
    }

    /// Whether the first operation guards the patch.
    pub fn is_guarded(&self) -> bool {
        matches!(
            self.patch.0.first(),
            Some(PatchOperation::Test(t))
                if t.path.as_str() == "/metadata/resourceVersion" || t.path.as_str() == "/metadata/uid"
        )
    }
}

/// One server-side apply: the fields `object` states are owned by
/// `field_manager` (forced, or skipped on a conflict when not).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Apply {
    pub field_manager: String,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub subresource: Subresource,
    pub object: serde_json::Value,
}

/// `Normal` or `Warning`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EventType {
    #[default]
    Normal,
    Warning,
}

/// A Kubernetes Event to record.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EventRecord {
    pub regarding: ObjectRef,
    #[serde(rename = "type")]
    pub type_: EventType,
    pub reason: String,
    pub message: String,
}

/// What a handler asks the relay to do.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<ObjectPatch>,
    /// Server-side applies (repository sync), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apply: Vec<Apply>,
    /// Objects to delete, for repository sync.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delete: Vec<ObjectRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_after_seconds: Option<u64>,
}

impl Outcome {
    /// Nothing to do.
    pub fn none() -> Self {
        Outcome::default()
    }

    pub fn is_empty(&self) -> bool {
        *self == Outcome::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocations_round_trip_and_reject_unknown_fields() {
        let json = serde_json::json!({
            "operation": "render",
            "repository": {
                "apiVersion": "config.porch.kpt.dev/v1alpha1",
                "kind": "Repository",
                "metadata": {"name": "blueprints", "namespace": "default"},
                "spec": {"type": "git", "git": {"repo": "https://example.com/r.git"}}
            },
            "requestId": "r-1"
        });
        let invocation: Invocation =
            serde_json::from_value(json.clone()).expect("valid invocation");
        assert_eq!(invocation.operation, Operation::Render);
        assert_eq!(invocation.attempt, 1);
        let mut bad = json.clone();
        bad["secret"] = serde_json::json!("no");
        assert!(serde_json::from_value::<Invocation>(bad).is_err());
        // Objects of another version are not read as these types.
        let mut old = json.clone();
        old["repository"]["apiVersion"] = serde_json::json!("config.porch.kpt.dev/v1alpha2");
        let bytes = serde_json::to_vec(&old).expect("json");
        assert!(matches!(
            Invocation::from_json(&bytes),
            Err(InvocationError::Version { .. })
        ));
        let mut old = json.clone();
        old["related"] = serde_json::json!([{"apiVersion": "porch.kpt.dev/v1alpha1", "kind": "PackageRevision", "metadata": {"name": "x"}}]);
        let bytes = serde_json::to_vec(&old).expect("json");
        assert!(Invocation::from_json(&bytes).is_err());
        assert!(Invocation::from_json(b"{not json").is_err());
        let bytes = serde_json::to_vec(&json).expect("json");
        let decoded = Invocation::from_json(&bytes);
        assert!(decoded.is_ok(), "{decoded:?}");
        // unknown fields inside the objects too
        let mut newer = json.clone();
        newer["repository"]["spec"]["git"]["fancy"] = serde_json::json!(true);
        let bytes = serde_json::to_vec(&newer).expect("json");
        let refused = Invocation::from_json(&bytes).expect_err("unknown field");
        assert!(refused.to_string().contains("fancy"), "{refused}");
        let mut newer = json.clone();
        newer["repository"]["metadata"]["fancy"] = serde_json::json!(true);
        let bytes = serde_json::to_vec(&newer).expect("json");
        let refused = Invocation::from_json(&bytes).expect_err("unknown field");
        assert!(
            refused.to_string().contains("repository.metadata.fancy"),
            "{refused}"
        );
    }

    #[test]
    fn guarded_patches_start_with_a_resource_version_test() {
        let patch =
            ObjectPatch::guarded(ObjectRef::default(), Subresource::Status, "42", Vec::new());
        assert!(patch.is_guarded());
        let json = serde_json::to_value(&patch).expect("serialises");
        assert_eq!(json["patch"][0]["op"], "test");
        assert_eq!(json["patch"][0]["value"], "42");
        assert_eq!(json["subresource"], "status");
    }
}
