//! A bare repository with a draft, and Invocations for it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::invocation::Invocation;
use porch_api::v1alpha1::{Task, TaskType};
use porch_git::identity::Identity;
use porch_git::layout::RepoLayout;
use porch_git::mirror::{Mirror, RetryPolicy};
use porch_git::operations::{Actor, Packages};
use porch_git::remote::LocalRemote;
use porch_git::repo::GitRepo;

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
    serde_json::from_value(serde_json::json!({
        "operation": operation,
        "requestId": "req-1",
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
