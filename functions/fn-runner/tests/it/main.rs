//! The builtin functions against kpt: kpt runs them as executables
//! (`fn-runner exec <name>`), our render runs them in-process; the packages
//! must come out byte-identical.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use porch_krm::builtins::BuiltinRuntime;
use porch_krm::render::{RenderOptions, render};
use porch_krm::runtime::{
    Call, FunctionError, FunctionOutput, FunctionRef, FunctionRuntime, Runtimes,
};
use pretty_assertions::assert_eq;

mod tls;

const FN_RUNNER: &str = env!("CARGO_BIN_EXE_fn-runner");

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                out.insert(
                    rel.to_string_lossy().into_owned(),
                    std::fs::read(&path).expect("read"),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// `exec: <fn-runner> exec <name>` runs the builtin of that name in-process.
#[derive(Debug)]
struct ExecAsBuiltin(BuiltinRuntime);

impl FunctionRuntime for ExecAsBuiltin {
    fn run(&self, call: Call<'_>) -> Result<FunctionOutput, FunctionError> {
        let FunctionRef::Exec(command) = call.function else {
            return Err(FunctionError::NotFound(call.function.display().to_owned()));
        };
        let name = command.rsplit(' ').next().unwrap_or("");
        self.0.run_named(name, call.items, call.config)
    }
}

fn conformance(fixture: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pkg = dir.path().join("pkg");
    let mut files = read_tree(&fixtures().join(fixture));
    for (path, bytes) in files.iter_mut() {
        if path.ends_with("Kptfile") {
            *bytes = String::from_utf8(bytes.clone())?
                .replace("FN ", &format!("{FN_RUNNER} exec "))
                .into_bytes();
        }
        let target = pkg.join(path);
        std::fs::create_dir_all(target.parent().expect("parent"))?;
        std::fs::write(target, &bytes)?;
    }
    let output = Command::new("kpt")
        .args(["fn", "render", "--allow-exec", "--truncate-output=false"])
        .arg(&pkg)
        .output()?;
    assert!(
        output.status.success(),
        "kpt: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let expected = read_tree(&pkg);

    let runtime = Runtimes::new().with(Arc::new(ExecAsBuiltin(BuiltinRuntime::catalog())));
    let options = RenderOptions {
        record_status: false,
        attribution: Some("kpt-fn".into()),
        ..RenderOptions::default()
    };
    let rendered = render(&files, &runtime, &options);
    assert_eq!(rendered.error, None);
    for (path, bytes) in &expected {
        assert_eq!(
            String::from_utf8_lossy(&rendered.files[path]),
            String::from_utf8_lossy(bytes),
            "{path}"
        );
    }
    assert_eq!(rendered.files.len(), expected.len());
    Ok(())
}

#[test]
fn catalog_functions_match_kpt_running_them_as_executables() -> anyhow::Result<()> {
    conformance("catalog")
}

#[test]
fn set_image_and_search_replace_match_kpt() -> anyhow::Result<()> {
    conformance("catalog-more")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut out = String::new();
    stream.read_to_string(&mut out)?;
    Ok(out)
}

/// Kills the server when the test ends, whatever happens.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_runner_answers_grpc_health_and_metrics() -> anyhow::Result<()> {
    let (grpc, metrics) = (free_port(), free_port());
    let _server = Server(
        Command::new(FN_RUNNER)
            .args(["serve", "--address", &format!("127.0.0.1:{grpc}")])
            .args(["--metrics-address", &format!("127.0.0.1:{metrics}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?,
    );
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc}"))?;
    let mut channel = None;
    for _ in 0..100 {
        if let Ok(c) = endpoint.connect().await {
            channel = Some(c);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let channel = channel.ok_or_else(|| anyhow::anyhow!("fn-runner did not start"))?;

    // One evaluation through Porch's API.
    let runtime = Runtimes::new().with(Arc::new(porch_krm::grpc::GrpcRuntime::new(
        channel.clone(),
        tokio::runtime::Handle::current(),
        porch_krm::grpc::ClientOptions::default(),
    )));
    let files: BTreeMap<String, Vec<u8>> = [
        ("Kptfile", "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: p\npipeline:\n  mutators:\n  - image: set-namespace:v0.4\n    configMap:\n      namespace: prod\n"),
        ("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n"),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_owned(), c.as_bytes().to_vec()))
    .collect();
    let rendered =
        tokio::task::spawn_blocking(move || render(&files, &runtime, &RenderOptions::default()))
            .await?;
    assert_eq!(rendered.error, None);
    assert!(String::from_utf8_lossy(&rendered.files["cm.yaml"]).contains("namespace: prod"));

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "evaluator.FunctionEvaluator".into(),
        })
        .await?
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let metrics_text = tokio::task::spawn_blocking(move || http_get(metrics, "/metrics")).await??;
    assert!(
        metrics_text.contains("fn_runner_evaluations_total 1"),
        "{metrics_text}"
    );
    assert!(
        metrics_text.contains("fn_runner_failures_total 0"),
        "{metrics_text}"
    );
    Ok(())
}
