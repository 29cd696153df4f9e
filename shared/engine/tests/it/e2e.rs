//! The handlers end to end through the [`Runner`]: a real git server that
//! accepts pushes over smart HTTP, snapshots in moto's S3 server, each
//! Outcome applied to the object as the relay would, and the repository
//! checked with the git CLI.

use std::sync::Arc;

use porch_api::common::Lifecycle;
use porch_api::invocation::{Operation, Subresource};
use porch_engine::repository::repository_key;
use porch_engine::runner::Runner;
use porch_git::snapshot::Manifest;
use porch_git::store::ObjectStore;
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::runtime::Runtimes;
use pretty_assertions::assert_eq;

use crate::support::{applied, git, invocation, moto_store, served, with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_render_propose_publish_sync_and_delete_over_http() -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let (_server, url) = served(root.path());
    let bare = root.path().join("repo.git");
    let (_moto, store) = moto_store(root.path()).await;
    let functions = Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog())));
    let runner = Runner::new(root.path().join("cache"), functions).with_store(store.clone());

    // The object as the user creates it: a Draft with an init source.
    let mut pr = invocation("source", serde_json::json!({}))
        .package_revision
        .expect("revision");
    pr.status = None;
    pr.spec.source = Some(serde_json::from_value(
        serde_json::json!({"init": {"description": "e2e"}}),
    )?);

    let outcome = runner.handle(&with(&pr, Operation::Source, &url)).await?;
    pr = applied(pr, &outcome);
    assert_eq!(
        pr.status.as_ref().map(|s| s.creation_source.as_str()),
        Some("init")
    );
    assert!(git(&bare, &["branch", "--list"]).contains("drafts/app/v1"));

    let outcome = runner.handle(&with(&pr, Operation::Render, &url)).await?;
    pr = applied(pr, &outcome);
    let kptfile = git(&bare, &["show", "drafts/app/v1:app/Kptfile"]);
    assert!(kptfile.contains("reason: RenderSuccess"), "{kptfile}");

    for desired in [Lifecycle::Proposed, Lifecycle::Published] {
        pr.spec.lifecycle = Some(desired);
        pr.metadata.generation = pr.metadata.generation.map(|g| g + 1);
        if desired == Lifecycle::Published {
            pr.metadata.annotations = Some(
                [(
                    porch_api::APPROVED_BY_ANNOTATION.to_owned(),
                    "bob@example.com".to_owned(),
                )]
                .into(),
            );
        }
        let outcome = runner
            .handle(&with(&pr, Operation::Lifecycle, &url))
            .await?;
        pr = applied(pr, &outcome);
    }
    assert_eq!(pr.status.as_ref().and_then(|s| s.revision), Some(1));
    assert_eq!(git(&bare, &["tag", "--list"]).trim(), "app/v1");
    let approval = git(&bare, &["log", "-1", "--format=%an <%ae>%n%s", "app/v1"]);
    assert!(approval.contains("bob@example.com"), "{approval}");
    assert!(
        approval.contains("Approving package revision app/1"),
        "{approval}"
    );
    git(&bare, &["fsck", "--strict"]);

    // The snapshot in S3 holds what the remote holds.
    let key = format!(
        "repos/{}/manifest.json",
        repository_key(&with(&pr, Operation::Sync, &url).repository)
    );
    let manifest = Manifest::decode(&store.get(&key).await?.expect("a manifest").body)
        .map_err(anyhow::Error::msg)?;
    let tag = git(&bare, &["rev-parse", "app/v1"]);
    assert_eq!(
        manifest
            .ref_ids()
            .get("refs/tags/app/v1")
            .map(ToString::to_string),
        Some(tag.trim().to_owned())
    );

    // Repository sync sees the published revision and the placeholder.
    let mut sync_inv = with(&pr, Operation::Sync, &url);
    sync_inv.package_revision = None;
    let synced = runner.handle(&sync_inv).await?;
    let mut names: Vec<String> = synced
        .apply
        .iter()
        .filter(|a| {
            a.field_manager == porch_engine::sync::OWNER_MANAGER
                && a.subresource == Subresource::Main
        })
        .filter_map(|a| a.object["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    assert_eq!(names, vec!["blueprints.app.main", "blueprints.app.v1"]);

    // Propose the deletion, then delete.
    pr.spec.lifecycle = Some(Lifecycle::DeletionProposed);
    pr.metadata.generation = pr.metadata.generation.map(|g| g + 1);
    let outcome = runner
        .handle(&with(&pr, Operation::Lifecycle, &url))
        .await?;
    pr = applied(pr, &outcome);
    assert!(git(&bare, &["branch", "--list"]).contains("deletionProposed/app/v1"));
    pr.metadata.deletion_timestamp = Some(crate::support::now());
    let outcome = runner.handle(&with(&pr, Operation::Delete, &url)).await?;
    assert!(
        outcome
            .patches
            .iter()
            .any(|p| p.subresource == Subresource::Main)
    );
    assert_eq!(git(&bare, &["tag", "--list"]).trim(), "");
    assert!(!git(&bare, &["branch", "--list"]).contains("deletionProposed"));
    git(&bare, &["fsck", "--strict"]);
    Ok(())
}
