//! The source handler (spec §3): apply `spec.source` as a new draft — init,
//! clone from an upstream revision, copy of a published revision, upgrade
//! onto a new upstream — with the checks the reference skips (§9 item 14):
//! the workspace is new for the package, clone only makes new packages,
//! package paths do not nest, upgrade and copy sources are published
//! revisions of the right package.
//!
//! On failure the status says why (`Ready` and `Rendered` False/`Failed`)
//! and nothing is written to git. Idempotent: the draft commit carries the
//! revision's uid and generation, and a repeated create finds it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::common::{GitLock, Lifecycle};
use porch_api::invocation::{Invocation, Operation, Outcome};
use porch_api::kptfile::{
    KPTFILE_API_VERSION, KPTFILE_KIND, Kptfile, KptfileMetadata, PackageInfo, Upstream,
    UpstreamGit, UpstreamLock,
};
use porch_api::lifecycle::effective;
use porch_api::planner::{self, READY_CONDITION, RENDERED_CONDITION};
use porch_api::v1alpha1::{Task, TaskType};
use porch_api::v1alpha2::PackageRevision;
use porch_git::identity::orchestrator;
use porch_git::layout::RepoLayout;
use porch_git::mirror::Mirror;
use porch_git::operations::{Actor, Packages};
use porch_git::remote::Remote;
use porch_git::repo::{Files, GitRepo};
use porch_krm::merge::{self, Strategy};
use porch_krm::render::typed_to_node;
use porch_krm::yaml::{self, SeqIndent};

use crate::HandlerError;
use crate::repository::layout;
use crate::status::{set_condition, status_patch};

/// Why a source cannot be applied (reported in the status).
type Refusal = String;

fn published(pr: &PackageRevision) -> bool {
    effective(pr.spec.lifecycle).is_published()
}

fn find<'a>(invocation: &'a Invocation, name: &str) -> Option<&'a PackageRevision> {
    invocation
        .upstream
        .iter()
        .chain(&invocation.related)
        .find(|p| p.metadata.name.as_deref() == Some(name))
}

/// An upstream outside the draft's repository, read by the caller before
/// the handler runs: a published revision of another Repository, or a
/// package at a git URL.
#[derive(Debug, Clone)]
pub struct ExternalUpstream {
    pub files: Files,
    pub lock: GitLock,
}

/// Everything a source reads outside the draft's repository, each read or
/// the reason it could not be (reported in the status like any refusal).
#[derive(Debug, Clone, Default)]
pub struct ExternalSources {
    /// The package at the git URL of `cloneFrom.git`.
    pub git: Option<Result<ExternalUpstream, Refusal>>,
    /// Published revisions of the upstream Repository by object name: the
    /// clone's upstream, an upgrade's old and new upstreams.
    pub revisions: BTreeMap<String, Result<ExternalUpstream, Refusal>>,
}

impl ExternalSources {
    /// The names of the revisions a source reads, by object name.
    pub fn referenced(pr: &PackageRevision) -> Vec<String> {
        let Some(source) = pr.spec.source.as_ref() else {
            return Vec::new();
        };
        let mut names = Vec::new();
        if let Some(reference) = source
            .clone_from
            .as_ref()
            .and_then(|c| c.upstream_ref.as_ref())
        {
            names.push(reference.name.clone());
        }
        if let Some(upgrade) = &source.upgrade {
            names.push(upgrade.old_upstream.name.clone());
            names.push(upgrade.new_upstream.name.clone());
        }
        names.retain(|n| !n.is_empty());
        names
    }
}

/// The git URL of the Invocation's Repository.
fn repository_url(invocation: &Invocation) -> &str {
    invocation
        .repository
        .spec
        .git
        .as_ref()
        .map_or("", |g| g.repo.as_str())
}

/// A published revision's files and lock: read from this repository, or
/// taken from what the caller read of the upstream Repository.
fn read_revision(
    invocation: &Invocation,
    pr: &PackageRevision,
    revision: &PackageRevision,
    repo: &GitRepo,
    layout: &RepoLayout,
    external: &ExternalSources,
) -> Result<(Files, GitLock), Refusal> {
    let name = revision.metadata.name.as_deref().unwrap_or("");
    if revision.spec.repository == pr.spec.repository {
        return read_published(repo, layout, repository_url(invocation), revision);
    }
    match external.revisions.get(name) {
        Some(Ok(read)) => Ok((read.files.clone(), read.lock.clone())),
        Some(Err(refusal)) => Err(refusal.clone()),
        None => Err(format!(
            "package {name:?} is in repository {:?}, which the invocation does not name",
            revision.spec.repository
        )),
    }
}

