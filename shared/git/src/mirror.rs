//! Operations against a remote through a local mirror: fetch, run the
//! operation on the mirror, push the refs it changed as compare-and-swap
//! updates. A lost race (a ref moved on the remote) refetches and runs the
//! operation again on the new state; a transient failure waits and does the
//! same. Operations recognise their own earlier commits, so a push that
//! landed although its answer was lost is not done twice.

use crate::listing::RefMap;
use crate::listing::is_branch_or_tag as mirrored;
use crate::operations::OperationError;
use crate::remote::{Remote, RemoteError};
use crate::repo::{GitRepo, RefUpdate, RepoError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often and how long to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts after transient errors (the reference uses 3).
    pub transient_attempts: u32,
    /// Attempts after lost compare-and-swap races; each one means another
    /// writer made progress.
    pub conflict_attempts: u32,
    /// First pause; doubled after each attempt, with jitter.
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            transient_attempts: 3,
            conflict_attempts: 50,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// The pause before attempt `attempt` (1-based): exponential with full
    /// jitter, so concurrent losers spread out.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
            .min(self.max_delay);
        let nanos = u64::try_from(exp.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(jitter(nanos))
    }
}

/// A number in `[n/2, n]` from the clock and a per-process counter.
fn jitter(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let half = n / 2;
    half + hasher.finish() % (n - half + 1).max(1)
}

/// Why an operation through a mirror failed.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(transparent)]
    Operation(#[from] OperationError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("gave up after {attempts} attempts: {last}")]
    Exhausted { attempts: u32, last: RemoteError },
    #[error("a blocking git task failed: {0}")]
    Task(String),
}

/// What an operation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied<T> {
    pub value: T,
    /// The ref updates pushed (empty when the remote already had them).
    pub updates: Vec<RefUpdate>,
    /// Attempts made, 1 when the first one succeeded.
    pub attempts: u32,
}

/// The branch and tag changes between two ref listings, as compare-and-swap
/// updates from `before` to `after`.
pub fn ref_changes(before: &RefMap, after: &RefMap) -> Vec<RefUpdate> {
    let (mut updates, mut deletions): (Vec<RefUpdate>, Vec<RefUpdate>) =
        crate::listing::differences(before, after)
            .into_iter()
            .filter(|(name, _, _)| mirrored(name))
            .map(|(name, expected, new)| RefUpdate {
                name: name.to_owned(),
                expected,
                new,
            })
            .partition(|u| u.new.is_some());
    // updates and creations first, then deletions, each in name order
    updates.append(&mut deletions);
    updates
}

/// A bare repository in local storage kept as a mirror of `remote`.
#[derive(Debug)]
pub struct Mirror<R> {
    path: PathBuf,
    remote: R,
    retry: RetryPolicy,
}

