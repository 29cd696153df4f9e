//! The snapshot: save and load between mirrors, warm loads that read
//! nothing, concurrent writers that lose nothing, compaction, and rebuilds
//! from the remote when the snapshot is missing, corrupt or behind.

use crate::support::{bare_upstream, git, git_commit_files, moto_server, s3_store};
use porch_api::v1alpha1::{Task, TaskType};
use porch_git::identity::Identity;
use porch_git::layout::RepoLayout;
use porch_git::mirror::{Mirror, RetryPolicy};
use porch_git::operations::{Actor, Packages};
use porch_git::remote::{LocalRemote, Remote};
use porch_git::repo::{Files, GitRepo};
use porch_git::snapshot::{COMPACT_AT, LoadOutcome, Manifest, Prepared, Snapshots};
use porch_git::store::{LocalDirStore, ObjectStore, PutCondition};
use std::collections::BTreeMap;
use std::path::Path;

const KEY: &str = "repos/default/blueprints";

fn show_refs(dir: &Path) -> BTreeMap<String, String> {
    git(dir, &["for-each-ref", "--format=%(refname) %(objectname)"])
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(n, _)| n.starts_with("refs/heads/") || n.starts_with("refs/tags/"))
        .map(|(n, id)| (n.to_owned(), id.to_owned()))
        .collect()
}

fn fsck(dir: &Path) {
    git(dir, &["fsck", "--strict", "--no-dangling"]);
}

/// An upstream with a few packages on main and a draft branch.
fn upstream(root: &Path) -> std::path::PathBuf {
    let dir = bare_upstream(root, "repo");
    git_commit_files(&dir, "main", &[("README.md", "Created by porch\n")], "init");
    git_commit_files(
        &dir,
        "main",
        &[
            ("a/Kptfile", "kind: Kptfile\nname: a\n"),
            ("b/Kptfile", "kind: Kptfile\nname: b\n"),
        ],
        "packages",
    );
    git_commit_files(&dir, "drafts/a/ws", &[("a/cm.yaml", "x: 1\n")], "draft");
    dir
}

fn draft(
    ws: &str,
    uid: &str,
) -> impl Fn(&GitRepo) -> Result<gix::ObjectId, porch_git::operations::OperationError>
+ Send
+ Sync
+ 'static {
    let (ws, uid) = (ws.to_owned(), uid.to_owned());
    move |repo| {
        Packages {
            repo,
            layout: RepoLayout::new("", "main"),
        }
        .create_draft(
            "c",
            &ws,
            &Files::from([(
                "Kptfile".to_owned(),
                format!("kind: Kptfile\nname: {ws}\n").into_bytes(),
            )]),
            Task {
                type_: TaskType::Init,
                ..Default::default()
            },
            &Actor {
                uid: uid.clone(),
                generation: 1,
                author: Identity::of_user("bob@example.com"),
                time: 1_795_000_000,
            },
        )
    }
}

/// A store, the local upstream, a remote for it, and a snapshot prepared
/// from it in the mirror `name`.
async fn prepared(
    root: &Path,
    name: &str,
) -> (
    LocalDirStore,
    std::path::PathBuf,
    LocalRemote,
    Snapshots<LocalDirStore>,
) {
    let store = LocalDirStore::new(root.join("store"));
    let up = upstream(root);
    let remote = LocalRemote::new(&up);
    let snapshots = Snapshots::new(store.clone(), KEY, root.join(name)).expect("snapshots");
    snapshots.prepare(&remote).await.expect("rebuild");
    (store, up, remote, snapshots)
}

/// Draft `ws<i>` made through `mirror`, then saved by `writer`.
async fn draft_and_save(
    mirror: &Mirror<LocalRemote>,
    writer: &Snapshots<LocalDirStore>,
    remote: &LocalRemote,
    i: usize,
) -> porch_git::snapshot::Saved {
    mirror
        .apply(draft(&format!("ws{i}"), &format!("u{i}")))
        .await
        .expect("draft");
    writer.save(remote.url()).await.expect("save")
}

/// A mirror at `dir` of the local upstream `up`.
fn mirror_of(dir: &Path, up: &Path) -> Mirror<LocalRemote> {
    Mirror::new(dir, LocalRemote::new(up), RetryPolicy::default()).expect("mirror")
}

