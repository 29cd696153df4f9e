//! The kube-rs cluster against a mock API server answering as
//! kube-apiserver does: patches to the status subresource, a failed `test`
//! guard (422), a missing object, server-side applies, deletes with a uid
//! precondition, Events.

use porch_api::invocation::{Apply, EventRecord, EventType, ObjectPatch, ObjectRef, Subresource};
use porch_relay::cluster::{Cluster, Written};
use porch_relay::kube::KubeCluster;
use serde_json::json;
use wiremock::matchers::{body_partial_json, header, method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

const PR_PATH: &str =
    "/apis/porch.kpt.dev/v1alpha2/namespaces/default/packagerevisions/blueprints.app.v1";

async fn cluster(server: &MockServer) -> KubeCluster {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = kube::Config::new(server.uri().parse().expect("uri"));
    KubeCluster::new(kube::Client::try_from(config).expect("client"))
}

fn target() -> ObjectRef {
    ObjectRef {
        api_version: "porch.kpt.dev/v1alpha2".into(),
        kind: "PackageRevision".into(),
        namespace: "default".into(),
        name: "blueprints.app.v1".into(),
        uid: "uid-1".into(),
    }
}

fn object(resource_version: &str) -> serde_json::Value {
    json!({
        "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
        "metadata": {"name": "blueprints.app.v1", "namespace": "default", "uid": "uid-1",
                     "resourceVersion": resource_version, "generation": 1},
        "spec": {"packageName": "app", "repository": "blueprints", "workspaceName": "v1", "lifecycle": "Draft"},
        "status": {"creationSource": "init"}
    })
}

fn status_patch(seen: &str) -> ObjectPatch {
    serde_json::from_value(json!({
        "target": target(),
        "subresource": "status",
        "patch": [
            {"op": "test", "path": "/metadata/resourceVersion", "value": seen},
            {"op": "replace", "path": "/status", "value": {"creationSource": "init"}}
        ]
    }))
    .expect("a patch")
}

/// kube-apiserver's answer to a JSON patch whose `test` fails.
fn test_failed() -> ResponseTemplate {
    ResponseTemplate::new(422).set_body_json(json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "PackageRevision.porch.kpt.dev \"blueprints.app.v1\" is invalid: patch: Invalid value: \"[{\\\"op\\\":\\\"test\\\"}]\": testing value /metadata/resourceVersion failed: test failed",
        "reason": "Invalid",
        "details": {"name": "blueprints.app.v1", "group": "porch.kpt.dev", "kind": "PackageRevision",
                    "causes": [{"reason": "FieldValueInvalid", "message": "Invalid value: \"...\": testing value /metadata/resourceVersion failed: test failed", "field": "patch"}]},
        "code": 422
    }))
}

fn not_found() -> ResponseTemplate {
    ResponseTemplate::new(404).set_body_json(json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "packagerevisions.porch.kpt.dev \"blueprints.app.v1\" not found",
        "reason": "NotFound",
        "details": {"name": "blueprints.app.v1", "group": "porch.kpt.dev", "kind": "packagerevisions"},
        "code": 404
    }))
}

#[tokio::test]
async fn status_patches_are_json_patches_and_a_failed_guard_is_a_conflict() {
    let server = MockServer::start().await;
    Mock::given(method("PATCH"))
        .and(path(format!("{PR_PATH}/status")))
        .and(header("content-type", "application/json-patch+json"))
        .and(body_partial_json(json!([{"op": "test", "value": "7"}])))
        .respond_with(ResponseTemplate::new(200).set_body_json(object("8")))
        .mount(&server)
        .await;
    Mock::given(method("PATCH"))
        .and(path(format!("{PR_PATH}/status")))
        .and(body_partial_json(json!([{"op": "test", "value": "6"}])))
        .respond_with(test_failed())
        .mount(&server)
        .await;
    let cluster = cluster(&server).await;
    match cluster.patch(&status_patch("7")).await.expect("patched") {
        Written::Applied(object) => assert_eq!(object["metadata"]["resourceVersion"], "8"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        cluster.patch(&status_patch("6")).await.expect("answered"),
        Written::Conflict(m) if m.contains("testing value")
    ));
}

#[tokio::test]
async fn missing_objects_conflicts_and_server_errors_are_told_apart() {
    let server = MockServer::start().await;
    Mock::given(method("PATCH"))
        .and(path(format!("{PR_PATH}/status")))
        .respond_with(not_found())
        .mount(&server)
        .await;
    Mock::given(method("PATCH"))
        .and(path(PR_PATH))
        .respond_with(ResponseTemplate::new(409).set_body_json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Operation cannot be fulfilled on packagerevisions.porch.kpt.dev \"blueprints.app.v1\": the object has been modified; please apply your changes to the latest version and try again",
            "reason": "Conflict", "code": 409
        })))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(PR_PATH))
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500
        })))
        .mount(&server)
        .await;
    let cluster = cluster(&server).await;
    assert_eq!(
        cluster.patch(&status_patch("7")).await.expect("answered"),
        Written::Missing
    );
    let mut main = status_patch("7");
    main.subresource = Subresource::Main;
    assert!(matches!(
        cluster.patch(&main).await.expect("answered"),
        Written::Conflict(m) if m.contains("has been modified")
    ));
    let err = cluster.get(&target()).await.expect_err("a server error");
    assert!(err.to_string().contains("etcdserver"), "{err}");
}

#[tokio::test]
async fn applies_deletes_and_events_reach_their_endpoints() {
    let server = MockServer::start().await;
    Mock::given(method("PATCH"))
        .and(path(PR_PATH))
        .and(header("content-type", "application/apply-patch+yaml"))
        .and(query_param("fieldManager", "repository-controller"))
        .and(query_param("force", "true"))
        .respond_with(ResponseTemplate::new(200).set_body_json(object("9")))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path(PR_PATH))
        .and(body_partial_json(
            json!({"preconditions": {"uid": "uid-1"}}),
        ))
        .respond_with(not_found())
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/apis/events.k8s.io/v1/namespaces/default/events"))
        .and(body_partial_json(json!({
            "type": "Warning", "reason": "InvocationRefused",
            "regarding": {"kind": "PackageRevision", "name": "blueprints.app.v1", "uid": "uid-1"},
            "reportingController": "porch.kpt.dev/porch-relay"
        })))
        .respond_with(ResponseTemplate::new(201).set_body_json(json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "blueprints.app.v1.abc", "namespace": "default"},
            "eventTime": "2026-11-22T10:00:00.000000Z"
        })))
        .expect(1)
        .mount(&server)
        .await;
    let cluster = cluster(&server).await;
    let apply = Apply {
        field_manager: "repository-controller".into(),
        force: true,
        subresource: Subresource::Main,
        object: object("0"),
    };
    assert!(matches!(
        cluster.apply(&apply).await.expect("applied"),
        Written::Applied(o) if o["metadata"]["resourceVersion"] == "9"
    ));
    // already gone: not an error
    cluster.delete(&target()).await.expect("deleted");
    cluster
        .record(&EventRecord {
            regarding: target(),
            type_: EventType::Warning,
            reason: "InvocationRefused".into(),
            message: "source: bad".into(),
        })
        .await
        .expect("recorded");
}
