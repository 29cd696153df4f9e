//! The function runner over TLS: a CA made here, a gRPC client that trusts
//! only that CA, TLS 1.2+ only, and a certificate rotated without a restart
//! while evaluations go on.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use porch_krm::grpc::{ClientOptions, GrpcRuntime};
use porch_krm::render::{RenderOptions, render};
use porch_krm::runtime::Runtimes;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn new_ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed CA");
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A leaf for localhost signed by `ca`, written atomically, key first.
fn write_leaf(ca: &Ca, dir: &Path) {
    let params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &ca.issuer).expect("leaf");
    for (name, body) in [("tls.key", key.serialize_pem()), ("tls.crt", cert.pem())] {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, body).expect("write");
        std::fs::rename(&tmp, dir.join(name)).expect("rename");
    }
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path) -> Server {
    let mut child = Command::new(super::FN_RUNNER)
        .args(["serve", "--address", "127.0.0.1:0"])
        .args(["--metrics-address", "127.0.0.1:0"])
        .args(["--tls-reload-seconds", "0.1"])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fn-runner");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = loop {
        let line = lines.next().expect("fn-runner exited").expect("read");
        if let Some(addr) = line.strip_prefix("listening on https://") {
            break addr.trim().parse().expect("address");
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server { child, addr }
}

/// A gRPC channel over TLS (ALPN h2) trusting only `ca_pem`.
async fn channel(
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("add root");
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let name = rustls::pki_types::ServerName::try_from("localhost")
                    .map_err(std::io::Error::other)?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
}

/// Renders a package whose one function the runner evaluates.
async fn evaluate(channel: tonic::transport::Channel) -> Result<(), String> {
    let runtime = Runtimes::new().with(Arc::new(GrpcRuntime::new(
        channel,
        tokio::runtime::Handle::current(),
        ClientOptions::default(),
    )));
    let files: std::collections::BTreeMap<String, Vec<u8>> = [
        ("Kptfile", "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: p\npipeline:\n  mutators:\n  - image: set-namespace:v0.4\n    configMap:\n      namespace: prod\n"),
        ("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n"),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_owned(), c.as_bytes().to_vec()))
    .collect();
    let rendered =
        tokio::task::spawn_blocking(move || render(&files, &runtime, &RenderOptions::default()))
            .await
            .map_err(|e| e.to_string())?;
    match rendered.error {
        None if String::from_utf8_lossy(&rendered.files["cm.yaml"]).contains("namespace: prod") => {
            Ok(())
        }
        None => Err("the function did not run".into()),
        Some(e) => Err(format!("{e:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_serves_grpc_over_tls_1_2_and_newer_and_rotates_its_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (first, second) = (new_ca("fn-runner test CA 1"), new_ca("fn-runner test CA 2"));
    write_leaf(&first, dir.path());
    let server = start(dir.path());

    let trusted = channel(server.addr, &first.pem).await.expect("TLS channel");
    evaluate(trusted.clone())
        .await
        .expect("an evaluation over TLS");
    assert!(
        channel(server.addr, &second.pem).await.is_err(),
        "a client of another CA is refused"
    );

    // TLS 1.0 and 1.1 hellos get a fatal alert, never a ServerHello
    for version in [[3u8, 1], [3, 2]] {
        let mut stream = std::net::TcpStream::connect(server.addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream.write_all(&old_client_hello(version)).expect("hello");
        let mut answer = [0u8; 7];
        stream.read_exact(&mut answer).expect("an answer");
        assert_eq!(answer[0], 0x15, "{version:?}: an alert record");
        assert!(answer[5] == 2 && matches!(answer[6], 40 | 70), "{answer:?}");
    }

    // rotate while evaluations go on over the open channel
    let load = tokio::spawn({
        let trusted = trusted.clone();
        async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            let until = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < until {
                match evaluate(trusted.clone()).await {
                    Ok(()) => ok += 1,
                    Err(e) => failed.push(e),
                }
            }
            (ok, failed)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_leaf(&second, dir.path());
    let deadline = Instant::now() + Duration::from_secs(10);
    let rotated = loop {
        if let Ok(channel) = channel(server.addr, &second.pem).await {
            break channel;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    evaluate(rotated)
        .await
        .expect("an evaluation with the new certificate");
    let (ok, failed) = load.await.expect("load");
    assert!(failed.is_empty(), "{failed:?}");
    assert!(ok > 0, "no evaluation ran during the rotation");
    assert!(
        channel(server.addr, &first.pem).await.is_err(),
        "the old certificate is still served"
    );
}

/// A ClientHello offering only `version`, as an old client sends it.
fn old_client_hello(version: [u8; 2]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&version);
    body.extend_from_slice(&[7u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 4, 0xc0, 0x2f, 0xc0, 0x2b]);
    body.extend_from_slice(&[1, 0]);
    let mut handshake = vec![1u8];
    handshake.extend_from_slice(&u32::try_from(body.len()).expect("len").to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 3, 1];
    record.extend_from_slice(&u16::try_from(handshake.len()).expect("len").to_be_bytes());
    record.extend(handshake);
    record
}
