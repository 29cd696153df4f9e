//! What work a PackageRevision needs now (spec §3.1, §4.4, §4.7, §5.1), as a
//! pure function of the object and its Repository. The relay routes by it;
//! every handler asks it again first, so a duplicate or stale Invocation
//! does nothing.

use crate::common::Lifecycle;
use crate::invocation::Operation;
use crate::lifecycle::effective;
use crate::repository::Repository;
use crate::v1alpha2::PackageRevision;
use crate::{PACKAGE_REVISION_FINALIZER, RENDER_REQUEST_ANNOTATION};

/// The condition type of render results on the object.
pub const RENDERED_CONDITION: &str = "Rendered";
/// The condition type of the controller's overall state.
pub const READY_CONDITION: &str = "Ready";

fn condition_status<'a>(pr: &'a PackageRevision, type_: &str) -> Option<&'a str> {
    pr.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.as_str())
}

fn creation_source(pr: &PackageRevision) -> &str {
    pr.status
        .as_ref()
        .map_or("", |s| s.creation_source.as_str())
}

/// Whether the object is owned by the Repository (finalizer and owner
/// reference in place).
pub fn is_adopted(pr: &PackageRevision, repository: &Repository) -> bool {
    let has_finalizer = pr
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == PACKAGE_REVISION_FINALIZER));
    let repository_name = repository.metadata.name.as_deref().unwrap_or("");
    let owned = pr.metadata.owner_references.as_ref().is_some_and(|refs| {
        refs.iter()
            .any(|r| r.kind == "Repository" && r.name == repository_name)
    });
    has_finalizer && owned
}

/// Whether a render is due (§5.1): only for drafts, when the render-request
/// annotation differs from the last one observed, or when a source was
/// applied and the `Rendered` condition is not `True`.
pub fn render_due(pr: &PackageRevision) -> bool {
    if effective(pr.spec.lifecycle) != Lifecycle::Draft {
        return false;
    }
    let requested = pr
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RENDER_REQUEST_ANNOTATION))
        .map_or("", String::as_str);
    let observed = pr
        .status
        .as_ref()
        .map_or("", |s| s.observed_prr_resource_version.as_str());
    let by_annotation = !requested.is_empty() && requested != observed;
    let by_source =
        !creation_source(pr).is_empty() && condition_status(pr, RENDERED_CONDITION) != Some("True");
    by_annotation || by_source
}

/// Whether the source failed at the current generation.
fn source_failed(pr: &PackageRevision) -> bool {
    let Some(status) = pr.status.as_ref() else {
        return false;
    };
    status.observed_generation == pr.metadata.generation
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == READY_CONDITION && c.status == "False" && c.reason == "Failed")
}

/// The reason `Ready` is False when git refused the requested change.
pub const FAILED_REASON: &str = "Failed";

/// The reason `Ready` is False while readiness gates are not met.
pub const GATES_PENDING_REASON: &str = "ReadinessGatesPending";

/// The readiness gates (`spec.readinessGates`) not yet met: no
/// `status.packageConditions` entry of that type with status `True`.
pub fn unmet_readiness_gates(pr: &PackageRevision) -> Vec<String> {
    let conditions = pr
        .status
        .as_ref()
        .map(|s| s.package_conditions.as_slice())
        .unwrap_or_default();
    pr.spec
        .readiness_gates
        .iter()
        .filter(|gate| {
            !conditions.iter().any(|c| {
                c.type_ == gate.condition_type && c.status == crate::common::ConditionStatus::True
            })
        })
        .map(|gate| gate.condition_type.clone())
        .collect()
}

/// Whether the lifecycle must be brought to git: the spec changed since the
/// last status write, or the last attempt did not end `Ready` — except when
/// it waits for readiness gates that are still not met.
pub fn lifecycle_due(pr: &PackageRevision) -> bool {
    let observed = pr.status.as_ref().and_then(|s| s.observed_generation);
    if observed != pr.metadata.generation {
        return true;
    }
    let ready = pr
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY_CONDITION));
    match ready {
        Some(c) if c.status == "True" => false,
        // git refused this generation's transition: not retried until the
        // spec changes
        Some(c) if c.reason == FAILED_REASON && c.observed_generation == pr.metadata.generation => {
            false
        }
        Some(c) if c.reason == GATES_PENDING_REASON => unmet_readiness_gates(pr).is_empty(),
        _ => true,
    }
}

