//! The sync handler: git's revisions become objects to apply; objects git
//! no longer has are released and deleted.

use porch_api::invocation::{Invocation, Subresource};
use porch_api::v1alpha2::PackageRevision;
use porch_engine::sync::{OWNER_MANAGER, SEED_MANAGER, sync};
use pretty_assertions::assert_eq;

use crate::support::{LABELS, invocation, package, publish, repo_with_draft};

fn labelled(
    name: &str,
    package: &str,
    workspace: &str,
    extra: serde_json::Value,
) -> PackageRevision {
    let mut object = serde_json::json!({
        "apiVersion": "porch.kpt.dev/v1alpha2",
        "kind": "PackageRevision",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": "9",
                     "labels": {"porch.kpt.dev/repository": "blueprints"},
                     "finalizers": ["porch.kpt.dev/packagerevisions"]},
        "spec": {"packageName": package, "repository": "blueprints", "workspaceName": workspace}
    });
    if let (Some(target), Some(extra)) = (object.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            target.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(object).expect("a valid revision")
}

fn sync_invocation(related: Vec<PackageRevision>) -> Invocation {
    let mut inv = invocation("sync", serde_json::json!({}));
    inv.package_revision = None;
    inv.related = related;
    inv
}

#[tokio::test]
async fn git_revisions_become_objects_and_stale_ones_go() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    publish(&repo.mirror, "base", "v1", package(LABELS)).await?;

    let stale = labelled("blueprints.gone.v1", "gone", "v1", serde_json::json!({}));
    let pending = labelled(
        "blueprints.new.v1",
        "new",
        "v1",
        serde_json::json!({"spec": {"packageName": "new", "repository": "blueprints", "workspaceName": "v1", "source": {"init": {}}}}),
    );
    let outcome = sync(&sync_invocation(vec![stale, pending]), &repo.mirror).await?;

    // Discovered: the draft app/v1, base v1 and base's placeholder on main.
    let mut names: Vec<String> = outcome
        .apply
        .iter()
        .filter(|a| a.field_manager == OWNER_MANAGER && a.subresource == Subresource::Main)
        .map(|a| {
            a.object["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "blueprints.app.v1",
            "blueprints.base.main",
            "blueprints.base.v1"
        ]
    );
    let owned = outcome
        .apply
        .iter()
        .find(|a| {
            a.object["metadata"]["name"] == "blueprints.base.v1"
                && a.subresource == Subresource::Main
        })
        .expect("base v1");
    assert!(owned.force);
    assert_eq!(
        owned.object["metadata"]["labels"]["porch.kpt.dev/repository"],
        "blueprints"
    );
    assert_eq!(
        owned.object["metadata"]["ownerReferences"][0]["uid"],
        "repo-uid"
    );
    let seed = outcome
        .apply
        .iter()
        .find(|a| {
            a.field_manager == SEED_MANAGER
                && a.object["metadata"]["name"] == "blueprints.base.v1"
                && a.subresource == Subresource::Status
        })
        .expect("seed status");
    assert!(!seed.force);
    assert_eq!(seed.object["status"]["revision"], 1);
    assert_eq!(seed.object["status"]["publishedBy"], "alice@example.com");
    let placeholder = outcome
        .apply
        .iter()
        .find(|a| {
            a.field_manager == SEED_MANAGER
                && a.object["metadata"]["name"] == "blueprints.base.main"
                && a.subresource == Subresource::Status
        })
        .expect("placeholder seed");
    assert_eq!(placeholder.object["status"]["revision"], -1);

    // The stale object is released and deleted; the pending one is kept.
    assert_eq!(outcome.delete.len(), 1);
    assert_eq!(outcome.delete[0].name, "blueprints.gone.v1");
    assert_eq!(outcome.patches.len(), 1);
    assert!(outcome.patches[0].is_guarded());
    assert_eq!(outcome.patches[0].target.name, "blueprints.gone.v1");
    Ok(())
}

