//! An HTTP proxy on loopback that injects faults between the handlers and
//! a real server (the git smart-HTTP server, the S3 server): errors before
//! or after the request reached the server, 412 storms on conditional
//! writes, truncated answers, connections broken mid-answer, rejected ref
//! updates, slow answers. Seeded, counted by kind, and quiet on request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;

/// What may go wrong with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fault {
    /// HTTP 500 and the server never saw the request.
    ErrorBefore,
    /// The server did the work, the client gets HTTP 500 (was it done?).
    ErrorAfter,
    /// HTTP 412 on a conditional write the server never saw.
    PreconditionFailed,
    /// The answer's headers promise more than its body brings.
    Truncated,
    /// The server did the work; the connection breaks mid-answer.
    ResetAfter,
    /// `receive-pack` answers every ref update with `ng`, unseen by the server.
    RejectedRefs,
    /// The answer comes late.
    Slow,
    /// Held half a second, with [`FaultProxy::held`] told (a test kills
    /// the writer meanwhile), then forwarded if the writer is still there.
    Held,
}

/// Which faults a request may get.
pub(crate) type Rule = fn(&Method, &str) -> &'static [Fault];

/// S3: every kind on reads and writes, 412 on conditional writes.
pub(crate) fn s3_rule(method: &Method, path: &str) -> &'static [Fault] {
    use Fault::*;
    if *method == Method::PUT && path.ends_with("manifest.json") {
        &[
            ErrorBefore,
            ErrorAfter,
            PreconditionFailed,
            ResetAfter,
            Slow,
            Held,
            Held,
        ]
    } else if *method == Method::PUT {
        &[ErrorBefore, ErrorAfter, ResetAfter, Slow]
    } else if *method == Method::GET {
        &[ErrorBefore, Truncated, ResetAfter, Slow]
    } else {
        &[ErrorBefore, Slow]
    }
}

/// Git smart HTTP: errors and broken connections around `receive-pack`,
/// rejected ref updates, slow and truncated `upload-pack`.
pub(crate) fn git_rule(method: &Method, path: &str) -> &'static [Fault] {
    use Fault::*;
    if *method == Method::POST && path.ends_with("/git-receive-pack") {
        &[ErrorBefore, ErrorAfter, ResetAfter, RejectedRefs, Slow]
    } else if *method == Method::POST && path.ends_with("/git-upload-pack") {
        &[ErrorBefore, Truncated, ResetAfter, Slow]
    } else {
        &[ErrorBefore, Slow]
    }
}

struct Inner {
    upstream: String,
    client: reqwest::Client,
    rule: Rule,
    /// Chance of a fault per request, in percent.
    percent: u64,
    quiet: AtomicBool,
    rng: Mutex<u64>,
    injected: Mutex<BTreeMap<Fault, u64>>,
    requests: Mutex<u64>,
    held: tokio::sync::Notify,
}

/// The proxy; dropping it does not stop it (it ends with the runtime).
#[derive(Clone)]
pub(crate) struct FaultProxy(Arc<Inner>);

