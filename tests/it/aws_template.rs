//! `infra/aws/template.yaml` passes cfn-lint, and what it declares matches
//! the code: a function per handler operation under the relay's default
//! prefix, built from the binaries `cargo lambda build` makes, environment
//! variables the functions read, git credentials readable by the handlers
//! alone; and `infra/k8s/overlays/aws` points the relay at those functions.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use clap::{CommandFactory, ValueEnum};
use porch_api::invocation::Operation;
use serde_json::{Value, json};

use crate::manifests::{find, render};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

fn template_path() -> PathBuf {
    root().join("infra/aws/template.yaml")
}

fn template() -> Value {
    let text = std::fs::read_to_string(template_path()).expect("infra/aws/template.yaml");
    serde_saphyr::from_str(&text).expect("the template is plain YAML (long-form intrinsics)")
}

fn source(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// Every operation; the match stops compiling when one is added.
fn operations() -> [Operation; 8] {
    use Operation::{Adopt, Delete, Lifecycle, Render, Source, Sync, Variant, VariantSet};
    let all = [
        Adopt, Source, Render, Lifecycle, Delete, Sync, Variant, VariantSet,
    ];
    for operation in all {
        match operation {
            Adopt | Source | Render | Lifecycle | Delete | Sync | Variant | VariantSet => {}
        }
    }
    all
}

/// The variables the handler functions may set, each with the file that
/// reads it.
const HANDLER_ENV: [(&str, &str); 9] = [
    ("PORCH_CACHE_DIR", "functions/lambda/src/lib.rs"),
    ("PORCH_S3_BUCKET", "functions/lambda/src/lib.rs"),
    ("PORCH_S3_PREFIX", "functions/lambda/src/lib.rs"),
    ("PORCH_S3_ENDPOINT", "functions/lambda/src/lib.rs"),
    ("PORCH_FUNCTION_RUNNER", "functions/lambda/src/lib.rs"),
    ("PORCH_AWS_SECRETS_PREFIX", "functions/lambda/src/lib.rs"),
    ("PORCH_AWS_SECRETS_ENDPOINT", "functions/lambda/src/lib.rs"),
    ("PORCH_SECRETS_DIR", "functions/lambda/src/lib.rs"),
    ("PORCH_LOG", "functions/lambda/src/lib.rs"),
];

/// The variables the webhook function may set, each with the file and the
/// text that reads it (`KUBECONFIG`: kube-rs, through the client that
/// `try_default` infers).
const WEBHOOK_ENV: [(&str, &str, &str); 4] = [
    (
        "PORCH_WEBHOOKS_APPROVAL_CHECK",
        "webhooks/src/config.rs",
        "\"PORCH_WEBHOOKS_APPROVAL_CHECK\"",
    ),
    (
        "PORCH_WEBHOOKS_DENY_SELF_APPROVAL",
        "webhooks/src/config.rs",
        "\"PORCH_WEBHOOKS_DENY_SELF_APPROVAL\"",
    ),
    (
        "PORCH_WEBHOOKS_CONTROLLER_USERS",
        "webhooks/src/config.rs",
        "\"PORCH_WEBHOOKS_CONTROLLER_USERS\"",
    ),
    (
        "KUBECONFIG",
        "webhooks/src/config.rs",
        "kube::Client::try_default()",
    ),
];

fn functions(template: &Value) -> Vec<(&str, &Value)> {
    template["Resources"]
        .as_object()
        .expect("Resources")
        .iter()
        .filter(|(_, r)| r["Type"] == "AWS::Serverless::Function")
        .map(|(id, r)| (id.as_str(), &r["Properties"]))
        .collect()
}

fn env_names(function: &Value) -> BTreeSet<&str> {
    function["Environment"]["Variables"]
        .as_object()
        .map(|vars| vars.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// `../../target/lambda/x/bootstrap.zip` from `infra/aws/`, as a path
/// relative to the workspace root.
fn code_uri(function: &Value) -> PathBuf {
    let uri = function["CodeUri"]
        .as_str()
        .expect("CodeUri is a local path");
    let mut path = PathBuf::from("infra/aws");
    for component in Path::new(uri).components() {
        match component {
            Component::ParentDir => assert!(path.pop(), "{uri} leaves the workspace"),
            Component::Normal(part) => path.push(part),
            other => panic!("{uri}: unexpected {other:?}"),
        }
    }
    path
}

/// Every IAM statement a resource grants, with the resource's logical id.
/// A policy document given as a string (the IRSA trust) is parsed.
fn statements(template: &Value) -> Vec<(&str, Value)> {
    let mut found = Vec::new();
    for (id, resource) in template["Resources"].as_object().expect("Resources") {
        let properties = &resource["Properties"];
        let mut documents = vec![
            properties["PolicyDocument"].clone(),
            properties["AssumeRolePolicyDocument"].clone(),
        ];
        for policy in properties["Policies"].as_array().into_iter().flatten() {
            documents.push(policy["PolicyDocument"].clone());
        }
        for document in documents {
            let document = match &document["Fn::Sub"] {
                Value::String(text) => serde_json::from_str(text).expect("a JSON policy"),
                _ => document,
            };
            for statement in document["Statement"].as_array().into_iter().flatten() {
                found.push((id.as_str(), statement.clone()));
            }
        }
    }
    found
}

fn actions(statement: &Value) -> Vec<String> {
    match &statement["Action"] {
        Value::String(a) => vec![a.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

#[test]
fn the_template_passes_cfn_lint() {
    let path = template_path();
    let out = match Command::new("cfn-lint")
        .args(["--include-checks", "I", "--"])
        .arg(&path)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && std::env::var_os("CI").is_none() => {
            eprintln!(
                "SKIPPED the_template_passes_cfn_lint: cfn-lint is not installed \
                 (python3 -m pip install cfn-lint, as .ci/run does); with CI set this fails"
            );
            return;
        }
        Err(e) => panic!("cfn-lint cannot run ({e}); .ci/run installs it from PyPI"),
    };
    let findings = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && findings.trim().is_empty(),
        "cfn-lint {}: {findings}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_operation_has_its_function_under_the_relays_prefix() {
    let template = template();
    let prefix = porch_relay::app::Config::command()
        .get_arguments()
        .find(|a| a.get_id() == "function_prefix")
        .and_then(|a| a.get_default_values().first().cloned())
        .expect("the relay has a default function prefix");
    assert_eq!(
        template["Parameters"]["FunctionPrefix"]["Default"],
        prefix.to_str().expect("utf8"),
        "the template names functions as the relay calls them"
    );
    assert_eq!(
        template["Transform"], "AWS::Serverless-2016-10-31",
        "a SAM template"
    );
    let globals = &template["Globals"]["Function"];
    assert_eq!(globals["Runtime"], "provided.al2023");
    assert_eq!(globals["Handler"], "bootstrap");
    assert_eq!(globals["Architectures"], json!([{"Ref": "Architecture"}]));

    let functions = functions(&template);
    let mut seen = BTreeSet::new();
    for operation in operations() {
        let name = operation.as_str();
        let (id, function) = functions
            .iter()
            .find(|(_, f)| {
                f["FunctionName"] == json!({"Fn::Sub": format!("${{FunctionPrefix}}{name}")})
            })
            .unwrap_or_else(|| panic!("no function named <prefix>{name}"));
        seen.insert(*id);
        // the binary of functions/<operation>, where cargo lambda puts it
        let binary = format!("porch-{name}");
        assert!(
            source(&format!("functions/{name}/Cargo.toml"))
                .contains(&format!("name = \"{binary}\"")),
            "functions/{name} builds {binary}"
        );
        assert_eq!(
            code_uri(function),
            Path::new("target/lambda")
                .join(&binary)
                .join("bootstrap.zip"),
            "{id}"
        );
        assert_eq!(
            function["Role"],
            json!({"Fn::GetAtt": ["HandlerRole", "Arn"]}),
            "{id}"
        );
        assert!(function["FunctionUrlConfig"].is_null(), "{id} has no URL");
        // the snapshot bucket and the secrets prefix of this template
        let vars = &function["Environment"]["Variables"];
        assert_eq!(
            vars["PORCH_S3_BUCKET"],
            json!({"Ref": "SnapshotBucket"}),
            "{id}"
        );
        assert_eq!(
            vars["PORCH_AWS_SECRETS_PREFIX"],
            json!({"Ref": "SecretsPrefix"}),
            "{id}"
        );
        assert_eq!(
            function["EphemeralStorage"]["Size"],
            json!({"Ref": "HandlerEphemeralStorageMB"})
        );
    }

    // and the webhook function, behind a function URL the API server calls
    // without signing
    let (webhook, function) = functions
        .iter()
        .find(|(id, _)| !seen.contains(id))
        .expect("the webhook function");
    assert_eq!(
        functions.len(),
        seen.len() + 1,
        "one function besides the handlers"
    );
    assert!(
        source("webhooks/Cargo.toml").contains("name = \"porch-webhooks-lambda\""),
        "the webhook crate builds porch-webhooks-lambda"
    );
    assert_eq!(
        code_uri(function),
        Path::new("target/lambda/porch-webhooks-lambda/bootstrap.zip"),
        "{webhook}"
    );
    assert_eq!(function["FunctionUrlConfig"]["AuthType"], "NONE");
    assert_eq!(
        function["Role"],
        json!({"Fn::GetAtt": ["WebhookRole", "Arn"]})
    );
    let checks: Vec<String> = porch_webhooks::config::ApprovalCheck::value_variants()
        .iter()
        .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_owned()))
        .collect();
    assert_eq!(
        template["Parameters"]["ApprovalCheck"]["AllowedValues"],
        json!(checks),
        "the approval checks the webhooks accept"
    );
}

#[test]
fn the_template_sets_only_variables_the_code_reads() {
    let template = template();
    for (name, file) in HANDLER_ENV {
        assert!(
            source(file).contains(&format!("\"{name}\"")),
            "{file} reads {name}"
        );
    }
    for (name, file, needle) in WEBHOOK_ENV {
        assert!(source(file).contains(needle), "{file} reads {name}");
    }
    let handler: BTreeSet<&str> = HANDLER_ENV.iter().map(|(n, _)| *n).collect();
    let webhook: BTreeSet<&str> = WEBHOOK_ENV.iter().map(|(n, _, _)| *n).collect();
    for (id, function) in functions(&template) {
        let allowed = if function["Role"]["Fn::GetAtt"][0] == "WebhookRole" {
            &webhook
        } else {
            &handler
        };
        let unknown: Vec<&str> = env_names(function).difference(allowed).copied().collect();
        assert!(
            unknown.is_empty(),
            "{id} sets {unknown:?}, which it never reads"
        );
    }
}

#[test]
fn only_the_handlers_read_git_credentials_and_snapshots() {
    let template = template();
    let statements = statements(&template);
    assert!(!statements.is_empty());
    for (id, statement) in &statements {
        for action in actions(statement) {
            let service = action.split(':').next().unwrap_or_default();
            match service {
                "secretsmanager" => {
                    assert_eq!(*id, "HandlerRole", "{action}");
                    assert_eq!(action, "secretsmanager:GetSecretValue");
                    // secrets under the prefix only: <prefix><namespace>/<name>
                    let resource = statement["Resource"]["Fn::Sub"].as_str().expect("one ARN");
                    assert!(
                        resource.ends_with(":secret:${SecretsPrefix}*"),
                        "{resource}"
                    );
                }
                "s3" => {
                    assert!(
                        *id == "HandlerRole" || *id == "SnapshotBucketPolicy",
                        "{id} grants {action}"
                    );
                    if *id == "SnapshotBucketPolicy" {
                        assert_eq!(statement["Effect"], "Deny", "the bucket policy only denies");
                    }
                }
                "lambda" => {
                    assert_eq!(*id, "RelayInvokePolicy", "{action}");
                    assert_eq!(action, "lambda:InvokeFunction");
                    // the six handlers, not the webhook function
                    let mut targets: Vec<&str> = statement["Resource"]
                        .as_array()
                        .expect("ARNs")
                        .iter()
                        .filter_map(|r| r["Fn::GetAtt"][0].as_str())
                        .collect();
                    targets.sort_unstable();
                    let mut handlers: Vec<&str> = functions(&template)
                        .into_iter()
                        .filter(|(_, f)| f["Role"]["Fn::GetAtt"][0] == "HandlerRole")
                        .map(|(id, _)| id)
                        .collect();
                    handlers.sort_unstable();
                    assert_eq!(targets, handlers);
                }
                "sts" if *id == "RelayRole" => {
                    // IRSA: the relay's ServiceAccount token, nothing else
                    assert_eq!(action, "sts:AssumeRoleWithWebIdentity");
                    let trusted = &statement["Condition"]["StringEquals"];
                    assert_eq!(
                        trusted["${EksOidcIssuer}:sub"],
                        "system:serviceaccount:${RelayNamespace}:${RelayServiceAccount}"
                    );
                    assert_eq!(trusted["${EksOidcIssuer}:aud"], "sts.amazonaws.com");
                }
                "sts" => {
                    assert_eq!(action, "sts:AssumeRole", "{id}");
                    assert_eq!(
                        statement["Principal"],
                        json!({"Service": "lambda.amazonaws.com"}),
                        "{id}"
                    );
                }
                _ => panic!("{id} grants {action}"),
            }
        }
    }
    // the webhook role: logs, no inline policies
    let webhook = &template["Resources"]["WebhookRole"]["Properties"];
    assert!(webhook["Policies"].is_null(), "{webhook}");
    assert_eq!(
        webhook["ManagedPolicyArns"],
        json!([{"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"}])
    );
    // the handlers reach the bucket of this template only
    for (id, statement) in &statements {
        if *id == "HandlerRole" && actions(statement).iter().any(|a| a.starts_with("s3:")) {
            let resource = statement["Resource"].to_string();
            assert!(resource.contains("SnapshotBucket"), "{resource}");
        }
    }
}

#[test]
fn the_snapshot_bucket_is_private_versioned_and_kept() {
    let template = template();
    let bucket = &template["Resources"]["SnapshotBucket"];
    assert_eq!(bucket["DeletionPolicy"], "Retain");
    assert_eq!(bucket["UpdateReplacePolicy"], "Retain");
    let properties = &bucket["Properties"];
    assert_eq!(properties["VersioningConfiguration"]["Status"], "Enabled");
    let block = &properties["PublicAccessBlockConfiguration"];
    for setting in [
        "BlockPublicAcls",
        "BlockPublicPolicy",
        "IgnorePublicAcls",
        "RestrictPublicBuckets",
    ] {
        assert_eq!(block[setting], true, "{setting}");
    }
    assert!(
        properties["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
            ["ServerSideEncryptionByDefault"]["SSEAlgorithm"]
            .is_string()
    );
    let rules = properties["LifecycleConfiguration"]["Rules"]
        .as_array()
        .expect("lifecycle rules");
    let has = |key: &str| {
        rules
            .iter()
            .any(|r| r["Status"] == "Enabled" && !r[key].is_null())
    };
    assert!(has("NoncurrentVersionExpiration"));
    assert!(has("AbortIncompleteMultipartUpload"));
    // no rule expires current objects: a live pack is as old as its
    // repository, and only the handlers know when one is retired
    assert!(!has("ExpirationInDays") && !has("ExpirationDate"));
    // packs sit under each repository's key, so no prefix rule could pick
    // them out
    assert!(source("shared/git/src/snapshot.rs").contains("\"{}/packs/pack-{pack}.{ext}\""));
}

#[test]
fn the_aws_overlay_points_the_relay_at_the_functions() {
    let template = template();
    let docs = render("overlays/aws");
    let deployment = find(&docs, "Deployment", "porch-relay");
    let env: Vec<(&str, &str)> = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    assert!(env.contains(&("PORCH_RELAY_INVOKER", "aws")), "{env:?}");
    let prefix = template["Parameters"]["FunctionPrefix"]["Default"]
        .as_str()
        .expect("prefix");
    assert!(env.contains(&("PORCH_FUNCTION_PREFIX", prefix)), "{env:?}");

    // IRSA: the role the template trusts for this ServiceAccount
    let account = find(&docs, "ServiceAccount", "porch-relay");
    assert!(
        account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].is_string(),
        "{account}"
    );
    let namespace = account["metadata"]["namespace"]
        .as_str()
        .expect("namespace");
    assert_eq!(
        template["Parameters"]["RelayNamespace"]["Default"],
        namespace
    );
    assert_eq!(
        template["Parameters"]["RelayServiceAccount"]["Default"],
        "porch-relay"
    );
    find(&docs, "Namespace", namespace);
    // the webhooks treat the relay as their controller
    assert_eq!(
        porch_webhooks::config::DEFAULT_CONTROLLER_USER,
        format!("system:serviceaccount:{namespace}:porch-relay")
    );

    // the webhooks are the function URL's, not a Deployment's
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "porch-webhooks")
    );
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        for hook in find(&docs, kind, "porch-webhooks")["webhooks"]
            .as_array()
            .expect("webhooks")
        {
            let url = hook["clientConfig"]["url"].as_str().expect("a URL");
            assert!(url.starts_with("https://"), "{url}");
            assert!(hook["clientConfig"]["service"].is_null());
        }
    }
}
