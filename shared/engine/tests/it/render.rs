//! The render handler on a local bare repository.

use std::sync::Arc;

use porch_api::invocation::{Invocation, Operation, Outcome};
use porch_engine::HandlerError;
use porch_engine::render::{RenderContext, render};
use porch_git::repo::GitRepo;
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::render::RenderOptions;
use porch_krm::runtime::Runtimes;
use pretty_assertions::assert_eq;

use crate::support::{Files, LABELS, Repo, now, package, repo_with_draft};

fn invocation(annotations: serde_json::Value) -> Invocation {
    crate::support::invocation("render", annotations)
}

fn context() -> RenderContext {
    RenderContext {
        functions: Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog()))),
        options: RenderOptions::default(),
        now: now(),
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

/// A function runtime that, on its first run, lets a user push new content
/// to the draft (straight into the remote) while the render is under way.
#[derive(Debug)]
struct PushDuringRender {
    inner: BuiltinRuntime,
    remote: std::path::PathBuf,
    pushed: std::sync::atomic::AtomicBool,
}

impl porch_krm::runtime::FunctionRuntime for PushDuringRender {
    fn run(
        &self,
        call: porch_krm::runtime::Call<'_>,
    ) -> Result<porch_krm::runtime::FunctionOutput, porch_krm::runtime::FunctionError> {
        if !self.pushed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let git = GitRepo::open(&self.remote).expect("remote");
            let mut files = package(LABELS);
            files.insert(
                "pushed.yaml".into(),
                b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: pushed\n".to_vec(),
            );
            porch_git::operations::Packages {
                repo: &git,
                layout: porch_git::layout::RepoLayout::new("", "main"),
            }
            .replace_draft_content(
                "app",
                "v1",
                &files,
                porch_api::v1alpha1::Task {
                    type_: porch_api::v1alpha1::TaskType::Push,
                    ..Default::default()
                },
                &porch_git::operations::Actor {
                    uid: "uid-1".into(),
                    generation: 1,
                    author: porch_git::identity::Identity::of_user("bob@example.com"),
                    time: 1_795_000_100,
                },
            )
            .expect("the user's push");
        }
        self.inner.run(call)
    }
}

#[tokio::test]
async fn a_push_landing_during_a_render_is_rendered_not_overwritten() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    let functions = Arc::new(PushDuringRender {
        inner: BuiltinRuntime::catalog(),
        remote: repo.remote.clone(),
        pushed: false.into(),
    });
    let context = RenderContext {
        functions,
        ..context()
    };
    let inv = invocation(serde_json::json!({"porch.kpt.dev/render-request": "rv-7"}));
    let outcome = render(&inv, &repo.mirror, &context).await?;
    let (_, files) = draft_files(&repo)?;
    assert!(
        files.contains_key("pushed.yaml"),
        "the push is kept: {:?}",
        files.keys()
    );
    let pushed = String::from_utf8(files["pushed.yaml"].clone())?;
    assert!(pushed.contains("app: shop"), "and rendered: {pushed}");
    assert_eq!(
        condition(&status_of(&outcome), "Rendered"),
        ("True".into(), "Rendered".into())
    );
    Ok(())
}
