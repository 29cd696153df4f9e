//! The variant handler's decisions (packagevariants spec §2, §5 items
//! 7–19 on v1alpha2): which downstream it creates, upgrades, adopts,
//! deletes or orphans, and what the variant's status says, from the
//! objects alone.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::invocation::{Invocation, Outcome, Subresource};
use porch_api::v1alpha2::PackageRevision;
use porch_engine::variant::{VARIANT_MANAGER, reconcile};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const PV_UID: &str = "pv-uid";

fn now() -> Time {
    serde_json::from_value(json!("2026-11-23T10:00:00Z")).expect("time")
}

/// A revision of `repo`/`package`; `owner` a variant uid; `lock` the
/// upstream ref it was cloned from.
fn pr(
    repo: &str,
    package: &str,
    workspace: &str,
    lifecycle: &str,
    revision: i64,
    owner: Option<&str>,
    lock: Option<&str>,
) -> PackageRevision {
    let name = format!("{repo}.{}.{workspace}", package.replace('/', "."));
    let mut object = json!({
        "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": "7", "generation": 1},
        "spec": {"packageName": package, "repository": repo, "workspaceName": workspace,
                 "lifecycle": lifecycle},
        "status": {"revision": revision, "creationSource": "clone"}
    });
    if owner == Some(PV_UID) {
        // what the variant gave the revisions it made
        object["metadata"]["labels"] = json!({"team": "blue"});
        object["metadata"]["annotations"] = json!({"owner": "ops"});
    }
    if let Some(owner) = owner {
        object["metadata"]["ownerReferences"] = json!([
            {"apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository", "name": repo, "uid": "repo-uid"},
            {"apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "PackageVariant", "name": "my-pv",
             "uid": owner, "controller": true}
        ]);
    }
    if let Some(lock) = lock {
        object["status"]["upstreamLock"] =
            json!({"type": "git", "git": {"repo": "https://example.com/up.git", "ref": lock}});
    }
    serde_json::from_value(object).expect("a PackageRevision")
}

fn upstreams() -> Vec<PackageRevision> {
    vec![
        pr("up", "app", "v1", "Published", 1, None, None),
        pr("up", "app", "v2", "Published", 2, None, None),
        pr("up", "app", "main", "Published", -1, None, None),
        pr("up", "app", "next", "Draft", 0, None, None),
    ]
}

fn variant(spec: Value, extra: Value) -> Value {
    let mut pv = json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "PackageVariant",
        "metadata": {"name": "my-pv", "namespace": "default", "uid": PV_UID,
                     "resourceVersion": "40", "generation": 1,
                     "finalizers": ["config.porch.kpt.dev/packagevariants"]},
        "spec": spec
    });
    if let (Some(pv), Some(extra)) = (pv.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            pv.insert(k.clone(), v.clone());
        }
    }
    pv
}

fn basic_spec() -> Value {
    json!({"upstream": {"repo": "up", "package": "app"},
           "downstream": {"repo": "deployments", "package": "bar"},
           "labels": {"team": "blue"}, "annotations": {"owner": "ops"}})
}

fn invocation(pv: Value, related: Vec<PackageRevision>) -> Invocation {
    serde_json::from_value(json!({
        "operation": "variant",
        "requestId": "req-1",
        "time": "2026-11-23T10:00:00Z",
        "repository": {
            "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository",
            "metadata": {"name": "deployments", "namespace": "default", "uid": "repo-uid"},
            "spec": {"type": "git", "git": {"repo": "file:///unused", "branch": "main"}}
        },
        "packageVariant": pv,
        "related": related,
    }))
    .expect("an Invocation")
}

fn run(pv: Value, related: Vec<PackageRevision>) -> Outcome {
    reconcile(&invocation(pv, related), &now())
        .expect("reconciled")
        .finish(false, None)
}

/// The variant's status as the Outcome writes it.
fn status_of(outcome: &Outcome) -> Value {
    outcome
        .patches
        .iter()
        .find(|p| p.target.kind == "PackageVariant" && p.subresource == Subresource::Status)
        .map(|p| serde_json::to_value(&p.patch).expect("json")[1]["value"].clone())
        .unwrap_or_default()
}

