//! The operations of the PackageRevision control plane (porch-v1alpha2 spec
//! §3–§6) as stateless, idempotent handlers: an
//! [`Invocation`](porch_api::invocation::Invocation) in, an
//! [`Outcome`](porch_api::invocation::Outcome) out. A handler never talks to
//! the Kubernetes API; it does the git work through a mirror of the
//! repository and says what the relay must patch.
//!
//! - [`render`]: render a draft (spec §5).
//! - [`lifecycle`]: propose, reject, publish, propose deletion (spec §4).
//! - [`source`]: init, clone, copy, upgrade as a new draft (spec §3).
//! - [`delete`]: git cleanup of a revision being deleted (spec §4.7).
//! - [`sync`]: repository discovery into objects to apply and delete (spec §6).

pub mod delete;
mod error;
pub mod lifecycle;
pub mod render;
pub mod source;
mod status;
pub mod sync;

pub use error::HandlerError;
