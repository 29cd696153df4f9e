//! The Runner: the snapshot around the handlers, redelivery, and a crash
//! between the push and the snapshot write.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use porch_api::common::Lifecycle;
use porch_api::invocation::{Invocation, Operation};
use porch_api::v1alpha2::PackageRevision;
use porch_engine::repository::repository_key;
use porch_engine::runner::Runner;
use porch_git::egress::EgressPolicy;
use porch_git::repo::GitRepo;
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

fn repository_object(name: &str, url: &std::path::Path) -> porch_api::repository::Repository {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1",
        "kind": "Repository",
        "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid")},
        "spec": {"type": "git", "git": {"repo": url.display().to_string(), "branch": "main"}}
    }))
    .expect("a repository")
}

/// A clone into `deploy` of `package`, from `source`.
fn clone_into(deploy: &std::path::Path, package: &str, source: serde_json::Value) -> Invocation {
    let mut inv = invocation("source", serde_json::json!({}));
    inv.repository = repository_object("deploy", deploy);
    if let Some(pr) = inv.package_revision.as_mut() {
        pr.metadata.name = Some(format!("deploy.{package}.v1"));
        pr.metadata.uid = Some(format!("uid-{package}"));
        pr.spec.package_name = package.to_owned();
        pr.spec.repository = "deploy".into();
        pr.status = None;
        pr.spec.source = serde_json::from_value(serde_json::json!({ "cloneFrom": source }))
            .expect("a clone source");
    }
    inv
}

