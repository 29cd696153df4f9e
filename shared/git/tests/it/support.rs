//! The git CLI, isolated from user and system configuration (tests only).

use std::path::Path;
use std::process::Command;

#[path = "../servers/announced.rs"]
mod announced;

/// `git` with no system or global configuration and a fixed identity.
pub(crate) fn git_command() -> Command {
    trace_logs();
    let mut command = Command::new("git");
    command
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "fixture")
        .env("GIT_AUTHOR_EMAIL", "fixture@example.com")
        .env("GIT_COMMITTER_NAME", "fixture")
        .env("GIT_COMMITTER_EMAIL", "fixture@example.com");
    command
}

/// Runs `command` and returns its stdout, failing the test on an error.
pub(crate) fn run(mut command: Command) -> String {
    let out = command.output().expect("git runs");
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

/// `git --git-dir <dir> <args>`.
pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let mut command = git_command();
    command.arg("--git-dir").arg(dir).args(args);
    run(command)
}

/// A bare repository that accepts pushes over HTTP, with `http.receivepack`.
pub(crate) fn bare_upstream(root: &Path, name: &str) -> std::path::PathBuf {
    let dir = root.join(format!("{name}.git"));
    let mut command = git_command();
    command
        .args(["init", "--bare", "-q", "-b", "main"])
        .arg(&dir);
    run(command);
    git(&dir, &["config", "http.receivepack", "true"]);
    dir
}

/// Commits `files` (path → text) on `branch` of the bare repository `dir`
/// with the git CLI (a scratch clone, then a push).
pub(crate) fn git_commit_files(dir: &Path, branch: &str, files: &[(&str, &str)], message: &str) {
    let work = tempfile::tempdir().expect("tempdir");
    let mut clone = git_command();
    clone.arg("clone").arg("-q").arg(dir).arg(work.path());
    run(clone);
    let in_work = |args: &[&str]| {
        let mut command = git_command();
        command.arg("-C").arg(work.path()).args(args);
        run(command)
    };
    let has_branch = !git(dir, &["for-each-ref", &format!("refs/heads/{branch}")]).is_empty();
    if has_branch {
        in_work(&["checkout", "-q", branch]);
    } else {
        in_work(&["checkout", "-q", "--orphan", branch]);
    }
    for (path, text) in files {
        let full = work.path().join(path);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
        std::fs::write(full, text).expect("write");
    }
    in_work(&["add", "-A"]);
    in_work(&["commit", "-q", "-m", message]);
    in_work(&["push", "-q", "origin", &format!("HEAD:refs/heads/{branch}")]);
}

/// A free loopback port (bound, read, released).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A server process killed when dropped.
pub(crate) struct Server {
    child: std::process::Child,
    pub(crate) port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The smart-HTTP test server over `root`; `auth` is a `user:password`
/// pair it then requires.
pub(crate) fn http_server(root: &Path, auth: Option<&str>) -> Server {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/git_http_server.py");
    let mut command = Command::new("python3");
    command.arg(script).arg(root).arg("0");
    if let Some(auth) = auth {
        command.env("GIT_TEST_AUTH", auth);
    }
    let (child, port) = announced::spawn_announcing(command);
    Server { child, port }
}

/// `git daemon` over `root` with receive-pack enabled. It cannot be told
/// to pick a port itself, so a port taken by another test's server between
/// choosing and binding it shows as the daemon exiting: then it is started
/// again on another port.
pub(crate) fn git_daemon(root: &Path) -> Server {
    // git-daemon itself: the `git daemon` wrapper would leave it running
    // when killed
    let exec_path = run({
        let mut c = git_command();
        c.arg("--exec-path");
        c
    });
    for _ in 0..5 {
        let port = free_port();
        let mut command = Command::new(Path::new(exec_path.trim()).join("git-daemon"));
        command
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["--reuseaddr", "--export-all", "--enable=receive-pack"])
            .arg("--listen=127.0.0.1")
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", root.display()))
            .arg(root)
            .stderr(std::process::Stdio::null());
        let mut server = Server {
            child: command.spawn().expect("git daemon runs"),
            port,
        };
        if listening_while_alive(&mut server) {
            return server;
        }
    }
    panic!("git daemon did not start on any of five ports");
}