/// The files of a published revision of this repository, read from its tag
/// (or from the branch for the placeholder, revision -1), with its lock.
pub(crate) fn read_published(
    repo: &GitRepo,
    layout: &RepoLayout,
    url: &str,
    pr: &PackageRevision,
) -> Result<(Files, GitLock), Refusal> {
    let package = &pr.spec.package_name;
    let revision = pr.status.as_ref().and_then(|s| s.revision).unwrap_or(0);
    let reference = if revision > 0 {
        layout
            .tag_ref(package, u64::try_from(revision).unwrap_or(0))
            .map_err(|e| e.to_string())?
    } else if revision == -1 {
        layout.branch_ref()
    } else {
        return Err(format!(
            "package {:?} has no published revision",
            pr.metadata.name.as_deref().unwrap_or("")
        ));
    };
    let commit = repo
        .ref_id(&reference)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{reference} does not exist in git"))?;
    let full = layout.full_path(package);
    let files = repo.read_files(commit, &full).map_err(|e| e.to_string())?;
    if !files.contains_key("Kptfile") {
        return Err(format!("{reference} has no Kptfile at {full}"));
    }
    let short = reference
        .strip_prefix("refs/tags/")
        .or(reference.strip_prefix("refs/heads/"))
        .unwrap_or(&reference)
        .to_owned();
    let repo_url = if url.ends_with(".git") {
        url.to_owned()
    } else {
        format!("{url}.git")
    };
    Ok((
        files,
        GitLock {
            repo: repo_url,
            directory: package.clone(),
            ref_: short,
            commit: commit.to_string(),
        },
    ))
}

/// The files `kpt pkg init` writes (spec §3.2).
fn init_files(pr: &PackageRevision) -> Result<Files, Refusal> {
    let init = pr
        .spec
        .source
        .as_ref()
        .and_then(|s| s.init.clone())
        .unwrap_or_default();
    if !init.subpackage.is_empty() {
        return Err("init with a subpackage leaves the package without a root Kptfile".into());
    }
    let name = pr
        .spec
        .package_name
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_owned();
    let kptfile = Kptfile {
        api_version: KPTFILE_API_VERSION.into(),
        kind: KPTFILE_KIND.into(),
        metadata: KptfileMetadata {
            name: name.clone(),
            annotations: [(
                "config.kubernetes.io/local-config".to_owned(),
                "true".to_owned(),
            )]
            .into(),
            ..KptfileMetadata::default()
        },
        info: Some(PackageInfo {
            description: init.description.clone(),
            site: init.site.clone(),
            keywords: init.keywords.clone(),
            ..PackageInfo::default()
        })
        .filter(|i| *i != PackageInfo::default()),
        ..Kptfile::default()
    };
    let node = typed_to_node(&kptfile)?;
    let readme = format!(
        "# {name}\n\n## Description\n{}\n\n## Usage\n\n### Fetch the package\n`kpt pkg get REPO_URI[.git]/PKG_PATH[@VERSION] {name}`\nDetails: https://kpt.dev/reference/cli/pkg/get/\n\n### View package content\n`kpt pkg tree {name}`\nDetails: https://kpt.dev/reference/cli/pkg/tree/\n\n### Apply the package\n```\nkpt live init {name}\nkpt live apply {name} --reconcile-timeout=2m --output=table\n```\nDetails: https://kpt.dev/reference/cli/live/\n",
        if init.description.is_empty() {
            "sample description"
        } else {
            &init.description
        }
    );
    Ok([
        ("Kptfile".to_owned(), yaml::emit_document(&node, SeqIndent::Wide).into_bytes()),
        ("README.md".to_owned(), readme.into_bytes()),
        (
            "package-context.yaml".to_owned(),
            b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kptfile.kpt.dev\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\ndata:\n  name: example\n".to_vec(),
        ),
    ]
    .into())
}