fn ready_message(outcome: &porch_api::invocation::Outcome) -> String {
    let json = serde_json::to_value(&outcome.patches[0].patch).expect("patch");
    json[1]["value"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| {
            format!(
                "{}/{}: {}",
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            )
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn clones_come_from_other_repositories_and_git_urls() -> anyhow::Result<()> {
    let upstream = empty_repo()?;
    crate::support::publish(
        &upstream.mirror,
        "app",
        "v1",
        crate::support::package(crate::support::LABELS),
    )
    .await?;
    let deploy = empty_repo()?;
    let tmp = tempfile::tempdir()?;
    // the upstream is a local path: allowed for clones here
    let runner = runner(
        &tmp.path().join("cache"),
        LocalDirStore::new(tmp.path().join("store")),
    )
    .with_clone_egress(EgressPolicy::with_allowlist("file").map_err(anyhow::Error::msg)?);

    // From a published revision of another registered repository.
    let mut inv = clone_into(
        &deploy.remote,
        "shop",
        serde_json::json!({"upstreamRef": {"name": "blueprints.app.v1"}}),
    );
    let mut app = crate::support::published_revision("blueprints.app.v1", "app", "v1", 1);
    app.spec.repository = "blueprints".into();
    inv.upstream = Some(app);
    inv.upstream_repository = Some(repository_object("blueprints", &upstream.remote));
    let outcome = runner.handle(&inv).await?;
    assert!(
        ready_message(&outcome).starts_with("False/Pending"),
        "{}",
        ready_message(&outcome)
    );
    let kptfile = git(&deploy.remote, &["show", "drafts/shop/v1:shop/Kptfile"]);
    assert!(
        kptfile.contains(&format!("repo: {}", upstream.remote.display())),
        "{kptfile}"
    );
    assert!(kptfile.contains("ref: app/v1"), "{kptfile}");
    assert!(git(&deploy.remote, &["show", "drafts/shop/v1:shop/cm.yaml"]).contains("kpt-merge"));
    // without the upstream's Repository it is a clear refusal
    let mut orphan = clone_into(
        &deploy.remote,
        "lost",
        serde_json::json!({"upstreamRef": {"name": "blueprints.app.v1"}}),
    );
    orphan.upstream = inv.upstream.clone();
    let refused = runner.handle(&orphan).await?;
    assert!(
        ready_message(&refused).contains("which the invocation does not name"),
        "{}",
        ready_message(&refused)
    );

    // From a git URL, by tag, branch or commit.
    let url = format!("file://{}", upstream.remote.display());
    let commit = git(&upstream.remote, &["rev-parse", "app/v1^{commit}"])
        .trim()
        .to_owned();
    for (package, reference) in [
        ("by-tag", "app/v1"),
        // the package's own tag `<directory>/<ref>` before a plain `v1`
        ("by-package-tag", "v1"),
        ("by-branch", "main"),
        ("by-commit", commit.as_str()),
    ] {
        let inv = clone_into(
            &deploy.remote,
            package,
            serde_json::json!({"git": {"repo": url, "ref": reference, "directory": "app"}}),
        );
        let outcome = runner.handle(&inv).await?;
        assert!(
            ready_message(&outcome).starts_with("False/Pending"),
            "{package}: {}",
            ready_message(&outcome)
        );
        let kptfile = git(
            &deploy.remote,
            &["show", &format!("drafts/{package}/v1:{package}/Kptfile")],
        );
        assert!(kptfile.contains(&format!("ref: {reference}")), "{kptfile}");
        assert!(kptfile.contains(&format!("commit: {commit}")), "{kptfile}");
    }
    let before = git(&deploy.remote, &["for-each-ref"]);
    for (source, expected) in [
        (
            serde_json::json!({"git": {"repo": url, "ref": "nope", "directory": "app"}}),
            "no branch, tag or commit \"nope\"",
        ),
        (
            serde_json::json!({"git": {"repo": url, "ref": "main", "directory": "missing"}}),
            "no Kptfile",
        ),
        (
            serde_json::json!({"git": {"repo": url, "ref": "main", "directory": "../app"}}),
            "directory",
        ),
        (
            serde_json::json!({"git": {"repo": "ftp://x/y", "ref": "main", "directory": "app"}}),
            "scheme",
        ),
        (
            serde_json::json!({"git": {"repo": url, "ref": "main", "directory": "app", "secretRef": {"name": "creds"}}}),
            "Secret default/creds: no secret store is configured",
        ),
    ] {
        let outcome = runner
            .handle(&clone_into(&deploy.remote, "bad", source))
            .await?;
        let message = ready_message(&outcome);
        assert!(
            message.starts_with("False/Failed") && message.contains(expected),
            "{expected}: {message}"
        );
    }
    assert_eq!(
        git(&deploy.remote, &["for-each-ref"]),
        before,
        "refusals write nothing"
    );
    Ok(())
}

/// A clone's git URL is the user's choice: by default it may not lead to
/// the handler's own disk, the cloud metadata service, loopback or private
/// addresses, by address or by name. Each is a refusal in the status,
/// nothing is written and no request reaches the server.
#[tokio::test]
async fn clones_from_internal_addresses_are_refused() -> anyhow::Result<()> {
    let upstream = empty_repo()?;
    crate::support::publish(&upstream.mirror, "app", "v1", versioned("1", "no")).await?;
    // a listener nobody should connect to
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let deploy = empty_repo()?;
    let tmp = tempfile::tempdir()?;
    let runner = runner(
        &tmp.path().join("cache"),
        LocalDirStore::new(tmp.path().join("store")),
    );
    let before = git(&deploy.remote, &["for-each-ref"]);
    for (repo, expected) in [
        (
            format!("file://{}", upstream.remote.display()),
            "local paths are not allowed",
        ),
        (upstream.remote.display().to_string(), "is not valid"),
        (
            "http://169.254.169.254/latest/meta-data/repo.git".to_owned(),
            "169.254.169.254 is not allowed: a link-local address",
        ),
        (
            format!("http://127.0.0.1:{port}/repo.git"),
            "127.0.0.1 is not allowed: a loopback address",
        ),
        (
            format!("http://localhost:{port}/repo.git"),
            "localhost resolves to",
        ),
        (
            "https://10.20.30.40/repo.git".to_owned(),
            "a private address",
        ),
    ] {
        let outcome = runner
            .handle(&clone_into(
                &deploy.remote,
                "bad",
                serde_json::json!({"git": {"repo": repo, "ref": "main", "directory": "app"}}),
            ))
            .await?;
        let message = ready_message(&outcome);
        assert!(
            message.starts_with("False/Failed") && message.contains(expected),
            "{repo}: {message}"
        );
    }
    assert_eq!(git(&deploy.remote, &["for-each-ref"]), before);
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nothing connected to the loopback listener"
    );
    Ok(())
}

/// A file set of `app` whose ConfigMap carries `version` and `local`.
fn versioned(version: &str, local: &str) -> crate::support::Files {
    [
        ("Kptfile", "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: app\n".to_owned()),
        ("cm.yaml", format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  version: \"{version}\"\n  local: \"{local}\"\n")),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_owned(), c.into_bytes()))
    .collect()
}

