//! The lifecycle handler on a local bare repository: propose, publish with
//! the approver recorded, latest-revision labels, deletion proposals.

use porch_api::common::Lifecycle;
use porch_api::invocation::{Invocation, Outcome, Subresource};
use porch_api::v1alpha2::PackageRevision;
use porch_engine::lifecycle::lifecycle;
use porch_git::repo::GitRepo;
use pretty_assertions::assert_eq;

use crate::support::{LABELS, Repo, invocation, now, package, repo_with_draft};

/// A lifecycle Invocation for `desired`, with the spec one generation ahead
/// of the status.
fn to(desired: Lifecycle, annotations: serde_json::Value) -> Invocation {
    let mut inv = invocation("lifecycle", annotations);
    if let Some(pr) = inv.package_revision.as_mut() {
        pr.spec.lifecycle = Some(desired);
        pr.metadata.generation = Some(2);
        if let Some(status) = pr.status.as_mut() {
            for c in &mut status.conditions {
                c.status = "True".into();
            }
        }
    }
    inv
}

fn refs(repo: &Repo) -> Vec<String> {
    GitRepo::open(&repo.remote)
        .and_then(|g| g.refs())
        .map(|r| r.into_keys().collect())
        .unwrap_or_default()
}

fn status(outcome: &Outcome) -> serde_json::Value {
    let patch = outcome
        .patches
        .iter()
        .find(|p| p.subresource == Subresource::Status)
        .expect("a status patch");
    assert!(patch.is_guarded());
    serde_json::to_value(&patch.patch).expect("patch")[1]["value"].clone()
}

fn ready(status: &serde_json::Value) -> (String, String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    (
        c["status"].as_str().unwrap_or("").into(),
        c["reason"].as_str().unwrap_or("").into(),
        c["message"].as_str().unwrap_or("").into(),
    )
}

fn published_sibling(name: &str, revision: i64, latest: &str) -> PackageRevision {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "porch.kpt.dev/v1alpha2",
        "kind": "PackageRevision",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": "7",
                     "labels": {"porch.kpt.dev/latest-revision": latest}},
        "spec": {"packageName": "app", "repository": "blueprints", "workspaceName": name, "lifecycle": "Published"},
        "status": {"revision": revision}
    }))
    .expect("a valid revision")
}

#[tokio::test]
async fn a_draft_is_proposed_then_published_with_its_approver() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;

    let outcome = lifecycle(
        &to(Lifecycle::Proposed, serde_json::json!({})),
        &repo.mirror,
        &now(),
    )
    .await?;
    assert!(
        refs(&repo).contains(&"refs/heads/proposed/app/v1".to_owned()),
        "{:?}",
        refs(&repo)
    );
    assert!(!refs(&repo).contains(&"refs/heads/drafts/app/v1".to_owned()));
    assert_eq!(ready(&status(&outcome)).0, "True");
    assert_eq!(status(&outcome)["observedGeneration"], 2);

    let mut approve = to(
        Lifecycle::Published,
        serde_json::json!({"porch.kpt.dev/approved-by": "bob@example.com"}),
    );
    approve.related = vec![published_sibling("blueprints.app.old", 0, "true")];
    let outcome = lifecycle(&approve, &repo.mirror, &now()).await?;
    assert!(
        refs(&repo).contains(&"refs/tags/app/v1".to_owned()),
        "{:?}",
        refs(&repo)
    );
    assert!(!refs(&repo).contains(&"refs/heads/proposed/app/v1".to_owned()));
    let s = status(&outcome);
    assert_eq!(s["revision"], 1);
    assert_eq!(s["publishedBy"], "bob@example.com");
    assert_eq!(s["publishedAt"], "2026-11-22T10:00:00Z");
    assert_eq!(outcome.events[0].reason, "Published");
    // The approval commit is the approver's.
    let git = GitRepo::open(&repo.remote)?;
    let tag = git
        .ref_id("refs/tags/app/v1")?
        .ok_or_else(|| anyhow::anyhow!("tag"))?;
    let info = git.commit_info(tag)?;
    assert!(
        info.message.starts_with("Approving package revision app/1"),
        "{}",
        info.message
    );
    // This revision becomes latest; the old one is told it is not.
    let labels: Vec<(String, String)> = outcome
        .patches
        .iter()
        .filter(|p| p.subresource == Subresource::Main)
        .map(|p| {
            let json = serde_json::to_value(&p.patch).expect("patch");
            (p.target.name.clone(), json[1].to_string())
        })
        .collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(
        labels
            .iter()
            .any(|(n, op)| n == "blueprints.app.v1" && op.contains("\"true\"")),
        "{labels:?}"
    );
    assert!(
        labels
            .iter()
            .any(|(n, op)| n == "blueprints.app.old" && op.contains("\"false\"")),
        "{labels:?}"
    );

    // Delivered again: the same revision, no second tag.
    let again = lifecycle(&approve, &repo.mirror, &now()).await?;
    assert_eq!(status(&again)["revision"], 1);
    assert!(!refs(&repo).iter().any(|r| r == "refs/tags/app/v2"));
    Ok(())
}

