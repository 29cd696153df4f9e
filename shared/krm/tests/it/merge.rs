//! Package upgrade against `kpt pkg update`: the same upstream versions in a
//! local git repository, the same local changes, the same result.

use std::path::Path;
use std::process::Command;

use porch_krm::merge::{MergeError, Strategy, add_merge_keys, update};
use porch_krm::package::Files;
use pretty_assertions::assert_eq;

use crate::support::{fixtures, read_tree};

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args([
            "-c",
            "user.email=test@example.com",
            "-c",
            "user.name=test",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

fn kpt(dir: &Path, args: &[&str]) {
    let output = Command::new("kpt")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("kpt runs");
    assert!(
        output.status.success(),
        "kpt {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn write(dir: &Path, files: &Files) {
    for (path, bytes) in files {
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::write(target, bytes).expect("write");
    }
}

/// Upstream at v1 and v2 in a git repository, a package fetched at v1 with
/// kpt and edited: returns (v1, v2, the local files, the local directory).
fn scenario(dir: &Path) -> anyhow::Result<(Files, Files, Files, std::path::PathBuf)> {
    let upstream = dir.join("upstream");
    std::fs::create_dir_all(upstream.join("pkg"))?;
    git(&upstream, &["init", "-q"]);
    let v1 = read_tree(&fixtures().join("merge/v1"));
    let v2 = read_tree(&fixtures().join("merge/v2"));
    write(&upstream.join("pkg"), &v1);
    git(&upstream, &["add", "-A"]);
    git(&upstream, &["commit", "-qm", "v1"]);
    git(&upstream, &["tag", "v1"]);
    let repo = format!("file://{}/.git/pkg", upstream.display());
    kpt(dir, &["pkg", "get", &format!("{repo}@v1"), "local"]);
    let local_dir = dir.join("local");
    let fetched = read_tree(&local_dir);

    // Local edits, then upstream v2.
    let mut edits = read_tree(&fixtures().join("merge/local"));
    // A function added locally next to the one upstream changes.
    let kptfile = String::from_utf8(fetched["Kptfile"].clone())?.replace(
        "pipeline:\n  mutators:\n",
        "pipeline:\n  mutators:\n    - image: set-annotations:v0.1\n      configMap:\n        owner: me\n",
    );
    assert!(kptfile.contains("owner: me"));
    edits.insert("Kptfile".into(), kptfile.into_bytes());
    write(&local_dir, &edits);
    let mut local = fetched;
    local.extend(edits);
    std::fs::remove_dir_all(upstream.join("pkg"))?;
    write(&upstream.join("pkg"), &v2);
    git(&upstream, &["add", "-A"]);
    git(&upstream, &["commit", "-qm", "v2"]);
    git(&upstream, &["tag", "v2"]);
    Ok((v1, v2, local, local_dir))
}

/// The Kptfile without the upstream fields kpt takes from git.
fn strip_upstream(bytes: &[u8]) -> anyhow::Result<String> {
    let mut node =
        porch_krm::yaml::parse_document(std::str::from_utf8(bytes)?)?.unwrap_or_default();
    node.remove("upstream");
    node.remove("upstreamLock");
    Ok(porch_krm::yaml::emit_document(
        &node,
        porch_krm::yaml::SeqIndent::Wide,
    ))
}

fn as_text(files: &Files) -> Vec<(String, String)> {
    files
        .iter()
        .filter(|(p, _)| p.as_str() != "Kptfile")
        .map(|(p, b)| (p.clone(), String::from_utf8_lossy(b).into_owned()))
        .collect()
}

#[test]
fn resource_merge_matches_kpt_pkg_update() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (v1, v2, local, local_dir) = scenario(dir.path())?;
    kpt(dir.path(), &["pkg", "update", "local@v2"]);
    let expected = read_tree(&local_dir);

    let merged = update(&v1, &v2, &local, Strategy::ResourceMerge)?;
    let merged = add_merge_keys(&merged, false)?;
    assert_eq!(as_text(&merged), as_text(&expected));
    // The Kptfile: the same apart from the upstream fields kpt takes from git.
    assert_eq!(
        strip_upstream(&merged["Kptfile"])?,
        strip_upstream(&expected["Kptfile"])?
    );
    let kptfile = String::from_utf8(merged["Kptfile"].clone())?;
    assert!(kptfile.contains("app: b"), "{kptfile}");
    assert!(kptfile.contains("owner: me"), "{kptfile}");
    assert!(kptfile.contains("name: local"), "{kptfile}");
    Ok(())
}

#[test]
fn the_other_strategies_match_kpt_pkg_update() -> anyhow::Result<()> {
    // copy-merge is newer than kpt 1.0.0-beta.56; the file vectors below
    // cover it.
    for (name, strategy) in [
        ("force-delete-replace", Strategy::ForceDeleteReplace),
        ("fast-forward", Strategy::FastForward),
    ] {
        let dir = tempfile::tempdir()?;
        let (v1, v2, local, local_dir) = scenario(dir.path())?;
        let output = Command::new("kpt")
            .args(["pkg", "update", "local@v2", "--strategy", name])
            .current_dir(dir.path())
            .output()?;
        let ours = update(&v1, &v2, &local, strategy);
        if strategy == Strategy::FastForward {
            // The local copy changed: both refuse.
            assert!(!output.status.success(), "{name}");
            assert!(
                String::from_utf8_lossy(&output.stderr)
                    .contains("local package files have been modified")
            );
            assert!(matches!(ours, Err(MergeError::LocalChanges(_))), "{ours:?}");
            continue;
        }
        assert!(
            output.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let expected = read_tree(&local_dir);
        let ours = add_merge_keys(&ours?, false)?;
        assert_eq!(as_text(&ours), as_text(&expected), "{name}");
    }
    Ok(())
}

fn files(entries: &[(&str, &str)]) -> Files {
    entries
        .iter()
        .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
        .collect()
}

const K: &str = "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: p\n";

#[test]
fn strategies_handle_local_files_as_kpt_does() {
    // The file1.txt vectors: copy-merge and force-delete-replace take
    // upstream, resource-merge keeps the local change, fast-forward refuses.
    let original = files(&[("Kptfile", K), ("file1.txt", "original\n")]);
    let updated = files(&[("Kptfile", K), ("file1.txt", "updated\n")]);
    let local = files(&[("Kptfile", K), ("file1.txt", "local\n")]);
    let text = |f: &Files| String::from_utf8_lossy(&f["file1.txt"]).into_owned();
    assert_eq!(
        text(&update(&original, &updated, &local, Strategy::CopyMerge).expect("copy-merge")),
        "updated\n"
    );
    assert_eq!(
        text(&update(&original, &updated, &local, Strategy::ForceDeleteReplace).expect("replace")),
        "updated\n"
    );
    assert_eq!(
        text(&update(&original, &updated, &local, Strategy::ResourceMerge).expect("merge")),
        "local\n"
    );
    match update(&original, &updated, &local, Strategy::FastForward) {
        Err(MergeError::LocalChanges(files)) => assert_eq!(files, vec!["file1.txt".to_owned()]),
        other => panic!("{other:?}"),
    }
    // Unchanged locally: fast-forward takes upstream.
    let ff = update(&original, &updated, &original, Strategy::FastForward).expect("fast-forward");
    assert_eq!(text(&ff), "updated\n");
}

#[test]
fn subpackages_follow_the_existence_matrix() {
    let sub = "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: s\n";
    let original = files(&[("Kptfile", K), ("gone/Kptfile", sub), ("gone/a.txt", "a\n")]);
    let updated = files(&[("Kptfile", K), ("new/Kptfile", sub), ("both/Kptfile", sub)]);
    let local = files(&[("Kptfile", K), ("gone/Kptfile", sub), ("gone/a.txt", "a\n")]);
    let out = update(&original, &updated, &local, Strategy::ResourceMerge).expect("merge");
    assert!(out.contains_key("new/Kptfile"));
    assert!(
        !out.keys().any(|p| p.starts_with("gone/")),
        "{:?}",
        out.keys()
    );
    // Changed locally: kept.
    let changed = files(&[
        ("Kptfile", K),
        ("gone/Kptfile", sub),
        ("gone/a.txt", "mine\n"),
    ]);
    let out = update(&original, &updated, &changed, Strategy::ResourceMerge).expect("merge");
    assert!(out.contains_key("gone/a.txt"));
    // Added on both sides: an error.
    let both = files(&[("Kptfile", K), ("both/Kptfile", sub)]);
    assert_eq!(
        update(&original, &updated, &both, Strategy::ResourceMerge),
        Err(MergeError::SubpackageAddedInBoth("both".into()))
    );
}

#[test]
fn objects_merge_by_identity_and_duplicates_are_errors() {
    let cm = |data: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n{data}")
    };
    let original = files(&[("Kptfile", K), ("c.yaml", &cm("  a: \"1\"\n  b: \"1\"\n"))]);
    let updated = files(&[("Kptfile", K), ("c.yaml", &cm("  a: \"2\"\n  b: \"1\"\n"))]);
    let local = files(&[
        ("Kptfile", K),
        ("c.yaml", &cm("  a: \"1\"\n  b: \"9\" # mine\n  c: \"3\"\n")),
    ]);
    let out = update(&original, &updated, &local, Strategy::ResourceMerge).expect("merge");
    assert_eq!(
        String::from_utf8_lossy(&out["c.yaml"]),
        cm("  a: \"2\"\n  b: \"9\" # mine\n  c: \"3\"\n")
    );
    // Deleted upstream and unchanged locally: gone, with its file.
    let gone = files(&[("Kptfile", K)]);
    let out = update(&original, &gone, &original, Strategy::ResourceMerge).expect("merge");
    assert!(!out.contains_key("c.yaml"));
    // Deleted upstream but changed locally: kept.
    let out = update(&original, &gone, &local, Strategy::ResourceMerge).expect("merge");
    assert!(out.contains_key("c.yaml"));
    let dup = files(&[
        ("Kptfile", K),
        (
            "c.yaml",
            &format!("{}---\n{}", cm("  a: x\n"), cm("  a: y\n")),
        ),
    ]);
    assert!(matches!(
        update(&original, &updated, &dup, Strategy::ResourceMerge),
        Err(MergeError::Duplicate { .. })
    ));
}