fn condition(status: &Value, type_: &str) -> String {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .map(|c| {
            format!(
                "{}/{}: {}",
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            )
        })
        .unwrap_or_default()
}

fn created(outcome: &Outcome) -> Vec<(String, Value)> {
    outcome
        .apply
        .iter()
        .map(|a| {
            assert_eq!(a.field_manager, VARIANT_MANAGER);
            assert!(!a.force);
            (
                a.object["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                a.object.clone(),
            )
        })
        .collect()
}

fn patched(outcome: &Outcome, name: &str) -> Vec<Value> {
    outcome
        .patches
        .iter()
        .filter(|p| p.target.name == name)
        .map(|p| serde_json::to_value(&p.patch).expect("json"))
        .collect()
}

#[test]
fn a_new_variant_clones_the_latest_published_upstream_once() {
    let pv = variant(basic_spec(), json!({}));
    let outcome = run(pv.clone(), upstreams());
    let made = created(&outcome);
    assert_eq!(made.len(), 1);
    let (name, object) = &made[0];
    assert_eq!(name, "deployments.bar.packagevariant-1");
    assert_eq!(
        object["spec"],
        json!({"packageName": "bar", "repository": "deployments",
               "workspaceName": "packagevariant-1", "lifecycle": "Draft",
               "source": {"cloneFrom": {"upstreamRef": {"name": "up.app.v2"}}}})
    );
    assert_eq!(object["metadata"]["labels"], json!({"team": "blue"}));
    assert_eq!(object["metadata"]["annotations"], json!({"owner": "ops"}));
    assert_eq!(
        object["metadata"]["ownerReferences"],
        json!([{"apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "PackageVariant",
                "name": "my-pv", "uid": PV_UID, "controller": true}])
    );
    let status = status_of(&outcome);
    assert_eq!(
        condition(&status, "Stalled"),
        "False/Valid: all validation checks passed"
    );
    assert_eq!(
        condition(&status, "Ready"),
        "True/NoErrors: successfully ensured downstream package variant"
    );
    assert_eq!(
        status["downstreamTargets"],
        json!([{"name": "deployments.bar.packagevariant-1"}])
    );
    // a redelivery decides the same, byte for byte
    assert_eq!(run(pv, upstreams()), outcome);
}

#[test]
fn the_upstream_revision_and_workspace_are_honoured() {
    let mut spec = basic_spec();
    spec["upstream"]["revision"] = json!(1);
    let outcome = run(variant(spec, json!({})), upstreams());
    assert_eq!(
        created(&outcome)[0].1["spec"]["source"]["cloneFrom"]["upstreamRef"]["name"],
        "up.app.v1"
    );
    let mut spec = basic_spec();
    spec["upstream"]["workspaceName"] = json!("v1");
    let outcome = run(variant(spec, json!({})), upstreams());
    assert_eq!(
        created(&outcome)[0].1["spec"]["source"]["cloneFrom"]["upstreamRef"]["name"],
        "up.app.v1"
    );
    // a draft workspace is no upstream, nor is the branch placeholder
    for workspace in ["next", "main"] {
        let mut spec = basic_spec();
        spec["upstream"]["workspaceName"] = json!(workspace);
        let outcome = run(variant(spec, json!({})), upstreams());
        assert!(created(&outcome).is_empty());
        assert!(
            condition(&status_of(&outcome), "Stalled").starts_with(
                "True/ValidationError: could not find upstream package revision up/app workspace"
            ),
            "{}",
            status_of(&outcome)
        );
    }
}

#[test]
fn a_missing_upstream_or_an_invalid_spec_stalls_the_variant_and_creates_nothing() {
    let outcome = run(variant(basic_spec(), json!({})), Vec::new());
    assert!(created(&outcome).is_empty());
    let status = status_of(&outcome);
    assert!(condition(&status, "Stalled").starts_with("True/ValidationError: could not find"));
    assert!(condition(&status, "Ready").starts_with("False/Error: could not find"));

    let outcome = run(
        variant(
            json!({"upstream": {"repo": "up"}, "downstream": {"repo": "deployments"},
                   "packageContext": {"data": {"name": "x"}}}),
            json!({}),
        ),
        upstreams(),
    );
    assert!(created(&outcome).is_empty());
    let status = status_of(&outcome);
    assert_eq!(
        condition(&status, "Stalled"),
        "True/ValidationError: missing required field spec.upstream.package; missing required field spec.downstream.package; spec.packageContext.data: Invalid value: {\"name\":\"x\"}: must not contain the key \"name\""
    );
    assert_eq!(
        condition(&status, "Ready"),
        "False/Error: invalid packagevariant object"
    );
}

#[test]
fn a_new_variant_gets_its_finalizer_and_a_written_status_is_not_rewritten() {
    let mut pv = variant(basic_spec(), json!({}));
    pv["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("finalizers");
    let outcome = run(pv, upstreams());
    let finalizer = patched(&outcome, "my-pv");
    assert_eq!(
        finalizer[0],
        json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "40"},
               {"op": "add", "path": "/metadata/finalizers", "value": ["config.porch.kpt.dev/packagevariants"]}])
    );

    // the status written, and the draft in place: nothing to say again
    let first = run(variant(basic_spec(), json!({})), upstreams());
    let written = status_of(&first);
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "Draft",
        0,
        Some(PV_UID),
        Some("app/v2"),
    ));
    let again = run(variant(basic_spec(), json!({"status": written})), related);
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn a_published_downstream_of_an_older_upstream_gets_an_upgrade_draft() {
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "Published",
        1,
        Some(PV_UID),
        Some("app/v1"),
    ));
    let outcome = run(variant(basic_spec(), json!({})), related);
    let made = created(&outcome);
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].0, "deployments.bar.packagevariant-2");
    assert_eq!(
        made[0].1["spec"]["source"],
        json!({"upgrade": {"oldUpstream": {"name": "up.app.v1"}, "newUpstream": {"name": "up.app.v2"},
                           "currentPackage": {"name": "deployments.bar.packagevariant-1"},
                           "strategy": "resource-merge"}})
    );
    assert_eq!(
        status_of(&outcome)["downstreamTargets"],
        json!([{"name": "deployments.bar.packagevariant-2"}])
    );
}

