//! What a Repository's status says after its syncs: `Ready` with the
//! package count and branch head after a full sync, `Ready=False/Error`
//! when git cannot be read, and `PackageRevisionSyncComplete` when some
//! PackageRevisions could not be written while the others were.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use porch_api::invocation::{Apply, EventRecord, ObjectPatch, ObjectRef};
use porch_relay::cluster::{Cluster, ClusterError, Written};
use porch_relay::invoker::InProcess;
use porch_relay::memory::Objects;
use porch_relay::relay::{Relay, RelayConfig, SYNC_COMPLETE};
use serde_json::Value;

use crate::support::{World, git};

/// The memory cluster, with an admission webhook that refuses the
/// objects named in `refused`.
struct Refusing {
    objects: Arc<Mutex<Objects>>,
    refused: Mutex<BTreeSet<String>>,
}

impl Cluster for Refusing {
    async fn get(&self, target: &ObjectRef) -> Result<Option<Value>, ClusterError> {
        self.objects.get(target).await
    }
    async fn patch(&self, patch: &ObjectPatch) -> Result<Written, ClusterError> {
        self.objects.patch(patch).await
    }
    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
    ) -> Result<Vec<Value>, ClusterError> {
        self.objects.list(api_version, kind, namespace).await
    }
    async fn apply(&self, apply: &Apply) -> Result<Written, ClusterError> {
        let name = apply.object["metadata"]["name"].as_str().unwrap_or("");
        if self.refused.lock().expect("lock").contains(name) {
            return Err(ClusterError(format!(
                "admission webhook \"validate.porch.kpt.dev\" denied the request: {name} is not allowed"
            )));
        }
        self.objects.apply(apply).await
    }
    async fn delete(&self, target: &ObjectRef) -> Result<(), ClusterError> {
        self.objects.delete(target).await
    }
    async fn record(&self, event: &EventRecord) -> Result<(), ClusterError> {
        self.objects.record(event).await
    }
}

/// Publishes packages straight into the world's git repository.
fn publish_in_git(world: &World, packages: &[&str]) {
    let root = world.bare.parent().expect("root");
    git(
        root,
        &["clone", "-q", world.bare.to_str().expect("utf-8"), "work"],
    );
    let work = root.join("work");
    let run = |args: &[&str]| {
        let mut all = vec!["-c", "user.name=t", "-c", "user.email=t@example.com"];
        all.extend_from_slice(args);
        git(&work, &all);
    };
    for package in packages {
        std::fs::create_dir_all(work.join(package)).expect("dir");
        std::fs::write(
            work.join(package).join("Kptfile"),
            format!("apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: {package}\n"),
        )
        .expect("Kptfile");
        run(&["add", "."]);
        run(&["commit", "-q", "-m", package]);
        run(&["tag", &format!("{package}/v1")]);
    }
    run(&["push", "-q", "--tags", "origin", "HEAD:main"]);
}

fn repository_status(objects: &Arc<Mutex<Objects>>) -> Value {
    objects
        .lock()
        .expect("lock")
        .repositories
        .get("default/blueprints")
        .map(|r| r["status"].clone())
        .unwrap_or_default()
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_sync_reports_ready_counts_and_partial_failures_on_the_repository() {
    let world = World::new();
    publish_in_git(&world, &["shop", "cart"]);
    let cluster = Arc::new(Refusing {
        objects: Arc::clone(&world.cluster),
        refused: Mutex::new(BTreeSet::from(["blueprints.cart.v1".to_owned()])),
    });
    let relay = Relay::new(
        Arc::clone(&cluster),
        Arc::new(InProcess::new(Arc::clone(&world.runner))),
        RelayConfig::default(),
    );
    relay.observe_repository(world.repository.clone());
    relay.drain().await;

    let status = repository_status(&world.cluster);
    let ready = condition(&status, "Ready");
    assert_eq!(ready["status"], "True", "{status}");
    assert_eq!(ready["reason"], "Ready");
    assert_eq!(ready["message"], "Repository Ready");
    // two published revisions and the main-branch placeholders
    assert_eq!(status["packageCount"], 4, "{status}");
    assert_eq!(
        status["gitCommitHash"],
        git(&world.bare, &["rev-parse", "main"]).trim()
    );
    assert!(status["lastFullSyncTime"].is_string(), "{status}");
    let partial = condition(&status, SYNC_COMPLETE);
    assert_eq!(partial["status"], "False", "{status}");
    assert_eq!(partial["reason"], "PartialFailure");
    let message = partial["message"].as_str().unwrap_or("");
    assert!(
        message.contains("default/blueprints.cart.v1")
            && message.contains("denied the request")
            && !message.contains("shop"),
        "{message}"
    );
    // the refused object held nothing else back
    let names: Vec<String> = world
        .cluster
        .lock()
        .expect("lock")
        .typed("default")
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(
        names.contains(&"blueprints.shop.v1".to_owned()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"blueprints.cart.v1".to_owned()),
        "{names:?}"
    );

    // the webhook lets it through: the next sync completes, and Ready,
    // which stayed True, keeps its transition time
    cluster.refused.lock().expect("lock").clear();
    relay.request_sync("default", "blueprints");
    relay.drain().await;
    let after = repository_status(&world.cluster);
    let complete = condition(&after, SYNC_COMPLETE);
    assert_eq!(complete["status"], "True", "{after}");
    assert_eq!(complete["reason"], "Synced");
    assert_eq!(
        condition(&after, "Ready")["lastTransitionTime"],
        ready["lastTransitionTime"]
    );
    assert!(
        world
            .cluster
            .lock()
            .expect("lock")
            .get("default", "blueprints.cart.v1")
            .is_some()
    );
}

#[tokio::test]
async fn a_repository_git_cannot_read_is_not_ready_with_the_reason() {
    let world = World::new();
    let mut repository = world.repository.clone();
    let missing = world.bare.with_file_name("missing.git");
    if let Some(git) = repository.spec.git.as_mut() {
        git.repo = missing.display().to_string();
    }
    let relay = Relay::new(
        Arc::clone(&world.cluster),
        Arc::new(InProcess::new(Arc::clone(&world.runner))),
        RelayConfig::default(),
    );
    relay.observe_repository(repository);
    relay.drain().await;
    let status = repository_status(&world.cluster);
    let ready = condition(&status, "Ready");
    assert_eq!(ready["status"], "False", "{status}");
    assert_eq!(ready["reason"], "Error");
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("missing.git")),
        "{status}"
    );
    // the sync is retried sooner than the interval, and the same failure
    // again writes nothing new
    let version = world.cluster.lock().expect("lock").repositories["default/blueprints"]
        ["metadata"]["resourceVersion"]
        .clone();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    relay.drain().await;
    assert!(relay.stats.syncs.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    assert_eq!(
        world.cluster.lock().expect("lock").repositories["default/blueprints"]["metadata"]["resourceVersion"],
        version
    );
}
