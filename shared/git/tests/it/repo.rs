//! Repositories written with gix are what the git CLI sees, and repositories
//! laid out by the git CLI are what gix reads.

use crate::support::{git, git_command, run};
use porch_api::v1alpha1::{Task, TaskType};
use porch_git::annotation::{Annotation, draft_message, parse_annotations};
use porch_git::identity::{Identity, committer, orchestrator};
use porch_git::layout::{RepoLayout, RevisionRef};
use porch_git::repo::{Files, GitRepo, RepoError};

fn package() -> Files {
    Files::from([
        (
            "Kptfile".to_owned(),
            b"apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: basens\n".to_vec(),
        ),
        (
            "namespace.yaml".to_owned(),
            b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns\n".to_vec(),
        ),
        (
            "sub/cm.yaml".to_owned(),
            b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n".to_vec(),
        ),
    ])
}

#[test]
fn a_draft_written_with_gix_is_what_git_sees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let layout = RepoLayout::new("blueprints", "main");
    let subtree = repo.write_files(&package()).expect("tree");
    let tree = repo
        .replace_subtree(None, &layout.full_path("basens"), Some(subtree))
        .expect("root tree");
    let annotation = Annotation {
        package_path: layout.full_path("basens"),
        workspace_name: "ws1".into(),
        revision: "0".into(),
        task: Some(Task {
            type_: TaskType::Init,
            ..Default::default()
        }),
        uid: "uid-1".into(),
        generation: Some(1),
    };
    let author = Identity::of_user("alice@example.com");
    let commit = repo
        .commit(
            tree,
            &[],
            &draft_message(&annotation),
            &author,
            &committer(),
            1_795_000_000,
        )
        .expect("commit");
    let draft = layout.draft_ref("basens", "ws1").expect("ref");
    repo.update_ref(&draft, None, Some(commit))
        .expect("create the draft");

    assert_eq!(
        git(
            dir.path(),
            &["show", &format!("{draft}:blueprints/basens/sub/cm.yaml")]
        ),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n"
    );
    assert_eq!(
        git(dir.path(), &["rev-parse", &draft]).trim(),
        commit.to_string()
    );
    let log = git(
        dir.path(),
        &["log", "-1", "--format=%an|%ae|%cn|%ce|%at", &draft],
    );
    assert_eq!(
        log.trim(),
        "alice@example.com|alice@example.com|Package Orchestration Service|porch@kpt.dev|1795000000"
    );
    let message = git(dir.path(), &["log", "-1", "--format=%B", &draft]);
    let (found, errors) = parse_annotations(&message);
    assert!(errors.is_empty());
    assert_eq!(found, vec![annotation]);
    git(dir.path(), &["fsck", "--strict", "--no-dangling"]);

    // and read back with gix
    assert_eq!(
        repo.read_files(commit, "blueprints/basens").expect("read"),
        package()
    );
    let refs = repo.refs().expect("refs");
    assert_eq!(refs.get(&draft), Some(&commit));
    assert_eq!(
        layout.parse_ref(&draft),
        Some(RevisionRef::Draft {
            package: "basens".into(),
            workspace: "ws1".into()
        })
    );
}

#[test]
fn replacing_one_package_keeps_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let a = repo.write_files(&package()).expect("a");
    let mut other = package();
    other.insert("extra.yaml".into(), b"x: 1\n".to_vec());
    let b = repo.write_files(&other).expect("b");
    let tree = repo.replace_subtree(None, "pkgs/a", Some(a)).expect("tree");
    let tree = repo
        .replace_subtree(Some(tree), "pkgs/b", Some(a))
        .expect("tree");
    let tree = repo
        .replace_subtree(Some(tree), "pkgs/b", Some(b))
        .expect("replace");
    let commit = repo
        .commit(tree, &[], "t", &orchestrator(), &committer(), 0)
        .expect("commit");
    assert_eq!(repo.read_files(commit, "pkgs/a").expect("a"), package());
    assert_eq!(repo.read_files(commit, "/pkgs/b/").expect("b"), other);
    let removed = repo
        .replace_subtree(Some(tree), "pkgs/a", None)
        .expect("remove");
    let commit = repo
        .commit(
            removed,
            &[commit],
            "Delete pkgs/a",
            &orchestrator(),
            &committer(),
            0,
        )
        .expect("commit");
    assert!(repo.read_files(commit, "pkgs/a").expect("a").is_empty());
    assert_eq!(repo.read_files(commit, "pkgs/b").expect("b"), other);
}

#[test]
fn ref_updates_are_compare_and_swap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let tree = repo.write_files(&package()).expect("tree");
    let c1 = repo
        .commit(tree, &[], "one", &orchestrator(), &committer(), 1)
        .expect("c1");
    let c2 = repo
        .commit(tree, &[c1], "two", &orchestrator(), &committer(), 2)
        .expect("c2");
    let name = "refs/heads/drafts/basens/ws";
    repo.update_ref(name, None, Some(c1)).expect("create");
    assert!(matches!(
        repo.update_ref(name, None, Some(c2)),
        Err(RepoError::Conflict { .. })
    ));
    assert!(matches!(
        repo.update_ref(name, Some(c2), Some(c1)),
        Err(RepoError::Conflict { .. })
    ));
    repo.update_ref(name, Some(c1), Some(c2))
        .expect("fast-forward");
    assert_eq!(git(dir.path(), &["rev-parse", name]).trim(), c2.to_string());
    let err = repo
        .update_ref(name, Some(c1), None)
        .expect_err("stale delete");
    assert!(err.to_string().contains("changed"), "{err}");
    repo.update_ref(name, Some(c2), None).expect("delete");
    assert!(
        git(dir.path(), &["for-each-ref", "--format=%(refname)"])
            .trim()
            .is_empty()
    );
}

