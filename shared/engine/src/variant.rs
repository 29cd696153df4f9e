//! The variant handler (packagevariants spec §2): keeps a PackageVariant's
//! downstream package in step with its upstream, on v1alpha2
//! PackageRevisions.
//!
//! [`reconcile`] decides from the objects alone (no git): the finalizer,
//! validation, the upstream, adoption, the downstream to create (a clone
//! draft, an upgrade draft when the upstream moved, an edit draft when only
//! the mutations changed), stale downstreams deleted or orphaned, and the
//! deletion policies. What needs the package's files (the mutations of
//! §2.6, applied to a draft or compared against a published revision) is
//! left in [`Plan`] for the Runner, which reads and writes git and then
//! [`Plan::finish`]es the Outcome with the variant's status.
//!
//! Where the reference falls short (spec §6), this handler:
//! - honours `spec.upstream.revision`, and without a workspace or revision
//!   follows the upstream's latest published revision (no hard-coded `main`
//!   workspace, no placeholder upstream);
//! - creates downstreams under names derived from the revisions it was
//!   given, and the relay runs one variant at a time, so repeated or
//!   concurrent events make no duplicate drafts (nephio#687);
//! - reports a Draft or Proposed downstream of an older upstream in `Ready`
//!   instead of failing the whole reconcile;
//! - keeps the finalizer until every owned revision is deleted or orphaned
//!   (nephio#642), and never adopts the branch placeholder;
//! - carries changes of its labels and annotations to the revisions it
//!   already owns.

use std::collections::BTreeMap;

use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use porch_api::Lifecycle;
use porch_api::invocation::{
    Apply, Invocation, ObjectPatch, ObjectRef, Operation, Outcome, Subresource,
};
use porch_api::naming::RevisionName;
use porch_api::v1alpha2::PackageRevision;
use porch_api::variant::{
    AdoptionPolicy, DeletionPolicy, DownstreamTarget, PACKAGE_VARIANT_FINALIZER, PackageVariant,
    PackageVariantStatus,
};
use serde_json::{Value, json};

use crate::HandlerError;

/// Field manager of the revisions a variant creates.
pub const VARIANT_MANAGER: &str = "packagevariant-controller";
/// Workspaces of the revisions a variant creates: `packagevariant-<N>`.
pub const WORKSPACE_PREFIX: &str = "packagevariant-";
/// How soon a variant waiting on its revisions' deletion looks again.
const CLEANUP_REQUEUE_SECONDS: u64 = 2;

const STALLED: &str = "Stalled";
const READY: &str = "Ready";

/// What the objects say is due; the file work is the Runner's.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Patches, creates and deletes decided without git.
    pub outcome: Outcome,
    /// Drafts whose files take the variant's mutations now (their source
    /// has run).
    pub mutate: Vec<PackageRevision>,
    /// A published downstream that gets an edit draft if the mutations
    /// would change its files.
    pub edit_if_changed: Option<PackageRevision>,
    /// The variant and its status so far.
    variant: Option<PackageVariant>,
    status: Option<PackageVariantStatus>,
    /// The edit draft of `edit_if_changed`, named now: `finish` adds it
    /// when the files would change.
    edit_draft: Option<(String, Apply)>,
    now: Time,
}

fn condition(type_: &str, status: bool, reason: &str, message: &str, now: &Time) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: None,
        last_transition_time: now.clone(),
    }
}

fn owned_by(pr: &PackageRevision, uid: &str) -> bool {
    pr.metadata
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| r.uid == uid))
}

fn lifecycle(pr: &PackageRevision) -> Lifecycle {
    pr.spec.lifecycle.unwrap_or(Lifecycle::Draft)
}

fn published(pr: &PackageRevision) -> bool {
    matches!(
        lifecycle(pr),
        Lifecycle::Published | Lifecycle::DeletionProposed
    )
}

fn revision(pr: &PackageRevision) -> i64 {
    pr.status.as_ref().and_then(|s| s.revision).unwrap_or(0)
}

fn name(pr: &PackageRevision) -> String {
    pr.metadata.name.clone().unwrap_or_default()
}