/// The operations due now, in the order they must run. Only the first is
/// invoked; the relay plans again once its Outcome is applied.
pub fn plan(pr: &PackageRevision, repository: &Repository) -> Vec<Operation> {
    if pr.metadata.deletion_timestamp.is_some() {
        return vec![Operation::Delete];
    }
    let mut due = Vec::new();
    if !is_adopted(pr, repository) {
        due.push(Operation::Adopt);
    }
    let source_pending = pr.spec.source.is_some() && creation_source(pr).is_empty();
    if source_pending {
        // A failed source is not retried by itself: Ready=False/Failed stays
        // until the spec changes (a new generation).
        if !source_failed(pr) {
            due.push(Operation::Source);
        }
        return due;
    }
    // A spec change not yet observed may be a rejection, whose draft branch
    // exists only once the lifecycle is applied: git follows the spec
    // before the content is rendered.
    let spec_pending =
        pr.status.as_ref().and_then(|s| s.observed_generation) != pr.metadata.generation;
    let (render, lifecycle) = (render_due(pr), lifecycle_due(pr));
    if lifecycle && spec_pending {
        due.push(Operation::Lifecycle);
    }
    if render {
        due.push(Operation::Render);
    }
    if lifecycle && !spec_pending {
        due.push(Operation::Lifecycle);
    }
    due
}