#[test]
fn a_repository_laid_out_by_git_is_read() {
    // a Porch-style repository made with the git CLI: the package on main and a tag
    let work = tempfile::tempdir().expect("work");
    let bare = tempfile::tempdir().expect("bare");
    let in_work = |args: &[&str]| {
        let mut command = git_command();
        command.current_dir(work.path()).args(args);
        run(command);
    };
    in_work(&["init", "-q", "-b", "main"]);
    std::fs::create_dir_all(work.path().join("basens")).expect("mkdir");
    for (path, content) in package() {
        let file = work.path().join("basens").join(&path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(file, content).expect("write");
    }
    in_work(&["add", "."]);
    in_work(&[
        "commit",
        "-q",
        "-m",
        "Approving package revision basens/1\n\nkpt:{\"package\":\"basens\",\"workspaceName\":\"ws\",\"revision\":\"1\"}",
    ]);
    in_work(&["tag", "basens/v1"]);
    in_work(&["tag", "v1.0.0"]);
    in_work(&[
        "clone",
        "-q",
        "--bare",
        ".",
        bare.path().to_str().expect("utf8"),
    ]);

    let repo = GitRepo::open(bare.path()).expect("open");
    let layout = RepoLayout::new("", "main");
    let refs = repo.refs().expect("refs");
    let revisions: Vec<_> = refs
        .keys()
        .filter_map(|name| layout.parse_ref(name))
        .collect();
    assert_eq!(
        revisions,
        vec![
            RevisionRef::Branch,
            RevisionRef::Tag {
                package: "basens".into(),
                revision: 1
            }
        ]
    );
    let tag = refs["refs/tags/basens/v1"];
    assert_eq!(repo.read_files(tag, "basens").expect("files"), package());
}

#[test]
fn hostile_file_paths_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    for bad in [
        "../escape.yaml",
        "/etc/passwd",
        "a/../../b",
        ".git/config",
        "a//b",
        "a\\b",
        "",
        "sub/.GIT/x",
        "x\u{1}",
    ] {
        let files = Files::from([(bad.to_owned(), b"x".to_vec())]);
        let err = repo.write_files(&files).expect_err(bad);
        assert!(
            matches!(err, RepoError::UnsafePath { .. }),
            "{bad:?}: {err}"
        );
        assert!(repo.replace_subtree(None, bad, None).is_err(), "{bad:?}");
    }
    let objects = git(dir.path(), &["count-objects", "-v"]);
    assert!(
        objects.contains("count: 0") && objects.contains("in-pack: 0"),
        "{objects}"
    );
}

/// The advertisement a real `git receive-pack` sends parses to our refs.
#[test]
fn a_real_receive_pack_advertisement_parses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let tree = repo.write_files(&package()).expect("tree");
    let c = repo
        .commit(tree, &[], "x", &orchestrator(), &committer(), 1)
        .expect("commit");
    repo.update_ref("refs/heads/main", None, Some(c))
        .expect("main");
    repo.update_ref("refs/tags/basens/v1", None, Some(c))
        .expect("tag");
    let mut command = git_command();
    command
        .args(["receive-pack", "--advertise-refs"])
        .arg(dir.path());
    let stdout = run(command);
    let advertisement = porch_git::pktline::parse_advertisement(stdout.as_bytes()).expect("parse");
    let advertised: std::collections::BTreeMap<_, _> = advertisement.refs.into_iter().collect();
    assert_eq!(advertised, repo.refs().expect("refs"));
    for capability in ["report-status", "delete-refs", "atomic", "side-band-64k"] {
        assert!(
            advertisement.capabilities.contains(capability),
            "{capability}"
        );
    }
}

/// The objects of `new` not reachable from `old`, sorted: as
/// `missing_objects` finds them, and as `git rev-list --objects` lists them.
fn new_objects_ours_and_gits(
    repo: &GitRepo,
    dir: &std::path::Path,
    new: gix::ObjectId,
    old: gix::ObjectId,
) -> (Vec<String>, Vec<String>) {
    let mut ours: Vec<String> = repo
        .missing_objects(&[new], &[old])
        .expect("objects")
        .iter()
        .map(ToString::to_string)
        .collect();
    ours.sort();
    let listed = git(
        dir,
        &[
            "rev-list",
            "--objects",
            &new.to_string(),
            &format!("^{old}"),
        ],
    );
    let mut theirs: Vec<String> = listed
        .lines()
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect();
    theirs.sort();
    (ours, theirs)
}

/// The objects a pack for a new commit holds are exactly what git lists
/// as new (`git rev-list --objects new ^old`), with names that sort
/// around a directory of the same stem (`a`, `a.b`, `a-c`, `a/`).
#[test]
fn missing_objects_are_what_git_lists_as_new() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let who = orchestrator();
    let files = |pairs: &[(&str, &str)]| -> Files {
        pairs
            .iter()
            .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
            .collect()
    };
    let old_tree = repo
        .write_files(&files(&[
            ("a.b", "1"),
            ("a-c", "2"),
            ("a/x", "3"),
            ("a/y/z", "4"),
            ("ab", "5"),
            ("b", "6"),
        ]))
        .expect("tree");
    let old = repo
        .commit(old_tree, &[], "old", &who, &committer(), 0)
        .expect("commit");
    let new_tree = repo
        .write_files(&files(&[
            ("a.b", "1 changed"),
            ("a-c", "2"),
            ("a/x", "3 changed"),
            ("a/y/z", "4"),
            ("ab", "5"),
            ("b", "6"),
            ("c/new", "7"),
        ]))
        .expect("tree");
    let new = repo
        .commit(new_tree, &[old], "new", &who, &committer(), 0)
        .expect("commit");
    let (ours, theirs) = new_objects_ours_and_gits(&repo, dir.path(), new, old);
    assert_eq!(ours, theirs);
    // commit, root tree, a/, a/x, a.b, c/, c/new: unchanged a/y not sent
    assert_eq!(ours.len(), 7);
}