#[tokio::test]
async fn upgrades_take_the_upstream_from_another_repository() -> anyhow::Result<()> {
    let upstream = empty_repo()?;
    crate::support::publish(&upstream.mirror, "app", "v1", versioned("1", "no")).await?;
    crate::support::publish(&upstream.mirror, "app", "v2", versioned("2", "no")).await?;
    let deploy = empty_repo()?;
    let tmp = tempfile::tempdir()?;
    let runner = runner(
        &tmp.path().join("cache"),
        LocalDirStore::new(tmp.path().join("store")),
    );
    let blueprints = repository_object("blueprints", &upstream.remote);
    let old = crate::support::published_revision("blueprints.app.v1", "app", "v1", 1);
    let new = crate::support::published_revision("blueprints.app.v2", "app", "v2", 2);

    // clone v1 into the deployment repository, change it there, publish
    let mut clone = clone_into(
        &deploy.remote,
        "shop",
        serde_json::json!({"upstreamRef": {"name": "blueprints.app.v1"}}),
    );
    clone.upstream = Some(old.clone());
    clone.upstream_repository = Some(blueprints.clone());
    runner.handle(&clone).await?;
    let git_repo = GitRepo::open(&deploy.remote)?;
    let head = git_repo
        .ref_id("refs/heads/drafts/shop/v1")?
        .ok_or_else(|| anyhow::anyhow!("no clone"))?;
    let mut local = git_repo.read_files(head, "shop")?;
    let cm =
        String::from_utf8(local["cm.yaml"].clone())?.replace("local: \"no\"", "local: \"yes\"");
    local.insert("cm.yaml".into(), cm.into_bytes());
    crate::support::publish(&deploy.mirror, "shop", "live", local).await?;
    let mut current = crate::support::published_revision("deploy.shop.live", "shop", "live", 1);
    current.spec.repository = "deploy".into();

    // upgrade onto v2: old and new upstream from blueprints, current here
    let upgrade = |old_name: &str| {
        let mut inv = clone_into(&deploy.remote, "shop", serde_json::json!({}));
        if let Some(pr) = inv.package_revision.as_mut() {
            pr.metadata.name = Some("deploy.shop.v2".into());
            pr.metadata.uid = Some("uid-shop-v2".into());
            pr.spec.workspace_name = "v2".into();
            pr.spec.source = serde_json::from_value(serde_json::json!({"upgrade": {
                "oldUpstream": {"name": old_name},
                "newUpstream": {"name": "blueprints.app.v2"},
                "currentPackage": {"name": "deploy.shop.live"}}}))
            .expect("an upgrade source");
        }
        inv.upstream = Some(new.clone());
        inv.upstream_repository = Some(blueprints.clone());
        inv.related = vec![old.clone(), new.clone(), current.clone()];
        inv
    };

    // without the upstream's Repository: a clear refusal, nothing written
    let mut orphan = upgrade("blueprints.app.v1");
    orphan.upstream_repository = None;
    let refused = runner.handle(&orphan).await?;
    assert!(
        ready_message(&refused).contains("which the invocation does not name"),
        "{}",
        ready_message(&refused)
    );
    assert!(
        GitRepo::open(&deploy.remote)?
            .ref_id("refs/heads/drafts/shop/v2")?
            .is_none()
    );
    // old and new upstream of different packages: refused
    let refused = runner.handle(&upgrade("deploy.shop.live")).await?;
    assert!(
        ready_message(&refused).contains("must be revisions of one package"),
        "{}",
        ready_message(&refused)
    );

    let outcome = runner.handle(&upgrade("blueprints.app.v1")).await?;
    assert!(
        ready_message(&outcome).starts_with("False/Pending"),
        "{}",
        ready_message(&outcome)
    );
    let upgraded = git(&deploy.remote, &["show", "drafts/shop/v2:shop/cm.yaml"]);
    assert!(upgraded.contains("version: \"2\""), "{upgraded}");
    assert!(upgraded.contains("local: \"yes\""), "{upgraded}");
    let kptfile = git(&deploy.remote, &["show", "drafts/shop/v2:shop/Kptfile"]);
    assert!(kptfile.contains("ref: app/v2"), "{kptfile}");
    assert!(
        kptfile.contains(&format!("repo: {}", upstream.remote.display())),
        "{kptfile}"
    );
    Ok(())
}
