//! Fetch and push against real servers on loopback: `git http-backend`
//! behind a small HTTP server, `git daemon` with receive-pack, and a local
//! bare repository; results checked with the git CLI.

use crate::support::{
    bare_upstream, files, git, git_commit_files, git_daemon, http_server, upstream_with_main,
};
use porch_api::v1alpha1::{Task, TaskType};
use porch_git::identity::Identity;
use porch_git::layout::RepoLayout;
use porch_git::listing::RefMap;
use porch_git::mirror::{Mirror, RetryPolicy, ref_changes};
use porch_git::operations::{Actor, Packages};
use porch_git::pktline::RefRejection;
use porch_git::remote::{
    Credentials, LocalRemote, Remote, RemoteError, RemoteOptions, SmartRemote, StaticCredentials,
};
use porch_git::repo::{GitRepo, RefUpdate};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

fn actor(uid: &str) -> Actor {
    crate::support::actor(uid, 1)
}

fn init_task() -> Task {
    Task {
        type_: TaskType::Init,
        ..Default::default()
    }
}

/// The operation creating draft `workspace` of `package` for PackageRevision `uid`.
fn create_draft(
    package: &'static str,
    workspace: &'static str,
    uid: &'static str,
) -> impl Fn(&GitRepo) -> Result<gix::ObjectId, porch_git::operations::OperationError>
+ Send
+ Sync
+ 'static {
    move |repo| {
        Packages {
            repo,
            layout: RepoLayout::new("", "main"),
        }
        .create_draft(package, workspace, &files("1"), init_task(), &actor(uid))
    }
}

/// `git show-ref` of a repository as a map.
fn show_refs(dir: &Path) -> BTreeMap<String, String> {
    git(dir, &["for-each-ref", "--format=%(refname) %(objectname)"])
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, id)| (n.to_owned(), id.to_owned()))
        .collect()
}

fn fsck(dir: &Path) {
    git(dir, &["fsck", "--strict", "--no-dangling"]);
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        base_delay: std::time::Duration::from_millis(10),
        ..RetryPolicy::default()
    }
}

/// Draft → proposed → published through a mirror of `remote`, then the
/// upstream checked with the git CLI.
async fn lifecycle_through<R: Remote>(remote: R, upstream: &Path) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mirror = Mirror::new(tmp.path().join("mirror"), remote, fast_retries()).expect("mirror");
    let refs = mirror.fetch().await.expect("fetch");
    let expected: BTreeMap<String, String> = refs
        .iter()
        .map(|(n, id)| (n.clone(), id.to_string()))
        .collect();
    assert_eq!(
        expected,
        show_refs(upstream),
        "fetch sees every upstream ref"
    );

    let layout = RepoLayout::new("", "main");
    let draft = {
        let layout = layout.clone();
        mirror
            .apply(move |repo| {
                Packages {
                    repo,
                    layout: layout.clone(),
                }
                .create_draft(
                    "basens",
                    "ws1",
                    &files("1"),
                    init_task(),
                    &actor("uid-1"),
                )
            })
            .await
            .expect("create draft")
    };
    assert_eq!(draft.updates.len(), 1);
    assert_eq!(
        show_refs(upstream).get("refs/heads/drafts/basens/ws1"),
        Some(&draft.value.to_string())
    );
    let layout2 = layout.clone();
    mirror
        .apply(move |repo| {
            Packages {
                repo,
                layout: layout2.clone(),
            }
            .propose("basens", "ws1")
        })
        .await
        .expect("propose");
    let layout3 = layout.clone();
    let published = mirror
        .apply(move |repo| {
            Packages {
                repo,
                layout: layout3.clone(),
            }
            .publish("basens", "ws1", &actor("uid-1"))
        })
        .await
        .expect("publish");
    assert_eq!(published.value, 1);
    assert_eq!(
        published.updates.len(),
        3,
        "branch, tag and proposed in one push"
    );
    let after = show_refs(upstream);
    assert!(after.contains_key("refs/tags/basens/v1"), "{after:?}");
    assert!(
        !after.contains_key("refs/heads/proposed/basens/ws1"),
        "{after:?}"
    );
    assert_eq!(
        after.get("refs/tags/basens/v1"),
        after.get("refs/heads/main")
    );
    assert_eq!(
        git(upstream, &["show", "main:basens/cm.yaml"]),
        "version: 1\n"
    );
    let parents = git(upstream, &["log", "-1", "--format=%P", "main"]);
    assert_eq!(
        parents.split_whitespace().count(),
        2,
        "publish is a merge commit"
    );
    fsck(upstream);

    // the same publish again is recognised: nothing pushed
    let layout4 = layout.clone();
    let again = mirror
        .apply(move |repo| {
            Packages {
                repo,
                layout: layout4.clone(),
            }
            .publish("basens", "ws1", &actor("uid-1"))
        })
        .await
        .expect("publish again");
    assert_eq!((again.value, again.updates.len()), (1, 0));
    assert_eq!(show_refs(upstream), after);
}

#[tokio::test]
async fn lifecycle_over_smart_http() {
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = upstream_with_main(root.path());
    let server = http_server(root.path(), None);
    let url = format!("http://127.0.0.1:{}/repo.git", server.port);
    let remote = SmartRemote::new(&url, RemoteOptions::default()).expect("remote");
    lifecycle_through(remote, &upstream).await;
}