/// The package context of a clone into a deployment repository (spec §4;
/// the reference's v1alpha2 clone skips it, §9 item 18): every ConfigMap
/// `kptfile.kpt.dev` is dropped and a root `package-context.yaml` holds the
/// new package's name and path.
fn package_context(files: Files, package: &str) -> Result<Files, Refusal> {
    let mut resources = porch_krm::package::read_resources(&files).map_err(|e| e.to_string())?;
    let previous = porch_krm::package::resource_files(&resources);
    resources.retain(|r| {
        !(r.kind() == "ConfigMap" && r.api_version() == "v1" && r.name() == "kptfile.kpt.dev")
    });
    let name = package.rsplit('/').next().unwrap_or(package);
    let mut context = yaml::parse_document(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kptfile.kpt.dev\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\ndata:\n  name: x\n  package-path: x\n",
    )
    .map_err(|e| e.to_string())?
    .ok_or("empty package context")?;
    for (key, value) in [("name", name), ("package-path", package)] {
        if let Some(slot) = context.lookup_mut(&["data", key]) {
            slot.set_string(value);
        }
    }
    resources.push(porch_krm::resource::Resource::new(
        context,
        porch_krm::resource::Origin {
            path: "package-context.yaml".into(),
            index: Some(0),
            ..Default::default()
        },
    ));
    porch_krm::package::write_resources(&files, resources, &previous).map_err(|e| e.to_string())
}

/// Points the Kptfile at its upstream and renames the package (kpt's
/// `UpdateKptfileUpstream`).
fn set_upstream(files: &mut Files, name: &str, lock: &GitLock) -> Result<(), Refusal> {
    let text = files
        .get("Kptfile")
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    let mut kptfile = Kptfile::from_yaml(&text).map_err(|e| e.to_string())?;
    kptfile.metadata.name = name.rsplit('/').next().unwrap_or(name).to_owned();
    kptfile.upstream = Some(Upstream {
        type_: "git".into(),
        git: Some(UpstreamGit {
            repo: lock.repo.clone(),
            directory: lock.directory.clone(),
            ref_: lock.ref_.clone(),
        }),
        update_strategy: kptfile.upstream.and_then(|u| u.update_strategy),
    });
    kptfile.upstream_lock = Some(UpstreamLock {
        type_: "git".into(),
        git: Some(lock.clone()),
        generic: None,
    });
    let node = typed_to_node(&kptfile)?;
    files.insert(
        "Kptfile".into(),
        yaml::emit_document(&node, SeqIndent::Wide).into_bytes(),
    );
    Ok(())
}

