//! The variant set handler (packagevariants spec §3, §5 items 34–44): the
//! targets unrolled, templates with CEL expressions rendered, variants
//! created, updated only when their spec differs, removed when no target
//! wants them, kept when a selector matches nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::invocation::{Invocation, Outcome, Subresource};
use porch_engine::variant_set::{PACKAGE_VARIANT_SET_FINALIZER, SET_MANAGER, reconcile};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const SET_UID: &str = "pvs-uid";

fn now() -> Time {
    serde_json::from_value(json!("2026-11-23T10:00:00Z")).expect("time")
}

fn repository(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository",
           "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": labels},
           "spec": {"type": "git", "git": {"repo": format!("https://example.com/{name}.git"), "branch": "main"}}})
}

fn set(spec: Value, extra: Value) -> Value {
    let mut set = json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha2", "kind": "PackageVariantSet",
        "metadata": {"name": "my-pvs", "namespace": "default", "uid": SET_UID, "resourceVersion": "30",
                     "finalizers": [PACKAGE_VARIANT_SET_FINALIZER]},
        "spec": spec
    });
    if let (Some(s), Some(extra)) = (set.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    set
}

fn existing(name: &str, repo: &str, package: &str, extra_spec: Value) -> Value {
    let mut spec = json!({"upstream": {"repo": "up", "package": "p", "revision": 1},
                          "downstream": {"repo": repo, "package": package}});
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "PackageVariant",
           "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                        "resourceVersion": "5", "labels": {"config.porch.kpt.dev/packagevariantset": SET_UID}},
           "spec": spec})
}

fn invocation(set: Value, variants: Vec<Value>, objects: Vec<Value>) -> Invocation {
    serde_json::from_value(json!({
        "operation": "variant-set",
        "requestId": "req-1",
        "time": "2026-11-23T10:00:00Z",
        "repository": repository("up", json!({})),
        "packageVariantSet": set,
        "variants": variants,
        "repositories": [
            repository("up", json!({})),
            repository("r1", json!({"env": "prod", "efg": "hij"})),
            repository("r2", json!({"env": "prod"})),
            repository("my-repo-2", json!({"efg": "hij", "abc": "def"})),
        ],
        "clusterObjects": objects,
        "related": [{
            "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
            "metadata": {"name": "up.p.v1", "namespace": "default", "uid": "uid-up",
                         "annotations": {"bigco.com/team": "us-platform"}},
            "spec": {"packageName": "p", "repository": "up", "workspaceName": "v1", "lifecycle": "Published"},
            "status": {"revision": 1}
        }],
    }))
    .expect("an Invocation")
}

fn run(set: Value, variants: Vec<Value>, objects: Vec<Value>) -> Outcome {
    reconcile(&invocation(set, variants, objects), &now()).expect("reconciled")
}

fn upstream() -> Value {
    json!({"repo": "up", "package": "p", "revision": 1})
}