#[tokio::test]
async fn lifecycle_over_git_daemon() {
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = upstream_with_main(root.path());
    let server = git_daemon(root.path());
    let url = format!("git://127.0.0.1:{}/repo.git", server.port);
    let remote = SmartRemote::new(&url, RemoteOptions::default()).expect("remote");
    lifecycle_through(remote, &upstream).await;
}

#[tokio::test]
async fn lifecycle_on_a_local_bare_repository() {
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = upstream_with_main(root.path());
    lifecycle_through(LocalRemote::new(&upstream), &upstream).await;
    // objects copied as their compressed files are whole and named right
    fsck(&upstream);
    let loose = crate::support::git(&upstream, &["count-objects", "-v"]);
    assert!(
        loose.lines().next().is_some_and(|l| l != "count: 0"),
        "nothing was copied loose: {loose}"
    );
}

#[tokio::test]
async fn empty_remote_is_fetched_and_pushed_to() {
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = bare_upstream(root.path(), "empty");
    let server = http_server(root.path(), None);
    let remote = SmartRemote::new(
        &format!("http://127.0.0.1:{}/empty.git", server.port),
        RemoteOptions::default(),
    )
    .expect("remote");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mirror = Mirror::new(tmp.path().join("m"), remote, fast_retries()).expect("mirror");
    assert!(mirror.fetch().await.expect("fetch").is_empty());
    let applied = mirror
        .apply(create_draft("a/b", "ws", "u"))
        .await
        .expect("draft");
    assert_eq!(
        show_refs(&upstream).get("refs/heads/drafts/a/b/ws"),
        Some(&applied.value.to_string())
    );
    fsck(&upstream);
}

/// A second fetch after upstream changes brings only the new commit, and
/// refs deleted upstream disappear from the mirror.
#[tokio::test]
async fn fetch_is_incremental_and_prunes() {
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = bare_upstream(root.path(), "repo");
    git_commit_files(
        &upstream,
        "main",
        &[("a/Kptfile", "kind: Kptfile\n")],
        "one",
    );
    git_commit_files(&upstream, "drafts/a/ws", &[("a/x.yaml", "x: 1\n")], "draft");
    let server = http_server(root.path(), None);
    let remote = SmartRemote::new(
        &format!("http://127.0.0.1:{}/repo.git", server.port),
        RemoteOptions::default(),
    )
    .expect("remote");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mirror_dir = tmp.path().join("m");
    GitRepo::init_bare(&mirror_dir).expect("init");
    remote.fetch(&mirror_dir).await.expect("first fetch");
    git_commit_files(
        &upstream,
        "main",
        &[("b/Kptfile", "kind: Kptfile\nname: b\n")],
        "two",
    );
    git(&upstream, &["update-ref", "-d", "refs/heads/drafts/a/ws"]);
    let packs_before = std::fs::read_dir(mirror_dir.join("objects/pack"))
        .expect("packs")
        .count();
    let refs = remote.fetch(&mirror_dir).await.expect("second fetch");
    assert!(!refs.contains_key("refs/heads/drafts/a/ws"));
    let mirror = GitRepo::open(&mirror_dir).expect("open");
    let local: BTreeMap<String, String> = mirror
        .try_refs_unpeeled()
        .expect("refs")
        .into_iter()
        .map(|(n, id)| (n, id.to_string()))
        .collect();
    assert_eq!(local, show_refs(&upstream));
    let new_pack = std::fs::read_dir(mirror_dir.join("objects/pack"))
        .expect("packs")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "idx"))
        .map(|e| e.path())
        .collect::<Vec<_>>();
    assert_eq!(new_pack.len() * 2, packs_before + 2, "one new pack");
    // the new pack holds the new commit, its root tree, b/ and b/Kptfile: the
    // server stopped at the commit the mirror already had
    let counts: Vec<usize> = new_pack
        .iter()
        .map(|idx| {
            let mut command = crate::support::git_command();
            command.arg("verify-pack").arg("-v").arg(idx);
            crate::support::run(command)
                .lines()
                .filter(|l| l.contains(" commit ") || l.contains(" tree ") || l.contains(" blob "))
                .count()
        })
        .collect();
    assert!(counts.contains(&4), "pack object counts {counts:?}");
    // the mirror is a valid repository by git's standards
    let mut command = crate::support::git_command();
    command
        .arg("--git-dir")
        .arg(&mirror_dir)
        .args(["fsck", "--strict"]);
    crate::support::run(command);
}

/// An upstream repository (commits of `a/Kptfile`, then `a/x` when `two`)
/// behind the HTTP test server, a remote for it, and an empty mirror.
struct Served {
    _root: tempfile::TempDir,
    upstream: std::path::PathBuf,
    _server: crate::support::Server,
    remote: SmartRemote,
    mirror_dir: std::path::PathBuf,
    mirror: GitRepo,
}

fn served(two_commits: bool, deny_non_fast_forwards: bool) -> Served {
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = bare_upstream(root.path(), "repo");
    git_commit_files(
        &upstream,
        "main",
        &[("a/Kptfile", "kind: Kptfile\n")],
        "one",
    );
    if two_commits {
        git_commit_files(&upstream, "main", &[("a/x", "2\n")], "two");
    }
    if deny_non_fast_forwards {
        git(
            &upstream,
            &["config", "receive.denyNonFastForwards", "true"],
        );
    }
    let server = http_server(root.path(), None);
    let remote = SmartRemote::new(
        &format!("http://127.0.0.1:{}/repo.git", server.port),
        RemoteOptions::default(),
    )
    .expect("remote");
    let mirror_dir = root.path().join("mirror");
    let mirror = GitRepo::init_bare(&mirror_dir).expect("init");
    Served {
        _root: root,
        upstream,
        _server: server,
        remote,
        mirror_dir,
        mirror,
    }
}

