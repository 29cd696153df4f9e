//! What the relay needs of the API server, and how an Outcome is applied
//! through it.
//!
//! [`Cluster`] is implemented by [`crate::kube::KubeCluster`] (a real API
//! server) and by [`crate::memory::Objects`] (the CLI's objects, and the
//! tests'). [`apply_outcome`] is the one place the Outcome rules live:
//! guarded JSON patches (a failed guard is a conflict: re-read and re-plan,
//! never overwrite), the same-Outcome resourceVersion rule, server-side
//! applies, deletes, events.

use std::collections::BTreeMap;
use std::future::Future;

use porch_api::invocation::{Apply, EventRecord, ObjectPatch, ObjectRef, Outcome};
use serde_json::{Value, json};

/// What a write did.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// The object as the write left it.
    Applied(Value),
    /// A guard failed or the server answered 409: the object changed since
    /// the handler saw it.
    Conflict(String),
    /// The object does not exist (any more).
    Missing,
}

/// A failure to talk to the API server.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClusterError(pub String);

/// The API server, as far as the relay uses it.
pub trait Cluster: Send + Sync {
    /// The object now, or `None` when it does not exist.
    fn get(
        &self,
        target: &ObjectRef,
    ) -> impl Future<Output = Result<Option<Value>, ClusterError>> + Send;

    /// One JSON patch, to the object or its status.
    fn patch(
        &self,
        patch: &ObjectPatch,
    ) -> impl Future<Output = Result<Written, ClusterError>> + Send;

    /// One server-side apply. Without `force`, a field owned by another
    /// manager is a [`Written::Conflict`] and nothing changes.
    fn apply(&self, apply: &Apply) -> impl Future<Output = Result<Written, ClusterError>> + Send;

    /// The objects of one kind in a namespace.
    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
    ) -> impl Future<Output = Result<Vec<Value>, ClusterError>> + Send;

    /// Deletes an object; one already gone is not an error.
    fn delete(&self, target: &ObjectRef) -> impl Future<Output = Result<(), ClusterError>> + Send;

    /// Records a Kubernetes Event.
    fn record(&self, event: &EventRecord) -> impl Future<Output = Result<(), ClusterError>> + Send;
}

/// The same-Outcome rule: every patch of an Outcome is guarded by the
/// resourceVersion the handler saw, so once this Outcome has written an
/// object, its later patches to that object are checked against the version
/// that write produced, not against a version that no longer exists.
#[derive(Debug, Default)]
pub struct Guards {
    /// `<namespace>/<name>` → (the version the handler saw, the version now)
    written: BTreeMap<String, (String, String)>,
}

fn key(target: &ObjectRef) -> String {
    format!("{}/{}", target.namespace, target.name)
}

fn resource_version(object: &Value) -> String {
    object["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

impl Guards {
    /// `patch` with its guard moved to the version this Outcome's own
    /// earlier write produced, when it names the version the handler saw.
    pub fn adjust(&self, patch: &ObjectPatch) -> ObjectPatch {
        let mut patch = patch.clone();
        if let Some((seen, now)) = self.written.get(&key(&patch.target))
            && let Some(json_patch::PatchOperation::Test(test)) = patch.patch.0.first_mut()
            && test.path.as_str() == "/metadata/resourceVersion"
            && test.value == json!(seen)
        {
            test.value = json!(now);
        }
        patch
    }

    /// Notes that this Outcome wrote `target`, which the handler saw at
    /// `seen` and is now `after`.
    pub fn record(&mut self, target: &ObjectRef, seen: &str, after: &Value) {
        let now = resource_version(after);
        self.written
            .entry(key(target))
            .and_modify(|(_, n)| n.clone_from(&now))
            .or_insert_with(|| (seen.to_owned(), now));
    }
}

/// The version a patch's guard names, if it is a resourceVersion guard.
fn guarded_version(patch: &ObjectPatch) -> Option<String> {
    match patch.patch.0.first() {
        Some(json_patch::PatchOperation::Test(test))
            if test.path.as_str() == "/metadata/resourceVersion" =>
        {
            test.value.as_str().map(str::to_owned)
        }
        _ => None,
    }
}

/// What applying an Outcome did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Applied {
    /// Objects as the writes left them, by `<namespace>/<name>`.
    pub objects: BTreeMap<String, Value>,
    /// Patches skipped because the object changed (or went): the relay
    /// re-reads and plans again.
    pub conflicts: Vec<ObjectRef>,
    /// Applies skipped because another manager owns a field (create-only
    /// applies of repository sync).
    pub skipped_applies: usize,
    pub deleted: usize,
    pub events: usize,
    /// Applies and deletes the API server refused or failed, each with
    /// why; the others were still made (one bad object of a repository
    /// sync must not hold back the rest).
    pub failed: Vec<WriteFailure>,
}

/// One write of an Outcome that did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFailure {
    /// `<namespace>/<name>` of the object.
    pub target: String,
    pub message: String,
}

fn apply_target(apply: &Apply) -> String {
    format!(
        "{}/{}",
        apply.object["metadata"]["namespace"].as_str().unwrap_or(""),
        apply.object["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// Applies `outcome` through `cluster`: patches in order (each stale one
/// skipped and reported, the rest still applied), then server-side
/// applies, deletes and events. An apply or delete that fails is reported
/// in [`Applied::failed`] and the rest are still made.
///
/// # Errors
/// A patch could not be made (the API server is unreachable or refused
/// it); what was applied before stays.
pub async fn apply_outcome<C: Cluster>(
    cluster: &C,
    outcome: &Outcome,
) -> Result<Applied, ClusterError> {
    let mut applied = Applied::default();
    let mut guards = Guards::default();
    for patch in &outcome.patches {
        let adjusted = guards.adjust(patch);
        match cluster.patch(&adjusted).await? {
            Written::Applied(object) => {
                let seen = guarded_version(patch).unwrap_or_default();
                guards.record(&patch.target, &seen, &object);
                applied.objects.insert(key(&patch.target), object);
            }
            Written::Conflict(_) | Written::Missing => {
                applied.conflicts.push(patch.target.clone());
            }
        }
    }
    for apply in &outcome.apply {
        match cluster.apply(apply).await {
            Ok(Written::Applied(object)) => {
                applied.objects.insert(apply_target(apply), object);
            }
            Ok(Written::Conflict(_) | Written::Missing) => applied.skipped_applies += 1,
            Err(e) => applied.failed.push(WriteFailure {
                target: apply_target(apply),
                message: e.0,
            }),
        }
    }
    for target in &outcome.delete {
        match cluster.delete(target).await {
            Ok(()) => applied.deleted += 1,
            Err(e) => applied.failed.push(WriteFailure {
                target: key(target),
                message: e.0,
            }),
        }
    }
    for event in &outcome.events {
        // an Event that cannot be recorded loses a message, not work
        match cluster.record(event).await {
            Ok(()) => applied.events += 1,
            Err(e) => tracing::warn!(error = %e, reason = %event.reason, "event not recorded"),
        }
    }
    Ok(applied)
}
