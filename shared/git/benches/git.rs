//! The git engine's figures: create-draft and publish latency through a
//! warm snapshot and a smart-HTTP remote, bytes read from the object store,
//! and the `git` CLI doing the same commit and push on a warm clone of the
//! same repository behind the same server; discovery time.
//!
//! `cargo bench -p porch-git --bench git -- [--sizes 10,1000,10000] [--runs 7] [--distinct-trees]`
//!
//! Repositories: N packages, 3 published revisions each (one approval commit
//! per revision on `main`, tags `pkg-<i>/v1..v3`) and a draft on every tenth
//! package. The `git` CLI builds nothing in the product; here it repacks
//! the fixture and is the baseline.

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use porch_api::v1alpha1::{Task, TaskType};
use porch_git::annotation::{Annotation, approval_message};
use porch_git::discovery::discover;
use porch_git::identity::{Identity, committer};
use porch_git::layout::RepoLayout;
use porch_git::mirror::{Mirror, RetryPolicy};
use porch_git::operations::{Actor, Packages};
use porch_git::remote::{RemoteOptions, SmartRemote};
use porch_git::repo::{Files, GitRepo};
use porch_git::snapshot::Snapshots;
use porch_git::store::{
    ETag, Fetched, LocalDirStore, ObjectStore, PutCondition, StoreError, StoredObject,
};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/servers/announced.rs"]
mod announced;

/// A store that counts the bytes it hands back.
#[derive(Debug, Clone)]
struct Counting {
    inner: LocalDirStore,
    read: Arc<AtomicU64>,
}

impl Counting {
    fn count(&self, n: usize) {
        self.read.fetch_add(n as u64, Ordering::Relaxed);
    }
}

impl ObjectStore for Counting {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        let got = self.inner.get(key).await?;
        if let Some(o) = &got {
            self.count(o.body.len());
        }
        Ok(got)
    }
    async fn get_if_changed(&self, key: &str, known: Option<&ETag>) -> Result<Fetched, StoreError> {
        let got = self.inner.get_if_changed(key, known).await?;
        if let Fetched::Found(o) = &got {
            self.count(o.body.len());
        }
        Ok(got)
    }
    async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: PutCondition,
    ) -> Result<ETag, StoreError> {
        self.inner.put(key, body, condition).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "cli")
        .env("GIT_AUTHOR_EMAIL", "cli@example.com")
        .env("GIT_COMMITTER_NAME", "cli")
        .env("GIT_COMMITTER_EMAIL", "cli@example.com")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn package_files(i: usize, v: usize) -> Files {
    Files::from([
        (
            "Kptfile".to_owned(),
            format!("apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: pkg-{i:05}\n").into_bytes(),
        ),
        (
            "cm.yaml".to_owned(),
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: pkg-{i:05}\ndata:\n  revision: \"{v}\"\n").into_bytes(),
        ),
    ])
}

