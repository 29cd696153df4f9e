//! Handler errors: retryable (the relay backs off and delivers again) or not
//! (the Invocation itself is wrong; delivering it again cannot help).

use porch_git::mirror::MirrorError;
use porch_git::repo::RepoError;

/// Why a handler gave no Outcome.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The Invocation is malformed: a missing object, the wrong operation.
    #[error("invalid invocation: {0}")]
    Invalid(String),
    /// Reading or writing git failed.
    #[error("git: {0}")]
    Git(#[from] MirrorError),
    #[error("git: {0}")]
    Repo(#[from] RepoError),
    /// The snapshot could not be loaded (the store failed).
    #[error("snapshot: {0}")]
    Snapshot(#[from] porch_git::snapshot::SnapshotError),
    /// The credentials a Repository names could not be resolved (a Secret
    /// created later, or fixed, helps: retried).
    #[error("credentials: {0}")]
    Credentials(String),
    /// A blocking task failed to finish.
    #[error("internal: {0}")]
    Internal(String),
}

impl HandlerError {
    /// Whether delivering the same Invocation again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            HandlerError::Invalid(_)
            | HandlerError::Repo(RepoError::TooLarge { .. } | RepoError::UnsafePath { .. }) => {
                false
            }
            HandlerError::Git(_)
            | HandlerError::Repo(_)
            | HandlerError::Snapshot(_)
            | HandlerError::Credentials(_)
            | HandlerError::Internal(_) => true,
        }
    }
}
