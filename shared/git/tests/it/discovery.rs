//! Discovery from refs: drafts, proposed, tags, deletion proposals and
//! placeholders, with the reference's rules on what is not a revision.

use porch_api::Lifecycle;
use porch_git::annotation::{Annotation, approval_message};
use porch_git::discovery::discover;
use porch_git::identity::{Identity, committer, orchestrator};
use porch_git::layout::RepoLayout;
use porch_git::repo::{Files, GitRepo};

fn kptfile(name: &str, upstream: bool) -> Vec<u8> {
    let mut text = format!("apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: {name}\n");
    if upstream {
        text.push_str("upstreamLock:\n  type: git\n  git:\n    repo: https://example.com/catalog.git\n    directory: basens\n    ref: basens/v3\n    commit: 4c6f3a8f0d6f7f2ad1a3b5b0d3f1f5e6a7b8c9d0\n");
    }
    text.into_bytes()
}

/// Commits `packages` (path → files) under `dir` and returns the commit.
fn commit(
    repo: &GitRepo,
    dir: &str,
    packages: &[(&str, Files)],
    message: &str,
    parents: &[gix::ObjectId],
) -> gix::ObjectId {
    let mut tree = None;
    for (path, files) in packages {
        let sub = repo.write_files(files).expect("files");
        let full = if dir.is_empty() {
            (*path).to_owned()
        } else {
            format!("{dir}/{path}")
        };
        tree = Some(repo.replace_subtree(tree, &full, Some(sub)).expect("tree"));
    }
    let tree = tree.expect("at least one package");
    repo.commit(
        tree,
        parents,
        message,
        &Identity::of_user("bob@example.com"),
        &committer(),
        1_795_000_000,
    )
    .expect("commit")
}

#[test]
fn every_kind_of_revision_is_found() {
    for dir in ["", "blueprints"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = GitRepo::init_bare(tmp.path()).expect("init");
        let layout = RepoLayout::new(dir, "main");
        let a = Files::from([
            ("Kptfile".to_owned(), kptfile("a", true)),
            ("cm.yaml".to_owned(), b"x: 1\n".to_vec()),
        ]);
        let b = Files::from([
            ("Kptfile".to_owned(), kptfile("b", false)),
            ("sub/Kptfile".to_owned(), kptfile("sub", false)),
        ]);
        let not_a_package = Files::from([("README.md".to_owned(), b"docs".to_vec())]);
        let bad_name = Files::from([("Kptfile".to_owned(), kptfile("Bad", false))]);
        let packages = [
            ("a", a.clone()),
            ("net/b", b.clone()),
            ("docs", not_a_package),
            ("Bad_Dir", bad_name),
        ];
        let v1_message = approval_message(&Annotation {
            package_path: layout.full_path("a"),
            workspace_name: "ws-a".into(),
            revision: "1".into(),
            ..Default::default()
        });
        let main = commit(&repo, dir, &packages, &v1_message, &[]);
        let v2 = commit(
            &repo,
            dir,
            &packages,
            "a second commit with no annotation",
            &[main],
        );
        let draft = commit(&repo, dir, &[("a", a.clone())], "draft", &[main]);
        let set = |name: &str, id| repo.update_ref(name, None, Some(id)).expect("ref");
        set("refs/heads/main", v2);
        set(&layout.tag_ref("a", 1).expect("tag"), main);
        set(&layout.tag_ref("a", 2).expect("tag"), v2);
        set(&layout.deletion_proposed_ref("a", 2).expect("ref"), v2);
        set(
            &layout
                .placeholder_deletion_proposed_ref("net/b")
                .expect("ref"),
            v2,
        );
        set(&layout.draft_ref("a", "ws3").expect("draft"), draft);
        set(&layout.proposed_ref("net/b", "ws4").expect("proposed"), v2);
        // not revisions: a release tag, a tag whose path holds no Kptfile, another branch
        set("refs/tags/v1.0.0", v2);
        set(&layout.tag_ref("docs", 1).expect("tag"), v2);
        set("refs/heads/feature", v2);

        let found = discover(
            &repo,
            &layout,
            "blueprints",
            "https://example.com/blueprints.git",
        )
        .expect("discover");
        let summary: Vec<(&str, Lifecycle, i64, &str)> = found
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.lifecycle,
                    r.revision,
                    r.workspace.as_str(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("blueprints.a.main", Lifecycle::Published, -1, "main"),
                ("blueprints.a.v2", Lifecycle::DeletionProposed, 2, "v2"),
                ("blueprints.a.ws-a", Lifecycle::Published, 1, "ws-a"),
                ("blueprints.a.ws3", Lifecycle::Draft, 0, "ws3"),
                (
                    "blueprints.net.b.main",
                    Lifecycle::DeletionProposed,
                    -1,
                    "main"
                ),
                ("blueprints.net.b.ws4", Lifecycle::Proposed, 0, "ws4"),
            ],
            "directory {dir:?}"
        );
        let v1 = found
            .iter()
            .find(|r| r.name == "blueprints.a.ws-a")
            .expect("v1");
        assert_eq!(v1.author, "bob@example.com");
        assert_eq!(v1.author_time, 1_795_000_000);
        let lock = v1.self_lock.git.as_ref().expect("git lock");
        assert_eq!(
            lock.ref_,
            layout
                .tag_ref("a", 1)
                .expect("tag")
                .trim_start_matches("refs/tags/")
        );
        assert_eq!(lock.directory, layout.full_path("a"));
        assert_eq!(lock.commit, main.to_string());
        assert_eq!(
            v1.upstream_lock
                .as_ref()
                .and_then(|l| l.git.as_ref())
                .map(|g| g.ref_.as_str()),
            Some("basens/v3")
        );
        assert_eq!(
            found
                .iter()
                .find(|r| r.name == "blueprints.net.b.ws4")
                .and_then(|r| r.upstream_lock.clone()),
            None
        );
        // the orchestrator identity is unused here but must stay distinct
        assert_ne!(orchestrator().email, v1.author);
    }
}

