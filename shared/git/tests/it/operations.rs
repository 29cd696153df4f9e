//! The lifecycle on a local repository, checked with the git CLI.

use crate::support::{actor, files, git};
use porch_api::Lifecycle;
use porch_api::v1alpha1::{Task, TaskType};
use porch_git::discovery::discover;
use porch_git::identity::Identity;
use porch_git::layout::RepoLayout;
use porch_git::operations::{Actor, OperationError, Packages};
use porch_git::repo::GitRepo;
use std::path::Path;

fn task(kind: TaskType) -> Task {
    Task {
        type_: kind,
        ..Default::default()
    }
}

fn refs(dir: &Path) -> Vec<String> {
    git(dir, &["for-each-ref", "--format=%(refname)"])
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn draft_propose_reject_publish() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(tmp.path()).expect("init");
    let ops = Packages {
        repo: &repo,
        layout: RepoLayout::new("", "main"),
    };
    let a = actor("uid-a", 1);
    let first = ops
        .create_draft("basens", "ws1", &files("1"), task(TaskType::Init), &a)
        .expect("draft");
    // delivered twice: the same commit, nothing new
    assert_eq!(
        ops.create_draft("basens", "ws1", &files("1"), task(TaskType::Init), &a)
            .expect("again"),
        first
    );
    // someone else's revision cannot take the workspace
    let err = ops
        .create_draft(
            "basens",
            "ws1",
            &files("x"),
            task(TaskType::Init),
            &actor("uid-b", 1),
        )
        .expect_err("taken");
    assert!(
        matches!(err, OperationError::WorkspaceExists { .. }),
        "{err}"
    );

    let rendered = ops
        .update_draft(
            "basens",
            "ws1",
            &files("2"),
            task(TaskType::Render),
            &actor("uid-a", 2),
        )
        .expect("update");
    assert_ne!(rendered, first);
    assert_eq!(
        git(tmp.path(), &["show", "drafts/basens/ws1:basens/cm.yaml"]),
        "version: 2\n"
    );
    assert!(
        git(
            tmp.path(),
            &["log", "-1", "--format=%s", "drafts/basens/ws1"]
        )
        .starts_with("Rendering package")
    );

    ops.move_branch("basens", "ws1", true).expect("propose");
    ops.move_branch("basens", "ws1", true)
        .expect("propose again is a no-op");
    assert_eq!(refs(tmp.path()), vec!["refs/heads/proposed/basens/ws1"]);
    ops.move_branch("basens", "ws1", false).expect("reject");
    assert_eq!(refs(tmp.path()), vec!["refs/heads/drafts/basens/ws1"]);
    ops.move_branch("basens", "ws1", true).expect("propose");

    let approver = Actor {
        author: Identity::of_user("bob@example.com"),
        ..actor("uid-a", 3)
    };
    assert_eq!(ops.publish("basens", "ws1", &approver).expect("publish"), 1);
    assert_eq!(
        ops.publish("basens", "ws1", &approver)
            .expect("publish again"),
        1
    );
    assert_eq!(
        refs(tmp.path()),
        vec!["refs/heads/main", "refs/tags/basens/v1"]
    );
    assert_eq!(
        git(tmp.path(), &["show", "basens/v1:basens/cm.yaml"]),
        "version: 2\n"
    );
    assert_eq!(
        git(tmp.path(), &["log", "-1", "--format=%s|%an|%cn", "main"]).trim(),
        "Approving package revision basens/1|bob@example.com|Package Orchestration Service"
    );
    git(tmp.path(), &["fsck", "--strict", "--no-dangling"]);

    let found = discover(&repo, &ops.layout, "blueprints", "file:///repo").expect("discover");
    let summary: Vec<_> = found
        .iter()
        .map(|r| (r.name.as_str(), r.lifecycle, r.revision))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("blueprints.basens.main", Lifecycle::Published, -1),
            ("blueprints.basens.ws1", Lifecycle::Published, 1)
        ]
    );
}