/// The same over a chain of commits on a tree of hundreds of entries, each
/// changing entries at its start, middle or end, adding and removing them,
/// and turning a file into a directory of the same name and back.
#[test]
fn missing_objects_match_git_for_changes_anywhere_in_a_large_tree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let who = orchestrator();
    let mut files: Files = (0..300)
        .map(|i| (format!("pkg-{i:03}/Kptfile"), format!("k{i}").into_bytes()))
        .chain((0..40).map(|i| (format!("file-{i:02}"), format!("f{i}").into_bytes())))
        .collect();
    let tree = repo.write_files(&files).expect("tree");
    let mut parent = repo
        .commit(tree, &[], "0", &who, &committer(), 0)
        .expect("commit");
    let changes: [&dyn Fn(&mut Files); 7] = [
        &|f| {
            f.insert("file-00".into(), b"changed first".to_vec());
        },
        &|f| {
            f.insert("pkg-150/Kptfile".into(), b"changed middle".to_vec());
        },
        &|f| {
            f.insert("pkg-299/Kptfile".into(), b"changed last".to_vec());
            f.insert("zz-new".into(), b"added last".to_vec());
        },
        &|f| {
            f.remove("pkg-000/Kptfile");
            f.insert("pkg-100/new.yaml".into(), b"added inside".to_vec());
        },
        &|f| {
            f.remove("file-20");
            f.insert(
                "file-20/inside".into(),
                b"a file became a directory".to_vec(),
            );
        },
        &|f| {
            f.remove("file-20/inside");
            f.insert("file-20".into(), b"and a file again".to_vec());
            f.insert("pkg-007/Kptfile".into(), b"k7".to_vec());
        },
        &|f| {
            for i in (0..300).step_by(7) {
                f.insert(format!("pkg-{i:03}/Kptfile"), b"many at once".to_vec());
            }
        },
    ];
    for (i, change) in changes.iter().enumerate() {
        change(&mut files);
        let tree = repo.write_files(&files).expect("tree");
        let commit = repo
            .commit(tree, &[parent], &i.to_string(), &who, &committer(), 0)
            .expect("commit");
        let (ours, theirs) = new_objects_ours_and_gits(&repo, dir.path(), commit, parent);
        assert_eq!(ours, theirs, "change {i}");
        parent = commit;
    }
}

/// Directories replaced, added and removed at the top of a large tree
/// (spliced into its bytes) give the tree of the files they make.
#[test]
fn directories_replaced_in_a_large_tree_make_the_tree_of_their_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let mut files: Files = (0..600)
        .map(|i| (format!("pkg-{i:03}/Kptfile"), format!("k{i}").into_bytes()))
        .chain(
            ["a", "a.b", "a-c", "file-05", "zz"]
                .iter()
                .map(|n| ((*n).to_owned(), n.as_bytes().to_vec())),
        )
        .collect();
    let package = |tag: &str| -> (Files, gix::ObjectId) {
        let own: Files = [("Kptfile".to_owned(), tag.as_bytes().to_vec())].into();
        let id = repo.write_files(&own).expect("subtree");
        (own, id)
    };
    let edits: Vec<Vec<(&str, Option<&str>)>> = vec![
        vec![("pkg-300", Some("replaced"))],
        vec![("pkg-000", None), ("pkg-599", None)],
        vec![("0-first", Some("first")), ("zzz-last", Some("last"))],
        vec![("a", Some("a directory where a file was"))],
        vec![
            ("file-05", Some("x")),
            ("file-05", None),
            ("pkg-1", Some("prefix")),
        ],
        vec![
            ("missing", None),
            ("pkg-100", Some("one")),
            ("pkg-100", Some("two")),
        ],
    ];
    let mut base = repo.write_files(&files).expect("tree");
    for (i, edit) in edits.iter().enumerate() {
        let mut subtrees = Vec::new();
        for (name, content) in edit {
            files.retain(|path, _| path != name && !path.starts_with(&format!("{name}/")));
            let id = content.map(|c| {
                let (own, id) = package(c);
                for (path, bytes) in own {
                    files.insert(format!("{name}/{path}"), bytes);
                }
                id
            });
            subtrees.push(((*name).to_owned(), id));
        }
        let spliced = repo.replace_subtrees(Some(base), &subtrees).expect("edit");
        let expected = repo.write_files(&files).expect("tree");
        assert_eq!(spliced, expected, "edit {i}: {edit:?}");
        base = spliced;
    }
    git(dir.path(), &["fsck", "--strict", "--no-dangling"]);
}

/// A handle reports the net effect of its ref updates: a ref created then
/// moved is one creation; a ref created and deleted again is nothing.
#[test]
fn a_handle_reports_its_net_ref_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let tree = repo.write_files(&package()).expect("tree");
    let one = repo
        .commit(tree, &[], "1", &orchestrator(), &committer(), 0)
        .expect("commit");
    let two = repo
        .commit(tree, &[one], "2", &orchestrator(), &committer(), 0)
        .expect("commit");
    repo.update_ref("refs/heads/kept", None, Some(one))
        .expect("create");
    repo.update_ref("refs/heads/kept", Some(one), Some(two))
        .expect("move");
    repo.update_ref("refs/heads/gone", None, Some(one))
        .expect("create");
    repo.update_ref("refs/heads/gone", Some(one), None)
        .expect("delete");
    let changes = repo.take_ref_changes();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].name, "refs/heads/kept");
    assert_eq!(changes[0].expected, None);
    assert_eq!(changes[0].new, Some(two));
    assert!(repo.take_ref_changes().is_empty(), "the journal is cleared");
    // a failed compare-and-swap is not recorded
    assert!(repo.update_ref("refs/heads/kept", Some(one), None).is_err());
    assert!(repo.take_ref_changes().is_empty());
}

