//! A PackageVariantSet fanning one blueprint out to many downstream
//! packages across many repositories, through the relay with the handlers
//! in-process on real git (local bare repositories, snapshots in a local
//! directory): the time until every downstream draft exists (sourced in
//! git), and, once they are published, the time until a new blueprint
//! revision is an upgrade draft in every one of them. Baseline: the same
//! for a single variant (one target), to show the per-target cost as the
//! fan-out grows.
//!
//! `cargo bench -p porch-relay --bench variants` (knobs:
//! `PORCH_BENCH_REPOSITORIES` (100), `PORCH_BENCH_PACKAGES` per repository
//! (10)).
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use porch_engine::runner::Runner;
use porch_git::store::LocalDirStore;
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::runtime::Runtimes;
use porch_relay::invoker::InProcess;
use porch_relay::memory::Objects;
use porch_relay::relay::{Relay, RelayConfig};
use serde_json::{Value, json};

type FleetRelay = Relay<Mutex<Objects>, InProcess<LocalDirStore>>;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(args)
        .current_dir(dir)
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

struct Fleet {
    _dir: tempfile::TempDir,
    cluster: Arc<Mutex<Objects>>,
    relay: Arc<FleetRelay>,
}

fn repository(name: &str, path: &Path) -> Value {
    json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": "1", "labels": {"tier": "edge"}},
        "spec": {"type": "git", "git": {"repo": path.display().to_string(), "branch": "main"}}
    })
}

