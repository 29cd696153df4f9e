//! The Runner: the snapshot around the handlers, redelivery, and a crash
//! between the push and the snapshot write.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use porch_api::common::Lifecycle;
use porch_api::invocation::{Invocation, Operation};
use porch_api::v1alpha2::PackageRevision;
use porch_engine::repository::repository_key;
use porch_engine::runner::Runner;
use porch_git::snapshot::Manifest;
use porch_git::store::{
    ETag, Fetched, LocalDirStore, ObjectStore, PutCondition, StoreError, StoredObject,
};
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::runtime::Runtimes;
use pretty_assertions::assert_eq;

use crate::support::{applied, empty_repo, git, invocation, with};

/// A local store whose manifest writes fail, as if the process died right
/// after its push.
#[derive(Debug, Clone)]
struct NoManifestWrites {
    inner: LocalDirStore,
    refused: Arc<AtomicUsize>,
}

impl ObjectStore for NoManifestWrites {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        self.inner.get(key).await
    }

    async fn get_if_changed(&self, key: &str, known: Option<&ETag>) -> Result<Fetched, StoreError> {
        self.inner.get_if_changed(key, known).await
    }

    async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: PutCondition,
    ) -> Result<ETag, StoreError> {
        if key.ends_with("manifest.json") {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable {
                step: "put",
                key: key.to_owned(),
                message: "connection reset".into(),
                transient: true,
            });
        }
        self.inner.put(key, body, condition).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }
}

fn runner<S: ObjectStore + Clone + 'static>(cache: &std::path::Path, store: S) -> Runner<S> {
    let functions = Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog())));
    Runner::new(cache, functions).with_store(store)
}

/// A new Draft with an init source, as the user creates it.
fn new_draft() -> PackageRevision {
    let mut pr = invocation("source", serde_json::json!({}))
        .package_revision
        .expect("revision");
    pr.status = None;
    pr.spec.source = serde_json::from_value(serde_json::json!({"init": {"description": "runner"}}))
        .expect("an init source");
    pr
}