#[tokio::test]
async fn objects_that_match_git_are_left_alone() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    let first = sync(&sync_invocation(Vec::new()), &repo.mirror).await?;
    // Build the objects as the API server would hold them after the applies.
    let mut objects: Vec<PackageRevision> = Vec::new();
    for apply in first
        .apply
        .iter()
        .filter(|a| a.field_manager == OWNER_MANAGER && a.subresource == Subresource::Main)
    {
        let name = apply.object["metadata"]["name"].as_str().unwrap_or("");
        let status = first
            .apply
            .iter()
            .find(|s| {
                s.field_manager == OWNER_MANAGER
                    && s.subresource == Subresource::Status
                    && s.object["metadata"]["name"] == name
            })
            .map(|s| s.object["status"].clone())
            .unwrap_or_default();
        let mut object = apply.object.clone();
        object["status"] = status;
        objects.push(serde_json::from_value(object)?);
    }
    let second = sync(&sync_invocation(objects), &repo.mirror).await?;
    // nothing for the PackageRevisions; the Repository's status only
    assert!(
        second.patches.is_empty() && second.delete.is_empty(),
        "{second:?}"
    );
    let kinds: Vec<&serde_json::Value> = second.apply.iter().map(|a| &a.object["kind"]).collect();
    assert_eq!(kinds, ["Repository"]);
    Ok(())
}

#[tokio::test]
async fn the_repository_status_says_ready_with_the_count_and_the_head() -> anyhow::Result<()> {
    let repo = repo_with_draft(package(LABELS)).await?;
    publish(&repo.mirror, "base", "v1", package(LABELS)).await?;
    let mut invocation = sync_invocation(Vec::new());
    invocation.repository.metadata.generation = Some(3);
    let outcome = sync(&invocation, &repo.mirror).await?;
    let status = outcome
        .apply
        .iter()
        .find(|a| a.object["kind"] == "Repository")
        .expect("the Repository's status");
    assert_eq!(status.field_manager, OWNER_MANAGER);
    assert!(status.force);
    assert_eq!(status.subresource, Subresource::Status);
    assert_eq!(status.object["metadata"]["name"], "blueprints");
    let head = std::process::Command::new("git")
        .args(["rev-parse", "main"])
        .current_dir(&repo.remote)
        .output()?;
    let fields = &status.object["status"];
    assert_eq!(
        fields["gitCommitHash"],
        String::from_utf8_lossy(&head.stdout).trim()
    );
    // the draft app/v1, base v1 and base's placeholder on main
    assert_eq!(fields["packageCount"], 3);
    assert_eq!(fields["observedGeneration"], 3);
    assert_eq!(fields["lastFullSyncTime"], "2026-11-22T10:00:00Z");
    assert_eq!(
        fields["conditions"],
        serde_json::json!([{"type": "Ready", "status": "True", "reason": "Ready",
            "message": "Repository Ready", "observedGeneration": 3,
            "lastTransitionTime": "2026-11-22T10:00:00Z"}])
    );

    // already Ready: a later sync keeps the time Ready became True
    invocation.repository.status = Some(serde_json::from_value(serde_json::json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
            "message": "Repository Ready", "lastTransitionTime": "2026-11-01T08:00:00Z"}]
    }))?);
    invocation.time = Some(serde_json::from_value(serde_json::json!(
        "2026-11-22T11:00:00Z"
    ))?);
    let later = sync(&invocation, &repo.mirror).await?;
    let fields = &later
        .apply
        .iter()
        .find(|a| a.object["kind"] == "Repository")
        .expect("the Repository's status")
        .object["status"];
    assert_eq!(
        fields["conditions"][0]["lastTransitionTime"],
        "2026-11-01T08:00:00Z"
    );
    assert_eq!(fields["lastFullSyncTime"], "2026-11-22T11:00:00Z");
    Ok(())
}
