//! The relay as it runs in a cluster, against a mock API server that keeps
//! state: kube-runtime watches list the objects, the kube-rs cluster writes
//! JSON patches, server-side applies and Events over HTTP, the in-process
//! handlers do the git work on a real repository. The mock keeps its
//! objects in the memory cluster, so it answers patches as kube-apiserver
//! does (a failed `test` is a 422).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use porch_api::invocation::{Apply, ObjectPatch, ObjectRef, Subresource};
use porch_relay::cluster::Written;
use porch_relay::invoker::InProcess;
use porch_relay::kube::KubeCluster;
use porch_relay::memory::Objects;
use porch_relay::relay::{Relay, RelayConfig};
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::support::{World, condition, git, typed};

/// kube-apiserver in front of a memory cluster, for PackageRevisions and
/// one Repository.
struct FakeApiServer {
    objects: Arc<Mutex<Objects>>,
    repository: Value,
    /// Status patches answered 422 before being looked at, to show the
    /// relay re-reads and re-plans.
    conflicts: std::sync::atomic::AtomicUsize,
    /// `<fieldManager> force=<force>` of each apply to a Repository status.
    repository_applies: Arc<Mutex<Vec<String>>>,
}

fn status(code: u16, reason: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(code).set_body_json(json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code
    }))
}

impl FakeApiServer {
    fn written(written: Written) -> ResponseTemplate {
        match written {
            Written::Applied(object) => ResponseTemplate::new(200).set_body_json(object),
            Written::Conflict(message) => status(
                422,
                "Invalid",
                &format!(
                    "PackageRevision.porch.kpt.dev is invalid: patch: Invalid value: \"...\": testing value /metadata/resourceVersion failed: {message}"
                ),
            ),
            Written::Missing => status(404, "NotFound", "not found"),
        }
    }
}