/// The variants applied: (name, spec).
fn applied(outcome: &Outcome) -> Vec<(String, Value)> {
    outcome
        .apply
        .iter()
        .map(|a| {
            assert_eq!(a.field_manager, SET_MANAGER);
            (
                a.object["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                a.object["spec"].clone(),
            )
        })
        .collect()
}

fn conditions(outcome: &Outcome) -> Vec<String> {
    outcome
        .patches
        .iter()
        .filter(|p| p.subresource == Subresource::Status)
        .flat_map(|p| {
            let value = serde_json::to_value(&p.patch).expect("json");
            value[1]["value"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|c| {
            format!(
                "{} {}/{}: {}",
                c["type"].as_str().unwrap_or(""),
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn repository_targets_make_one_variant_per_package() {
    let outcome = run(
        set(
            json!({"upstream": upstream(), "targets": [
                {"repositories": [{"name": "r1", "packageNames": ["p1", "p2"]}, {"name": "r2"}]}]}),
            json!({}),
        ),
        Vec::new(),
        Vec::new(),
    );
    let made = applied(&outcome);
    let names: Vec<&str> = made.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["my-pvs-r1-p1", "my-pvs-r1-p2", "my-pvs-r2-p"]);
    assert_eq!(
        made[2].1,
        json!({"upstream": upstream(), "downstream": {"repo": "r2", "package": "p"}})
    );
    let object = &outcome.apply[0].object;
    assert_eq!(
        object["metadata"]["labels"],
        json!({"config.porch.kpt.dev/packagevariantset": SET_UID})
    );
    assert_eq!(
        object["metadata"]["finalizers"],
        json!(["config.porch.kpt.dev/packagevariants"])
    );
    assert_eq!(
        object["metadata"]["ownerReferences"][0]["uid"],
        json!(SET_UID)
    );
    assert_eq!(
        conditions(&outcome),
        [
            "Stalled False/Valid: all validation checks passed",
            "Ready True/Reconciled: package variants successfully reconciled"
        ]
    );
}

#[test]
fn templates_render_with_cel() {
    let outcome = run(
        set(
            json!({"upstream": upstream(), "targets": [{
            "repositories": [{"name": "r1"}],
            "template": {
                "downstream": {"repoExpr": "'my-repo-2'", "packageExpr": "repoDefault + '-' + packageDefault"},
                "labels": {"foo": "bar", "hello": "there"},
                "labelExprs": [
                    {"key": "foo", "valueExpr": "repoDefault"},
                    {"keyExpr": "repository.labels['efg']", "valueExpr": "packageDefault + '-' + repository.name"},
                    {"key": "hello", "value": "goodbye"}],
                "annotationExprs": [{"key": "team", "valueExpr": "upstream.annotations['bigco.com/team']"}],
                "packageContext": {"data": {"foo": "bar"},
                                   "dataExprs": [{"keyExpr": "upstream.namespace", "valueExpr": "upstream.name"}],
                                   "removeKeys": ["foobar", "barfoo"],
                                   "removeKeyExprs": ["repository.labels['abc']"]},
                "injectors": [{"name": "bar"}, {"kind": "ConfigMap", "nameExpr": "repository.name + '-test'"}],
                "pipeline": {"mutators": [{"image": "set-labels:v0.2", "name": "labels",
                                           "configMap": {"k1": "v1", "k2": "v2"},
                                           "configMapExprs": [{"key": "k1", "valueExpr": "target.repo"}]}]}
            }}]}),
            json!({}),
        ),
        Vec::new(),
        Vec::new(),
    );
    let made = applied(&outcome);
    assert_eq!(made[0].0, "my-pvs-my-repo-2-r1-p");
    assert_eq!(
        made[0].1,
        json!({
            "upstream": upstream(),
            "downstream": {"repo": "my-repo-2", "package": "r1-p"},
            "labels": {"foo": "r1", "hello": "goodbye", "hij": "p-my-repo-2"},
            "annotations": {"team": "us-platform"},
            "packageContext": {"data": {"default": "up.p.v1", "foo": "bar"},
                               "removeKeys": ["barfoo", "def", "foobar"]},
            "injectors": [{"name": "bar"}, {"kind": "ConfigMap", "name": "my-repo-2-test"}],
            "pipeline": {"mutators": [{"image": "set-labels:v0.2", "name": "labels",
                                       "configMap": {"k1": "r1", "k2": "v2"}}]}
        })
    );
}

#[test]
fn variants_are_written_only_when_their_spec_differs_and_stale_ones_go() {
    let target = json!({"upstream": upstream(), "targets": [
        {"repositories": [{"name": "r1", "packageNames": ["p1", "p2"]}]}]});
    let variants = vec![
        existing("my-pvs-r1-p1", "r1", "p1", json!({})),
        existing(
            "renamed-by-hand",
            "r1",
            "p2",
            json!({"labels": {"old": "x"}}),
        ),
        existing("my-pvs-r2-gone", "r2", "gone", json!({})),
    ];
    let outcome = run(set(target, json!({})), variants, Vec::new());
    let made = applied(&outcome);
    // p1 is as desired; p2 is rewritten under the name it has
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].0, "renamed-by-hand");
    assert!(made[0].1.get("labels").is_none());
    let deleted: Vec<&str> = outcome.delete.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(deleted, ["my-pvs-r2-gone"]);
}

#[test]
fn a_selector_matching_nothing_keeps_the_variants_and_says_so() {
    let spec = json!({"upstream": upstream(), "targets": [
        {"repositorySelector": {"matchLabels": {"env": "prod"}}},
        {"repositorySelector": {"matchLabels": {"env": "staging"}}}]});
    let variants = vec![existing("my-pvs-r9-p", "r9", "p", json!({}))];
    let outcome = run(set(spec, json!({})), variants, Vec::new());
    let names: Vec<String> = applied(&outcome).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["my-pvs-r1-p", "my-pvs-r2-p"]);
    assert!(outcome.delete.is_empty(), "nothing removed");
    assert_eq!(
        conditions(&outcome)[1],
        "Ready False/NoMatchingTargets: spec.targets[1] selected nothing; no PackageVariant was removed"
    );
}

#[test]
fn object_selectors_choose_objects_of_their_kind_in_the_namespace() {
    let cluster = |name: &str, namespace: &str, labels: Value| {
        json!({"apiVersion": "infra.example.com/v1", "kind": "Cluster",
               "metadata": {"name": name, "namespace": namespace, "labels": labels}})
    };
    let objects = vec![
        cluster("edge-1", "default", json!({"tier": "edge"})),
        cluster("edge-2", "other", json!({"tier": "edge"})),
        cluster("core-1", "default", json!({"tier": "core"})),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "edge-3", "namespace": "default", "labels": {"tier": "edge"}}}),
    ];
    let spec = json!({"upstream": upstream(), "targets": [{
        "objectSelector": {"apiVersion": "infra.example.com/v1", "kind": "Cluster",
                           "matchExpressions": [{"key": "tier", "operator": "In", "values": ["edge"]}]},
        "template": {"downstream": {"repo": "r1", "packageExpr": "target.name"}}}]});
    let names: Vec<String> = applied(&run(set(spec, json!({})), Vec::new(), objects))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["my-pvs-r1-edge-1"]);
}