#[test]
fn a_stale_draft_is_reported_not_duplicated() {
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "Published",
        1,
        Some(PV_UID),
        Some("app/v1"),
    ));
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-2",
        "Proposed",
        0,
        Some(PV_UID),
        Some("app/v1"),
    ));
    let outcome = run(variant(basic_spec(), json!({})), related);
    assert!(created(&outcome).is_empty(), "no second draft");
    assert_eq!(
        condition(&status_of(&outcome), "Ready"),
        "False/Error: downstream \"deployments.bar.packagevariant-2\" is Proposed on an older upstream than \"up.app.v2\"; publish or delete it to upgrade"
    );
}

#[test]
fn owned_revisions_of_another_package_are_deleted_or_proposed_for_deletion() {
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "Published",
        1,
        Some(PV_UID),
        Some("app/v2"),
    ));
    related.push(pr(
        "deployments",
        "foo",
        "packagevariant-1",
        "Draft",
        0,
        Some(PV_UID),
        None,
    ));
    related.push(pr(
        "deployments",
        "foo",
        "packagevariant-2",
        "Published",
        1,
        Some(PV_UID),
        None,
    ));
    related.push(pr(
        "deployments",
        "foo",
        "other",
        "Draft",
        0,
        Some("someone-else"),
        None,
    ));
    let outcome = run(variant(basic_spec(), json!({})), related);
    let deleted: Vec<&str> = outcome.delete.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(deleted, ["deployments.foo.packagevariant-1"]);
    assert_eq!(
        patched(&outcome, "deployments.foo.packagevariant-2"),
        [
            json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "replace", "path": "/spec/lifecycle", "value": "DeletionProposed"},
                {"op": "remove", "path": "/metadata/ownerReferences/1"}])
        ]
    );
    assert!(patched(&outcome, "deployments.foo.other").is_empty());
    assert!(created(&outcome).is_empty());
}