/// A commit of `tree` on `parent` in the mirror.
fn commit_on(mirror: &GitRepo, tree: gix::ObjectId, parent: gix::ObjectId) -> gix::ObjectId {
    let who = Identity::of_user("a@b.c");
    mirror
        .commit(tree, &[parent], "change", &who, &who, 1)
        .expect("commit")
}

/// Pushes one compare-and-swap update of `refs/heads/main`.
async fn push_main(
    remote: &SmartRemote,
    mirror_dir: &Path,
    expected: Option<gix::ObjectId>,
    new: Option<gix::ObjectId>,
) -> Result<(), RemoteError> {
    remote
        .push(
            mirror_dir,
            &[RefUpdate {
                name: "refs/heads/main".into(),
                expected,
                new,
            }],
        )
        .await
}

/// A push whose expected old id is stale is refused before any pack is sent.
#[tokio::test]
async fn stale_expected_id_is_a_conflict() {
    let Served {
        _root,
        _server,
        upstream,
        remote,
        mirror_dir,
        mirror,
    } = served(false, false);
    let refs = remote.fetch(&mirror_dir).await.expect("fetch");
    let main = refs["refs/heads/main"];
    git_commit_files(&upstream, "main", &[("a/x", "moved\n")], "someone else");
    let before = show_refs(&upstream);
    let tree = mirror.write_files(&files("2")).expect("tree");
    let mine = commit_on(&mirror, tree, main);
    let err = push_main(&remote, &mirror_dir, Some(main), Some(mine))
        .await
        .expect_err("stale");
    assert!(err.is_conflict(), "{err}");
    assert!(!err.is_transient());
    assert_eq!(show_refs(&upstream), before, "nothing changed upstream");
    // creating a ref that exists is a conflict too
    let err = push_main(&remote, &mirror_dir, None, Some(mine))
        .await
        .expect_err("exists");
    assert!(
        matches!(&err, RemoteError::Rejected { refs, .. } if refs[0].1 == RefRejection::AlreadyExists),
        "{err:?}"
    );
}

/// Refusals decided by the server itself come back typed: a
/// non-fast-forward with `receive.denyNonFastForwards`, a declining hook.
#[tokio::test]
async fn server_rejections_are_typed() {
    let Served {
        _root,
        _server,
        upstream,
        remote,
        mirror_dir,
        mirror,
    } = served(true, true);
    let refs = remote.fetch(&mirror_dir).await.expect("fetch");
    let main = refs["refs/heads/main"];
    let parent = mirror.first_parents(main, 2).expect("history")[1];
    let err = push_main(&remote, &mirror_dir, Some(main), Some(parent))
        .await
        .expect_err("non-fast-forward");
    assert!(
        matches!(&err, RemoteError::Rejected { refs, .. } if refs[0].1 == RefRejection::NonFastForward),
        "{err:?}"
    );
    assert_eq!(show_refs(&upstream)["refs/heads/main"], main.to_string());

    let hook = upstream.join("hooks/pre-receive");
    std::fs::write(&hook, "#!/bin/sh\necho no >&2\nexit 1\n").expect("hook");
    let mut chmod = std::process::Command::new("chmod");
    chmod.arg("+x").arg(&hook);
    crate::support::run(chmod);
    let tree = mirror.write_files(&files("3")).expect("tree");
    let next = commit_on(&mirror, tree, main);
    let err = push_main(&remote, &mirror_dir, Some(main), Some(next))
        .await
        .expect_err("hook declines");
    assert!(
        matches!(&err, RemoteError::Rejected { refs, .. } if refs[0].1 == RefRejection::HookDeclined),
        "{err:?}"
    );
    assert!(err.is_transient(), "the reference retries declined hooks");
}

/// An atomic push with one bad ref changes none.
#[tokio::test]
async fn atomic_push_is_all_or_nothing() {
    let Served {
        _root,
        _server,
        upstream,
        remote,
        mirror_dir,
        mirror,
    } = served(true, true);
    let main = remote.fetch(&mirror_dir).await.expect("fetch")["refs/heads/main"];
    let parent = mirror.first_parents(main, 2).expect("history")[1];
    let before = show_refs(&upstream);
    let err = remote
        .push(
            &mirror_dir,
            &[
                RefUpdate {
                    name: "refs/tags/a/v1".into(),
                    expected: None,
                    new: Some(main),
                },
                RefUpdate {
                    name: "refs/heads/main".into(),
                    expected: Some(main),
                    new: Some(parent),
                },
            ],
        )
        .await
        .expect_err("rejected");
    assert!(matches!(err, RemoteError::Rejected { .. }), "{err:?}");
    assert_eq!(
        show_refs(&upstream),
        before,
        "the tag was not created either"
    );
}

