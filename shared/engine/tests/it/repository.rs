//! Remotes and mirrors from Repository objects.

use porch_engine::repository::{AnyRemote, mirror_dir, mirror_for, remote_for};
use porch_git::mirror::RetryPolicy;
use porch_git::remote::RemoteOptions;

use crate::support::{invocation, now};

fn repository(url: &str) -> porch_api::repository::Repository {
    let mut repo = invocation("sync", serde_json::json!({})).repository;
    if let Some(git) = repo.spec.git.as_mut() {
        git.repo = url.to_owned();
    }
    repo
}

#[test]
fn urls_pick_their_remote_and_bad_ones_are_refused() {
    assert!(matches!(
        remote_for(
            &repository("file:///srv/repo.git"),
            RemoteOptions::default()
        ),
        Ok(AnyRemote::Local(_))
    ));
    assert!(matches!(
        remote_for(&repository("/srv/repo.git"), RemoteOptions::default()),
        Ok(AnyRemote::Local(_))
    ));
    assert!(matches!(
        remote_for(
            &repository("https://example.com/repo.git"),
            RemoteOptions::default()
        ),
        Ok(AnyRemote::Smart(_))
    ));
    for bad in [
        "git@example.com:org/repo.git",
        "ssh://example.com/repo.git",
        "relative/path",
        "ftp://x/y",
    ] {
        let err = remote_for(&repository(bad), RemoteOptions::default()).expect_err(bad);
        assert!(!err.is_retryable(), "{bad}");
    }
    let root = std::path::Path::new("/cache");
    assert_ne!(
        mirror_dir(&repository("https://a/x.git"), root),
        mirror_dir(&repository("https://b/x.git"), root)
    );
    assert!(mirror_dir(&repository("https://a/x.git"), root).starts_with("/cache/default"));
}

#[tokio::test]
async fn a_handler_runs_on_the_mirror_of_a_file_url() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let bare = dir.path().join("repo.git");
    porch_git::repo::GitRepo::init_bare(&bare)?;
    let mut inv = invocation("source", serde_json::json!({}));
    if let Some(git) = inv.repository.spec.git.as_mut() {
        git.repo = format!("file://{}", bare.display());
    }
    if let Some(pr) = inv.package_revision.as_mut() {
        pr.status = None;
    }
    let mirror = mirror_for(
        &inv.repository,
        &dir.path().join("cache"),
        RemoteOptions::default(),
        RetryPolicy::default(),
    )?;
    let outcome = porch_engine::source::source(&inv, &mirror, &now()).await?;
    assert!(!outcome.is_empty());
    let head = porch_git::repo::GitRepo::open(&bare)?.ref_id("refs/heads/drafts/app/v1")?;
    assert!(head.is_some());
    Ok(())
}
