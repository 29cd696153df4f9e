//! Status changes as guarded JSON patches.

use json_patch::{AddOperation, PatchOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use porch_api::invocation::{ObjectPatch, ObjectRef, Subresource};
use porch_api::v1alpha2::{PackageRevision, PackageRevisionStatus};

/// Sets a condition, keeping its transition time when nothing changed.
pub(crate) fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let new = Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        // The CRD caps messages at 32768 characters.
        message: message.chars().take(32_768).collect(),
        observed_generation: generation,
        last_transition_time: now.clone(),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            let unchanged = existing.status == new.status
                && existing.reason == new.reason
                && existing.message == new.message
                && existing.observed_generation == new.observed_generation;
            if !unchanged {
                *existing = new;
            }
        }
        None => conditions.push(new),
    }
}

/// A patch that replaces the status, guarded by the resourceVersion the
/// handler saw.
pub(crate) fn status_patch(pr: &PackageRevision, status: PackageRevisionStatus) -> ObjectPatch {
    let value = serde_json::to_value(status).unwrap_or(serde_json::Value::Null);
    ObjectPatch::guarded(
        ObjectRef::package_revision(pr),
        Subresource::Status,
        pr.metadata.resource_version.as_deref().unwrap_or(""),
        vec![PatchOperation::Add(AddOperation {
            path: "/status".try_into().unwrap_or_default(),
            value,
        })],
    )
}
