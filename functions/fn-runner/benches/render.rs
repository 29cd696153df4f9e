//! Render benchmark: a 1,000-resource package through set-namespace,
//! set-labels, set-annotations, apply-setters and ensure-name-substring.
//!
//! Measures, in the same run and on the same package:
//! - our render with the builtins in-process (the production path);
//! - our render running the same functions as executables (`fn-runner exec`);
//! - `kpt fn render` running the same executables (the baseline).
//!
//! `cargo bench -p porch-fn-runner --bench render -- [--resources N] [--runs N] [--kpt-runs N]`

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use porch_krm::builtins::BuiltinRuntime;
use porch_krm::package::Files;
use porch_krm::render::{RenderOptions, render};
use porch_krm::runtime::{ExecLimits, ExecRuntime, Runtimes};

const FN_RUNNER: &str = env!("CARGO_BIN_EXE_fn-runner");
const FUNCTIONS: [(&str, &str); 5] = [
    ("set-namespace", "    configMap:\n      namespace: prod\n"),
    (
        "set-labels",
        "    configMap:\n      app.kubernetes.io/part-of: shop\n",
    ),
    ("set-annotations", "    configMap:\n      owner: team-a\n"),
    (
        "apply-setters",
        "    configMap:\n      replicas: \"5\"\n      tag: \"1.27\"\n",
    ),
    (
        "ensure-name-substring",
        "    configMap:\n      prepend: prod-\n",
    ),
];

fn kptfile(exec: bool) -> String {
    let mut out = String::from(
        "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: bench\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\npipeline:\n  mutators:\n",
    );
    for (name, config) in FUNCTIONS {
        if exec {
            out.push_str(&format!("  - exec: {FN_RUNNER} exec {name}\n"));
        } else {
            out.push_str(&format!(
                "  - image: {name}:v0.{}\n",
                if name == "set-namespace" {
                    4
                } else if name == "set-annotations" {
                    1
                } else {
                    2
                }
            ));
        }
        out.push_str(config);
    }
    out
}

/// `resources` objects in files of 10: Deployments, Services and ConfigMaps.
fn package(resources: usize, exec: bool) -> Files {
    let mut files = BTreeMap::new();
    files.insert("Kptfile".to_owned(), kptfile(exec).into_bytes());
    let mut docs = Vec::new();
    for i in 0..resources {
        let doc = match i % 3 {
            0 => format!(
                "# app {i}\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app-{i}\n  labels:\n    app: app-{i}\nspec:\n  replicas: 3 # kpt-set: ${{replicas}}\n  selector:\n    matchLabels:\n      app: app-{i}\n  template:\n    metadata:\n      labels:\n        app: app-{i}\n    spec:\n      containers:\n      - name: main\n        image: registry.example.com/app:1.25 # kpt-set: registry.example.com/app:${{tag}}\n        envFrom:\n        - configMapRef:\n            name: config-{}\n",
                i + 2
            ),
            1 => format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: app-{}\nspec:\n  selector:\n    app: app-{}\n  ports:\n  - port: 80 # http\n    targetPort: 8080\n",
                i - 1,
                i - 1
            ),
            _ => format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-{i}\ndata:\n  mode: \"on\"\n  level: info\n"
            ),
        };
        docs.push(doc);
        if docs.len() == 10 || i + 1 == resources {
            files.insert(
                format!("apps/part-{:04}.yaml", i / 10),
                docs.join("---\n").into_bytes(),
            );
            docs.clear();
        }
    }
    files
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn write(dir: &Path, files: &Files) {
    let _ = std::fs::remove_dir_all(dir);
    for (path, bytes) in files {
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::write(target, bytes).expect("write");
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let resources = arg("--resources", 1000);
    let runs = arg("--runs", 9);
    let kpt_runs = arg("--kpt-runs", 3);
    let options = RenderOptions {
        record_status: false,
        attribution: Some("kpt-fn".into()),
        ..RenderOptions::default()
    };

    let builtin_files = package(resources, false);
    let builtins = Runtimes::new().with(Arc::new(BuiltinRuntime::catalog()));
    let mut in_process = Vec::new();
    let mut expected = None;
    for _ in 0..runs {
        let start = Instant::now();
        let rendered = render(&builtin_files, &builtins, &options);
        in_process.push(start.elapsed());
        assert!(rendered.is_success(), "{:?}", rendered.error);
        expected = Some(rendered.files);
    }

    // Where the in-process time goes: reading and writing the package.
    let mut read = Vec::new();
    let mut write_back = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let parsed = porch_krm::package::read_resources(&builtin_files).expect("read");
        read.push(start.elapsed());
        let previous = porch_krm::package::resource_files(&parsed);
        let start = Instant::now();
        porch_krm::package::write_resources(&builtin_files, parsed, &previous).expect("write");
        write_back.push(start.elapsed());
    }

    if std::env::args().any(|a| a == "--in-process-only") {
        println!("in-process: {:.1?} (median of {runs})", median(in_process));
        return;
    }
    let exec_files = package(resources, true);
    let exec = Runtimes::new().with(Arc::new(
        ExecRuntime::new(ExecLimits::default()).allow(FN_RUNNER),
    ));
    let mut our_exec = Vec::new();
    for _ in 0..runs.min(5) {
        let start = Instant::now();
        let rendered = render(&exec_files, &exec, &options);
        our_exec.push(start.elapsed());
        assert!(rendered.is_success(), "{:?}", rendered.error);
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let pkg = dir.path().join("pkg");
    let mut kpt = Vec::new();
    for _ in 0..kpt_runs {
        write(&pkg, &exec_files);
        let start = Instant::now();
        let status = Command::new("kpt")
            .args(["fn", "render", "--allow-exec"])
            .arg(&pkg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("kpt is installed");
        kpt.push(start.elapsed());
        assert!(status.success(), "kpt fn render failed");
    }
    // Same output as kpt, apart from the Kptfile (image vs exec).
    let expected = expected.unwrap_or_default();
    let mut differing = 0;
    for (path, bytes) in &expected {
        if path != "Kptfile" && std::fs::read(pkg.join(path)).ok().as_ref() != Some(bytes) {
            differing += 1;
        }
    }

    let (a, b, c) = (median(in_process.clone()), median(our_exec), median(kpt));
    println!("render of {resources} resources, 5 functions (medians)");
    println!(
        "  in-process builtins        {:>10.1?}  ({runs} runs, min {:.1?})",
        a,
        in_process.iter().min().copied().unwrap_or_default()
    );
    println!("    of which reading files   {:>10.1?}", median(read));
    println!("    of which writing files   {:>10.1?}", median(write_back));
    println!("  ours, functions as exec    {:>10.1?}", b);
    println!(
        "  kpt fn render, same exec   {:>10.1?}  ({kpt_runs} runs)",
        c
    );
    println!(
        "  kpt / in-process           {:>10.1}x",
        c.as_secs_f64() / a.as_secs_f64()
    );
    println!(
        "  kpt / ours with exec       {:>10.1}x",
        c.as_secs_f64() / b.as_secs_f64()
    );
    println!("  files differing from kpt   {differing:>10}");
}
