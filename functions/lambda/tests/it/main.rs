//! The Lambda functions: the example events, `invoke` on good and hostile
//! input, and the binary served by a Lambda Runtime API on loopback.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use porch_api::invocation::Invocation;
use porch_lambda::{INVALID, RETRYABLE, invoke};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

mod fault_proxy;
mod faults;
mod relay_http;
mod runtime_api;
use runtime_api::RuntimeApi;

fn functions_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(["-c", "safe.directory=*"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn event(operation: &str, name: &str) -> Value {
    let path = functions_dir().join(operation).join("events").join(name);
    serde_json::from_slice(&std::fs::read(&path).expect("event file")).expect("json")
}

/// An event pointed at the bare repository `repo`.
fn pointed(mut event: Value, repo: &Path) -> Value {
    event["repository"]["spec"]["git"]["repo"] = json!(repo.display().to_string());
    event
}

#[test]
fn every_example_event_is_an_invocation_of_its_function() {
    let mut seen = 0;
    for operation in [
        "adopt",
        "source",
        "render",
        "lifecycle",
        "delete",
        "sync",
        "variant",
    ] {
        let dir = functions_dir().join(operation).join("events");
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(!names.is_empty(), "{operation} has example events");
        for name in names {
            seen += 1;
            let bytes = std::fs::read(dir.join(&name)).expect("read");
            let parsed = Invocation::from_json(&bytes);
            if name.starts_with("invalid-") {
                assert!(parsed.is_err(), "{operation}/{name} should be refused");
            } else {
                let invocation = parsed.unwrap_or_else(|e| panic!("{operation}/{name}: {e}"));
                assert_eq!(invocation.operation.as_str(), operation, "{name}");
            }
        }
    }
    assert!(seen >= 8);
}

#[tokio::test]
async fn invoke_answers_outcomes_and_typed_errors() {
    let tmp = tempfile::tempdir().expect("tmp");
    let bare = tmp.path().join("repo.git");
    git(
        tmp.path(),
        &["init", "--bare", "-q", "-b", "main", "repo.git"],
    );
    let config = porch_lambda::Config {
        cache_dir: tmp.path().join("cache"),
        ..Default::default()
    };
    let runner = config.runner().await.expect("runner");
    let init = pointed(event("source", "init.json"), &bare);
    let op = porch_api::invocation::Operation::Source;

    let hostile = |mut e: Value, pointer: &str, value: Value| {
        let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
        e.pointer_mut(parent).expect("parent")[key] = value;
        e
    };
    let refused = [
        (
            event("source", "invalid-wrong-version.json"),
            "porch.kpt.dev/v1alpha2",
        ),
        (json!("not an object"), "invalid invocation"),
        (json!({"operation": "source"}), "repository must be"),
        (
            hostile(init.clone(), "/operation", json!("render")),
            "this function runs source invocations, not render",
        ),
        (
            hostile(init.clone(), "/operation", json!("explode")),
            "unknown variant",
        ),
        (
            hostile(
                init.clone(),
                "/packageRevision/spec/packageName",
                json!("../../etc"),
            ),
            "'.' and '..'",
        ),
        (
            hostile(
                init.clone(),
                "/packageRevision/spec/workspaceName",
                json!("v1/../x"),
            ),
            "workspace",
        ),
        (
            hostile(init.clone(), "/packageRevision/spec/sneaky", json!(1)),
            "unknown field",
        ),
        (
            hostile(
                init.clone(),
                "/repository/spec/git/repo",
                json!("ssh://git@example.com/x.git"),
            ),
            "",
        ),
        (
            hostile(init.clone(), "/requestId", json!("x".repeat(7 << 20))),
            "at most",
        ),
    ];
    for (event, expected) in refused {
        let error = invoke(&runner, op, &event)
            .await
            .expect_err(&format!("refused ({expected})"));
        assert_eq!(error.error_type, INVALID, "{}", error.error_message);
        assert!(
            error.error_message.contains(expected),
            "{expected:?} in {}",
            error.error_message
        );
    }
    assert_eq!(git(&bare, &["for-each-ref"]), "", "nothing written");

    // An unreachable remote is worth retrying.
    let unreachable = hostile(
        init.clone(),
        "/repository/spec/git/repo",
        json!("http://127.0.0.1:1/x.git"),
    );
    let error = invoke(&runner, op, &unreachable)
        .await
        .expect_err("unreachable");
    assert_eq!(error.error_type, RETRYABLE, "{}", error.error_message);

    // The real thing, twice: the same Outcome, one commit.
    let first = invoke(&runner, op, &init).await.expect("outcome");
    let second = invoke(&runner, op, &init).await.expect("outcome");
    assert_eq!(first, second);
    assert!(
        first["patches"][0]["patch"]
            .to_string()
            .contains("\"creationSource\":\"init\""),
        "{first}"
    );
    assert_eq!(
        git(&bare, &["rev-list", "--count", "drafts/hello/v1"]).trim(),
        "1"
    );
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_invocations_from_the_runtime_api() {
    let tmp = tempfile::tempdir().expect("tmp");
    let bare = tmp.path().join("repo.git");
    git(
        tmp.path(),
        &["init", "--bare", "-q", "-b", "main", "repo.git"],
    );
    let init = pointed(event("source", "init.json"), &bare);
    let (api, address) = RuntimeApi::start().await;
    let _child = Child(
        Command::new(env!("CARGO_BIN_EXE_porch-handler"))
            .env("PORCH_OPERATION", "source")
            .envs(RuntimeApi::env(address, "porch-source"))
            .env("PORCH_CACHE_DIR", tmp.path().join("cache"))
            .env("PORCH_LOG", "warn")
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("porch-handler starts"),
    );
    let call = |event| tokio::time::timeout(Duration::from_secs(60), api.call(event));
    let first = call(init.clone()).await.expect("answered");
    let second = call(init.clone()).await.expect("answered");
    let refused = call(event("source", "invalid-wrong-version.json"))
        .await
        .expect("answered");
    assert_eq!(first.0, "response", "{first:?}");
    assert_eq!(first, second, "a redelivery gets the same Outcome");
    assert!(first.1["patches"].is_array(), "{first:?}");
    assert_eq!(refused.0, "error");
    assert_eq!(refused.1["errorType"], INVALID);
    assert_eq!(
        git(&bare, &["rev-list", "--count", "drafts/hello/v1"]).trim(),
        "1"
    );
}