#[test]
fn long_and_nested_names_are_shortened_with_a_hash() {
    let long = "supersupersuperloooooooooooooooooooooooooooooooooooong";
    let spec = json!({"upstream": upstream(), "targets": [
        {"repositories": [{"name": "r1", "packageNames": [long, "net/edge"]}]}]});
    let names: Vec<String> = applied(&run(set(spec, json!({})), Vec::new(), Vec::new()))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.iter().all(|n| n.len() <= 63), "{names:?}");
    assert!(
        names[0].starts_with("my-pvs-r1-supersupersuperlooo"),
        "{names:?}"
    );
    assert!(names[1].starts_with("my-pvs-r1-net-edge-"), "{names:?}");
}

#[test]
fn invalid_sets_missing_upstreams_and_bad_expressions_stall_and_write_nothing() {
    let outcome = run(
        set(json!({"targets": []}), json!({})),
        Vec::new(),
        Vec::new(),
    );
    assert!(outcome.apply.is_empty());
    assert!(
        conditions(&outcome)[0].starts_with(
            "Stalled True/ValidationError: spec.upstream is a required field; must specify at least one item in spec.targets"
        ),
        "{:?}",
        conditions(&outcome)
    );

    let outcome = run(
        set(
            json!({"upstream": {"repo": "up", "package": "p", "revision": 7},
                   "targets": [{"repositories": [{"name": "r1"}]}]}),
            json!({}),
        ),
        Vec::new(),
        Vec::new(),
    );
    assert_eq!(
        conditions(&outcome)[0],
        "Stalled True/UpstreamNotFound: could not find upstream package revision 'p/7' in repo 'up'"
    );

    for (expression, message) in [
        ("badvar", "template.downstream.repoExpr: "),
        (
            "repository.labels['missing']",
            "template.downstream.repoExpr: ",
        ),
        (
            "1 + 2",
            "template.downstream.repoExpr: expression must evaluate to a string",
        ),
    ] {
        let spec = json!({"upstream": upstream(), "targets": [{
            "repositories": [{"name": "r1"}],
            "template": {"downstream": {"repoExpr": expression}}}]});
        let outcome = run(set(spec, json!({})), Vec::new(), Vec::new());
        assert!(outcome.apply.is_empty() && outcome.delete.is_empty());
        let stalled = &conditions(&outcome)[0];
        assert!(
            stalled.starts_with(&format!("Stalled True/UnexpectedError: {message}")),
            "{expression}: {stalled}"
        );
    }
    // hostile: too deep and too long
    let deep = format!("{}'x'{}", "(".repeat(100), ")".repeat(100));
    let long = format!("'{}'", "x".repeat(5000));
    for expression in [deep, long] {
        let spec = json!({"upstream": upstream(), "targets": [{
            "repositories": [{"name": "r1"}],
            "template": {"downstream": {"packageExpr": expression}}}]});
        let outcome = run(set(spec, json!({})), Vec::new(), Vec::new());
        assert!(outcome.apply.is_empty());
        assert!(
            conditions(&outcome)[0].contains("template.downstream.packageExpr: expression"),
            "{:?}",
            conditions(&outcome)
        );
    }
    // a downstream Repository that does not exist
    let spec = json!({"upstream": upstream(), "targets": [{
        "repositories": [{"name": "nowhere"}], "template": {"labels": {"a": "b"}}}]});
    assert_eq!(
        conditions(&run(set(spec, json!({})), Vec::new(), Vec::new()))[0],
        "Stalled True/UnexpectedError: repository \"nowhere\" could not be loaded"
    );
}