#[tokio::test]
async fn server_errors_are_transient_and_retried() {
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = bare_upstream(root.path(), "repo");
    git_commit_files(&upstream, "main", &[("README.md", "x\n")], "one");
    let server = http_server(root.path(), None);
    let url = format!("http://127.0.0.1:{}/repo.git", server.port);
    let remote = SmartRemote::new(&url, RemoteOptions::default()).expect("remote");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mirror = Mirror::new(tmp.path().join("m"), remote, fast_retries()).expect("mirror");
    // two failures, then success: the draft lands once
    std::fs::write(root.path().join(".fail-receive-pack"), "2").expect("fault");
    let applied = mirror
        .apply(create_draft("p", "ws", "u"))
        .await
        .expect("draft after retries");
    assert_eq!(applied.attempts, 3);
    assert_eq!(
        show_refs(&upstream).get("refs/heads/drafts/p/ws"),
        Some(&applied.value.to_string())
    );
    // more failures than retries: a clear error, nothing changed
    std::fs::write(root.path().join(".fail-receive-pack"), "10").expect("fault");
    let before = show_refs(&upstream);
    let err = mirror
        .apply(create_draft("q", "ws", "u2"))
        .await
        .expect_err("gives up");
    assert!(err.to_string().contains("HTTP 500"), "{err}");
    assert_eq!(show_refs(&upstream), before);
}

#[tokio::test]
async fn basic_auth_is_required_and_used() {
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = bare_upstream(root.path(), "repo");
    git_commit_files(&upstream, "main", &[("README.md", "x\n")], "one");
    let server = http_server(root.path(), Some("porch:s3cret-c4n4ry"));
    let url = format!("http://127.0.0.1:{}/repo.git", server.port);
    let tmp = tempfile::tempdir().expect("tempdir");
    let mirror_dir = tmp.path().join("m");
    GitRepo::init_bare(&mirror_dir).expect("init");

    let anonymous = SmartRemote::new(&url, RemoteOptions::default()).expect("remote");
    let err = anonymous.fetch(&mirror_dir).await.expect_err("401");
    assert!(
        matches!(err, RemoteError::Auth { status: 401, .. }),
        "{err:?}"
    );
    assert!(!err.is_transient());

    let wrong = SmartRemote::new(
        &url,
        RemoteOptions {
            credentials: Some(Arc::new(StaticCredentials(Credentials::Basic {
                username: "porch".into(),
                password: "wrong".into(),
            }))),
            ..RemoteOptions::default()
        },
    )
    .expect("remote");
    assert!(matches!(
        wrong.fetch(&mirror_dir).await,
        Err(RemoteError::Auth { .. })
    ));

    let resolved = SmartRemote::new(
        &url,
        RemoteOptions {
            credentials: Some(Arc::new(StaticCredentials(Credentials::Basic {
                username: "porch".into(),
                password: "s3cret-c4n4ry".into(),
            }))),
            ..RemoteOptions::default()
        },
    )
    .expect("remote");
    assert_eq!(resolved.fetch(&mirror_dir).await.expect("fetch").len(), 1);

    // user information in the URL works too and is never shown
    let in_url = format!(
        "http://porch:s3cret-c4n4ry@127.0.0.1:{}/repo.git",
        server.port
    );
    let remote = SmartRemote::new(&in_url, RemoteOptions::default()).expect("remote");
    assert!(!remote.url().contains("s3cret-c4n4ry"));
    assert!(!format!("{remote:?}").contains("s3cret-c4n4ry"));
    assert_eq!(remote.fetch(&mirror_dir).await.expect("fetch").len(), 1);
}

