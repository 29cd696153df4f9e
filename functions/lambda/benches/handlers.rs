//! Draft → Proposed → Published of a small package through the handlers:
//! in-process (the engine's Runner, as the CLI and an in-process relay call
//! it) and over HTTP (the `porch-handler` Lambda binary behind a Lambda
//! Runtime API on loopback, the protocol AWS Lambda and `cargo lambda
//! watch` speak), on repositories of 10 and 10,000 published packages. Then
//! process start to first Outcome.
//!
//! `cargo bench -p porch-lambda --bench handlers` (release). Each flow is a
//! new package: source (init) → render → propose → publish; figures are
//! medians of `ITERATIONS` flows after one warm-up flow.

#![allow(clippy::print_stdout)] // a bench binary reports on stdout

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use porch_api::invocation::Invocation;
use porch_engine::runner::Runner;
use porch_git::store::LocalDirStore;
use porch_krm::builtins::BuiltinRuntime;
use porch_krm::runtime::Runtimes;
use serde_json::{Value, json};

#[path = "../tests/it/runtime_api.rs"]
mod runtime_api;
use runtime_api::RuntimeApi;

const ITERATIONS: usize = 10;

/// Flows per figure: `ITERATIONS`, or `PORCH_BENCH_ITERATIONS` (more flows
/// make a profile of the steady state).
fn iterations() -> usize {
    std::env::var("PORCH_BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ITERATIONS)
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

/// A bare repository with `n` published packages (`pkg-<i>` at tag
/// `pkg-<i>/v1`), written by `git fast-import`, refs packed.
fn repository(root: &Path, n: usize) -> PathBuf {
    use std::io::Write;
    let bare = root.join(format!("repo-{n}.git"));
    git(
        root,
        &[
            "init",
            "--bare",
            "-q",
            "-b",
            "main",
            bare.to_str().expect("utf-8"),
        ],
    );
    let mut import = Command::new("git")
        .args(["fast-import", "--quiet"])
        .current_dir(&bare)
        .stdin(Stdio::piped())
        .spawn()
        .expect("git fast-import");
    let mut input = String::new();
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  a: \"1\"\n";
    input.push_str(&format!("blob\nmark :1\ndata {}\n{cm}\n", cm.len()));
    input.push_str("commit refs/heads/main\nmark :2\ncommitter Bench <bench@example.com> 1795000000 +0000\ndata 5\nseed\n");
    for i in 0..n {
        let kptfile = format!(
            "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: pkg-{i}\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\ninfo:\n  description: package {i}\n"
        );
        input.push_str(&format!(
            "M 100644 inline pkg-{i}/Kptfile\ndata {}\n{kptfile}\nM 100644 :1 pkg-{i}/cm.yaml\n",
            kptfile.len()
        ));
    }
    input.push('\n');
    for i in 0..n {
        input.push_str(&format!("reset refs/tags/pkg-{i}/v1\nfrom :2\n\n"));
    }
    import
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    assert!(import.wait().expect("fast-import").success());
    // as `git gc` leaves a server's repository: refs packed
    git(&bare, &["pack-refs", "--all"]);
    bare
}

fn repository_object(url: &Path) -> Value {
    json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1",
        "kind": "Repository",
        "metadata": {"name": "bench", "namespace": "default", "uid": "repo-uid"},
        "spec": {"type": "git", "git": {"repo": url.display().to_string(), "branch": "main"}}
    })
}

/// A new draft as the webhook leaves it.
fn new_draft(package: &str) -> Value {
    json!({
        "apiVersion": "porch.kpt.dev/v1alpha2",
        "kind": "PackageRevision",
        "metadata": {
            "name": format!("bench.{package}.v1"),
            "namespace": "default",
            "uid": format!("uid-{package}"),
            "generation": 1,
            "resourceVersion": "1",
            "labels": {"porch.kpt.dev/repository": "bench"},
            "finalizers": ["porch.kpt.dev/packagerevisions"],
            "ownerReferences": [{"apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository", "name": "bench", "uid": "repo-uid"}]
        },
        "spec": {"packageName": package, "repository": "bench", "workspaceName": "v1", "lifecycle": "Draft",
                 "source": {"init": {"description": "bench"}}}
    })
}

/// The patches of an Outcome applied to the object (what the relay does).
fn apply(object: &mut Value, outcome: &Value) {
    for patch in outcome["patches"].as_array().into_iter().flatten() {
        if patch["target"]["name"] != object["metadata"]["name"] {
            continue;
        }
        let ops: json_patch::Patch =
            serde_json::from_value(patch["patch"].clone()).expect("a patch");
        json_patch::patch(object, &ops).expect("applies");
    }
}

/// The operations of a flow, in order.
const STEPS: [&str; 4] = ["source", "render", "propose", "publish"];