impl wiremock::Respond for FakeApiServer {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let path = request.url.path().to_owned();
        let watch = request
            .url
            .query_pairs()
            .any(|(k, v)| k == "watch" && v == "true");
        let method = request.method.as_str().to_owned();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let mut objects = self.objects.lock().expect("lock");
        match (method.as_str(), segments.as_slice()) {
            // watches: nothing new (the relay reads its own writes back);
            // the stream ends after a while and is resumed
            ("GET", _) if watch => ResponseTemplate::new(200)
                .insert_header("content-type", "application/json")
                .set_body_string("")
                .set_delay(Duration::from_millis(300)),
            ("GET", ["apis", "porch.kpt.dev", "v1alpha2", "packagerevisions"]) => {
                let items: Vec<Value> = objects.package_revisions.values().cloned().collect();
                ResponseTemplate::new(200).set_body_json(json!({
                    "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevisionList",
                    "metadata": {"resourceVersion": objects.resource_version.to_string()},
                    "items": items
                }))
            }
            ("GET", ["apis", "config.porch.kpt.dev", "v1alpha1", "repositories"]) => {
                ResponseTemplate::new(200).set_body_json(json!({
                    "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "RepositoryList",
                    "metadata": {"resourceVersion": "1"},
                    "items": [self.repository]
                }))
            }
            (
                "GET",
                [
                    "apis",
                    "porch.kpt.dev",
                    "v1alpha2",
                    "namespaces",
                    ns,
                    "packagerevisions",
                    name,
                ],
            ) => match objects.get(ns, name) {
                Some(object) => ResponseTemplate::new(200).set_body_json(object),
                None => status(404, "NotFound", "not found"),
            },
            (
                "PATCH",
                [
                    "apis",
                    "porch.kpt.dev",
                    "v1alpha2",
                    "namespaces",
                    ns,
                    "packagerevisions",
                    name,
                    rest @ ..,
                ],
            ) => {
                let subresource = if rest == ["status"] {
                    Subresource::Status
                } else {
                    Subresource::Main
                };
                let content_type = request
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let target = ObjectRef {
                    api_version: "porch.kpt.dev/v1alpha2".into(),
                    kind: "PackageRevision".into(),
                    namespace: (*ns).to_owned(),
                    name: (*name).to_owned(),
                    uid: String::new(),
                };
                if content_type == "application/json-patch+json" {
                    if subresource == Subresource::Status
                        && self
                            .conflicts
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok()
                    {
                        return Self::written(Written::Conflict("test failed".into()));
                    }
                    let Ok(patch) = serde_json::from_slice(&request.body) else {
                        return status(400, "BadRequest", "not a JSON patch");
                    };
                    Self::written(objects.patch(&ObjectPatch {
                        target,
                        subresource,
                        patch,
                    }))
                } else if content_type == "application/apply-patch+yaml" {
                    let Ok(object) = serde_json::from_slice(&request.body) else {
                        return status(400, "BadRequest", "not an object");
                    };
                    let query = |key: &str| {
                        request
                            .url
                            .query_pairs()
                            .find(|(k, _)| k == key)
                            .map(|(_, v)| v.into_owned())
                    };
                    Self::written(objects.server_side_apply(&Apply {
                        field_manager: query("fieldManager").unwrap_or_default(),
                        force: query("force").as_deref() == Some("true"),
                        subresource,
                        object,
                    }))
                } else {
                    status(415, "UnsupportedMediaType", content_type)
                }
            }
            (
                "PATCH",
                [
                    "apis",
                    "config.porch.kpt.dev",
                    "v1alpha1",
                    "namespaces",
                    _,
                    "repositories",
                    _,
                    "status",
                ],
            ) => {
                let query = |key: &str| {
                    request
                        .url
                        .query_pairs()
                        .find(|(k, _)| k == key)
                        .map(|(_, v)| v.into_owned())
                };
                let Ok(object) = serde_json::from_slice::<Value>(&request.body) else {
                    return status(400, "BadRequest", "not an object");
                };
                if object["kind"] != "Repository" {
                    return status(400, "BadRequest", "kind must be Repository");
                }
                let manager = query("fieldManager").unwrap_or_default();
                let force = query("force").as_deref() == Some("true");
                self.repository_applies
                    .lock()
                    .expect("lock")
                    .push(format!("{manager} force={force}"));
                Self::written(objects.server_side_apply(&Apply {
                    field_manager: manager,
                    force,
                    subresource: Subresource::Status,
                    object,
                }))
            }
            (
                "GET",
                [
                    "apis",
                    "config.porch.kpt.dev",
                    "v1alpha1",
                    "packagevariants",
                ],
            ) => {
                let items: Vec<Value> = objects
                    .others
                    .iter()
                    .filter(|(k, _)| k.starts_with("PackageVariant/"))
                    .map(|(_, v)| v.clone())
                    .collect();
                ResponseTemplate::new(200).set_body_json(json!({
                    "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "PackageVariantList",
                    "metadata": {"resourceVersion": objects.resource_version.to_string()},
                    "items": items
                }))
            }
            (
                "GET",
                [
                    "apis",
                    "config.porch.kpt.dev",
                    "v1alpha1",
                    "namespaces",
                    ns,
                    "packagevariants",
                    name,
                ],
            ) => match objects.object("PackageVariant", ns, name) {
                Some(object) => ResponseTemplate::new(200).set_body_json(object),
                None => status(404, "NotFound", "not found"),
            },
            (
                "PATCH",
                [
                    "apis",
                    "config.porch.kpt.dev",
                    "v1alpha1",
                    "namespaces",
                    ns,
                    "packagevariants",
                    name,
                    rest @ ..,
                ],
            ) => {
                let Ok(patch) = serde_json::from_slice(&request.body) else {
                    return status(400, "BadRequest", "not a JSON patch");
                };
                Self::written(objects.patch(&ObjectPatch {
                    target: ObjectRef {
                        api_version: "config.porch.kpt.dev/v1alpha1".into(),
                        kind: "PackageVariant".into(),
                        namespace: (*ns).to_owned(),
                        name: (*name).to_owned(),
                        uid: String::new(),
                    },
                    subresource: if rest == ["status"] {
                        Subresource::Status
                    } else {
                        Subresource::Main
                    },
                    patch,
                }))
            }
            (
                "DELETE",
                [
                    "apis",
                    "porch.kpt.dev",
                    "v1alpha2",
                    "namespaces",
                    ns,
                    "packagerevisions",
                    name,
                ],
            ) => match objects.delete(ns, name) {
                Ok(()) => ResponseTemplate::new(200).set_body_json(
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                ),
                Err(_) => status(404, "NotFound", "not found"),
            },
            ("POST", ["apis", "events.k8s.io", "v1", "namespaces", _, "events"]) => {
                ResponseTemplate::new(201).set_body_bytes(request.body.clone())
            }
            _ => status(404, "NotFound", &format!("{method} {path}")),
        }
    }
}

