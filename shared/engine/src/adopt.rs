//! The adopt handler (spec §4.7, first paragraph): every live revision
//! carries the `porch.kpt.dev/packagerevisions` finalizer and an owner
//! reference to its Repository (no `controller`, no `blockOwnerDeletion`).
//! Pure: no git.

use json_patch::{AddOperation, PatchOperation};
use porch_api::PACKAGE_REVISION_FINALIZER;
use porch_api::invocation::{Invocation, ObjectPatch, ObjectRef, Operation, Outcome, Subresource};

use crate::HandlerError;

/// Adds what is missing of the finalizer and the owner reference.
///
/// # Errors
/// A malformed Invocation.
pub fn adopt(invocation: &Invocation) -> Result<Outcome, HandlerError> {
    let pr = crate::revision_of(invocation, Operation::Adopt)?;
    if pr.metadata.deletion_timestamp.is_some() {
        return Ok(Outcome::none());
    }
    let repository = &invocation.repository.metadata;
    let name = repository.name.clone().unwrap_or_default();
    let mut operations = Vec::new();
    let finalizers = pr.metadata.finalizers.clone().unwrap_or_default();
    if !finalizers.iter().any(|f| f == PACKAGE_REVISION_FINALIZER) {
        let mut all = finalizers;
        all.push(PACKAGE_REVISION_FINALIZER.to_owned());
        operations.push(PatchOperation::Add(AddOperation {
            path: "/metadata/finalizers".try_into().unwrap_or_default(),
            value: serde_json::json!(all),
        }));
    }
    let owners = pr.metadata.owner_references.clone().unwrap_or_default();
    if !owners
        .iter()
        .any(|o| o.kind == "Repository" && o.name == name)
    {
        let mut all = serde_json::to_value(&owners).unwrap_or_else(|_| serde_json::json!([]));
        if let Some(list) = all.as_array_mut() {
            list.push(serde_json::json!({
                "apiVersion": "config.porch.kpt.dev/v1alpha1",
                "kind": "Repository",
                "name": name,
                "uid": repository.uid.clone().unwrap_or_default(),
            }));
        }
        operations.push(PatchOperation::Add(AddOperation {
            path: "/metadata/ownerReferences".try_into().unwrap_or_default(),
            value: all,
        }));
    }
    if operations.is_empty() {
        return Ok(Outcome::none());
    }
    Ok(Outcome {
        patches: vec![ObjectPatch::guarded(
            ObjectRef::package_revision(pr),
            Subresource::Main,
            pr.metadata.resource_version.as_deref().unwrap_or(""),
            operations,
        )],
        ..Outcome::default()
    })
}