/// Whether `server` listens, judged only while its process lives: a port
/// that answers for a process that then exits belongs to another server.
fn listening_while_alive(server: &mut Server) -> bool {
    for _ in 0..200 {
        if server.child.try_wait().ok().flatten().is_some() {
            return false;
        }
        if std::net::TcpStream::connect(("127.0.0.1", server.port)).is_ok() {
            // a daemon that failed to bind exits at once
            std::thread::sleep(std::time::Duration::from_millis(50));
            return server.child.try_wait().ok().flatten().is_none();
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("server on port {} did not start", server.port);
}

/// A TLS-terminating proxy on loopback in front of `backend_port`, with a
/// fresh self-signed certificate for `127.0.0.1`; returns its port and the
/// certificate (PEM) to trust.
pub(crate) async fn tls_proxy(backend_port: u16) -> (u16, Vec<u8>) {
    use std::sync::Arc;
    let generated =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("certificate");
    let cert_pem = generated.cert.pem().into_bytes();
    let key_pem = generated.signing_key.serialize_pem();
    let certs = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .expect("certs");
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .expect("key")
        .expect("one key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut backend) =
                    tokio::net::TcpStream::connect(("127.0.0.1", backend_port)).await
                else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut backend).await;
            });
        }
    });
    (port, cert_pem)
}

/// moto's S3 server, one request at a time (see `servers/moto_serial.py`).
pub(crate) fn moto_server() -> Server {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/moto_serial.py");
    let mut command = Command::new("python3");
    command
        .arg(script)
        .args(["127.0.0.1", "0"])
        .stderr(std::process::Stdio::null());
    let (child, port) = announced::spawn_announcing(command);
    Server { child, port }
}

/// An S3 client for a local endpoint with fixed test credentials.
pub(crate) fn s3_client(endpoint: &str, max_attempts: u32) -> aws_sdk_s3::Client {
    let options = porch_git::s3::S3Options {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        force_path_style: true,
        max_attempts,
        operation_timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    };
    let builder = aws_sdk_s3::config::Builder::new()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "testing",
            "testing-c4n4ry",
            None,
            None,
            "tests",
        ));
    aws_sdk_s3::Client::from_conf(porch_git::s3::S3Store::config(builder, &options))
}

/// A bucket on the moto server and a store on it.
pub(crate) async fn s3_store(server: &Server, bucket: &str) -> porch_git::s3::S3Store {
    let client = s3_client(&format!("http://127.0.0.1:{}", server.port), 3);
    client
        .create_bucket()
        .bucket(bucket)
        .send()
        .await
        .expect("create bucket");
    porch_git::s3::S3Store::with_client(client, bucket, "porch").expect("store")
}

/// Who asks for an operation in tests.
pub(crate) fn actor(uid: &str, generation: i64) -> porch_git::operations::Actor {
    porch_git::operations::Actor {
        uid: uid.into(),
        generation,
        author: porch_git::identity::Identity::of_user("alice@example.com"),
        time: 1_795_000_000,
    }
}

/// A small package: a Kptfile and a ConfigMap holding `version`.
pub(crate) fn files(version: &str) -> porch_git::repo::Files {
    porch_git::repo::Files::from([
        (
            "Kptfile".to_owned(),
            b"apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: basens\n".to_vec(),
        ),
        (
            "cm.yaml".to_owned(),
            format!("version: {version}\n").into_bytes(),
        ),
    ])
}

/// A bare repository `repo.git` under `root` with a README on `main`, as
/// Porch creates a branch.
pub(crate) fn upstream_with_main(root: &Path) -> std::path::PathBuf {
    let upstream = bare_upstream(root, "repo");
    git_commit_files(
        &upstream,
        "main",
        &[("README.md", "Created by porch\n")],
        "Initial commit: Creating main branch",
    );
    upstream
}

/// Sends the test's log lines, at the level `PORCH_TEST_LOG` names (none
/// when unset), to the test's output: `.ci/secrets-in-logs` runs the tests
/// at trace level and searches that output for credential values.
pub(crate) fn trace_logs() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("PORCH_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
}