fn guarded(pr: &PackageRevision, ops: Vec<PatchOperation>) -> ObjectPatch {
    ObjectPatch::guarded(
        ObjectRef::package_revision(pr),
        Subresource::Main,
        pr.metadata.resource_version.as_deref().unwrap_or(""),
        ops,
    )
}

fn path(p: &str) -> json_patch::jsonptr::PointerBuf {
    p.try_into().unwrap_or_default()
}

fn variant_ref(pv: &PackageVariant) -> ObjectRef {
    ObjectRef {
        api_version: "config.porch.kpt.dev/v1alpha1".into(),
        kind: "PackageVariant".into(),
        namespace: pv.metadata.namespace.clone().unwrap_or_default(),
        name: pv.metadata.name.clone().unwrap_or_default(),
        uid: pv.metadata.uid.clone().unwrap_or_default(),
    }
}

/// The revision number a lock's ref names (`<path>/v<N>`), or -1.
fn revision_from_ref(reference: &str) -> i64 {
    let last = reference.rsplit('/').next().unwrap_or("");
    last.strip_prefix('v').unwrap_or(last).parse().unwrap_or(-1)
}

/// Removes the variant's owner reference (and, for `DeletionProposed`,
/// nothing else: an approver publishes the deletion).
fn orphan_ops(pr: &PackageRevision, uid: &str) -> Vec<PatchOperation> {
    let refs = pr.metadata.owner_references.clone().unwrap_or_default();
    // from the back, so earlier indices stay valid
    refs.iter()
        .enumerate()
        .rev()
        .filter(|(_, r)| r.uid == uid)
        .map(|(i, _)| {
            PatchOperation::Remove(RemoveOperation {
                path: path(&format!("/metadata/ownerReferences/{i}")),
            })
        })
        .collect()
}

/// Deletes or orphans a revision the variant no longer wants (§2.1).
fn delete_or_orphan(pr: &PackageRevision, pv: &PackageVariant, out: &mut Outcome) {
    let uid = pv.metadata.uid.clone().unwrap_or_default();
    let policy = pv
        .spec
        .deletion_policy
        .as_ref()
        .and_then(|p| p.known())
        .unwrap_or_default();
    if pr.metadata.deletion_timestamp.is_some() {
        return;
    }
    match (policy, lifecycle(pr)) {
        (DeletionPolicy::Orphan, _) | (DeletionPolicy::Delete, Lifecycle::DeletionProposed) => {
            out.patches.push(guarded(pr, orphan_ops(pr, &uid)));
        }
        (DeletionPolicy::Delete, Lifecycle::Published) => {
            // proposed for deletion and orphaned, so the variant's own
            // deletion cannot cascade to it: an approver decides
            let mut ops = vec![PatchOperation::Replace(ReplaceOperation {
                path: path("/spec/lifecycle"),
                value: json!("DeletionProposed"),
            })];
            ops.extend(orphan_ops(pr, &uid));
            out.patches.push(guarded(pr, ops));
        }
        (DeletionPolicy::Delete, _) => out.delete.push(ObjectRef::package_revision(pr)),
    }
}

/// The upstream revision the variant follows: its workspace, else its
/// revision, else the latest published revision of the package.
fn resolve_upstream<'a>(
    pv: &PackageVariant,
    related: &'a [PackageRevision],
) -> Result<&'a PackageRevision, String> {
    let upstream = pv.spec.upstream.clone().unwrap_or_default();
    let candidates = related.iter().filter(|p| {
        p.spec.repository == upstream.repo
            && p.spec.package_name == upstream.package
            && p.metadata.deletion_timestamp.is_none()
    });
    let found = if !upstream.workspace_name.is_empty() {
        candidates
            .filter(|p| p.spec.workspace_name == upstream.workspace_name)
            // published, and not the branch placeholder (-1): a clone of
            // a moving branch is refused by the source handler
            .find(|p| published(p) && revision(p) > 0)
    } else if let Some(wanted) = upstream.revision.filter(|r| *r > 0) {
        candidates
            .filter(|p| published(p))
            .find(|p| revision(p) == wanted)
    } else {
        candidates
            .filter(|p| lifecycle(p) == Lifecycle::Published && revision(p) > 0)
            .max_by_key(|p| revision(p))
    };
    found.ok_or_else(|| {
        let mut what = format!("{}/{}", upstream.repo, upstream.package);
        if !upstream.workspace_name.is_empty() {
            what.push_str(&format!(" workspace {}", upstream.workspace_name));
        } else if let Some(r) = upstream.revision.filter(|r| *r > 0) {
            what.push_str(&format!(" revision {r}"));
        }
        format!("could not find upstream package revision {what} (published)")
    })
}

