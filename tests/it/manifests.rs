//! `infra/k8s` renders with kustomize, and what it renders matches the code:
//! every webhook calls a path the router serves, the CRD converts through
//! `/convert`, the webhooks cover both served PackageRevision versions, every
//! served version of every CRD is validated by a kind `/validate` handles, and
//! every overlay reaches every webhook.

use std::path::Path;
use std::process::Command;

pub(crate) fn render(overlay: &str) -> Vec<serde_json::Value> {
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

pub(crate) fn find<'a>(
    docs: &'a [serde_json::Value],
    kind: &str,
    name: &str,
) -> &'a serde_json::Value {
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

/// `(group, version, plural, kind)` of every served version of every CRD.
fn served_resources(docs: &[serde_json::Value]) -> Vec<(String, String, String, String)> {
    let mut served = Vec::new();
    for crd in docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
    {
        let spec = &crd["spec"];
        let text = |v: &serde_json::Value| v.as_str().expect("a string").to_owned();
        for version in spec["versions"].as_array().expect("versions") {
            if version["served"] == true {
                served.push((
                    text(&spec["group"]),
                    text(&version["name"]),
                    text(&spec["names"]["plural"]),
                    text(&spec["names"]["kind"]),
                ));
            }
        }
    }
    served
}

fn strings(value: &serde_json::Value) -> Vec<&str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect()
}

#[tokio::test]
async fn every_served_resource_is_validated_by_a_kind_the_router_handles() {
    use tower::ServiceExt;
    let docs = render("base");
    let validating = find(&docs, "ValidatingWebhookConfiguration", "porch-webhooks");
    let state = porch_webhooks::AppState::new(
        porch_webhooks::config::WebhookConfig::default(),
        std::sync::Arc::new(porch_webhooks::authz::StaticAuthorizer::DenyAll),
    );
    let served = served_resources(&docs);
    assert_eq!(served.len(), 5, "{served:?}");
    for (group, version, plural, kind) in served {
        let covered = validating["webhooks"]
            .as_array()
            .expect("webhooks")
            .iter()
            .filter(|hook| hook["clientConfig"]["service"]["path"] == "/validate")
            .flat_map(|hook| hook["rules"].as_array().into_iter().flatten())
            .any(|rule| {
                strings(&rule["apiGroups"]).contains(&group.as_str())
                    && strings(&rule["apiVersions"]).contains(&version.as_str())
                    && strings(&rule["resources"]).contains(&plural.as_str())
                    && ["CREATE", "UPDATE"]
                        .iter()
                        .all(|op| strings(&rule["operations"]).contains(op))
            });
        assert!(
            covered,
            "no CREATE and UPDATE rule for {group}/{version} {plural}"
        );
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": plural},
                "name": "x",
                "namespace": "porch-demo",
                "operation": "CREATE",
                "userInfo": {"username": "alice@example.com"},
                "object": {
                    "apiVersion": format!("{group}/{version}"),
                    "kind": kind,
                    "metadata": {"name": "x", "namespace": "porch-demo"},
                    "spec": {},
                },
            },
        });
        let response = porch_webhooks::router(state.clone())
            .oneshot(
                http::Request::post("/validate")
                    .body(axum::body::Body::from(review.to_string()))
                    .expect("request"),
            )
            .await
            .expect("response");
        let bytes = http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("body")
            .to_bytes();
        let answer: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            !message.starts_with("unsupported kind"),
            "{group}/{version} {kind}: {message}"
        );
    }
}

/// The admission webhook names of a configuration document.
fn hook_names(config: &serde_json::Value) -> Vec<&str> {
    config["webhooks"]
        .as_array()
        .expect("webhooks")
        .iter()
        .filter_map(|hook| hook["name"].as_str())
        .collect()
}

