//! The gRPC client runtime against our function runner service: over
//! loopback TCP and an in-memory duplex, with limits, deadlines and a server
//! that is not there.

use std::sync::Arc;
use std::time::Duration;

use porch_krm::builtins::BuiltinRuntime;
use porch_krm::grpc::{
    ClientOptions, Evaluator, FunctionEvaluatorServer, GrpcRuntime, ImageAllowlist, serve,
};
use porch_krm::package::Files;
use porch_krm::render::{RenderOptions, Rendered, render};
use porch_krm::runtime::{ExecLimits, ExecRuntime, FunctionRuntime, Runtimes};

fn package(pipeline: &str) -> Files {
    [
        (
            "Kptfile",
            format!("apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: pkg\npipeline:\n  mutators:\n{pipeline}"),
        ),
        (
            "cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm # keep me\ndata:\n  a: \"1\"\n".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_owned(), c.into_bytes()))
    .collect()
}

const LABELS: &str = "  - image: set-labels:v0.2.1\n    configMap:\n      app: shop\n";

async fn start_server(
    exec: Option<ExecRuntime>,
    max: usize,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let evaluator = Evaluator::new(BuiltinRuntime::catalog(), exec);
    tokio::spawn(async move {
        let _ = serve(listener, evaluator, max, async {
            let _ = rx.await;
        })
        .await;
    });
    (address, tx)
}

async fn render_with(runtime: Arc<dyn FunctionRuntime>, files: Files) -> Rendered {
    tokio::task::spawn_blocking(move || {
        let options = RenderOptions {
            record_status: false,
            ..RenderOptions::default()
        };
        render(&files, runtime.as_ref(), &options)
    })
    .await
    .expect("render task")
}

fn client(address: &str, options: ClientOptions) -> Arc<dyn FunctionRuntime> {
    Arc::new(
        GrpcRuntime::connect_lazy(address, tokio::runtime::Handle::current(), options)
            .expect("valid address"),
    )
}