impl<R: Remote> Mirror<R> {
    /// A mirror at `path` (created when missing) of `remote`.
    ///
    /// # Errors
    /// The directory cannot hold a repository.
    pub fn new(path: impl Into<PathBuf>, remote: R, retry: RetryPolicy) -> Result<Self, RepoError> {
        let path = path.into();
        GitRepo::init_bare(&path)?;
        Ok(Self {
            path,
            remote,
            retry,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn remote(&self) -> &R {
        &self.remote
    }

    /// Brings the mirror up to date with the remote.
    ///
    /// # Errors
    /// The remote fails (after the transient retries).
    pub async fn fetch(&self) -> Result<crate::remote::RemoteRefs, MirrorError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.remote.fetch(&self.path).await {
                Ok(refs) => return Ok(refs),
                Err(e) if e.is_transient() && attempt <= self.retry.transient_attempts => {
                    tracing::warn!(remote = self.remote.url(), attempt, error = %e, "fetch failed, retrying");
                    tokio::time::sleep(self.retry.delay(attempt)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Fetches, runs `op` on the mirror, and pushes the refs it changed;
    /// on a lost race or a transient failure, does all three again.
    ///
    /// # Errors
    /// The operation fails, the remote fails for good, or the retries run out.
    pub async fn apply<T, F>(&self, op: F) -> Result<Applied<T>, MirrorError>
    where
        T: Send + 'static,
        F: Fn(&GitRepo) -> Result<T, OperationError> + Send + Sync + 'static,
    {
        self.run(op, true).await
    }

    /// Like [`Mirror::apply`], but the first attempt trusts the mirror (a
    /// warm one, or one just loaded from the snapshot) and pushes without
    /// fetching; a stale mirror shows as a lost race, which fetches and
    /// redoes. For operations whose every read is guarded by the
    /// compare-and-swap of a ref they write: publish (the branch and the new
    /// tag), propose and reject (both branches), deletions (every ref
    /// removed), draft updates (the draft branch). Create-draft also checks
    /// the proposed branch, which it does not write; that check is a second
    /// line only, since the workspace is part of the PackageRevision's name
    /// and the API server keeps names unique.
    ///
    /// # Errors
    /// As [`Mirror::apply`].
    pub async fn apply_optimistic<T, F>(&self, op: F) -> Result<Applied<T>, MirrorError>
    where
        T: Send + 'static,
        F: Fn(&GitRepo) -> Result<T, OperationError> + Send + Sync + 'static,
    {
        self.run(op, false).await
    }

    async fn run<T, F>(&self, op: F, fetch_first: bool) -> Result<Applied<T>, MirrorError>
    where
        T: Send + 'static,
        F: Fn(&GitRepo) -> Result<T, OperationError> + Send + Sync + 'static,
    {
        let op = Arc::new(op);
        let (mut transient, mut conflicts, mut attempts) = (0u32, 0u32, 0u32);
        loop {
            attempts += 1;
            // after any failed attempt the mirror may hold refs the remote
            // does not: always start again from the remote's state
            if fetch_first || attempts > 1 {
                self.fetch().await?;
            }
            let (path, op) = (self.path.clone(), Arc::clone(&op));
            let local = tokio::task::spawn_blocking(move || {
                let repo = GitRepo::open(&path)?;
                let value = op(&repo)?;
                // what the operation changed, from its own ref updates (all
                // compare-and-swaps on this handle): no listing of every ref
                let updates: Vec<RefUpdate> = repo
                    .take_ref_changes()
                    .into_iter()
                    .filter(|u| mirrored(&u.name))
                    .collect();
                Ok::<_, OperationError>((value, updates))
            })
            .await
            .map_err(|e| MirrorError::Task(e.to_string()))?;
            let (value, updates) = match local {
                Ok(done) => done,
                // another local writer moved a ref of the mirror: start over
                Err(OperationError::Repo(RepoError::Conflict { .. }))
                    if conflicts < self.retry.conflict_attempts =>
                {
                    conflicts += 1;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if updates.is_empty() {
                return Ok(Applied {
                    value,
                    updates,
                    attempts,
                });
            }
            match self.remote.push(&self.path, &updates).await {
                Ok(()) => {
                    return Ok(Applied {
                        value,
                        updates,
                        attempts,
                    });
                }
                Err(e) if e.is_conflict() => {
                    conflicts += 1;
                    if conflicts > self.retry.conflict_attempts {
                        return Err(MirrorError::Exhausted { attempts, last: e });
                    }
                    tracing::debug!(remote = self.remote.url(), attempt = attempts, error = %e, "push lost a race, redoing the operation");
                    tokio::time::sleep(self.retry.delay(1).min(Duration::from_millis(50))).await;
                }
                Err(e) if e.is_transient() => {
                    transient += 1;
                    if transient > self.retry.transient_attempts {
                        return Err(MirrorError::Exhausted { attempts, last: e });
                    }
                    tracing::warn!(remote = self.remote.url(), attempt = attempts, error = %e, "push failed, retrying");
                    tokio::time::sleep(self.retry.delay(transient)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}
