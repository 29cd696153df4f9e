//! The local loop end to end: one `porch-handler` process per operation,
//! each behind its own Lambda Runtime API, the Lambda Invoke API in front
//! of them (what `cargo lambda watch` serves), and the relay driving a
//! draft to Published through its HTTP invoker, with real git underneath.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use porch_api::invocation::Invocation;
use porch_api::v1alpha2::PackageRevision;
use porch_relay::invoker::{InvokeError, Invoker, LambdaHttp};
use porch_relay::memory::Objects;
use porch_relay::relay::{Relay, RelayConfig};
use serde_json::json;

use crate::runtime_api::{RuntimeApi, invoke_api};
use crate::{Child, event, git, pointed};

const NAME: &str = "blueprints.app.v1";
pub(crate) const OPERATIONS: [&str; 8] = [
    "adopt",
    "source",
    "render",
    "lifecycle",
    "delete",
    "sync",
    "variant",
    "variant-set",
];

fn object(cluster: &Mutex<Objects>) -> PackageRevision {
    let objects = cluster.lock().expect("lock");
    serde_json::from_value(objects.get("default", NAME).expect("stored").clone())
        .expect("a PackageRevision")
}

fn condition(pr: &PackageRevision, type_: &str) -> String {
    pr.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| format!("{}/{}", c.status, c.reason))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_drives_a_draft_to_published_through_the_handler_binaries() {
    // what the relay's binary does first: the one rustls provider
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let tmp = tempfile::tempdir().expect("tmp");
    git(
        tmp.path(),
        &["init", "--bare", "-q", "-b", "main", "repo.git"],
    );
    let bare = tmp.path().join("repo.git");

    // each function its own process and its own /tmp, as on Lambda
    let mut functions = HashMap::new();
    let mut children = Vec::new();
    for operation in OPERATIONS {
        let (api, address) = RuntimeApi::start().await;
        let function = format!("porch-{operation}");
        children.push(Child(
            Command::new(env!("CARGO_BIN_EXE_porch-handler"))
                .env("PORCH_OPERATION", operation)
                .envs(RuntimeApi::env(address, &function))
                .env(
                    "PORCH_CACHE_DIR",
                    tmp.path().join(format!("tmp-{operation}")),
                )
                .env("PORCH_LOG", "warn")
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("porch-handler starts"),
        ));
        functions.insert(function, api);
    }
    let endpoint = format!("http://{}", invoke_api(functions).await);
    let invoker =
        Arc::new(LambdaHttp::new(&endpoint, "porch-", Duration::from_secs(60)).expect("invoker"));

    let cluster = Arc::new(Mutex::new(Objects::default()));
    let relay = Relay::new(
        Arc::clone(&cluster),
        Arc::clone(&invoker),
        RelayConfig::default(),
    );
    let repository = serde_json::from_value(json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository",
        "metadata": {"name": "blueprints", "namespace": "default", "uid": "repo-uid", "generation": 1},
        "spec": {"type": "git", "git": {"repo": bare.display().to_string(), "branch": "main"}}
    }))
    .expect("a Repository");
    relay.observe_repository(repository);
    cluster
        .lock()
        .expect("lock")
        .create(json!({
            "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
            "metadata": {"name": NAME, "namespace": "default"},
            "spec": {"packageName": "app", "repository": "blueprints", "workspaceName": "v1",
                     "lifecycle": "Draft", "source": {"init": {"description": "over HTTP"}}}
        }))
        .expect("created");
    relay.observe_revision(object(&cluster));
    tokio::time::timeout(Duration::from_secs(120), relay.drain())
        .await
        .expect("drained");
    let pr = object(&cluster);
    assert_eq!(
        pr.status.as_ref().map(|s| s.creation_source.as_str()),
        Some("init")
    );
    assert_eq!(condition(&pr, "Rendered"), "True/Rendered");
    assert!(condition(&pr, "Ready").starts_with("True/"), "{pr:?}");
    assert!(git(&bare, &["branch", "--list"]).contains("drafts/app/v1"));
    // the sync function wrote the Repository's status through the relay
    let repository_status =
        cluster.lock().expect("lock").repositories["default/blueprints"]["status"].clone();
    assert_eq!(repository_status["conditions"][0]["type"], "Ready");
    assert_eq!(repository_status["conditions"][0]["status"], "True");

    for (lifecycle, approver) in [("Proposed", None), ("Published", Some("alice@example.com"))] {
        cluster
            .lock()
            .expect("lock")
            .update("default", NAME, |o| {
                o["spec"]["lifecycle"] = json!(lifecycle);
                if let Some(approver) = approver {
                    o["metadata"]["annotations"] =
                        json!({(porch_api::APPROVED_BY_ANNOTATION): approver});
                }
            })
            .expect("updated");
        relay.observe_revision(object(&cluster));
        tokio::time::timeout(Duration::from_secs(120), relay.drain())
            .await
            .expect("drained");
    }
    assert_eq!(git(&bare, &["tag", "--list"]).trim(), "app/v1");
    let status = object(&cluster).status.expect("status");
    assert_eq!(status.revision, Some(1));
    assert_eq!(status.published_by, "alice@example.com");
    assert_eq!(
        relay
            .stats
            .retried
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );

    // a hostile Invocation is refused by the function, typed as such, and
    // writes nothing
    let mut hostile: Invocation =
        serde_json::from_value(pointed(event("source", "init.json"), &bare)).expect("event");
    if let Some(pr) = hostile.package_revision.as_mut() {
        pr.spec.package_name = "../escape".into();
    }
    let refs = git(&bare, &["for-each-ref"]);
    let err = invoker.invoke(&hostile).await.expect_err("refused");
    assert!(matches!(err, InvokeError::Invalid(_)), "{err:?}");
    assert_eq!(git(&bare, &["for-each-ref"]), refs);
    // a function that is not deployed is worth trying again later
    let missing = LambdaHttp::new(&endpoint, "absent-", Duration::from_secs(5)).expect("invoker");
    assert!(
        missing
            .invoke(&hostile)
            .await
            .expect_err("absent")
            .is_retryable()
    );
    drop(children);
}
