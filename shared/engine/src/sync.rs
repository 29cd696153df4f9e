//! The sync handler (spec §6): discover a repository's revisions in git and
//! say which PackageRevision objects to apply and which to delete.
//!
//! - Owned fields (manager `repository-controller`, forced): the repository
//!   label, the owner reference, package, repository and workspace, and the
//!   upstream lock, self lock and deployment flag in the status. Objects whose
//!   owned fields already match are left alone.
//! - Seed fields (manager `repository-controller-seed`, not forced, new
//!   objects only): lifecycle, revision, publishedBy, publishedAt.
//! - Stale objects (labelled for the repository, no longer in git) are
//!   deleted, and their finalizer released in the same Outcome so a revision
//!   deleted directly in git does not hang in Terminating (§9 item 23). An
//!   object whose source has not run yet is never stale.
//! - The Repository's status (manager `repository-controller`, forced, as
//!   the reference writes it, packagevariants spec §4.2): `Ready=True`,
//!   `lastFullSyncTime`, `observedGeneration`, `observedRunOnceAt`,
//!   `packageCount` and `gitCommitHash`. `lastTransitionTime` moves only
//!   when `Ready` changes (the reference stamps it on every write).

use json_patch::{PatchOperation, RemoveOperation};
use porch_api::invocation::{
    Apply, Invocation, ObjectPatch, ObjectRef, Operation, Outcome, Subresource,
};
use porch_api::v1alpha2::PackageRevision;
use porch_api::{PACKAGE_REVISION_FINALIZER, REPOSITORY_LABEL};
use porch_git::discovery::{DiscoveredRevision, discover};
use porch_git::mirror::Mirror;
use porch_git::remote::Remote;
use porch_git::repo::GitRepo;

use crate::HandlerError;
use crate::repository::layout;

/// Field manager of the owned fields.
pub const OWNER_MANAGER: &str = "repository-controller";
/// The Repository condition a full sync sets (packagevariants spec §4.2).
pub const REPOSITORY_READY: &str = "Ready";

/// Field manager of the fields set once, on create.
pub const SEED_MANAGER: &str = "repository-controller-seed";

fn owner_reference(invocation: &Invocation) -> serde_json::Value {
    let repo = &invocation.repository.metadata;
    serde_json::json!([{
        "apiVersion": "config.porch.kpt.dev/v1alpha1",
        "kind": "Repository",
        "name": repo.name.clone().unwrap_or_default(),
        "uid": repo.uid.clone().unwrap_or_default(),
    }])
}

fn base(name: &str, namespace: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "porch.kpt.dev/v1alpha2",
        "kind": "PackageRevision",
        "metadata": {"name": name, "namespace": namespace},
    })
}

fn published_at(seconds: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Whether an existing object's owned fields already say what git says.
fn up_to_date(
    existing: &PackageRevision,
    d: &DiscoveredRevision,
    repository: &str,
    deployment: bool,
) -> bool {
    let labels_ok = existing
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REPOSITORY_LABEL))
        .is_some_and(|v| v == repository);
    let owned = existing
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r.kind == "Repository" && r.name == repository)
        });
    let status = existing.status.clone().unwrap_or_default();
    labels_ok
        && owned
        && existing.spec.package_name == d.package
        && existing.spec.workspace_name == d.workspace
        && status.self_lock.as_ref() == Some(&d.self_lock)
        && status.upstream_lock == d.upstream_lock
        && status.deployment == deployment
}