/// One flow, `call(operation, pr, repository)` answering the Outcome: its
/// time, and the time of each of [`STEPS`].
async fn flow<F, Fut>(repo: &Value, package: &str, call: F) -> (Duration, [Duration; 4])
where
    F: Fn(&'static str, Value) -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let started = Instant::now();
    let mut steps = [Duration::ZERO; 4];
    let mut pr = new_draft(package);
    let invocation = |op: &str, pr: &Value| json!({"operation": op, "requestId": format!("bench-{package}-{op}"), "repository": repo, "packageRevision": pr});
    let step = Instant::now();
    let outcome = call("source", invocation("source", &pr)).await;
    apply(&mut pr, &outcome);
    steps[0] = step.elapsed();
    let step = Instant::now();
    let outcome = call("render", invocation("render", &pr)).await;
    apply(&mut pr, &outcome);
    steps[1] = step.elapsed();
    for (i, (lifecycle, generation)) in [("Proposed", 2), ("Published", 3)].into_iter().enumerate()
    {
        let step = Instant::now();
        pr["spec"]["lifecycle"] = json!(lifecycle);
        pr["metadata"]["generation"] = json!(generation);
        if lifecycle == "Published" {
            pr["metadata"]["annotations"] =
                json!({"porch.kpt.dev/approved-by": "bench@example.com"});
        }
        let outcome = call("lifecycle", invocation("lifecycle", &pr)).await;
        apply(&mut pr, &outcome);
        steps[2 + i] = step.elapsed();
    }
    assert_eq!(pr["status"]["revision"], 1, "published: {pr}");
    (started.elapsed(), steps)
}

/// The median of each step over `flows`, for stderr.
fn step_medians(flows: &[[Duration; 4]]) -> String {
    STEPS
        .iter()
        .enumerate()
        .map(|(i, name)| {
            format!(
                "{name} {}",
                ms(median(flows.iter().map(|f| f[i]).collect()))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The baseline: the git CLI doing the same git work on a warm clone of
/// the same repository (draft branch commit + push, a second commit +
/// push for the render, the move to the proposed branch, then the approval
/// merge, the tag and an atomic push).
fn git_cli_flow(work: &Path, package: &str) -> Duration {
    let run = |args: &[&str]| {
        let status = Command::new("git")
            .args([
                "-c",
                "user.name=Bench",
                "-c",
                "user.email=bench@example.com",
            ])
            .args(args)
            .current_dir(work)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("git runs");
        assert!(status.success(), "git {args:?}");
    };
    let started = Instant::now();
    let draft = format!("drafts/{package}/v1");
    let proposed = format!("proposed/{package}/v1");
    run(&["checkout", "-q", "-b", &draft, "main"]);
    std::fs::create_dir_all(work.join(package)).expect("dir");
    std::fs::write(
        work.join(package).join("Kptfile"),
        format!("apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: {package}\n"),
    )
    .expect("write");
    run(&["add", package]);
    run(&["commit", "-q", "-m", "Creating new empty revision"]);
    run(&["push", "-q", "origin", &draft]);
    std::fs::write(work.join(package).join("README.md"), "rendered\n").expect("write");
    run(&["add", package]);
    run(&["commit", "-q", "-m", "Rendering package"]);
    run(&["push", "-q", "origin", &draft]);
    run(&[
        "push",
        "-q",
        "--atomic",
        "origin",
        &format!("{draft}:refs/heads/{proposed}"),
        &format!(":refs/heads/{draft}"),
    ]);
    run(&["checkout", "-q", "main"]);
    run(&[
        "merge",
        "-q",
        "--no-ff",
        "-m",
        "Approving package revision",
        &draft,
    ]);
    run(&["tag", &format!("{package}/v1")]);
    run(&[
        "push",
        "-q",
        "--atomic",
        "origin",
        "main",
        &format!("{package}/v1"),
        &format!(":refs/heads/{proposed}"),
    ]);
    started.elapsed()
}

fn git_cli(bare: &Path, root: &Path, n: usize) -> Duration {
    let work = root.join(format!("git-cli-{n}"));
    git(
        root,
        &[
            "clone",
            "-q",
            bare.to_str().expect("utf-8"),
            work.to_str().expect("utf-8"),
        ],
    );
    git_cli_flow(&work, "cli-warm");
    let samples = (0..iterations())
        .map(|i| git_cli_flow(&work, &format!("cli-{i}")))
        .collect();
    median(samples)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn handler_process(address: std::net::SocketAddr, operation: &str, cache: &Path) -> Child {
    Child(
        Command::new(env!("CARGO_BIN_EXE_porch-handler"))
            .env("PORCH_OPERATION", operation)
            .envs(RuntimeApi::env(address, operation))
            .env("PORCH_CACHE_DIR", cache)
            .env("PORCH_LOG", "error")
            .stderr(Stdio::null())
            .spawn()
            .expect("porch-handler starts"),
    )
}

async fn in_process(repo: &Value, cache: &Path, label: &str) -> Duration {
    let functions = Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog())));
    let runner = Runner::new(cache.join("mirrors"), functions)
        .with_store(LocalDirStore::new(cache.join("snapshots")));
    let call = |_op: &'static str, event: Value| {
        let runner = &runner;
        async move {
            let invocation =
                Invocation::from_json(&serde_json::to_vec(&event).expect("json")).expect("valid");
            serde_json::to_value(runner.handle(&invocation).await.expect("outcome")).expect("json")
        }
    };
    flow(repo, &format!("{label}-warm"), call).await;
    let mut samples = Vec::new();
    let mut steps = Vec::new();
    for i in 0..iterations() {
        let (total, each) = flow(repo, &format!("{label}-{i}"), call).await;
        samples.push(total);
        steps.push(each);
    }
    // the median leaves out the rare flow whose save compacts the snapshot;
    // the mean spreads it over all of them
    let mean = samples.iter().sum::<Duration>() / u32::try_from(samples.len()).unwrap_or(1).max(1);
    eprintln!(
        "{label}: {}; mean of the flows {}",
        step_medians(&steps),
        ms(mean)
    );
    median(samples)
}

async fn over_http(repo: &Value, cache: &Path, label: &str) -> Duration {
    let mut apis = std::collections::BTreeMap::new();
    let mut children = Vec::new();
    for operation in ["source", "render", "lifecycle"] {
        let (api, address) = RuntimeApi::start().await;
        children.push(handler_process(address, operation, cache));
        apis.insert(operation, api);
    }
    let call = |op: &'static str, event: Value| {
        let api = apis[op].clone();
        async move {
            let (kind, value) = api.call(event).await;
            assert_eq!(kind, "response", "{value}");
            value
        }
    };
    flow(repo, &format!("{label}-warm"), call).await;
    // a profiler attached for the steady state starts here
    eprintln!("{label}: warmed up");
    let mut samples = Vec::new();
    let mut steps = Vec::new();
    for i in 0..iterations() {
        let (total, each) = flow(repo, &format!("{label}-{i}"), call).await;
        samples.push(total);
        steps.push(each);
    }
    eprintln!("{label}: {}", step_medians(&steps));
    drop(children);
    median(samples)
}

