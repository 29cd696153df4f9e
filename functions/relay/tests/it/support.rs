//! A cluster in memory with a Repository and a bare git repository behind
//! it, and the in-process handlers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_engine::runner::Runner;
use porch_git::store::LocalDirStore;
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::runtime::Runtimes;
use porch_relay::memory::Objects;
use serde_json::json;

pub(crate) struct World {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) bare: PathBuf,
    pub(crate) cluster: Arc<Mutex<Objects>>,
    pub(crate) repository: Repository,
    pub(crate) runner: Arc<Runner<LocalDirStore>>,
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl World {
    pub(crate) fn new() -> Self {
        trace_logs();
        let dir = tempfile::tempdir().expect("tmp");
        git(
            dir.path(),
            &["init", "--bare", "-q", "-b", "main", "repo.git"],
        );
        let bare = dir.path().join("repo.git");
        let repository: Repository = serde_json::from_value(json!({
            "apiVersion": "config.porch.kpt.dev/v1alpha1",
            "kind": "Repository",
            "metadata": {"name": "blueprints", "namespace": "default", "uid": "repo-uid"},
            "spec": {"type": "git", "git": {"repo": bare.display().to_string(), "branch": "main"}}
        }))
        .expect("a repository");
        let functions = Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog())));
        let runner = Arc::new(
            Runner::new(dir.path().join("cache"), functions)
                .with_store(LocalDirStore::new(dir.path().join("store"))),
        );
        World {
            _dir: dir,
            bare,
            cluster: Arc::new(Mutex::new(Objects::default())),
            repository,
            runner,
        }
    }

    /// Creates a draft of `package` with an init source, as the API server
    /// and the mutating webhook would; returns it.
    pub(crate) fn create_draft(&self, package: &str) -> PackageRevision {
        let name = format!("blueprints.{package}.v1");
        let mut objects = self.cluster.lock().expect("lock");
        objects
            .create(json!({
                "apiVersion": "porch.kpt.dev/v1alpha2",
                "kind": "PackageRevision",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"packageName": package, "repository": "blueprints", "workspaceName": "v1",
                         "lifecycle": "Draft", "source": {"init": {"description": "demo"}}}
            }))
            .expect("created");
        typed(objects.get("default", &name).expect("stored"))
    }

    pub(crate) fn object(&self, name: &str) -> Option<PackageRevision> {
        self.cluster
            .lock()
            .expect("lock")
            .get("default", name)
            .map(typed)
    }

    /// Changes an object as a user would (a new resourceVersion; a new
    /// generation when the spec changed); returns it.
    pub(crate) fn edit(
        &self,
        name: &str,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> PackageRevision {
        let mut objects = self.cluster.lock().expect("lock");
        objects.update("default", name, edit).expect("updated");
        typed(objects.get("default", name).expect("stored"))
    }
}

pub(crate) fn typed(value: &serde_json::Value) -> PackageRevision {
    serde_json::from_value(value.clone()).expect("a PackageRevision")
}

pub(crate) fn condition(pr: &PackageRevision, type_: &str) -> String {
    pr.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| format!("{}/{}", c.status, c.reason))
        .unwrap_or_default()
}

/// Asserts that no commit of `branch` repeats its parent's subject: a
/// handler that ran twice did its work once.
pub(crate) fn assert_no_commit_twice(bare: &Path, branch: &str) {
    let subjects = git(bare, &["log", "--format=%s", branch]);
    let lines: Vec<&str> = subjects.lines().collect();
    let mut unique = lines.clone();
    unique.dedup();
    assert_eq!(lines, unique, "no commit twice: {subjects}");
}

/// Takes `name` from Draft to Published through `relay`, as a user who
/// proposes and an approver would.
pub(crate) async fn publish<C, I>(
    world: &World,
    relay: &porch_relay::relay::Relay<C, I>,
    name: &str,
) where
    C: porch_relay::cluster::Cluster + 'static,
    I: porch_relay::invoker::Invoker + 'static,
{
    let proposed = world.edit(name, |o| o["spec"]["lifecycle"] = json!("Proposed"));
    relay.observe_revision(proposed);
    relay.drain().await;
    let approved = world.edit(name, |o| {
        o["spec"]["lifecycle"] = json!("Published");
        o["metadata"]["annotations"] =
            json!({(porch_api::APPROVED_BY_ANNOTATION): "alice@example.com"});
    });
    relay.observe_revision(approved);
    relay.drain().await;
}

/// A server process the test started; stopped when dropped.
pub(crate) struct Child(pub(crate) std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A git smart-HTTP server (`git http-backend`, pushes allowed) over the
/// bare repositories in a directory; stopped when dropped.
pub(crate) struct GitServer {
    child: std::process::Child,
    /// `http://127.0.0.1:<port>`: a repository `<name>.git` is at
    /// `<base>/<name>.git`.
    pub(crate) base: String,
}

impl Drop for GitServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GitServer {
    /// Serves `root`'s `*.git` repositories (each is made to accept pushes).
    pub(crate) fn start(root: &Path) -> Self {
        for entry in std::fs::read_dir(root).expect("root").flatten() {
            if entry.file_name().to_string_lossy().ends_with(".git") {
                git(&entry.path(), &["config", "http.receivepack", "true"]);
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/git/tests/servers/git_http_server.py");
        let child = Command::new("python3")
            .arg(script)
            .arg(root)
            .arg(port.to_string())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 runs");
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        GitServer {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }
}

/// Creates `blueprints.app.<workspace>`, a copy of `blueprints.app.<from>`,
/// and publishes it through `relay`.
pub(crate) async fn publish_copy<C, I>(
    world: &World,
    relay: &porch_relay::relay::Relay<C, I>,
    from: &str,
    workspace: &str,
) where
    C: porch_relay::cluster::Cluster + 'static,
    I: porch_relay::invoker::Invoker + 'static,
{
    let name = format!("blueprints.app.{workspace}");
    let copy = {
        let mut objects = world.cluster.lock().expect("lock");
        objects
            .create(json!({
                "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"packageName": "app", "repository": "blueprints", "workspaceName": workspace,
                         "lifecycle": "Draft", "source": {"copyFrom": {"name": format!("blueprints.app.{from}")}}}
            }))
            .expect("created");
        typed(objects.get("default", &name).expect("stored"))
    };
    relay.observe_revision(copy);
    relay.drain().await;
    publish(world, relay, &name).await;
}

/// Sends the test's log lines, at the level `PORCH_TEST_LOG` names (none
/// when unset), to the test's output: `.ci/secrets-in-logs` runs the tests
/// at trace level and searches that output for credential values.
pub(crate) fn trace_logs() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("PORCH_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
}