#[test]
fn revisions_count_up_and_are_never_reused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(tmp.path()).expect("init");
    let ops = Packages {
        repo: &repo,
        layout: RepoLayout::new("pkgs", "main"),
    };
    for (i, ws) in ["ws1", "ws2"].iter().enumerate() {
        let a = actor(&format!("uid-{ws}"), 1);
        ops.create_draft("net/basens", ws, &files(ws), task(TaskType::Init), &a)
            .expect("draft");
        ops.move_branch("net/basens", ws, true).expect("propose");
        assert_eq!(
            ops.publish("net/basens", ws, &a).expect("publish"),
            i as u64 + 1
        );
    }
    // the merge commit of v2 has the old branch head and the proposal as parents
    let parents = git(tmp.path(), &["log", "-1", "--format=%P", "main"]);
    assert_eq!(parents.split_whitespace().count(), 2);
    ops.set_deletion_proposed("net/basens", 2, true)
        .expect("propose deletion");
    assert!(
        refs(tmp.path()).contains(&"refs/heads/deletionProposed/pkgs/net/basens/v2".to_owned())
    );
    ops.delete_revision("net/basens", "ws2", 2)
        .expect("delete v2");
    assert!(!refs(tmp.path()).iter().any(|r| r.ends_with("/v2")));
    // v2 is gone but was published once: the next revision is 3
    let a = actor("uid-ws3", 1);
    ops.create_draft("net/basens", "ws3", &files("3"), task(TaskType::Edit), &a)
        .expect("draft");
    ops.move_branch("net/basens", "ws3", true).expect("propose");
    assert_eq!(ops.publish("net/basens", "ws3", &a).expect("publish"), 3);

    ops.delete_placeholder("net/basens", &a)
        .expect("delete placeholder");
    assert_eq!(
        git(tmp.path(), &["log", "-1", "--format=%s", "main"]).trim(),
        "Delete pkgs/net/basens"
    );
    let tree = git(tmp.path(), &["ls-tree", "-r", "--name-only", "main"]);
    assert!(!tree.contains("pkgs/net/basens/Kptfile"), "{tree}");
    ops.delete_placeholder("net/basens", &a)
        .expect("again: nothing to do");
    git(tmp.path(), &["fsck", "--strict", "--no-dangling"]);
}

/// 20 publishers of one package, each with its own handle on the repository
/// (as separate handlers would have), retrying on conflicts: revisions 1..20,
/// each exactly once, no proposal lost.
#[test]
fn concurrent_publishers_get_consecutive_revisions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().to_owned();
    {
        let repo = GitRepo::init_bare(&path).expect("init");
        let ops = Packages {
            repo: &repo,
            layout: RepoLayout::new("", "main"),
        };
        for i in 0..20 {
            let ws = format!("ws{i}");
            let a = actor(&format!("uid-{i}"), 1);
            ops.create_draft("basens", &ws, &files(&ws), task(TaskType::Init), &a)
                .expect("draft");
            ops.move_branch("basens", &ws, true).expect("propose");
        }
    }
    let handles: Vec<_> = (0..20)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let repo = GitRepo::open(&path).expect("open");
                let ops = Packages {
                    repo: &repo,
                    layout: RepoLayout::new("", "main"),
                };
                let a = actor(&format!("uid-{i}"), 1);
                let mut conflicts = 0;
                loop {
                    match ops.publish("basens", &format!("ws{i}"), &a) {
                        Ok(revision) => return (revision, conflicts),
                        Err(OperationError::Repo(porch_git::repo::RepoError::Conflict {
                            ..
                        })) => {
                            conflicts += 1;
                            assert!(conflicts < 1000, "publisher {i} never got through");
                        }
                        Err(e) => panic!("publisher {i}: {e}"),
                    }
                }
            })
        })
        .collect();
    let mut revisions: Vec<u64> = handles
        .into_iter()
        .map(|h| h.join().expect("thread").0)
        .collect();
    revisions.sort_unstable();
    assert_eq!(revisions, (1..=20).collect::<Vec<u64>>());
    let tags: Vec<String> = refs(&path)
        .into_iter()
        .filter(|r| r.starts_with("refs/tags/"))
        .collect();
    assert_eq!(tags.len(), 20);
    assert!(
        !refs(&path)
            .iter()
            .any(|r| r.starts_with("refs/heads/proposed/"))
    );
    // every published revision holds its own content
    for i in 0..20 {
        let ws = format!("ws{i}");
        let found = discover(
            &GitRepo::open(&path).expect("open"),
            &RepoLayout::new("", "main"),
            "r",
            "file:///r",
        )
        .expect("discover");
        let rev = found.iter().find(|r| r.workspace == ws).expect("published");
        assert_eq!(
            git(
                &path,
                &["show", &format!("basens/v{}:basens/cm.yaml", rev.revision)]
            ),
            format!("version: {ws}\n")
        );
    }
    git(&path, &["fsck", "--strict", "--no-dangling"]);
}