async fn save_and_load_between_mirrors<S: ObjectStore + Clone>(store: S) {
    let root = tempfile::tempdir().expect("tempdir");
    let up = upstream(root.path());
    let remote = LocalRemote::new(&up);
    let a = Snapshots::new(store.clone(), KEY, root.path().join("a")).expect("a");
    assert_eq!(a.load().await.expect("load"), LoadOutcome::Missing);
    let prepared = a.prepare(&remote).await.expect("rebuild");
    assert!(
        matches!(prepared, Prepared::Rebuilt(ref s) if s.pack.is_some()),
        "{prepared:?}"
    );

    // a fresh process loads it: same refs, a valid repository
    let b = Snapshots::new(store.clone(), KEY, root.path().join("b")).expect("b");
    let LoadOutcome::Loaded(loaded) = b.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(loaded.packs_downloaded, 1);
    assert!(loaded.bytes_read > 0);
    assert_eq!(show_refs(b.mirror()), show_refs(&up));
    fsck(b.mirror());

    // warm and unchanged: nothing read
    let LoadOutcome::Loaded(again) = b.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!((again.bytes_read, again.packs_downloaded), (0, 0));

    // a change through a: b downloads one small pack
    let mirror = mirror_of(a.mirror(), &up);
    mirror.apply(draft("ws1", "u1")).await.expect("draft");
    let saved = a.save(remote.url()).await.expect("save");
    assert!(saved.pack.is_some());
    let LoadOutcome::Loaded(next) = b.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(next.packs_downloaded, 1);
    assert!(next.bytes_read < 8 * 1024, "read {} bytes", next.bytes_read);
    assert_eq!(show_refs(b.mirror()), show_refs(&up));
    fsck(b.mirror());
    // the writer keeps no copy of the pack it uploaded (it has the
    // objects), and does not download it back
    let name = saved.pack.as_deref().expect("pack");
    assert!(
        !a.mirror()
            .join(format!("objects/pack/pack-{name}.idx"))
            .exists()
    );
    let LoadOutcome::Loaded(own) = a.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(own.packs_downloaded, 0);
    fsck(a.mirror());

    // a save with nothing new writes nothing but keeps the tag
    let unchanged = a.save(remote.url()).await.expect("save");
    assert_eq!((unchanged.pack, unchanged.bytes_written), (None, 0));
}

#[tokio::test]
async fn save_and_load_on_a_local_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    save_and_load_between_mirrors(LocalDirStore::new(tmp.path())).await;
}

#[tokio::test]
async fn save_and_load_on_s3() {
    let server = moto_server();
    save_and_load_between_mirrors(s3_store(&server, "snapshots").await).await;
}

