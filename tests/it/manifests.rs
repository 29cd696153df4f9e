//! `infra/k8s` renders with kustomize, and what it renders matches the code:
//! every webhook calls a path the router serves, the CRD converts through
//! `/convert`, and the webhooks cover both served PackageRevision versions.

use std::path::Path;
use std::process::Command;

fn render(overlay: &str) -> Vec<serde_json::Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../infra/k8s")
        .join(overlay);
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(&dir)
        .output()
        .expect("kubectl must be installed (.ci/run checks it)");
    assert!(
        out.status.success(),
        "kubectl kustomize {overlay} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf8");
    text.split("\n---\n")
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).expect("rendered YAML parses"))
        .collect()
}

fn find<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} not rendered"))
}

const ROUTER_POST_PATHS: [&str; 3] = ["/validate", "/mutate", "/convert"];

#[test]
fn base_manifests_match_the_router_and_the_crds() {
    let docs = render("base");
    let crd = find(
        &docs,
        "CustomResourceDefinition",
        "packagerevisions.porch.kpt.dev",
    );
    let service = &crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"];
    assert_eq!(service["path"], "/convert");
    assert_eq!(service["name"], "porch-webhooks");
    let served: Vec<&str> = crd["spec"]["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .filter(|v| v["served"] == true)
        .filter_map(|v| v["name"].as_str())
        .collect();
    // the checked-in CRD is the generated one
    let generated = porch_api::crd::package_revisions().expect("crd");
    assert_eq!(served.len(), generated.spec.versions.len());

    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        let config = find(&docs, kind, "porch-webhooks");
        for hook in config["webhooks"].as_array().expect("webhooks") {
            let client = &hook["clientConfig"]["service"];
            let path = client["path"].as_str().expect("path");
            assert!(ROUTER_POST_PATHS.contains(&path), "{path} is not served");
            assert_eq!(
                client["namespace"], service["namespace"],
                "one namespace for every client"
            );
            assert_eq!(hook["timeoutSeconds"], 2);
            assert_eq!(hook["failurePolicy"], "Fail");
            assert_eq!(hook["sideEffects"], "None");
            assert_eq!(hook["matchPolicy"], "Equivalent");
            assert_eq!(hook["admissionReviewVersions"], serde_json::json!(["v1"]));
            for rule in hook["rules"].as_array().expect("rules") {
                if rule["apiGroups"] == serde_json::json!(["porch.kpt.dev"]) {
                    for version in &served {
                        assert!(
                            rule["apiVersions"]
                                .as_array()
                                .expect("versions")
                                .iter()
                                .any(|v| v == version),
                            "{} does not cover {version}",
                            hook["name"]
                        );
                    }
                }
            }
        }
    }
    // the server may only create SubjectAccessReviews
    let role = find(&docs, "ClusterRole", "porch-webhooks");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}])
    );
}

#[test]
fn overlays_render() {
    for overlay in ["overlays/cert-manager", "overlays/lambda-url"] {
        let docs = render(overlay);
        assert!(
            docs.iter()
                .any(|d| d["kind"] == "ValidatingWebhookConfiguration"),
            "{overlay}"
        );
    }
}

#[tokio::test]
async fn the_router_answers_every_configured_path() {
    use tower::ServiceExt;
    let state = porch_webhooks::AppState::new(
        porch_webhooks::config::WebhookConfig::default(),
        std::sync::Arc::new(porch_webhooks::authz::StaticAuthorizer::DenyAll),
    );
    for path in ROUTER_POST_PATHS {
        let request = http::Request::post(path)
            .body(axum::body::Body::from("{}"))
            .expect("request");
        let response = porch_webhooks::router(state.clone())
            .oneshot(request)
            .await
            .expect("response");
        assert_eq!(response.status(), http::StatusCode::OK, "{path}");
    }
}
