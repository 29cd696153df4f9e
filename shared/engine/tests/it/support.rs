//! A bare repository with a draft, and Invocations for it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::invocation::{Invocation, Operation, Outcome, Subresource};
use porch_api::v1alpha1::{Task, TaskType};
use porch_api::v1alpha2::PackageRevision;
use porch_git::identity::Identity;
use porch_git::layout::RepoLayout;
use porch_git::mirror::{Mirror, RetryPolicy};
use porch_git::operations::{Actor, Packages};
use porch_git::remote::LocalRemote;
use porch_git::repo::GitRepo;

#[path = "../../../git/tests/servers/announced.rs"]
mod announced;

pub(crate) type Files = BTreeMap<String, Vec<u8>>;

pub(crate) fn package(pipeline: &str) -> Files {
    [
        (
            "Kptfile",
            format!("apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: app\npipeline:\n  mutators:\n{pipeline}"),
        ),
        (
            "cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm # keep\ndata:\n  a: \"1\"\n".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_owned(), c.into_bytes()))
    .collect()
}

pub(crate) const LABELS: &str = "  - image: set-labels:v0.2\n    configMap:\n      app: shop\n";

pub(crate) struct Repo {
    _dir: tempfile::TempDir,
    pub(crate) remote: std::path::PathBuf,
    pub(crate) mirror: Mirror<LocalRemote>,
}

/// A bare repository with a draft of `app` in workspace `v1`.
pub(crate) async fn repo_with_draft(files: Files) -> anyhow::Result<Repo> {
    let repo = empty_repo()?;
    let actor = Actor {
        uid: "uid-1".into(),
        generation: 1,
        author: Identity::of_user("alice@example.com"),
        time: 1_795_000_000,
    };
    repo.mirror
        .apply(move |repo| {
            Packages {
                repo,
                layout: RepoLayout::new("", "main"),
            }
            .create_draft(
                "app",
                "v1",
                &files,
                Task {
                    type_: TaskType::Init,
                    ..Task::default()
                },
                &actor,
            )
        })
        .await?;
    Ok(repo)
}

pub(crate) fn invocation(operation: &str, annotations: serde_json::Value) -> Invocation {
    trace_logs();
    serde_json::from_value(serde_json::json!({
        "operation": operation,
        "requestId": "req-1",
        "time": "2026-11-22T10:00:00Z",
        "repository": {
            "apiVersion": "config.porch.kpt.dev/v1alpha1",
            "kind": "Repository",
            "metadata": {"name": "blueprints", "namespace": "default", "uid": "repo-uid"},
            "spec": {"type": "git", "git": {"repo": "file:///unused", "branch": "main"}}
        },
        "packageRevision": {
            "apiVersion": "porch.kpt.dev/v1alpha2",
            "kind": "PackageRevision",
            "metadata": {
                "name": "blueprints.app.v1",
                "namespace": "default",
                "uid": "uid-1",
                "generation": 1,
                "resourceVersion": "100",
                "annotations": annotations,
                "finalizers": ["porch.kpt.dev/packagerevisions"],
                "ownerReferences": [{"apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository", "name": "blueprints", "uid": "repo-uid"}]
            },
            "spec": {"packageName": "app", "repository": "blueprints", "workspaceName": "v1", "lifecycle": "Draft", "source": {"init": {}}},
            "status": {
                "creationSource": "init",
                "observedGeneration": 1,
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "Pending", "message": "awaiting render", "lastTransitionTime": "2026-11-22T00:00:00Z"},
                    {"type": "Rendered", "status": "Unknown", "reason": "Pending", "message": "awaiting render", "lastTransitionTime": "2026-11-22T00:00:00Z"}
                ]
            }
        }
    }))
    .expect("a valid invocation")
}

pub(crate) fn now() -> Time {
    Time("2026-11-22T10:00:00Z".parse().expect("timestamp"))
}

/// Publishes `files` as revision `<n>` of `package` (draft, propose,
/// publish) on the repository behind `mirror`.
pub(crate) async fn publish(
    mirror: &Mirror<LocalRemote>,
    package: &str,
    workspace: &str,
    files: Files,
) -> anyhow::Result<u64> {
    let (package, workspace) = (package.to_owned(), workspace.to_owned());
    let actor = Actor {
        uid: format!("uid-{package}-{workspace}"),
        generation: 1,
        author: Identity::of_user("alice@example.com"),
        time: 1_795_000_000,
    };
    let applied = mirror
        .apply(move |repo| {
            let packages = Packages {
                repo,
                layout: RepoLayout::new("", "main"),
            };
            packages.create_draft(
                &package,
                &workspace,
                &files,
                Task {
                    type_: TaskType::Init,
                    ..Task::default()
                },
                &actor,
            )?;
            packages.propose(&package, &workspace)?;
            packages.publish(&package, &workspace, &actor)
        })
        .await?;
    Ok(applied.value)
}

