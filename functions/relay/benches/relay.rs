//! How fast the relay plans and dispatches, with a handler that does
//! nothing: events per second for a burst of new revisions, and the delay
//! from an object event to its handler's start for a steady stream, with
//! the cluster in memory. Baseline: the same events passed through a plain
//! tokio channel to a task (the least any dispatcher costs).
//!
//! `cargo bench -p porch-relay --bench relay` (knobs: `PORCH_BENCH_REVISIONS`,
//! `PORCH_BENCH_RUNS`).
#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use porch_api::invocation::{Invocation, Outcome};
use porch_api::repository::Repository;
use porch_api::v1alpha2::PackageRevision;
use porch_relay::invoker::{InvokeError, Invoker};
use porch_relay::memory::Objects;
use porch_relay::relay::{Relay, RelayConfig};
use serde_json::json;

/// Notes when each revision's handler started.
#[derive(Default)]
struct Stopwatch {
    started: Mutex<HashMap<String, Instant>>,
}

impl Invoker for Stopwatch {
    async fn invoke(&self, invocation: &Invocation) -> Result<Outcome, InvokeError> {
        if let Some(pr) = &invocation.package_revision {
            self.started
                .lock()
                .expect("lock")
                .insert(pr.metadata.name.clone().unwrap_or_default(), Instant::now());
        }
        Ok(Outcome::none())
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn repository(i: usize) -> Repository {
    serde_json::from_value(json!({
        "apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository",
        "metadata": {"name": format!("repo-{i}"), "namespace": "default", "uid": format!("r{i}"), "resourceVersion": "1"},
        "spec": {"type": "git", "git": {"repo": format!("https://git.example.com/{i}.git"), "branch": "main"}}
    }))
    .expect("repository")
}

/// A draft not yet adopted: the planner says `adopt` is due.
fn revision(i: usize, repositories: usize) -> PackageRevision {
    let repo = format!("repo-{}", i % repositories);
    serde_json::from_value(json!({
        "apiVersion": "porch.kpt.dev/v1alpha2", "kind": "PackageRevision",
        "metadata": {"name": format!("{repo}.p{i}.v1"), "namespace": "default", "uid": format!("u{i}"),
                     "resourceVersion": "5", "generation": 1},
        "spec": {"packageName": format!("p{i}"), "repository": repo, "workspaceName": "v1", "lifecycle": "Draft"}
    }))
    .expect("revision")
}

fn relay(repositories: usize) -> (Arc<Relay<Mutex<Objects>, Stopwatch>>, Arc<Stopwatch>) {
    let stopwatch = Arc::new(Stopwatch::default());
    let relay = Arc::new(Relay::new(
        Arc::new(Mutex::new(Objects::default())),
        Arc::clone(&stopwatch),
        RelayConfig {
            sync_interval: Duration::from_secs(3600),
            ..RelayConfig::default()
        },
    ));
    for i in 0..repositories {
        relay.observe_repository(repository(i));
    }
    (relay, stopwatch)
}

async fn wait_for(stopwatch: &Stopwatch, n: usize) {
    while stopwatch.started.lock().expect("lock").len() < n {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// A burst of `n` new revisions: events per second until every handler ran.
async fn burst(n: usize, repositories: usize) -> f64 {
    let (relay, stopwatch) = relay(repositories);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Arc::clone(&relay).run(async {
        let _ = stopped.await;
    }));
    let revisions: Vec<PackageRevision> = (0..n).map(|i| revision(i, repositories)).collect();
    let started = Instant::now();
    for pr in revisions {
        relay.observe_revision(pr);
    }
    wait_for(&stopwatch, n).await;
    let elapsed = started.elapsed();
    let _ = stop.send(());
    running.await.expect("stops");
    n as f64 / elapsed.as_secs_f64()
}

/// `n` events, one every `gap`: the delay from each event to its handler's
/// start, sorted.
async fn steady(n: usize, repositories: usize, gap: Duration) -> Vec<Duration> {
    let (relay, stopwatch) = relay(repositories);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Arc::clone(&relay).run(async {
        let _ = stopped.await;
    }));
    let mut sent = HashMap::new();
    for i in 0..n {
        let pr = revision(i, repositories);
        sent.insert(pr.metadata.name.clone().unwrap_or_default(), Instant::now());
        relay.observe_revision(pr);
        tokio::time::sleep(gap).await;
    }
    wait_for(&stopwatch, n).await;
    let _ = stop.send(());
    running.await.expect("stops");
    let started = stopwatch.started.lock().expect("lock");
    let mut delays: Vec<Duration> = sent
        .iter()
        .map(|(name, at)| started[name].saturating_duration_since(*at))
        .collect();
    delays.sort();
    delays
}

/// The baseline: the same steady stream through an unbounded channel to a
/// task that notes the arrival.
async fn channel_baseline(n: usize, gap: Duration) -> Vec<Duration> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(PackageRevision, Instant)>();
    let receiver = tokio::spawn(async move {
        let mut delays = Vec::new();
        while let Some((_pr, sent)) = rx.recv().await {
            delays.push(sent.elapsed());
        }
        delays
    });
    for i in 0..n {
        tx.send((revision(i, 100), Instant::now())).expect("send");
        tokio::time::sleep(gap).await;
    }
    drop(tx);
    let mut delays = receiver.await.expect("receiver");
    delays.sort();
    delays
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = env("PORCH_BENCH_REVISIONS", 10_000);
    let runs = env("PORCH_BENCH_RUNS", 5);
    println!("Relay with a no-op handler, cluster in memory, {runs} runs:");
    println!();
    println!("| burst of {n} new revisions over 100 repositories | events/s |");
    println!("|---|---|");
    let mut rates = Vec::new();
    for run in 0..runs {
        let rate = burst(n, 100).await;
        println!("| run {} | {rate:.0} |", run + 1);
        rates.push(rate);
    }
    println!("| median | {:.0} |", median(rates));
    println!();
    let steady_n = 2_000;
    let gap = Duration::from_micros(500);
    println!(
        "| {steady_n} events, one per {} µs | p50 | p99 | max |",
        gap.as_micros()
    );
    println!("|---|---|---|---|");
    for run in 0..runs {
        let relay = steady(steady_n, 100, gap).await;
        let channel = channel_baseline(steady_n, gap).await;
        println!(
            "| run {}: event → handler start | {} | {} | {} |",
            run + 1,
            ms(percentile(&relay, 0.5)),
            ms(percentile(&relay, 0.99)),
            ms(percentile(&relay, 1.0))
        );
        println!(
            "| run {}: baseline, a channel to a task | {} | {} | {} |",
            run + 1,
            ms(percentile(&channel, 0.5)),
            ms(percentile(&channel, 0.99)),
            ms(percentile(&channel, 1.0))
        );
    }
}