/// 20 writers load the same snapshot, each adds its own branch, all save
/// at once: the manifest ends with every branch and every pack, and a
/// fresh load has them all.
async fn concurrent_savers<S: ObjectStore + Clone + 'static>(store: S) {
    const WRITERS: usize = 20;
    let root = tempfile::tempdir().expect("tempdir");
    let up = upstream(root.path());
    let first = Snapshots::new(store.clone(), KEY, root.path().join("first")).expect("first");
    first
        .prepare(&LocalRemote::new(&up))
        .await
        .expect("rebuild");
    let mut writers = Vec::new();
    for i in 0..WRITERS {
        let snapshots =
            Snapshots::new(store.clone(), KEY, root.path().join(format!("w{i}"))).expect("w");
        snapshots.load().await.expect("load");
        let repo = GitRepo::open(snapshots.mirror()).expect("open");
        let files = Files::from([(format!("f{i}"), format!("{i}\n").into_bytes())]);
        let tree = repo.write_files(&files).expect("tree");
        let who = Identity::of_user("w@example.com");
        let commit = repo
            .commit(tree, &[], &format!("w{i}"), &who, &who, 1)
            .expect("commit");
        repo.update_ref(&format!("refs/heads/w{i}"), None, Some(commit))
            .expect("ref");
        writers.push(snapshots);
    }
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|s| tokio::spawn(async move { s.save("file:///upstream").await }))
        .collect();
    let mut merges = 0;
    for task in tasks {
        merges += task.await.expect("join").expect("save").merges;
    }
    let fresh = Snapshots::new(store.clone(), KEY, root.path().join("fresh")).expect("fresh");
    let LoadOutcome::Loaded(loaded) = fresh.load().await.expect("load") else {
        panic!("missing")
    };
    let refs = show_refs(fresh.mirror());
    for i in 0..WRITERS {
        assert!(
            refs.contains_key(&format!("refs/heads/w{i}")),
            "w{i} lost: {refs:?}"
        );
    }
    for (name, id) in show_refs(&up) {
        assert_eq!(refs.get(&name), Some(&id), "{name}");
    }
    let stored = fresh.stored_packs().await.expect("packs");
    for pack in &loaded.manifest.packs {
        assert!(stored.contains(pack), "pack {pack} listed but not stored");
    }
    fsck(fresh.mirror());
    eprintln!(
        "{WRITERS} concurrent savers: {merges} manifest merges, {} packs",
        loaded.manifest.packs.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_savers_on_a_local_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    concurrent_savers(LocalDirStore::new(tmp.path())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_savers_on_s3() {
    let server = moto_server();
    concurrent_savers(s3_store(&server, "race").await).await;
}

#[tokio::test]
async fn packs_are_compacted_and_loads_still_work() {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, up, remote, writer) = prepared(root.path(), "w").await;
    let mirror = mirror_of(writer.mirror(), &up);
    let mut compacted = false;
    for i in 0..=COMPACT_AT {
        compacted |= draft_and_save(&mirror, &writer, &remote, i).await.compacted;
    }
    assert!(compacted, "more than {COMPACT_AT} packs were compacted");
    let reader = Snapshots::new(store.clone(), KEY, root.path().join("r")).expect("r");
    let LoadOutcome::Loaded(loaded) = reader.load().await.expect("load") else {
        panic!("missing")
    };
    assert!(
        loaded.manifest.packs.len() <= 2,
        "{:?}",
        loaded.manifest.packs
    );
    assert!(
        !loaded.manifest.retired.is_empty(),
        "old packs kept for readers of older manifests"
    );
    assert_eq!(show_refs(reader.mirror()), show_refs(&up));
    fsck(reader.mirror());
}

/// With a repository much larger than what the saves since add, a
/// compaction rolls up the saves' packs and leaves the repository's pack
/// alone: a reader downloads the small new pack, not the repository again.
#[tokio::test]
async fn a_compaction_rewrites_the_recent_small_packs_not_the_whole_repository() {
    let root = tempfile::tempdir().expect("tempdir");
    let up = upstream(root.path());
    let texts: Vec<(String, String)> = (0..300)
        .map(|i| (format!("big/f{i}.yaml"), format!("n: {i}\n")))
        .collect();
    let files: Vec<(&str, &str)> = texts
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    git_commit_files(&up, "main", &files, "a large package");
    let store = LocalDirStore::new(root.path().join("store"));
    let remote = LocalRemote::new(&up);
    let writer = Snapshots::new(store.clone(), KEY, root.path().join("w")).expect("w");
    writer.prepare(&remote).await.expect("rebuild");
    let reader = Snapshots::new(store.clone(), KEY, root.path().join("r")).expect("r");
    let LoadOutcome::Loaded(first) = reader.load().await.expect("load") else {
        panic!("missing")
    };
    let [repository_pack] = first.manifest.packs.as_slice() else {
        panic!("{:?}", first.manifest.packs)
    };

    let mirror = mirror_of(writer.mirror(), &up);
    let mut compactions = 0;
    // one pack per save: the one that makes them more than COMPACT_AT
    // compacts
    for i in 0..COMPACT_AT {
        mirror
            .apply(draft(&format!("ws{i}"), &format!("u{i}")))
            .await
            .expect("draft");
        compactions += usize::from(writer.save(remote.url()).await.expect("save").compacted);
    }
    assert_eq!(compactions, 1);
    let LoadOutcome::Loaded(loaded) = reader.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(
        loaded.manifest.packs.len(),
        2,
        "{:?}",
        loaded.manifest.packs
    );
    assert!(loaded.manifest.packs.contains(repository_pack));
    assert_eq!(loaded.packs_downloaded, 1, "only the rolled-up pack");
    assert_eq!(loaded.manifest.retired.len(), COMPACT_AT);
    assert_eq!(show_refs(reader.mirror()), show_refs(&up));
    fsck(reader.mirror());
    // a cold reader finds every object in the two packs
    let cold = Snapshots::new(store.clone(), KEY, root.path().join("c")).expect("c");
    let LoadOutcome::Loaded(cold_loaded) = cold.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(cold_loaded.packs_downloaded, 2);
    assert_eq!(show_refs(cold.mirror()), show_refs(&up));
    fsck(cold.mirror());
    // the writer holds the pack it compacted into: nothing to download
    let LoadOutcome::Loaded(again) = writer.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(again.packs_downloaded, 0);
}

/// The pack indices in a mirror's pack directory.
fn pack_files(mirror: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(mirror.join("objects/pack"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".idx"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn processes_sharing_a_mirror_take_no_copy_of_each_others_packs() {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, up, remote, first) = prepared(root.path(), "shared").await;
    // a second process on the same cache directory, a third on its own
    let second = Snapshots::new(store.clone(), KEY, root.path().join("shared")).expect("second");
    let own = Snapshots::new(store.clone(), KEY, root.path().join("own")).expect("own");
    for reader in [&second, &own] {
        let LoadOutcome::Loaded(_) = reader.load().await.expect("load") else {
            panic!("missing")
        };
    }
    let shared_packs = pack_files(first.mirror());

    let mirror = mirror_of(first.mirror(), &up);
    let mut compacted = false;
    // enough saves for one compaction
    for i in 0..=COMPACT_AT {
        let saved = draft_and_save(&mirror, &first, &remote, i).await;
        assert!(saved.pack.is_some());
        compacted |= saved.compacted;
        for reader in [&second, &own] {
            let LoadOutcome::Loaded(loaded) = reader.load().await.expect("load") else {
                panic!("missing")
            };
            assert_eq!(loaded.packs_downloaded, 1);
            assert_eq!(show_refs(reader.mirror()), show_refs(&up));
            // and it is not read again
            let LoadOutcome::Loaded(again) = reader.load().await.expect("load") else {
                panic!("missing")
            };
            assert_eq!((again.bytes_read, again.packs_downloaded), (0, 0));
        }
        // the second read the new pack (for what it says of its large
        // trees), found every object in the mirror, and installed nothing
        assert_eq!(pack_files(first.mirror()), shared_packs);
    }
    assert!(compacted);
    fsck(first.mirror());
    // the third installed what it lacked, the roll-up too (it holds the
    // compacting save's objects), then removed the packs the roll-up
    // replaced: it has the packs the manifest lists, and no other
    let manifest = Manifest::decode(
        &store
            .get(&format!("{KEY}/manifest.json"))
            .await
            .expect("get")
            .expect("manifest")
            .body,
    )
    .expect("manifest");
    assert!(!manifest.retired.is_empty());
    let mut listed: Vec<String> = manifest
        .packs
        .iter()
        .map(|p| format!("pack-{p}.idx"))
        .collect();
    listed.sort();
    assert_eq!(pack_files(own.mirror()), listed);
    assert_eq!(
        std::fs::read_dir(own.mirror().join("objects/pack"))
            .expect("pack directory")
            .count(),
        2 * listed.len(),
        "each index with its pack, nothing else"
    );
    assert_eq!(show_refs(own.mirror()), show_refs(&up));
    fsck(own.mirror());
}

#[tokio::test]
async fn packs_a_mirror_installed_stay_while_only_a_held_roll_up_holds_their_objects() {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, up, remote, writer) = prepared(root.path(), "w").await;
    let other = Snapshots::new(store.clone(), KEY, root.path().join("o")).expect("other");
    let LoadOutcome::Loaded(_) = other.load().await.expect("load") else {
        panic!("missing")
    };
    // the writer's saves, each installed by the other as it loads them
    let writes = mirror_of(writer.mirror(), &up);
    for i in 0..COMPACT_AT - 1 {
        draft_and_save(&writes, &writer, &remote, i).await;
        let LoadOutcome::Loaded(loaded) = other.load().await.expect("load") else {
            panic!("missing")
        };
        assert_eq!(loaded.packs_downloaded, 1);
    }
    // the other's save compacts: it holds the roll-up (its own pack), whose
    // objects are in the packs it installed and its own
    let saved = draft_and_save(&mirror_of(other.mirror(), &up), &other, &remote, 100).await;
    assert!(saved.compacted);
    // the writer's next save: the other downloads it, and must keep the
    // packs the roll-up retired, since it never installed the roll-up
    writer.load().await.expect("load");
    draft_and_save(&writes, &writer, &remote, 101).await;
    let LoadOutcome::Loaded(loaded) = other.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(loaded.packs_downloaded, 1);
    assert!(!loaded.manifest.retired.is_empty());
    assert_eq!(show_refs(other.mirror()), show_refs(&up));
    fsck(other.mirror());
}

#[tokio::test]
async fn a_corrupt_snapshot_is_rebuilt_from_the_remote() {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, up, remote, writer) = prepared(root.path(), "w").await;

    // a damaged pack: detected by its checksum, then rebuilt
    let packs = writer.stored_packs().await.expect("packs");
    let pack_key = format!(
        "{KEY}/packs/pack-{}.pack",
        packs.iter().next().expect("one pack")
    );
    let mut body = store.get(&pack_key).await.expect("get").expect("pack").body;
    let middle = body.len() / 2;
    body[middle] ^= 0xff;
    store
        .put(&pack_key, body, PutCondition::Always)
        .await
        .expect("damage");
    let reader = Snapshots::new(store.clone(), KEY, root.path().join("r")).expect("r");
    let err = reader.load().await.expect_err("corrupt");
    assert!(err.to_string().contains("checksum"), "{err}");
    let prepared = reader.prepare(&remote).await.expect("prepare");
    assert!(matches!(prepared, Prepared::Rebuilt(_)), "{prepared:?}");
    assert_eq!(show_refs(reader.mirror()), show_refs(&up));
    let other = Snapshots::new(store.clone(), KEY, root.path().join("o")).expect("o");
    assert!(matches!(
        other.load().await.expect("load"),
        LoadOutcome::Loaded(_)
    ));
    fsck(other.mirror());

    // garbage in the manifest: rebuilt too
    store
        .put(
            &format!("{KEY}/manifest.json"),
            b"{not json".to_vec(),
            PutCondition::Always,
        )
        .await
        .expect("garbage");
    let again = Snapshots::new(store.clone(), KEY, root.path().join("g")).expect("g");
    assert!(matches!(
        again.prepare(&remote).await.expect("prepare"),
        Prepared::Rebuilt(_)
    ));
    assert_eq!(show_refs(again.mirror()), show_refs(&up));
}

/// A handler killed after its push and before its manifest write: the next
/// one loads the older snapshot, fetches, and the save converges.
#[tokio::test]
async fn killed_between_push_and_manifest_converges() {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, up, remote, first) = prepared(root.path(), "first").await;
    let mirror = mirror_of(first.mirror(), &up);
    mirror.apply(draft("lost", "u-lost")).await.expect("pushed");
    // ...killed here: no save

    let next = Snapshots::new(store.clone(), KEY, root.path().join("next")).expect("next");
    next.prepare(&remote).await.expect("load");
    assert!(
        !show_refs(next.mirror()).contains_key("refs/heads/drafts/c/lost"),
        "snapshot is behind"
    );
    let mirror = mirror_of(next.mirror(), &up);
    // the same invocation delivered again: recognised, nothing pushed twice
    let again = mirror.apply(draft("lost", "u-lost")).await.expect("again");
    assert!(again.updates.is_empty());
    next.save(remote.url()).await.expect("save");
    let last = Snapshots::new(store.clone(), KEY, root.path().join("last")).expect("last");
    last.load().await.expect("load");
    assert_eq!(show_refs(last.mirror()), show_refs(&up));
}