impl FaultProxy {
    /// Proxies to `upstream` (`http://host:port`), injecting a fault
    /// `rule` allows into `percent`% of requests.
    pub(crate) async fn start(
        upstream: &str,
        rule: Rule,
        percent: u64,
        seed: u64,
    ) -> (Self, SocketAddr) {
        let proxy = FaultProxy(Arc::new(Inner {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("client"),
            rule,
            percent,
            quiet: AtomicBool::new(false),
            rng: Mutex::new(seed | 1),
            injected: Mutex::new(BTreeMap::new()),
            requests: Mutex::new(0),
            held: tokio::sync::Notify::new(),
        }));
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(proxy.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (proxy, address)
    }

    /// No more faults from now on.
    pub(crate) fn quiet(&self) {
        self.0.quiet.store(true, Ordering::SeqCst);
    }

    /// Faults injected so far, by kind.
    pub(crate) fn injected(&self) -> BTreeMap<Fault, u64> {
        self.0.injected.lock().expect("lock").clone()
    }

    /// Resolves when a request is being held.
    pub(crate) async fn held(&self) {
        self.0.held.notified().await;
    }

    pub(crate) fn requests(&self) -> u64 {
        *self.0.requests.lock().expect("lock")
    }

    fn roll(&self, method: &Method, path: &str) -> Option<Fault> {
        *self.0.requests.lock().expect("lock") += 1;
        if self.0.quiet.load(Ordering::SeqCst) {
            return None;
        }
        let allowed = (self.0.rule)(method, path);
        let mut state = self.0.rng.lock().expect("lock");
        let mut next = || {
            // xorshift64
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state
        };
        if allowed.is_empty() || next() % 100 >= self.0.percent {
            return None;
        }
        let fault = allowed[usize::try_from(next()).unwrap_or(0) % allowed.len()];
        *self
            .0
            .injected
            .lock()
            .expect("lock")
            .entry(fault)
            .or_default() += 1;
        Some(fault)
    }
}

fn status(code: StatusCode, body: &'static str) -> Response {
    Response::builder()
        .status(code)
        .body(Body::from(body))
        .expect("response")
}

async fn forward(State(proxy): State<FaultProxy>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or_else(|| path.clone(), |p| p.as_str().to_owned());
    let Ok(body) = axum::body::to_bytes(body, 1 << 30).await else {
        return status(StatusCode::BAD_REQUEST, "unreadable request body");
    };
    let fault = proxy.roll(&parts.method, &path);
    match fault {
        Some(Fault::ErrorBefore) => {
            return status(StatusCode::INTERNAL_SERVER_ERROR, "injected error");
        }
        Some(Fault::PreconditionFailed) => {
            return Response::builder()
                .status(StatusCode::PRECONDITION_FAILED)
                .header("content-type", "application/xml")
                .body(Body::from(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message></Error>",
                ))
                .expect("response");
        }
        Some(Fault::RejectedRefs) => return rejected_refs(&body),
        Some(Fault::Slow) => tokio::time::sleep(Duration::from_millis(400)).await,
        Some(Fault::Held) => {
            proxy.0.held.notify_one();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        _ => {}
    }
    let mut headers = parts.headers.clone();
    headers.remove("host");
    let answer = proxy
        .0
        .client
        .request(
            parts.method.clone(),
            format!("{}{path_and_query}", proxy.0.upstream),
        )
        .headers(headers)
        .body(body)
        .send()
        .await;
    let answer = match answer {
        Ok(answer) => answer,
        Err(_) => return status(StatusCode::BAD_GATEWAY, "upstream unreachable"),
    };
    let code = answer.status();
    let mut headers = HeaderMap::new();
    for (name, value) in answer.headers() {
        if name != "transfer-encoding" && name != "connection" {
            headers.insert(name.clone(), value.clone());
        }
    }
    let Ok(bytes) = answer.bytes().await else {
        return status(StatusCode::BAD_GATEWAY, "upstream answer broke");
    };
    let body = match fault {
        Some(Fault::ErrorAfter) => {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "injected error after the work",
            );
        }
        Some(Fault::Truncated | Fault::ResetAfter) if bytes.len() > 1 => {
            // half the promised bytes, then the connection breaks
            headers.insert(
                "content-length",
                HeaderValue::from_str(&bytes.len().to_string()).expect("header"),
            );
            let half = bytes.slice(..bytes.len() / 2);
            Body::from_stream(tokio_stream::iter(vec![
                Ok::<Bytes, std::io::Error>(half),
                Err(std::io::Error::other("injected connection reset")),
            ]))
        }
        _ => {
            // the length of what is sent (hyper sets it), except for HEAD,
            // whose length is that of the body it does not carry
            if parts.method != Method::HEAD {
                headers.remove("content-length");
            }
            Body::from(bytes)
        }
    };
    let mut response = Response::builder().status(code);
    if let Some(h) = response.headers_mut() {
        *h = headers;
    }
    response.body(body).expect("response")
}

/// A `report-status` refusing every command of a `receive-pack` request.
fn rejected_refs(request: &[u8]) -> Response {
    let mut refs = Vec::new();
    let mut sideband = false;
    let mut rest = request;
    while rest.len() >= 4 {
        let Some(len) = std::str::from_utf8(&rest[..4])
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
        else {
            break;
        };
        if len == 0 || len > rest.len() {
            break;
        }
        let line = String::from_utf8_lossy(&rest[4..len]);
        let mut halves = line.split('\0');
        let command = halves.next().unwrap_or_default().trim_end();
        sideband |= halves
            .next()
            .is_some_and(|caps| caps.contains("side-band-64k"));
        if let Some(name) = command.split(' ').nth(2) {
            refs.push(name.to_owned());
        }
        rest = &rest[len..];
    }
    let pkt = |text: &str| format!("{:04x}{text}", text.len() + 4);
    let mut report = pkt("unpack ok\n");
    for name in &refs {
        report.push_str(&pkt(&format!("ng {name} injected rejection\n")));
    }
    report.push_str("0000");
    let answer = if sideband {
        // on band 1, as the client asked for side-band-64k
        let mut band = vec![1u8];
        band.extend(report.into_bytes());
        let mut answer = format!("{:04x}", band.len() + 4).into_bytes();
        answer.extend(band);
        answer.extend_from_slice(b"0000");
        answer
    } else {
        report.into_bytes()
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/x-git-receive-pack-result")
        .body(Body::from(answer))
        .expect("response")
}
