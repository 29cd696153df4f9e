//! Leader election against a mock API server: a free Lease is created, a
//! fresh one held by another replica is left alone, an expired one is taken
//! over (transitions counted), and a lost race (409) means standby.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use porch_relay::lease::LeaseLock;
use serde_json::json;
use wiremock::matchers::{body_partial_json, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/porch-system/leases";

async fn lock(server: &MockServer) -> LeaseLock {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = kube::Config::new(server.uri().parse().expect("uri"));
    let client = kube::Client::try_from(config).expect("client");
    LeaseLock::new(
        kube::Api::namespaced(client, "porch-system"),
        "porch-relay",
        "relay-b",
        Duration::from_secs(15),
    )
}

fn held(by: &str, renewed: Timestamp) -> serde_json::Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "porch-relay", "namespace": "porch-system", "resourceVersion": "41"},
        "spec": {"holderIdentity": by, "leaseDurationSeconds": 15,
                 "acquireTime": "2026-11-22T09:00:00.000000Z",
                 "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
                 "leaseTransitions": 3}
    })
}

#[tokio::test]
async fn a_missing_lease_is_created_and_held() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("{LEASES}/porch-relay")))
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "leases.coordination.k8s.io \"porch-relay\" not found"})))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(LEASES))
        .and(body_partial_json(json!({"spec": {"holderIdentity": "relay-b", "leaseDurationSeconds": 15, "leaseTransitions": 0}})))
        .respond_with(ResponseTemplate::new(201).set_body_json(held("relay-b", Timestamp::now())))
        .expect(1)
        .mount(&server)
        .await;
    assert!(
        lock(&server)
            .await
            .try_acquire_or_renew()
            .await
            .expect("answered")
    );
}

#[tokio::test]
async fn a_fresh_lease_of_another_replica_is_left_alone() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("{LEASES}/porch-relay")))
        .respond_with(ResponseTemplate::new(200).set_body_json(held("relay-a", Timestamp::now())))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .respond_with(ResponseTemplate::new(500))
        .expect(0)
        .mount(&server)
        .await;
    assert!(
        !lock(&server)
            .await
            .try_acquire_or_renew()
            .await
            .expect("answered")
    );
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_a_lost_race_is_standby() {
    let expired = Timestamp::now()
        .checked_sub(SignedDuration::from_secs(60))
        .expect("a minute ago");
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("{LEASES}/porch-relay")))
        .respond_with(ResponseTemplate::new(200).set_body_json(held("relay-a", expired)))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path(format!("{LEASES}/porch-relay")))
        .and(body_partial_json(json!({
            "metadata": {"resourceVersion": "41"},
            "spec": {"holderIdentity": "relay-b", "leaseTransitions": 4}})))
        .respond_with(ResponseTemplate::new(200).set_body_json(held("relay-b", Timestamp::now())))
        .expect(1)
        .mount(&server)
        .await;
    assert!(
        lock(&server)
            .await
            .try_acquire_or_renew()
            .await
            .expect("answered")
    );

    // the same, but another standby replaced it first
    let raced = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("{LEASES}/porch-relay")))
        .respond_with(ResponseTemplate::new(200).set_body_json(held("relay-a", expired)))
        .mount(&raced)
        .await;
    Mock::given(method("PUT"))
        .respond_with(ResponseTemplate::new(409).set_body_json(json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": "Operation cannot be fulfilled on leases.coordination.k8s.io \"porch-relay\": the object has been modified; please apply your changes to the latest version and try again"})))
        .mount(&raced)
        .await;
    assert!(
        !lock(&raced)
            .await
            .try_acquire_or_renew()
            .await
            .expect("answered")
    );
}