#[tokio::test]
async fn deletion_is_proposed_and_withdrawn_on_the_published_revision() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    lifecycle(
        &to(Lifecycle::Proposed, serde_json::json!({})),
        &repo.mirror,
        &now(),
    )
    .await?;
    lifecycle(
        &to(Lifecycle::Published, serde_json::json!({})),
        &repo.mirror,
        &now(),
    )
    .await?;
    let mut propose_delete = to(Lifecycle::DeletionProposed, serde_json::json!({}));
    if let Some(status) = propose_delete
        .package_revision
        .as_mut()
        .and_then(|p| p.status.as_mut())
    {
        status.revision = Some(1);
    }
    lifecycle(&propose_delete, &repo.mirror, &now()).await?;
    assert!(
        refs(&repo).contains(&"refs/heads/deletionProposed/app/v1".to_owned()),
        "{:?}",
        refs(&repo)
    );
    let mut restore = propose_delete.clone();
    if let Some(pr) = restore.package_revision.as_mut() {
        pr.spec.lifecycle = Some(Lifecycle::Published);
    }
    lifecycle(&restore, &repo.mirror, &now()).await?;
    assert!(!refs(&repo).contains(&"refs/heads/deletionProposed/app/v1".to_owned()));
    Ok(())
}

#[tokio::test]
async fn a_draft_cannot_be_published_without_review() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    let before = refs(&repo);
    let outcome = lifecycle(
        &to(Lifecycle::Published, serde_json::json!({})),
        &repo.mirror,
        &now(),
    )
    .await?;
    let (state, reason, message) = ready(&status(&outcome));
    assert_eq!((state.as_str(), reason.as_str()), ("False", "Failed"));
    assert!(
        message.contains("propose it before publishing"),
        "{message}"
    );
    assert_eq!(refs(&repo), before);
    Ok(())
}

/// Proposed, then approved in the API before the proposal reached git
/// (the webhook stamped the proposer): the approval carries out both, in
/// one push.
#[tokio::test]
async fn an_approval_that_overtakes_its_proposal_publishes_the_draft() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    let outcome = lifecycle(
        &to(
            Lifecycle::Published,
            serde_json::json!({
                (porch_api::PROPOSED_BY_ANNOTATION): "bob@example.com",
                (porch_api::APPROVED_BY_ANNOTATION): "alice@example.com",
            }),
        ),
        &repo.mirror,
        &now(),
    )
    .await?;
    let status = status(&outcome);
    let (state, _, message) = ready(&status);
    assert_eq!(state, "True", "{message}");
    assert_eq!(status["revision"], 1);
    let refs = refs(&repo);
    assert!(refs.contains(&"refs/tags/app/v1".to_owned()), "{refs:?}");
    assert!(
        !refs
            .iter()
            .any(|r| r.starts_with("refs/heads/drafts/") || r.starts_with("refs/heads/proposed/")),
        "{refs:?}"
    );
    Ok(())
}