/// Packages pushed to git by other means over the size limits: reading one
/// fails clearly (sizes come from object headers, nothing is inflated),
/// discovery still lists them, and writing one is refused before any
/// object is written.
#[test]
fn packages_over_the_size_limits_are_refused_on_read_write_and_discovery() {
    use porch_api::limits::{LimitError, MAX_FILE_BYTES, MAX_PACKAGE_FILES};
    let work = tempfile::tempdir().expect("work");
    let bare = tempfile::tempdir().expect("bare");
    let in_work = |args: &[&str]| {
        let mut command = git_command();
        command.current_dir(work.path()).args(args);
        run(command);
    };
    in_work(&["init", "-q", "-b", "main"]);
    let write = |path: &str, content: &[u8]| {
        let file = work.path().join(path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(file, content).expect("write");
    };
    let kptfile = |name: &str| {
        format!("apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: {name}\n").into_bytes()
    };
    for name in ["ok", "big", "many"] {
        write(&format!("{name}/Kptfile"), &kptfile(name));
    }
    write("big/huge.yaml", &vec![b'#'; MAX_FILE_BYTES + 1]);
    for i in 0..MAX_PACKAGE_FILES {
        write(&format!("many/f/{i}.yaml"), b"# same\n");
    }
    let mut huge_kptfile = kptfile("fat");
    huge_kptfile.resize(MAX_FILE_BYTES + 10, b'\n');
    write("fat/Kptfile", &huge_kptfile);
    in_work(&["add", "."]);
    in_work(&["commit", "-q", "-m", "oversized"]);
    in_work(&[
        "clone",
        "-q",
        "--bare",
        ".",
        bare.path().to_str().expect("utf8"),
    ]);

    let repo = GitRepo::open(bare.path()).expect("open");
    let head = repo.refs().expect("refs")["refs/heads/main"];
    assert_eq!(repo.read_files(head, "ok").expect("ok").len(), 1);
    match repo.read_files(head, "big") {
        Err(RepoError::TooLarge {
            dir,
            source: LimitError::FileTooLarge { path, size },
        }) => assert_eq!(
            (dir.as_str(), path.as_str(), size),
            ("big", "huge.yaml", MAX_FILE_BYTES + 1)
        ),
        other => panic!("{other:?}"),
    }
    let error = repo.read_files(head, "many").expect_err("too many files");
    assert!(
        matches!(
            &error,
            RepoError::TooLarge {
                source: LimitError::TooManyFiles,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("more than 10000 files"),
        "{error}"
    );
    assert!(matches!(
        repo.file(head, "fat/Kptfile"),
        Err(RepoError::TooLarge { .. })
    ));

    let found = porch_git::discovery::discover(&repo, &RepoLayout::new("", "main"), "r", "url")
        .expect("discovery does not fail on one oversized package");
    let mut packages: Vec<_> = found.iter().map(|r| r.package.as_str()).collect();
    packages.sort_unstable();
    packages.dedup();
    assert_eq!(packages, ["big", "fat", "many", "ok"]);

    let empty = tempfile::tempdir().expect("tempdir");
    let target = GitRepo::init_bare(empty.path()).expect("init");
    let mut files = Files::new();
    files.insert("Kptfile".into(), kptfile("x"));
    files.insert("big.yaml".into(), vec![b'#'; MAX_FILE_BYTES + 1]);
    let error = target.write_files(&files).expect_err("too large");
    assert!(
        error.to_string().contains("big.yaml has 8388609 bytes"),
        "{error}"
    );
    let objects = git(empty.path(), &["count-objects", "-v"]);
    assert!(objects.contains("count: 0"), "nothing written: {objects}");
}

/// A first commit holding one package's Kptfile.
fn first_commit(repo: &GitRepo) -> gix::ObjectId {
    let mut files = Files::new();
    files.insert("a/Kptfile".into(), b"kind: Kptfile\n".to_vec());
    let tree = repo.write_files(&files).expect("tree");
    let who = orchestrator();
    repo.commit(tree, &[], "first", &who, &committer(), 1_795_000_000)
        .expect("commit")
}

#[test]
fn the_cached_ref_listing_is_what_gix_lists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bare = dir.path().join("r.git");
    run({
        let mut c = git_command();
        c.args(["init", "--bare", "-q", "-b", "main"]).arg(&bare);
        c
    });
    let repo = GitRepo::open(&bare).expect("open");
    let commit = first_commit(&repo);
    let hex = commit.to_string();
    for name in [
        "refs/heads/main",
        "refs/heads/drafts/a/ws",
        "refs/tags/a/v1",
    ] {
        git(&bare, &["update-ref", name, &hex]);
    }
    git(&bare, &["tag", "-a", "-m", "annotated", "a/v2", &hex]);
    git(&bare, &["pack-refs", "--all"]);
    // loose over packed, a loose-only branch, a symbolic ref, a note
    git(&bare, &["update-ref", "refs/heads/loose", &hex]);
    git(&bare, &["update-ref", "-d", "refs/heads/drafts/a/ws"]);
    git(
        &bare,
        &["symbolic-ref", "refs/heads/alias", "refs/heads/main"],
    );
    git(&bare, &["update-ref", "refs/notes/commits", &hex]);
    let expected: std::collections::BTreeMap<_, _> = repo
        .try_refs_unpeeled()
        .expect("gix lists")
        .into_iter()
        .filter(|(n, _)| n.starts_with("refs/heads/") || n.starts_with("refs/tags/"))
        .collect();
    let listed = GitRepo::open(&bare)
        .expect("open")
        .branches_and_tags()
        .expect("lists");
    assert_eq!(*listed, expected.into());
    assert!(listed.contains_key("refs/tags/a/v2"));
    assert!(!listed.contains_key("refs/heads/drafts/a/ws"));
    assert!(listed.contains_key("refs/heads/loose"));
}

/// The index written beside a pack is the one `git index-pack` computes
/// from the pack alone, byte for byte, and a pack installed that way is
/// one git reads: blobs (one empty, one large enough to need several
/// deflate blocks and a multi-byte size), trees and commits.
#[test]
fn a_written_pack_and_its_index_are_the_ones_git_computes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let source_dir = tmp.path().join("source.git");
    let source = GitRepo::init_bare(&source_dir).expect("init");
    let noise: Vec<u8> = (0u32..300_000)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut content = Files::new();
    content.insert("empty".into(), Vec::new());
    content.insert("dir/noise.bin".into(), noise);
    content.insert("dir/Kptfile".into(), b"apiVersion: kpt.dev/v1\n".to_vec());
    let tree = source.write_files(&content).expect("tree");
    // a root tree large enough to be written (and packed) uncompressed
    let packages: Vec<(String, Option<_>)> =
        (0..700).map(|i| (format!("pkg-{i}"), Some(tree))).collect();
    let root = source
        .replace_subtrees(Some(tree), &packages)
        .expect("root");
    git(&source_dir, &["cat-file", "-e", &root.to_string()]);
    let who = Identity::of_user("a@b.c");
    let first = source
        .commit(tree, &[], "one", &who, &who, 1)
        .expect("commit");
    let second = source
        .commit(root, &[first], "two", &who, &who, 2)
        .expect("commit");
    let ids = source.missing_objects(&[second], &[]).expect("objects");
    assert_eq!(ids.len(), 8, "two commits, three trees, three blobs");
    let pack = source.write_pack(&ids).expect("pack");
    assert_eq!(pack.objects, 8);

    let pack_path = tmp.path().join("written.pack");
    std::fs::write(&pack_path, &pack.bytes).expect("write pack");
    let checksum = git(
        &source_dir,
        &["index-pack", "-v", pack_path.to_str().expect("utf-8")],
    );
    assert_eq!(checksum.trim(), pack.checksum.to_string());
    let by_git = std::fs::read(tmp.path().join("written.idx")).expect("git's index");
    assert!(
        by_git == pack.index().expect("index"),
        "the index differs from git's"
    );

    let target_dir = tmp.path().join("target.git");
    let target = GitRepo::init_bare(&target_dir).expect("init");
    target.install_pack(&pack).expect("install");
    target
        .update_ref("refs/heads/main", None, Some(second))
        .expect("ref");
    git(&target_dir, &["fsck", "--strict", "--no-dangling"]);
    let listed = git(&target_dir, &["ls-tree", "--name-only", "main"]);
    assert_eq!(listed.lines().count(), 702, "dir, empty and 700 packages");
    let reopened = GitRepo::open(&target_dir).expect("open");
    assert_eq!(
        reopened.read_files(second, "pkg-699").expect("read"),
        content
    );
    // the large tree went loose into the source, uncompressed and valid
    git(
        &source_dir,
        &["update-ref", "refs/heads/main", &second.to_string()],
    );
    git(&source_dir, &["fsck", "--strict", "--no-dangling"]);
}

/// What a target lacks is judged by the objects its handle saw at its first
/// lookup: a pack that arrives later (another writer's) is not looked for, so its
/// objects are sent again rather than missed, and what the target held at
/// opening is not sent.
#[test]
fn objects_missing_from_a_target_are_judged_by_what_its_handle_saw_first() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let source = GitRepo::init_bare(&tmp.path().join("source.git")).expect("init");
    let target_dir = tmp.path().join("target.git");
    GitRepo::init_bare(&target_dir).expect("init");
    let who = orchestrator();
    let first_tree = source.write_files(&package()).expect("tree");
    let first = source
        .commit(first_tree, &[], "one", &who, &committer(), 0)
        .expect("commit");
    let mut changed = package();
    changed.insert("more.yaml".to_owned(), b"a: 1\n".to_vec());
    let second_tree = source.write_files(&changed).expect("tree");
    let second = source
        .commit(second_tree, &[first], "two", &who, &committer(), 1)
        .expect("commit");
    let first_objects = source.missing_objects(&[first], &[]).expect("objects");
    let all = source.missing_objects(&[second], &[]).expect("objects");

    let opened_early = GitRepo::open(&target_dir).expect("open");
    assert!(!opened_early.has_object(first));
    // the first commit's objects arrive in a pack through another handle
    let other = GitRepo::open(&target_dir).expect("open");
    other
        .install_pack(&source.write_pack(&first_objects).expect("pack"))
        .expect("install");
    let mut stale = source
        .objects_missing_from(&[second], &opened_early)
        .expect("missing");
    stale.sort();
    let mut everything = all.clone();
    everything.sort();
    assert_eq!(stale, everything, "a later pack is not looked for");

    let opened_late = GitRepo::open(&target_dir).expect("open");
    let fresh = source
        .objects_missing_from(&[second], &opened_late)
        .expect("missing");
    assert!(fresh.iter().all(|id| !first_objects.contains(id)));
    assert_eq!(fresh.len(), 3, "commit, root tree and new blob");
    source.copy_loose(&fresh, &opened_late).expect("copy");
    // on one filesystem the files are linked, not copied
    let inode = |repo: &std::path::Path, id: &gix::ObjectId| {
        let hex = id.to_string();
        let path = repo.join("objects").join(&hex[..2]).join(&hex[2..]);
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).expect("loose"))
    };
    for id in &fresh {
        assert_eq!(
            inode(&tmp.path().join("source.git"), id),
            inode(&target_dir, id)
        );
    }
    opened_late
        .update_ref("refs/heads/main", None, Some(second))
        .expect("ref");
    git(&target_dir, &["fsck", "--strict", "--no-dangling"]);
}

