//! Webhook benchmarks, each against a baseline measured in the same run:
//!
//! 1. admission throughput and p99 latency of `/validate` versus an axum echo
//!    handler, same loopback, same client, same host code (goal ≥ 0.7×);
//! 2. one ConversionReview of 1,500 PackageRevisions of ~5 kB (goal ≤ 50 ms);
//! 3. process start to first answered request of `porch-webhooks` over HTTPS
//!    (goal ≤ 15 ms), next to the start of a process that does nothing.
//!
//! `cargo bench -p porch-webhooks --bench webhooks [-- --quick] [--http-only]`

#![allow(clippy::print_stdout)] // a bench binary reports on stdout

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use porch_webhooks::authz::StaticAuthorizer;
use porch_webhooks::config::WebhookConfig;
use porch_webhooks::{AppState, router};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Serves `app` on a loopback port from its own single-threaded runtime.
fn serve(app: Router) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            axum::serve(listener, app).await.expect("serve");
        });
    });
    rx.recv().expect("server address")
}

/// Serves `app` over TLS with the production host code (`server::serve_tls`).
fn serve_https(app: Router, cert_dir: &Path) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    let files = porch_webhooks::server::TlsFiles {
        cert: cert_dir.join("tls.crt"),
        key: cert_dir.join("tls.key"),
    };
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let cert = porch_webhooks::server::ReloadingCert::new(files).expect("cert");
            let tls = porch_webhooks::server::tls_config(cert).expect("tls");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            porch_webhooks::server::serve_tls(
                listener,
                tls,
                app,
                porch_webhooks::server::ConnectionLimits::default(),
                std::future::pending(),
            )
            .await;
        });
    });
    rx.recv().expect("server address")
}

struct Load {
    requests_per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// `workers` keep-alive connections posting `body` for `duration`.
async fn load(
    client: &reqwest::Client,
    url: &str,
    body: Bytes,
    workers: usize,
    duration: Duration,
) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (client, url, body, stop) = (
            client.clone(),
            url.to_owned(),
            body.clone(),
            Arc::clone(&stop),
        );
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let response = client
                    .post(&url)
                    .body(body.clone())
                    .send()
                    .await
                    .expect("request");
                assert!(response.status().is_success());
                let bytes = response.bytes().await.expect("body");
                assert!(!bytes.is_empty());
                latencies.push(start.elapsed());
            }
            latencies
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("worker"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    Load {
        requests_per_second: all.len() as f64 / elapsed,
        p50: percentile(&all, 0.5),
        p99: percentile(&all, 0.99),
    }
}

fn fixture(rel: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(rel),
    )
    .expect("fixture")
}