/// `packagevariant-<N>`, N one more than any such workspace of the package.
fn new_workspace(related: &[PackageRevision], repo: &str, package: &str) -> String {
    let highest = related
        .iter()
        .filter(|p| p.spec.repository == repo && p.spec.package_name == package)
        .filter_map(|p| p.spec.workspace_name.strip_prefix(WORKSPACE_PREFIX))
        .map(|n| n.parse::<u64>().unwrap_or(0))
        .max()
        .unwrap_or(0);
    format!("{WORKSPACE_PREFIX}{}", highest + 1)
}

/// Whether a downstream is cloned from (or upgraded to) `upstream`.
fn up_to_date(downstream: &PackageRevision, upstream: &PackageRevision) -> bool {
    let reference = downstream
        .status
        .as_ref()
        .and_then(|s| s.upstream_lock.as_ref())
        .and_then(|l| l.git.as_ref())
        .map_or("", |g| g.ref_.as_str());
    if reference.is_empty() {
        return true;
    }
    if reference.starts_with("drafts") {
        return false;
    }
    revision_from_ref(reference) == revision(upstream)
}

/// A new downstream revision of the variant, as a server-side apply: the
/// same Invocation gives the same name, so a redelivery changes nothing.
fn create(pv: &PackageVariant, related: &[PackageRevision], source: Value) -> (String, Apply) {
    let downstream = pv.spec.downstream.clone().unwrap_or_default();
    let workspace = new_workspace(related, &downstream.repo, &downstream.package);
    let name = RevisionName::compose(&downstream.repo, &downstream.package, &workspace);
    let mut metadata = json!({
        "name": name,
        "namespace": pv.metadata.namespace,
        "ownerReferences": [{
            "apiVersion": "config.porch.kpt.dev/v1alpha1",
            "kind": "PackageVariant",
            "name": pv.metadata.name,
            "uid": pv.metadata.uid,
            "controller": true,
        }],
    });
    if !pv.spec.labels.is_empty() {
        metadata["labels"] = json!(pv.spec.labels);
    }
    if !pv.spec.annotations.is_empty() {
        metadata["annotations"] = json!(pv.spec.annotations);
    }
    let apply = Apply {
        field_manager: VARIANT_MANAGER.into(),
        force: false,
        subresource: Subresource::Main,
        object: json!({
            "apiVersion": "porch.kpt.dev/v1alpha2",
            "kind": "PackageRevision",
            "metadata": metadata,
            "spec": {
                "packageName": downstream.package,
                "repository": downstream.repo,
                "workspaceName": workspace,
                "lifecycle": "Draft",
                "source": source,
            },
        }),
    };
    (name, apply)
}

