//! The lifecycle handler (spec §4): bring git to `spec.lifecycle` —
//! propose, reject, publish (the compare-and-swap approval push), propose
//! deletion, restore — and report it: `Ready`, the revision number,
//! `publishedBy` (the approving user the webhook recorded) and
//! `publishedAt`, and the `porch.kpt.dev/latest-revision` label of every
//! revision of the package.
//!
//! Idempotent: each git step recognises its own work (a branch already
//! moved, a revision already published for this uid and generation).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::common::Lifecycle;
use porch_api::invocation::{
    EventRecord, EventType, Invocation, ObjectPatch, ObjectRef, Operation, Outcome,
};
use porch_api::lifecycle::effective;
use porch_api::planner::{self, READY_CONDITION};
use porch_api::v1alpha2::PackageRevision;
use porch_api::{APPROVED_BY_ANNOTATION, PROPOSED_BY_ANNOTATION};
use porch_git::identity::{Identity, orchestrator};
use porch_git::mirror::MirrorError;
use porch_git::operations::{Actor, OperationError, Packages};
use porch_git::remote::Remote;

use crate::HandlerError;
use crate::repository::layout;
use crate::status::{latest_label_patches, set_condition, siblings, status_patch};

/// Where a revision stands in git after the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    Unpublished,
    Published(u64),
    /// The placeholder revision (-1): the package on the registered branch,
    /// published by definition, with nothing to do in git.
    Placeholder,
}

/// Brings the Invocation's PackageRevision to its lifecycle.
///
/// # Errors
/// A malformed Invocation (not retryable); git transport failures
/// (retryable). A transition git refuses is reported in `Ready`, not as an
/// error.
pub async fn lifecycle<R: Remote + 'static>(
    invocation: &Invocation,
    mirror: &porch_git::mirror::Mirror<R>,
    now: &Time,
) -> Result<Outcome, HandlerError> {
    let pr = crate::revision_of(invocation, Operation::Lifecycle)?;
    if !planner::is_due(Operation::Lifecycle, pr, &invocation.repository) {
        return Ok(Outcome::none());
    }
    let (package, workspace) = (pr.spec.package_name.clone(), pr.spec.workspace_name.clone());
    let layout = layout(invocation);
    layout
        .draft_ref(&package, &workspace)
        .map_err(|e| HandlerError::Invalid(e.to_string()))?;
    let desired = effective(pr.spec.lifecycle);
    let known_revision = pr
        .status
        .as_ref()
        .and_then(|s| s.revision)
        .and_then(|r| u64::try_from(r).ok())
        .filter(|r| *r > 0);
    let placeholder = pr.status.as_ref().and_then(|s| s.revision) == Some(-1);
    let approver = pr
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(APPROVED_BY_ANNOTATION))
        .cloned();
    // The webhook admits Published only from Proposed and stamps the
    // proposer: an approval that arrives before the proposal reached git
    // was reviewed, and is carried out as the proposal and the approval.
    let proposal_admitted = pr
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(PROPOSED_BY_ANNOTATION));
    let actor = Actor {
        uid: pr.metadata.uid.clone().unwrap_or_default(),
        generation: pr.metadata.generation.unwrap_or(0),
        author: approver
            .as_deref()
            .map_or_else(orchestrator, Identity::of_user),
        time: now.0.as_second(),
    };

    let outcome = mirror
        .apply(move |repo| {
            let packages = Packages {
                repo,
                layout: layout.clone(),
            };
            let exists =
                |r: Result<String, porch_api::naming::NameError>| -> Result<bool, OperationError> {
                    Ok(repo.ref_id(&r?)?.is_some())
                };
            if placeholder {
                return match desired {
                    Lifecycle::Published => Ok(Done::Placeholder),
                    _ => Err(OperationError::Refused(format!(
                        "{package}/{workspace} is the placeholder revision of the branch; it is always Published"
                    ))),
                };
            }
            let draft = exists(packages.layout.draft_ref(&package, &workspace))?;
            let proposed = exists(packages.layout.proposed_ref(&package, &workspace))?;
            match desired {
                Lifecycle::Draft => {
                    if proposed {
                        packages.reject(&package, &workspace)?;
                    } else if !draft {
                        return Err(OperationError::Missing(format!("{package}/{workspace}")));
                    }
                    Ok(Done::Unpublished)
                }
                Lifecycle::Proposed => {
                    if draft {
                        packages.propose(&package, &workspace)?;
                    } else if !proposed {
                        return Err(OperationError::Missing(format!("{package}/{workspace}")));
                    }
                    Ok(Done::Unpublished)
                }
                Lifecycle::Published | Lifecycle::DeletionProposed => {
                    let revision = match known_revision {
                        Some(r) => r,
                        None if draft && !proposal_admitted => {
                            return Err(OperationError::Refused(format!(
                                "{package}/{workspace} is a draft: propose it before publishing"
                            )));
                        }
                        None => {
                            if draft {
                                packages.propose(&package, &workspace)?;
                            }
                            packages.publish(&package, &workspace, &actor)?
                        }
                    };
                    packages.set_deletion_proposed(
                        &package,
                        revision,
                        desired == Lifecycle::DeletionProposed,
                    )?;
                    Ok(Done::Published(revision))
                }
            }
        })
        .await;

    let mut status = pr.status.clone().unwrap_or_default();
    let generation = pr.metadata.generation;
    let mut out = Outcome::default();
    match outcome {
        Ok(applied) => {
            status.observed_generation = generation;
            let unmet = planner::unmet_readiness_gates(pr);
            if unmet.is_empty() {
                set_condition(
                    &mut status.conditions,
                    READY_CONDITION,
                    "True",
                    "Ready",
                    "",
                    generation,
                    now,
                );
            } else {
                let message = format!("waiting for readiness gates: {}", unmet.join(", "));
                set_condition(
                    &mut status.conditions,
                    READY_CONDITION,
                    "False",
                    planner::GATES_PENDING_REASON,
                    &message,
                    generation,
                    now,
                );
            }
            if let Done::Published(revision) = applied.value {
                let newly = known_revision.is_none();
                status.revision = i64::try_from(revision).ok();
                if newly {
                    status.published_by = approver.clone().unwrap_or_else(|| orchestrator().email);
                    status.published_at = Some(now.clone());
                    out.events.push(EventRecord {
                        regarding: ObjectRef::package_revision(pr),
                        type_: EventType::Normal,
                        reason: "Published".into(),
                        message: format!("published as revision {revision}"),
                    });
                }
            }
        }
        Err(MirrorError::Operation(error)) if !matches!(error, OperationError::Repo(_)) => {
            // Git refused the transition: report it; retrying cannot help.
            set_condition(
                &mut status.conditions,
                READY_CONDITION,
                "False",
                "Failed",
                &error.to_string(),
                generation,
                now,
            );
            status.observed_generation = generation;
        }
        Err(other) => return Err(other.into()),
    }
    let revision = status.revision;
    out.patches.push(status_patch(pr, status));
    out.patches
        .extend(latest_revision_patches(pr, revision, &invocation.related));
    Ok(out)
}

/// The label patches for this revision (with its new revision number) and
/// the rest of its package (spec §4.5).
fn latest_revision_patches(
    pr: &PackageRevision,
    revision: Option<i64>,
    related: &[PackageRevision],
) -> Vec<ObjectPatch> {
    let mut candidates = vec![(pr, revision.unwrap_or(0))];
    candidates.extend(siblings(pr, related));
    latest_label_patches(&candidates)
}