fn admission_vs_echo(rounds: usize, seconds: f64, https: bool) {
    let state = AppState::new(
        WebhookConfig::default(),
        Arc::new(StaticAuthorizer::DenyAll),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let pem = tls_pair(dir.path());
    let echo_app = Router::new().route("/validate", post(|body: Bytes| async move { body }));
    let (admission, echo, scheme) = if https {
        (
            serve_https(router(state), dir.path()),
            serve_https(echo_app, dir.path()),
            "https",
        )
    } else {
        (serve(router(state)), serve(echo_app), "http")
    };
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(16)
        .http1_only();
    if https {
        builder = builder.use_preconfigured_tls(client_tls(&pem));
    }
    let client = builder.build().expect("client");
    let echo_url = format!("{scheme}://localhost:{}/validate", echo.port());
    let admission_url = format!("{scheme}://localhost:{}/validate", admission.port());
    let body = Bytes::from(fixture("validate/pass/v1alpha2-update-propose.json"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (mut echo_rps, mut adm_rps, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut echo_p99, mut adm_p99, mut adm_p50) = (Vec::new(), Vec::new(), Vec::new());
    let duration = Duration::from_secs_f64(seconds);
    rt.block_on(async {
        // warm both
        load(&client, &echo_url, body.clone(), 16, Duration::from_millis(300)).await;
        load(&client, &admission_url, body.clone(), 16, Duration::from_millis(300)).await;
        for round in 0..rounds {
            let e = load(&client, &echo_url, body.clone(), 16, duration).await;
            let a = load(&client, &admission_url, body.clone(), 16, duration).await;
            println!(
                "  {scheme} round {round}: echo {:>8.0} req/s p99 {:>6.0} µs | validate {:>8.0} req/s p50 {:>6.0} µs p99 {:>6.0} µs | ratio {:.2}",
                e.requests_per_second,
                e.p99.as_secs_f64() * 1e6,
                a.requests_per_second,
                a.p50.as_secs_f64() * 1e6,
                a.p99.as_secs_f64() * 1e6,
                a.requests_per_second / e.requests_per_second
            );
            ratios.push(a.requests_per_second / e.requests_per_second);
            echo_rps.push(e.requests_per_second);
            adm_rps.push(a.requests_per_second);
            echo_p99.push(e.p99.as_secs_f64() * 1e6);
            adm_p99.push(a.p99.as_secs_f64() * 1e6);
            adm_p50.push(a.p50.as_secs_f64() * 1e6);
        }
    });
    println!(
        "admission vs echo over {scheme} ({} B review, 16 connections, median of {rounds} rounds of {seconds}s): echo {:.0} req/s (p99 {:.0} µs), /validate {:.0} req/s (p50 {:.0} µs, p99 {:.0} µs), ratio {:.2} (goal ≥ 0.70)",
        body.len(),
        median(&mut echo_rps),
        median(&mut echo_p99),
        median(&mut adm_rps),
        median(&mut adm_p50),
        median(&mut adm_p99),
        median(&mut ratios)
    );
}

/// A published v1alpha2 PackageRevision padded to about `size` bytes of JSON.
fn package_revision(i: usize, size: usize) -> Value {
    let mut obj = json!({
        "apiVersion": "porch.kpt.dev/v1alpha2",
        "kind": "PackageRevision",
        "metadata": {
            "name": format!("blueprints.team-{i}.basens.v{i}"),
            "namespace": "porch-demo",
            "uid": format!("8d0f4a4e-55b6-4cfa-9d39-{i:012}"),
            "resourceVersion": format!("{}", 100_000 + i),
            "generation": 3,
            "creationTimestamp": "2026-11-20T10:00:00Z",
            "labels": {"porch.kpt.dev/repository": "blueprints", "porch.kpt.dev/latest-revision": if i.is_multiple_of(3) { "true" } else { "false" }},
            "annotations": {"porch.kpt.dev/proposed-by": "alice@example.com", "porch.kpt.dev/approved-by": "bob@example.com"},
            "finalizers": ["porch.kpt.dev/packagerevisions"],
            "ownerReferences": [{"apiVersion": "config.porch.kpt.dev/v1alpha1", "kind": "Repository", "name": "blueprints", "uid": "2b9b2f39-8a1e-4f71-9a43-6d1d7c0e4f22"}]
        },
        "spec": {
            "packageName": format!("team-{i}/basens"),
            "repository": "blueprints",
            "workspaceName": format!("v{i}"),
            "lifecycle": "Published",
            "source": {"cloneFrom": {"upstreamRef": {"name": "catalog.basens.v3"}}},
            "readinessGates": [{"conditionType": "config.injection.ConfigMap.cfg"}],
            "packageMetadata": {"labels": {"app": "basens"}, "annotations": {"owner": "team"}}
        },
        "status": {
            "observedGeneration": 3,
            "revision": i,
            "upstreamLock": {"type": "git", "git": {"repo": "https://github.com/example/catalog.git", "directory": "basens", "ref": "basens/v3", "commit": "4c6f3a8f0d6f7f2ad1a3b5b0d3f1f5e6a7b8c9d0"}},
            "selfLock": {"type": "git", "git": {"repo": "https://github.com/example/blueprints.git", "directory": format!("team-{i}/basens"), "ref": format!("team-{i}/basens/v{i}"), "commit": "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b"}},
            "publishedBy": "bob@example.com",
            "publishedAt": "2026-11-21T09:00:00Z",
            "creationSource": "clone",
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-11-21T09:00:00Z", "observedGeneration": 3},
                {"type": "Rendered", "status": "True", "reason": "Rendered", "message": "", "lastTransitionTime": "2026-11-21T08:59:00Z"}
            ],
            "packageConditions": []
        }
    });
    let mut n = 0;
    while serde_json::to_vec(&obj).expect("json").len() < size {
        obj["status"]["packageConditions"].as_array_mut().expect("array").push(json!({
            "type": format!("config.injection.ConfigMap.settings-{n}"),
            "status": "True",
            "reason": "ConfigInjected",
            "message": format!("injected resource \"settings-{n}\" from cluster object ConfigMap/porch-demo/settings-{n}")
        }));
        n += 1;
    }
    obj
}

fn conversion(iterations: usize) {
    let objects: Vec<Value> = (0..1500).map(|i| package_revision(i, 5_000)).collect();
    let review = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "bench", "desiredAPIVersion": "porch.kpt.dev/v1alpha1", "objects": objects}
    });
    let body = serde_json::to_vec(&review).expect("json");
    let mut back = None;
    let mut down = Vec::new();
    let mut up = Vec::new();
    for _ in 0..iterations {
        let start = Instant::now();
        let answer = porch_webhooks::conversion::review(&body);
        down.push(start.elapsed().as_secs_f64() * 1e3);
        back = Some(answer);
    }
    let answer: Value = serde_json::from_slice(&back.expect("ran")).expect("json");
    let converted = answer["response"]["convertedObjects"].clone();
    assert_eq!(
        converted.as_array().map(Vec::len),
        Some(1500),
        "{}",
        answer["response"]["result"]
    );
    // and back to v1alpha2, as a v1alpha1 list read then write would do
    let review_up = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "bench", "desiredAPIVersion": "porch.kpt.dev/v1alpha2", "objects": converted}
    });
    let body_up = serde_json::to_vec(&review_up).expect("json");
    for _ in 0..iterations {
        let start = Instant::now();
        let answer = porch_webhooks::conversion::review(&body_up);
        assert!(porch_webhooks::conversion::succeeded(&answer));
        up.push(start.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "ConversionReview of 1,500 PackageRevisions ({:.1} MB, {} B each), parse + convert + encode, median of {iterations}: v1alpha2→v1alpha1 {:.1} ms, v1alpha1→v1alpha2 {:.1} ms (goal ≤ 50 ms)",
        body.len() as f64 / 1e6,
        body.len() / 1500,
        median(&mut down),
        median(&mut up)
    );
}

