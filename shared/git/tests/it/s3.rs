//! The S3 store against moto's S3 server (the same semantics as the local
//! store, under concurrency too) and against scripted faults (wiremock).

use crate::store::{concurrent_writers, conditional_semantics};
use crate::support::{moto_server, s3_client, s3_store};
use porch_git::s3::S3Store;
use porch_git::store::{ETag, Fetched, ObjectStore, PutCondition, StoreError};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn conditional_writes_on_s3() {
    let server = moto_server();
    let store = s3_store(&server, "semantics").await;
    conditional_semantics(&store).await;
    // keys live under the prefix, and the prefix is not shown back
    store
        .put("x/y", b"1".to_vec(), PutCondition::Always)
        .await
        .expect("put");
    let raw = s3_client(&format!("http://127.0.0.1:{}", server.port), 1)
        .get_object()
        .bucket("semantics")
        .key("porch/x/y")
        .send()
        .await
        .expect("raw get");
    assert_eq!(raw.content_length(), Some(1));
    assert_eq!(store.list("x/").await.expect("list"), vec!["x/y"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_on_s3_lose_nothing() {
    let server = moto_server();
    let store = s3_store(&server, "race").await;
    concurrent_writers(store).await;
}

#[tokio::test]
async fn hostile_keys_never_reach_s3() {
    let server = moto_server();
    let store = s3_store(&server, "keys").await;
    for key in ["../escape", "/abs", "a//b", "a\\b", "a\u{0}b", ""] {
        let err = store
            .put(key, vec![1], PutCondition::Always)
            .await
            .expect_err(key);
        assert!(
            matches!(err, StoreError::InvalidKey { .. }),
            "{key:?}: {err}"
        );
    }
    assert!(S3Store::with_client(s3_client("http://127.0.0.1:1", 1), "", "p").is_err());
    assert!(S3Store::with_client(s3_client("http://127.0.0.1:1", 1), "b", "../p").is_err());
}

const S3_ERROR: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>CODE</Code><Message>MESSAGE</Message><RequestId>1</RequestId></Error>"#;

fn s3_error(status: u16, code: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("content-type", "application/xml")
        .set_body_string(S3_ERROR.replace("CODE", code).replace("MESSAGE", message))
}

async fn faulty(max_attempts: u32) -> (MockServer, S3Store) {
    let mock = MockServer::start().await;
    let store = S3Store::with_client(s3_client(&mock.uri(), max_attempts), "b", "").expect("store");
    (mock, store)
}

#[tokio::test]
async fn server_errors_are_transient_with_a_clear_message() {
    let (mock, store) = faulty(1).await;
    Mock::given(method("PUT"))
        .respond_with(s3_error(
            503,
            "SlowDown",
            "Please reduce your request rate.",
        ))
        .mount(&mock)
        .await;
    Mock::given(method("GET"))
        .respond_with(s3_error(
            500,
            "InternalError",
            "We encountered an internal error.",
        ))
        .mount(&mock)
        .await;
    let err = store
        .put("m.json", b"{}".to_vec(), PutCondition::IfAbsent)
        .await
        .expect_err("503");
    assert!(err.is_transient(), "{err:?}");
    assert!(err.to_string().contains("SlowDown"), "{err}");
    let err = store.get("m.json").await.expect_err("500");
    assert!(err.is_transient(), "{err:?}");
    assert!(err.to_string().contains("HTTP 500"), "{err}");
}

/// The SDK's own retries get through a short burst of 503s.
#[tokio::test]
async fn sdk_retries_ride_out_a_burst() {
    let (mock, store) = faulty(3).await;
    Mock::given(method("PUT"))
        .respond_with(s3_error(503, "SlowDown", "slow down"))
        .up_to_n_times(2)
        .mount(&mock)
        .await;
    Mock::given(method("PUT"))
        .respond_with(ResponseTemplate::new(200).insert_header("etag", "\"abc\""))
        .mount(&mock)
        .await;
    let tag = store
        .put("m.json", b"{}".to_vec(), PutCondition::IfAbsent)
        .await
        .expect("third attempt");
    assert_eq!(tag, ETag("\"abc\"".into()));
}

#[tokio::test]
async fn precondition_answers_are_typed() {
    let (mock, store) = faulty(1).await;
    Mock::given(method("PUT"))
        .and(path("/b/412"))
        .respond_with(s3_error(
            412,
            "PreconditionFailed",
            "At least one of the pre-conditions you specified did not hold",
        ))
        .mount(&mock)
        .await;
    Mock::given(method("PUT"))
        .and(path("/b/409"))
        .respond_with(s3_error(
            409,
            "ConditionalRequestConflict",
            "A conflicting conditional operation is currently in progress",
        ))
        .mount(&mock)
        .await;
    Mock::given(method("GET"))
        .and(path("/b/304"))
        .respond_with(ResponseTemplate::new(304))
        .mount(&mock)
        .await;
    Mock::given(method("GET"))
        .and(path("/b/404"))
        .respond_with(s3_error(
            404,
            "NoSuchKey",
            "The specified key does not exist.",
        ))
        .mount(&mock)
        .await;
    for key in ["412", "409"] {
        let err = store
            .put(key, vec![1], PutCondition::IfMatch(ETag("\"x\"".into())))
            .await
            .expect_err(key);
        assert!(
            matches!(err, StoreError::PreconditionFailed { .. }),
            "{key}: {err:?}"
        );
    }
    assert_eq!(
        store
            .get_if_changed("304", Some(&ETag("\"x\"".into())))
            .await
            .expect("304"),
        Fetched::NotModified
    );
    assert_eq!(store.get("404").await.expect("404"), None);
}

/// A body shorter than its announced length is an error, never a short
/// manifest or pack taken as whole.
#[tokio::test]
async fn truncated_bodies_are_errors() {
    let (mock, store) = faulty(1).await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("etag", "\"abc\"")
                .insert_header("content-length", "100")
                .set_body_bytes(b"{\"format\":1".to_vec()),
        )
        .mount(&mock)
        .await;
    let err = store.get("m.json").await.expect_err("truncated");
    assert!(err.is_transient(), "{err:?}");
}

#[tokio::test]
async fn unreachable_store_is_transient() {
    let port = crate::support::free_port();
    let store = S3Store::with_client(s3_client(&format!("http://127.0.0.1:{port}"), 1), "b", "")
        .expect("store");
    let err = store.get("m.json").await.expect_err("refused");
    assert!(err.is_transient(), "{err:?}");
}

/// A store slower than the operation timeout is a transient error.
#[tokio::test]
async fn slow_answers_time_out_as_transient() {
    let mock = MockServer::start().await;
    let options = porch_git::s3::S3Options {
        endpoint: Some(mock.uri()),
        region: Some("us-east-1".into()),
        force_path_style: true,
        max_attempts: 1,
        operation_timeout: std::time::Duration::from_millis(300),
        ..Default::default()
    };
    let builder = aws_sdk_s3::config::Builder::new()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "testing", "testing", None, None, "tests",
        ));
    let client = aws_sdk_s3::Client::from_conf(S3Store::config(builder, &options));
    let store = S3Store::with_client(client, "b", "").expect("store");
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_delay(std::time::Duration::from_secs(3)))
        .mount(&mock)
        .await;
    let started = std::time::Instant::now();
    let err = store.get("m.json").await.expect_err("timeout");
    assert!(err.is_transient(), "{err:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}

/// A failing store is reported as such: the snapshot is not declared
/// corrupt and rebuilt over a store that cannot be written anyway.
#[tokio::test]
async fn a_failing_store_is_not_a_corrupt_snapshot() {
    let (mock, store) = faulty(1).await;
    Mock::given(method("GET"))
        .respond_with(s3_error(503, "SlowDown", "slow down"))
        .mount(&mock)
        .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let snapshots = porch_git::snapshot::Snapshots::new(store, "repos/ns/r", tmp.path().join("m"))
        .expect("snapshots");
    let remote = porch_git::remote::LocalRemote::new(tmp.path().join("nowhere"));
    let err = snapshots.prepare(&remote).await.expect_err("store down");
    assert!(
        matches!(&err, porch_git::snapshot::SnapshotError::Store(e) if e.is_transient()),
        "{err:?}"
    );
}