/// A PackageRevision object for a published revision.
pub(crate) fn published_revision(
    name: &str,
    package: &str,
    workspace: &str,
    revision: i64,
) -> porch_api::v1alpha2::PackageRevision {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "porch.kpt.dev/v1alpha2",
        "kind": "PackageRevision",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": "5"},
        "spec": {"packageName": package, "repository": "blueprints", "workspaceName": workspace, "lifecycle": "Published"},
        "status": {"revision": revision}
    }))
    .expect("a valid revision")
}

/// An empty bare repository and its mirror.
pub(crate) fn empty_repo() -> anyhow::Result<Repo> {
    trace_logs();
    let dir = tempfile::tempdir()?;
    let remote = dir.path().join("remote.git");
    GitRepo::init_bare(&remote)?;
    let mirror = Mirror::new(
        dir.path().join("mirror"),
        LocalRemote::new(&remote),
        RetryPolicy::default(),
    )?;
    Ok(Repo {
        _dir: dir,
        remote,
        mirror,
    })
}

pub(crate) struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(["-c", "safe.directory=*"])
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

/// A bare repository served over smart HTTP with pushes allowed.
pub(crate) fn served(root: &Path) -> (Server, String) {
    served_with_auth(root, None)
}

/// [`served`], requiring the basic-auth `user:password` pair when given.
pub(crate) fn served_with_auth(root: &Path, auth: Option<&str>) -> (Server, String) {
    let bare = root.join("repo.git");
    git(root, &["init", "--bare", "-q", "-b", "main", "repo.git"]);
    git(&bare, &["config", "http.receivepack", "true"]);
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../git/tests/servers/git_http_server.py");
    let mut command = Command::new("python3");
    command.arg(script).arg(root).arg("0");
    if let Some(auth) = auth {
        command.env("GIT_TEST_AUTH", auth);
    }
    let (child, port) = announced::spawn_announcing(command);
    (Server(child), format!("http://127.0.0.1:{port}/repo.git"))
}

/// What the relay does with an Outcome: the status patch becomes the
/// object's status, label patches its labels, and the resourceVersion moves.
pub(crate) fn applied(mut pr: PackageRevision, outcome: &Outcome) -> PackageRevision {
    for patch in &outcome.patches {
        if patch.target.name != pr.metadata.name.clone().unwrap_or_default() {
            continue;
        }
        let json = serde_json::to_value(&patch.patch).expect("patch");
        if patch.subresource == Subresource::Status {
            pr.status = serde_json::from_value(json[1]["value"].clone()).expect("status");
        } else if let Some(label) = json[1]["value"].as_str() {
            pr.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(porch_api::LATEST_REVISION_LABEL.into(), label.into());
        }
    }
    let version: u64 = pr
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    pr.metadata.resource_version = Some((version + 1).to_string());
    pr
}

pub(crate) fn with(pr: &PackageRevision, operation: Operation, url: &str) -> Invocation {
    let mut inv = invocation(operation.as_str(), serde_json::json!({}));
    inv.package_revision = Some(pr.clone());
    if let Some(git) = inv.repository.spec.git.as_mut() {
        git.repo = url.to_owned();
    }
    inv
}

/// moto's S3 server (one request at a time) and a bucket with a store on it.
pub(crate) async fn moto_store(root: &Path) -> (Server, porch_git::s3::S3Store) {
    let (server, port) = moto(root);
    let options = porch_git::s3::S3Options {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        region: Some("us-east-1".into()),
        force_path_style: true,
        max_attempts: 3,
        operation_timeout: std::time::Duration::from_secs(10),
        ..Default::default()
    };
    let builder = aws_sdk_s3::config::Builder::new()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "testing",
            "testing-c4n4ry",
            None,
            None,
            "tests",
        ));
    let client = aws_sdk_s3::Client::from_conf(porch_git::s3::S3Store::config(builder, &options));
    client
        .create_bucket()
        .bucket("snapshots")
        .send()
        .await
        .expect("create bucket");
    let store = porch_git::s3::S3Store::with_client(client, "snapshots", "porch").expect("store");
    (server, store)
}

/// moto's server for every AWS API it mocks, one request at a time, and
/// its port.
pub(crate) fn moto(root: &Path) -> (Server, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../git/tests/servers/moto_serial.py");
    let mut command = Command::new("python3");
    command
        .arg(script)
        .args(["127.0.0.1", "0"])
        .current_dir(root)
        .stderr(std::process::Stdio::null());
    let (child, port) = announced::spawn_announcing(command);
    (Server(child), port)
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