#[test]
fn adopt_existing_takes_matching_revisions_but_never_the_placeholder() {
    let mut spec = basic_spec();
    spec["adoptionPolicy"] = json!("adoptExisting");
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "hand-made",
        "Draft",
        0,
        None,
        Some("app/v2"),
    ));
    related.push(pr(
        "deployments",
        "bar",
        "main",
        "Published",
        -1,
        None,
        None,
    ));
    related.push(pr(
        "deployments",
        "baz",
        "hand-made",
        "Draft",
        0,
        None,
        None,
    ));
    let outcome = run(variant(spec, json!({})), related);
    assert_eq!(
        patched(&outcome, "deployments.bar.hand-made"),
        [
            json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/ownerReferences",
                 "value": [{"apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "PackageVariant",
                            "name": "my-pv", "uid": PV_UID, "controller": true}]},
                {"op": "add", "path": "/metadata/labels", "value": {"team": "blue"}},
                {"op": "add", "path": "/metadata/annotations", "value": {"owner": "ops"}}])
        ]
    );
    assert!(patched(&outcome, "deployments.bar.main").is_empty());
    assert!(patched(&outcome, "deployments.baz.hand-made").is_empty());
    assert!(created(&outcome).is_empty());
    assert_eq!(
        status_of(&outcome)["downstreamTargets"],
        json!([{"name": "deployments.bar.hand-made"}])
    );
}

#[test]
fn a_deletion_proposed_target_is_published_again() {
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "DeletionProposed",
        1,
        Some(PV_UID),
        Some("app/v2"),
    ));
    let plan = reconcile(
        &invocation(variant(basic_spec(), json!({})), related),
        &now(),
    )
    .expect("reconciled");
    assert_eq!(
        plan.edit_if_changed
            .as_ref()
            .and_then(|p| p.metadata.name.clone())
            .as_deref(),
        Some("deployments.bar.packagevariant-1")
    );
    let outcome = plan.finish(false, None);
    assert_eq!(
        patched(&outcome, "deployments.bar.packagevariant-1"),
        [
            json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "replace", "path": "/spec/lifecycle", "value": "Published"}])
        ]
    );
}

#[test]
fn changed_mutations_of_a_published_downstream_make_an_edit_draft() {
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "Published",
        1,
        Some(PV_UID),
        Some("app/v2"),
    ));
    let outcome = reconcile(
        &invocation(variant(basic_spec(), json!({})), related),
        &now(),
    )
    .expect("reconciled")
    .finish(true, None);
    let made = created(&outcome);
    assert_eq!(made[0].0, "deployments.bar.packagevariant-2");
    assert_eq!(
        made[0].1["spec"]["source"],
        json!({"copyFrom": {"name": "deployments.bar.packagevariant-1"}})
    );
    assert_eq!(
        status_of(&outcome)["downstreamTargets"],
        json!([{"name": "deployments.bar.packagevariant-2"}])
    );
}

#[test]
fn a_deleted_variant_cleans_up_before_its_finalizer_goes() {
    let deleting = json!({"metadata": {"name": "my-pv", "namespace": "default", "uid": PV_UID,
        "resourceVersion": "41", "deletionTimestamp": "2026-11-23T09:59:00Z",
        "finalizers": ["config.porch.kpt.dev/packagevariants"]}});
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "Published",
        1,
        Some(PV_UID),
        Some("app/v1"),
    ));
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-2",
        "Draft",
        0,
        Some(PV_UID),
        Some("app/v2"),
    ));
    let outcome = run(variant(basic_spec(), deleting.clone()), related.clone());
    assert_eq!(outcome.delete.len(), 1);
    assert_eq!(outcome.delete[0].name, "deployments.bar.packagevariant-2");
    assert_eq!(
        patched(&outcome, "deployments.bar.packagevariant-1"),
        [
            json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "replace", "path": "/spec/lifecycle", "value": "DeletionProposed"},
                {"op": "remove", "path": "/metadata/ownerReferences/1"}])
        ]
    );
    assert!(patched(&outcome, "my-pv").is_empty(), "the finalizer stays");
    assert_eq!(outcome.requeue_after_seconds, Some(2));

    // orphan: only the owner reference goes
    let mut spec = basic_spec();
    spec["deletionPolicy"] = json!("orphan");
    let outcome = run(variant(spec, deleting.clone()), related);
    assert!(outcome.delete.is_empty());
    assert_eq!(
        patched(&outcome, "deployments.bar.packagevariant-2"),
        [
            json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "remove", "path": "/metadata/ownerReferences/1"}])
        ]
    );

    // nothing owned any more: the finalizer is released
    let outcome = run(variant(basic_spec(), deleting), upstreams());
    assert_eq!(
        patched(&outcome, "my-pv"),
        [
            json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
                {"op": "remove", "path": "/metadata/finalizers/0"}])
        ]
    );
    assert!(outcome.requeue_after_seconds.is_none());
}