/// A repository is kept open between opens in one process; one deleted and
/// made again at the same path is not the one kept.
#[test]
fn a_repository_made_again_at_the_same_path_is_opened_afresh() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("repo.git");
    let first = GitRepo::init_bare(&path).expect("init");
    let tree = first.write_files(&package()).expect("tree");
    let commit = first
        .commit(tree, &[], "one", &orchestrator(), &committer(), 0)
        .expect("commit");
    first
        .update_ref("refs/heads/main", None, Some(commit))
        .expect("ref");
    drop(first);
    assert!(GitRepo::open(&path).expect("open").has_object(commit));

    std::fs::remove_dir_all(&path).expect("remove");
    let again = GitRepo::init_bare(&path).expect("init again");
    assert!(
        !again.has_object(commit),
        "objects of the deleted repository"
    );
    assert_eq!(again.try_refs_unpeeled().expect("refs"), Default::default());
    assert_eq!(again.ref_id("refs/heads/main").expect("ref"), None);
}

/// `packed-refs` rewritten with the same size and modification time (two
/// writes within one tick of the coarse clock) is read again at the next
/// open, though gix itself compares modification times only.
#[test]
fn packed_refs_rewritten_within_one_tick_are_read_again() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("repo.git");
    let repo = GitRepo::init_bare(&path).expect("init");
    let tree = repo.write_files(&package()).expect("tree");
    let who = orchestrator();
    let one = repo
        .commit(tree, &[], "one", &who, &committer(), 0)
        .expect("commit");
    let two = repo
        .commit(tree, &[one], "two", &who, &committer(), 1)
        .expect("commit");
    drop(repo);
    let packed = path.join("packed-refs");
    let write = |id: gix::ObjectId| {
        let tmp = path.join("packed-refs.new");
        std::fs::write(
            &tmp,
            format!("# pack-refs with: sorted \n{id} refs/heads/main\n"),
        )
        .expect("write");
        std::fs::File::options()
            .write(true)
            .open(&tmp)
            .expect("open")
            .set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000))
            .expect("set time");
        std::fs::rename(&tmp, &packed).expect("rename");
    };
    let main = || {
        GitRepo::open(&path)
            .expect("open")
            .try_refs_unpeeled()
            .expect("refs")
            .get("refs/heads/main")
            .copied()
    };
    write(one);
    assert_eq!(main(), Some(one));
    write(two);
    assert_eq!(main(), Some(two), "the rewrite is seen");
}

