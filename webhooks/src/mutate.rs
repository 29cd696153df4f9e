//! `/mutate`: defaults and provenance for PackageRevisions, as a JSON Patch.
//!
//! On create: `spec.lifecycle: Draft` when empty, the `porch.kpt.dev/repository`
//! label, the `porch.kpt.dev/packagerevisions` finalizer, and for v1alpha1 the
//! default `init` task (a create without tasks means init, spec §4.3). On
//! update: `porch.kpt.dev/proposed-by` on Draft → Proposed and
//! `porch.kpt.dev/approved-by` on Proposed → Published, from `userInfo`. Users
//! cannot write those two annotations themselves: any other change to them is
//! undone.

use crate::config::WebhookConfig;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use porch_api::common::Lifecycle;
use porch_api::lifecycle::{self, Transition};
use porch_api::{
    APPROVED_BY_ANNOTATION, PACKAGE_REVISION_FINALIZER, PROPOSED_BY_ANNOTATION, REPOSITORY_LABEL,
};
use serde_json::{Value, json};

/// The patch for a PackageRevision request; empty when nothing changes.
///
/// # Errors
/// A message when the object cannot be read; the request is then denied.
pub fn package_revision(
    req: &AdmissionRequest<DynamicObject>,
    config: &WebhookConfig,
) -> Result<Vec<PatchOperation>, String> {
    if req.sub_resource.is_some() {
        return Ok(Vec::new());
    }
    let object = match (&req.operation, &req.object) {
        (Operation::Create | Operation::Update, Some(obj)) => {
            serde_json::to_value(obj).map_err(|e| format!("invalid PackageRevision: {e}"))?
        }
        _ => return Ok(Vec::new()),
    };
    let controller = config.is_controller(req.user_info.username.as_deref());
    let user = req.user_info.username.clone().unwrap_or_default();
    let mut ops = Vec::new();
    match req.operation {
        Operation::Create => {
            if lifecycle_in(&object)?.is_none() {
                ops.push(add(&["spec", "lifecycle"], json!("Draft")));
            }
            if req.kind.version == "v1alpha1" && !has_tasks(&object) {
                let package = object["spec"]["packageName"].as_str().unwrap_or_default();
                ops.push(add(
                    &["spec", "tasks"],
                    json!([{"type": "init", "init": {"description": format!("{package} description")}}]),
                ));
            }
            if let Some(repo) = object["spec"]["repository"]
                .as_str()
                .filter(|r| !r.is_empty())
            {
                set_map_entry(&mut ops, &object, "labels", REPOSITORY_LABEL, Some(repo));
            }
            ensure_finalizer(&mut ops, &object);
            if !controller {
                for key in [PROPOSED_BY_ANNOTATION, APPROVED_BY_ANNOTATION] {
                    set_map_entry(&mut ops, &object, "annotations", key, None);
                }
            }
        }
        Operation::Update => {
            let old = match &req.old_object {
                Some(old) => serde_json::to_value(old)
                    .map_err(|e| format!("invalid PackageRevision: {e}"))?,
                None => return Ok(ops),
            };
            let transition =
                lifecycle::transition(lifecycle_in(&old)?, lifecycle_in(&object)?).ok();
            for key in [PROPOSED_BY_ANNOTATION, APPROVED_BY_ANNOTATION] {
                let stamped = match (key, transition) {
                    (PROPOSED_BY_ANNOTATION, Some(Transition::Propose)) => Some(user.as_str()),
                    (APPROVED_BY_ANNOTATION, Some(Transition::Approve)) => Some(user.as_str()),
                    _ if controller => continue,
                    // anything else keeps what was stored
                    _ => annotation(&old, key),
                };
                if annotation(&object, key) != stamped {
                    set_map_entry(&mut ops, &object, "annotations", key, stamped);
                }
            }
            let deleting = !object["metadata"]["deletionTimestamp"].is_null();
            if !deleting
                && let Some(repo) = object["spec"]["repository"]
                    .as_str()
                    .filter(|r| !r.is_empty())
                && object["metadata"]["labels"][REPOSITORY_LABEL].as_str() != Some(repo)
            {
                set_map_entry(&mut ops, &object, "labels", REPOSITORY_LABEL, Some(repo));
            }
        }
        _ => {}
    }
    Ok(ops)
}

fn lifecycle_in(obj: &Value) -> Result<Option<Lifecycle>, String> {
    match &obj["spec"]["lifecycle"] {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        v => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|_| format!("invalid PackageRevision: unknown spec.lifecycle {v}")),
    }
}

fn has_tasks(obj: &Value) -> bool {
    obj["spec"]["tasks"]
        .as_array()
        .is_some_and(|t| !t.is_empty())
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"][key].as_str()
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: pointer(tokens),
        value,
    })
}

/// Sets (`Some`) or removes (`None`) `metadata.<map>[key]`, creating the map
/// when it is absent.
fn set_map_entry(
    ops: &mut Vec<PatchOperation>,
    obj: &Value,
    map: &str,
    key: &str,
    value: Option<&str>,
) {
    let existing = &obj["metadata"][map];
    match value {
        Some(v) if existing.is_object() => ops.push(add(&["metadata", map, key], json!(v))),
        Some(v) => ops.push(add(&["metadata", map], json!({ key: v }))),
        None if existing.get(key).is_some() => ops.push(PatchOperation::Remove(RemoveOperation {
            path: pointer(&["metadata", map, key]),
        })),
        None => {}
    }
}

fn ensure_finalizer(ops: &mut Vec<PatchOperation>, obj: &Value) {
    match obj["metadata"]["finalizers"].as_array() {
        Some(list) if list.iter().any(|f| f == PACKAGE_REVISION_FINALIZER) => {}
        Some(_) => ops.push(add(
            &["metadata", "finalizers", "-"],
            json!(PACKAGE_REVISION_FINALIZER),
        )),
        None => ops.push(add(
            &["metadata", "finalizers"],
            json!([PACKAGE_REVISION_FINALIZER]),
        )),
    }
}
