//! Status changes as guarded JSON patches.

use json_patch::{AddOperation, PatchOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use porch_api::LATEST_REVISION_LABEL;
use porch_api::invocation::{ObjectPatch, ObjectRef, Subresource};
use porch_api::lifecycle::effective;
use porch_api::v1alpha2::{PackageRevision, PackageRevisionStatus};

/// Carries each condition's transition time over from `known` while its
/// status holds; `true` when `new` says just what `known` said (types,
/// statuses, reasons, messages), so nothing needs writing.
pub(crate) fn settle_conditions(known: &[Condition], new: &mut [Condition]) -> bool {
    for c in new.iter_mut() {
        if let Some(old) = known.iter().find(|o| o.type_ == c.type_)
            && old.status == c.status
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
    }
    known.len() == new.len()
        && new.iter().all(|c| {
            known.iter().any(|o| {
                o.type_ == c.type_
                    && o.status == c.status
                    && o.reason == c.reason
                    && o.message == c.message
            })
        })
}

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

/// The other live revisions of the same package, with their revision
/// numbers.
pub(crate) fn siblings<'a>(
    pr: &PackageRevision,
    related: &'a [PackageRevision],
) -> Vec<(&'a PackageRevision, i64)> {
    related
        .iter()
        .filter(|other| {
            other.metadata.namespace == pr.metadata.namespace
                && other.spec.repository == pr.spec.repository
                && other.spec.package_name == pr.spec.package_name
                && other.metadata.deletion_timestamp.is_none()
                && other.metadata.name != pr.metadata.name
        })
        .map(|other| {
            (
                other,
                other.status.as_ref().and_then(|s| s.revision).unwrap_or(0),
            )
        })
        .collect()
}

/// The label patches that make the published revision with the highest
/// number the only `"true"` among `candidates` (spec §4.5); only labels
/// that change are patched.
pub(crate) fn latest_label_patches(candidates: &[(&PackageRevision, i64)]) -> Vec<ObjectPatch> {
    let winner = candidates
        .iter()
        .filter(|(p, r)| effective(p.spec.lifecycle).is_published() && *r > 0)
        .max_by_key(|(_, r)| *r)
        .map(|(p, _)| p.metadata.name.clone());
    candidates
        .iter()
        .filter_map(|(p, _)| {
            let want = if winner.as_ref() == Some(&p.metadata.name) {
                "true"
            } else {
                "false"
            };
            let labels = p.metadata.labels.as_ref();
            if labels
                .and_then(|l| l.get(LATEST_REVISION_LABEL))
                .map(String::as_str)
                == Some(want)
            {
                return None;
            }
            let op = if labels.is_some() {
                let key = LATEST_REVISION_LABEL.replace('~', "~0").replace('/', "~1");
                PatchOperation::Add(AddOperation {
                    path: format!("/metadata/labels/{key}")
                        .as_str()
                        .try_into()
                        .unwrap_or_default(),
                    value: serde_json::Value::String(want.into()),
                })
            } else {
                PatchOperation::Add(AddOperation {
                    path: "/metadata/labels".try_into().unwrap_or_default(),
                    value: serde_json::json!({ LATEST_REVISION_LABEL: want }),
                })
            };
            Some(ObjectPatch::guarded(
                ObjectRef::package_revision(p),
                Subresource::Main,
                p.metadata.resource_version.as_deref().unwrap_or(""),
                vec![op],
            ))
        })
        .collect()
}