/// Whether an operation is still due: handlers check this first and answer
/// an empty Outcome otherwise.
pub fn is_due(operation: Operation, pr: &PackageRevision, repository: &Repository) -> bool {
    match operation {
        Operation::Sync | Operation::Variant | Operation::VariantSet => true,
        op => plan(pr, repository).contains(&op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1alpha2::{PackageRevisionSpec, PackageRevisionStatus, PackageSource};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};

    fn repository() -> Repository {
        let mut repo = Repository::new("blueprints", Default::default());
        repo.metadata.namespace = Some("default".into());
        repo
    }

    fn adopted(mut pr: PackageRevision) -> PackageRevision {
        pr.metadata.finalizers = Some(vec![PACKAGE_REVISION_FINALIZER.into()]);
        pr.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "config.porch.kpt.dev/v1alpha1".into(),
            kind: "Repository".into(),
            name: "blueprints".into(),
            uid: "u".into(),
            ..Default::default()
        }]);
        pr
    }

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: String::new(),
            last_transition_time: Time(Default::default()),
            observed_generation: None,
        }
    }

    fn draft() -> PackageRevision {
        let mut pr = PackageRevision::new(
            "blueprints.app.v1",
            PackageRevisionSpec {
                package_name: "app".into(),
                repository: "blueprints".into(),
                workspace_name: "v1".into(),
                source: Some(PackageSource {
                    init: Some(Default::default()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        pr.metadata.generation = Some(1);
        pr
    }

    #[test]
    fn a_new_draft_is_adopted_then_sourced() {
        let pr = draft();
        assert_eq!(
            plan(&pr, &repository()),
            vec![Operation::Adopt, Operation::Source]
        );
        assert_eq!(plan(&adopted(pr), &repository()), vec![Operation::Source]);
    }

    #[test]
    fn after_the_source_a_draft_renders_then_settles() {
        let mut pr = adopted(draft());
        pr.status = Some(PackageRevisionStatus {
            creation_source: "init".into(),
            observed_generation: Some(1),
            conditions: vec![
                condition("Ready", "False"),
                condition("Rendered", "Unknown"),
            ],
            ..Default::default()
        });
        assert_eq!(
            plan(&pr, &repository()),
            vec![Operation::Render, Operation::Lifecycle]
        );
        let status = pr.status.as_mut().expect("status");
        status.conditions = vec![condition("Ready", "True"), condition("Rendered", "True")];
        assert!(plan(&pr, &repository()).is_empty());
        // A render request that was not observed yet.
        pr.metadata.annotations =
            Some([(RENDER_REQUEST_ANNOTATION.to_owned(), "abc".to_owned())].into());
        assert_eq!(plan(&pr, &repository()), vec![Operation::Render]);
        pr.status
            .as_mut()
            .expect("status")
            .observed_prr_resource_version = "abc".into();
        assert!(plan(&pr, &repository()).is_empty());
        // A spec change (new generation) is a lifecycle change to bring to git.
        pr.metadata.generation = Some(2);
        pr.spec.lifecycle = Some(Lifecycle::Proposed);
        assert_eq!(plan(&pr, &repository()), vec![Operation::Lifecycle]);
        // Only drafts render.
        pr.metadata.annotations =
            Some([(RENDER_REQUEST_ANNOTATION.to_owned(), "def".to_owned())].into());
        assert!(!render_due(&pr));
    }

    #[test]
    fn a_rejection_reaches_git_before_the_draft_renders() {
        // Proposed at generation 2, then rejected (generation 3) with a
        // render request: the draft branch exists only after the lifecycle
        // handler moved it back from `proposed/`.
        let mut pr = adopted(draft());
        pr.metadata.generation = Some(3);
        pr.metadata.annotations =
            Some([(RENDER_REQUEST_ANNOTATION.to_owned(), "abc".to_owned())].into());
        pr.status = Some(PackageRevisionStatus {
            creation_source: "init".into(),
            observed_generation: Some(2),
            conditions: vec![condition("Ready", "True"), condition("Rendered", "True")],
            ..Default::default()
        });
        assert_eq!(
            plan(&pr, &repository()),
            vec![Operation::Lifecycle, Operation::Render]
        );
        pr.status.as_mut().expect("status").observed_generation = Some(3);
        assert_eq!(plan(&pr, &repository()), vec![Operation::Render]);
    }

    #[test]
    fn readiness_gates_hold_ready_until_their_conditions_are_true() {
        let mut pr = adopted(draft());
        pr.spec.readiness_gates = vec![crate::common::ReadinessGate {
            condition_type: "Approved".into(),
        }];
        let mut waiting = condition("Ready", "False");
        waiting.reason = GATES_PENDING_REASON.into();
        pr.status = Some(PackageRevisionStatus {
            creation_source: "init".into(),
            observed_generation: Some(1),
            conditions: vec![waiting, condition("Rendered", "True")],
            ..Default::default()
        });
        assert_eq!(unmet_readiness_gates(&pr), vec!["Approved".to_owned()]);
        assert!(plan(&pr, &repository()).is_empty());
        pr.status.as_mut().expect("status").package_conditions =
            vec![crate::common::PackageCondition {
                type_: "Approved".into(),
                status: crate::common::ConditionStatus::True,
                reason: String::new(),
                message: String::new(),
            }];
        assert!(unmet_readiness_gates(&pr).is_empty());
        assert_eq!(plan(&pr, &repository()), vec![Operation::Lifecycle]);
    }

    #[test]
    fn a_failed_source_waits_for_a_new_generation() {
        let mut pr = adopted(draft());
        let mut failed = condition("Ready", "False");
        failed.reason = "Failed".into();
        pr.status = Some(PackageRevisionStatus {
            observed_generation: Some(1),
            conditions: vec![failed],
            ..Default::default()
        });
        assert!(plan(&pr, &repository()).is_empty());
        pr.metadata.generation = Some(2);
        assert_eq!(plan(&pr, &repository()), vec![Operation::Source]);
    }

    #[test]
    fn a_refused_transition_waits_for_a_new_generation() {
        let mut pr = adopted(draft());
        pr.spec.lifecycle = Some(Lifecycle::Published);
        let mut failed = condition("Ready", "False");
        failed.reason = FAILED_REASON.into();
        failed.observed_generation = Some(1);
        pr.status = Some(PackageRevisionStatus {
            creation_source: "init".into(),
            observed_generation: Some(1),
            conditions: vec![failed, condition("Rendered", "True")],
            ..Default::default()
        });
        assert!(plan(&pr, &repository()).is_empty());
        pr.metadata.generation = Some(2);
        assert_eq!(plan(&pr, &repository()), vec![Operation::Lifecycle]);
    }

    #[test]
    fn a_deleted_revision_only_needs_its_cleanup() {
        let mut pr = draft();
        pr.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(plan(&pr, &repository()), vec![Operation::Delete]);
        assert!(is_due(Operation::Delete, &pr, &repository()));
        assert!(!is_due(Operation::Render, &pr, &repository()));
    }
}