#[test]
fn hostile_manifests_are_refused() {
    let good = r#"{"format":1,"remote":"https://example.com/r.git","fetchedAt":1,
        "refs":{"refs/heads/main":"0123456789012345678901234567890123456789"},
        "packs":["0123456789012345678901234567890123456789"]}"#;
    assert!(Manifest::decode(good.as_bytes()).is_ok());
    let id = "0123456789012345678901234567890123456789";
    for (bad, needle) in [
        ("{", "not a manifest"),
        ("[]", "not a manifest"),
        (&good.replace("\"format\":1", "\"format\":2"), "format 2"),
        (
            &good.replace("\"packs\"", "\"extra\":1,\"packs\""),
            "unknown field",
        ),
        (&good.replace("refs/heads/main", "HEAD"), "not a branch"),
        (
            &good.replace("refs/heads/main", "refs/heads/../x"),
            "not a branch",
        ),
        (
            &good.replace("refs/heads/main", "refs/remotes/x"),
            "not a branch",
        ),
        (&good.replacen(id, "zz", 1), "bad object id"),
        (
            &good.replacen(&format!("[\"{id}\"]"), "[\"../../etc/passwd\"]", 1),
            "not a checksum",
        ),
    ] {
        let err = Manifest::decode(bad.as_bytes()).expect_err(bad);
        assert!(err.contains(needle), "{bad}: {err}");
    }
    for (bad, needle) in [
        (
            good.replace("\"packs\"", "\"base\":\"../x\",\"packs\""),
            "not a checksum",
        ),
        (
            good.replace("\"packs\"", "\"deleted\":[\"HEAD\"],\"packs\""),
            "not a branch",
        ),
    ] {
        let err = Manifest::decode(bad.as_bytes()).expect_err(&bad);
        assert!(err.contains(needle), "{bad}: {err}");
    }
    let huge = vec![b' '; porch_git::snapshot::MAX_MANIFEST_BYTES + 1];
    assert!(
        Manifest::decode(&huge)
            .expect_err("huge")
            .contains("larger")
    );
}