#[test]
fn unusable_urls_are_refused_clearly() {
    for (url, needle) in [
        ("ssh://git@example.com/repo.git", "SSH"),
        ("git@example.com:org/repo.git", "SSH"),
        ("ftp://example.com/repo.git", "ftp"),
        ("file:///tmp/repo.git", "file"),
        ("not a url", "relative URL"),
        ("https://user:hunter2@", "empty host"),
    ] {
        let err = SmartRemote::new(url, RemoteOptions::default()).expect_err(url);
        let text = err.to_string();
        assert!(text.contains(needle), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
    let err = SmartRemote::new(
        "https://example.com/repo.git",
        RemoteOptions {
            ca_bundle: Some(b"not a certificate".to_vec()),
            ..RemoteOptions::default()
        },
    )
    .expect_err("bad bundle");
    assert!(err.to_string().contains("CA bundle"), "{err}");
}

#[tokio::test]
async fn unreachable_remote_is_transient() {
    let port = crate::support::free_port();
    let remote = SmartRemote::new(
        &format!("http://127.0.0.1:{port}/repo.git"),
        RemoteOptions::default(),
    )
    .expect("remote");
    let tmp = tempfile::tempdir().expect("tempdir");
    GitRepo::init_bare(tmp.path()).expect("init");
    let err = remote.fetch(tmp.path()).await.expect_err("refused");
    assert!(err.is_transient(), "{err:?}");
}

#[test]
fn a_want_that_moved_since_the_advertisement_is_retried() {
    let moved = RemoteError::Server {
        url: "http://git.example.com/repo.git".into(),
        message: "upload-pack: not our ref 4b825dc642cb6eb9a060e54bf8d69288fbee4904".into(),
    };
    assert!(moved.is_transient(), "{moved}");
    let other = RemoteError::Server {
        url: "http://git.example.com/repo.git".into(),
        message: "upload-pack: repository is corrupt".into(),
    };
    assert!(!other.is_transient(), "{other}");
}

/// Hostile ref names never reach the wire.
#[tokio::test]
async fn bad_ref_updates_are_refused_before_connecting() {
    let remote = LocalRemote::new("/nonexistent");
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in [
        "HEAD",
        "refs/remotes/x",
        "refs/heads/../../etc",
        "refs/heads/a..b",
        "refs/heads/x\nrefs/heads/y",
    ] {
        let err = remote
            .push(
                tmp.path(),
                &[RefUpdate {
                    name: name.into(),
                    expected: None,
                    new: None,
                }],
            )
            .await
            .expect_err(name);
        assert!(matches!(err, RemoteError::BadUpdate(_)), "{name}: {err:?}");
    }
}

#[test]
fn ref_changes_are_compare_and_swap_updates() {
    let id = |n: u8| gix::ObjectId::from_bytes_or_panic(&[n; 20]);
    let before = RefMap::from([
        ("refs/heads/main".to_owned(), id(1)),
        ("refs/heads/proposed/a/ws".to_owned(), id(2)),
        ("refs/remotes/x".to_owned(), id(9)),
    ]);
    let after = RefMap::from([
        ("refs/heads/main".to_owned(), id(3)),
        ("refs/tags/a/v1".to_owned(), id(3)),
    ]);
    assert_eq!(
        ref_changes(&before, &after),
        vec![
            RefUpdate {
                name: "refs/heads/main".into(),
                expected: Some(id(1)),
                new: Some(id(3))
            },
            RefUpdate {
                name: "refs/tags/a/v1".into(),
                expected: None,
                new: Some(id(3))
            },
            RefUpdate {
                name: "refs/heads/proposed/a/ws".into(),
                expected: Some(id(2)),
                new: None
            },
        ]
    );
}

/// HTTPS with a private CA: refused without the bundle, works with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_custom_ca_bundle() {
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = bare_upstream(root.path(), "repo");
    git_commit_files(&upstream, "main", &[("README.md", "x\n")], "one");
    let server = http_server(root.path(), None);
    let (port, ca) = crate::support::tls_proxy(server.port).await;
    let url = format!("https://127.0.0.1:{port}/repo.git");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mirror_dir = tmp.path().join("m");
    GitRepo::init_bare(&mirror_dir).expect("init");

    let untrusted = SmartRemote::new(&url, RemoteOptions::default()).expect("remote");
    let err = untrusted
        .fetch(&mirror_dir)
        .await
        .expect_err("unknown issuer");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    let remote = SmartRemote::new(
        &url,
        RemoteOptions {
            ca_bundle: Some(ca),
            ..RemoteOptions::default()
        },
    )
    .expect("remote");
    let mirror = Mirror::new(&mirror_dir, remote, fast_retries()).expect("mirror");
    let applied = mirror
        .apply(create_draft("p", "ws", "u"))
        .await
        .expect("draft over https");
    assert_eq!(
        show_refs(&upstream).get("refs/heads/drafts/p/ws"),
        Some(&applied.value.to_string())
    );
}

/// 20 publishers of one package, each with its own mirror, racing through
/// the HTTP server: revisions 1..20 exactly once each, every proposed
/// branch gone, every draft's content on the branch history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishers_over_http_get_consecutive_revisions() {
    const PUBLISHERS: usize = 20;
    let root = tempfile::tempdir().expect("tempdir");
    let upstream = bare_upstream(root.path(), "repo");
    git_commit_files(&upstream, "main", &[("README.md", "x\n")], "one");
    let server = http_server(root.path(), None);
    let url = format!("http://127.0.0.1:{}/repo.git", server.port);
    let tmp = tempfile::tempdir().expect("tempdir");

    // drafts and proposals first, one mirror each
    let mut mirrors = Vec::new();
    for i in 0..PUBLISHERS {
        let remote = SmartRemote::new(&url, RemoteOptions::default()).expect("remote");
        let mirror = Arc::new(
            Mirror::new(tmp.path().join(format!("m{i}")), remote, fast_retries()).expect("mirror"),
        );
        let ws = format!("ws{i}");
        let body = format!("{i}");
        let ws2 = ws.clone();
        mirror
            .apply(move |repo| {
                let ops = Packages {
                    repo,
                    layout: RepoLayout::new("", "main"),
                };
                ops.create_draft(
                    "pkg",
                    &ws2,
                    &files(&body),
                    init_task(),
                    &actor(&format!("u{ws2}")),
                )?;
                ops.propose("pkg", &ws2)
            })
            .await
            .expect("draft and proposal");
        mirrors.push((mirror, ws));
    }
    let tasks: Vec<_> = mirrors
        .into_iter()
        .map(|(mirror, ws)| {
            tokio::spawn(async move {
                mirror
                    .apply(move |repo| {
                        Packages {
                            repo,
                            layout: RepoLayout::new("", "main"),
                        }
                        .publish("pkg", &ws, &actor(&format!("u{ws}")))
                    })
                    .await
            })
        })
        .collect();
    let mut revisions = Vec::new();
    let mut conflicts = 0;
    for task in tasks {
        let applied = task.await.expect("join").expect("publish");
        conflicts += applied.attempts - 1;
        revisions.push(applied.value);
    }
    revisions.sort_unstable();
    assert_eq!(revisions, (1..=PUBLISHERS as u64).collect::<Vec<_>>());
    let refs = show_refs(&upstream);
    for n in 1..=PUBLISHERS {
        assert!(
            refs.contains_key(&format!("refs/tags/pkg/v{n}")),
            "v{n} missing"
        );
    }
    assert!(!refs.keys().any(|r| r.contains("proposed/")), "{refs:?}");
    let merges = git(&upstream, &["rev-list", "--merges", "--count", "main"]);
    assert_eq!(merges.trim(), PUBLISHERS.to_string());
    fsck(&upstream);
    eprintln!("{PUBLISHERS} publishers: {conflicts} lost races retried");
}