fn error_text(rendered: &Rendered) -> String {
    rendered
        .error
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_render_over_grpc_equals_the_in_process_render() {
    let (address, _stop) = start_server(None, 6 << 20).await;
    let files = package(LABELS);
    let remote = render_with(client(&address, ClientOptions::default()), files.clone()).await;
    let local = render_with(
        Arc::new(Runtimes::new().with(Arc::new(BuiltinRuntime::catalog()))),
        files,
    )
    .await;
    assert_eq!(remote.error, None);
    assert_eq!(remote.files, local.files);
    assert!(
        String::from_utf8_lossy(&remote.files["cm.yaml"])
            .contains("name: cm # keep me\n  labels:\n    app: shop\n")
    );
    assert_eq!(remote.steps[0].results[0].message, "set 2 labels in total");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_works_over_an_in_memory_duplex() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let evaluator = Evaluator::new(BuiltinRuntime::catalog(), None);
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(FunctionEvaluatorServer::new(evaluator))
            .serve_with_incoming(tokio_stream::once(Ok::<_, std::io::Error>(server_io)))
            .await;
    });
    let mut slot = Some(client_io);
    let channel = tonic::transport::Endpoint::from_static("http://in-memory")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let io = slot.take();
            async move {
                io.map(hyper_util::rt::TokioIo::new)
                    .ok_or_else(|| std::io::Error::other("the duplex is already used"))
            }
        }))
        .await
        .expect("connect");
    let runtime = Arc::new(GrpcRuntime::new(
        channel,
        tokio::runtime::Handle::current(),
        ClientOptions::default(),
    ));
    let rendered = render_with(runtime, package(LABELS)).await;
    assert_eq!(rendered.error, None);
    assert!(String::from_utf8_lossy(&rendered.files["cm.yaml"]).contains("app: shop"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_refused_on_both_sides() {
    let (address, _stop) = start_server(None, 64).await;
    let files = package(LABELS);
    let small_client = ClientOptions {
        max_message_bytes: 64,
        ..ClientOptions::default()
    };
    let rendered = render_with(client(&address, small_client), files.clone()).await;
    assert!(
        error_text(&rendered).contains("larger than the message limit"),
        "{}",
        error_text(&rendered)
    );
    assert_eq!(rendered.files, files);
    let rendered = render_with(client(&address, ClientOptions::default()), files.clone()).await;
    assert!(
        error_text(&rendered).contains("message too large"),
        "{}",
        error_text(&rendered)
    );
    assert_eq!(rendered.files, files);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_a_clear_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let files = package(LABELS);
    let rendered = render_with(client(&address, ClientOptions::default()), files.clone()).await;
    assert!(
        error_text(&rendered).contains("unavailable"),
        "{}",
        error_text(&rendered)
    );
    assert_eq!(rendered.files, files);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_function_hits_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("slow.sh");
    std::fs::write(&path, "#!/bin/sh\nsleep 30\ncat\n").expect("write");
    let mut perms = std::fs::metadata(&path).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).expect("chmod");
    let exec = ExecRuntime::new(ExecLimits::default()).image("example.com/slow:v1", &path, &[]);
    let (address, _stop) = start_server(Some(exec), 6 << 20).await;
    let options = ClientOptions {
        timeout: Duration::from_millis(300),
        images: ImageAllowlist::parse("example.com/*"),
        ..ClientOptions::default()
    };
    let files = package("  - image: example.com/slow:v1\n");
    let started = std::time::Instant::now();
    let rendered = render_with(client(&address, options), files.clone()).await;
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert!(
        error_text(&rendered).contains("deadline exceeded"),
        "{}",
        error_text(&rendered)
    );
    assert_eq!(rendered.files, files);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_unknown_images_map_to_typed_errors() {
    let (address, _stop) = start_server(None, 6 << 20).await;
    // set-labels without a config fails with its result in the message.
    let rendered = render_with(
        client(&address, ClientOptions::default()),
        package("  - image: set-labels:v0.2\n"),
    )
    .await;
    let text = error_text(&rendered);
    assert!(text.contains("`FunctionConfig` is not given"), "{text}");
    // An image nobody has.
    let everything = ClientOptions {
        images: ImageAllowlist::parse("*"),
        ..ClientOptions::default()
    };
    let rendered = render_with(
        client(&address, everything),
        package("  - image: example.com/none:v1\n"),
    )
    .await;
    assert!(
        error_text(&rendered).contains("not found"),
        "{}",
        error_text(&rendered)
    );
}

/// Only allowlisted images reach the runner (the kpt catalog by default):
/// another image fails before any call, so no server is even needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_outside_the_allowlist_never_reach_the_runner() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    for image in [
        "evil.example/miner:v1",
        "gcr.io/kpt-fn-evil/x:v1",
        "ghcr.io/kptdev/krm-functions-catalog-fake/x:v1",
    ] {
        let files = package(&format!("  - image: {image}\n"));
        let rendered = render_with(client(&address, ClientOptions::default()), files.clone()).await;
        assert!(
            error_text(&rendered).contains("not in the function image allowlist"),
            "{image}: {}",
            error_text(&rendered)
        );
        assert_eq!(rendered.files, files);
    }
    let defaults = ImageAllowlist::default();
    assert!(defaults.allows("gcr.io/kpt-fn/set-labels:v0.2.0"));
    assert!(defaults.allows("ghcr.io/kptdev/krm-functions-catalog/apply-setters:v0.2"));
    assert!(defaults.allows("set-labels:v0.2.1"), "a catalog short name");
    assert!(!defaults.allows("docker.io/library/set-labels:v1"));
    assert!(ImageAllowlist::parse("*").allows("anything/at:all"));
    assert!(!ImageAllowlist::parse("").allows("set-labels:v1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_service_reports_serving() {
    let (address, _stop) = start_server(None, 6 << 20).await;
    let channel = tonic::transport::Endpoint::from_shared(address)
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let response = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "evaluator.FunctionEvaluator".into(),
        })
        .await
        .expect("health check")
        .into_inner();
    assert_eq!(
        response.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}
