//! Leader election against a mock API server: a free Lease is created, a
//! fresh one held by another replica is left alone, an expired one is taken
//! over (transitions counted), a lost race (409) means standby, and a
//! released Lease is handed over at once.

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

/// kube-apiserver's Lease endpoints over one stored Lease: create is 409
/// when it exists, a replace whose resourceVersion is stale is 409.
struct LeaseServer(std::sync::Mutex<Option<serde_json::Value>>);

impl wiremock::Respond for LeaseServer {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let mut stored = self.0.lock().expect("lock");
        let conflict = ResponseTemplate::new(409).set_body_json(json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": "Operation cannot be fulfilled on leases.coordination.k8s.io \"porch-relay\": the object has been modified"}));
        let body = serde_json::from_slice::<serde_json::Value>(&request.body);
        match (request.method.as_str(), stored.as_ref(), body) {
            ("GET", Some(lease), _) => ResponseTemplate::new(200).set_body_json(lease),
            ("GET", None, _) => ResponseTemplate::new(404).set_body_json(json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                "message": "leases.coordination.k8s.io \"porch-relay\" not found"})),
            ("POST", Some(_), _) => conflict,
            ("POST", None, Ok(mut lease)) => {
                lease["metadata"]["resourceVersion"] = json!("1");
                lease["metadata"]["namespace"] = json!("porch-system");
                *stored = Some(lease.clone());
                ResponseTemplate::new(201).set_body_json(lease)
            }
            ("PUT", Some(current), Ok(mut lease)) => {
                let version = current["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                if lease["metadata"]["resourceVersion"] != json!(version.to_string()) {
                    return conflict;
                }
                lease["metadata"]["resourceVersion"] = json!((version + 1).to_string());
                *stored = Some(lease.clone());
                ResponseTemplate::new(200).set_body_json(lease)
            }
            _ => ResponseTemplate::new(400),
        }
    }
}

#[tokio::test]
async fn a_released_lease_is_handed_over_at_once_and_a_race_has_one_winner() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let server = MockServer::start().await;
    Mock::given(wiremock::matchers::path_regex(format!(
        "^{LEASES}(/porch-relay)?$"
    )))
    .respond_with(LeaseServer(std::sync::Mutex::new(None)))
    .mount(&server)
    .await;
    let client = kube::Client::try_from(kube::Config::new(server.uri().parse().expect("uri")))
        .expect("client");
    let replica = |identity: &str| {
        LeaseLock::new(
            kube::Api::namespaced(client.clone(), "porch-system"),
            "porch-relay",
            identity,
            Duration::from_secs(15),
        )
    };
    let (a, b, c) = (replica("relay-a"), replica("relay-b"), replica("relay-c"));

    // two replicas start together on a free Lease: exactly one leads
    let (won_a, won_b) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
    let (won_a, won_b) = (won_a.expect("answered"), won_b.expect("answered"));
    assert!(won_a ^ won_b, "one leader: a={won_a} b={won_b}");
    let (leader, standby) = if won_a { (&a, &b) } else { (&b, &a) };

    // the leader renews; the standby waits (15 s have not passed)
    assert!(leader.try_acquire_or_renew().await.expect("answered"));
    assert!(!standby.try_acquire_or_renew().await.expect("answered"));

    // the leader stops and releases: the standby takes over at once
    leader.release().await.expect("released");
    assert!(standby.try_acquire_or_renew().await.expect("answered"));
    assert!(!leader.try_acquire_or_renew().await.expect("answered"));
    assert!(!c.try_acquire_or_renew().await.expect("answered"));
    let lease: serde_json::Value = server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .rev()
        .find(|r| r.method.as_str() == "PUT")
        .and_then(|r| serde_json::from_slice(&r.body).ok())
        .expect("a replace");
    assert_eq!(lease["spec"]["holderIdentity"], standby.identity());
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
}
