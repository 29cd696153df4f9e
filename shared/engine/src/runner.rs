//! One entry point for every operation: the [`Runner`] picks the handler,
//! keeps a mirror per repository and, with an object store, the snapshot
//! around it. Lambda functions, `cargo lambda watch` and the `porch` CLI all
//! call [`Runner::handle`].
//!
//! Around each git operation:
//! 1. the planner is asked first: an Invocation with nothing due answers an
//!    empty Outcome without touching git or the store;
//! 2. the mirror is brought to the snapshot (a cold process downloads it; a
//!    warm one reads nothing when the manifest has not changed; a missing
//!    or corrupt snapshot is rebuilt from the remote);
//! 3. the handler runs; its pushes are compare-and-swaps against the
//!    remote, so a stale snapshot costs a retry, never a lost update;
//! 4. when the mirror's refs moved, the snapshot is saved. A save that
//!    fails after the push is logged and the Outcome still returned: the
//!    remote holds the work and the next Invocation catches the snapshot up.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use porch_api::invocation::{Invocation, Operation, Outcome};
use porch_api::planner;
use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_git::egress::EgressPolicy;
use porch_git::mirror::MirrorError;
use porch_git::mirror::{Mirror, RetryPolicy};
use porch_git::remote::{Remote, RemoteError, RemoteOptions};
use porch_git::repo::{Files, GitRepo};
use porch_git::snapshot::SnapshotError;
use porch_git::snapshot::{Prepared, Snapshots};
use porch_git::store::ObjectStore;
use porch_krm::render::RenderOptions;
use porch_krm::runtime::FunctionRuntime;

use crate::HandlerError;
use crate::render::RenderContext;
use crate::repository::{AnyRemote, mirror_for, repository_key};
use crate::secrets::{NoSecrets, SecretResolver};
use crate::source::{ExternalSources, ExternalUpstream};

/// The egress policy's refusal behind a handler error, if that is what it
/// is: a refusal of the URL, not a failure worth retrying.
fn egress_refusal(error: &HandlerError) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(inner) = source {
        // transparent wrappers hide their inner error from `source()`
        let remote = inner
            .downcast_ref::<RemoteError>()
            .or_else(|| match inner.downcast_ref::<SnapshotError>() {
                Some(SnapshotError::Remote(e)) => Some(e),
                _ => None,
            })
            .or_else(|| match inner.downcast_ref::<MirrorError>() {
                Some(MirrorError::Remote(e) | MirrorError::Exhausted { last: e, .. }) => Some(e),
                _ => None,
            });
        if let Some(RemoteError::Denied { url, reason }) = remote {
            return Some(format!("{url}: {reason}"));
        }
        source = inner.source();
    }
    None
}

/// What the handlers share across Invocations.
#[derive(Debug)]
pub struct Runner<S> {
    cache_root: PathBuf,
    store: Option<S>,
    remote_options: RemoteOptions,
    retry: RetryPolicy,
    functions: Arc<dyn FunctionRuntime>,
    render_options: RenderOptions,
    secrets: Arc<dyn SecretResolver>,
    /// Where a clone's `cloneFrom.git.repo` may lead (users choose it, so
    /// public addresses only unless allowlisted).
    clone_egress: Arc<EgressPolicy>,
    /// One per mirror directory, kept so a warm process reads the manifest
    /// only when it changed.
    snapshots: Mutex<HashMap<PathBuf, Arc<Snapshots<S>>>>,
}

