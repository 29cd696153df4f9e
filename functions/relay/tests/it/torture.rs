//! Concurrency torture: many writers acting as API clients (creating
//! drafts, pushing content, rendering, proposing, rejecting, approving,
//! copying, upgrading, proposing deletion, restoring, deleting) on a few
//! packages in two repositories served over smart HTTP, snapshots in an
//! S3-compatible server, the running relay and the in-process handlers
//! doing the git work. Afterwards the git repositories, the snapshots and
//! the objects are checked against what the writers did.
//!
//! `torture_smoke` is short and runs by default; `torture_full` is sized by
//! `TORTURE_WRITERS`, `TORTURE_OPS`, `TORTURE_PACKAGES` and `TORTURE_SEED`
//! and runs with `--ignored`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use porch_api::common::Lifecycle;
use porch_api::invocation::EventType;
use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_engine::runner::Runner;
use porch_git::s3::S3Store;
use porch_git::snapshot::{LoadOutcome, Snapshots};
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::runtime::{FunctionRuntime, Runtimes};
use porch_relay::invoker::InProcess;
use porch_relay::memory::Objects;
use porch_relay::relay::{Relay, RelayConfig};
use serde_json::json;

use crate::support::{GitServer, git, typed};

const NAMESPACE: &str = "default";
const REPOSITORIES: [&str; 2] = ["blueprints", "deploy"];
/// How long a client waits for the relay to settle its write.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The size of a run.
#[derive(Debug, Clone, Copy)]
struct Size {
    writers: usize,
    ops: usize,
    packages: usize,
    seed: u64,
}

impl Size {
    /// `TORTURE_SEED` or a seed from the clock.
    fn seed() -> u64 {
        std::env::var("TORTURE_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            })
    }

    fn fixed(writers: usize, ops: usize, packages: usize) -> Self {
        Size {
            writers,
            ops,
            packages,
            seed: Self::seed(),
        }
    }

    fn from_env(writers: usize, ops: usize, packages: usize) -> Self {
        let read = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let seed = Self::seed();
        Size {
            writers: read("TORTURE_WRITERS", writers).max(1),
            ops: read("TORTURE_OPS", ops),
            packages: read("TORTURE_PACKAGES", packages).max(2),
            seed,
        }
    }
}

/// splitmix64: small, seeded, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A package of the run: upstream packages live in `blueprints` and start
/// with an init draft; downstream ones live in `deploy` and start as a clone
/// of an upstream package.
#[derive(Debug, Clone)]
struct Package {
    name: String,
    repository: &'static str,
    upstream: Option<String>,
}

fn packages(count: usize) -> Vec<Package> {
    let upstreams = count.div_ceil(2);
    (0..count)
        .map(|i| {
            if i < upstreams {
                Package {
                    name: format!("u{i}"),
                    repository: REPOSITORIES[0],
                    upstream: None,
                }
            } else {
                Package {
                    name: format!("d{}", i - upstreams),
                    repository: REPOSITORIES[1],
                    upstream: Some(format!("u{}", (i - upstreams) % upstreams)),
                }
            }
        })
        .collect()
}

/// What a writer decided to do.
#[derive(Debug, Clone)]
enum Choice {
    Create {
        package: Package,
        clone_of: Option<String>,
    },
    Copy {
        package: Package,
        from: String,
    },
    Upgrade {
        package: Package,
        current: String,
        old: String,
        new: String,
    },
    Push {
        name: String,
    },
    Render {
        name: String,
        seen: String,
    },
    Lifecycle {
        kind: &'static str,
        name: String,
        seen: String,
        to: Lifecycle,
    },
    Delete {
        name: String,
        seen: String,
    },
}

impl Choice {
    fn kind(&self) -> &'static str {
        match self {
            Choice::Create { .. } => "create",
            Choice::Copy { .. } => "copy",
            Choice::Upgrade { .. } => "upgrade",
            Choice::Push { .. } => "push",
            Choice::Render { .. } => "render",
            Choice::Lifecycle { kind, .. } => kind,
            Choice::Delete { .. } => "delete",
        }
    }
}

/// How an operation ended for its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ended {
    /// Written and settled as asked.
    Done,
    /// Stale resourceVersion or a name taken: the client re-reads and
    /// chooses again.
    Conflict,
    /// Written, and refused by the API path or a handler (a draft moved
    /// meanwhile, git refused the transition).
    Refused,
    /// Written, and not settled within [`SETTLE_TIMEOUT`].
    Unsettled,
    /// A retryable failure the client saw (a content write's git error).
    Failed,
}

/// A successful content push.
#[derive(Debug, Clone)]
struct Push {
    name: String,
    marker: String,
    start: Instant,
    end: Instant,
}

/// A publication the lifecycle handler reported (its `Published` event).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Approval {
    package: String,
    name: String,
    revision: i64,
}

