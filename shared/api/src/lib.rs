//! Typed Porch resources and the pure rules over them.
//!
//! * [`v1alpha2`] and [`v1alpha1`] PackageRevision (spec `porch-v1alpha2.md`
//!   §1, §2.1), [`repository::Repository`], [`variant`] (PackageVariant and
//!   PackageVariantSet, `packagevariants.md` §1, §3, §4), [`kptfile::Kptfile`]
//!   (`krm-functions.md` §3);
//! * [`naming`]: object names and package paths (§6.2);
//! * [`lifecycle`]: the state machine (§4.3);
//! * [`convert`]: lossless v1alpha1 ↔ v1alpha2 conversion (§2.3);
//! * [`crd`]: the CustomResourceDefinitions written to `infra/crds/`.
//!
//! No clients and no runtime: everything here is a function over values.

pub mod common;
pub mod convert;
pub mod crd;
pub mod invocation;
pub mod kptfile;
pub mod lifecycle;
pub mod limits;
pub mod naming;
pub mod planner;
pub mod repository;
mod schema;
pub mod v1alpha1;
pub mod v1alpha2;
pub mod variant;

pub use common::Lifecycle;

/// API group of PackageRevisions.
pub const GROUP: &str = "porch.kpt.dev";
/// API group of Repository, PackageVariant and PackageVariantSet.
pub const CONFIG_GROUP: &str = "config.porch.kpt.dev";
/// Label marking the latest published revision of a package (v1alpha2).
pub const LATEST_REVISION_LABEL: &str = "porch.kpt.dev/latest-revision";
/// The v1alpha1 spelling of the latest-revision label (present only when "true").
pub const V1ALPHA1_LATEST_REVISION_LABEL: &str = "kpt.dev/latest-revision";
/// Label naming the Repository a revision belongs to.
pub const REPOSITORY_LABEL: &str = "porch.kpt.dev/repository";
/// Finalizer that keeps a revision until its git refs are cleaned up.
pub const PACKAGE_REVISION_FINALIZER: &str = "porch.kpt.dev/packagerevisions";
/// Annotation asking for a render of a draft.
pub const RENDER_REQUEST_ANNOTATION: &str = "porch.kpt.dev/render-request";
/// Annotation: write rendered output even when the pipeline fails.
pub const PUSH_ON_RENDER_FAILURE_ANNOTATION: &str = "porch.kpt.dev/push-on-render-failure";
/// Annotation on a Repository switching it to v1alpha2 management.
pub const V1ALPHA2_MIGRATION_ANNOTATION: &str = "porch.kpt.dev/v1alpha2-migration";
/// Annotation recording the user who proposed a revision (set by `/mutate`).
pub const PROPOSED_BY_ANNOTATION: &str = "porch.kpt.dev/proposed-by";
/// Annotation recording the user who approved a revision (set by `/mutate`);
/// the lifecycle handler copies it into `status.publishedBy`.
pub const APPROVED_BY_ANNOTATION: &str = "porch.kpt.dev/approved-by";