impl<S: ObjectStore + Clone + 'static> Runner<S> {
    /// A runner keeping mirrors under `cache_root`, rendering with
    /// `functions`, and without snapshots until [`Runner::with_store`].
    pub fn new(cache_root: impl Into<PathBuf>, functions: Arc<dyn FunctionRuntime>) -> Self {
        Runner {
            cache_root: cache_root.into(),
            store: None,
            remote_options: RemoteOptions::default(),
            retry: RetryPolicy::default(),
            functions,
            render_options: RenderOptions::default(),
            secrets: Arc::new(NoSecrets),
            clone_egress: Arc::new(EgressPolicy::public_only()),
            snapshots: Mutex::new(HashMap::new()),
        }
    }

    /// Where clones from git URLs may connect (public addresses only by
    /// default).
    #[must_use]
    pub fn with_clone_egress(mut self, policy: EgressPolicy) -> Self {
        self.clone_egress = Arc::new(policy);
        self
    }

    /// Keeps each repository's snapshot in `store`.
    #[must_use]
    pub fn with_store(mut self, store: S) -> Self {
        self.store = Some(store);
        self
    }

    #[must_use]
    pub fn with_remote_options(mut self, options: RemoteOptions) -> Self {
        self.remote_options = options;
        self
    }

    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    #[must_use]
    pub fn with_render_options(mut self, options: RenderOptions) -> Self {
        self.render_options = options;
        self
    }

    /// Resolves the Secrets Repositories and clones name for their
    /// credentials (none without it).
    #[must_use]
    pub fn with_secrets(mut self, secrets: Arc<dyn SecretResolver>) -> Self {
        self.secrets = secrets;
        self
    }

    pub fn cache_root(&self) -> &Path {
        &self.cache_root
    }

    /// Runs the Invocation's operation.
    ///
    /// # Errors
    /// As the handler's; a store that fails before the handler ran
    /// (retryable).
    pub async fn handle(&self, invocation: &Invocation) -> Result<Outcome, HandlerError> {
        let now = invocation
            .time
            .clone()
            .unwrap_or_else(|| Time(Timestamp::now()));
        if invocation.operation == Operation::Adopt {
            return crate::adopt::adopt(invocation);
        }
        if invocation.operation == Operation::VariantSet {
            return crate::variant_set::reconcile(invocation, &now);
        }
        if invocation.operation == Operation::Variant {
            // boxed: its git work is a future of its own, and the callers'
            // futures stay small
            return Box::pin(self.variant(invocation, &now)).await;
        }
        if !due(invocation) {
            // the handler would say the same after loading the repository
            crate::check(invocation, invocation.operation)?;
            return Ok(Outcome::none());
        }
        let session = self.open(&invocation.repository).await?;
        let mirror = &session.mirror;
        let outcome = match invocation.operation {
            Operation::Adopt => crate::adopt::adopt(invocation),
            Operation::Source => {
                let external = self.external_sources(invocation).await?;
                crate::source::source_with(invocation, mirror, &now, external).await
            }
            Operation::Render => {
                let context = RenderContext {
                    functions: Arc::clone(&self.functions),
                    options: self.render_options.clone(),
                    now,
                };
                crate::render::render(invocation, mirror, &context).await
            }
            Operation::Lifecycle => crate::lifecycle::lifecycle(invocation, mirror, &now).await,
            Operation::Delete => crate::delete::delete(invocation, mirror, &now).await,
            Operation::Sync => crate::sync::sync(invocation, mirror).await,
            Operation::Variant => Box::pin(self.variant(invocation, &now)).await,
            Operation::VariantSet => crate::variant_set::reconcile(invocation, &now),
        }?;
        self.close(session).await;
        Ok(outcome)
    }

    /// The files of a revision: its draft or proposed branch, else its tag.
    ///
    /// # Errors
    /// Bad names or no such revision in git (not retryable); git failures.
    /// A variant: the decision from the objects, then the mutations on
    /// the files of its downstream drafts (and, for a published
    /// downstream, whether they would change it).
    async fn variant(&self, invocation: &Invocation, now: &Time) -> Result<Outcome, HandlerError> {
        let plan = crate::variant::reconcile(invocation, now)?;
        if plan.mutate.is_empty() && plan.edit_if_changed.is_none() {
            return Ok(plan.finish(false, None));
        }
        let session = self.open(&invocation.repository).await?;
        let result = crate::variant::mutate(invocation, &plan, &session.mirror, now).await;
        self.close(session).await;
        let (mut requests, edit_needed, error) = match result {
            Ok(done) => (done.render_requests, done.edit_needed, None),
            Err(e) if !e.is_retryable() => (Vec::new(), false, Some(e.to_string())),
            Err(e) => return Err(e),
        };
        let mut outcome = plan.finish(edit_needed, error);
        outcome.patches.append(&mut requests);
        Ok(outcome)
    }

    pub async fn read_revision(
        &self,
        repository: &Repository,
        pr: &PackageRevision,
    ) -> Result<Files, HandlerError> {
        let session = self.open(repository).await?;
        session.mirror.fetch().await?;
        let files = crate::content::read(repository, pr, &session.mirror).await;
        self.close(session).await;
        files
    }

    /// Replaces a draft's package with `files` as `user`; `false` when the
    /// draft held them already.
    ///
    /// # Errors
    /// Unsafe file paths, no such draft (not retryable); git failures.
    pub async fn write_draft(
        &self,
        repository: &Repository,
        pr: &PackageRevision,
        files: Files,
        user: &str,
    ) -> Result<bool, HandlerError> {
        let session = self.open(repository).await?;
        let now = Time(Timestamp::now());
        let written =
            crate::content::write(repository, pr, &session.mirror, files, user, &now).await;
        self.close(session).await;
        written
    }

    /// What a source reads outside the draft's repository, each from its
    /// own mirror: the package at a git URL, published revisions of the
    /// upstream Repository. A ref or directory that does not exist is a
    /// refusal (reported in the status); an unreachable remote is an error
    /// (retried).
    async fn external_sources(
        &self,
        invocation: &Invocation,
    ) -> Result<ExternalSources, HandlerError> {
        let mut sources = ExternalSources::default();
        let Some(pr) = &invocation.package_revision else {
            return Ok(sources);
        };
        if let Some(git) = pr
            .spec
            .source
            .as_ref()
            .and_then(|s| s.clone_from.as_ref())
            .and_then(|c| c.git.as_ref())
        {
            sources.git = Some(self.read_git_url(invocation, git).await?);
        }
        let Some(repository) = &invocation.upstream_repository else {
            return Ok(sources);
        };
        let Some(repository_name) = repository.metadata.name.as_deref() else {
            return Ok(sources);
        };
        let wanted: Vec<PackageRevision> = ExternalSources::referenced(pr)
            .iter()
            .filter_map(|name| {
                invocation
                    .upstream
                    .iter()
                    .chain(&invocation.related)
                    .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            })
            .filter(|p| {
                p.spec.repository != pr.spec.repository && p.spec.repository == repository_name
            })
            .cloned()
            .collect();
        if wanted.is_empty() {
            return Ok(sources);
        }
        let session = self.open(repository).await?;
        session.mirror.fetch().await?;
        let path = session.mirror.path().to_path_buf();
        let repository = repository.clone();
        let read = tokio::task::spawn_blocking(move || -> Result<_, HandlerError> {
            let repo = GitRepo::open(&path)?;
            let layout = crate::repository::layout_of(&repository);
            let url = repository.spec.git.as_ref().map_or("", |g| g.repo.as_str());
            Ok(wanted
                .iter()
                .map(|upstream| {
                    let name = upstream.metadata.name.clone().unwrap_or_default();
                    let read = crate::source::read_published(&repo, &layout, url, upstream)
                        .map(|(files, lock)| ExternalUpstream { files, lock });
                    (name, read)
                })
                .collect())
        })
        .await
        .map_err(|e| HandlerError::Internal(e.to_string()))??;
        self.close(session).await;
        sources.revisions = read;
        Ok(sources)
    }

    /// The package a `cloneFrom.git` names, read through a mirror of its
    /// URL with the credentials its Secret holds.
    async fn read_git_url(
        &self,
        invocation: &Invocation,
        git: &porch_api::common::GitPackage,
    ) -> Result<Result<ExternalUpstream, String>, HandlerError> {
        if let Err(e) = porch_api::naming::validate_git_url(&git.repo) {
            return Ok(Err(e.to_string()));
        }
        let directory = git.directory.trim_matches('/').to_owned();
        if !directory.is_empty()
            && let Err(e) = porch_api::naming::validate_package_path(&directory)
        {
            return Ok(Err(format!("directory: {e}")));
        }
        let url = git.repo.as_str();
        if (url.starts_with("file://") || url.starts_with('/'))
            && let Err(denied) = self.clone_egress.check_local_path(url)
        {
            return Ok(Err(denied.to_string()));
        }
        let repository = upstream_repository(invocation, &git.repo, &git.secret_ref.name);
        let mut options = match self.remote_options(&repository).await {
            Ok(options) => options,
            Err(HandlerError::Credentials(e)) => return Ok(Err(e)),
            Err(e) => return Err(e),
        };
        options.egress = Some(Arc::clone(&self.clone_egress));
        if let Err(e) = crate::repository::remote_for(&repository, options.clone()) {
            // an unusable URL, or one the egress policy refuses: a refusal
            return Ok(Err(e.to_string()));
        }
        let opened = match self.open_with(&repository, options).await {
            Ok(session) => session
                .mirror
                .fetch()
                .await
                .map(|_| session)
                .map_err(Into::into),
            Err(e) => Err(e),
        };
        let session = match opened {
            Ok(session) => session,
            Err(e) => return egress_refusal(&e).map(Err).ok_or(e),
        };
        let (path, url, reference) = (
            session.mirror.path().to_path_buf(),
            git.repo.clone(),
            git.ref_.clone(),
        );
        let read =
            tokio::task::spawn_blocking(move || read_at_ref(&path, &url, &reference, &directory))
                .await
                .map_err(|e| HandlerError::Internal(e.to_string()))??;
        self.close(session).await;
        Ok(read)
    }

    /// The repository's mirror, brought to its snapshot when there is a store.
    async fn open(&self, repository: &Repository) -> Result<Session<S>, HandlerError> {
        let options = self.remote_options(repository).await?;
        self.open_with(repository, options).await
    }

    /// How a Repository's remote is reached: with the credentials and CA
    /// bundle of the Secrets it names.
    async fn remote_options(&self, repository: &Repository) -> Result<RemoteOptions, HandlerError> {
        let secret = repository
            .spec
            .git
            .as_ref()
            .and_then(|g| g.secret_ref.as_ref())
            .map(|r| r.name.as_str());
        let namespace = repository
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default");
        crate::secrets::remote_options(&*self.secrets, &self.remote_options, namespace, secret)
            .await
            .map_err(HandlerError::Credentials)
    }

    async fn open_with(
        &self,
        repository: &Repository,
        options: RemoteOptions,
    ) -> Result<Session<S>, HandlerError> {
        let mirror = mirror_for(repository, &self.cache_root, options, self.retry)?;
        let snapshots = self.snapshots_for(repository, mirror.path())?;
        if let Some(snapshots) = &snapshots {
            match snapshots.prepare(mirror.remote()).await? {
                Prepared::Loaded(loaded) => tracing::debug!(
                    bytes = loaded.bytes_read,
                    packs = loaded.packs_downloaded,
                    "snapshot loaded"
                ),
                Prepared::Rebuilt(saved) => {
                    tracing::info!(
                        bytes = saved.bytes_written,
                        "snapshot rebuilt from the remote"
                    );
                }
            }
        }
        Ok(Session { mirror, snapshots })
    }

    /// Saves the snapshot (a no-op when no ref moved). A failed save is
    /// logged only: the remote holds the work.
    async fn close(&self, session: Session<S>) {
        let Session { mirror, snapshots } = session;
        if let Some(snapshots) = snapshots
            && let Err(e) = snapshots.save(mirror.remote().url()).await
        {
            tracing::warn!(error = %e, "snapshot not saved; the next invocation catches it up from the remote");
        }
    }

    fn snapshots_for(
        &self,
        repository: &Repository,
        mirror: &Path,
    ) -> Result<Option<Arc<Snapshots<S>>>, HandlerError> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        let mut open = self
            .snapshots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(existing) = open.get(mirror) {
            return Ok(Some(Arc::clone(existing)));
        }
        let key = format!("repos/{}", repository_key(repository));
        let snapshots = Arc::new(Snapshots::new(store.clone(), &key, mirror)?);
        open.insert(mirror.to_path_buf(), Arc::clone(&snapshots));
        Ok(Some(snapshots))
    }
}