/// Takes a matching revision under the variant: its owner reference
/// (controller unless another controller owns it) and the variant's
/// labels and annotations.
fn adopt(pr: &PackageRevision, pv: &PackageVariant) -> ObjectPatch {
    let refs = pr.metadata.owner_references.clone().unwrap_or_default();
    let controlled = refs.iter().any(|r| r.controller == Some(true));
    let mut reference = json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1",
        "kind": "PackageVariant",
        "name": pv.metadata.name,
        "uid": pv.metadata.uid,
    });
    if !controlled {
        reference["controller"] = json!(true);
    }
    let mut ops = Vec::new();
    if refs.is_empty() {
        ops.push(PatchOperation::Add(AddOperation {
            path: path("/metadata/ownerReferences"),
            value: json!([reference]),
        }));
    } else {
        ops.push(PatchOperation::Add(AddOperation {
            path: path("/metadata/ownerReferences/-"),
            value: reference,
        }));
    }
    for (field, wanted) in [
        ("labels", &pv.spec.labels),
        ("annotations", &pv.spec.annotations),
    ] {
        if wanted.is_empty() {
            continue;
        }
        let mut merged: BTreeMap<String, String> = match field {
            "labels" => pr.metadata.labels.clone().unwrap_or_default(),
            _ => pr.metadata.annotations.clone().unwrap_or_default(),
        };
        merged.extend(wanted.iter().map(|(k, v)| (k.clone(), v.clone())));
        ops.push(PatchOperation::Add(AddOperation {
            path: path(&format!("/metadata/{field}")),
            value: json!(merged),
        }));
    }
    guarded(pr, ops)
}

/// The variant's labels and annotations onto a revision it already owns,
/// when they changed (the reference sets them only on create and adopt).
fn propagate(pr: &PackageRevision, pv: &PackageVariant) -> Option<ObjectPatch> {
    let mut ops = Vec::new();
    for (field, wanted, current) in [
        ("labels", &pv.spec.labels, pr.metadata.labels.clone()),
        (
            "annotations",
            &pv.spec.annotations,
            pr.metadata.annotations.clone(),
        ),
    ] {
        let current = current.unwrap_or_default();
        let mut merged = current.clone();
        merged.extend(wanted.iter().map(|(k, v)| (k.clone(), v.clone())));
        if merged != current {
            ops.push(PatchOperation::Add(AddOperation {
                path: path(&format!("/metadata/{field}")),
                value: json!(merged),
            }));
        }
    }
    (!ops.is_empty()).then(|| guarded(pr, ops))
}

