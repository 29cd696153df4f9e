//! A revision's files: read from whichever ref holds the revision, and
//! written to a draft (what `PackageRevisionResources` updates do in Porch;
//! the `porch` CLI's `pull` and `push`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::common::Lifecycle;
use porch_api::repository::Repository;
use porch_api::v1alpha1::{Task, TaskType};
use porch_api::v1alpha2::PackageRevision;
use porch_git::identity::Identity;
use porch_git::layout::RepoLayout;
use porch_git::mirror::Mirror;
use porch_git::operations::{Actor, Packages};
use porch_git::remote::Remote;
use porch_git::repo::{Files, GitRepo, validate_file_path};

use crate::HandlerError;
use crate::repository::layout_of;

fn invalid(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::Invalid(e.to_string())
}

/// The refs that may hold `pr`, most specific first.
fn candidate_refs(layout: &RepoLayout, pr: &PackageRevision) -> Result<Vec<String>, HandlerError> {
    let (package, workspace) = (&pr.spec.package_name, &pr.spec.workspace_name);
    porch_api::naming::validate_package_path(package).map_err(invalid)?;
    let mut refs = vec![
        layout.draft_ref(package, workspace).map_err(invalid)?,
        layout.proposed_ref(package, workspace).map_err(invalid)?,
    ];
    let revision = pr.status.as_ref().and_then(|s| s.revision).unwrap_or(0);
    if let Ok(revision) = u64::try_from(revision)
        && revision > 0
    {
        refs.insert(0, layout.tag_ref(package, revision).map_err(invalid)?);
    }
    if revision == -1 {
        // the placeholder: the package on the registered branch
        refs.push(layout.branch_ref());
    }
    Ok(refs)
}

/// The files of `pr` in the mirror (fetched by the caller).
///
/// # Errors
/// No ref holds the revision, or git fails.
pub async fn read<R: Remote + 'static>(
    repository: &Repository,
    pr: &PackageRevision,
    mirror: &Mirror<R>,
) -> Result<Files, HandlerError> {
    let layout = layout_of(repository);
    let refs = candidate_refs(&layout, pr)?;
    let full_path = layout.full_path(&pr.spec.package_name);
    let path = mirror.path().to_path_buf();
    let name = pr.metadata.name.clone().unwrap_or_default();
    tokio::task::spawn_blocking(move || {
        let repo = GitRepo::open(&path)?;
        for name in &refs {
            if let Some(commit) = repo.ref_id(name)? {
                return Ok(repo.read_files(commit, &full_path)?);
            }
        }
        Err(HandlerError::Invalid(format!(
            "no branch or tag holds {name:?} (looked for {})",
            refs.join(", ")
        )))
    })
    .await
    .map_err(|e| HandlerError::Internal(e.to_string()))?
}

/// Replaces the package on `pr`'s draft branch with `files`, authored by
/// `user`; `false` when the draft held them already.
///
/// # Errors
/// `pr` is not a draft, a file path is unsafe, the draft is missing (not
/// retryable); git failures.
pub async fn write<R: Remote + 'static>(
    repository: &Repository,
    pr: &PackageRevision,
    mirror: &Mirror<R>,
    files: Files,
    user: &str,
    now: &Time,
) -> Result<bool, HandlerError> {
    let lifecycle = pr.spec.lifecycle.unwrap_or(Lifecycle::Draft);
    if lifecycle != Lifecycle::Draft {
        return Err(HandlerError::Invalid(format!(
            "only drafts can be changed; {:?} is {}",
            pr.metadata.name.as_deref().unwrap_or(""),
            lifecycle.as_str()
        )));
    }
    for path in files.keys() {
        validate_file_path(path).map_err(invalid)?;
    }
    porch_api::limits::PackageBudget::check(&files).map_err(invalid)?;
    if !files.contains_key("Kptfile") {
        return Err(HandlerError::Invalid(
            "the package has no Kptfile at its root".into(),
        ));
    }
    let layout = layout_of(repository);
    let (package, workspace) = (pr.spec.package_name.clone(), pr.spec.workspace_name.clone());
    layout.draft_ref(&package, &workspace).map_err(invalid)?;
    let actor = Actor {
        uid: pr.metadata.uid.clone().unwrap_or_default(),
        generation: pr.metadata.generation.unwrap_or(0),
        author: Identity::of_user(user),
        time: now.0.as_second(),
    };
    replace_draft(
        mirror,
        layout,
        package,
        workspace,
        files,
        TaskType::Push,
        actor,
    )
    .await
}

/// Commits `files` as the package of a draft unless it holds them already
/// (content decides, not authorship); `true` when a commit was pushed. The
/// draft branch's compare-and-swap guards the write, so a warm mirror is
/// trusted first.
pub(crate) async fn replace_draft<R: Remote + 'static>(
    mirror: &Mirror<R>,
    layout: RepoLayout,
    package: String,
    workspace: String,
    files: Files,
    task: TaskType,
    actor: Actor,
) -> Result<bool, HandlerError> {
    let applied = mirror
        .apply_optimistic(move |repo| {
            Packages {
                repo,
                layout: layout.clone(),
            }
            .replace_draft_content(
                &package,
                &workspace,
                &files,
                Task {
                    type_: task,
                    ..Task::default()
                },
                &actor,
            )
        })
        .await?;
    Ok(!applied.updates.is_empty())
}

/// Commits `files`, rendered from the draft's commit `from`, as the
/// draft's package (a render task) while the draft is still at `from`;
/// `None` when it moved meanwhile (a push landed: the files no longer
/// follow from the draft, and writing them would undo it).
pub(crate) async fn replace_rendered<R: Remote + 'static>(
    mirror: &Mirror<R>,
    layout: RepoLayout,
    package: String,
    workspace: String,
    files: Files,
    actor: Actor,
    from: String,
) -> Result<Option<bool>, HandlerError> {
    let applied = mirror
        .apply_optimistic(move |repo| {
            let from = porch_git::repo::parse_object_id(&from).ok_or_else(|| {
                porch_git::operations::OperationError::Refused(format!(
                    "{from:?} is not a commit id"
                ))
            })?;
            Packages {
                repo,
                layout: layout.clone(),
            }
            .replace_draft_content_from(
                &package,
                &workspace,
                &files,
                Task {
                    type_: TaskType::Render,
                    ..Task::default()
                },
                &actor,
                from,
            )
        })
        .await?;
    Ok(applied.value.map(|_| !applied.updates.is_empty()))
}