/// The second discovery reads tags from the cache next to the repository
/// and finds the same; a re-pointed tag and a damaged cache are handled.
#[test]
fn discovery_cache_is_transparent() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(tmp.path()).expect("init");
    let layout = RepoLayout::new("", "main");
    let a = Files::from([("Kptfile".to_owned(), kptfile("a", true))]);
    let message = |n: &str, ws: &str| {
        approval_message(&Annotation {
            package_path: "a".into(),
            workspace_name: ws.into(),
            revision: n.into(),
            ..Default::default()
        })
    };
    let first = commit(&repo, "", &[("a", a.clone())], &message("1", "one"), &[]);
    let second = commit(&repo, "", &[("a", a)], &message("1", "other"), &[first]);
    repo.update_ref("refs/heads/main", None, Some(second))
        .expect("main");
    repo.update_ref("refs/tags/a/v1", None, Some(first))
        .expect("tag");
    let cold = discover(&repo, &layout, "r", "u").expect("cold");
    assert!(tmp.path().join("porch-discovery.json").exists());
    let warm = discover(&repo, &layout, "r", "u").expect("warm");
    assert_eq!(cold, warm);
    assert!(warm.iter().any(|r| r.name == "r.a.one"));

    // the tag moves to another commit: its facts are read again
    repo.update_ref("refs/tags/a/v1", Some(first), Some(second))
        .expect("move");
    let moved = discover(&repo, &layout, "r", "u").expect("moved");
    assert!(moved.iter().any(|r| r.name == "r.a.other"), "{moved:#?}");
    assert!(!moved.iter().any(|r| r.name == "r.a.one"));

    std::fs::write(tmp.path().join("porch-discovery.json"), b"{garbage").expect("damage");
    assert_eq!(discover(&repo, &layout, "r", "u").expect("again"), moved);
}
