//! A Repository's git remote and the handler's mirror of it: local bare
//! repositories (`file://` URLs and absolute paths, the embedded default)
//! through direct access, everything else over smart HTTP(S) or `git://`.

use std::path::{Path, PathBuf};

use porch_api::repository::Repository;
use porch_git::mirror::{Mirror, RetryPolicy};
use porch_git::remote::{LocalRemote, Remote, RemoteError, RemoteOptions, RemoteRefs, SmartRemote};
use porch_git::repo::RefUpdate;

use porch_api::invocation::Invocation;
use porch_git::layout::RepoLayout;

use crate::HandlerError;

/// One of the remotes a Repository can name.
#[derive(Debug)]
pub enum AnyRemote {
    Local(LocalRemote),
    Smart(Box<SmartRemote>),
}

impl Remote for AnyRemote {
    fn url(&self) -> &str {
        match self {
            AnyRemote::Local(r) => r.url(),
            AnyRemote::Smart(r) => r.url(),
        }
    }

    async fn fetch(&self, mirror: &Path) -> Result<RemoteRefs, RemoteError> {
        match self {
            AnyRemote::Local(r) => r.fetch(mirror).await,
            AnyRemote::Smart(r) => r.fetch(mirror).await,
        }
    }

    async fn push(&self, mirror: &Path, updates: &[RefUpdate]) -> Result<(), RemoteError> {
        match self {
            AnyRemote::Local(r) => r.push(mirror, updates).await,
            AnyRemote::Smart(r) => r.push(mirror, updates).await,
        }
    }
}

/// The remote of a Repository's `spec.git.repo`.
///
/// # Errors
/// No git spec, or a URL no remote can serve (SSH, relative paths,
/// unknown schemes): not retryable.
pub fn remote_for(
    repository: &Repository,
    options: RemoteOptions,
) -> Result<AnyRemote, HandlerError> {
    let url = repository
        .spec
        .git
        .as_ref()
        .map(|g| g.repo.as_str())
        .ok_or_else(|| HandlerError::Invalid("only git repositories are supported".into()))?;
    if let Some(path) = url.strip_prefix("file://") {
        return Ok(AnyRemote::Local(LocalRemote::new(path)));
    }
    if url.starts_with('/') {
        return Ok(AnyRemote::Local(LocalRemote::new(url)));
    }
    SmartRemote::new(url, options)
        .map(|r| AnyRemote::Smart(Box::new(r)))
        .map_err(|e| HandlerError::Invalid(e.to_string()))
}

/// A Repository's place in caches and object stores:
/// `<namespace>/<name>-<hash of the URL>`, so a changed URL starts afresh.
/// The hash (64-bit FNV-1a) is stable across builds and machines: snapshot
/// keys outlive the process that wrote them.
pub fn repository_key(repository: &Repository) -> String {
    let url = repository.spec.git.as_ref().map_or("", |g| g.repo.as_str());
    let hash = url.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let namespace = repository
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default");
    let name = repository.metadata.name.as_deref().unwrap_or("repository");
    format!("{namespace}/{name}-{hash:016x}")
}

/// Where a handler keeps its mirror of a Repository.
pub fn mirror_dir(repository: &Repository, cache_root: &Path) -> PathBuf {
    cache_root.join(repository_key(repository))
}

/// The mirror of a Repository under `cache_root`.
///
/// # Errors
/// As [`remote_for`]; an unusable cache directory (retryable).
pub fn mirror_for(
    repository: &Repository,
    cache_root: &Path,
    options: RemoteOptions,
    retry: RetryPolicy,
) -> Result<Mirror<AnyRemote>, HandlerError> {
    let remote = remote_for(repository, options)?;
    let dir = mirror_dir(repository, cache_root);
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| {
            HandlerError::Internal(format!("failed to create {}: {e}", parent.display()))
        })?;
    }
    Ok(Mirror::new(dir, remote, retry)?)
}

/// The repository layout of an Invocation's Repository.
pub fn layout(invocation: &Invocation) -> RepoLayout {
    layout_of(&invocation.repository)
}

/// The repository layout of a Repository.
pub fn layout_of(repository: &Repository) -> RepoLayout {
    let git = repository.spec.git.as_ref();
    RepoLayout::new(
        git.map_or("", |g| g.directory.as_str()),
        git.map(|g| g.branch.as_str())
            .filter(|b| !b.is_empty())
            .unwrap_or("main"),
    )
}