#[test]
fn hostile_snapshot_keys_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for key in ["../x", "/abs", "a//b", ""] {
        assert!(
            Snapshots::new(LocalDirStore::new(tmp.path()), key, tmp.path().join("m")).is_err(),
            "{key}"
        );
    }
}

/// Discovery's tag cache travels with the snapshot: a cold handler gets it
/// on load and discovers the same revisions without reading tag trees.
#[tokio::test]
async fn discovery_cache_travels_with_the_snapshot() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = LocalDirStore::new(root.path().join("store"));
    let up = upstream(root.path());
    git(&up, &["tag", "a/v1", "main"]);
    git(&up, &["tag", "b/v1", "main"]);
    let remote = LocalRemote::new(&up);
    let a = Snapshots::new(store.clone(), KEY, root.path().join("a")).expect("a");
    a.prepare(&remote).await.expect("rebuild");
    let layout = RepoLayout::new("", "main");
    let first = porch_git::discovery::discover(
        &GitRepo::open(a.mirror()).expect("open"),
        &layout,
        "repo",
        remote.url(),
    )
    .expect("discover");
    assert!(a.save_discovery_cache().await.expect("save cache") > 0);
    let b = Snapshots::new(store.clone(), KEY, root.path().join("b")).expect("b");
    b.load().await.expect("load");
    assert!(
        b.mirror()
            .join(porch_git::discovery::TAG_CACHE_FILE)
            .exists()
    );
    let second = porch_git::discovery::discover(
        &GitRepo::open(b.mirror()).expect("open"),
        &layout,
        "repo",
        remote.url(),
    )
    .expect("discover");
    assert_eq!(first, second);
    assert_eq!(first.iter().filter(|r| r.revision == 1).count(), 2);
}