/// The upstream repository with `n` packages.
/// With `distinct_trees`, every approval commit has its own root tree (as
/// in a repository grown by publishes); else the commits of one round of
/// revisions share one root tree (fast to build at 10,000 packages).
fn build_upstream(dir: &Path, n: usize, distinct_trees: bool) {
    let repo = GitRepo::init_bare(dir).unwrap();
    let who = Identity::of_user("fixture@example.com");
    let mut refs = String::new();
    let readme = repo
        .write_files(&Files::from([(
            "README.md".to_owned(),
            b"Created by porch\n".to_vec(),
        )]))
        .unwrap();
    let mut head = repo
        .commit(
            readme,
            &[],
            "Initial commit: Creating main branch",
            &who,
            &committer(),
            1,
        )
        .unwrap();
    let mut tree = readme;
    for v in 1..=3 {
        let subtrees: Vec<(String, Option<gix::ObjectId>)> = (0..n)
            .map(|i| {
                (
                    format!("pkg-{i:05}"),
                    Some(repo.write_files(&package_files(i, v)).unwrap()),
                )
            })
            .collect();
        if !distinct_trees {
            tree = repo.replace_subtrees(Some(tree), &subtrees).unwrap();
        }
        for (i, subtree) in subtrees.iter().enumerate() {
            if distinct_trees {
                tree = repo
                    .replace_subtrees(Some(tree), std::slice::from_ref(subtree))
                    .unwrap();
            }
            let message = approval_message(&Annotation {
                package_path: format!("pkg-{i:05}"),
                workspace_name: format!("ws-{v}"),
                revision: v.to_string(),
                ..Default::default()
            });
            head = repo
                .commit(tree, &[head], &message, &who, &committer(), 2)
                .unwrap();
            refs.push_str(&format!("create refs/tags/pkg-{i:05}/v{v} {head}\n"));
        }
    }
    for i in (0..n).step_by(10) {
        let draft = repo
            .commit(tree, &[head], "draft", &who, &committer(), 3)
            .unwrap();
        refs.push_str(&format!(
            "create refs/heads/drafts/pkg-{i:05}/draft {draft}\n"
        ));
    }
    refs.push_str(&format!("create refs/heads/main {head}\n"));
    let mut child = Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .arg("--git-dir")
        .arg(dir)
        .args(["update-ref", "--stdin"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), refs.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    git(dir, &["pack-refs", "--all"]);
    git(dir, &["repack", "-adq"]);
    git(dir, &["config", "http.receivepack", "true"]);
    git(dir, &["symbolic-ref", "HEAD", "refs/heads/main"]);
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(root: &Path) -> (Server, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/git_http_server.py");
    let mut command = Command::new("python3");
    command.arg(script).arg(root).arg("0");
    let (child, port) = announced::spawn_announcing(command);
    (Server(child), port)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn actor(uid: String) -> Actor {
    Actor {
        uid,
        generation: 1,
        author: Identity::of_user("bench@example.com"),
        time: 1_795_000_000,
    }
}

#[derive(Debug, Default)]
struct Row {
    packages: usize,
    revisions: usize,
    /// Time to build the fixture repository, shown with `{row:?}`.
    #[allow(dead_code)]
    fixture: f64,
    cold_rebuild: f64,
    discovery: f64,
    discovery_warm: f64,
    draft: f64,
    draft_bytes: f64,
    draft_cli: f64,
    publish: f64,
    publish_bytes: f64,
    publish_cli: f64,
    /// Snapshot load, fetch-free publish and push, snapshot save.
    publish_phases: [f64; 3],
    cold_publish: f64,
    cold_publish_bytes: f64,
}

async fn measure(n: usize, runs: usize, distinct_trees: bool) -> Row {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("srv");
    std::fs::create_dir_all(&root).unwrap();
    let upstream = root.join("repo.git");
    let started = Instant::now();
    build_upstream(&upstream, n, distinct_trees);
    let mut row = Row {
        packages: n,
        fixture: ms(started.elapsed()),
        ..Row::default()
    };
    let (_server, port) = serve(&root);
    let url = format!("http://127.0.0.1:{port}/repo.git");
    let read = Arc::new(AtomicU64::new(0));
    let store = Counting {
        inner: LocalDirStore::new(tmp.path().join("store")),
        read: Arc::clone(&read),
    };
    let snapshots =
        Snapshots::new(store.clone(), "repos/bench/repo", tmp.path().join("mirror")).unwrap();
    let remote = SmartRemote::new(&url, RemoteOptions::default()).unwrap();
    let started = Instant::now();
    snapshots.prepare(&remote).await.unwrap();
    row.cold_rebuild = ms(started.elapsed());
    let mirror = Mirror::new(snapshots.mirror(), remote, RetryPolicy::default()).unwrap();
    let layout = RepoLayout::new("", "main");

    // cold: no tag cache yet (every tag's commit and Kptfile read); warm:
    // the cache next to the mirror
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let _ = std::fs::remove_file(snapshots.mirror().join("porch-discovery.json"));
        for times in [&mut cold, &mut warm] {
            let repo = GitRepo::open(snapshots.mirror()).unwrap();
            let started = Instant::now();
            let found = discover(&repo, &layout, "repo", &url).unwrap();
            times.push(ms(started.elapsed()));
            row.revisions = found.len();
        }
    }
    row.discovery = median(&mut cold);
    row.discovery_warm = median(&mut warm);

    // create-draft: load (warm) + create + push + save
    let (mut lat, mut bytes) = (Vec::new(), Vec::new());
    for r in 0..runs {
        read.store(0, Ordering::Relaxed);
        let started = Instant::now();
        snapshots.load().await.unwrap();
        let package = format!("pkg-{:05}", r % n);
        let ws = format!("bench-{r}");
        mirror
            .apply_optimistic(move |repo| {
                Packages {
                    repo,
                    layout: RepoLayout::new("", "main"),
                }
                .create_draft(
                    &package,
                    &ws,
                    &package_files(r, 9),
                    Task {
                        type_: TaskType::Init,
                        ..Default::default()
                    },
                    &actor(format!("draft-{r}")),
                )
            })
            .await
            .unwrap();
        snapshots.save(&url).await.unwrap();
        lat.push(ms(started.elapsed()));
        bytes.push(read.load(Ordering::Relaxed) as f64);
    }
    row.draft = median(&mut lat);
    row.draft_bytes = median(&mut bytes);

    // publish: proposals prepared untimed, then load + publish + push + save
    for r in 0..runs {
        let package = format!("pkg-{:05}", r % n);
        let ws = format!("pub-{r}");
        mirror
            .apply(move |repo| {
                let ops = Packages {
                    repo,
                    layout: RepoLayout::new("", "main"),
                };
                ops.create_draft(
                    &package,
                    &ws,
                    &package_files(r, 7),
                    Task {
                        type_: TaskType::Init,
                        ..Default::default()
                    },
                    &actor(format!("pub-{r}")),
                )?;
                ops.propose(&package, &ws)
            })
            .await
            .unwrap();
    }
    snapshots.save(&url).await.unwrap();
    let (mut lat, mut bytes) = (Vec::new(), Vec::new());
    let (mut loads, mut applies, mut saves) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..runs {
        read.store(0, Ordering::Relaxed);
        let started = Instant::now();
        snapshots.load().await.unwrap();
        loads.push(ms(started.elapsed()));
        let package = format!("pkg-{:05}", r % n);
        let ws = format!("pub-{r}");
        let applied = Instant::now();
        let done = mirror
            .apply_optimistic(move |repo| {
                Packages {
                    repo,
                    layout: RepoLayout::new("", "main"),
                }
                .publish(&package, &ws, &actor(format!("pub-{r}")))
            })
            .await
            .unwrap();
        applies.push(ms(applied.elapsed()));
        let saved = Instant::now();
        snapshots.save(&url).await.unwrap();
        saves.push(ms(saved.elapsed()));
        lat.push(ms(started.elapsed()));
        bytes.push(read.load(Ordering::Relaxed) as f64);
        assert_eq!(done.updates.len(), 3);
    }
    row.publish = median(&mut lat);
    row.publish_bytes = median(&mut bytes);
    row.publish_phases = [median(&mut loads), median(&mut applies), median(&mut saves)];

    // a cold handler: an empty mirror directory loads the snapshot, publishes, saves
    {
        let package = format!("pkg-{:05}", (runs + 1) % n);
        let ws = "cold".to_owned();
        let (p, w) = (package.clone(), ws.clone());
        mirror
            .apply(move |repo| {
                let ops = Packages {
                    repo,
                    layout: RepoLayout::new("", "main"),
                };
                ops.create_draft(
                    &p,
                    &w,
                    &package_files(1, 8),
                    Task {
                        type_: TaskType::Init,
                        ..Default::default()
                    },
                    &actor("cold".into()),
                )?;
                ops.propose(&p, &w)
            })
            .await
            .unwrap();
        snapshots.save(&url).await.unwrap();
        read.store(0, Ordering::Relaxed);
        let started = Instant::now();
        let cold =
            Snapshots::new(store.clone(), "repos/bench/repo", tmp.path().join("cold")).unwrap();
        cold.load().await.unwrap();
        let cold_mirror = Mirror::new(
            cold.mirror(),
            SmartRemote::new(&url, RemoteOptions::default()).unwrap(),
            RetryPolicy::default(),
        )
        .unwrap();
        cold_mirror
            .apply_optimistic(move |repo| {
                Packages {
                    repo,
                    layout: RepoLayout::new("", "main"),
                }
                .publish(&package, &ws, &actor("cold".into()))
            })
            .await
            .unwrap();
        cold.save(&url).await.unwrap();
        row.cold_publish = ms(started.elapsed());
        row.cold_publish_bytes = read.load(Ordering::Relaxed) as f64;
    }

    // the git CLI on a warm clone: the same commit and push
    let work = tmp.path().join("work");
    let out = Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["clone", "-q", &url])
        .arg(&work)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lat = Vec::new();
    for r in 0..runs {
        git(&work, &["fetch", "-q", "origin"]);
        git(&work, &["checkout", "-q", "--detach", "origin/main"]);
        let started = Instant::now();
        let file = work.join(format!("pkg-{:05}", r % n)).join("cli.yaml");
        std::fs::write(&file, format!("cli: {r}\n")).unwrap();
        git(&work, &["add", "-A"]);
        git(
            &work,
            &["commit", "-q", "-m", "Creating new empty revision"],
        );
        git(
            &work,
            &[
                "push",
                "-q",
                "origin",
                &format!("HEAD:refs/heads/drafts/pkg-{:05}/cli-{r}", r % n),
            ],
        );
        lat.push(ms(started.elapsed()));
    }
    row.draft_cli = median(&mut lat);
    let mut lat = Vec::new();
    for r in 0..runs {
        let package = format!("pkg-{:05}", r % n);
        // untimed: a proposed branch to merge, and main checked out
        git(&work, &["fetch", "-q", "origin"]);
        git(&work, &["checkout", "-q", "--detach", "origin/main"]);
        std::fs::write(
            work.join(&package).join("clipub.yaml"),
            format!("cli: {r}\n"),
        )
        .unwrap();
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "-q", "-m", "proposal"]);
        git(
            &work,
            &[
                "push",
                "-q",
                "origin",
                &format!("HEAD:refs/heads/proposed/{package}/clipub-{r}"),
            ],
        );
        git(&work, &["fetch", "-q", "origin"]);
        git(&work, &["checkout", "-q", "-B", "main", "origin/main"]);
        let started = Instant::now();
        git(
            &work,
            &[
                "merge",
                "-q",
                "--no-ff",
                "-m",
                &format!("Approving package revision {package}/{}", 100 + r),
                &format!("origin/proposed/{package}/clipub-{r}"),
            ],
        );
        git(&work, &["tag", &format!("{package}/v{}", 100 + r)]);
        git(
            &work,
            &[
                "push",
                "-q",
                "--atomic",
                "origin",
                "main",
                &format!("{package}/v{}", 100 + r),
                &format!(":refs/heads/proposed/{package}/clipub-{r}"),
            ],
        );
        lat.push(ms(started.elapsed()));
    }
    row.publish_cli = median(&mut lat);
    row
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sizes: Vec<usize> = arg(&args, "--sizes")
        .unwrap_or_else(|| "10,1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let distinct_trees = args.iter().any(|a| a == "--distinct-trees");
    let runs: usize = arg(&args, "--runs")
        .and_then(|r| r.parse().ok())
        .unwrap_or(7);
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for n in sizes {
        let row = runtime.block_on(measure(n, runs, distinct_trees));
        println!("{row:?}");
        rows.push(row);
    }
    println!();
    println!(
        "medians of {runs} runs (ms; bytes read from the object store per operation with a warm cache)"
    );
    println!(
        "| packages | revisions | discovery cold | warm | create-draft | git CLI | ratio | bytes read | publish | git CLI | ratio | bytes read | cold publish | cold bytes | cold rebuild |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.2} | {:.0} | {:.1} | {:.1} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} |",
            r.packages,
            r.revisions,
            r.discovery,
            r.discovery_warm,
            r.draft,
            r.draft_cli,
            r.draft / r.draft_cli,
            r.draft_bytes,
            r.publish,
            r.publish_cli,
            r.publish / r.publish_cli,
            r.publish_bytes,
            r.cold_publish,
            r.cold_publish_bytes,
            r.cold_rebuild
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        println!(
            "publish at {} packages / publish at {} packages: {:.2} (git CLI: {:.2})",
            last.packages,
            first.packages,
            last.publish / first.publish,
            last.publish_cli / first.publish_cli
        );
    }
}