/// A self-signed pair for localhost; returns the certificate PEM.
fn tls_pair(dir: &Path) -> String {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    std::fs::write(dir.join("tls.crt"), generated.cert.pem()).expect("write");
    std::fs::write(dir.join("tls.key"), generated.signing_key.serialize_pem()).expect("write");
    generated.cert.pem()
}

/// A client configuration trusting only `pem`.
fn client_tls(pem: &str) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// One blocking HTTPS GET of `/healthz`; `None` while nothing listens.
fn healthz(port: u16, tls: &Arc<rustls::ClientConfig>) -> Option<bool> {
    use std::io::{Read, Write};
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let conn = rustls::ClientConnection::new(Arc::clone(tls), name).expect("client");
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    Some(answer.starts_with(b"HTTP/1.1 200"))
}

/// Spawn to the first `200` on `/healthz` over TLS, polled by a blocking
/// client every 100 µs (connection refused until the server listens).
fn startup(runs: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let pem = tls_pair(dir.path());
    let tls = Arc::new(client_tls(&pem));
    let mut starts = Vec::new();
    let mut noop = Vec::new();
    for run in 0..runs {
        let port = 20_000 + (std::process::id() % 1000) as u16 * 10 + (run % 10) as u16;
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_porch-webhooks"))
            .args([
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--approval-check",
                "deny-all",
            ])
            .arg("--tls-cert")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.path().join("tls.key"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let elapsed = loop {
            if healthz(port, &tls) == Some(true) {
                break started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "server did not answer"
            );
            std::thread::sleep(Duration::from_micros(100));
        };
        let _ = child.kill();
        let _ = child.wait();
        starts.push(elapsed.as_secs_f64() * 1e3);
        let t = Instant::now();
        Command::new("true").status().expect("true");
        noop.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "process start to first answered HTTPS request, median of {runs}: {:.1} ms (min {:.1}, max {:.1}; goal ≤ 15 ms); spawning `true` takes {:.1} ms",
        median(&mut starts.clone()),
        starts.iter().copied().fold(f64::INFINITY, f64::min),
        starts.iter().copied().fold(0.0, f64::max),
        median(&mut noop)
    );
}

/// Where the time of one `/validate` goes, per stage, in-process.
fn components(iterations: usize) {
    let body = fixture("validate/pass/v1alpha2-update-propose.json");
    let config = WebhookConfig::default();
    let time = |label: &str, f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..iterations {
            f();
        }
        println!(
            "  {label}: {:.1} µs",
            start.elapsed().as_secs_f64() * 1e6 / iterations as f64
        );
    };
    time("generic: read the AdmissionReview envelope", &mut || {
        std::hint::black_box(porch_webhooks::review::parse(&body).expect("parse"));
    });
    let input = porch_webhooks::review::parse(&body).expect("parse");
    time(
        "generic: validate (decode both objects, rules)",
        &mut || {
            std::hint::black_box(porch_webhooks::validate::package_revision(&input, &config));
        },
    );
    time("one pass: read and validate a v1alpha2 review", &mut || {
        let review = porch_webhooks::review::parse_revision_review(&body).expect("one pass");
        std::hint::black_box(porch_webhooks::validate::package_revision_review(
            review, &config,
        ));
    });
    time("encode the answer", &mut || {
        let response = input.allow();
        std::hint::black_box(porch_webhooks::encode_admission(response.into_review()));
    });
}

fn main() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let quick = std::env::args().any(|a| a == "--quick");
    // `cargo test --benches` runs this with `--bench`; keep that fast
    let smoke = std::env::args().all(|a| a != "--bench") || quick;
    let (rounds, seconds, iterations, runs) = if smoke {
        (1, 0.5, 2, 3)
    } else {
        (5, 3.0, 10, 21)
    };
    println!(
        "porch-webhooks benchmarks ({} mode)",
        if smoke { "quick" } else { "full" }
    );
    components(if smoke { 2_000 } else { 20_000 });
    admission_vs_echo(rounds, seconds, false);
    if std::env::args().any(|a| a == "--http-only") {
        return;
    }
    admission_vs_echo(rounds, seconds, true);
    conversion(iterations);
    startup(runs);
}