#[test]
fn overlays_render() {
    let base = render("base");
    for overlay in ["overlays/cert-manager", "overlays/lambda-url"] {
        let docs = render(overlay);
        for kind in [
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
        ] {
            let config = find(&docs, kind, "porch-webhooks");
            assert_eq!(
                hook_names(config),
                hook_names(find(&base, kind, "porch-webhooks")),
                "{overlay}"
            );
            if overlay.ends_with("lambda-url") {
                // every webhook calls the function URL, none the Service
                for hook in config["webhooks"].as_array().expect("webhooks") {
                    let client = &hook["clientConfig"];
                    assert!(client["service"].is_null(), "{}", hook["name"]);
                    assert!(
                        client["url"]
                            .as_str()
                            .is_some_and(|url| url.starts_with("https://")),
                        "{}",
                        hook["name"]
                    );
                }
            }
        }
    }
    // static-ca needs the operator's certificate files to render: its patch
    // must still name every webhook, or one is left without a CA
    let patch = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../infra/k8s/overlays/static-ca/ca-bundle-patch.yaml"),
    )
    .expect("static-ca patch");
    let patched: Vec<serde_json::Value> = patch
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str(doc).expect("patch parses"))
        .collect();
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        let config = find(&patched, kind, "porch-webhooks");
        assert_eq!(
            hook_names(config),
            hook_names(find(&base, kind, "porch-webhooks")),
            "static-ca"
        );
        for hook in config["webhooks"].as_array().expect("webhooks") {
            assert!(
                hook["clientConfig"]["caBundle"].is_string(),
                "{}",
                hook["name"]
            );
        }
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

#[tokio::test]
async fn the_relay_manifests_match_the_relay() {
    use tower::ServiceExt;
    let docs = render("relay");
    let deployment = find(&docs, "Deployment", "porch-relay");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    assert_eq!(pod["spec"]["serviceAccountName"], "porch-relay");

    // the webhook Service never selects the relay's pods
    let base = render("base");
    let selector = &find(&base, "Service", "porch-webhooks")["spec"]["selector"];
    let labels = &pod["metadata"]["labels"];
    assert!(
        selector
            .as_object()
            .expect("selector")
            .iter()
            .any(|(k, v)| labels[k] != *v),
        "{labels} matches the webhook Service selector {selector}"
    );

    // the probes ask the relay's own router, on the port it listens on
    assert!(
        container["args"]
            .as_array()
            .expect("args")
            .iter()
            .any(|a| a == "--listen=0.0.0.0:8081")
    );
    assert_eq!(container["ports"][0]["containerPort"], 8081);
    let health = porch_relay::server::Health {
        ready: Vec::new(),
        leading: None,
        metrics: std::sync::Arc::new(String::new),
    };
    for probe in ["readinessProbe", "livenessProbe"] {
        let path = container[probe]["httpGet"]["path"].as_str().expect("path");
        let response = porch_relay::server::router(health.clone())
            .oneshot(
                http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .expect("request"),
            )
            .await
            .expect("response");
        assert_eq!(response.status(), http::StatusCode::OK, "{probe} {path}");
    }
    // the Lease's holder and namespace come from the downward API
    let env: Vec<(&str, &str)> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?,
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str()?,
            ))
        })
        .collect();
    assert!(env.contains(&("POD_NAME", "metadata.name")), "{env:?}");
    assert!(
        env.contains(&("POD_NAMESPACE", "metadata.namespace")),
        "{env:?}"
    );

    // least privilege: exactly the resources the relay's cluster writes,
    // no Secrets
    let role = find(&docs, "ClusterRole", "porch-relay");
    let rules = role["rules"].as_array().expect("rules");
    let plural =
        |api_version: &str, kind: &str| porch_relay::kube::resource(api_version, kind).plural;
    let verbs = |resource: &str| -> Vec<&str> {
        rules
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|x| x == resource))
            })
            .flat_map(|r| r["verbs"].as_array().into_iter().flatten())
            .filter_map(|v| v.as_str())
            .collect()
    };
    let revisions = plural("porch.kpt.dev/v1alpha2", "PackageRevision");
    assert_eq!(
        verbs(&revisions),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    assert_eq!(verbs(&format!("{revisions}/status")), ["patch"]);
    let repositories = plural("config.porch.kpt.dev/v1alpha1", "Repository");
    assert_eq!(verbs(&repositories), ["get", "list", "watch"]);
    assert_eq!(verbs(&format!("{repositories}/status")), ["patch"]);
    let variants = plural("config.porch.kpt.dev/v1alpha1", "PackageVariant");
    assert_eq!(
        verbs(&variants),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    assert_eq!(verbs(&format!("{variants}/status")), ["patch"]);
    let sets = plural("config.porch.kpt.dev/v1alpha2", "PackageVariantSet");
    assert_eq!(verbs(&sets), ["get", "list", "watch", "patch"]);
    assert_eq!(verbs(&format!("{sets}/status")), ["patch"]);
    // injection reads and watches ConfigMaps; nothing writes them
    assert_eq!(verbs("configmaps"), ["get", "list", "watch"]);
    assert_eq!(verbs("events"), ["create"]);
    assert!(verbs("secrets").is_empty());
    let lease = find(&docs, "Role", "porch-relay-leader-election");
    assert_eq!(
        lease["rules"],
        serde_json::json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}])
    );
}
