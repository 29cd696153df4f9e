//! The delete handler: git cleanup, then the finalizer released.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use porch_api::common::{GitLock, Lifecycle, Locator};
use porch_api::invocation::{EventType, Invocation, Subresource};
use porch_engine::delete::delete;
use porch_git::repo::GitRepo;
use pretty_assertions::assert_eq;

use crate::support::{
    LABELS, Repo, empty_repo, invocation, now, package, publish, published_revision,
    repo_with_draft,
};

fn deleting(lifecycle: Lifecycle, revision: i64) -> Invocation {
    let mut inv = invocation("delete", serde_json::json!({}));
    if let Some(pr) = inv.package_revision.as_mut() {
        pr.metadata.deletion_timestamp = Some(Time("2026-11-22T09:00:00Z".parse().expect("time")));
        pr.spec.lifecycle = Some(lifecycle);
        if let Some(status) = pr.status.as_mut() {
            status.revision = Some(revision);
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

fn releases(outcome: &porch_api::invocation::Outcome) -> bool {
    outcome.patches.iter().any(|p| {
        p.subresource == Subresource::Main
            && p.is_guarded()
            && serde_json::to_value(&p.patch).expect("patch")[1]
                == serde_json::json!({"op": "remove", "path": "/metadata/finalizers/0"})
    })
}

#[tokio::test]
async fn a_draft_is_removed_from_git_and_released() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    assert!(refs(&repo).contains(&"refs/heads/drafts/app/v1".to_owned()));
    let outcome = delete(&deleting(Lifecycle::Draft, 0), &repo.mirror, &now()).await?;
    assert!(!refs(&repo).contains(&"refs/heads/drafts/app/v1".to_owned()));
    assert!(releases(&outcome), "{outcome:?}");
    // Delivered again: nothing left in git, released again (the relay's
    // patch then fails its guard if the first one landed).
    let again = delete(&deleting(Lifecycle::Draft, 0), &repo.mirror, &now()).await?;
    assert!(releases(&again));
    Ok(())
}

#[tokio::test]
async fn published_revisions_go_only_through_a_deletion_proposal() -> anyhow::Result<()> {
    let repo = empty_repo()?;
    publish(&repo.mirror, "app", "v1", package(LABELS)).await?;
    assert!(refs(&repo).contains(&"refs/tags/app/v1".to_owned()));

    let blocked = delete(&deleting(Lifecycle::Published, 1), &repo.mirror, &now()).await?;
    assert!(blocked.patches.is_empty());
    assert_eq!(blocked.events[0].type_, EventType::Warning);
    assert!(refs(&repo).contains(&"refs/tags/app/v1".to_owned()));

    // Another revision uses it as upstream.
    let mut used = deleting(Lifecycle::DeletionProposed, 1);
    let mut downstream = published_revision("blueprints.down.v1", "down", "v1", 1);
    if let Some(status) = downstream.status.as_mut() {
        status.upstream_lock = Some(Locator {
            type_: "git".into(),
            git: Some(GitLock {
                ref_: "app/v1".into(),
                ..GitLock::default()
            }),
        });
    }
    used.related = vec![downstream];
    let outcome = delete(&used, &repo.mirror, &now()).await?;
    assert!(outcome.patches.is_empty());
    assert!(
        outcome.events[0].message.contains("blueprints.down.v1"),
        "{:?}",
        outcome.events
    );

    // The same package and ref locked from another repository is no user.
    let mut elsewhere = deleting(Lifecycle::DeletionProposed, 1);
    let mut other = published_revision("deploy.down.v1", "down", "v1", 1);
    if let Some(status) = other.status.as_mut() {
        status.upstream_lock = Some(Locator {
            type_: "git".into(),
            git: Some(GitLock {
                repo: "https://git.example.com/other-blueprints.git".into(),
                ref_: "app/v1".into(),
                ..GitLock::default()
            }),
        });
    }
    elsewhere.related = vec![other.clone()];
    let same_url = elsewhere
        .repository
        .spec
        .git
        .as_ref()
        .map(|g| g.repo.clone());
    // ...while a lock on this repository's URL (with `.git`) is
    if let (Some(status), Some(url)) = (other.status.as_mut(), same_url)
        && let Some(git) = status.upstream_lock.as_mut().and_then(|l| l.git.as_mut())
    {
        git.repo = format!("{url}.git");
    }
    let mut blocked_here = deleting(Lifecycle::DeletionProposed, 1);
    // listed twice (an Invocation may repeat a revision): named once
    blocked_here.related = vec![other.clone(), other];
    let outcome = delete(&blocked_here, &repo.mirror, &now()).await?;
    assert!(outcome.patches.is_empty(), "blocked by a lock on this URL");
    assert!(
        outcome.events[0]
            .message
            .ends_with("referenced as upstream by: deploy.down.v1"),
        "{}",
        outcome.events[0].message
    );
    let outcome = delete(&elsewhere, &repo.mirror, &now()).await?;
    assert!(releases(&outcome), "{:?}", outcome.events);
    assert!(!refs(&repo).contains(&"refs/tags/app/v1".to_owned()));
    publish(&repo.mirror, "app", "v1", package(LABELS)).await?;

    // Proposed for deletion and unused: the tag goes; a sibling becomes latest.
    let mut inv = deleting(Lifecycle::DeletionProposed, 1);
    let mut sibling = published_revision("blueprints.app.v0", "app", "v0", 0);
    sibling.status = Some(porch_api::v1alpha2::PackageRevisionStatus {
        revision: Some(-1),
        ..Default::default()
    });
    inv.related = vec![sibling];
    let outcome = delete(&inv, &repo.mirror, &now()).await?;
    assert!(
        !refs(&repo).contains(&"refs/tags/app/v1".to_owned()),
        "{:?}",
        refs(&repo)
    );
    assert!(releases(&outcome));
    // The placeholder (-1) is never latest.
    let labels: Vec<String> = outcome
        .patches
        .iter()
        .filter(|p| p.target.name == "blueprints.app.v0")
        .map(|p| serde_json::to_value(&p.patch).expect("patch")[1].to_string())
        .collect();
    assert_eq!(labels.len(), 1);
    assert!(labels[0].contains("\"false\""), "{labels:?}");
    Ok(())
}

#[tokio::test]
async fn a_repository_being_deleted_only_releases_and_live_objects_are_left_alone()
-> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    let mut inv = deleting(Lifecycle::Published, 1);
    inv.repository.metadata.deletion_timestamp = Some(Time("2026-11-22T09:00:00Z".parse()?));
    let outcome = delete(&inv, &repo.mirror, &now()).await?;
    assert!(releases(&outcome));
    assert!(refs(&repo).contains(&"refs/heads/drafts/app/v1".to_owned()));

    let alive = invocation("delete", serde_json::json!({}));
    assert!(delete(&alive, &repo.mirror, &now()).await?.is_empty());
    Ok(())
}
