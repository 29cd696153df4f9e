//! The checked-in CRDs under `infra/crds/` are what the types generate.

use porch_api::crd;
use std::path::Path;

#[test]
fn checked_in_crds_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../infra/crds");
    for (file, definition) in crd::all().expect("crds") {
        let want = crd::to_yaml(&definition).expect("yaml");
        let got = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        assert!(
            got == want,
            "infra/crds/{file} is stale: run `cargo run -p porch-webhooks --bin crdgen` and commit the result"
        );
    }
}

#[test]
fn package_revisions_serve_both_versions_and_store_v1alpha2() {
    let prs = crd::package_revisions().expect("crd");
    let versions: Vec<_> = prs
        .spec
        .versions
        .iter()
        .map(|v| (v.name.as_str(), v.served, v.storage))
        .collect();
    assert_eq!(
        versions,
        vec![("v1alpha2", true, true), ("v1alpha1", true, false)]
    );
    let conversion = prs.spec.conversion.as_ref().expect("conversion");
    assert_eq!(conversion.strategy, "Webhook");
    let service = conversion
        .webhook
        .as_ref()
        .and_then(|w| w.client_config.as_ref())
        .and_then(|c| c.service.as_ref())
        .expect("service");
    assert_eq!(service.path.as_deref(), Some("/convert"));
    for v in &prs.spec.versions {
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{} has status",
            v.name
        );
    }
}

#[test]
fn v1alpha2_selectable_fields_and_columns_match_the_reference() {
    let prs = crd::package_revisions().expect("crd");
    let v2 = prs
        .spec
        .versions
        .iter()
        .find(|v| v.name == "v1alpha2")
        .expect("v1alpha2");
    let selectable: Vec<_> = v2
        .selectable_fields
        .iter()
        .flatten()
        .map(|f| f.json_path.as_str())
        .collect();
    assert_eq!(
        selectable,
        vec![
            ".spec.lifecycle",
            ".spec.repository",
            ".spec.packageName",
            ".spec.workspaceName",
            ".status.revision"
        ]
    );
    let columns: Vec<_> = v2
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        columns,
        vec![
            ("Package", ".spec.packageName"),
            ("WorkspaceName", ".spec.workspaceName"),
            ("Revision", ".status.revision"),
            (
                "Latest",
                ".metadata.labels['porch\\.kpt\\.dev/latest-revision']"
            ),
            ("Lifecycle", ".spec.lifecycle"),
            ("Repository", ".spec.repository"),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
}

#[test]
fn the_exactly_one_source_rule_is_in_the_schema() {
    let prs = crd::package_revisions().expect("crd");
    let v2 = prs
        .spec
        .versions
        .iter()
        .find(|v| v.name == "v1alpha2")
        .expect("v1alpha2");
    let schema = serde_json::to_value(&v2.schema).expect("schema");
    let rules = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["source"]["x-kubernetes-validations"];
    assert_eq!(
        rules[0]["message"],
        "exactly one of init, cloneFrom, copyFrom, or upgrade must be set"
    );
    assert!(
        rules[0]["rule"]
            .as_str()
            .unwrap_or_default()
            .contains("size() == 1")
    );
}