/// The object database kept between opens has a fixed number of index
/// slots; a repository that gains many packs meanwhile still finds the
/// objects in all of them.
#[test]
fn a_repository_that_gains_many_packs_between_opens_finds_all_their_objects() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let source = GitRepo::init_bare(&tmp.path().join("source.git")).expect("init");
    let target_dir = tmp.path().join("target.git");
    drop(GitRepo::init_bare(&target_dir).expect("init"));
    let who = orchestrator();
    let mut commits = Vec::new();
    for n in 0..80 {
        let mut files = package();
        files.insert("n.yaml".to_owned(), format!("n: {n}\n").into_bytes());
        let tree = source.write_files(&files).expect("tree");
        let commit = source
            .commit(tree, &[], "one", &who, &committer(), n)
            .expect("commit");
        let target = GitRepo::open(&target_dir).expect("open");
        let objects = source
            .objects_missing_from(&[commit], &target)
            .expect("missing");
        target
            .install_pack(&source.write_pack(&objects).expect("pack"))
            .expect("install");
        commits.push(commit);
    }
    let packs = std::fs::read_dir(target_dir.join("objects/pack"))
        .expect("packs")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "idx"))
        .count();
    assert_eq!(packs, 80);
    let target = GitRepo::open(&target_dir).expect("open");
    for commit in &commits {
        assert!(target.has_object(*commit));
        let files = target.read_files(*commit, "").expect("read");
        assert!(files.contains_key("n.yaml"));
    }
}

/// A pack index is read back to the ids it lists; anything that is not a
/// whole version 2 index is refused, not read past its end.
#[test]
fn the_ids_of_a_pack_index_are_read_and_a_damaged_index_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let tree = repo.write_files(&package()).expect("tree");
    let who = orchestrator();
    let commit = repo
        .commit(tree, &[], "one", &who, &committer(), 0)
        .expect("commit");
    let mut ids = repo.missing_objects(&[commit], &[]).expect("objects");
    let idx = repo.write_pack(&ids).expect("pack").index().expect("index");
    ids.sort();
    assert_eq!(porch_git::pack::index_object_ids(&idx), Some(ids));

    let mut damaged = Vec::new();
    damaged.push(idx[..idx.len() - 41].to_vec());
    damaged.push(idx[..8 + 1024].to_vec());
    let mut version = idx.clone();
    version[7] = 3;
    damaged.push(version);
    // a count larger than the file holds
    let mut count = idx.clone();
    count[8 + 255 * 4..8 + 256 * 4].copy_from_slice(&u32::MAX.to_be_bytes());
    damaged.push(count);
    // a fan-out that goes down
    let mut fanout = idx.clone();
    fanout[8 + 254 * 4..8 + 255 * 4].copy_from_slice(&u32::MAX.to_be_bytes());
    damaged.push(fanout);
    // ids out of order
    let mut order = idx.clone();
    let first = 8 + 1024;
    let (a, b) = order[first..first + 40].split_at_mut(20);
    a.swap_with_slice(b);
    damaged.push(order);
    for bytes in damaged {
        assert_eq!(porch_git::pack::index_object_ids(&bytes), None);
    }
}

/// A `refs/replace/` ref does not change what an id reads as: a mirror's
/// objects are the ones their ids name, as `git` serves them.
#[test]
fn replace_refs_do_not_substitute_objects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = GitRepo::init_bare(dir.path()).expect("init");
    let who = orchestrator();
    let real = repo.write_files(&package()).expect("tree");
    let commit = repo
        .commit(real, &[], "real", &who, &committer(), 0)
        .expect("commit");
    let mut other = package();
    other.insert("planted.yaml".to_owned(), b"a: 1\n".to_vec());
    let planted_tree = repo.write_files(&other).expect("tree");
    let planted = repo
        .commit(planted_tree, &[], "planted", &who, &committer(), 0)
        .expect("commit");
    git(
        dir.path(),
        &[
            "update-ref",
            &format!("refs/replace/{commit}"),
            &planted.to_string(),
        ],
    );
    // git's porcelain honours the replacement; a handle of ours does not
    let shown = git(dir.path(), &["ls-tree", "--name-only", &commit.to_string()]);
    assert!(shown.contains("planted.yaml"), "{shown}");
    let reopened = GitRepo::open(dir.path()).expect("open");
    assert_eq!(reopened.read_files(commit, "").expect("read"), package());
}

/// A bare repository `source.git` under `root`, and the files of 700
/// packages: a root tree over 16 KiB, which packs store as a large tree.
fn many_packages(root: &std::path::Path) -> (std::path::PathBuf, GitRepo, Files) {
    let dir = root.join("source.git");
    let repo = GitRepo::init_bare(&dir).expect("init");
    let files = (0..700)
        .map(|i| (format!("pkg-{i:03}/Kptfile"), format!("k{i}").into_bytes()))
        .collect();
    (dir, repo, files)
}