/// A Repository object for a git URL a clone names, so it gets a mirror and
/// a snapshot of its own.
fn upstream_repository(invocation: &Invocation, url: &str, secret: &str) -> Repository {
    let namespace = invocation
        .repository
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    serde_json::from_value(serde_json::json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1",
        "kind": "Repository",
        "metadata": {"name": "git-upstream", "namespace": namespace},
        "spec": {"type": "git", "git": {"repo": url, "secretRef": (!secret.is_empty()).then(|| serde_json::json!({"name": secret}))}}
    }))
    .unwrap_or_else(|_| invocation.repository.clone())
}

/// The package at `directory` of `reference` (a tag, a branch or a commit
/// id) in the mirror at `path`, with its lock; a refusal when either does
/// not exist or holds no Kptfile.
fn read_at_ref(
    path: &Path,
    url: &str,
    reference: &str,
    directory: &str,
) -> Result<Result<ExternalUpstream, String>, HandlerError> {
    let repo = GitRepo::open(path)?;
    let reference = if reference.is_empty() {
        "main"
    } else {
        reference
    };
    // as the reference resolves it: the package's own tag or branch
    // (`<directory>/<ref>`, so `v1` of directory `app` is tag `app/v1`)
    // before the plain name, tags before branches
    let mut names = Vec::new();
    if !directory.is_empty() {
        names.push(format!("refs/tags/{directory}/{reference}"));
        names.push(format!("refs/heads/{directory}/{reference}"));
    }
    names.push(format!("refs/tags/{reference}"));
    names.push(format!("refs/heads/{reference}"));
    let mut commit = None;
    for name in names {
        if let Ok(Some(id)) = repo.ref_id(&name) {
            commit = Some(id);
            break;
        }
    }
    if commit.is_none() && reference.len() == 40 {
        commit =
            porch_git::repo::parse_object_id(reference).filter(|id| repo.commit_info(*id).is_ok());
    }
    let Some(commit) = commit else {
        return Ok(Err(format!(
            "{url} has no branch, tag or commit {reference:?}"
        )));
    };
    let files = repo.read_files(commit, directory)?;
    if !files.contains_key("Kptfile") {
        return Ok(Err(format!(
            "{url} has no package at {directory:?} of {reference:?} (no Kptfile)"
        )));
    }
    Ok(Ok(ExternalUpstream {
        files,
        lock: porch_api::common::GitLock {
            repo: url.to_owned(),
            directory: directory.to_owned(),
            ref_: reference.to_owned(),
            commit: commit.to_string(),
        },
    }))
}

/// A repository's mirror during one operation.
#[derive(Debug)]
struct Session<S> {
    mirror: Mirror<AnyRemote>,
    snapshots: Option<Arc<Snapshots<S>>>,
}

/// Whether the Invocation's operation is due for its object.
fn due(invocation: &Invocation) -> bool {
    let Some(pr) = &invocation.package_revision else {
        // sync has no object; the others fail their checks in the handler
        return true;
    };
    match invocation.operation {
        Operation::Delete => pr.metadata.deletion_timestamp.is_some(),
        Operation::Sync | Operation::Variant | Operation::VariantSet => true,
        op => planner::is_due(op, pr, &invocation.repository),
    }
}
