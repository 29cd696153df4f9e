//! The operations of the PackageRevision control plane (porch-v1alpha2 spec
//! §3–§6) as stateless, idempotent handlers: an
//! [`Invocation`](porch_api::invocation::Invocation) in, an
//! [`Outcome`](porch_api::invocation::Outcome) out. A handler never talks to
//! the Kubernetes API; it does the git work through a mirror of the
//! repository and says what the relay must patch.
//!
//! - [`adopt`]: the finalizer and the Repository owner reference.
//! - [`render`]: render a draft (spec §5).
//! - [`content`]: a revision's files, read and pushed to a draft.
//! - [`lifecycle`]: propose, reject, publish, propose deletion (spec §4).
//! - [`source`]: init, clone, copy, upgrade as a new draft (spec §3).
//! - [`delete`]: git cleanup of a revision being deleted (spec §4.7).
//! - [`sync`]: repository discovery into objects to apply and delete (spec §6).
//! - [`repository`]: a Repository's remote and the handler's mirror of it.
//! - [`secrets`]: git credentials named by a Secret reference, resolved.
//! - [`runner`]: one entry point for all of them, with the snapshot around
//!   the git work.

pub mod adopt;
pub mod content;
pub mod delete;
mod error;
pub mod lifecycle;
pub mod render;
pub mod repository;
pub mod runner;
pub mod secrets;
pub mod source;
mod status;
pub mod sync;
pub mod variant;
pub mod variant_set;

pub use error::HandlerError;

/// The revision an Invocation is about, after the checks every handler
/// makes: the right operation, the objects of the right versions, names
/// that make safe git refs.
pub(crate) fn revision_of(
    invocation: &porch_api::invocation::Invocation,
    operation: porch_api::invocation::Operation,
) -> Result<&porch_api::v1alpha2::PackageRevision, HandlerError> {
    check(invocation, operation)?;
    let pr = invocation.package_revision.as_ref().ok_or_else(|| {
        HandlerError::Invalid(format!("{} needs the PackageRevision", operation.as_str()))
    })?;
    porch_api::naming::validate_package_path(&pr.spec.package_name)
        .and_then(|()| porch_api::naming::validate_label("workspaceName", &pr.spec.workspace_name))
        .map_err(|e| HandlerError::Invalid(e.to_string()))?;
    Ok(pr)
}

/// The checks of every Invocation: the operation and the Repository.
pub(crate) fn check(
    invocation: &porch_api::invocation::Invocation,
    operation: porch_api::invocation::Operation,
) -> Result<(), HandlerError> {
    if invocation.operation != operation {
        return Err(HandlerError::Invalid(format!(
            "the {} handler got a {} invocation",
            operation.as_str(),
            invocation.operation.as_str()
        )));
    }
    if invocation.repository.spec.git.is_none() {
        return Err(HandlerError::Invalid(
            "only git repositories are supported".into(),
        ));
    }
    Ok(())
}