/// Spawn to first answer, for an Invocation with no git work (adopt) and
/// for a first init on a cold cache.
async fn start_to_first_outcome(repo: &Value, root: &Path) -> (Duration, Duration) {
    let mut plain = Vec::new();
    let mut with_git = Vec::new();
    for i in 0..iterations() {
        let (api, address) = RuntimeApi::start().await;
        let mut adopt = new_draft("start");
        adopt["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("finalizers");
        let event = json!({"operation": "adopt", "requestId": "start", "repository": repo, "packageRevision": adopt});
        let started = Instant::now();
        let _child = handler_process(address, "adopt", &root.join(format!("start-{i}")));
        let (kind, _) = api.call(event).await;
        plain.push(started.elapsed());
        assert_eq!(kind, "response");

        let (api, address) = RuntimeApi::start().await;
        let event = json!({"operation": "source", "requestId": "start", "repository": repo, "packageRevision": new_draft(&format!("cold-{i}"))});
        let started = Instant::now();
        let _child = handler_process(address, "source", &root.join(format!("cold-{i}")));
        let (kind, value) = api.call(event).await;
        with_git.push(started.elapsed());
        assert_eq!(kind, "response", "{value}");
    }
    (median(plain), median(with_git))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    println!(
        "Draft -> Proposed -> Published of a small package, median of {} flows:",
        iterations()
    );
    println!(
        "| packages in the repository | in-process | over HTTP (Lambda Runtime API) | git CLI, same git work |"
    );
    println!("|---|---|---|---|");
    // PORCH_BENCH_IN_PROCESS_ONLY=1: the in-process flows alone (for profiling)
    let in_process_only = std::env::var_os("PORCH_BENCH_IN_PROCESS_ONLY").is_some();
    let mut figures = Vec::new();
    // PORCH_BENCH_SIZES=10000: other repository sizes (profiling one)
    let sizes: Vec<usize> = std::env::var("PORCH_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10, 10_000]);
    for &n in &sizes {
        let started = Instant::now();
        let bare = repository(root, n);
        eprintln!(
            "repository of {n} packages written in {}",
            ms(started.elapsed())
        );
        let repo = repository_object(&bare);
        let local = in_process(&repo, &root.join(format!("cache-in-{n}")), "in").await;
        if in_process_only {
            println!("| {n} | {} | — | — |", ms(local));
            continue;
        }
        let http = over_http(&repo, &root.join(format!("cache-http-{n}")), "http").await;
        let cli = git_cli(&bare, root, n);
        println!("| {n} | {} | {} | {} |", ms(local), ms(http), ms(cli));
        figures.push((local, http, cli));
    }
    if in_process_only || figures.len() != 2 {
        return;
    }
    let ratio = |a: Duration, b: Duration| b.as_secs_f64() / a.as_secs_f64();
    println!(
        "10,000 ÷ 10 packages: in-process {:.2}x, over HTTP {:.2}x, git CLI {:.2}x (goal <= 1.2x)",
        ratio(figures[0].0, figures[1].0),
        ratio(figures[0].1, figures[1].1),
        ratio(figures[0].2, figures[1].2)
    );
    let bare = root.join("repo-10.git");
    let (plain, with_git) = start_to_first_outcome(&repository_object(&bare), root).await;
    println!(
        "process start to first Outcome: {} with no git work (adopt), {} for an init on a cold cache (goal <= 15 ms + git)",
        ms(plain),
        ms(with_git)
    );
}