/// A pkt-line of `text`.
fn pkt(text: &[u8]) -> Vec<u8> {
    porch_git::pktline::encode(text).expect("pkt")
}

/// A receive-pack advertisement of an empty repository.
fn empty_receive_pack_advertisement() -> Vec<u8> {
    let mut body = pkt(b"# service=git-receive-pack\n");
    body.extend_from_slice(b"0000");
    body.extend(pkt(
        b"0000000000000000000000000000000000000000 capabilities^{}\0report-status delete-refs side-band-64k atomic\n",
    ));
    body.extend_from_slice(b"0000");
    body
}

/// A mirror with one commit, and the update that creates `refs/heads/x`.
fn one_commit_mirror() -> (tempfile::TempDir, RefUpdate) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(tmp.path()).expect("init");
    let tree = repo.write_files(&files("1")).expect("tree");
    let who = Identity::of_user("a@b.c");
    let commit = repo
        .commit(tree, &[], "one", &who, &who, 1)
        .expect("commit");
    (
        tmp,
        RefUpdate {
            name: "refs/heads/x".into(),
            expected: None,
            new: Some(commit),
        },
    )
}

async fn hostile_server(
    advertisement: (u16, &str, Vec<u8>),
    report: Option<Vec<u8>>,
) -> wiremock::MockServer {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    let (status, content_type, body) = advertisement;
    Mock::given(method("GET"))
        .and(path("/repo.git/info/refs"))
        .respond_with(
            ResponseTemplate::new(status)
                .insert_header("content-type", content_type)
                .set_body_bytes(body),
        )
        .mount(&server)
        .await;
    if let Some(report) = report {
        Mock::given(method("POST"))
            .and(path("/repo.git/git-receive-pack"))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("content-type", "application/x-git-receive-pack-result")
                    .set_body_bytes(report),
            )
            .mount(&server)
            .await;
    }
    server
}

/// A server that answers badly gets a clear, typed error, never a panic or
/// a push taken as done.
#[tokio::test]
async fn hostile_servers_get_clear_errors() {
    const ADV: &str = "application/x-git-receive-pack-advertisement";
    let sideband = |payload: &[u8]| {
        let mut band = vec![1u8];
        band.extend(payload);
        let mut out = pkt(&band);
        out.extend_from_slice(b"0000");
        out
    };
    let report = |lines: &[&str]| {
        let mut out = Vec::new();
        for line in lines {
            out.extend(pkt(line.as_bytes()));
        }
        out.extend_from_slice(b"0000");
        out
    };
    type Advertised<'a> = (u16, &'a str, Vec<u8>);
    let cases: Vec<(Advertised, Option<Vec<u8>>, &str)> = vec![
        (
            (200, "text/plain", b"dumb".to_vec()),
            None,
            "not a smart git server",
        ),
        (
            (404, "text/plain", b"no such repository".to_vec()),
            None,
            "HTTP 404",
        ),
        (
            (200, ADV, b"zzzzgarbage".to_vec()),
            None,
            "malformed answer",
        ),
        (
            (200, ADV, b"0032not-an-id refs/heads/main\n".to_vec()),
            None,
            "malformed answer",
        ),
        ((200, ADV, b"00ff short".to_vec()), None, "malformed answer"),
        (
            (200, ADV, empty_receive_pack_advertisement()),
            Some(sideband(&report(&["unpack ok\n"]))),
            "malformed answer",
        ),
        (
            (200, ADV, empty_receive_pack_advertisement()),
            Some(sideband(&report(&[
                "unpack index-pack failed\n",
                "ng refs/heads/x unpacker error\n",
            ]))),
            "could not store the pushed objects",
        ),
        (
            (200, ADV, empty_receive_pack_advertisement()),
            Some({
                let mut out = pkt(b"\x03fatal: out of disk\n");
                out.extend_from_slice(b"0000");
                out
            }),
            "out of disk",
        ),
        (
            (200, ADV, empty_receive_pack_advertisement()),
            Some(b"\x00\x01\x02".to_vec()),
            "malformed answer",
        ),
    ];
    for (advertisement, post, needle) in cases {
        let server = hostile_server(advertisement, post).await;
        let remote = SmartRemote::new(
            &format!("{}/repo.git", server.uri()),
            RemoteOptions::default(),
        )
        .expect("remote");
        let (mirror, update) = one_commit_mirror();
        let err = remote
            .push(mirror.path(), &[update])
            .await
            .expect_err(needle);
        assert!(
            err.to_string().contains(needle),
            "expected {needle:?}: {err}"
        );
    }
    // an advertisement beyond the limit is refused, not buffered
    let mut huge = empty_receive_pack_advertisement();
    huge.truncate(huge.len() - 4);
    for i in 0..2000 {
        huge.extend(pkt(
            format!("{} refs/heads/b{i}\n", "1".repeat(40)).as_bytes()
        ));
    }
    huge.extend_from_slice(b"0000");
    let server = hostile_server((200, ADV, huge), None).await;
    let remote = SmartRemote::new(
        &format!("{}/repo.git", server.uri()),
        RemoteOptions {
            max_advertisement_bytes: 16 * 1024,
            ..RemoteOptions::default()
        },
    )
    .expect("remote");
    let (mirror, update) = one_commit_mirror();
    let err = remote
        .push(mirror.path(), &[update])
        .await
        .expect_err("too large");
    assert!(matches!(err, RemoteError::TooLarge { .. }), "{err:?}");
}

