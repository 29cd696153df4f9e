//! The delete handler (spec §4.7): a revision being deleted has its git
//! refs removed, then the finalizer is released and the package's
//! latest-revision labels recomputed.
//!
//! - Draft, Proposed, DeletionProposed: the branch, or the tag and the
//!   deletion proposal, are deleted (the package stays on the branch).
//! - Published: blocked (the webhook refuses it; an object that got here
//!   anyway stays until its lifecycle is DeletionProposed), unless its
//!   Repository is being deleted: then only the finalizer is released.
//! - A published revision another revision uses as its upstream is kept,
//!   with an event saying which (the v1alpha1 rule the reference dropped).
//!
//! Idempotent: refs already gone are no change.

use json_patch::{PatchOperation, RemoveOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::PACKAGE_REVISION_FINALIZER;
use porch_api::common::Lifecycle;
use porch_api::invocation::{
    EventRecord, EventType, Invocation, ObjectPatch, ObjectRef, Operation, Outcome, Subresource,
};
use porch_api::lifecycle::effective;
use porch_api::v1alpha2::PackageRevision;
use porch_git::identity::orchestrator;
use porch_git::mirror::Mirror;
use porch_git::operations::{Actor, Packages};
use porch_git::remote::Remote;

use crate::HandlerError;
use crate::repository::layout;
use crate::status::{latest_label_patches, siblings};

/// When a blocked deletion is tried again.
pub const BLOCKED_RECHECK_SECONDS: u64 = 60;

fn event(pr: &PackageRevision, type_: EventType, reason: &str, message: String) -> EventRecord {
    EventRecord {
        regarding: ObjectRef::package_revision(pr),
        type_,
        reason: reason.into(),
        message,
    }
}

/// The patch that removes the finalizer, guarded by the resourceVersion.
fn release(pr: &PackageRevision) -> Option<ObjectPatch> {
    let index = pr
        .metadata
        .finalizers
        .as_ref()?
        .iter()
        .position(|f| f == PACKAGE_REVISION_FINALIZER)?;
    Some(ObjectPatch::guarded(
        ObjectRef::package_revision(pr),
        Subresource::Main,
        pr.metadata.resource_version.as_deref().unwrap_or(""),
        vec![PatchOperation::Remove(RemoveOperation {
            path: format!("/metadata/finalizers/{index}")
                .as_str()
                .try_into()
                .unwrap_or_default(),
        })],
    ))
}

/// Cleans up git for a revision being deleted and releases it.
///
/// # Errors
/// A malformed Invocation (not retryable); git failures (retryable: the
/// finalizer stays until the cleanup succeeds).
pub async fn delete<R: Remote + 'static>(
    invocation: &Invocation,
    mirror: &Mirror<R>,
    now: &Time,
) -> Result<Outcome, HandlerError> {
    let pr = crate::revision_of(invocation, Operation::Delete)?;
    if pr.metadata.deletion_timestamp.is_none() {
        return Ok(Outcome::none());
    }
    let Some(release_patch) = release(pr) else {
        // Released already: nothing left to do.
        return Ok(Outcome::none());
    };
    let mut out = Outcome::default();
    let lifecycle = effective(pr.spec.lifecycle);
    let repository_going = invocation.repository.metadata.deletion_timestamp.is_some();
    if repository_going {
        out.patches.push(release_patch);
        return Ok(out);
    }
    if lifecycle == Lifecycle::Published {
        out.events.push(event(
            pr,
            EventType::Warning,
            "DeletionBlocked",
            "published revisions must be proposed for deletion (spec.lifecycle DeletionProposed) before they are deleted".into(),
        ));
        out.requeue_after_seconds = Some(BLOCKED_RECHECK_SECONDS);
        return Ok(out);
    }
    let revision = pr.status.as_ref().and_then(|s| s.revision).unwrap_or(0);
    let layout = layout(invocation);
    let (package, workspace) = (pr.spec.package_name.clone(), pr.spec.workspace_name.clone());
    if revision > 0 {
        let tag = layout
            .tag_ref(&package, u64::try_from(revision).unwrap_or(0))
            .map_err(|e| HandlerError::Invalid(e.to_string()))?;
        let short = tag.trim_start_matches("refs/tags/").to_owned();
        let url = invocation
            .repository
            .spec
            .git
            .as_ref()
            .map_or("", |g| g.repo.as_str());
        // each downstream once, in name order, however often it is listed
        let users: std::collections::BTreeSet<String> = invocation
            .related
            .iter()
            .filter(|other| {
                other.metadata.deletion_timestamp.is_none()
                    && other
                        .status
                        .as_ref()
                        .and_then(|s| s.upstream_lock.as_ref())
                        .and_then(|l| l.git.as_ref())
                        // the same package of another repository is not this one
                        .is_some_and(|g| {
                            g.ref_ == short && (g.repo.is_empty() || same_repository(&g.repo, url))
                        })
            })
            .filter_map(|other| other.metadata.name.clone())
            .collect();
        if !users.is_empty() {
            out.events.push(event(
                pr,
                EventType::Warning,
                "DeletionBlocked",
                format!(
                    "cannot delete package revision, it is referenced as upstream by: {}",
                    users.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ));
            // nothing changes until a user goes: look again later
            out.requeue_after_seconds = Some(BLOCKED_RECHECK_SECONDS);
            return Ok(out);
        }
    } else {
        layout
            .draft_ref(&package, &workspace)
            .map_err(|e| HandlerError::Invalid(e.to_string()))?;
    }
    let actor = Actor {
        uid: pr.metadata.uid.clone().unwrap_or_default(),
        generation: pr.metadata.generation.unwrap_or(0),
        author: orchestrator(),
        time: now.0.as_second(),
    };
    mirror
        .apply(move |repo| {
            let packages = Packages {
                repo,
                layout: layout.clone(),
            };
            if revision == -1 {
                packages.delete_placeholder(&package, &actor)
            } else {
                packages.delete_revision(&package, &workspace, u64::try_from(revision).unwrap_or(0))
            }
        })
        .await?;
    out.patches.push(release_patch);
    out.patches
        .extend(latest_label_patches(&siblings(pr, &invocation.related)));
    out.events.push(event(
        pr,
        EventType::Normal,
        "Deleted",
        "removed from git".into(),
    ));
    Ok(out)
}

/// Whether two repository URLs name the same repository (a trailing `/` or
/// `.git` aside).
fn same_repository(a: &str, b: &str) -> bool {
    let normal = |url: &str| {
        url.trim_end_matches('/')
            .trim_end_matches(".git")
            .to_ascii_lowercase()
    };
    normal(a) == normal(b)
}