/// With more refs than [`MAX_DELTA`], the refs move to a base object and a
/// save writes, and a changed manifest costs a reader, only the refs that
/// changed since.
#[tokio::test]
async fn many_refs_live_in_a_base_and_saves_write_only_changes() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = LocalDirStore::new(root.path().join("store"));
    let up = upstream(root.path());
    let main = git(&up, &["rev-parse", "main"]).trim().to_owned();
    let script: String = (0..porch_git::snapshot::MAX_DELTA + 100)
        .map(|i| format!("create refs/tags/p{i:05}/v1 {main}\n"))
        .collect();
    let mut command = crate::support::git_command();
    command
        .arg("--git-dir")
        .arg(&up)
        .args(["update-ref", "--stdin"])
        .stdin(std::process::Stdio::piped());
    let mut child = command.spawn().expect("git");
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), script.as_bytes())
        .expect("write");
    assert!(child.wait().expect("wait").success());
    let remote = LocalRemote::new(&up);
    let writer = Snapshots::new(store.clone(), KEY, root.path().join("w")).expect("w");
    writer.prepare(&remote).await.expect("rebuild");
    let manifest = || async {
        let body = store
            .get(&format!("{KEY}/manifest.json"))
            .await
            .expect("get")
            .expect("manifest")
            .body;
        (Manifest::decode(&body).expect("decode"), body.len())
    };
    let (first, first_size) = manifest().await;
    assert!(first.base.is_some(), "refs moved to a base");
    assert!(first.refs.is_empty());
    assert!(first_size < 4096, "manifest of {first_size} bytes");

    // one more draft: the manifest lists one changed ref on the same base
    let mirror = mirror_of(writer.mirror(), &up);
    mirror.apply(draft("more", "u-more")).await.expect("draft");
    writer.save(remote.url()).await.expect("save");
    let (second, _) = manifest().await;
    assert_eq!(second.base, first.base);
    assert_eq!(
        second.refs.keys().collect::<Vec<_>>(),
        vec!["refs/heads/drafts/c/more"]
    );

    // the local state does not list the refs again: its size does not
    // grow with them, and a restarted process (same mirror, empty memory)
    // resolves them from the base kept beside the mirror, reading nothing
    let state = std::fs::metadata(writer.mirror().join("porch-snapshot.json"))
        .expect("state file")
        .len();
    assert!(state < 8 * 1024, "state of {state} bytes");
    let restarted = Snapshots::new(store.clone(), KEY, writer.mirror()).expect("restarted");
    let LoadOutcome::Loaded(loaded) = restarted.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(loaded.bytes_read, 0);
    assert_eq!(show_refs(writer.mirror()), show_refs(&up));
    let saved = restarted.save(remote.url()).await.expect("save");
    assert_eq!(saved.bytes_written, 0, "nothing moved: nothing written");

    // a reader that had the previous manifest reads only the small new one
    let reader = Snapshots::new(store.clone(), KEY, root.path().join("r")).expect("r");
    reader.load().await.expect("first load");
    mirror
        .apply(draft("again", "u-again"))
        .await
        .expect("draft");
    writer.save(remote.url()).await.expect("save");
    let LoadOutcome::Loaded(loaded) = reader.load().await.expect("load") else {
        panic!("missing")
    };
    assert!(
        loaded.bytes_read < 16 * 1024,
        "read {} bytes",
        loaded.bytes_read
    );
    assert_eq!(show_refs(reader.mirror()), show_refs(&up));
    fsck(reader.mirror());

    // a fresh reader resolves the base too
    let fresh = Snapshots::new(store.clone(), KEY, root.path().join("f")).expect("f");
    fresh.load().await.expect("load");
    assert_eq!(show_refs(fresh.mirror()), show_refs(&up));

    // a rebuild (here: a damaged base) retires the old base and packs
    let (before, _) = manifest().await;
    let old_base = before.base.clone().expect("base");
    store
        .put(
            &format!("{KEY}/refs/{old_base}.json"),
            b"{}".to_vec(),
            PutCondition::Always,
        )
        .await
        .expect("damage");
    git(&up, &["tag", "extra/v1", "main"]);
    let cold = Snapshots::new(store.clone(), KEY, root.path().join("c")).expect("c");
    assert!(matches!(
        cold.prepare(&remote).await.expect("prepare"),
        Prepared::Rebuilt(_)
    ));
    let (after, _) = manifest().await;
    assert_ne!(after.base, before.base);
    assert!(after.retired_bases.iter().any(|r| r.pack == old_base));
    assert_eq!(show_refs(cold.mirror()), show_refs(&up));
}

