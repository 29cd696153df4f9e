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
