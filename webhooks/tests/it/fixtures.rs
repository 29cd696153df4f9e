//! Real-shaped AdmissionReview and ConversionReview fixtures under
//! `tests/fixtures/{validate,mutate,convert}/{pass,fail}/`. Each `<name>.json`
//! is sent to its endpoint; the answer must match `<name>.expected.json`
//! (patches shown decoded). `pass/` must be allowed or converted, `fail/`
//! denied or failed. `UPDATE_FIXTURES=1` rewrites the expected files.

use crate::support::{call, json, state};
use base64::Engine as _;
use http::StatusCode;
use porch_webhooks::config::WebhookConfig;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The answer with its base64 patch decoded, so expected files are readable.
fn readable(mut answer: Value) -> Value {
    if let Some(patch) = answer["response"]["patch"].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .expect("patch is base64");
        answer["response"]["patch"] = serde_json::from_slice(&bytes).expect("patch is JSON");
    }
    answer
}

fn succeeded(endpoint: &str, answer: &Value) -> bool {
    match endpoint {
        "convert" => answer["response"]["result"]["status"] == "Success",
        _ => answer["response"]["allowed"] == true,
    }
}

#[tokio::test]
async fn every_fixture_gets_its_expected_answer() {
    let update = std::env::var_os("UPDATE_FIXTURES").is_some();
    let state = state(WebhookConfig::default());
    let mut checked = 0;
    let mut problems = Vec::new();
    for endpoint in ["validate", "mutate", "convert"] {
        for outcome in ["pass", "fail"] {
            let dir = fixture_dir().join(endpoint).join(outcome);
            let mut files: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|e| e.expect("entry").path())
                .filter(|p| {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    name.ends_with(".json") && !name.ends_with(".expected.json")
                })
                .collect();
            files.sort();
            for input in files {
                let body = std::fs::read(&input).expect("read fixture");
                let (status, bytes) = call(&state, "POST", &format!("/{endpoint}"), body).await;
                let label = input
                    .strip_prefix(fixture_dir())
                    .unwrap_or(&input)
                    .display()
                    .to_string();
                if status != StatusCode::OK {
                    problems.push(format!("{label}: HTTP {status}"));
                    continue;
                }
                let answer = readable(json(&bytes));
                if succeeded(endpoint, &answer) != (outcome == "pass") {
                    problems.push(format!("{label}: expected {outcome}, got {answer}"));
                }
                let expected_path = input.with_extension("expected.json");
                let pretty = serde_json::to_string_pretty(&answer).expect("pretty") + "\n";
                if update {
                    std::fs::write(&expected_path, &pretty).expect("write expected");
                } else {
                    match std::fs::read_to_string(&expected_path) {
                        Ok(expected) if json(expected.as_bytes()) == answer => {}
                        Ok(expected) => problems.push(format!(
                            "{label}: answer differs\n--- expected\n{expected}\n--- got\n{pretty}"
                        )),
                        Err(_) => problems.push(format!("{label}: no {}", expected_path.display())),
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 60, "only {checked} fixtures found");
    assert!(
        problems.is_empty(),
        "{} fixture problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// `/validate` reads v1alpha2 PackageRevision reviews in one pass; every
/// fixture must get the same verdict that way as through the generic reader.
#[test]
fn the_one_pass_reader_agrees_with_the_generic_one() {
    use porch_webhooks::{review, validate};
    let config = WebhookConfig::default();
    let mut fast = 0;
    for outcome in ["pass", "fail"] {
        let dir = fixture_dir().join("validate").join(outcome);
        for entry in std::fs::read_dir(&dir).expect("dir") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            if !name.ends_with(".json") || name.ends_with(".expected.json") {
                continue;
            }
            let body = std::fs::read(&path).expect("read");
            let Some(one_pass) = review::parse_revision_review(&body) else {
                continue;
            };
            fast += 1;
            let generic = review::parse(&body).expect("the generic reader reads it too");
            let expected = validate::package_revision(&generic, &config);
            let (_, got) = validate::package_revision_review(one_pass, &config);
            assert_eq!(got, expected, "{name}");
        }
    }
    assert!(fast >= 30, "only {fast} fixtures took the one-pass reader");
}