/// Everything of one repository pushed into an empty one over HTTP,
/// annotated tags included: the copy is identical and complete.
#[tokio::test]
async fn a_whole_repository_with_annotated_tags_is_pushed() {
    let root = tempfile::tempdir().expect("tempdir");
    let source = bare_upstream(root.path(), "source");
    git_commit_files(&source, "main", &[("a/Kptfile", "kind: Kptfile\n")], "one");
    git_commit_files(&source, "main", &[("a/x.yaml", "x: 2\n")], "two");
    git_commit_files(
        &source,
        "feature",
        &[("b/Kptfile", "kind: Kptfile\n")],
        "feature",
    );
    let mut tag = crate::support::git_command();
    tag.arg("--git-dir")
        .arg(&source)
        .args(["tag", "-a", "-m", "release", "release/v1", "main~1"]);
    crate::support::run(tag);
    let target = bare_upstream(root.path(), "target");
    let server = http_server(root.path(), None);
    let tmp = tempfile::tempdir().expect("tempdir");
    let mirror_dir = tmp.path().join("m");
    GitRepo::init_bare(&mirror_dir).expect("init");
    let refs = LocalRemote::new(&source)
        .fetch(&mirror_dir)
        .await
        .expect("fetch");
    let updates: Vec<RefUpdate> = refs
        .iter()
        .map(|(name, id)| RefUpdate {
            name: name.clone(),
            expected: None,
            new: Some(*id),
        })
        .collect();
    let remote = SmartRemote::new(
        &format!("http://127.0.0.1:{}/target.git", server.port),
        RemoteOptions::default(),
    )
    .expect("remote");
    remote.push(&mirror_dir, &updates).await.expect("push");
    assert_eq!(show_refs(&target), show_refs(&source));
    fsck(&target);
}

/// A repository that moved on the same host (the advertisement request is
/// redirected): the push follows it, as git does.
#[tokio::test]
async fn a_redirect_on_the_same_host_is_followed() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/old.git/info/refs"))
        .respond_with(ResponseTemplate::new(301).insert_header(
            "location",
            format!(
                "{}/new.git/info/refs?service=git-receive-pack",
                server.uri()
            ),
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/new.git/info/refs"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header(
                    "content-type",
                    "application/x-git-receive-pack-advertisement",
                )
                .set_body_bytes(empty_receive_pack_advertisement()),
        )
        .mount(&server)
        .await;
    let mut report = Vec::new();
    report.extend(pkt(b"unpack ok\n"));
    report.extend(pkt(b"ok refs/heads/x\n"));
    report.extend_from_slice(b"0000");
    let mut band = vec![1u8];
    band.extend(report);
    let mut answer = pkt(&band);
    answer.extend_from_slice(b"0000");
    Mock::given(method("POST"))
        .and(path("/new.git/git-receive-pack"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/x-git-receive-pack-result")
                .set_body_bytes(answer),
        )
        .expect(1)
        .mount(&server)
        .await;
    let remote = SmartRemote::new(
        &format!("{}/old.git", server.uri()),
        RemoteOptions::default(),
    )
    .expect("remote");
    let (mirror, update) = one_commit_mirror();
    remote
        .push(mirror.path(), &[update])
        .await
        .expect("push through the redirect");
}

