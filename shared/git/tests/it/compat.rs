//! Compatibility with Porch's layout both ways: a repository built by the
//! git CLI the way Porch writes one is discovered correctly, and one we
//! wrote, cloned fresh with the git CLI, is discovered identically.

use crate::support::{git_command, http_server, run, upstream_with_main};
use porch_api::Lifecycle;
use porch_api::v1alpha1::{Task, TaskType};
use porch_git::discovery::discover;
use porch_git::identity::Identity;
use porch_git::layout::RepoLayout;
use porch_git::mirror::{Mirror, RetryPolicy};
use porch_git::operations::{Actor, Packages};
use porch_git::remote::{RemoteOptions, SmartRemote};
use porch_git::repo::{Files, GitRepo};
use std::path::Path;

#[test]
fn a_repository_porch_wrote_is_discovered() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("porch.git");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/porch-layout.sh");
    let mut command = std::process::Command::new("sh");
    command.arg(script).arg(&dir);
    run(command);
    let repo = GitRepo::open(&dir).expect("open");
    let found = discover(
        &repo,
        &RepoLayout::new("", "main"),
        "porch",
        "https://example.com/porch.git",
    )
    .expect("discover");
    let summary: Vec<(&str, Lifecycle, i64, &str, &str)> = found
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.lifecycle,
                r.revision,
                r.workspace.as_str(),
                r.package.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "porch.basens.main",
                Lifecycle::Published,
                -1,
                "main",
                "basens"
            ),
            ("porch.basens.ws1", Lifecycle::Published, 1, "ws1", "basens"),
            ("porch.basens.ws2", Lifecycle::Draft, 0, "ws2", "basens"),
            (
                "porch.net.infra.a",
                Lifecycle::DeletionProposed,
                1,
                "a",
                "net/infra"
            ),
            (
                "porch.net.infra.b",
                Lifecycle::Published,
                2,
                "b",
                "net/infra"
            ),
            (
                "porch.net.infra.main",
                Lifecycle::Published,
                -1,
                "main",
                "net/infra"
            ),
        ]
    );
    let v1 = found
        .iter()
        .find(|r| r.name == "porch.basens.ws1")
        .expect("v1");
    assert_eq!(
        v1.author, "approver@example.com",
        "publishedBy is the approval commit's author"
    );
    assert_eq!(v1.author_time, 1_793_613_600, "2026-11-02T10:00:00Z");
    let lock = v1.self_lock.git.as_ref().expect("lock");
    assert_eq!(
        (lock.ref_.as_str(), lock.directory.as_str()),
        ("basens/v1", "basens")
    );
}

/// Our writes over smart HTTP, then `git clone --mirror`: the clone
/// discovers exactly what our mirror does.
#[tokio::test]
async fn a_repository_we_wrote_reads_the_same_after_a_git_clone() {
    let root = tempfile::tempdir().expect("tempdir");
    upstream_with_main(root.path());
    let server = http_server(root.path(), None);
    let url = format!("http://127.0.0.1:{}/repo.git", server.port);
    let remote = SmartRemote::new(&url, RemoteOptions::default()).expect("remote");
    let mirror =
        Mirror::new(root.path().join("mirror"), remote, RetryPolicy::default()).expect("mirror");
    for (package, ws, publish) in [
        ("basens", "ws1", true),
        ("net/infra", "a", true),
        ("net/infra", "b", false),
    ] {
        let (package, ws) = (package.to_owned(), ws.to_owned());
        mirror
            .apply(move |repo| {
                let ops = Packages {
                    repo,
                    layout: RepoLayout::new("", "main"),
                };
                let actor = Actor {
                    uid: format!("uid-{package}-{ws}"),
                    generation: 1,
                    author: Identity::of_user("alice@example.com"),
                    time: 1_795_000_000,
                };
                let files = Files::from([(
                    "Kptfile".to_owned(),
                    format!(
                        "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: {}\n",
                        package.rsplit('/').next().unwrap_or("x")
                    )
                    .into_bytes(),
                )]);
                ops.create_draft(
                    &package,
                    &ws,
                    &files,
                    Task {
                        type_: TaskType::Init,
                        ..Default::default()
                    },
                    &actor,
                )?;
                if publish {
                    ops.move_branch(&package, &ws, true)?;
                    ops.publish(&package, &ws, &actor)?;
                }
                Ok(())
            })
            .await
            .expect("lifecycle");
    }
    let clone = root.path().join("clone.git");
    let mut command = git_command();
    command
        .arg("clone")
        .arg("-q")
        .arg("--mirror")
        .arg(&url)
        .arg(&clone);
    run(command);
    let layout = RepoLayout::new("", "main");
    let ours = discover(
        &GitRepo::open(mirror.path()).expect("open"),
        &layout,
        "repo",
        &url,
    )
    .expect("ours");
    let theirs =
        discover(&GitRepo::open(&clone).expect("open"), &layout, "repo", &url).expect("theirs");
    assert_eq!(ours, theirs);
    assert_eq!(ours.len(), 5, "{ours:#?}");
}