/// Decides what a variant needs from the objects alone.
///
/// # Errors
/// An Invocation that is not a variant's (not retryable).
pub fn reconcile(invocation: &Invocation, now: &Time) -> Result<Plan, HandlerError> {
    if invocation.operation != Operation::Variant {
        return Err(HandlerError::Invalid(format!(
            "the variant handler got a {} invocation",
            invocation.operation.as_str()
        )));
    }
    let pv = invocation.package_variant.clone().ok_or_else(|| {
        HandlerError::Invalid("a variant Invocation needs its PackageVariant".into())
    })?;
    let uid = pv
        .metadata
        .uid
        .clone()
        .ok_or_else(|| HandlerError::Invalid("the PackageVariant has no uid".into()))?;
    let mut plan = Plan {
        outcome: Outcome::default(),
        mutate: Vec::new(),
        edit_if_changed: None,
        variant: Some(pv.clone()),
        status: None,
        edit_draft: None,
        now: now.clone(),
    };
    let related = &invocation.related;
    let owned: Vec<&PackageRevision> = related.iter().filter(|p| owned_by(p, &uid)).collect();
    let finalizers = pv.metadata.finalizers.clone().unwrap_or_default();
    let version = pv.metadata.resource_version.clone().unwrap_or_default();

    if pv.metadata.deletion_timestamp.is_some() {
        // every owned revision deleted or orphaned first; the finalizer
        // goes only once none is left (nephio#642)
        for pr in &owned {
            delete_or_orphan(pr, &pv, &mut plan.outcome);
        }
        let waiting = owned
            .iter()
            .any(|p| p.metadata.deletion_timestamp.is_some());
        if owned.is_empty() {
            if let Some(index) = finalizers
                .iter()
                .position(|f| f == PACKAGE_VARIANT_FINALIZER)
            {
                plan.outcome.patches.push(ObjectPatch::guarded(
                    variant_ref(&pv),
                    Subresource::Main,
                    &version,
                    vec![PatchOperation::Remove(RemoveOperation {
                        path: path(&format!("/metadata/finalizers/{index}")),
                    })],
                ));
            }
        } else if waiting || !plan.outcome.is_empty() {
            plan.outcome.requeue_after_seconds = Some(CLEANUP_REQUEUE_SECONDS);
        }
        plan.variant = None;
        return Ok(plan);
    }

    if !finalizers.iter().any(|f| f == PACKAGE_VARIANT_FINALIZER) {
        let op = if pv.metadata.finalizers.is_none() {
            PatchOperation::Add(AddOperation {
                path: path("/metadata/finalizers"),
                value: json!([PACKAGE_VARIANT_FINALIZER]),
            })
        } else {
            PatchOperation::Add(AddOperation {
                path: path("/metadata/finalizers/-"),
                value: json!(PACKAGE_VARIANT_FINALIZER),
            })
        };
        plan.outcome.patches.push(ObjectPatch::guarded(
            variant_ref(&pv),
            Subresource::Main,
            &version,
            vec![op],
        ));
    }

    let mut status = PackageVariantStatus {
        conditions: Vec::new(),
        downstream_targets: pv
            .status
            .as_ref()
            .map(|s| s.downstream_targets.clone())
            .unwrap_or_default(),
    };
    if let Err(errors) = pv.spec.validate() {
        status.conditions = vec![
            condition(STALLED, true, "ValidationError", &errors.to_string(), now),
            condition(READY, false, "Error", "invalid packagevariant object", now),
        ];
        plan.status = Some(status);
        return Ok(plan);
    }
    let downstream = pv.spec.downstream.clone().unwrap_or_default();
    if invocation.repository.metadata.name.as_deref() != Some(downstream.repo.as_str()) {
        return Err(HandlerError::Invalid(format!(
            "the Invocation's repository is {:?}, the variant's downstream repository {:?}",
            invocation.repository.metadata.name.as_deref().unwrap_or(""),
            downstream.repo
        )));
    }
    if invocation.repository.spec.git.is_none() {
        // the relay found no downstream Repository
        status.conditions = vec![
            condition(STALLED, false, "Valid", "all validation checks passed", now),
            condition(
                READY,
                false,
                "Error",
                &format!("repository {:?} could not be loaded", downstream.repo),
                now,
            ),
        ];
        plan.status = Some(status);
        return Ok(plan);
    }
    let upstream = match resolve_upstream(&pv, related) {
        Ok(upstream) => upstream,
        Err(message) => {
            status.conditions = vec![
                condition(STALLED, true, "ValidationError", &message, now),
                condition(READY, false, "Error", &message, now),
            ];
            plan.status = Some(status);
            return Ok(plan);
        }
    };
    let stalled = condition(STALLED, false, "Valid", "all validation checks passed", now);

    // §2.4: the downstreams, adoption, and owned revisions that are no
    // longer the target
    let adopt_existing = pv
        .spec
        .adoption_policy
        .as_ref()
        .and_then(|p| p.known())
        .unwrap_or_default()
        == AdoptionPolicy::AdoptExisting;
    let mut drafts: Vec<&PackageRevision> = Vec::new();
    let mut latest: Option<&PackageRevision> = None;
    for pr in related {
        let is_owned = owned_by(pr, &uid);
        let matches =
            pr.spec.repository == downstream.repo && pr.spec.package_name == downstream.package;
        if !(is_owned || (adopt_existing && matches)) {
            continue;
        }
        if is_owned && !matches {
            delete_or_orphan(pr, &pv, &mut plan.outcome);
            continue;
        }
        if pr.metadata.deletion_timestamp.is_some() || revision(pr) < 0 {
            // going, or the branch placeholder: never a target
            continue;
        }
        if !is_owned {
            plan.outcome.patches.push(adopt(pr, &pv));
        } else if let Some(patch) = propagate(pr, &pv) {
            plan.outcome.patches.push(patch);
        }
        if published(pr) {
            if latest.is_none_or(|l| revision(pr) > revision(l)) {
                latest = Some(pr);
            }
        } else {
            drafts.push(pr);
        }
    }

    let mut problems = Vec::new();
    let mut targets = Vec::new();
    if !drafts.is_empty() {
        for draft in &drafts {
            targets.push(name(draft));
            if !up_to_date(draft, upstream) {
                problems.push(format!(
                    "downstream {:?} is {} on an older upstream than {:?}; publish or delete it to upgrade",
                    name(draft),
                    lifecycle(draft).as_str(),
                    name(upstream)
                ));
            }
            let sourced = draft
                .status
                .as_ref()
                .is_some_and(|s| !s.creation_source.is_empty());
            if lifecycle(draft) == Lifecycle::Draft && sourced {
                plan.mutate.push((*draft).clone());
            }
        }
    } else if let Some(current) = latest {
        if lifecycle(current) == Lifecycle::DeletionProposed {
            // the target again: no longer to be deleted
            plan.outcome.patches.push(guarded(
                current,
                vec![PatchOperation::Replace(ReplaceOperation {
                    path: path("/spec/lifecycle"),
                    value: json!("Published"),
                })],
            ));
        }
        if up_to_date(current, upstream) {
            targets.push(name(current));
            plan.edit_if_changed = Some(current.clone());
            plan.edit_draft = Some(create(
                &pv,
                related,
                json!({"copyFrom": {"name": name(current)}}),
            ));
        } else {
            let lock = current
                .status
                .as_ref()
                .and_then(|s| s.upstream_lock.as_ref())
                .and_then(|l| l.git.as_ref())
                .map_or("", |g| g.ref_.as_str());
            let old_revision = revision_from_ref(lock);
            let old = related.iter().find(|p| {
                p.spec.repository == upstream.spec.repository
                    && p.spec.package_name == upstream.spec.package_name
                    && published(p)
                    && revision(p) == old_revision
            });
            match old {
                Some(old) => {
                    let (created, apply) = create(
                        &pv,
                        related,
                        json!({"upgrade": {
                            "oldUpstream": {"name": name(old)},
                            "newUpstream": {"name": name(upstream)},
                            "currentPackage": {"name": name(current)},
                            "strategy": "resource-merge",
                        }}),
                    );
                    plan.outcome.apply.push(apply);
                    targets.push(created);
                }
                None => {
                    targets.push(name(current));
                    problems.push(format!(
                        "could not find upstream package revision {}/{} revision {old_revision}, the one {:?} was made from",
                        upstream.spec.repository,
                        upstream.spec.package_name,
                        name(current)
                    ));
                }
            }
        }
    } else {
        let (created, apply) = create(
            &pv,
            related,
            json!({"cloneFrom": {"upstreamRef": {"name": name(upstream)}}}),
        );
        plan.outcome.apply.push(apply);
        targets.push(created);
    }

    // each target's render as the revision reports it: the error of a
    // failed render (the reference kept the PackageRevisionResources
    // update's answer, which this project does not make)
    status.downstream_targets = targets
        .into_iter()
        .map(|name| {
            let failed = related
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
                .and_then(|p| p.status.as_ref())
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Rendered"))
                .filter(|c| c.status == "False")
                .map(|c| porch_api::v1alpha1::RenderStatus {
                    result: None,
                    error: c.message.clone(),
                });
            DownstreamTarget {
                name,
                render_status: failed,
            }
        })
        .collect();
    let ready = if problems.is_empty() {
        condition(
            READY,
            true,
            "NoErrors",
            "successfully ensured downstream package variant",
            now,
        )
    } else {
        condition(READY, false, "Error", &problems.join("; "), now)
    };
    status.conditions = vec![stalled, ready];
    plan.status = Some(status);
    Ok(plan)
}