/// A snapshot pack stores a large tree as a delta against the tree at its
/// path in the parent commit: git resolves it against the base (so the
/// delta is git's format and makes exactly the new tree), gix reads it
/// with the base in another pack, and a base stored too deep, unknown, or
/// inside the pack itself gives the whole tree.
#[test]
fn a_thin_snapshot_pack_stores_a_large_tree_as_a_delta_git_resolves() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (source_dir, source, mut files) = many_packages(tmp.path());
    let who = orchestrator();
    let first_tree = source.write_files(&files).expect("tree");
    let first = source
        .commit(first_tree, &[], "one", &who, &who, 1)
        .expect("commit");
    files.insert("pkg-350/Kptfile".into(), b"changed".to_vec());
    files.insert("pkg-999/Kptfile".into(), b"added".to_vec());
    let second_tree = source.write_files(&files).expect("tree");
    let second = source
        .commit(second_tree, &[first], "two", &who, &who, 2)
        .expect("commit");
    let (ids, bases) = source
        .missing_objects_and_bases(&[second], &[first])
        .expect("objects");
    assert!(bases.contains(&(second_tree, first_tree)), "{bases:?}");
    let whole = source.write_pack(&ids).expect("pack");
    let (thin, depths) = source
        .write_thin_pack(&ids, &bases, &|id| (*id == first_tree).then_some(3))
        .expect("thin pack");
    let stored = |trees: &[porch_git::pack::StoredTree]| {
        trees
            .iter()
            .map(|t| (t.id, t.depth, t.base))
            .collect::<Vec<_>>()
    };
    assert_eq!(stored(&depths), vec![(second_tree, 4, Some(first_tree))]);
    // what a loader learns from the pack and its index
    let index = thin.index().expect("index");
    let learned = |known: &dyn Fn(&gix::ObjectId) -> Option<u8>| {
        stored(&porch_git::pack::large_tree_depths(
            &thin.bytes,
            &index,
            known,
        ))
    };
    assert_eq!(
        learned(&|id| (*id == first_tree).then_some(3)),
        vec![(second_tree, 4, Some(first_tree))]
    );
    assert_eq!(learned(&|_| None), vec![], "a base of unknown depth");
    assert_eq!(
        stored(&porch_git::pack::large_tree_depths(
            &whole.bytes,
            &whole.index().expect("index"),
            &|_| None
        )),
        vec![(second_tree, 0, None)]
    );
    assert_eq!(
        porch_git::pack::large_tree_depths(&thin.bytes, &index[..100], &|_| Some(0)),
        vec![],
        "a damaged index"
    );
    assert_eq!(thin.objects, whole.objects);
    assert!(
        thin.bytes.len() < 1024 && whole.bytes.len() > 20_000,
        "thin {} bytes, whole {}",
        thin.bytes.len(),
        whole.bytes.len()
    );

    // git: completed against the base in the source, the pack holds the
    // ids ours says (index-pack hashes what each delta makes)
    let pack_path = tmp.path().join("thin.pack");
    std::fs::write(&pack_path, &thin.bytes).expect("write pack");
    let mut index_pack = git_command();
    index_pack
        .arg("--git-dir")
        .arg(&source_dir)
        .args(["index-pack", "--stdin", "--fix-thin"])
        .stdin(std::fs::File::open(&pack_path).expect("open"));
    run(index_pack);
    let completed = git(&source_dir, &["count-objects", "-v"]);
    assert!(completed.contains("packs: 1"), "{completed}");
    git(
        &source_dir,
        &["update-ref", "refs/heads/main", &second.to_string()],
    );
    git(&source_dir, &["fsck", "--strict", "--no-dangling"]);

    // gix: the base in a pack of its own, the delta's pack installed with
    // our index; a fresh handle reads the new tree and its files
    let target_dir = tmp.path().join("target.git");
    let target = GitRepo::init_bare(&target_dir).expect("init");
    let base_ids = source.missing_objects(&[first], &[]).expect("objects");
    target
        .install_pack(&source.write_pack(&base_ids).expect("pack"))
        .expect("install base");
    target.install_pack(&thin).expect("install thin");
    let reopened = GitRepo::open(&target_dir).expect("open");
    assert_eq!(
        reopened
            .read_files(second, "pkg-350")
            .expect("read")
            .get("Kptfile"),
        Some(&b"changed".to_vec())
    );
    let gix_repo = gix::open(&target_dir).expect("gix");
    let ours = gix_repo.find_object(second_tree).expect("tree").detach();
    let source_gix = gix::open(&source_dir).expect("gix");
    let theirs = source_gix.find_object(second_tree).expect("tree").detach();
    assert!(ours.data == theirs.data, "the delta made another tree");

    // stored whole: a base too deep, of unknown depth, or in the pack
    for depth_of in [
        &(|_: &gix::ObjectId| Some(porch_git::pack::MAX_DELTA_DEPTH)) as &dyn Fn(&_) -> _,
        &|_: &gix::ObjectId| None,
    ] {
        let (pack, depths) = source
            .write_thin_pack(&ids, &bases, depth_of)
            .expect("pack");
        assert_eq!(pack, whole);
        assert_eq!(stored(&depths), vec![(second_tree, 0, Some(first_tree))]);
    }
    let all = source.missing_objects(&[second], &[]).expect("objects");
    let (pack, _) = source
        .write_thin_pack(&all, &bases, &|_| Some(0))
        .expect("pack");
    assert_eq!(pack, source.write_pack(&all).expect("pack"));
}

/// A compaction's pack is complete (each delta's base in it) and stores a
/// history of large root trees as chains of deltas within it, no chain
/// deeper than the limit: git indexes it as it is (no base missing) and
/// reads every tree.
#[test]
fn a_complete_pack_stores_a_history_of_large_trees_as_deltas_within_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (source_dir, source, mut files) = many_packages(tmp.path());
    let who = orchestrator();
    let mut parents = Vec::new();
    let mut trees = Vec::new();
    for i in 0..20 {
        files.insert(format!("pkg-{:03}/Kptfile", i * 31), b"changed".to_vec());
        let tree = source.write_files(&files).expect("tree");
        let commit = source
            .commit(tree, &parents, &i.to_string(), &who, &who, i)
            .expect("commit");
        parents = vec![commit];
        trees.push(tree);
    }
    let tip = parents[0];
    let (ids, bases) = source
        .missing_objects_and_bases(&[tip], &[])
        .expect("objects");
    for pair in trees.windows(2) {
        assert!(bases.contains(&(pair[1], pair[0])), "root trees paired");
    }
    let whole = source.write_pack(&ids).expect("pack");
    let pack = source.write_complete_pack(&ids, &bases).expect("pack");
    assert_eq!(pack.objects, whole.objects);
    // 20 root trees of 22 KB: at most 3 whole (one per 9), the rest deltas
    assert!(
        pack.bytes.len() * 4 < whole.bytes.len(),
        "complete {} bytes, whole {}",
        pack.bytes.len(),
        whole.bytes.len()
    );
    // a loader finds every root tree standing on no other pack
    let learned =
        porch_git::pack::large_tree_depths(&pack.bytes, &pack.index().expect("index"), &|_| None);
    for tree in &trees {
        assert!(
            learned.iter().any(|t| t.id == *tree && t.depth == 0),
            "{tree} in {learned:?}"
        );
    }
    let pack_path = tmp.path().join("complete.pack");
    std::fs::write(&pack_path, &pack.bytes).expect("write pack");
    let checksum = git(
        &source_dir,
        &["index-pack", "-v", pack_path.to_str().expect("utf-8")],
    );
    assert_eq!(checksum.trim(), pack.checksum.to_string());
    let chains = git(
        &source_dir,
        &["verify-pack", "-v", pack_path.to_str().expect("utf-8")],
    );
    let deepest = chains
        .lines()
        .filter_map(|l| l.strip_prefix("chain length = "))
        .filter_map(|l| l.split(':').next()?.trim().parse::<u8>().ok())
        .max();
    assert_eq!(deepest, Some(porch_git::pack::MAX_DELTA_DEPTH), "{chains}");

    let target_dir = tmp.path().join("target.git");
    let target = GitRepo::init_bare(&target_dir).expect("init");
    target.install_pack(&pack).expect("install");
    target
        .update_ref("refs/heads/main", None, Some(tip))
        .expect("ref");
    git(&target_dir, &["fsck", "--strict", "--no-dangling"]);
    let theirs = gix::open(&source_dir).expect("gix");
    let ours = gix::open(&target_dir).expect("gix");
    for tree in trees {
        let a = ours.find_object(tree).expect("tree").detach().data;
        let b = theirs.find_object(tree).expect("tree").detach().data;
        assert!(a == b, "tree {tree} read back differently");
    }
}