#[tokio::test]
async fn a_save_that_loses_the_race_to_a_compaction_still_lists_every_object() {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, up, remote, writer) = prepared(root.path(), "w").await;
    let other = Snapshots::new(store.clone(), KEY, root.path().join("o")).expect("o");
    other.load().await.expect("load");

    // the writer adds a file to the draft `a/ws`: its pack leaves out the
    // draft's other files, which the snapshot it loaded has
    let mirror = mirror_of(writer.mirror(), &up);
    let edited = mirror
        .apply(|repo| {
            Packages {
                repo,
                layout: RepoLayout::new("", "main"),
            }
            .replace_draft_content(
                "a",
                "ws",
                &Files::from([
                    ("Kptfile".to_owned(), b"kind: Kptfile\nname: a\n".to_vec()),
                    ("cm.yaml".to_owned(), b"x: 1\n".to_vec()),
                    ("extra.yaml".to_owned(), b"y: 2\n".to_vec()),
                ]),
                Task {
                    type_: TaskType::Init,
                    ..Default::default()
                },
                &Actor {
                    uid: "u-edit".into(),
                    generation: 2,
                    author: Identity::of_user("bob@example.com"),
                    time: 1_795_000_000,
                },
            )
        })
        .await
        .expect("edit")
        .value;

    // meanwhile another process drops that draft and compacts the
    // snapshot: the draft's old files are in no listed pack any more
    git(&up, &["update-ref", "-d", "refs/heads/drafts/a/ws"]);
    let others = mirror_of(other.mirror(), &up);
    let mut compacted = false;
    for i in 0..=COMPACT_AT {
        others
            .apply(draft(&format!("o{i}"), &format!("o{i}")))
            .await
            .expect("draft");
        compacted |= other.save(remote.url()).await.expect("save").compacted;
    }
    assert!(compacted);

    // the writer's save merges into the compacted manifest
    let saved = writer.save(remote.url()).await.expect("save");
    assert!(saved.merges > 0);
    let reader = Snapshots::new(store.clone(), KEY, root.path().join("r")).expect("r");
    reader.load().await.expect("load");
    let files = GitRepo::open(reader.mirror())
        .expect("open")
        .read_files(edited, "a")
        .expect("every file of the edited draft is in the snapshot");
    assert_eq!(
        files.get("cm.yaml").map(Vec::as_slice),
        Some(&b"x: 1\n"[..])
    );
    fsck(reader.mirror());
}

