//! `/mutate`: defaults and provenance for PackageRevisions, as a JSON Patch.
//!
//! On create: `spec.lifecycle: Draft` when empty, the `porch.kpt.dev/repository`
//! label, the `porch.kpt.dev/packagerevisions` finalizer, and for v1alpha1 the
//! default `init` task (a create without tasks means init, spec §4.3). On
//! update: `porch.kpt.dev/proposed-by` on Draft → Proposed and
//! `porch.kpt.dev/approved-by` on Proposed → Published, from `userInfo`.
//!
//! Users cannot write the provenance annotations or the conversion
//! annotations themselves: on create they are removed, on update any change
//! is undone (so a v1alpha1 client cannot set v1alpha2-only status through
//! the conversion stash, and a `kubectl replace` without them loses nothing).

use crate::config::WebhookConfig;
use crate::review::AdmissionInput;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use kube::core::admission::Operation;
use porch_api::common::Lifecycle;
use porch_api::convert::{V1ALPHA1_FIELDS_ANNOTATION, V1ALPHA2_FIELDS_ANNOTATION};
use porch_api::lifecycle::{self, Transition};
use porch_api::{
    APPROVED_BY_ANNOTATION, PACKAGE_REVISION_FINALIZER, PROPOSED_BY_ANNOTATION, REPOSITORY_LABEL,
};
use serde_json::{Value, json};

/// Annotations only the package orchestrator writes.
const GUARDED_ANNOTATIONS: [&str; 4] = [
    PROPOSED_BY_ANNOTATION,
    APPROVED_BY_ANNOTATION,
    V1ALPHA1_FIELDS_ANNOTATION,
    V1ALPHA2_FIELDS_ANNOTATION,
];

/// A patch being built against a working copy, so every operation sees the
/// effect of the ones before it.
struct PatchBuilder {
    object: Value,
    ops: Vec<PatchOperation>,
}

impl PatchBuilder {
    fn push(&mut self, op: PatchOperation) {
        // the ops are built for the current state, so applying cannot fail
        let _ = json_patch::patch(&mut self.object, std::slice::from_ref(&op));
        self.ops.push(op);
    }

    fn add(&mut self, tokens: &[&str], value: Value) {
        self.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(tokens.iter().copied()),
            value,
        }));
    }

    /// Sets (`Some`) or removes (`None`) `metadata.<map>[key]`, creating the
    /// map when it is absent.
    fn set_entry(&mut self, map: &str, key: &str, value: Option<&str>) {
        let existing = self.object["metadata"][map].get(key);
        match value {
            Some(v) if existing.and_then(Value::as_str) == Some(v) => {}
            None if existing.is_none() => {}
            Some(v) if self.object["metadata"][map].is_object() => {
                self.add(&["metadata", map, key], json!(v))
            }
            Some(v) => self.add(&["metadata", map], json!({ key: v })),
            None => self.push(PatchOperation::Remove(RemoveOperation {
                path: PointerBuf::from_tokens(["metadata", map, key]),
            })),
        }
    }

    fn ensure_finalizer(&mut self) {
        match self.object["metadata"]["finalizers"].as_array() {
            Some(list) if list.iter().any(|f| f == PACKAGE_REVISION_FINALIZER) => {}
            Some(_) => self.add(
                &["metadata", "finalizers", "-"],
                json!(PACKAGE_REVISION_FINALIZER),
            ),
            None => self.add(
                &["metadata", "finalizers"],
                json!([PACKAGE_REVISION_FINALIZER]),
            ),
        }
    }
}

/// The patch for a PackageRevision request; empty when nothing changes.
///
/// # Errors
/// A message when the object cannot be read; the request is then denied.
pub fn package_revision(
    input: &AdmissionInput<'_>,
    config: &WebhookConfig,
) -> Result<Vec<PatchOperation>, String> {
    if input.sub_resource.is_some()
        || !matches!(input.operation, Operation::Create | Operation::Update)
    {
        return Ok(Vec::new());
    }
    let object = read(input.object.map(|r| r.get()))?.ok_or("the request has no object")?;
    if !object["metadata"].is_object() {
        return Err("invalid PackageRevision: metadata is required".to_owned());
    }
    if !object["spec"].is_object() {
        return Err("invalid PackageRevision: spec is required".to_owned());
    }
    let controller = config.is_controller(input.username());
    let user = input.username().unwrap_or_default().to_owned();
    let mut patch = PatchBuilder {
        object,
        ops: Vec::new(),
    };
    match input.operation {
        Operation::Create => {
            if lifecycle_in(&patch.object)?.is_none() {
                patch.add(&["spec", "lifecycle"], json!("Draft"));
            }
            if input.kind.version == "v1alpha1" && !has_tasks(&patch.object) {
                let package = patch.object["spec"]["packageName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                patch.add(
                    &["spec", "tasks"],
                    json!([{"type": "init", "init": {"description": format!("{package} description")}}]),
                );
            }
            if let Some(repo) = repository(&patch.object) {
                patch.set_entry("labels", REPOSITORY_LABEL, Some(&repo));
            }
            patch.ensure_finalizer();
            if !controller {
                for key in GUARDED_ANNOTATIONS {
                    patch.set_entry("annotations", key, None);
                }
            }
        }
        Operation::Update => {
            let Some(old) = read(input.old_object.map(|r| r.get()))? else {
                return Ok(Vec::new());
            };
            let transition =
                lifecycle::transition(lifecycle_in(&old)?, lifecycle_in(&patch.object)?).ok();
            if !controller {
                for key in GUARDED_ANNOTATIONS {
                    let stamped = match (key, transition) {
                        (PROPOSED_BY_ANNOTATION, Some(Transition::Propose))
                        | (APPROVED_BY_ANNOTATION, Some(Transition::Approve)) => Some(user.clone()),
                        // anything else keeps what was stored
                        _ => old["metadata"]["annotations"][key]
                            .as_str()
                            .map(str::to_owned),
                    };
                    patch.set_entry("annotations", key, stamped.as_deref());
                }
            }
            let deleting = !patch.object["metadata"]["deletionTimestamp"].is_null();
            if !deleting && let Some(repo) = repository(&patch.object) {
                patch.set_entry("labels", REPOSITORY_LABEL, Some(&repo));
            }
        }
        _ => {}
    }
    Ok(patch.ops)
}

fn read(raw: Option<&str>) -> Result<Option<Value>, String> {
    raw.map(|text| serde_json::from_str(text).map_err(|e| format!("invalid PackageRevision: {e}")))
        .transpose()
}

fn repository(obj: &Value) -> Option<String> {
    obj["spec"]["repository"]
        .as_str()
        .filter(|r| !r.is_empty())
        .map(str::to_owned)
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
