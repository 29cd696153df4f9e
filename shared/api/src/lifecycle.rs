//! The lifecycle state machine (spec §4.3), as pure decisions.
//!
//! The reference accepts any transition in v1alpha2 (spec §9 items 12, 13, 15);
//! here only the v1alpha1 table is allowed, for both versions.

use crate::common::Lifecycle;

/// A lifecycle change and what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The lifecycle stays the same.
    Unchanged,
    /// Draft → Proposed.
    Propose,
    /// Proposed → Draft.
    Reject,
    /// Proposed → Published: needs the approval right.
    Approve,
    /// Published → DeletionProposed.
    ProposeDeletion,
    /// DeletionProposed → Published.
    RestorePublished,
}

/// A lifecycle change that is not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    #[error(
        "a package revision must be created as Draft, not {0}: create it as Draft, then propose and approve it"
    )]
    CreateNotDraft(Lifecycle),
    #[error(
        "cannot change lifecycle from {from} to {to}: allowed are Draft→Proposed, Proposed→Draft, Proposed→Published, Published→DeletionProposed and DeletionProposed→Published"
    )]
    Transition { from: Lifecycle, to: Lifecycle },
    #[error(
        "spec of a {0} package revision cannot change, except spec.lifecycle between Published and DeletionProposed"
    )]
    SpecFrozen(Lifecycle),
    #[error(
        "published PackageRevisions must be proposed for deletion by setting spec.lifecycle to 'DeletionProposed' prior to deletion"
    )]
    DeletePublished,
}

/// The effective lifecycle: an empty one means Draft.
pub fn effective(lifecycle: Option<Lifecycle>) -> Lifecycle {
    lifecycle.unwrap_or(Lifecycle::Draft)
}

/// Checks the lifecycle of a new object: only Draft (or empty).
///
/// # Errors
/// Any other lifecycle.
pub fn check_create(lifecycle: Option<Lifecycle>) -> Result<(), LifecycleError> {
    match effective(lifecycle) {
        Lifecycle::Draft => Ok(()),
        other => Err(LifecycleError::CreateNotDraft(other)),
    }
}

/// Classifies a lifecycle change.
///
/// # Errors
/// Any change outside the table of spec §4.3.
pub fn transition(
    from: Option<Lifecycle>,
    to: Option<Lifecycle>,
) -> Result<Transition, LifecycleError> {
    use Lifecycle::*;
    let (from, to) = (effective(from), effective(to));
    match (from, to) {
        _ if from == to => Ok(Transition::Unchanged),
        (Draft, Proposed) => Ok(Transition::Propose),
        (Proposed, Draft) => Ok(Transition::Reject),
        (Proposed, Published) => Ok(Transition::Approve),
        (Published, DeletionProposed) => Ok(Transition::ProposeDeletion),
        (DeletionProposed, Published) => Ok(Transition::RestorePublished),
        _ => Err(LifecycleError::Transition { from, to }),
    }
}

/// Whether the rest of the spec (everything but the lifecycle) may change in
/// this lifecycle: only while Draft or Proposed.
///
/// # Errors
/// A spec change of a Published or DeletionProposed revision.
pub fn check_spec_change(
    from: Option<Lifecycle>,
    spec_changed: bool,
) -> Result<(), LifecycleError> {
    let from = effective(from);
    if spec_changed && from.is_published() {
        return Err(LifecycleError::SpecFrozen(from));
    }
    Ok(())
}

/// Whether a revision may be deleted: not while Published.
///
/// # Errors
/// The revision is Published.
pub fn check_delete(lifecycle: Option<Lifecycle>) -> Result<(), LifecycleError> {
    if effective(lifecycle) == Lifecycle::Published {
        return Err(LifecycleError::DeletePublished);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Lifecycle::*;

    #[test]
    fn only_the_table_is_allowed() {
        let allowed = [
            (Draft, Proposed, Transition::Propose),
            (Proposed, Draft, Transition::Reject),
            (Proposed, Published, Transition::Approve),
            (Published, DeletionProposed, Transition::ProposeDeletion),
            (DeletionProposed, Published, Transition::RestorePublished),
        ];
        for from in Lifecycle::ALL {
            for to in Lifecycle::ALL {
                let got = transition(Some(from), Some(to));
                let want = if from == to {
                    Some(Transition::Unchanged)
                } else {
                    allowed
                        .iter()
                        .find(|(f, t, _)| *f == from && *t == to)
                        .map(|a| a.2)
                };
                match want {
                    Some(w) => assert_eq!(got, Ok(w), "{from}→{to}"),
                    None => assert_eq!(
                        got,
                        Err(LifecycleError::Transition { from, to }),
                        "{from}→{to}"
                    ),
                }
            }
        }
    }

    #[test]
    fn empty_means_draft() {
        assert_eq!(transition(None, Some(Proposed)), Ok(Transition::Propose));
        assert_eq!(transition(Some(Draft), None), Ok(Transition::Unchanged));
        assert!(transition(None, Some(Published)).is_err());
        check_create(None).expect("empty is Draft");
        check_create(Some(Draft)).expect("Draft");
        for l in [Proposed, Published, DeletionProposed] {
            let err = check_create(Some(l)).expect_err("not draft");
            assert!(
                err.to_string().contains("must be created as Draft"),
                "{err}"
            );
        }
    }

    #[test]
    fn spec_is_frozen_once_published() {
        check_spec_change(Some(Draft), true).expect("draft");
        check_spec_change(Some(Proposed), true).expect("proposed");
        check_spec_change(Some(Published), false).expect("unchanged");
        assert_eq!(
            check_spec_change(Some(Published), true),
            Err(LifecycleError::SpecFrozen(Published))
        );
        assert!(check_spec_change(Some(DeletionProposed), true).is_err());
    }

    #[test]
    fn published_cannot_be_deleted() {
        let err = check_delete(Some(Published)).expect_err("published");
        assert!(err.to_string().contains("DeletionProposed"), "{err}");
        for l in [None, Some(Draft), Some(Proposed), Some(DeletionProposed)] {
            check_delete(l).expect("deletable");
        }
    }
}