/// A mirror that gains one tag per publish packs its loose refs once they
/// pass `PACK_LOOSE_AT`, so a listing never reads more loose files than
/// that; git reads the same branches and tags as the listing throughout,
/// annotated tags and a note the mirror does not own included.
#[test]
fn a_mirror_gaining_a_tag_per_publish_keeps_few_loose_refs() {
    use porch_git::listing::RefMap;
    use porch_git::packed_refs::PACK_LOOSE_AT;

    let dir = tempfile::tempdir().expect("tempdir");
    let bare = dir.path().join("m.git");
    let repo = GitRepo::init_bare(&bare).expect("init");
    let commit = first_commit(&repo);
    let hex = commit.to_string();
    git(&bare, &["tag", "-a", "-m", "annotated", "annotated", &hex]);
    let annotated = repo.branches_and_tags().expect("list")["refs/tags/annotated"];
    // a ref the mirror does not own, at an annotated tag: packed with a
    // peeled line
    git(
        &bare,
        &["update-ref", "refs/notes/commits", &annotated.to_string()],
    );
    git(&bare, &["pack-refs", "--all"]);
    let peeled = format!("{annotated} refs/notes/commits\n^{hex}\n");
    assert!(
        std::fs::read_to_string(bare.join("packed-refs"))
            .expect("read")
            .contains(&peeled)
    );

    let loose_files = || {
        let out = git(&bare, &["for-each-ref", "--format=%(refname)"]);
        out.lines().filter(|name| bare.join(name).is_file()).count()
    };
    // the branches and tags as git reads them
    let gits = || -> RefMap {
        git(
            &bare,
            &["for-each-ref", "--format=%(objectname) %(refname)"],
        )
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(_, name)| name.starts_with("refs/heads/") || name.starts_with("refs/tags/"))
        .map(|(id, name)| (name.to_owned(), id.parse().expect("id")))
        .collect()
    };
    let mut refs: RefMap = [
        ("refs/heads/main".to_owned(), commit),
        ("refs/tags/annotated".to_owned(), annotated),
    ]
    .into();
    let mut most = 0;
    for n in 1..=PACK_LOOSE_AT + 20 {
        refs.insert(format!("refs/tags/pkg-{}/v{n}", n % 7), commit);
        GitRepo::open(&bare)
            .expect("open")
            .mirror_refs(&refs)
            .expect("mirror");
        most = most.max(loose_files());
    }
    assert!(
        most <= PACK_LOOSE_AT,
        "at most {PACK_LOOSE_AT} loose refs, {most} seen"
    );
    assert!(loose_files() < 30, "packed once past the limit");
    let listed = GitRepo::open(&bare)
        .expect("open")
        .branches_and_tags()
        .expect("list");
    assert_eq!(*listed, refs);
    assert_eq!(gits(), refs, "git reads what the listing reads");
    assert!(
        std::fs::read_to_string(bare.join("packed-refs"))
            .expect("read")
            .contains(&peeled),
        "a ref the mirror does not own stays, with its peeled line"
    );
    assert_eq!(
        git(&bare, &["rev-parse", "refs/notes/commits^{commit}"]).trim(),
        hex
    );
    assert_eq!(
        git(&bare, &["rev-parse", "annotated^{commit}"]).trim(),
        hex,
        "an annotated tag still peels"
    );

    // many removed at once (more than are written loose), one added
    let mut refs: RefMap = refs
        .iter()
        .filter(|(name, _)| {
            !["3/", "4/", "5/"]
                .iter()
                .any(|n| name.starts_with(&format!("refs/tags/pkg-{n}")))
        })
        .map(|(name, id)| (name.clone(), *id))
        .collect();
    refs.insert("refs/heads/next".to_owned(), commit);
    let mirror = GitRepo::open(&bare).expect("open");
    let before = mirror.branches_and_tags().expect("list");
    assert!(porch_git::listing::differences(&before, &refs).len() > 64);
    mirror.mirror_refs(&refs).expect("mirror");
    assert_eq!(gits(), refs, "the removed tags are gone for git too");
    assert_eq!(
        *GitRepo::open(&bare)
            .expect("open")
            .branches_and_tags()
            .expect("list"),
        refs
    );
    git(&bare, &["fsck", "--no-progress"]);
}

/// `packed-refs.lock` held by another writer: no change is written, and
/// the lock is left alone. Left by a writer that died long ago: broken,
/// and the change written.
#[test]
fn a_mirror_waits_for_a_held_packed_refs_lock_and_breaks_a_stale_one() {
    use porch_git::listing::RefMap;
    use porch_git::packed_refs::LOCK_STALE;

    let dir = tempfile::tempdir().expect("tempdir");
    let bare = dir.path().join("m.git");
    let repo = GitRepo::init_bare(&bare).expect("init");
    let commit = first_commit(&repo);
    let mut refs: RefMap = [("refs/heads/main".to_owned(), commit)].into();
    repo.mirror_refs(&refs).expect("mirror");
    let lock = bare.join("packed-refs.lock");
    std::fs::write(&lock, "").expect("another writer's lock");

    refs.insert("refs/tags/p/v1".to_owned(), commit);
    let error = repo.mirror_refs(&refs).expect_err("locked");
    assert!(
        std::error::Error::source(&error)
            .is_some_and(|e| e.to_string().contains("packed-refs.lock")),
        "{error:?}"
    );
    assert!(
        !repo
            .branches_and_tags()
            .expect("list")
            .contains_key("refs/tags/p/v1")
    );
    assert!(lock.exists(), "another writer's lock is left alone");

    std::fs::File::open(&lock)
        .expect("open")
        .set_modified(std::time::SystemTime::now() - LOCK_STALE * 2)
        .expect("age");
    repo.mirror_refs(&refs).expect("the stale lock broken");
    assert_eq!(*repo.branches_and_tags().expect("list"), refs);
    assert!(!lock.exists());
    assert_eq!(
        git(&bare, &["rev-parse", "refs/tags/p/v1"]).trim(),
        commit.to_string()
    );
}