#[test]
fn a_new_set_gets_its_finalizer_and_a_deleted_one_removes_its_variants_first() {
    let spec = json!({"upstream": upstream(), "targets": [{"repositories": [{"name": "r1"}]}]});
    let mut fresh = set(spec.clone(), json!({}));
    fresh["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("finalizers");
    let outcome = run(fresh, Vec::new(), Vec::new());
    assert_eq!(
        serde_json::to_value(&outcome.patches[0].patch).expect("json")[1],
        json!({"op": "add", "path": "/metadata/finalizers", "value": [PACKAGE_VARIANT_SET_FINALIZER]})
    );

    let deleting = json!({"metadata": {"name": "my-pvs", "namespace": "default", "uid": SET_UID,
        "resourceVersion": "31", "deletionTimestamp": "2026-11-23T09:00:00Z",
        "finalizers": [PACKAGE_VARIANT_SET_FINALIZER]}});
    let outcome = run(
        set(spec.clone(), deleting.clone()),
        vec![existing("my-pvs-r1-p", "r1", "p", json!({}))],
        Vec::new(),
    );
    assert_eq!(outcome.delete.len(), 1);
    assert!(outcome.patches.is_empty(), "the finalizer stays");
    assert_eq!(outcome.requeue_after_seconds, Some(2));
    let outcome = run(set(spec, deleting), Vec::new(), Vec::new());
    assert_eq!(
        serde_json::to_value(&outcome.patches[0].patch).expect("json")[1],
        json!({"op": "remove", "path": "/metadata/finalizers/0"})
    );
}

#[test]
fn a_set_whose_status_says_it_all_writes_nothing() {
    let spec = json!({"upstream": upstream(), "targets": [{"repositories": [{"name": "r1"}]}]});
    let first = run(set(spec.clone(), json!({})), Vec::new(), Vec::new());
    let status = serde_json::to_value(&first.patches[0].patch).expect("json")[1]["value"].clone();
    let again = run(
        set(spec, json!({"status": status})),
        vec![existing("my-pvs-r1-p", "r1", "p", json!({}))],
        Vec::new(),
    );
    assert!(again.is_empty(), "{again:?}");
}
