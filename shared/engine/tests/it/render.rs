//! The render handler on a local bare repository.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::invocation::{Invocation, Operation, Outcome};
use porch_api::v1alpha1::{Task, TaskType};
use porch_engine::HandlerError;
use porch_engine::render::{RenderContext, render};
use porch_git::identity::Identity;
use porch_git::layout::RepoLayout;
use porch_git::mirror::{Mirror, RetryPolicy};
use porch_git::operations::{Actor, Packages};
use porch_git::remote::LocalRemote;
use porch_git::repo::GitRepo;
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::render::RenderOptions;
use porch_krm::runtime::Runtimes;
use pretty_assertions::assert_eq;

type Files = BTreeMap<String, Vec<u8>>;

fn package(pipeline: &str) -> Files {
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

const LABELS: &str = "  - image: set-labels:v0.2\n    configMap:\n      app: shop\n";

struct Repo {
    _dir: tempfile::TempDir,
    remote: std::path::PathBuf,
    mirror: Mirror<LocalRemote>,
}

/// A bare repository with a draft of `app` in workspace `v1`.
async fn repo_with_draft(files: Files) -> anyhow::Result<Repo> {
    let dir = tempfile::tempdir()?;
    let remote = dir.path().join("remote.git");
    GitRepo::init_bare(&remote)?;
    let mirror = Mirror::new(
        dir.path().join("mirror"),
        LocalRemote::new(&remote),
        RetryPolicy::default(),
    )?;
    let actor = Actor {
        uid: "uid-1".into(),
        generation: 1,
        author: Identity::of_user("alice@example.com"),
        time: 1_795_000_000,
    };
    mirror
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
    Ok(Repo {
        _dir: dir,
        remote,
        mirror,
    })
}

fn invocation(annotations: serde_json::Value) -> Invocation {
    serde_json::from_value(serde_json::json!({
        "operation": "render",
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

fn context() -> RenderContext {
    RenderContext {
        functions: Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog()))),
        options: RenderOptions::default(),
        now: Time("2026-11-22T10:00:00Z".parse().expect("timestamp")),
    }
}

fn draft_files(repo: &Repo) -> anyhow::Result<(String, Files)> {
    let git = GitRepo::open(&repo.remote)?;
    let head = git
        .ref_id("refs/heads/drafts/app/v1")?
        .ok_or_else(|| anyhow::anyhow!("no draft"))?;
    Ok((head.to_string(), git.read_files(head, "app")?))
}

fn status_of(outcome: &Outcome) -> serde_json::Value {
    let patch = serde_json::to_value(&outcome.patches[0].patch).expect("patch");
    assert_eq!(patch[0]["op"], "test");
    assert_eq!(patch[0]["path"], "/metadata/resourceVersion");
    assert_eq!(patch[0]["value"], "100");
    patch[1]["value"].clone()
}

fn condition(status: &serde_json::Value, type_: &str) -> (String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or_default();
    (
        c["status"].as_str().unwrap_or("").to_owned(),
        c["reason"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test]
async fn a_draft_is_rendered_pushed_and_reported_once() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    let (before, _) = draft_files(&repo)?;
    let inv = invocation(serde_json::json!({"porch.kpt.dev/render-request": "rv-7"}));

    let outcome = render(&inv, &repo.mirror, &context()).await?;
    let (after, files) = draft_files(&repo)?;
    assert_ne!(before, after, "the rendered package is a new commit");
    let cm = String::from_utf8(files["cm.yaml"].clone())?;
    assert!(
        cm.contains("name: cm # keep\n  labels:\n    app: shop\n"),
        "{cm}"
    );
    let git = GitRepo::open(&repo.remote)?;
    let message = git.commit_info(after.parse()?)?.message;
    assert!(message.starts_with("Rendering package"), "{message}");

    let status = status_of(&outcome);
    assert_eq!(
        condition(&status, "Rendered"),
        ("True".into(), "Rendered".into())
    );
    assert_eq!(status["observedPrrResourceVersion"], "rv-7");
    assert_eq!(status["packageConditions"][0]["type"], "Rendered");
    assert_eq!(status["packageConditions"][0]["reason"], "RenderSuccess");

    // The same Invocation again: no new commit, the same Outcome.
    let again = render(&inv, &repo.mirror, &context()).await?;
    assert_eq!(draft_files(&repo)?.0, after);
    assert_eq!(again, outcome);
    Ok(())
}

#[tokio::test]
async fn a_failed_render_is_reported_and_pushed_only_when_asked() -> anyhow::Result<()> {
    let failing = "  - image: set-labels:v0.2\n";
    let repo = repo_with_draft(package(failing)).await?;
    let (before, _) = draft_files(&repo)?;
    let outcome = render(&invocation(serde_json::json!({})), &repo.mirror, &context()).await?;
    assert_eq!(draft_files(&repo)?.0, before, "nothing is pushed");
    let status = status_of(&outcome);
    assert_eq!(
        condition(&status, "Rendered"),
        ("False".into(), "RenderFailed".into())
    );
    assert_eq!(
        condition(&status, "Ready"),
        ("False".into(), "RenderFailed".into())
    );

    let pushed = invocation(serde_json::json!({"porch.kpt.dev/push-on-render-failure": "true"}));
    render(&pushed, &repo.mirror, &context()).await?;
    let (after, files) = draft_files(&repo)?;
    assert_ne!(after, before);
    let kptfile = String::from_utf8(files["Kptfile"].clone())?;
    assert!(kptfile.contains("reason: RenderFailed"), "{kptfile}");
    Ok(())
}

#[tokio::test]
async fn renders_that_are_not_due_and_bad_invocations_do_nothing() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    let (before, _) = draft_files(&repo)?;
    // Already rendered and nothing requested.
    let mut done = invocation(serde_json::json!({}));
    if let Some(status) = done
        .package_revision
        .as_mut()
        .and_then(|p| p.status.as_mut())
    {
        for c in &mut status.conditions {
            c.status = "True".into();
        }
    }
    assert!(render(&done, &repo.mirror, &context()).await?.is_empty());
    // Not a draft.
    let mut proposed = invocation(serde_json::json!({}));
    if let Some(pr) = proposed.package_revision.as_mut() {
        pr.spec.lifecycle = Some(porch_api::common::Lifecycle::Proposed);
    }
    assert!(
        render(&proposed, &repo.mirror, &context())
            .await?
            .is_empty()
    );
    assert_eq!(draft_files(&repo)?.0, before);

    let mut wrong = invocation(serde_json::json!({}));
    wrong.operation = Operation::Lifecycle;
    let err = render(&wrong, &repo.mirror, &context())
        .await
        .expect_err("wrong operation");
    assert!(!err.is_retryable());
    let mut missing = invocation(serde_json::json!({}));
    missing.package_revision = None;
    let err = render(&missing, &repo.mirror, &context())
        .await
        .expect_err("no revision");
    assert!(matches!(err, HandlerError::Invalid(_)));
    let mut hostile = invocation(serde_json::json!({}));
    if let Some(pr) = hostile.package_revision.as_mut() {
        pr.spec.package_name = "../../etc".into();
    }
    let err = render(&hostile, &repo.mirror, &context())
        .await
        .expect_err("hostile name");
    assert!(!err.is_retryable(), "{err}");
    Ok(())
}