/// In a repository whose root tree is large, a save stores the new root
/// tree as a delta against its parent's, which the snapshot holds: the
/// pack grows with the change, not with the repository. A cold reader
/// reads every tree whole, and a compaction writes the trees whole again,
/// so its readers get complete packs.
#[tokio::test]
async fn a_large_root_tree_is_saved_as_a_delta_against_the_snapshots() {
    let root = tempfile::tempdir().expect("tempdir");
    let up = upstream(root.path());
    let texts: Vec<(String, String)> = (0..700)
        .map(|i| (format!("p{i:03}/Kptfile"), format!("n: {i}\n")))
        .collect();
    let files: Vec<(&str, &str)> = texts
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    git_commit_files(&up, "main", &files, "many packages");
    let store = LocalDirStore::new(root.path().join("store"));
    let remote = LocalRemote::new(&up);
    let writer = Snapshots::new(store.clone(), KEY, root.path().join("w")).expect("w");
    writer.prepare(&remote).await.expect("rebuild");
    let mirror = mirror_of(writer.mirror(), &up);
    let pack_size = |pack: &str| {
        let store = store.clone();
        let key = format!("{KEY}/packs/pack-{pack}.pack");
        async move {
            store
                .get(&key)
                .await
                .expect("get")
                .expect("pack")
                .body
                .len()
        }
    };
    let up_repo = gix::open(&up).expect("gix");
    let main_tree = up_repo
        .find_reference("refs/heads/main")
        .expect("main")
        .peel_to_commit()
        .expect("commit")
        .tree_id()
        .expect("tree");
    let main_tree_size = up_repo.find_object(main_tree).expect("tree").data.len();
    assert!(main_tree_size > 20_000, "{main_tree_size}");
    for i in 0..3 {
        mirror
            .apply(draft(&format!("ws{i}"), &format!("u{i}")))
            .await
            .expect("draft");
        let saved = writer.save(remote.url()).await.expect("save");
        let size = pack_size(saved.pack.as_deref().expect("a pack")).await;
        assert!(size < 2_000, "save {i}: a pack of {size} bytes");
    }

    let reader = Snapshots::new(store.clone(), KEY, root.path().join("r")).expect("r");
    let LoadOutcome::Loaded(_) = reader.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(show_refs(reader.mirror()), show_refs(&up));
    let ours = gix::open(reader.mirror()).expect("gix");
    for i in 0..3 {
        let name = format!("refs/heads/drafts/c/ws{i}");
        let commit = up_repo
            .find_reference(name.as_str())
            .expect("draft")
            .peel_to_commit()
            .expect("commit");
        let tree = commit.tree_id().expect("tree").detach();
        let theirs = up_repo.find_object(tree).expect("tree").detach().data;
        let read = ours.find_object(tree).expect("tree").detach().data;
        assert!(read == theirs, "{name}: the delta made another tree");
        let files = GitRepo::open(reader.mirror())
            .expect("open")
            .read_files(commit.id, "c")
            .expect("files");
        assert_eq!(
            files.get("Kptfile"),
            Some(&format!("kind: Kptfile\nname: ws{i}\n").into_bytes())
        );
    }

    // the reader learned from the packs it loaded: its own save is a delta
    mirror_of(reader.mirror(), &up)
        .apply(draft("rw", "ru"))
        .await
        .expect("draft");
    let saved = reader.save(remote.url()).await.expect("save");
    let size = pack_size(saved.pack.as_deref().expect("a pack")).await;
    assert!(size < 2_000, "the reader's save: a pack of {size} bytes");

    // compacted: the roll-up holds every tree whole
    let mut saves = 3;
    loop {
        mirror
            .apply(draft(&format!("ws{saves}"), &format!("u{saves}")))
            .await
            .expect("draft");
        saves += 1;
        if writer.save(remote.url()).await.expect("save").compacted {
            break;
        }
        assert!(saves <= COMPACT_AT, "no compaction after {saves} saves");
    }
    let cold = Snapshots::new(store.clone(), KEY, root.path().join("c")).expect("c");
    let LoadOutcome::Loaded(loaded) = cold.load().await.expect("load") else {
        panic!("missing")
    };
    assert_eq!(
        loaded.manifest.packs.len(),
        2,
        "{:?}",
        loaded.manifest.packs
    );
    assert_eq!(show_refs(cold.mirror()), show_refs(&up));
    fsck(cold.mirror());
}