#[test]
fn workspaces_count_past_every_variant_workspace_of_the_package() {
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-7",
        "Published",
        1,
        None,
        None,
    ));
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-x",
        "Draft",
        0,
        None,
        None,
    ));
    related.push(pr(
        "deployments",
        "other",
        "packagevariant-9",
        "Draft",
        0,
        None,
        None,
    ));
    let outcome = run(variant(basic_spec(), json!({})), related);
    assert_eq!(created(&outcome)[0].0, "deployments.bar.packagevariant-8");
}

#[test]
fn an_invocation_for_another_repository_or_without_a_variant_is_refused() {
    let mut wrong = invocation(variant(basic_spec(), json!({})), upstreams());
    wrong.repository.metadata.name = Some("elsewhere".into());
    let err = reconcile(&wrong, &now()).expect_err("refused");
    assert!(!err.is_retryable());
    let mut none = invocation(variant(basic_spec(), json!({})), upstreams());
    none.package_variant = None;
    assert!(
        !reconcile(&none, &now())
            .expect_err("refused")
            .is_retryable()
    );
}

#[test]
fn label_and_annotation_changes_reach_existing_downstreams() {
    let mut related = upstreams();
    let mut owned = pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "Published",
        1,
        Some(PV_UID),
        Some("app/v2"),
    );
    // as they were before the variant's labels and annotations changed
    owned.metadata.labels = Some([("team".to_owned(), "red".to_owned())].into());
    owned.metadata.annotations = None;
    related.push(owned);
    let outcome = run(variant(basic_spec(), json!({})), related);
    assert_eq!(
        patched(&outcome, "deployments.bar.packagevariant-1"),
        [
            json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/labels", "value": {"team": "blue"}},
                {"op": "add", "path": "/metadata/annotations", "value": {"owner": "ops"}}])
        ]
    );
    // once they are there, nothing more
    let mut related = upstreams();
    related.push(pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "Published",
        1,
        Some(PV_UID),
        Some("app/v2"),
    ));
    let outcome = run(variant(basic_spec(), json!({})), related);
    assert!(patched(&outcome, "deployments.bar.packagevariant-1").is_empty());
}

#[test]
fn a_failed_render_of_a_downstream_shows_in_its_target() {
    let mut related = upstreams();
    let mut draft = pr(
        "deployments",
        "bar",
        "packagevariant-1",
        "Draft",
        0,
        Some(PV_UID),
        Some("app/v2"),
    );
    draft.status.as_mut().expect("status").conditions = vec![
        serde_json::from_value(json!({
            "type": "Rendered", "status": "False", "reason": "RenderFailed",
            "message": "set-labels: unknown field", "lastTransitionTime": "2026-11-23T09:00:00Z"
        }))
        .expect("a condition"),
    ];
    related.push(draft);
    let outcome = run(variant(basic_spec(), json!({})), related);
    assert_eq!(
        status_of(&outcome)["downstreamTargets"],
        json!([{"name": "deployments.bar.packagevariant-1",
                "renderStatus": {"error": "set-labels: unknown field"}}])
    );
}