impl Fleet {
    fn new(repositories: usize) -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let functions = Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog())));
        let runner = Arc::new(
            Runner::new(dir.path().join("cache"), functions)
                .with_store(LocalDirStore::new(dir.path().join("store"))),
        );
        let cluster = Arc::new(Mutex::new(Objects::default()));
        let relay = Arc::new(Relay::new(
            Arc::clone(&cluster),
            Arc::new(InProcess::new(runner)),
            RelayConfig::default(),
        ));
        let mut names = vec!["blueprints".to_owned()];
        names.extend((0..repositories).map(|i| format!("edge{i}")));
        for name in &names {
            git(
                dir.path(),
                &["init", "--bare", "-q", "-b", "main", &format!("{name}.git")],
            );
            let path: PathBuf = dir.path().join(format!("{name}.git"));
            relay.observe_repository(
                serde_json::from_value(repository(name, &path)).expect("a Repository"),
            );
        }
        Fleet {
            _dir: dir,
            cluster,
            relay,
        }
    }

    fn observe(&self, name: &str) {
        let pr = self
            .cluster
            .lock()
            .expect("lock")
            .get("default", name)
            .cloned()
            .expect("stored");
        self.relay
            .observe_revision(serde_json::from_value(pr).expect("typed"));
    }

    fn edit(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        self.cluster
            .lock()
            .expect("lock")
            .update("default", name, edit)
            .expect("updated");
        self.observe(name);
    }

    async fn publish(&self, names: &[String]) {
        for name in names {
            self.edit(name, |o| o["spec"]["lifecycle"] = json!("Proposed"));
        }
        self.relay.drain().await;
        for name in names {
            self.edit(name, |o| {
                o["spec"]["lifecycle"] = json!("Published");
                o["metadata"]["annotations"] =
                    json!({(porch_api::APPROVED_BY_ANNOTATION): "alice@example.com"});
            });
        }
        self.relay.drain().await;
    }

    async fn blueprint(&self, workspace: &str, source: Value) {
        let name = format!("blueprints.app.{workspace}");
        self.cluster
            .lock()
            .expect("lock")
            .create(json!({
                "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"packageName": "app", "repository": "blueprints", "workspaceName": workspace,
                         "lifecycle": "Draft", "source": source}
            }))
            .expect("created");
        self.observe(&name);
        self.relay.drain().await;
        self.publish(&[name]).await;
    }

    /// Downstream revisions whose source ran as `kind` (read from the
    /// stored JSON: polling must not slow the relay down).
    fn sourced(&self, kind: &str) -> Vec<String> {
        self.cluster
            .lock()
            .expect("lock")
            .package_revisions
            .values()
            .filter(|p| {
                p["spec"]["repository"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("edge"))
                    && p["status"]["creationSource"] == kind
            })
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// Runs the relay (its concurrency, its per-repository order) until
    /// `count` downstreams are sourced as `kind`; the time it took. The
    /// work that follows (renders, the variants' no-op reconciles) is then
    /// drained, untimed.
    async fn run_until(&self, kind: &str, count: usize, started: Instant) -> Duration {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(Arc::clone(&self.relay).run(async {
            let _ = stopped.await;
        }));
        let elapsed = loop {
            if self.sourced(kind).len() >= count {
                break started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let _ = stop.send(());
        running.await.expect("the relay stops");
        self.relay.drain().await;
        elapsed
    }
}

/// Fan-out and rollout for `repositories` × `packages` targets.
async fn scenario(repositories: usize, packages: usize) -> (Duration, Duration) {
    let fleet = Fleet::new(repositories);
    fleet
        .blueprint("v1", json!({"init": {"description": "blueprint"}}))
        .await;
    let targets: Vec<Value> = (0..repositories)
        .map(|i| {
            json!({"name": format!("edge{i}"),
                   "packageNames": (0..packages).map(|p| format!("app{p}")).collect::<Vec<_>>()})
        })
        .collect();
    let set = fleet
        .cluster
        .lock()
        .expect("lock")
        .create_object(json!({
            "apiVersion": "config.porch.kpt.dev/v1alpha2", "kind": "PackageVariantSet",
            "metadata": {"name": "fleet", "namespace": "default"},
            "spec": {"upstream": {"repo": "blueprints", "package": "app", "workspaceName": "v1"},
                     "targets": [{"repositories": targets}]}
        }))
        .expect("created");
    let total = repositories * packages;
    let started = Instant::now();
    fleet
        .relay
        .observe_variant_set(serde_json::from_value(set).expect("typed"));
    let fan_out = fleet.run_until("clone", total, started).await;

    // every downstream published, then the blueprint moves to v2
    let drafts = fleet.sourced("clone");
    fleet.publish(&drafts).await;
    fleet
        .blueprint("v2", json!({"copyFrom": {"name": "blueprints.app.v1"}}))
        .await;
    let edited = fleet
        .cluster
        .lock()
        .expect("lock")
        .update_object("PackageVariantSet", "default", "fleet", |o| {
            o["spec"]["upstream"]["workspaceName"] = json!("v2");
        })
        .expect("updated")
        .expect("kept");
    let started = Instant::now();
    fleet
        .relay
        .observe_variant_set(serde_json::from_value(edited).expect("typed"));
    let rollout = fleet.run_until("upgrade", total, started).await;
    (fan_out, rollout)
}

fn main() {
    let repositories = env("PORCH_BENCH_REPOSITORIES", 100);
    let packages = env("PORCH_BENCH_PACKAGES", 10);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (single_fan_out, single_rollout) = scenario(1, 1).await;
        println!(
            "single variant: draft in {:.1} ms, upgrade draft in {:.1} ms",
            ms(single_fan_out),
            ms(single_rollout)
        );
        let total = repositories * packages;
        let (fan_out, rollout) = scenario(repositories, packages).await;
        println!(
            "set of {total} targets over {repositories} repositories: all drafts in {:.1} s ({:.1} ms per target, {:.2}x a single variant), all upgrade drafts in {:.1} s ({:.1} ms per target, {:.2}x a single variant)",
            fan_out.as_secs_f64(),
            ms(fan_out) / total as f64,
            ms(fan_out) / total as f64 / ms(single_fan_out),
            rollout.as_secs_f64(),
            ms(rollout) / total as f64,
            ms(rollout) / total as f64 / ms(single_rollout),
        );
    });
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
