//! The watches against a mock API server: the initial list, watch events
//! (added, modified, deleted), a watch that ends and is resumed, and a
//! re-list that forgets what is gone; the health endpoints follow.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use porch_relay::invoker::InvokeError;
use porch_relay::relay::{Relay, RelayConfig};
use serde_json::json;
use tower::ServiceExt;
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::World;

/// An invoker that does nothing.
struct Nothing;

impl porch_relay::invoker::Invoker for Nothing {
    async fn invoke(
        &self,
        _invocation: &porch_api::invocation::Invocation,
    ) -> Result<porch_api::invocation::Outcome, InvokeError> {
        Ok(porch_api::invocation::Outcome::none())
    }
}

fn revision(name: &str, version: &str) -> serde_json::Value {
    json!({
        "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": version, "generation": 1},
        "spec": {"packageName": name.split('.').nth(1).unwrap_or("p"), "repository": "blueprints",
                 "workspaceName": "v1", "lifecycle": "Draft"}
    })
}

#[tokio::test]
async fn watches_list_follow_and_forget_and_readiness_follows_the_lists() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let server = MockServer::start().await;
    let collection = "/apis/porch.kpt.dev/v1alpha2/packagerevisions";
    Mock::given(method("GET"))
        .and(path(collection))
        .and(query_param_is_missing("watch"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevisionList",
            "metadata": {"resourceVersion": "100"},
            "items": [revision("blueprints.listed.v1", "90"), revision("blueprints.gone.v1", "91")]
        })))
        .mount(&server)
        .await;
    let events = [
        json!({"type": "ADDED", "object": revision("blueprints.added.v1", "101")}),
        json!({"type": "MODIFIED", "object": revision("blueprints.listed.v1", "102")}),
        json!({"type": "DELETED", "object": revision("blueprints.gone.v1", "103")}),
        json!({"type": "BOOKMARK", "object": {"apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
               "metadata": {"resourceVersion": "103"}}}),
    ]
    .iter()
    .map(|e| format!("{e}\n"))
    .collect::<String>();
    Mock::given(method("GET"))
        .and(path(collection))
        .and(query_param("watch", "true"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/json")
                .set_body_string(events),
        )
        .mount(&server)
        .await;
    let config = kube::Config::new(server.uri().parse().expect("uri"));
    let client = kube::Client::try_from(config).expect("client");

    let world = World::new();
    let relay = Arc::new(Relay::new(
        Arc::clone(&world.cluster),
        Arc::new(Nothing),
        RelayConfig::default(),
    ));
    let listed = Arc::new(AtomicBool::new(false));
    let health = porch_relay::server::Health {
        ready: vec![Arc::clone(&listed)],
        leading: None,
        metrics: {
            let relay = Arc::clone(&relay);
            Arc::new(move || relay.encode_metrics())
        },
    };
    let get = |uri: &'static str| {
        let router = porch_relay::server::router(health.clone());
        async move {
            let response = router
                .oneshot(
                    axum::http::Request::get(uri)
                        .body(axum::body::Body::empty())
                        .expect("request"),
                )
                .await
                .expect("answer");
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .expect("body");
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(get("/readyz").await.0, 503);
    assert_eq!(get("/healthz").await, (200, "ok".to_owned()));

    let watching = tokio::spawn(porch_relay::watch::revisions(
        Arc::clone(&relay),
        kube::Api::all(client),
        Arc::clone(&listed),
    ));
    let mut state = (false, false, false);
    for _ in 0..200 {
        state = (
            relay.revision("default", "blueprints.added.v1").is_some(),
            relay
                .revision("default", "blueprints.listed.v1")
                .and_then(|p| p.metadata.resource_version)
                .as_deref()
                == Some("102"),
            relay.revision("default", "blueprints.gone.v1").is_none(),
        );
        if state == (true, true, true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state, (true, true, true), "added, modified, deleted");
    assert_eq!(get("/readyz").await, (200, "ok".to_owned()));
    let (status, metrics) = get("/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("porch_relay_queue_depth"), "{metrics}");
    // the stream ended and was resumed: the same events again change nothing
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(relay.revision("default", "blueprints.gone.v1").is_none());
    assert!(server.received_requests().await.expect("recorded").len() >= 2);
    // a re-list that no longer holds a revision forgets it
    let mut listed_now = std::collections::BTreeSet::new();
    listed_now.insert(("default".to_owned(), "blueprints.added.v1".to_owned()));
    relay.retain_revisions(&listed_now);
    watching.abort();
    assert!(relay.revision("default", "blueprints.listed.v1").is_none());
    assert!(relay.revision("default", "blueprints.added.v1").is_some());
}

#[tokio::test]
async fn an_expired_watch_re_lists_and_forgets_what_the_new_list_lacks() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let server = MockServer::start().await;
    let collection = "/apis/porch.kpt.dev/v1alpha2/packagerevisions";
    let list = |version: &str, items: Vec<serde_json::Value>| {
        ResponseTemplate::new(200).set_body_json(json!({
            "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevisionList",
            "metadata": {"resourceVersion": version}, "items": items
        }))
    };
    // the first list, then (after the watch expired) a newer one: `kept`
    // stays, `dropped` went while the relay was away, `arrived` is new
    Mock::given(method("GET"))
        .and(path(collection))
        .and(query_param_is_missing("watch"))
        .respond_with(list(
            "100",
            vec![
                revision("blueprints.kept.v1", "90"),
                revision("blueprints.dropped.v1", "91"),
            ],
        ))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(collection))
        .and(query_param_is_missing("watch"))
        .respond_with(list(
            "200",
            vec![
                revision("blueprints.kept.v1", "90"),
                revision("blueprints.arrived.v1", "150"),
            ],
        ))
        .with_priority(2)
        .mount(&server)
        .await;
    // the watch from version 100 is too old: the API server says 410 Gone
    // in an ERROR event, as it does once etcd compacted that version
    Mock::given(method("GET"))
        .and(path(collection))
        .and(query_param("watch", "true"))
        .and(query_param("resourceVersion", "100"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/json")
                .set_body_string(format!(
                    "{}\n",
                    json!({"type": "ERROR", "object": {
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "too old resource version: 100 (180)", "reason": "Expired", "code": 410}})
                )),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(collection))
        .and(query_param("watch", "true"))
        .and(query_param("resourceVersion", "200"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/json")
                .set_body_string("")
                .set_delay(Duration::from_millis(200)),
        )
        .mount(&server)
        .await;
    let client = kube::Client::try_from(kube::Config::new(server.uri().parse().expect("uri")))
        .expect("client");
    let world = World::new();
    let relay = Arc::new(Relay::new(
        Arc::clone(&world.cluster),
        Arc::new(Nothing),
        RelayConfig::default(),
    ));
    let watching = tokio::spawn(porch_relay::watch::revisions(
        Arc::clone(&relay),
        kube::Api::all(client),
        Arc::new(AtomicBool::new(false)),
    ));
    let seen = |name: &str| relay.revision("default", name).is_some();
    let mut state = (false, false, false);
    for _ in 0..250 {
        state = (
            seen("blueprints.kept.v1"),
            seen("blueprints.dropped.v1"),
            seen("blueprints.arrived.v1"),
        );
        if state == (true, false, true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watching.abort();
    assert_eq!(state, (true, false, true), "kept, dropped, arrived");
    let requests = server.received_requests().await.unwrap_or_default();
    let lists = requests
        .iter()
        .filter(|r| !r.url.query().unwrap_or("").contains("watch=true"))
        .count();
    assert_eq!(lists, 2, "listed again after the 410");
}

/// Counts the variant reconciles it is asked for.
#[derive(Default)]
struct Variants(std::sync::atomic::AtomicUsize);

impl porch_relay::invoker::Invoker for Variants {
    async fn invoke(
        &self,
        invocation: &porch_api::invocation::Invocation,
    ) -> Result<porch_api::invocation::Outcome, InvokeError> {
        if invocation.operation == porch_api::invocation::Operation::Variant {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(porch_api::invocation::Outcome::none())
    }
}

#[tokio::test]
async fn a_change_to_an_injected_object_wakes_the_variants_naming_it() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let server = MockServer::start().await;
    let config_map = |name: &str, version: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "default", "resourceVersion": version},
               "data": {"region": "us-east1"}})
    };
    Mock::given(method("GET"))
        .and(path("/api/v1/configmaps"))
        .and(query_param_is_missing("watch"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "10"},
            "items": [config_map("unrelated", "9")]
        })))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v1/configmaps"))
        .and(query_param("watch", "true"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/json")
                .set_body_string(format!(
                    "{}\n",
                    json!({"type": "MODIFIED", "object": config_map("site-config", "11")})
                ))
                .set_delay(Duration::from_millis(50)),
        )
        .mount(&server)
        .await;
    let client = kube::Client::try_from(kube::Config::new(server.uri().parse().expect("uri")))
        .expect("client");

    let world = World::new();
    let counter = Arc::new(Variants::default());
    let relay = Arc::new(Relay::new(
        Arc::clone(&world.cluster),
        Arc::clone(&counter),
        RelayConfig::default(),
    ));
    relay.observe_variant(
        serde_json::from_value(json!({
            "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "PackageVariant",
            "metadata": {"name": "app-dev", "namespace": "default", "uid": "pv-uid", "resourceVersion": "3"},
            "spec": {"upstream": {"repo": "blueprints", "package": "app"},
                     "downstream": {"repo": "blueprints", "package": "app-dev"},
                     "injectors": [{"name": "site-config"},
                                   {"group": "hr.example.com", "version": "v1alpha1", "kind": "Team", "name": "beta"}]}
        }))
        .expect("a PackageVariant"),
    );
    relay.drain().await;
    let runs = || counter.0.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(runs(), 1);
    assert_eq!(
        relay.injectable_kinds().into_iter().collect::<Vec<_>>(),
        [
            ("hr.example.com/v1alpha1".to_owned(), "Team".to_owned()),
            ("v1".to_owned(), "ConfigMap".to_owned())
        ]
    );
    // an object no injector names wakes nothing
    relay.observe_injectable("ConfigMap", "default", "unrelated");
    relay.observe_injectable("ConfigMap", "other", "site-config");
    assert_eq!(relay.queue_depth(), 0);

    let watching = tokio::spawn(porch_relay::watch::injectables(
        Arc::clone(&relay),
        client,
        "v1".into(),
        "ConfigMap".into(),
        None,
    ));
    for _ in 0..200 {
        if relay.queue_depth() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watching.abort();
    relay.drain().await;
    assert_eq!(runs(), 2, "the watched change reconciled the variant again");
}