#[tokio::test]
async fn a_draft_created_in_the_api_is_sourced_rendered_and_ready_over_http() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let world = World::new();
    world.create_draft("app");
    let server = MockServer::start().await;
    let repository_applies = Arc::new(Mutex::new(Vec::new()));
    Mock::given(wiremock::matchers::any())
        .respond_with(FakeApiServer {
            objects: Arc::clone(&world.cluster),
            repository: {
                let mut repository = serde_json::to_value(&world.repository).expect("json");
                repository["metadata"]["resourceVersion"] = json!("1");
                repository
            },
            conflicts: std::sync::atomic::AtomicUsize::new(1),
            repository_applies: Arc::clone(&repository_applies),
        })
        .mount(&server)
        .await;
    let client = kube::Client::try_from(kube::Config::new(server.uri().parse().expect("uri")))
        .expect("client");
    let relay = Arc::new(Relay::new(
        Arc::new(KubeCluster::new(client.clone())),
        Arc::new(InProcess::new(Arc::clone(&world.runner))),
        RelayConfig::default(),
    ));
    let listed = [
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    ];
    let watches = [
        tokio::spawn(porch_relay::watch::revisions(
            Arc::clone(&relay),
            kube::Api::all(client.clone()),
            Arc::clone(&listed[0]),
        )),
        tokio::spawn(porch_relay::watch::repositories(
            Arc::clone(&relay),
            kube::Api::all(client.clone()),
            Arc::clone(&listed[1]),
        )),
    ];
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Arc::clone(&relay).run(async {
        let _ = stopped.await;
    }));

    let repository_status = || {
        world
            .cluster
            .lock()
            .expect("lock")
            .repositories
            .get("default/blueprints")
            .map(|r| r["status"].clone())
            .unwrap_or_default()
    };
    let synced = || {
        let conditions = repository_status()["conditions"].clone();
        ["Ready", "PackageRevisionSyncComplete"].iter().all(|t| {
            conditions
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == *t && c["status"] == "True")
        })
    };
    let ready = || {
        synced()
            && world.object("blueprints.app.v1").is_some_and(|pr| {
                condition(&pr, "Rendered") == "True/Rendered"
                    && condition(&pr, "Ready").starts_with("True/")
            })
    };
    for _ in 0..2400 {
        if ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // the injected 422 made the relay read the object again, not overwrite
    // it (later conflicts may come from the user's edits below)
    let conflicts = relay.stats.conflicts.load(Ordering::Relaxed);
    // a user proposes and an approver publishes: the lifecycle handler's
    // patches (status, the latest-revision label) go over HTTP too
    if ready() {
        let latest = || {
            world.object("blueprints.app.v1").is_some_and(|pr| {
                pr.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(porch_api::LATEST_REVISION_LABEL))
                    .is_some_and(|v| v == "true")
            })
        };
        let proposed = || git(&world.bare, &["branch", "--list"]).contains("proposed/app/v1");
        relay.observe_revision(world.edit("blueprints.app.v1", |o| {
            o["spec"]["lifecycle"] = json!("Proposed");
        }));
        for _ in 0..2400 {
            if proposed() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        relay.observe_revision(world.edit("blueprints.app.v1", |o| {
            o["spec"]["lifecycle"] = json!("Published");
            o["metadata"]["annotations"] =
                json!({(porch_api::APPROVED_BY_ANNOTATION): "alice@example.com"});
        }));
        for _ in 0..2400 {
            if latest() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    let _ = stop.send(());
    running.await.expect("the relay stops");
    for watch in watches {
        watch.abort();
    }
    assert!(
        listed.iter().all(|l| l.load(Ordering::SeqCst)),
        "both lists done"
    );
    assert!(
        ready(),
        "sourced, rendered and ready: {:?}",
        world.object("blueprints.app.v1")
    );
    assert_eq!(conflicts, 1);
    let pr = typed(
        world
            .cluster
            .lock()
            .expect("lock")
            .get("default", "blueprints.app.v1")
            .expect("object"),
    );
    assert!(
        pr.metadata.owner_references.as_ref().is_some_and(|o| o
            .iter()
            .any(|r| r.kind == "Repository" && r.uid == "repo-uid")),
        "adopted over HTTP"
    );
    // published over HTTP: the tag, the approver, the latest-revision label
    assert_eq!(git(&world.bare, &["tag", "--list"]).trim(), "app/v1");
    assert_eq!(pr.status.as_ref().and_then(|s| s.revision), Some(1));
    assert_eq!(
        pr.status.as_ref().map(|s| s.published_by.as_str()),
        Some("alice@example.com")
    );
    assert_eq!(
        pr.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(porch_api::LATEST_REVISION_LABEL))
            .map(String::as_str),
        Some("true")
    );
    crate::support::assert_no_commit_twice(&world.bare, "app/v1");
    // the sync's status went to the Repository's status subresource: Ready
    // by the repository controller's manager, the sync-complete condition
    // by the relay's
    assert_eq!(
        *repository_applies.lock().expect("lock"),
        ["repository-controller force=true", "porch-relay force=true"],
        "{}",
        repository_status()
    );
    assert!(repository_status()["gitCommitHash"].is_string());
}

#[tokio::test]
async fn a_variant_in_the_api_gets_its_downstream_over_http() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let world = World::new();
    // a published blueprint, and a variant of it, as the API server holds them
    {
        let relay = Relay::new(
            Arc::clone(&world.cluster),
            Arc::new(InProcess::new(Arc::clone(&world.runner))),
            RelayConfig::default(),
        );
        relay.observe_repository(world.repository.clone());
        relay.observe_revision(world.create_draft("app"));
        relay.drain().await;
        crate::support::publish(&world, &relay, "blueprints.app.v1").await;
    }
    world
        .cluster
        .lock()
        .expect("lock")
        .create_object(json!({
            "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "PackageVariant",
            "metadata": {"name": "app-dev", "namespace": "default"},
            "spec": {"upstream": {"repo": "blueprints", "package": "app"},
                     "downstream": {"repo": "blueprints", "package": "app-dev"},
                     "packageContext": {"data": {"env": "dev"}}}
        }))
        .expect("created");
    let server = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(FakeApiServer {
            objects: Arc::clone(&world.cluster),
            repository: {
                let mut repository = serde_json::to_value(&world.repository).expect("json");
                repository["metadata"]["resourceVersion"] = json!("1");
                repository
            },
            conflicts: std::sync::atomic::AtomicUsize::new(0),
            repository_applies: Arc::new(Mutex::new(Vec::new())),
        })
        .mount(&server)
        .await;
    let client = kube::Client::try_from(kube::Config::new(server.uri().parse().expect("uri")))
        .expect("client");
    let relay = Arc::new(Relay::new(
        Arc::new(KubeCluster::new(client.clone())),
        Arc::new(InProcess::new(Arc::clone(&world.runner))),
        RelayConfig::default(),
    ));
    let listed: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let watches = [
        tokio::spawn(porch_relay::watch::revisions(
            Arc::clone(&relay),
            kube::Api::all(client.clone()),
            Arc::clone(&listed[0]),
        )),
        tokio::spawn(porch_relay::watch::repositories(
            Arc::clone(&relay),
            kube::Api::all(client.clone()),
            Arc::clone(&listed[1]),
        )),
        tokio::spawn(porch_relay::watch::variants(
            Arc::clone(&relay),
            kube::Api::all(client.clone()),
            Arc::clone(&listed[2]),
        )),
    ];
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Arc::clone(&relay).run(async {
        let _ = stopped.await;
    }));
    let draft = "blueprints.app-dev.packagevariant-1";
    let done = || {
        let rendered = world
            .object(draft)
            .is_some_and(|pr| condition(&pr, "Rendered") == "True/Rendered");
        let variant_ready = world
            .cluster
            .lock()
            .expect("lock")
            .object("PackageVariant", "default", "app-dev")
            .is_some_and(|pv| {
                pv["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        // the variant's mutation committed (after the draft's source ran)
        let mutated = std::process::Command::new("git")
            .args([
                "show",
                "drafts/app-dev/packagevariant-1:app-dev/package-context.yaml",
            ])
            .current_dir(&world.bare)
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("env: dev"));
        rendered && variant_ready && mutated
    };
    for _ in 0..2400 {
        if done() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let _ = stop.send(());
    running.await.expect("the relay stops");
    for watch in watches {
        watch.abort();
    }
    assert!(done(), "{:?}", world.object(draft));
    // the variant's finalizer and status went over HTTP as JSON patches,
    // its downstream as a server-side apply
    let pv = world
        .cluster
        .lock()
        .expect("lock")
        .object("PackageVariant", "default", "app-dev")
        .cloned()
        .expect("the variant");
    assert_eq!(
        pv["metadata"]["finalizers"],
        json!(["config.porch.kpt.dev/packagevariants"])
    );
    assert_eq!(pv["status"]["downstreamTargets"], json!([{"name": draft}]));
    let context = git(
        &world.bare,
        &[
            "show",
            "drafts/app-dev/packagevariant-1:app-dev/package-context.yaml",
        ],
    );
    assert!(context.contains("env: dev"), "{context}");
}