/// The package's files for the source, or why not.
fn compute(
    invocation: &Invocation,
    pr: &PackageRevision,
    repo: &GitRepo,
    layout: &RepoLayout,
    external: &ExternalSources,
) -> Result<(Files, &'static str), Refusal> {
    let source = pr.spec.source.as_ref().ok_or("no source")?;
    let kind = source.creation_source().ok_or("source has no fields set")?;
    let url = repository_url(invocation);
    let siblings: Vec<&PackageRevision> = invocation
        .related
        .iter()
        .filter(|p| p.spec.repository == pr.spec.repository && p.metadata.name != pr.metadata.name)
        .collect();
    if siblings.iter().any(|p| {
        p.spec.package_name == pr.spec.package_name
            && p.spec.workspace_name == pr.spec.workspace_name
    }) {
        return Err(format!(
            "workspace {:?} already exists for package {:?}",
            pr.spec.workspace_name, pr.spec.package_name
        ));
    }
    let nested =
        |a: &str, b: &str| a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"));
    if matches!(kind, "init" | "clone")
        && let Some(other) = siblings
            .iter()
            .find(|p| nested(&p.spec.package_name, &pr.spec.package_name))
    {
        return Err(format!(
            "package path {:?} would nest with package {:?}",
            pr.spec.package_name, other.spec.package_name
        ));
    }
    match kind {
        "init" => Ok((init_files(pr)?, kind)),
        "clone" => {
            if siblings
                .iter()
                .any(|p| p.spec.package_name == pr.spec.package_name)
            {
                return Err(format!(
                    "package {:?} already exists; make new revisions of it with copy",
                    pr.spec.package_name
                ));
            }
            let clone = source.clone_from.as_ref().ok_or("clone has no source")?;
            let (mut files, lock) = match (&clone.upstream_ref, &clone.git) {
                (Some(reference), None) => {
                    let name = &reference.name;
                    let upstream = find(invocation, name)
                        .ok_or_else(|| format!("failed to get upstream package {name:?}"))?;
                    if !published(upstream) {
                        return Err(format!("upstream package {name:?} must be published"));
                    }
                    read_revision(invocation, pr, upstream, repo, layout, external)
                        .map_err(|e| format!("upstream package: {e}"))?
                }
                (None, Some(_)) => {
                    let read = external
                        .git
                        .clone()
                        .ok_or("the package at the git URL was not read")??;
                    (read.files, read.lock)
                }
                _ => return Err("clone needs exactly one of upstreamRef and git".into()),
            };
            set_upstream(&mut files, &pr.spec.package_name, &lock)?;
            if invocation.repository.spec.deployment {
                files = package_context(files, &pr.spec.package_name)?;
            }
            let files = merge::add_merge_keys(&files, true).map_err(|e| e.to_string())?;
            Ok((files, kind))
        }
        "copy" => {
            let name = source
                .copy_from
                .as_ref()
                .map(|r| r.name.clone())
                .unwrap_or_default();
            let from = find(invocation, &name)
                .ok_or_else(|| format!("failed to get source package {name:?}"))?;
            if from.spec.repository != pr.spec.repository {
                return Err(format!(
                    "source package must be from same repository {:?}, got {:?}",
                    pr.spec.repository, from.spec.repository
                ));
            }
            if from.spec.package_name != pr.spec.package_name {
                return Err(format!(
                    "source package must be same package {:?}, got {:?}",
                    pr.spec.package_name, from.spec.package_name
                ));
            }
            if !published(from) {
                return Err(format!("source package {name:?} must be published"));
            }
            Ok((read_published(repo, layout, url, from)?.0, kind))
        }
        "upgrade" => {
            let upgrade = source.upgrade.as_ref().ok_or("upgrade has no fields")?;
            let get = |label: &str, name: &str| -> Result<&PackageRevision, Refusal> {
                let pr = find(invocation, name)
                    .ok_or_else(|| format!("{label}: failed to get package {name:?}"))?;
                if !published(pr) {
                    return Err(format!("{label}: package {name:?} must be published"));
                }
                Ok(pr)
            };
            let old = get("old upstream", &upgrade.old_upstream.name)?;
            let new = get("new upstream", &upgrade.new_upstream.name)?;
            let current = get("current package", &upgrade.current_package.name)?;
            if current.spec.package_name != pr.spec.package_name {
                return Err(format!(
                    "current package: {:?} is not a revision of package {:?}",
                    upgrade.current_package.name, pr.spec.package_name
                ));
            }
            if current.spec.repository != pr.spec.repository {
                return Err(format!(
                    "current package: {:?} is in repository {:?}, not {:?}",
                    upgrade.current_package.name, current.spec.repository, pr.spec.repository
                ));
            }
            if old.spec.repository != new.spec.repository
                || old.spec.package_name != new.spec.package_name
            {
                return Err(format!(
                    "old upstream {:?} and new upstream {:?} must be revisions of one package",
                    upgrade.old_upstream.name, upgrade.new_upstream.name
                ));
            }
            let (original, _) = read_revision(invocation, pr, old, repo, layout, external)
                .map_err(|e| format!("old upstream: {e}"))?;
            let (updated, lock) = read_revision(invocation, pr, new, repo, layout, external)
                .map_err(|e| format!("new upstream: {e}"))?;
            let (local, _) = read_published(repo, layout, url, current)?;
            let strategy = Strategy::from_name(
                &upgrade
                    .strategy
                    .map(|s| {
                        serde_json::to_value(s)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    })
                    .unwrap_or_default(),
            );
            let mut files = merge::update(&original, &updated, &local, strategy)
                .map_err(|e| format!("3-way merge failed: {e}"))?;
            set_upstream(&mut files, &pr.spec.package_name, &lock)?;
            let files = merge::add_merge_keys(&files, true).map_err(|e| e.to_string())?;
            Ok((files, kind))
        }
        other => Err(format!("unknown source {other:?}")),
    }
}

/// Applies the Invocation's source as a new draft.
///
/// # Errors
/// A malformed Invocation (not retryable); git transport failures
/// (retryable). A source that cannot be applied is reported in the status.
pub async fn source<R: Remote + 'static>(
    invocation: &Invocation,
    mirror: &Mirror<R>,
    now: &Time,
) -> Result<Outcome, HandlerError> {
    source_with(invocation, mirror, now, ExternalSources::default()).await
}