/// Twenty proposed revisions of one package published at once, each
/// through its own mirror of the same repository (as twenty handler
/// instances would): revisions 1..20, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_publishes_get_consecutive_unique_revisions() -> anyhow::Result<()> {
    use porch_git::identity::Identity;
    use porch_git::layout::RepoLayout;
    use porch_git::mirror::{Mirror, RetryPolicy};
    use porch_git::operations::{Actor, Packages};
    use porch_git::remote::LocalRemote;

    let repo = crate::support::empty_repo()?;
    let files = package(LABELS);
    repo.mirror
        .apply(move |git| {
            let packages = Packages {
                repo: git,
                layout: RepoLayout::new("", "main"),
            };
            for i in 0..20 {
                let actor = Actor {
                    uid: format!("uid-{i}"),
                    generation: 1,
                    author: Identity::of_user("alice@example.com"),
                    time: 1_795_000_000,
                };
                packages.create_draft(
                    "app",
                    &format!("ws{i}"),
                    &files,
                    Default::default(),
                    &actor,
                )?;
                packages.propose("app", &format!("ws{i}"))?;
            }
            Ok(())
        })
        .await?;

    let retry = RetryPolicy {
        conflict_attempts: 100,
        transient_attempts: 20,
        ..RetryPolicy::default()
    };
    let mut tasks = Vec::new();
    for i in 0..20 {
        let dir = tempfile::tempdir()?;
        let mirror = Mirror::new(
            dir.path().join("mirror"),
            LocalRemote::new(&repo.remote),
            retry,
        )?;
        let mut inv = to(Lifecycle::Published, serde_json::json!({}));
        if let Some(pr) = inv.package_revision.as_mut() {
            pr.metadata.name = Some(format!("blueprints.app.ws{i}"));
            pr.metadata.uid = Some(format!("uid-{i}"));
            pr.spec.workspace_name = format!("ws{i}");
        }
        tasks.push(tokio::spawn(async move {
            let _keep = dir;
            // As the relay does: a retryable failure is delivered again.
            let mut attempt = 0;
            loop {
                attempt += 1;
                match lifecycle(&inv, &mirror, &now()).await {
                    Err(e) if e.is_retryable() && attempt < 10 => continue,
                    other => break other,
                }
            }
        }));
    }
    let mut revisions = Vec::new();
    for task in tasks {
        let outcome = task.await??;
        let s = status(&outcome);
        assert_eq!(ready(&s).0, "True", "{s}");
        revisions.push(s["revision"].as_i64().unwrap_or(0));
    }
    revisions.sort_unstable();
    assert_eq!(revisions, (1..=20).collect::<Vec<i64>>());
    let tags: Vec<String> = refs(&repo)
        .into_iter()
        .filter(|r| r.starts_with("refs/tags/app/"))
        .collect();
    assert_eq!(tags.len(), 20, "{tags:?}");
    Ok(())
}

#[tokio::test]
async fn ready_waits_for_readiness_gates() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    let mut inv = to(Lifecycle::Proposed, serde_json::json!({}));
    if let Some(pr) = inv.package_revision.as_mut() {
        pr.spec.readiness_gates = vec![porch_api::common::ReadinessGate {
            condition_type: "Approved".into(),
        }];
    }
    let outcome = lifecycle(&inv, &repo.mirror, &now()).await?;
    assert!(refs(&repo).contains(&"refs/heads/proposed/app/v1".to_owned()));
    let (state, reason, message) = ready(&status(&outcome));
    assert_eq!(
        (state.as_str(), reason.as_str()),
        ("False", "ReadinessGatesPending")
    );
    assert!(message.contains("Approved"), "{message}");
    // With the gate's condition True in the Kptfile-derived conditions: Ready.
    if let Some(status) = inv
        .package_revision
        .as_mut()
        .and_then(|p| p.status.as_mut())
    {
        status.package_conditions = vec![porch_api::common::PackageCondition {
            type_: "Approved".into(),
            status: porch_api::common::ConditionStatus::True,
            reason: String::new(),
            message: String::new(),
        }];
    }
    let outcome = lifecycle(&inv, &repo.mirror, &now()).await?;
    assert_eq!(ready(&status(&outcome)).0, "True");
    Ok(())
}
