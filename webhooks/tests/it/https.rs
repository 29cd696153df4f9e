//! `porch-webhooks` over HTTPS on loopback: a CA made here, a client that
//! trusts only that CA, and certificate rotation without a restart.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use std::time::{Duration, Instant};

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

/// Writes a leaf for localhost signed by `ca`, atomically (rename), key first.
fn write_leaf(ca: &Ca, dir: &Path) {
    let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("params");
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &ca.issuer).expect("leaf");
    for (name, body) in [("tls.key", key.serialize_pem()), ("tls.crt", cert.pem())] {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, body).expect("write");
        std::fs::rename(&tmp, dir.join(name)).expect("rename");
    }
}

fn client_trusting(ca_pem: &str) -> reqwest::Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("add root");
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_porch-webhooks"))
        .args([
            "--addr",
            "127.0.0.1:0",
            "--tls-reload-seconds",
            "0.1",
            "--approval-check",
            "deny-all",
        ])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn porch-webhooks");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("server exited before listening")
            .expect("read");
        if let Some(addr) = line.strip_prefix("listening on ") {
            break addr.trim().to_owned();
        }
    };
    // keep draining so the child never blocks on a full pipe
    std::thread::spawn(move || for _ in lines {});
    Server { child, base }
}

#[tokio::test]
async fn serves_https_to_a_client_that_trusts_only_our_ca_and_rotates_certificates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = new_ca("porch test CA 1");
    write_leaf(&first, dir.path());
    let server = start(dir.path());
    let url = format!("{}/healthz", server.base.replace("127.0.0.1", "localhost"));

    let trusted = client_trusting(&first.pem);
    let body = trusted
        .get(&url)
        .send()
        .await
        .expect("https request")
        .text()
        .await
        .expect("body");
    assert_eq!(body, "ok");

    // a client with another CA is refused: the server really presents our leaf
    let second = new_ca("porch test CA 2");
    assert!(client_trusting(&second.pem).get(&url).send().await.is_err());

    // a real review over TLS
    let review = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/validate/fail/v1alpha2-create-as-published.json"),
    )
    .expect("fixture");
    let answer: serde_json::Value = trusted
        .post(format!(
            "{}/validate",
            server.base.replace("127.0.0.1", "localhost")
        ))
        .body(review)
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(
        answer["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );

    // rotate to a leaf of the second CA without restarting
    write_leaf(&second, dir.path());
    let rotated = client_trusting(&second.pem);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(r) = rotated.get(&url).send().await {
            assert_eq!(r.text().await.expect("body"), "ok");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        client_trusting(&first.pem).get(&url).send().await.is_err(),
        "the old certificate is still served"
    );
    let pid = server.child.id();
    drop(server);
    assert!(pid > 0);
}

#[tokio::test]
async fn a_broken_rotation_keeps_the_previous_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("porch test CA");
    write_leaf(&ca, dir.path());
    let server = start(dir.path());
    let url = format!("{}/healthz", server.base.replace("127.0.0.1", "localhost"));
    // a key that does not belong to the certificate
    std::fs::write(
        dir.path().join("tls.key"),
        KeyPair::generate().expect("key").serialize_pem(),
    )
    .expect("write");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let body = client_trusting(&ca.pem)
        .get(&url)
        .send()
        .await
        .expect("still served")
        .text()
        .await
        .expect("body");
    assert_eq!(body, "ok");
}

/// A ClientHello offering only `version` (0x0301 TLS 1.0, 0x0302 TLS 1.1),
/// with no `supported_versions` extension, as an old client sends it.
fn old_client_hello(version: [u8; 2]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&version);
    body.extend_from_slice(&[7u8; 32]); // random
    body.push(0); // no session id
    // suites rustls supports, so only the version can be the refusal
    body.extend_from_slice(&[0, 4, 0xc0, 0x2f, 0xc0, 0x2b]);
    body.extend_from_slice(&[1, 0]); // null compression
    let mut handshake = vec![1u8]; // ClientHello
    handshake.extend_from_slice(&u32::try_from(body.len()).expect("len").to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 3, 1];
    record.extend_from_slice(&u16::try_from(handshake.len()).expect("len").to_be_bytes());
    record.extend(handshake);
    record
}

fn client_with_versions(
    ca_pem: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> reqwest::Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("add root");
    }
    let config = rustls::ClientConfig::builder_with_protocol_versions(versions)
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

/// TLS 1.0 and 1.1 get a fatal alert, never a ServerHello;
/// TLS 1.2 and 1.3 clients are served.
#[tokio::test]
async fn only_tls_1_2_and_newer_are_accepted() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("porch test CA");
    write_leaf(&ca, dir.path());
    let server = start(dir.path());
    let addr = server.base.trim_start_matches("https://").to_owned();
    for (name, version) in [("TLS 1.0", [3, 1]), ("TLS 1.1", [3, 2])] {
        let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream.write_all(&old_client_hello(version)).expect("hello");
        let mut answer = [0u8; 7];
        stream.read_exact(&mut answer).expect("an answer");
        assert_eq!(answer[0], 0x15, "{name}: an alert record, not a handshake");
        // fatal (2): protocol_version (70) or handshake_failure (40)
        assert!(
            answer[5] == 2 && matches!(answer[6], 40 | 70),
            "{name}: a fatal alert, got {answer:?}"
        );
    }
    let url = format!("{}/healthz", server.base.replace("127.0.0.1", "localhost"));
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let body = client_with_versions(&ca.pem, &[version])
            .get(&url)
            .send()
            .await
            .expect("served")
            .text()
            .await
            .expect("body");
        assert_eq!(body, "ok", "{version:?}");
    }
}

/// Certificates rotate while eight clients keep sending requests: no
/// request fails, and the last certificate is what is served at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_under_load_without_failed_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (first, second) = (new_ca("porch test CA 1"), new_ca("porch test CA 2"));
    write_leaf(&first, dir.path());
    let server = start(dir.path());
    let url = format!("{}/healthz", server.base.replace("127.0.0.1", "localhost"));
    let both = client_trusting(&format!("{}{}", first.pem, second.pem));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (client, url, stop) = (both.clone(), url.clone(), std::sync::Arc::clone(&stop));
        clients.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match client.get(&url).send().await {
                    Ok(r) if r.status().is_success() => ok += 1,
                    Ok(r) => failed.push(format!("HTTP {}", r.status())),
                    Err(e) => failed.push(format!("{e:?}")),
                }
            }
            (ok, failed)
        }));
    }
    for round in 0..10 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        write_leaf(if round % 2 == 0 { &second } else { &first }, dir.path());
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for client in clients {
        let (o, f) = client.await.expect("client task");
        ok += o;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        ok as usize + failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert!(ok > 50, "only {ok} requests were made");
    // the last rotation (to the first CA) is what is served now
    let deadline = Instant::now() + Duration::from_secs(10);
    while client_trusting(&first.pem).get(&url).send().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the last certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("certificate rotation under load: {ok} requests, 0 failed, 10 rotations");
}
