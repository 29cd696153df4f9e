//! Faults everywhere at once, then the invariants. The relay drives
//! packages from draft to published, copies and deletes them through the
//! `porch-handler` processes, while:
//! - a proxy in front of the S3 server answers 5xx before and after the
//!   write, 412 storms on the manifest, truncated and broken reads, slow
//!   answers, and holds manifest writes while the handler is killed (the
//!   push done, the snapshot not written);
//! - a proxy in front of the git server answers 500 before and after
//!   `receive-pack`, breaks connections mid-answer, rejects ref updates,
//!   truncates and slows `upload-pack`;
//! - handler processes are killed (`SIGKILL`) at random and restarted with
//!   an empty `/tmp`, as Lambda does;
//! - Invocations are delivered twice, and older Invocations of the same
//!   object arrive after newer ones.
//!
//! After the faults stop, the relay runs until nothing is due; then every
//! revision must be where its spec says, with one tag per approval and
//! consecutive revisions, no draft or proposed branch left, `git fsck
//! --strict` clean, and the snapshot in S3 reloading to the remote's refs.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use porch_api::invocation::{Invocation, Outcome};
use porch_api::v1alpha2::PackageRevision;
use porch_relay::invoker::{InvokeError, Invoker, LambdaHttp};
use porch_relay::memory::Objects;
use porch_relay::relay::{Relay, RelayConfig};
use serde_json::json;

use crate::fault_proxy::{Fault, FaultProxy, git_rule, s3_rule};
use crate::git;
use crate::runtime_api::{RuntimeApi, invoke_api};

#[path = "../../../../shared/git/tests/servers/announced.rs"]
mod announced;

/// Packages (each published twice, one revision deleted), the chance of a
/// fault per request in percent, and the pause between kills: the
/// defaults keep the run near a minute; `FAULTS_PACKAGES`, `FAULTS_PERCENT`
/// and `FAULTS_KILL_MS` scale it.
fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
const BUCKET: &str = "porch-faults";
/// AWS credentials of the handlers (the secret carries the marker
/// `.ci/secrets-in-logs` searches for).
const AWS_KEY: (&str, &str) = ("testing", "faults-secret-c4n4ry");

/// A server process stopped when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python_server(script: &str, args: &[&str], dir: &Path) -> (Server, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/git/tests/servers")
        .join(script);
    let mut command = Command::new("python3");
    command
        .arg(script)
        .args(args)
        .arg("0")
        .current_dir(dir)
        .stderr(Stdio::null());
    let (child, port) = announced::spawn_announcing(command);
    (Server(child), port)
}

/// One function: its Runtime API and its current process.
struct Slot {
    operation: &'static str,
    api: RuntimeApi,
    address: SocketAddr,
    child: Mutex<Option<std::process::Child>>,
    starts: AtomicU64,
}

/// The handler processes, restarted after every kill.
struct Functions {
    root: PathBuf,
    env: Vec<(String, String)>,
    slots: Vec<Slot>,
    kills: AtomicU64,
}