#[derive(Debug, Default)]
struct Log {
    pushes: Vec<Push>,
    /// The revisions a client's approval settled.
    approved: Vec<String>,
    /// Time from the client's write until the relay settled the object,
    /// per operation kind (operations that wrote).
    latencies: BTreeMap<&'static str, Vec<Duration>>,
    ended: BTreeMap<(&'static str, Ended), u64>,
    /// Why operations were refused or failed: `<kind>: <message>`, digits
    /// left out so alike messages count together.
    reasons: BTreeMap<String, u64>,
}

impl Log {
    fn reason(&mut self, kind: &str, message: &str) {
        let message: String = message
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .take(160)
            .collect();
        *self
            .reasons
            .entry(format!("{kind}: {message}"))
            .or_default() += 1;
    }
}

type TortureRelay = Relay<Mutex<Objects>, InProcess<S3Store>>;

struct Torture {
    root: PathBuf,
    cluster: Arc<Mutex<Objects>>,
    relay: Arc<TortureRelay>,
    repositories: BTreeMap<String, Repository>,
    packages: Vec<Package>,
    store: S3Store,
    functions: Arc<dyn FunctionRuntime>,
    log: Mutex<Log>,
    workspaces: AtomicU64,
    ops_left: AtomicUsize,
}

/// moto's S3 server, one request at a time, and a store on a new bucket.
async fn s3(root: &Path) -> (crate::support::Child, S3Store) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/git/tests/servers/moto_serial.py");
    let child = std::process::Command::new("python3")
        .arg(script)
        .arg("127.0.0.1")
        .arg(port.to_string())
        .current_dir(root)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 runs moto (pip install 'moto[server]')");
    let child = crate::support::Child(child);
    for _ in 0..400 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let options = porch_git::s3::S3Options {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        region: Some("us-east-1".into()),
        force_path_style: true,
        max_attempts: 5,
        operation_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let builder = aws_sdk_s3::config::Builder::new()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "testing", "testing", None, None, "tests",
        ));
    let client = aws_sdk_s3::Client::from_conf(S3Store::config(builder, &options));
    client
        .create_bucket()
        .bucket("snapshots")
        .send()
        .await
        .expect("create bucket");
    let store = S3Store::with_client(client, "snapshots", "porch").expect("store");
    (child, store)
}

fn lifecycle_of(pr: &PackageRevision) -> Lifecycle {
    pr.spec.lifecycle.unwrap_or(Lifecycle::Draft)
}

fn revision_of(pr: &PackageRevision) -> i64 {
    pr.status.as_ref().and_then(|s| s.revision).unwrap_or(0)
}

fn name_of(pr: &PackageRevision) -> String {
    pr.metadata.name.clone().unwrap_or_default()
}

fn version_of(pr: &PackageRevision) -> String {
    pr.metadata.resource_version.clone().unwrap_or_default()
}

fn self_commit(pr: &PackageRevision) -> Option<String> {
    pr.status
        .as_ref()?
        .self_lock
        .as_ref()?
        .git
        .as_ref()
        .map(|g| g.commit.clone())
}

fn upstream_commit(pr: &PackageRevision) -> Option<String> {
    pr.status
        .as_ref()?
        .upstream_lock
        .as_ref()?
        .git
        .as_ref()
        .map(|g| g.commit.clone())
}

fn ready_failed(pr: &PackageRevision) -> bool {
    pr.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "Failed")
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

