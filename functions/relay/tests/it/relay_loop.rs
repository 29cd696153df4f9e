//! The relay's loop: plan → invoke → apply → plan again, with real handlers
//! and git, and with scripted invokers for the failure paths.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use porch_api::invocation::{
    Apply, EventRecord, EventType, Invocation, ObjectPatch, ObjectRef, Operation, Outcome,
    Subresource,
};
use porch_relay::cluster::{Cluster, ClusterError, Written};
use porch_relay::invoker::{InProcess, InvokeError, Invoker};
use porch_relay::memory::Objects;
use porch_relay::relay::{Relay, RelayConfig};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::support::{World, condition, git};

const NAME: &str = "blueprints.app.v1";

/// An invoker that passes on and remembers the operations it ran.
struct Recording<I> {
    inner: I,
    operations: Mutex<Vec<Operation>>,
}

impl<I: Invoker> Recording<I> {
    fn new(inner: I) -> Self {
        Recording {
            inner,
            operations: Mutex::new(Vec::new()),
        }
    }

    /// The operations run on revisions since the last call (repository
    /// syncs left out).
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.operations.lock().expect("lock"))
            .into_iter()
            .filter(|o| *o != Operation::Sync)
            .map(|o| o.as_str())
            .collect()
    }
}

impl<I: Invoker> Invoker for Recording<I> {
    async fn invoke(&self, invocation: &Invocation) -> Result<Outcome, InvokeError> {
        self.operations
            .lock()
            .expect("lock")
            .push(invocation.operation);
        self.inner.invoke(invocation).await
    }
}

#[tokio::test]
async fn a_draft_is_sourced_rendered_proposed_and_published_through_the_relay() {
    let world = World::new();
    let invoker = Arc::new(Recording::new(InProcess::new(Arc::clone(&world.runner))));
    let relay = Relay::new(
        Arc::clone(&world.cluster),
        Arc::clone(&invoker),
        RelayConfig::default(),
    );
    relay.observe_repository(world.repository.clone());
    relay.observe_revision(world.create_draft("app"));
    relay.drain().await;
    // the draft's Ready comes from the lifecycle handler once rendered
    assert_eq!(
        invoker.take(),
        vec!["adopt", "source", "render", "lifecycle"]
    );
    let pr = world.object(NAME).expect("object");
    let status = pr.status.clone().expect("status");
    assert_eq!(status.creation_source, "init");
    assert_eq!(condition(&pr, "Rendered"), "True/Rendered");
    assert!(
        pr.metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|r| r.kind == "Repository")),
        "adopted"
    );
    assert!(git(&world.bare, &["branch", "--list"]).contains("drafts/app/v1"));
    // nothing more is due, and the relay knows it without a handler run
    assert_eq!(relay.drain().await, 0);

    let proposed = world.edit(NAME, |o| o["spec"]["lifecycle"] = json!("Proposed"));
    relay.observe_revision(proposed);
    relay.drain().await;
    assert_eq!(invoker.take(), vec!["lifecycle"]);
    let branches = git(&world.bare, &["branch", "--list"]);
    assert!(
        branches.contains("proposed/app/v1") && !branches.contains("drafts/app/v1"),
        "{branches}"
    );

    let approved = world.edit(NAME, |o| {
        o["spec"]["lifecycle"] = json!("Published");
        o["metadata"]["annotations"] =
            json!({(porch_api::APPROVED_BY_ANNOTATION): "alice@example.com"});
    });
    relay.observe_revision(approved);
    relay.drain().await;
    assert_eq!(invoker.take(), vec!["lifecycle"]);
    assert_eq!(git(&world.bare, &["tag", "--list"]).trim(), "app/v1");
    let pr = world.object(NAME).expect("object");
    let status = pr.status.clone().expect("status");
    assert_eq!(status.revision, Some(1));
    assert_eq!(status.published_by, "alice@example.com");
    assert_eq!(
        pr.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(porch_api::LATEST_REVISION_LABEL))
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(relay.drain().await, 0);

    // a draft deleted in the API: its branch goes, its finalizer is
    // released, and the delete handler runs once
    relay.observe_revision(world.create_draft("tmp"));
    relay.drain().await;
    invoker.take();
    assert!(git(&world.bare, &["branch", "--list"]).contains("drafts/tmp/v1"));
    world
        .cluster
        .lock()
        .expect("lock")
        .delete("default", "blueprints.tmp.v1")
        .expect("marked for deletion");
    relay.observe_revision(world.object("blueprints.tmp.v1").expect("terminating"));
    relay.drain().await;
    assert_eq!(invoker.take(), vec!["delete"]);
    assert!(
        world.object("blueprints.tmp.v1").is_none(),
        "gone from the API"
    );
    assert!(
        relay.revision("default", "blueprints.tmp.v1").is_none(),
        "and from the relay's view"
    );
    assert!(!git(&world.bare, &["branch", "--list"]).contains("drafts/tmp/v1"));
    assert_eq!(relay.stats.conflicts.load(Ordering::Relaxed), 0);
}