/// Discovers the repository and reconciles its objects.
///
/// # Errors
/// A malformed Invocation (not retryable); git failures (retryable).
pub async fn sync<R: Remote + 'static>(
    invocation: &Invocation,
    mirror: &Mirror<R>,
) -> Result<Outcome, HandlerError> {
    crate::check(invocation, Operation::Sync)?;
    let repository = invocation
        .repository
        .metadata
        .name
        .clone()
        .ok_or_else(|| HandlerError::Invalid("the Repository has no name".into()))?;
    let namespace = invocation
        .repository
        .metadata
        .namespace
        .clone()
        .unwrap_or_default();
    let deployment = invocation.repository.spec.deployment;
    let url = invocation
        .repository
        .spec
        .git
        .as_ref()
        .map(|g| g.repo.clone())
        .unwrap_or_default();
    let layout = layout(invocation);
    mirror.fetch().await?;
    let path = mirror.path().to_owned();
    let name = repository.clone();
    let (discovered, head) = tokio::task::spawn_blocking(move || -> Result<_, HandlerError> {
        let repo = GitRepo::open(&path)?;
        let head = repo.ref_id(&layout.branch_ref())?;
        Ok((discover(&repo, &layout, &name, &url)?, head))
    })
    .await
    .map_err(|e| HandlerError::Internal(e.to_string()))??;

    let existing: Vec<&PackageRevision> = invocation
        .related
        .iter()
        .filter(|p| p.metadata.namespace.as_deref().unwrap_or("") == namespace)
        .collect();
    let mut out = Outcome::default();
    for d in &discovered {
        let current = existing
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(d.name.as_str()));
        if current.is_some_and(|c| up_to_date(c, d, &repository, deployment)) {
            continue;
        }
        let mut spec = base(&d.name, &namespace);
        spec["metadata"]["labels"] = serde_json::json!({ REPOSITORY_LABEL: repository });
        spec["metadata"]["ownerReferences"] = owner_reference(invocation);
        spec["spec"] = serde_json::json!({
            "packageName": d.package,
            "repository": repository,
            "workspaceName": d.workspace,
        });
        out.apply.push(Apply {
            field_manager: OWNER_MANAGER.into(),
            force: true,
            subresource: Subresource::Main,
            object: spec,
        });
        let mut status = base(&d.name, &namespace);
        status["status"] = serde_json::json!({ "selfLock": d.self_lock, "deployment": deployment });
        if let Some(lock) = &d.upstream_lock {
            status["status"]["upstreamLock"] = serde_json::to_value(lock).unwrap_or_default();
        }
        out.apply.push(Apply {
            field_manager: OWNER_MANAGER.into(),
            force: true,
            subresource: Subresource::Status,
            object: status,
        });
        if current.is_none() {
            let mut seed = base(&d.name, &namespace);
            seed["spec"] = serde_json::json!({ "lifecycle": d.lifecycle.as_str() });
            out.apply.push(Apply {
                field_manager: SEED_MANAGER.into(),
                force: false,
                subresource: Subresource::Main,
                object: seed,
            });
            if d.revision != 0 {
                let mut seed = base(&d.name, &namespace);
                seed["status"] = serde_json::json!({ "revision": d.revision });
                if d.revision > 0 {
                    seed["status"]["publishedBy"] = serde_json::json!(d.author);
                    seed["status"]["publishedAt"] = serde_json::json!(published_at(d.author_time));
                }
                out.apply.push(Apply {
                    field_manager: SEED_MANAGER.into(),
                    force: false,
                    subresource: Subresource::Status,
                    object: seed,
                });
            }
        }
    }
    for stale in existing.iter().filter(|p| {
        let labelled = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(REPOSITORY_LABEL))
            .is_some_and(|v| *v == repository);
        let found = discovered
            .iter()
            .any(|d| p.metadata.name.as_deref() == Some(d.name.as_str()));
        let source_pending = p.spec.source.is_some()
            && p.status
                .as_ref()
                .is_none_or(|s| s.creation_source.is_empty());
        labelled && !found && !source_pending
    }) {
        if let Some(index) = stale
            .metadata
            .finalizers
            .as_ref()
            .and_then(|f| f.iter().position(|x| x == PACKAGE_REVISION_FINALIZER))
        {
            out.patches.push(ObjectPatch::guarded(
                ObjectRef::package_revision(stale),
                Subresource::Main,
                stale.metadata.resource_version.as_deref().unwrap_or(""),
                vec![PatchOperation::Remove(RemoveOperation {
                    path: format!("/metadata/finalizers/{index}")
                        .as_str()
                        .try_into()
                        .unwrap_or_default(),
                })],
            ));
        }
        out.delete.push(ObjectRef::package_revision(stale));
    }
    out.apply.push(repository_status(
        invocation,
        discovered.len(),
        head.map(|id| id.to_string()).unwrap_or_default(),
    ));
    Ok(out)
}

/// The Repository's status after a full sync, as a forced apply of the
/// fields the repository controller owns.
fn repository_status(invocation: &Invocation, package_count: usize, head: String) -> Apply {
    let repository = &invocation.repository;
    let generation = repository.metadata.generation.unwrap_or(0);
    let time = invocation
        .time
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    let ready = repository
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == REPOSITORY_READY));
    let since = match ready {
        Some(c) if c.status == "True" => c.last_transition_time.0.to_string(),
        _ => time.clone(),
    };
    let mut status = serde_json::json!({
        "conditions": [{
            "type": REPOSITORY_READY,
            "status": "True",
            "reason": "Ready",
            "message": "Repository Ready",
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }],
        "lastFullSyncTime": time,
        "observedGeneration": generation,
        "packageCount": package_count,
        "gitCommitHash": head,
    });
    if let Some(at) = repository
        .spec
        .sync
        .as_ref()
        .and_then(|s| s.run_once_at.as_ref())
    {
        status["observedRunOnceAt"] = serde_json::json!(at.0.to_string());
    }
    Apply {
        field_manager: OWNER_MANAGER.into(),
        force: true,
        subresource: Subresource::Status,
        object: serde_json::json!({
            "apiVersion": "config.porch.kpt.dev/v1alpha1",
            "kind": "Repository",
            "metadata": {
                "name": repository.metadata.name.clone().unwrap_or_default(),
                "namespace": repository.metadata.namespace.clone().unwrap_or_default(),
            },
            "status": status,
        }),
    }
}