impl Torture {
    async fn new(root: &Path, store: S3Store, git_base: &str, size: Size) -> Self {
        let functions: Arc<dyn FunctionRuntime> =
            Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog())));
        let runner = Arc::new(
            Runner::new(root.join("relay-cache"), Arc::clone(&functions)).with_store(store.clone()),
        );
        let cluster = Arc::new(Mutex::new(Objects::default()));
        let relay = Arc::new(Relay::new(
            Arc::clone(&cluster),
            Arc::new(InProcess::new(runner)),
            RelayConfig {
                backoff_base: Duration::from_millis(50),
                backoff_max: Duration::from_secs(2),
                // syncs interleave with the writers' work
                sync_interval: Duration::from_secs(3),
                ..RelayConfig::default()
            },
        ));
        let mut repositories = BTreeMap::new();
        for (i, name) in REPOSITORIES.iter().enumerate() {
            let repository: Repository = serde_json::from_value(json!({
                "apiVersion": "config.porch.kpt.dev/v1alpha1",
                "kind": "Repository",
                "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("repo-uid-{i}")},
                "spec": {"type": "git", "git": {"repo": format!("{git_base}/{name}.git"), "branch": "main"}}
            }))
            .expect("a repository");
            relay.observe_repository(repository.clone());
            repositories.insert((*name).to_owned(), repository);
        }
        Torture {
            root: root.to_path_buf(),
            cluster,
            relay,
            repositories,
            packages: packages(size.packages),
            store,
            functions,
            log: Mutex::new(Log::default()),
            workspaces: AtomicU64::new(0),
            ops_left: AtomicUsize::new(size.ops),
        }
    }

    fn all(&self) -> Vec<PackageRevision> {
        self.cluster.lock().expect("lock").typed(NAMESPACE)
    }

    fn object(&self, name: &str) -> Option<PackageRevision> {
        self.cluster
            .lock()
            .expect("lock")
            .get(NAMESPACE, name)
            .map(typed)
    }

    fn repository(&self, name: &str) -> &Repository {
        &self.repositories[name]
    }

    /// What a client could do now to one package, given what it sees.
    fn choices(&self, package: &Package, all: &[PackageRevision]) -> Vec<Choice> {
        let mine: Vec<&PackageRevision> = all
            .iter()
            .filter(|p| {
                p.spec.package_name == package.name && p.spec.repository == package.repository
            })
            .collect();
        let live: Vec<&PackageRevision> = mine
            .iter()
            .copied()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let published =
            |p: &&PackageRevision| lifecycle_of(p) == Lifecycle::Published && revision_of(p) > 0;
        let published_upstreams = |upstream: &str| -> Vec<PackageRevision> {
            all.iter()
                .filter(|p| {
                    p.spec.package_name == upstream
                        && p.spec.repository == REPOSITORIES[0]
                        && p.metadata.deletion_timestamp.is_none()
                        && published(p)
                })
                .cloned()
                .collect()
        };
        // a published revision some downstream revision locks onto is not
        // deleted: its deletion would wait for the downstream
        let locked: BTreeSet<String> = all.iter().filter_map(upstream_commit).collect();
        let referenced: BTreeSet<String> = all
            .iter()
            .filter_map(|p| p.spec.source.as_ref())
            .flat_map(|s| {
                let clone = s
                    .clone_from
                    .as_ref()
                    .and_then(|c| c.upstream_ref.as_ref())
                    .map(|r| r.name.clone());
                let upgrade = s
                    .upgrade
                    .as_ref()
                    .map(|u| [u.old_upstream.name.clone(), u.new_upstream.name.clone()]);
                clone.into_iter().chain(upgrade.into_iter().flatten())
            })
            .collect();
        let free = |pr: &PackageRevision| {
            self_commit(pr).is_none_or(|c| !locked.contains(&c))
                && !referenced.contains(&name_of(pr))
        };
        let mut choices = Vec::new();
        if mine.is_empty() {
            match &package.upstream {
                None => choices.push(Choice::Create {
                    package: package.clone(),
                    clone_of: None,
                }),
                Some(upstream) => {
                    if let Some(latest) = published_upstreams(upstream)
                        .iter()
                        .max_by_key(|p| revision_of(p))
                    {
                        choices.push(Choice::Create {
                            package: package.clone(),
                            clone_of: Some(name_of(latest)),
                        });
                    }
                }
            }
            return choices;
        }
        let in_flight = live
            .iter()
            .filter(|p| matches!(lifecycle_of(p), Lifecycle::Draft | Lifecycle::Proposed))
            .count();
        let settled_published: Vec<&PackageRevision> =
            live.iter().copied().filter(|p| published(p)).collect();
        if in_flight < 2 {
            if !settled_published.is_empty() {
                let from = settled_published[settled_published.len() / 2];
                choices.push(Choice::Copy {
                    package: package.clone(),
                    from: name_of(from),
                });
            }
            if let (Some(upstream), Some(current)) = (
                &package.upstream,
                settled_published.iter().max_by_key(|p| revision_of(p)),
            ) {
                let upstreams = published_upstreams(upstream);
                let old = upstreams.iter().find(|u| {
                    self_commit(u).is_some() && self_commit(u) == upstream_commit(current)
                });
                let new = upstreams.iter().max_by_key(|p| revision_of(p));
                if let (Some(old), Some(new)) = (old, new)
                    && revision_of(new) > revision_of(old)
                {
                    choices.push(Choice::Upgrade {
                        package: package.clone(),
                        current: name_of(current),
                        old: name_of(old),
                        new: name_of(new),
                    });
                }
            }
        }
        for pr in &live {
            let (name, seen) = (name_of(pr), version_of(pr));
            let lifecycle = |kind, to| Choice::Lifecycle {
                kind,
                name: name.clone(),
                seen: seen.clone(),
                to,
            };
            let sourced = pr
                .status
                .as_ref()
                .is_some_and(|s| !s.creation_source.is_empty());
            match lifecycle_of(pr) {
                Lifecycle::Draft if sourced => {
                    choices.push(Choice::Push { name: name.clone() });
                    choices.push(Choice::Push { name: name.clone() });
                    choices.push(Choice::Render {
                        name: name.clone(),
                        seen: seen.clone(),
                    });
                    choices.push(lifecycle("propose", Lifecycle::Proposed));
                    choices.push(lifecycle("propose", Lifecycle::Proposed));
                    choices.push(Choice::Delete {
                        name: name.clone(),
                        seen: seen.clone(),
                    });
                }
                Lifecycle::Draft => {}
                Lifecycle::Proposed => {
                    choices.push(lifecycle("reject", Lifecycle::Draft));
                    choices.push(lifecycle("approve", Lifecycle::Published));
                    choices.push(lifecycle("approve", Lifecycle::Published));
                }
                Lifecycle::Published if revision_of(pr) > 0 => {
                    if free(pr) && settled_published.len() > 1 {
                        choices.push(lifecycle("propose-delete", Lifecycle::DeletionProposed));
                    }
                }
                Lifecycle::Published => {}
                Lifecycle::DeletionProposed => {
                    choices.push(lifecycle("restore", Lifecycle::Published));
                    if free(pr) {
                        choices.push(Choice::Delete { name, seen });
                    }
                }
            }
        }
        choices
    }

    /// Waits until the planner has nothing due for `name` (or it is gone,
    /// the object then, if any. A warning that the relay refused the
    /// Invocation or a handler blocked it ends the wait with its text;
    /// `Err(None)` is a timeout.
    async fn settle(
        &self,
        name: &str,
        events_before: usize,
    ) -> Result<Option<PackageRevision>, Option<String>> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            {
                let objects = self.cluster.lock().expect("lock");
                let Some(object) = objects.get(NAMESPACE, name) else {
                    return Ok(None);
                };
                let pr = typed(object);
                let repository = self.repository(&pr.spec.repository);
                if porch_api::planner::plan(&pr, repository).is_empty() {
                    return Ok(Some(pr));
                }
                let refused = objects.events.iter().skip(events_before).find(|e| {
                    e.type_ == EventType::Warning
                        && matches!(e.reason.as_str(), "InvocationRefused" | "DeletionBlocked")
                        && e.regarding.name == name
                });
                if let Some(event) = refused {
                    return Err(Some(format!("{}: {}", event.reason, event.message)));
                }
            }
            if Instant::now() > deadline {
                return Err(None);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn events(&self) -> usize {
        self.cluster.lock().expect("lock").events.len()
    }

    /// Tells the relay about a change, as its watch would.
    fn observe(&self, name: &str) {
        if let Some(pr) = self.object(name) {
            self.relay.observe_revision(pr);
        }
    }

    /// Changes `name` if it is still at `seen` (a guarded update, as
    /// kubectl's and porchctl's are).
    fn update(&self, name: &str, seen: &str, edit: impl FnOnce(&mut serde_json::Value)) -> bool {
        let mut objects = self.cluster.lock().expect("lock");
        let current = objects
            .get(NAMESPACE, name)
            .and_then(|o| o["metadata"]["resourceVersion"].as_str())
            .map(str::to_owned);
        if current.as_deref() != Some(seen) {
            return false;
        }
        objects.update(NAMESPACE, name, edit).is_ok()
    }

    fn new_workspace(&self) -> String {
        format!("w{}", self.workspaces.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Creates a draft with `source`; `None` when the name is taken.
    fn create(&self, package: &Package, source: serde_json::Value) -> Option<String> {
        let workspace = self.new_workspace();
        let name = format!("{}.{}.{workspace}", package.repository, package.name);
        self.cluster
            .lock()
            .expect("lock")
            .create(json!({
                "apiVersion": "porch.kpt.dev/v1alpha2",
                "kind": "PackageRevision",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"packageName": package.name, "repository": package.repository,
                         "workspaceName": workspace, "lifecycle": "Draft", "source": source}
            }))
            .ok()
    }

    /// Writes, tells the relay, waits for it: the end and the latency.
    async fn written(
        &self,
        kind: &'static str,
        name: &str,
        events_before: usize,
        start: Instant,
    ) -> (Ended, Option<PackageRevision>) {
        self.observe(name);
        let settled = self.settle(name, events_before).await;
        let elapsed = start.elapsed();
        self.log
            .lock()
            .expect("lock")
            .latencies
            .entry(kind)
            .or_default()
            .push(elapsed);
        match settled {
            Err(None) => (Ended::Unsettled, None),
            Err(Some(warning)) => {
                self.log.lock().expect("lock").reason(kind, &warning);
                (Ended::Refused, None)
            }
            Ok(None) => (Ended::Done, None),
            Ok(Some(pr)) if ready_failed(&pr) => {
                let message = pr
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                self.log.lock().expect("lock").reason(kind, &message);
                (Ended::Refused, Some(pr))
            }
            Ok(Some(pr)) => (Ended::Done, Some(pr)),
        }
    }

    async fn perform(
        &self,
        writer: usize,
        seq: u64,
        runner: &Runner<S3Store>,
        choice: &Choice,
    ) -> Ended {
        let events_before = self.events();
        let start = Instant::now();
        let kind = choice.kind();
        match choice {
            Choice::Create { package, clone_of } => {
                let source = match clone_of {
                    None => json!({"init": {"description": "torture"}}),
                    Some(upstream) => json!({"cloneFrom": {"upstreamRef": {"name": upstream}}}),
                };
                let Some(name) = self.create(package, source) else {
                    return Ended::Conflict;
                };
                self.written(kind, &name, events_before, start).await.0
            }
            Choice::Copy { package, from } => {
                let Some(name) = self.create(package, json!({"copyFrom": {"name": from}})) else {
                    return Ended::Conflict;
                };
                self.written(kind, &name, events_before, start).await.0
            }
            Choice::Upgrade {
                package,
                current,
                old,
                new,
            } => {
                let source = json!({"upgrade": {
                    "oldUpstream": {"name": old}, "newUpstream": {"name": new},
                    "currentPackage": {"name": current}, "strategy": "resource-merge"}});
                let Some(name) = self.create(package, source) else {
                    return Ended::Conflict;
                };
                self.written(kind, &name, events_before, start).await.0
            }
            Choice::Render { name, seen } => {
                let request = format!("r-{writer}-{seq}");
                if !self.update(name, seen, |o| {
                    o["metadata"]["annotations"][porch_api::RENDER_REQUEST_ANNOTATION] =
                        json!(request);
                }) {
                    return Ended::Conflict;
                }
                self.written(kind, name, events_before, start).await.0
            }
            Choice::Lifecycle { name, seen, to, .. } => {
                let stamp = match to {
                    Lifecycle::Proposed => Some(porch_api::PROPOSED_BY_ANNOTATION),
                    Lifecycle::Published => Some(porch_api::APPROVED_BY_ANNOTATION),
                    _ => None,
                };
                let user = format!("writer-{writer}@example.com");
                if !self.update(name, seen, |o| {
                    o["spec"]["lifecycle"] = json!(to.as_str());
                    if let Some(key) = stamp {
                        o["metadata"]["annotations"][key] = json!(user);
                    }
                }) {
                    return Ended::Conflict;
                }
                let (ended, _) = self.written(kind, name, events_before, start).await;
                if choice.kind() == "approve" && ended == Ended::Done {
                    self.log.lock().expect("lock").approved.push(name.clone());
                }
                ended
            }
            Choice::Delete { name, seen } => {
                let deleted = {
                    let mut objects = self.cluster.lock().expect("lock");
                    let current = objects
                        .get(NAMESPACE, name)
                        .and_then(|o| o["metadata"]["resourceVersion"].as_str())
                        .map(str::to_owned);
                    current.as_deref() == Some(seen.as_str())
                        && objects.delete(NAMESPACE, name).is_ok()
                };
                if !deleted {
                    return Ended::Conflict;
                }
                self.written(kind, name, events_before, start).await.0
            }
            Choice::Push { name } => self.push(writer, seq, runner, name).await,
        }
    }

    /// Pulls the draft, replaces its marker, pushes it through the content
    /// write path and asks for a render, as `porch rpkg push` does.
    async fn push(&self, writer: usize, seq: u64, runner: &Runner<S3Store>, name: &str) -> Ended {
        let Some(pr) = self.object(name) else {
            return Ended::Conflict;
        };
        if lifecycle_of(&pr) != Lifecycle::Draft || pr.metadata.deletion_timestamp.is_some() {
            return Ended::Conflict;
        }
        let repository = self.repository(&pr.spec.repository).clone();
        let start = Instant::now();
        let mut files = match runner.read_revision(&repository, &pr).await {
            Ok(files) => files,
            Err(e) => {
                self.log
                    .lock()
                    .expect("lock")
                    .reason("pull", &e.to_string());
                return if e.is_retryable() {
                    Ended::Failed
                } else {
                    Ended::Refused
                };
            }
        };
        let marker = format!("m-{writer}-{seq}");
        files.insert(
            "marker.yaml".into(),
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: marker\ndata:\n  marker: {marker}\n"
            )
            .into_bytes(),
        );
        let written = runner
            .write_draft(&repository, &pr, files, &format!("writer-{writer}"))
            .await;
        let end = Instant::now();
        if let Err(e) = written {
            self.log
                .lock()
                .expect("lock")
                .reason("push", &e.to_string());
            return if e.is_retryable() {
                Ended::Failed
            } else {
                Ended::Refused
            };
        }
        self.log.lock().expect("lock").pushes.push(Push {
            name: name.to_owned(),
            marker,
            start,
            end,
        });
        let events_before = self.events();
        let request = format!("p-{writer}-{seq}");
        let requested = self
            .cluster
            .lock()
            .expect("lock")
            .update(NAMESPACE, name, |o| {
                o["metadata"]["annotations"][porch_api::RENDER_REQUEST_ANNOTATION] = json!(request);
            })
            .is_ok();
        if !requested {
            return Ended::Done;
        }
        self.written("push", name, events_before, start).await.0
    }

    async fn writer(self: Arc<Self>, index: usize, seed: u64) {
        let mut rng = Rng(seed ^ (index as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let runner = Runner::new(
            self.root.join(format!("client-{index}")),
            Arc::clone(&self.functions),
        )
        .with_store(self.store.clone());
        let mut seq = 0u64;
        loop {
            // nothing to do for a while (every package waiting on another
            // writer's work): this writer stops
            let mut choice = None;
            for _ in 0..3000 {
                if self.ops_left.load(Ordering::SeqCst) == 0 {
                    return;
                }
                let package = self.packages[rng.below(self.packages.len())].clone();
                let choices = self.choices(&package, &self.all());
                if !choices.is_empty() {
                    choice = Some(choices[rng.below(choices.len())].clone());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let Some(choice) = choice else {
                return;
            };
            if self
                .ops_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_err()
            {
                return;
            }
            seq += 1;
            let ended = self.perform(index, seq, &runner, &choice).await;
            *self
                .log
                .lock()
                .expect("lock")
                .ended
                .entry((choice.kind(), ended))
                .or_default() += 1;
        }
    }

    /// Waits until no object has work due and none is being deleted.
    async fn quiesce(&self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let busy: Vec<String> = self
                .all()
                .iter()
                .filter(|pr| {
                    !porch_api::planner::plan(pr, self.repository(&pr.spec.repository)).is_empty()
                })
                .map(name_of)
                .collect();
            // a deletion blocked by a downstream waits for a user, not for
            // the relay: it is returned at once, not waited for
            let blocked = {
                let cluster = self.cluster.lock().expect("lock");
                busy.iter()
                    .filter(|n| {
                        cluster
                            .events
                            .iter()
                            .any(|e| e.reason == "DeletionBlocked" && e.regarding.name == **n)
                    })
                    .count()
            };
            if busy.len() == blocked || Instant::now() > deadline {
                return busy;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Refs of a bare repository: name → object id.
fn refs(dir: &Path) -> BTreeMap<String, String> {
    git(dir, &["for-each-ref", "--format=%(refname) %(objectname)"])
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(r, id)| (r.to_owned(), id.to_owned()))
        .collect()
}

/// The approval commits on `main`: (package, revision) → how many.
fn approval_commits(bare: &Path) -> BTreeMap<(String, i64), usize> {
    let mut found = BTreeMap::new();
    if !refs(bare).contains_key("refs/heads/main") {
        return found;
    }
    let log = git(bare, &["log", "--format=%B%x00", "main"]);
    for message in log.split('\0') {
        if !message
            .trim_start()
            .starts_with("Approving package revision")
        {
            continue;
        }
        for line in message.lines() {
            let Some(json) = line.strip_prefix("kpt:") else {
                continue;
            };
            let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
                continue;
            };
            let package = value["package"].as_str().unwrap_or("").to_owned();
            let revision: i64 = value["revision"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            *found.entry((package, revision)).or_insert(0) += 1;
        }
    }
    found
}

/// Checks git, the snapshots and the objects against the log; the
/// violations found.
async fn check(torture: &Torture, git_root: &Path) -> Vec<String> {
    let mut violations = Vec::new();
    let (pushed, approved) = {
        let log = torture.log.lock().expect("lock");
        (log.pushes.clone(), log.approved.clone())
    };
    let objects = torture.all();
    // the publications, from the lifecycle handler's events (a redelivered
    // Outcome may repeat one)
    let approvals: Vec<Approval> = {
        let cluster = torture.cluster.lock().expect("lock");
        let mut found = BTreeSet::new();
        for event in cluster.events.iter().filter(|e| e.reason == "Published") {
            let revision = event
                .message
                .rsplit(' ')
                .next()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            let package = event
                .regarding
                .name
                .split('.')
                .nth(1)
                .unwrap_or("")
                .to_owned();
            found.insert(Approval {
                package,
                name: event.regarding.name.clone(),
                revision,
            });
        }
        found.into_iter().collect()
    };
    let mut published_as: BTreeMap<&str, BTreeSet<i64>> = BTreeMap::new();
    for approval in &approvals {
        published_as
            .entry(approval.name.as_str())
            .or_default()
            .insert(approval.revision);
    }
    for (name, revisions) in &published_as {
        if revisions.len() != 1 {
            violations.push(format!("{name}: published as revisions {revisions:?}"));
        }
    }
    for name in &approved {
        if !published_as.contains_key(name.as_str()) {
            violations.push(format!("{name}: approved, settled, and never published"));
        }
    }
    // every approval: one revision number, consecutive per package, one
    // approval commit each, and its tag while its object lives
    let mut by_package: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for approval in &approvals {
        by_package
            .entry(approval.package.as_str())
            .or_default()
            .push(approval.revision);
    }
    for (package, revisions) in &mut by_package {
        revisions.sort_unstable();
        let expected: Vec<i64> = (1..=revisions.len() as i64).collect();
        if *revisions != expected {
            violations.push(format!(
                "{package}: revisions approved are {revisions:?}, not 1..={}",
                revisions.len()
            ));
        }
    }
    for package in &torture.packages {
        let bare = git_root.join(format!("{}.git", package.repository));
        let commits = approval_commits(&bare);
        let logged: BTreeSet<i64> = by_package
            .get(package.name.as_str())
            .map(|r| r.iter().copied().collect())
            .unwrap_or_default();
        for ((path, revision), count) in &commits {
            if path != &package.name {
                continue;
            }
            if *count != 1 {
                violations.push(format!(
                    "{path} revision {revision}: {count} approval commits"
                ));
            }
            if !logged.contains(revision) {
                violations.push(format!(
                    "{path} revision {revision}: an approval commit no approval made"
                ));
            }
        }
        for revision in &logged {
            if !commits.contains_key(&(package.name.clone(), *revision)) {
                violations.push(format!(
                    "{} revision {revision}: approved with no approval commit",
                    package.name
                ));
            }
        }
    }
    // every published object has its tag
    let refs_of: BTreeMap<&str, BTreeMap<String, String>> = REPOSITORIES
        .iter()
        .map(|r| (*r, refs(&git_root.join(format!("{r}.git")))))
        .collect();
    for pr in &objects {
        let revision = revision_of(pr);
        if revision > 0 {
            let tag = format!("refs/tags/{}/v{revision}", pr.spec.package_name);
            if !refs_of[pr.spec.repository.as_str()].contains_key(&tag) {
                violations.push(format!("{}: revision {revision} has no tag", name_of(pr)));
            }
        }
    }
    // revisions are unique among the objects
    let mut seen: BTreeMap<(String, i64), String> = BTreeMap::new();
    for pr in &objects {
        let revision = revision_of(pr);
        if revision > 0
            && let Some(other) = seen.insert((pr.spec.package_name.clone(), revision), name_of(pr))
        {
            violations.push(format!(
                "{} and {other} both have revision {revision}",
                name_of(pr)
            ));
        }
    }
    // the content pushed to an approved draft is in its published revision
    let mut pushes: BTreeMap<&str, Vec<&Push>> = BTreeMap::new();
    for push in &pushed {
        pushes.entry(push.name.as_str()).or_default().push(push);
    }
    for approval in &approvals {
        let Some(pushed) = pushes.get(approval.name.as_str()) else {
            continue;
        };
        let Some(pr) = objects.iter().find(|p| name_of(p) == approval.name) else {
            continue; // deleted since; its tag went with it
        };
        let bare = git_root.join(format!("{}.git", pr.spec.repository));
        let tag = format!("{}/v{}", approval.package, approval.revision);
        let file = format!("{tag}:{}/marker.yaml", approval.package);
        let shown = std::process::Command::new("git")
            .args(["show", &file])
            .current_dir(&bare)
            .output()
            .expect("git runs");
        let text = String::from_utf8_lossy(&shown.stdout);
        let marker = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("marker: "))
            .unwrap_or("")
            .to_owned();
        let Some(landed) = pushed.iter().find(|p| p.marker == marker) else {
            violations.push(format!(
                "{}: published {tag} holds marker {marker:?}, none of the {} pushed",
                approval.name,
                pushed.len()
            ));
            continue;
        };
        if let Some(later) = pushed.iter().find(|p| p.start > landed.end) {
            violations.push(format!(
                "{}: push {} (after {} finished) is missing from {tag}",
                approval.name, later.marker, landed.marker
            ));
        }
    }
    // no draft or proposed branch outlives its PackageRevision
    for (repository, refs) in &refs_of {
        for name in refs.keys() {
            let Some(branch) = name.strip_prefix("refs/heads/") else {
                continue;
            };
            let Some(rest) = branch
                .strip_prefix("drafts/")
                .or_else(|| branch.strip_prefix("proposed/"))
            else {
                continue;
            };
            let Some((package, workspace)) = rest.rsplit_once('/') else {
                continue;
            };
            let owned = objects.iter().any(|p| {
                p.spec.repository == *repository
                    && p.spec.package_name == package
                    && p.spec.workspace_name == workspace
            });
            if !owned {
                violations.push(format!(
                    "{repository}: branch {branch} has no PackageRevision"
                ));
            }
        }
    }
    // git fsck --strict
    for repository in REPOSITORIES {
        let bare = git_root.join(format!("{repository}.git"));
        let fsck = std::process::Command::new("git")
            .args(["fsck", "--strict", "--no-progress"])
            .current_dir(&bare)
            .output()
            .expect("git runs");
        if !fsck.status.success() {
            violations.push(format!(
                "{repository}: git fsck --strict: {}",
                String::from_utf8_lossy(&fsck.stderr)
            ));
        }
    }
    // the snapshots reload to the remote's refs
    for (repository, remote_refs) in &refs_of {
        let repo = torture.repository(repository);
        let key = format!("repos/{}", porch_engine::repository::repository_key(repo));
        let mirror = torture.root.join(format!("reload-{repository}"));
        let snapshots = Snapshots::new(torture.store.clone(), &key, &mirror).expect("snapshots");
        match snapshots.load().await {
            Ok(LoadOutcome::Loaded(_)) => {
                let loaded = refs(&mirror);
                if &loaded != remote_refs {
                    let differ: Vec<&String> = loaded
                        .keys()
                        .chain(remote_refs.keys())
                        .filter(|k| loaded.get(*k) != remote_refs.get(*k))
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    violations.push(format!(
                        "{repository}: the snapshot's refs differ from the remote's: {differ:?}"
                    ));
                }
            }
            Ok(LoadOutcome::Missing) => {
                violations.push(format!("{repository}: no snapshot"));
            }
            Err(e) => violations.push(format!("{repository}: snapshot does not load: {e}")),
        }
    }
    violations
}

async fn torture(size: Size) {
    eprintln!(
        "torture: seed {} ({} writers, {} ops, {} packages, {} repositories)",
        size.seed,
        size.writers,
        size.ops,
        size.packages,
        REPOSITORIES.len()
    );
    let dir = tempfile::tempdir().expect("tmp");
    let git_root = dir.path().join("git");
    std::fs::create_dir_all(&git_root).expect("dir");
    for repository in REPOSITORIES {
        git(
            &git_root,
            &[
                "init",
                "--bare",
                "-q",
                "-b",
                "main",
                &format!("{repository}.git"),
            ],
        );
    }
    let server = GitServer::start(&git_root);
    let (_s3, store) = s3(dir.path()).await;
    let torture = Arc::new(Torture::new(dir.path(), store, &server.base, size).await);

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Arc::clone(&torture.relay).run(async {
        let _ = stopped.await;
    }));
    let started = Instant::now();
    let writers: Vec<_> = (0..size.writers)
        .map(|i| tokio::spawn(Arc::clone(&torture).writer(i, size.seed)))
        .collect();
    for writer in writers {
        writer.await.expect("a writer finishes");
    }
    let elapsed = started.elapsed();
    // the relay runs until nothing is due, a sync of each repository
    // included
    let blocked = |name: &str| {
        torture
            .cluster
            .lock()
            .expect("lock")
            .events
            .iter()
            .any(|e| e.reason == "DeletionBlocked" && e.regarding.name == name)
    };
    let busy = torture.quiesce(Duration::from_secs(120)).await;
    let (blocked, busy): (Vec<String>, Vec<String>) = busy.into_iter().partition(|n| blocked(n));
    let mut violations: Vec<String> = busy
        .into_iter()
        .map(|n| {
            let pr = torture.object(&n);
            let state = pr.as_ref().map(|pr| {
                let due = porch_api::planner::plan(pr, torture.repository(&pr.spec.repository));
                let conditions = pr.status.as_ref().map(|s| {
                    s.conditions
                        .iter()
                        .map(|c| format!("{}={}/{} {:?}", c.type_, c.status, c.reason, c.message))
                        .collect::<Vec<_>>()
                });
                format!(
                    "{:?} due {due:?}, deleting {}, generation {:?}, observed {:?}, {conditions:?}",
                    lifecycle_of(pr),
                    pr.metadata.deletion_timestamp.is_some(),
                    pr.metadata.generation,
                    pr.status.as_ref().and_then(|s| s.observed_generation),
                )
            });
            format!("{n}: still has work due after the writers stopped: {state:?}")
        })
        .collect();
    for repository in REPOSITORIES {
        torture.relay.request_sync(NAMESPACE, repository);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    torture.quiesce(Duration::from_secs(60)).await;
    let _ = stop.send(());
    running.await.expect("the relay stops");
    let invocations = torture.relay.stats.invocations.load(Ordering::Relaxed);
    let relay_conflicts = torture.relay.stats.conflicts.load(Ordering::Relaxed);
    let relay_retried = torture.relay.stats.retried.load(Ordering::Relaxed);
    violations.extend(check(&torture, &git_root).await);
    drop(server);

    let log = torture.log.lock().expect("lock");
    let count = |wanted: Ended| -> u64 {
        log.ended
            .iter()
            .filter(|((_, e), _)| *e == wanted)
            .map(|(_, n)| n)
            .sum()
    };
    let total: u64 = log.ended.values().sum();
    eprintln!(
        "\n| operation | done | conflict | refused | failed | unsettled | p50 | p99 |\n|---|---|---|---|---|---|---|---|"
    );
    let kinds: BTreeSet<&str> = log.ended.keys().map(|(k, _)| *k).collect();
    for kind in kinds {
        let n = |e| log.ended.get(&(kind, e)).copied().unwrap_or(0);
        let mut latencies = log.latencies.get(kind).cloned().unwrap_or_default();
        latencies.sort_unstable();
        eprintln!(
            "| {kind} | {} | {} | {} | {} | {} | {:.0} ms | {:.0} ms |",
            n(Ended::Done),
            n(Ended::Conflict),
            n(Ended::Refused),
            n(Ended::Failed),
            n(Ended::Unsettled),
            percentile(&latencies, 0.50).as_secs_f64() * 1e3,
            percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        );
    }
    eprintln!(
        "\nops {total} in {:.1} s: {:.1} ops/s; client conflicts retried {}, refused {}, failed {}, unsettled {}; \
         approvals {}, pushes {}; relay: {invocations} invocations, {relay_conflicts} conflicts re-planned, \
         {relay_retried} retried; deletions left blocked by a downstream {}; invariant violations {}",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        count(Ended::Conflict),
        count(Ended::Refused),
        count(Ended::Failed),
        count(Ended::Unsettled),
        log.approved.len(),
        log.pushes.len(),
        blocked.len(),
        violations.len()
    );
    for (reason, n) in &log.reasons {
        eprintln!("{n:>5} × {reason}");
    }
    for violation in &violations {
        eprintln!("violation: {violation}");
    }
    assert!(
        violations.is_empty(),
        "seed {}: {} invariant violations",
        size.seed,
        violations.len()
    );
    assert!(
        !log.approved.is_empty() && !log.pushes.is_empty(),
        "seed {}: the run approved and pushed something",
        size.seed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torture_smoke() {
    torture(Size::fixed(8, 150, 3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: TORTURE_WRITERS=100 TORTURE_OPS=10000 TORTURE_PACKAGES=10, run with --release"]
async fn torture_full() {
    torture(Size::from_env(100, 10_000, 10)).await;
}