/// The memory cluster with another writer: before each of the first
/// `interfere` status patches, someone else changes the object.
struct Interfering {
    inner: Arc<Mutex<Objects>>,
    interfere: AtomicUsize,
}

impl Cluster for Interfering {
    async fn get(&self, target: &ObjectRef) -> Result<Option<Value>, ClusterError> {
        self.inner.get(target).await
    }

    async fn patch(&self, patch: &ObjectPatch) -> Result<Written, ClusterError> {
        if patch.subresource == Subresource::Status
            && self
                .interfere
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            let mut objects = self.inner.lock().expect("lock");
            objects
                .update(&patch.target.namespace, &patch.target.name, |o| {
                    o["metadata"]["labels"]["touched"] = json!("yes");
                })
                .expect("someone else writes");
        }
        self.inner.patch(patch).await
    }

    async fn apply(&self, apply: &Apply) -> Result<Written, ClusterError> {
        self.inner.apply(apply).await
    }

    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
    ) -> Result<Vec<Value>, ClusterError> {
        self.inner.list(api_version, kind, namespace).await
    }

    async fn delete(&self, target: &ObjectRef) -> Result<(), ClusterError> {
        self.inner.delete(target).await
    }

    async fn record(&self, event: &EventRecord) -> Result<(), ClusterError> {
        self.inner.record(event).await
    }
}

#[tokio::test]
async fn a_stale_patch_is_re_read_and_re_planned_without_a_second_commit() {
    let world = World::new();
    let cluster = Arc::new(Interfering {
        inner: Arc::clone(&world.cluster),
        interfere: AtomicUsize::new(1),
    });
    let relay = Relay::new(
        cluster,
        Arc::new(InProcess::new(Arc::clone(&world.runner))),
        RelayConfig::default(),
    );
    relay.observe_repository(world.repository.clone());
    world.create_draft("app");
    // adopted already, so the first status patch is the source's
    world.edit(NAME, |o| {
        o["metadata"]["ownerReferences"] = json!([{"apiVersion": "config.porch.kpt.dev/v1alpha1",
            "kind": "Repository", "name": "blueprints", "uid": "repo-uid"}]);
    });
    relay.observe_revision(world.object(NAME).expect("object"));
    let runs = relay.drain().await;
    assert_eq!(relay.stats.conflicts.load(Ordering::Relaxed), 1);
    // source (conflict), source again (recognises its commit), render,
    // lifecycle, and the repository's first sync
    assert_eq!(runs, 5);
    assert_eq!(relay.stats.syncs.load(Ordering::Relaxed), 1);
    let pr = world.object(NAME).expect("object");
    assert_eq!(
        pr.status.as_ref().map(|s| s.creation_source.as_str()),
        Some("init")
    );
    assert_eq!(
        pr.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("touched"))
            .map(String::as_str),
        Some("yes"),
        "the other writer's change is kept"
    );
    crate::support::assert_no_commit_twice(&world.bare, "drafts/app/v1");
}