/// [`source`] with an upstream outside the repository, read beforehand
/// (or why it could not be: reported in the status like any refusal).
///
/// # Errors
/// As [`source`].
pub async fn source_with<R: Remote + 'static>(
    invocation: &Invocation,
    mirror: &Mirror<R>,
    now: &Time,
    external: ExternalSources,
) -> Result<Outcome, HandlerError> {
    let pr = crate::revision_of(invocation, Operation::Source)?;
    if !planner::is_due(Operation::Source, pr, &invocation.repository) {
        return Ok(Outcome::none());
    }
    let layout = layout(invocation);
    layout
        .draft_ref(&pr.spec.package_name, &pr.spec.workspace_name)
        .map_err(|e| HandlerError::Invalid(e.to_string()))?;
    if effective(pr.spec.lifecycle) != Lifecycle::Draft {
        return Err(HandlerError::Invalid(
            "a revision with a source is created as a Draft".into(),
        ));
    }

    mirror.fetch().await?;
    let path = mirror.path().to_owned();
    let (inv, pr_owned, layout_owned) = (invocation.clone(), pr.clone(), layout.clone());
    let computed = tokio::task::spawn_blocking(move || -> Result<_, HandlerError> {
        let repo = GitRepo::open(&path)?;
        Ok(compute(&inv, &pr_owned, &repo, &layout_owned, &external))
    })
    .await
    .map_err(|e| HandlerError::Internal(e.to_string()))??;

    let mut status = pr.status.clone().unwrap_or_default();
    let generation = pr.metadata.generation;
    status.observed_generation = generation;
    // the upstream the new draft locks onto, for its status (the variant
    // handler reads it to see whether a downstream is up to date)
    let lock = match &computed {
        Ok((files, _)) => files
            .get("Kptfile")
            .and_then(|k| porch_git::discovery::upstream_lock_of(k)),
        Err(_) => None,
    };
    let outcome = match computed {
        Ok((files, kind)) => {
            let actor = Actor {
                uid: pr.metadata.uid.clone().unwrap_or_default(),
                generation: generation.unwrap_or(0),
                author: orchestrator(),
                time: now.0.as_second(),
            };
            let task = Task {
                type_: match kind {
                    "init" => TaskType::Init,
                    "clone" => TaskType::Clone,
                    "upgrade" => TaskType::Upgrade,
                    _ => TaskType::Edit,
                },
                ..Task::default()
            };
            let (package, workspace) =
                (pr.spec.package_name.clone(), pr.spec.workspace_name.clone());
            mirror
                .apply_optimistic(move |repo| {
                    Packages {
                        repo,
                        layout: layout.clone(),
                    }
                    .create_draft(
                        &package,
                        &workspace,
                        &files,
                        task.clone(),
                        &actor,
                    )
                })
                .await
                .map(|_| kind)
        }
        Err(refusal) => Err(porch_git::mirror::MirrorError::Operation(
            porch_git::operations::OperationError::Missing(refusal),
        )),
    };
    match outcome {
        Ok(kind) => {
            status.creation_source = kind.to_owned();
            if lock.is_some() {
                status.upstream_lock = lock;
            }
            set_condition(
                &mut status.conditions,
                READY_CONDITION,
                "False",
                "Pending",
                "awaiting render",
                generation,
                now,
            );
            set_condition(
                &mut status.conditions,
                RENDERED_CONDITION,
                "Unknown",
                "Pending",
                "awaiting render",
                generation,
                now,
            );
        }
        Err(porch_git::mirror::MirrorError::Operation(error))
            if !matches!(error, porch_git::operations::OperationError::Repo(_)) =>
        {
            let message = match error {
                porch_git::operations::OperationError::Missing(m) => m,
                other => other.to_string(),
            };
            set_condition(
                &mut status.conditions,
                READY_CONDITION,
                "False",
                "Failed",
                &message,
                generation,
                now,
            );
            set_condition(
                &mut status.conditions,
                RENDERED_CONDITION,
                "False",
                "Failed",
                &message,
                generation,
                now,
            );
        }
        Err(other) => return Err(other.into()),
    }
    Ok(Outcome {
        patches: vec![status_patch(pr, status)],
        ..Outcome::default()
    })
}