fn manifest_refs(store: &LocalDirStore, inv: &Invocation) -> Vec<String> {
    let key = format!("repos/{}/manifest.json", repository_key(&inv.repository));
    store
        .get_blocking(&key)
        .ok()
        .flatten()
        .and_then(|o| Manifest::decode(&o.body).ok())
        .map(|m| m.ref_ids().into_keys().collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_same_invocation_twice_commits_once_and_the_snapshot_follows() -> anyhow::Result<()> {
    let repo = empty_repo()?;
    let url = repo.remote.display().to_string();
    let tmp = tempfile::tempdir()?;
    let store = LocalDirStore::new(tmp.path().join("store"));
    let runner = runner(&tmp.path().join("cache"), store.clone());
    let inv = with(&new_draft(), Operation::Source, &url);

    let first = runner.handle(&inv).await?;
    let second = runner.handle(&inv).await?;
    assert_eq!(first, second);
    assert_eq!(
        git(&repo.remote, &["rev-list", "--count", "drafts/app/v1"]).trim(),
        "1"
    );
    assert_eq!(
        manifest_refs(&store, &inv),
        vec!["refs/heads/drafts/app/v1"]
    );

    // A cold process (empty cache) starts from the snapshot and agrees.
    let cold = self::runner(&tmp.path().join("cold"), store.clone());
    assert_eq!(cold.handle(&inv).await?, first);
    assert_eq!(
        git(&repo.remote, &["rev-list", "--count", "drafts/app/v1"]).trim(),
        "1"
    );
    Ok(())
}

#[tokio::test]
async fn nothing_due_touches_neither_git_nor_the_store() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let store = LocalDirStore::new(tmp.path().join("store"));
    let runner = runner(&tmp.path().join("cache"), store.clone());
    // Rendered already, nothing requested: no render is due.
    let mut inv = invocation("render", serde_json::json!({}));
    if let Some(status) = inv
        .package_revision
        .as_mut()
        .and_then(|p| p.status.as_mut())
    {
        for c in &mut status.conditions {
            c.status = "True".into();
        }
    }
    if let Some(git) = inv.repository.spec.git.as_mut() {
        git.repo = "/nonexistent/remote.git".into();
    }
    assert!(runner.handle(&inv).await?.is_empty());
    assert!(!tmp.path().join("store").exists());
    assert!(!tmp.path().join("cache").exists());
    Ok(())
}

#[tokio::test]
async fn a_crash_between_push_and_snapshot_write_converges_on_redelivery() -> anyhow::Result<()> {
    let repo = empty_repo()?;
    let url = repo.remote.display().to_string();
    let tmp = tempfile::tempdir()?;
    let store = LocalDirStore::new(tmp.path().join("store"));
    let healthy = runner(&tmp.path().join("a"), store.clone());

    let mut pr = new_draft();
    let outcome = healthy.handle(&with(&pr, Operation::Source, &url)).await?;
    pr = applied(pr, &outcome);
    let outcome = healthy.handle(&with(&pr, Operation::Render, &url)).await?;
    pr = applied(pr, &outcome);
    pr.spec.lifecycle = Some(Lifecycle::Proposed);
    pr.metadata.generation = pr.metadata.generation.map(|g| g + 1);
    let outcome = healthy
        .handle(&with(&pr, Operation::Lifecycle, &url))
        .await?;
    pr = applied(pr, &outcome);
    assert!(
        manifest_refs(&store, &with(&pr, Operation::Sync, &url))
            .contains(&"refs/heads/proposed/app/v1".to_owned())
    );

    pr.spec.lifecycle = Some(Lifecycle::Published);
    pr.metadata.generation = pr.metadata.generation.map(|g| g + 1);
    pr.metadata.annotations = Some(
        [(
            porch_api::APPROVED_BY_ANNOTATION.to_owned(),
            "bob@example.com".to_owned(),
        )]
        .into(),
    );
    let publish = with(&pr, Operation::Lifecycle, &url);

    // The publish pushes, then its snapshot write fails.
    let refused = Arc::new(AtomicUsize::new(0));
    let crashing = runner(
        &tmp.path().join("b"),
        NoManifestWrites {
            inner: store.clone(),
            refused: Arc::clone(&refused),
        },
    );
    let first = crashing.handle(&publish).await?;
    assert!(
        refused.load(Ordering::SeqCst) > 0,
        "the snapshot write was attempted"
    );
    assert_eq!(git(&repo.remote, &["tag", "--list"]).trim(), "app/v1");
    let main = git(&repo.remote, &["rev-parse", "main"]);
    let stale = manifest_refs(&store, &publish);
    assert!(!stale.contains(&"refs/tags/app/v1".to_owned()), "{stale:?}");

    // Redelivered to a cold process that loads the stale snapshot.
    let cold = runner(&tmp.path().join("c"), store.clone());
    let second = cold.handle(&publish).await?;
    let revision =
        |o: &porch_api::invocation::Outcome| applied(pr.clone(), o).status.and_then(|s| s.revision);
    assert_eq!(revision(&first), Some(1));
    assert_eq!(revision(&second), Some(1));
    assert_eq!(git(&repo.remote, &["tag", "--list"]).trim(), "app/v1");
    assert_eq!(
        git(&repo.remote, &["rev-parse", "main"]),
        main,
        "no second approval commit"
    );
    git(&repo.remote, &["fsck", "--strict"]);
    // and the snapshot caught up with the remote
    let caught_up = manifest_refs(&store, &publish);
    assert!(
        caught_up.contains(&"refs/tags/app/v1".to_owned()),
        "{caught_up:?}"
    );
    assert!(!caught_up.contains(&"refs/heads/proposed/app/v1".to_owned()));
    Ok(())
}