impl Functions {
    fn spawn(&self, slot: &Slot) {
        let start = slot.starts.fetch_add(1, Ordering::SeqCst);
        let child = Command::new(env!("CARGO_BIN_EXE_porch-handler"))
            .env("PORCH_OPERATION", slot.operation)
            .envs(RuntimeApi::env(
                slot.address,
                &format!("porch-{}", slot.operation),
            ))
            // a new process, a new /tmp
            .env(
                "PORCH_CACHE_DIR",
                self.root.join(format!("tmp-{}-{start}", slot.operation)),
            )
            .envs(self.env.clone())
            // logs only when asked for (the trace-level secrets check)
            .env(
                "PORCH_LOG",
                std::env::var("PORCH_LOG").unwrap_or_else(|_| "off".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("porch-handler starts");
        *slot.child.lock().expect("lock") = Some(child);
    }

    /// `SIGKILL`, the caller told as Lambda tells it, a fresh process.
    fn kill(&self, slot: &Slot) {
        if let Some(mut child) = slot.child.lock().expect("lock").take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        slot.api.fail_in_flight();
        self.kills.fetch_add(1, Ordering::SeqCst);
        self.spawn(slot);
    }

    fn busy(&self) -> Vec<&Slot> {
        self.slots
            .iter()
            .filter(|s| s.api.in_flight() > 0)
            .collect()
    }
}

impl Drop for Functions {
    fn drop(&mut self) {
        for slot in &self.slots {
            if let Some(mut child) = slot.child.lock().expect("lock").take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Delivers some Invocations twice, and before some, an older Invocation
/// of the same object (its answer lost, as a late redelivery's would be).
struct Chaos<I> {
    inner: I,
    rng: Mutex<u64>,
    last: Mutex<HashMap<String, Invocation>>,
    duplicates: AtomicU64,
    stale: AtomicU64,
    quiet: AtomicBool,
}

impl<I> Chaos<I> {
    fn roll(&self, percent: u64) -> bool {
        if self.quiet.load(Ordering::SeqCst) {
            return false;
        }
        let mut state = self.rng.lock().expect("lock");
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state % 100 < percent
    }
}

fn object_of(invocation: &Invocation) -> String {
    let name = invocation
        .package_revision
        .as_ref()
        .and_then(|p| p.metadata.name.clone())
        .unwrap_or_else(|| {
            invocation
                .repository
                .metadata
                .name
                .clone()
                .unwrap_or_default()
        });
    format!("{}/{name}", invocation.operation.as_str())
}

impl<I: Invoker> Invoker for Chaos<I> {
    async fn invoke(&self, invocation: &Invocation) -> Result<Outcome, InvokeError> {
        let key = object_of(invocation);
        if self.roll(10) {
            let older = self.last.lock().expect("lock").get(&key).cloned();
            if let Some(older) = older {
                self.stale.fetch_add(1, Ordering::SeqCst);
                let _ = self.inner.invoke(&older).await;
            }
        }
        let answer = self.inner.invoke(invocation).await;
        self.last
            .lock()
            .expect("lock")
            .insert(key, invocation.clone());
        if self.roll(10) {
            self.duplicates.fetch_add(1, Ordering::SeqCst);
            return self.inner.invoke(invocation).await;
        }
        answer
    }
}

fn typed(objects: &Objects, name: &str) -> Option<PackageRevision> {
    objects
        .get("default", name)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

/// Runs the relay until nothing has been due for a while (longer than the
/// longest backoff).
async fn settle<C, I>(relay: &Relay<C, I>)
where
    C: porch_relay::cluster::Cluster + 'static,
    I: Invoker + 'static,
{
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut idle_since = Instant::now();
    loop {
        if relay.drain().await > 0 {
            idle_since = Instant::now();
        } else if idle_since.elapsed() > Duration::from_millis(2500) {
            return;
        }
        assert!(Instant::now() < deadline, "the relay did not settle");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn edit(
    cluster: &Mutex<Objects>,
    name: &str,
    change: impl FnOnce(&mut serde_json::Value),
) -> PackageRevision {
    let mut objects = cluster.lock().expect("lock");
    objects.update("default", name, change).expect("updated");
    typed(&objects, name).expect("stored")
}

fn refs_of(bare: &Path) -> BTreeMap<String, String> {
    git(bare, &["for-each-ref", "--format=%(refname) %(objectname)"])
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| name.starts_with("refs/heads/") || name.starts_with("refs/tags/"))
        .map(|(n, id)| (n.to_owned(), id.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_converges_through_store_git_and_process_faults() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let started = Instant::now();
    let seed: u64 = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f00d);
    let packages = usize::try_from(knob("FAULTS_PACKAGES", 3)).expect("packages");
    let percent = knob("FAULTS_PERCENT", 8);
    let kill_ms = knob("FAULTS_KILL_MS", 1500);
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();

    // git: a bare repository behind `git http-backend`, a proxy in front
    let repos = root.join("repos");
    std::fs::create_dir_all(&repos).expect("mkdir");
    git(&repos, &["init", "--bare", "-q", "-b", "main", "repo.git"]);
    let bare = repos.join("repo.git");
    git(&bare, &["config", "http.receivepack", "true"]);
    let (_git_server, git_port) =
        python_server("git_http_server.py", &[repos.to_str().expect("utf8")], root);
    let (git_proxy, git_address) = FaultProxy::start(
        &format!("http://127.0.0.1:{git_port}"),
        git_rule,
        percent,
        seed,
    )
    .await;

    // S3: a strictly serialised S3 server, a bucket, a proxy in front
    let s3_dir = root.join("s3");
    std::fs::create_dir_all(&s3_dir).expect("mkdir");
    let (_s3_server, s3_port) = python_server("moto_serial.py", &["127.0.0.1"], &s3_dir);
    let s3 = aws_sdk_s3::Client::from_conf(porch_git::s3::S3Store::config(
        aws_sdk_s3::config::Builder::new()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .credentials_provider(aws_sdk_s3::config::Credentials::new(
                AWS_KEY.0, AWS_KEY.1, None, None, "tests",
            )),
        &porch_git::s3::S3Options {
            endpoint: Some(format!("http://127.0.0.1:{s3_port}")),
            region: Some("us-east-1".into()),
            force_path_style: true,
            ..Default::default()
        },
    ));
    s3.create_bucket()
        .bucket(BUCKET)
        .send()
        .await
        .expect("bucket");
    let (s3_proxy, s3_address) = FaultProxy::start(
        &format!("http://127.0.0.1:{s3_port}"),
        s3_rule,
        percent,
        seed.rotate_left(17),
    )
    .await;

    // the handler processes, behind the Invoke API
    let mut slots = Vec::new();
    let mut apis = HashMap::new();
    for operation in crate::relay_http::OPERATIONS {
        let (api, address) = RuntimeApi::start().await;
        apis.insert(format!("porch-{operation}"), api.clone());
        slots.push(Slot {
            operation,
            api,
            address,
            child: Mutex::new(None),
            starts: AtomicU64::new(0),
        });
    }
    let functions = Arc::new(Functions {
        root: root.to_owned(),
        env: [
            ("PORCH_S3_BUCKET", BUCKET.to_owned()),
            ("PORCH_S3_ENDPOINT", format!("http://{s3_address}")),
            ("AWS_ACCESS_KEY_ID", AWS_KEY.0.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", AWS_KEY.1.to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        slots,
        kills: AtomicU64::new(0),
    });
    for slot in &functions.slots {
        functions.spawn(slot);
    }
    let endpoint = format!("http://{}", invoke_api(apis).await);
    let invoker = Chaos {
        inner: LambdaHttp::new(&endpoint, "porch-", Duration::from_secs(30)).expect("invoker"),
        rng: Mutex::new(seed.rotate_left(31) | 1),
        last: Mutex::new(HashMap::new()),
        duplicates: AtomicU64::new(0),
        stale: AtomicU64::new(0),
        quiet: AtomicBool::new(false),
    };
    let invoker = Arc::new(invoker);

    // kills: a busy handler every few hundred milliseconds, and the one
    // writing a manifest the S3 proxy holds (after its push)
    let stop = Arc::new(AtomicBool::new(false));
    let held_kills = Arc::new(AtomicU64::new(0));
    let killer = tokio::spawn({
        let (functions, stop, held, proxy) = (
            Arc::clone(&functions),
            Arc::clone(&stop),
            Arc::clone(&held_kills),
            s3_proxy.clone(),
        );
        async move {
            let mut state = seed | 1;
            while !stop.load(Ordering::SeqCst) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let pause = Duration::from_millis(kill_ms / 2 + state % kill_ms.max(1));
                let during_write = tokio::select! {
                    () = tokio::time::sleep(pause) => false,
                    () = proxy.held() => true,
                };
                let busy = functions.busy();
                if let Some(slot) =
                    busy.get(usize::try_from(state).unwrap_or(0) % busy.len().max(1))
                {
                    functions.kill(slot);
                    if during_write {
                        held.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }
    });

    let cluster = Arc::new(Mutex::new(Objects::default()));
    let relay = Relay::new(
        Arc::clone(&cluster),
        Arc::clone(&invoker),
        RelayConfig {
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
            sync_interval: Duration::from_secs(3600),
            ..RelayConfig::default()
        },
    );
    let repository: porch_api::repository::Repository = serde_json::from_value(json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository",
        "metadata": {"name": "blueprints", "namespace": "default", "uid": "repo-uid", "generation": 1},
        "spec": {"type": "git", "git": {"repo": format!("http://{git_address}/repo.git"), "branch": "main"}}
    }))
    .expect("a Repository");
    relay.observe_repository(repository.clone());
    settle(&relay).await;

    let name = |p: usize, workspace: &str| format!("blueprints.pkg{p}.{workspace}");
    let lifecycle = |names: &[String], lifecycle: &str| {
        for n in names {
            let pr = edit(&cluster, n, |o| {
                o["spec"]["lifecycle"] = json!(lifecycle);
                if lifecycle == "Published" {
                    o["metadata"]["annotations"] =
                        json!({(porch_api::APPROVED_BY_ANNOTATION): "alice@example.com"});
                }
            });
            relay.observe_revision(pr);
        }
    };
    // v1: init, propose, publish
    let v1: Vec<String> = (0..packages).map(|p| name(p, "v1")).collect();
    for (p, n) in v1.iter().enumerate() {
        let mut objects = cluster.lock().expect("lock");
        objects
            .create(json!({
                "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
                "metadata": {"name": n, "namespace": "default"},
                "spec": {"packageName": format!("pkg{p}"), "repository": "blueprints", "workspaceName": "v1",
                         "lifecycle": "Draft", "source": {"init": {"description": "under faults"}}}
            }))
            .expect("created");
        let pr = typed(&objects, n).expect("stored");
        drop(objects);
        relay.observe_revision(pr);
    }
    settle(&relay).await;
    lifecycle(&v1, "Proposed");
    settle(&relay).await;
    lifecycle(&v1, "Published");
    settle(&relay).await;
    // v2: a copy of v1, proposed and published
    let v2: Vec<String> = (0..packages).map(|p| name(p, "v2")).collect();
    for (p, n) in v2.iter().enumerate() {
        let mut objects = cluster.lock().expect("lock");
        objects
            .create(json!({
                "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
                "metadata": {"name": n, "namespace": "default"},
                "spec": {"packageName": format!("pkg{p}"), "repository": "blueprints", "workspaceName": "v2",
                         "lifecycle": "Draft", "source": {"copyFrom": {"name": name(p, "v1")}}}
            }))
            .expect("created");
        let pr = typed(&objects, n).expect("stored");
        drop(objects);
        relay.observe_revision(pr);
    }
    settle(&relay).await;
    lifecycle(&v2, "Proposed");
    settle(&relay).await;
    lifecycle(&v2, "Published");
    settle(&relay).await;
    // pkg0's v1: proposed for deletion, then deleted
    lifecycle(&v1[..1], "DeletionProposed");
    settle(&relay).await;
    cluster
        .lock()
        .expect("lock")
        .delete("default", &v1[0])
        .expect("deleted");
    if let Some(pr) = typed(&cluster.lock().expect("lock"), &v1[0]) {
        relay.observe_revision(pr);
    }
    settle(&relay).await;

    // the faults stop; everything is looked at again until nothing is due
    stop.store(true, Ordering::SeqCst);
    killer.await.expect("killer");
    git_proxy.quiet();
    s3_proxy.quiet();
    invoker.quiet.store(true, Ordering::SeqCst);
    let all: Vec<PackageRevision> = cluster.lock().expect("lock").typed("default");
    for pr in all {
        relay.observe_revision(pr);
    }
    relay.request_sync("default", "blueprints");
    settle(&relay).await;

    // the objects: where their specs say, revisions consecutive and unique
    let finals: Vec<PackageRevision> = cluster.lock().expect("lock").typed("default");
    let find = |n: &str| {
        finals
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(n))
            .cloned()
    };
    let mut violations = Vec::new();
    for p in 0..packages {
        for (workspace, revision) in [("v1", 1), ("v2", 2)] {
            let n = name(p, workspace);
            let pr = find(&n);
            if p == 0 && workspace == "v1" {
                if pr.is_some() {
                    violations.push(format!("{n} was deleted but is still there"));
                }
                continue;
            }
            let Some(pr) = pr else {
                violations.push(format!("{n} is gone"));
                continue;
            };
            let status = pr.status.clone().unwrap_or_default();
            if pr.spec.lifecycle != Some(porch_api::common::Lifecycle::Published)
                || status.revision != Some(revision)
            {
                violations.push(format!(
                    "{n}: {:?} revision {:?}",
                    pr.spec.lifecycle, status.revision
                ));
            }
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
            if ready.is_none_or(|c| c.status != "True") {
                violations.push(format!("{n}: not Ready: {ready:?}"));
            }
        }
    }
    // and nothing else but each package's placeholder on the branch
    let mut expected: Vec<String> = (0..packages)
        .flat_map(|p| [name(p, "main"), name(p, "v1"), name(p, "v2")])
        .filter(|n| *n != name(0, "v1"))
        .collect();
    expected.sort();
    let mut stored: Vec<String> = finals
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    stored.sort();
    if stored != expected {
        violations.push(format!("objects {stored:?}, expected {expected:?}"));
    }

    // git: one tag per approval, nothing left of drafts and proposals
    let refs = refs_of(&bare);
    for p in 0..packages {
        let tags: Vec<&String> = refs
            .keys()
            .filter(|r| r.starts_with(&format!("refs/tags/pkg{p}/")))
            .collect();
        let expected: Vec<String> = if p == 0 {
            vec![format!("refs/tags/pkg{p}/v2")]
        } else {
            vec![
                format!("refs/tags/pkg{p}/v1"),
                format!("refs/tags/pkg{p}/v2"),
            ]
        };
        if tags
            .iter()
            .map(|t| t.as_str())
            .ne(expected.iter().map(String::as_str))
        {
            violations.push(format!("pkg{p} tags: {tags:?}, expected {expected:?}"));
        }
    }
    for r in refs.keys() {
        if r.starts_with("refs/heads/drafts/") || r.starts_with("refs/heads/proposed/") {
            violations.push(format!("{r} outlived its revision"));
        }
    }
    let fsck = Command::new("git")
        .args(["fsck", "--strict", "--no-dangling"])
        .current_dir(&bare)
        .output()
        .expect("git fsck");
    if !fsck.status.success() {
        violations.push(format!(
            "git fsck: {}",
            String::from_utf8_lossy(&fsck.stderr)
        ));
    }

    // the snapshot reloads to the remote's refs
    let key = format!(
        "repos/{}",
        porch_engine::repository::repository_key(&repository)
    );
    let mirror = root.join("reload");
    std::fs::create_dir_all(&mirror).expect("mkdir");
    porch_git::repo::GitRepo::init_bare(&mirror).expect("init");
    let store = porch_git::s3::S3Store::with_client(s3.clone(), BUCKET, "").expect("store");
    let snapshots = porch_git::snapshot::Snapshots::new(store, &key, &mirror).expect("snapshots");
    match snapshots.load().await.expect("load") {
        porch_git::snapshot::LoadOutcome::Loaded(_) => {
            let reloaded: BTreeMap<String, String> = porch_git::repo::GitRepo::open(&mirror)
                .expect("open")
                .refs()
                .expect("refs")
                .into_iter()
                .filter(|(n, _)| n.starts_with("refs/heads/") || n.starts_with("refs/tags/"))
                .map(|(n, id)| (n, id.to_string()))
                .collect();
            if reloaded != refs {
                violations.push(format!("snapshot refs {reloaded:?} != remote {refs:?}"));
            }
        }
        porch_git::snapshot::LoadOutcome::Missing => violations.push("no snapshot".into()),
    }

    let stats = &relay.stats;
    let injected: BTreeMap<Fault, u64> = git_proxy
        .injected()
        .into_iter()
        .chain(s3_proxy.injected())
        .fold(BTreeMap::new(), |mut all, (f, n)| {
            *all.entry(f).or_default() += n;
            all
        });
    eprintln!(
        "faults (seed {seed}): git {:?} of {} requests; s3 {:?} of {} requests; kills {} ({} during a manifest write); duplicate deliveries {}; stale deliveries {}; invocations {}, retried {}, refused {}, conflicts {}; violations {}; {:.1} s",
        git_proxy.injected(),
        git_proxy.requests(),
        s3_proxy.injected(),
        s3_proxy.requests(),
        functions.kills.load(Ordering::SeqCst),
        held_kills.load(Ordering::SeqCst),
        invoker.duplicates.load(Ordering::SeqCst),
        invoker.stale.load(Ordering::SeqCst),
        stats.invocations.load(Ordering::SeqCst),
        stats.retried.load(Ordering::SeqCst),
        stats.invalid.load(Ordering::SeqCst),
        stats.conflicts.load(Ordering::SeqCst),
        violations.len(),
        started.elapsed().as_secs_f64(),
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(
        injected.values().sum::<u64>() > 20,
        "too few faults to prove anything: {injected:?}"
    );
    assert!(
        functions.kills.load(Ordering::SeqCst) > 0,
        "no handler was killed"
    );
}