impl Plan {
    /// The Outcome, with an edit draft when the published downstream's
    /// files would change (`edit_needed`), `Ready` turned to an error when
    /// the file work failed, and the variant's status when it changed.
    pub fn finish(mut self, edit_needed: bool, file_error: Option<String>) -> Outcome {
        let (Some(pv), Some(mut status)) = (self.variant.take(), self.status.take()) else {
            return self.outcome;
        };
        if edit_needed
            && let (Some(current), Some((created, apply))) =
                (&self.edit_if_changed, self.edit_draft.take())
        {
            self.outcome.apply.push(apply);
            for target in &mut status.downstream_targets {
                if target.name == name(current) {
                    *target = DownstreamTarget {
                        name: created.clone(),
                        render_status: None,
                    };
                }
            }
        }
        if let Some(message) = file_error
            && let Some(ready) = status.conditions.iter_mut().find(|c| c.type_ == READY)
        {
            *ready = condition(READY, false, "Error", &message, &self.now);
        }
        // conditions that say what they said keep their transition time,
        // and a status that says nothing new is not written
        let known = pv.status.clone().unwrap_or_default();
        let same = crate::status::settle_conditions(&known.conditions, &mut status.conditions)
            && known.downstream_targets == status.downstream_targets;
        if !same {
            self.outcome.patches.push(ObjectPatch::guarded(
                variant_ref(&pv),
                Subresource::Status,
                pv.metadata.resource_version.as_deref().unwrap_or(""),
                vec![PatchOperation::Add(AddOperation {
                    path: path("/status"),
                    value: serde_json::to_value(&status).unwrap_or_default(),
                })],
            ));
        }
        self.outcome
    }