/// A server that offers no side-band sends the pack raw after its NAK:
/// fetched all the same.
#[tokio::test]
async fn fetch_without_side_band() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let source_dir = tempfile::tempdir().expect("tempdir");
    let source = GitRepo::init_bare(source_dir.path()).expect("init");
    let tree = source.write_files(&files("1")).expect("tree");
    let who = Identity::of_user("a@b.c");
    let tip = source
        .commit(tree, &[], "one", &who, &who, 1)
        .expect("commit");
    let ids = source.missing_objects(&[tip], &[]).expect("objects");
    let pack = source.write_pack(&ids).expect("pack");

    let server = MockServer::start().await;
    let mut advertisement = pkt(b"# service=git-upload-pack\n");
    advertisement.extend_from_slice(b"0000");
    advertisement.extend(pkt(format!("{tip} HEAD\0ofs-delta agent=old\n").as_bytes()));
    advertisement.extend(pkt(format!("{tip} refs/heads/main\n").as_bytes()));
    advertisement.extend_from_slice(b"0000");
    Mock::given(method("GET"))
        .and(path("/repo.git/info/refs"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header(
                    "content-type",
                    "application/x-git-upload-pack-advertisement",
                )
                .set_body_bytes(advertisement),
        )
        .mount(&server)
        .await;
    let mut answer = pkt(b"NAK\n");
    answer.extend_from_slice(&pack.bytes);
    Mock::given(method("POST"))
        .and(path("/repo.git/git-upload-pack"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/x-git-upload-pack-result")
                .set_body_bytes(answer),
        )
        .mount(&server)
        .await;
    let remote = SmartRemote::new(
        &format!("{}/repo.git", server.uri()),
        RemoteOptions::default(),
    )
    .expect("remote");
    let tmp = tempfile::tempdir().expect("tempdir");
    GitRepo::init_bare(tmp.path()).expect("init");
    let refs = remote.fetch(tmp.path()).await.expect("fetch");
    assert_eq!(refs["refs/heads/main"], tip);
    let mirror = GitRepo::open(tmp.path()).expect("open");
    assert_eq!(mirror.read_files(tip, "").expect("files"), files("1"));
    fsck(tmp.path());
}

fn guarded(allow: &str) -> RemoteOptions {
    RemoteOptions {
        egress: Some(std::sync::Arc::new(
            porch_git::egress::EgressPolicy::with_allowlist(allow).expect("allowlist"),
        )),
        ..RemoteOptions::default()
    }
}

fn assert_denied(error: &RemoteError, needle: &str) {
    assert!(
        matches!(error, RemoteError::Denied { .. }),
        "expected an egress refusal, got {error:?}"
    );
    assert!(!error.is_transient(), "a refusal is not retried: {error}");
    assert!(error.to_string().contains(needle), "{error}");
}

/// The cloud metadata service, loopback and private addresses are refused
/// for a guarded remote before any connection is made.
#[tokio::test]
async fn a_guarded_remote_refuses_internal_addresses() {
    for url in [
        "http://169.254.169.254/latest/meta-data.git",
        "https://10.0.0.7/repo.git",
        "http://[::ffff:127.0.0.1]:8080/repo.git",
        "http://[fd00::1]/repo.git",
    ] {
        let error = SmartRemote::new(url, guarded("")).expect_err(url);
        assert_denied(&error, "is not allowed");
    }
    let error = SmartRemote::new("git://192.168.0.1/repo.git", guarded("")).expect_err("git");
    assert_denied(&error, "a private address");
}

/// A name is checked where it is resolved: `localhost` resolves to
/// loopback only, so nothing reaches the server listening there.
#[tokio::test]
async fn a_guarded_remote_refuses_names_resolving_to_loopback() {
    use wiremock::MockServer;
    let server = MockServer::start().await;
    let port = server.address().port();
    let remote = SmartRemote::new(&format!("http://localhost:{port}/repo.git"), guarded(""))
        .expect("a name is checked on connect");
    let tmp = tempfile::tempdir().expect("tempdir");
    GitRepo::init_bare(tmp.path()).expect("init");
    let error = remote.fetch(tmp.path()).await.expect_err("refused");
    assert_denied(&error, "localhost resolves to");
    assert!(
        server
            .received_requests()
            .await
            .unwrap_or_default()
            .is_empty(),
        "no request reached the server"
    );
    // the same over git://
    let remote =
        SmartRemote::new(&format!("git://localhost:{port}/repo.git"), guarded("")).expect("remote");
    let error = remote.fetch(tmp.path()).await.expect_err("refused");
    assert_denied(&error, "localhost resolves to");
    // allowlisted by name, the request goes out (and fails on the mock's 404)
    let remote = SmartRemote::new(
        &format!("http://localhost:{port}/repo.git"),
        guarded("localhost"),
    )
    .expect("remote");
    let error = remote.fetch(tmp.path()).await.expect_err("404");
    assert!(
        matches!(error, RemoteError::Http { status: 404, .. }),
        "{error:?}"
    );
}

/// A redirect is checked again: an allowed server sending the client to
/// the metadata service, or to a name that resolves to loopback, is refused.
#[tokio::test]
async fn a_guarded_remote_rechecks_redirects() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    let port = server.address().port();
    for (from, to) in [
        (
            "/meta.git/info/refs",
            "http://169.254.169.254/latest/".to_owned(),
        ),
        (
            "/literal.git/info/refs",
            format!("http://127.0.0.1:{port}/other.git/info/refs"),
        ),
        ("/file.git/info/refs", "file:///etc/passwd".to_owned()),
    ] {
        Mock::given(method("GET"))
            .and(path(from))
            .respond_with(ResponseTemplate::new(302).insert_header("location", to))
            .mount(&server)
            .await;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    GitRepo::init_bare(tmp.path()).expect("init");
    // the server is allowed by its name only: a redirect to its own
    // address, written as an address, is checked as one and refused
    for (repo, needle) in [
        ("meta", "169.254.169.254 is not allowed"),
        ("literal", "127.0.0.1 is not allowed"),
    ] {
        let remote = SmartRemote::new(
            &format!("http://localhost:{port}/{repo}.git"),
            guarded("localhost"),
        )
        .expect("remote");
        let error = remote.fetch(tmp.path()).await.expect_err(repo);
        assert_denied(&error, needle);
    }
    let requests = server.received_requests().await.unwrap_or_default();
    assert!(
        requests
            .iter()
            .all(|r| !r.url.path().starts_with("/other.git")),
        "the refused redirect was not followed"
    );
    let remote = SmartRemote::new(
        &format!("http://localhost:{port}/file.git"),
        guarded("localhost"),
    )
    .expect("remote");
    // a redirect off HTTP is not followed at all
    let error = remote.fetch(tmp.path()).await.expect_err("file");
    assert!(
        matches!(error, RemoteError::Http { status: 302, .. }),
        "{error:?}"
    );
    assert!(!error.is_transient(), "{error}");
}