/// An invoker that answers from a script and remembers what it got.
#[derive(Default)]
struct Scripted {
    answers: Mutex<Vec<Result<Outcome, InvokeError>>>,
    seen: Mutex<Vec<Invocation>>,
}

impl Invoker for Scripted {
    async fn invoke(&self, invocation: &Invocation) -> Result<Outcome, InvokeError> {
        if invocation.operation == Operation::Sync {
            // the repository's syncs find nothing
            return Ok(Outcome::none());
        }
        self.seen.lock().expect("lock").push(invocation.clone());
        let mut answers = self.answers.lock().expect("lock");
        if answers.is_empty() {
            Ok(Outcome::none())
        } else {
            answers.remove(0)
        }
    }
}

fn revision_invocations(invoker: &Scripted) -> usize {
    invoker
        .seen
        .lock()
        .expect("lock")
        .iter()
        .filter(|i| i.operation != Operation::Sync)
        .count()
}

fn quick() -> RelayConfig {
    RelayConfig {
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(40),
        ..RelayConfig::default()
    }
}

#[tokio::test]
async fn retryable_failures_are_redelivered_with_the_planned_time_and_the_next_attempt() {
    let world = World::new();
    let invoker = Arc::new(Scripted::default());
    *invoker.answers.lock().expect("lock") = vec![
        Err(InvokeError::Retryable("git: connection reset".into())),
        Err(InvokeError::Retryable("git: connection reset".into())),
    ];
    let relay = Relay::new(Arc::clone(&world.cluster), Arc::clone(&invoker), quick());
    relay.observe_repository(world.repository.clone());
    relay.observe_revision(world.create_draft("app"));
    for _ in 0..200 {
        relay.drain().await;
        if revision_invocations(&invoker) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen: Vec<Invocation> = invoker
        .seen
        .lock()
        .expect("lock")
        .iter()
        .filter(|i| i.operation != Operation::Sync)
        .cloned()
        .collect();
    assert_eq!(seen.len(), 3, "two failures, then the answer");
    assert_eq!(
        seen.iter().map(|i| i.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(seen.iter().all(|i| i.operation == Operation::Adopt));
    assert!(
        seen.iter()
            .all(|i| i.time.is_some() && i.time == seen[0].time)
    );
    assert!(seen.iter().all(|i| i.request_id == seen[0].request_id));
    assert_eq!(relay.stats.retried.load(Ordering::Relaxed), 2);
    // an answer that changes nothing settles the revision
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(relay.drain().await, 0);
}

#[tokio::test]
async fn an_invalid_invocation_is_reported_once_and_retried_only_after_a_change() {
    let world = World::new();
    let invoker = Arc::new(Scripted::default());
    *invoker.answers.lock().expect("lock") =
        vec![Err(InvokeError::Invalid("workspaceName: bad".into()))];
    let relay = Relay::new(Arc::clone(&world.cluster), Arc::clone(&invoker), quick());
    relay.observe_repository(world.repository.clone());
    let pr = world.create_draft("app");
    relay.observe_revision(pr.clone());
    relay.drain().await;
    assert_eq!(revision_invocations(&invoker), 1);
    {
        let objects = world.cluster.lock().expect("lock");
        assert_eq!(objects.events.len(), 1);
        let event = &objects.events[0];
        assert_eq!(
            (
                event.type_,
                event.reason.as_str(),
                event.regarding.name.as_str()
            ),
            (EventType::Warning, "InvocationRefused", NAME)
        );
        assert!(
            event.message.contains("workspaceName: bad"),
            "{}",
            event.message
        );
    }
    // the same version again: not delivered again
    relay.observe_revision(pr);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(relay.drain().await, 0);
    // a changed object is planned afresh
    let changed = world.edit(NAME, |o| o["metadata"]["labels"]["fixed"] = json!("yes"));
    relay.observe_revision(changed);
    assert_eq!(relay.drain().await, 1);
    assert_eq!(revision_invocations(&invoker), 2);
}

#[tokio::test]
async fn the_running_relay_serialises_a_repository_and_finishes_in_flight_work_on_shutdown() {
    let world = World::new();
    let relay = Arc::new(Relay::new(
        Arc::clone(&world.cluster),
        Arc::new(InProcess::new(Arc::clone(&world.runner))),
        RelayConfig::default(),
    ));
    relay.observe_repository(world.repository.clone());
    for package in ["a", "b", "c", "d"] {
        relay.observe_revision(world.create_draft(package));
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Arc::clone(&relay).run(async {
        let _ = stopped.await;
    }));
    let mut done = false;
    for _ in 0..400 {
        done = ["a", "b", "c", "d"].iter().all(|p| {
            world
                .object(&format!("blueprints.{p}.v1"))
                .is_some_and(|pr| {
                    condition(&pr, "Rendered") == "True/Rendered"
                        && condition(&pr, "Ready").starts_with("True/")
                })
        });
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let _ = stop.send(());
    running.await.expect("the relay stops");
    assert!(done, "every draft sourced, rendered and ready");
    let branches = git(&world.bare, &["branch", "--list"]);
    for package in ["a", "b", "c", "d"] {
        assert!(
            branches.contains(&format!("drafts/{package}/v1")),
            "{branches}"
        );
    }
    assert_eq!(relay.stats.conflicts.load(Ordering::Relaxed), 0);
    // one repository: no handler ever raced another on it, so no push
    // was retried by the mirror either (adopt, source, render, lifecycle
    // for each of the four)
    let stats = &relay.stats;
    assert_eq!(
        stats.invocations.load(Ordering::Relaxed) - stats.syncs.load(Ordering::Relaxed),
        16
    );
}

#[tokio::test]
async fn a_sync_brings_in_what_git_holds_and_removes_what_it_lost() {
    let world = World::new();
    let relay = Relay::new(
        Arc::clone(&world.cluster),
        Arc::new(InProcess::new(Arc::clone(&world.runner))),
        RelayConfig::default(),
    );
    // a package published straight into git, outside the API
    let work = world.bare.with_file_name("work");
    git(
        world.bare.parent().expect("root"),
        &["clone", "-q", world.bare.to_str().expect("utf-8"), "work"],
    );
    std::fs::create_dir_all(work.join("shop")).expect("dir");
    std::fs::write(
        work.join("shop/Kptfile"),
        "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: shop\n",
    )
    .expect("Kptfile");
    let commit = |args: &[&str]| {
        let mut all = vec!["-c", "user.name=t", "-c", "user.email=t@example.com"];
        all.extend_from_slice(args);
        git(&work, &all);
    };
    commit(&["add", "."]);
    commit(&["commit", "-q", "-m", "shop"]);
    commit(&["tag", "shop/v1"]);
    commit(&["push", "-q", "origin", "HEAD:main", "shop/v1"]);

    relay.observe_repository(world.repository.clone());
    relay.drain().await;
    let shop = |objects: &Objects| -> Vec<(String, Option<i64>)> {
        objects
            .typed("default")
            .into_iter()
            .filter(|p| p.spec.package_name == "shop")
            .map(|p| {
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    p.status.and_then(|s| s.revision),
                )
            })
            .collect()
    };
    let found = shop(&world.cluster.lock().expect("lock"));
    assert!(
        found.iter().any(|(_, revision)| *revision == Some(1)),
        "revision 1 of shop discovered: {found:?}"
    );

    // the tag goes in git: the next sync deletes the object (its finalizer
    // released by the delete handler, so nothing stays Terminating)
    git(&world.bare, &["tag", "-d", "shop/v1"]);
    // the same Repository again is no news; a sync is asked for
    relay.observe_repository(world.repository.clone());
    assert_eq!(relay.drain().await, 0);
    relay.request_sync("default", "blueprints");
    relay.drain().await;
    let left = shop(&world.cluster.lock().expect("lock"));
    assert!(
        !left.iter().any(|(_, revision)| *revision == Some(1)),
        "revision 1 of shop is gone: {left:?}"
    );
}