    /// The variant this plan is for, while it lives.
    pub fn variant(&self) -> Option<&PackageVariant> {
        self.variant.as_ref()
    }
}

/// What the file work of a variant did.
#[derive(Debug, Default)]
pub struct Mutated {
    /// Render requests for the drafts whose files changed.
    pub render_requests: Vec<ObjectPatch>,
    /// The published downstream's files would change: an edit draft is due.
    pub edit_needed: bool,
}

/// `<namespace>/<name>`, as the reference names a revision's resources in
/// its messages.
fn display(pr: &PackageRevision) -> String {
    format!(
        "{}/{}",
        pr.metadata.namespace.as_deref().unwrap_or(""),
        name(pr)
    )
}

/// The identity the variant's commits carry.
fn committer(pv: &PackageVariant) -> String {
    format!(
        "packagevariant/{}",
        pv.metadata.name.as_deref().unwrap_or("")
    )
}

/// Applies the variant's mutations (package context, pipeline, injection:
/// spec §2.6) to its drafts, each a commit when its files change, and
/// checks whether they would change its published downstream.
///
/// # Errors
/// A package the mutations cannot apply to (not retryable: `Ready` says
/// why), or git failures (retryable).
pub async fn mutate<R: porch_git::remote::Remote + 'static>(
    invocation: &Invocation,
    plan: &Plan,
    mirror: &porch_git::mirror::Mirror<R>,
    now: &Time,
) -> Result<Mutated, HandlerError> {
    let Some(pv) = plan.variant() else {
        return Ok(Mutated::default());
    };
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    mirror.fetch().await?;
    let mut done = Mutated::default();
    for draft in &plan.mutate {
        let files = crate::content::read(&invocation.repository, draft, mirror).await?;
        let mutated = porch_krm::variant::mutate_package(
            &pv_name,
            &pv.spec,
            &display(draft),
            &files,
            &invocation.cluster_objects,
        )
        .map_err(|e| HandlerError::Invalid(e.to_string()))?;
        if !mutated.changed {
            continue;
        }
        let written = crate::content::write(
            &invocation.repository,
            draft,
            mirror,
            mutated.files,
            &committer(pv),
            now,
        )
        .await?;
        if written {
            // the same Invocation asks for the same render
            let request = format!("{pv_name}-{}", invocation.request_id);
            let mut annotations = draft.metadata.annotations.clone().unwrap_or_default();
            annotations.insert(porch_api::RENDER_REQUEST_ANNOTATION.to_owned(), request);
            done.render_requests.push(guarded(
                draft,
                vec![PatchOperation::Add(AddOperation {
                    path: path("/metadata/annotations"),
                    value: json!(annotations),
                })],
            ));
        }
    }
    if let Some(current) = &plan.edit_if_changed {
        let files = crate::content::read(&invocation.repository, current, mirror).await?;
        let mutated = porch_krm::variant::mutate_package(
            &pv_name,
            &pv.spec,
            &display(current),
            &files,
            &invocation.cluster_objects,
        )
        .map_err(|e| HandlerError::Invalid(e.to_string()))?;
        done.edit_needed = mutated.changed;
    }
    Ok(done)
}
