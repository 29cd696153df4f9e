//! The builtin functions on the behaviours and edge cases of spec §5.

use porch_krm::builtins::BuiltinRuntime;
use porch_krm::resource::{Origin, Resource};
use porch_krm::runtime::{FunctionError, FunctionOutput};
use porch_krm::yaml::{SeqIndent, emit_documents, parse_document, parse_documents};
use pretty_assertions::assert_eq;

fn items(text: &str) -> Vec<Resource> {
    parse_documents(text)
        .expect("valid yaml")
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            Resource::new(
                d.root,
                Origin {
                    path: "res.yaml".into(),
                    index: Some(i),
                    ..Origin::default()
                },
            )
        })
        .collect()
}

fn run(name: &str, config: &str, input: &str) -> Result<FunctionOutput, FunctionError> {
    let config = parse_document(config).expect("valid config");
    BuiltinRuntime::catalog().run_named(name, items(input), config.as_ref())
}

fn text(output: &FunctionOutput) -> String {
    emit_documents(output.items.iter().map(|r| (&r.object, SeqIndent::Compact)))
}

fn messages(output: &FunctionOutput) -> Vec<String> {
    output
        .results
        .iter()
        .map(|r| format!("{}: {}", r.severity, r.message))
        .collect()
}

const NS_CONFIG: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  namespace: prod\n";

#[test]
fn set_namespace_sets_namespaced_objects_and_skips_local_config() {
    let out = run(
        "set-namespace",
        NS_CONFIG,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: dev\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: b\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: c\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: local\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: dev\n",
    )
    .expect("runs");
    assert_eq!(
        text(&out),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: prod\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: b\n  namespace: prod\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: c\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: local\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: prod\n"
    );
    assert_eq!(
        messages(&out)[0],
        "info: namespace [\"default\", \"dev\"] updated to \"prod\", 3 value(s) changed"
    );
}

#[test]
fn set_namespace_honours_the_matcher_and_package_context() {
    let config = "apiVersion: fn.kpt.dev/v1alpha1\nkind: SetNamespace\nmetadata:\n  name: c\nnamespace: prod\nnamespaceMatcher: dev\n";
    let out = run(
        "set-namespace",
        config,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: dev\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n  namespace: other\n",
    )
    .expect("runs");
    assert!(text(&out).contains("name: a\n  namespace: prod\n"));
    assert!(text(&out).contains("name: b\n  namespace: other\n"));

    let context = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kptfile.kpt.dev\ndata:\n  name: from-context\n";
    let out = run(
        "set-namespace",
        context,
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n",
    )
    .expect("runs");
    assert!(text(&out).contains("namespace: from-context"));
}

#[test]
fn set_namespace_reports_bad_config_without_failing() {
    for (config, message) in [
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata: {}\n",
            "`data.namespace` should not be empty",
        ),
        (
            "apiVersion: example.com/v1\nkind: Other\nmetadata:\n  name: c\n",
            "unknown functionConfig",
        ),
    ] {
        let out = run(
            "set-namespace",
            config,
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n",
        )
        .expect("succeeds");
        assert!(
            messages(&out)[0].starts_with("error: "),
            "{:?}",
            messages(&out)
        );
        assert!(messages(&out)[0].contains(message), "{:?}", messages(&out));
        assert_eq!(
            text(&out),
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n"
        );
    }
    let out = BuiltinRuntime::catalog()
        .run_named(
            "set-namespace",
            items("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n"),
            None,
        )
        .expect("succeeds");
    assert!(messages(&out)[0].contains("FunctionConfig is missing"));
}

#[test]
fn set_namespace_follows_depends_on_and_binding_subjects() {
    let out = run(
        "set-namespace",
        NS_CONFIG,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: dev\n  annotations:\n    config.kubernetes.io/depends-on: /namespaces/dev/ServiceAccount/sa\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: sa\n  namespace: dev\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: rb\n  namespace: dev\nsubjects:\n- kind: ServiceAccount\n  name: sa\n  namespace: dev\n",
    )
    .expect("runs");
    let t = text(&out);
    assert!(
        t.contains("depends-on: /namespaces/prod/ServiceAccount/sa"),
        "{t}"
    );
    assert!(t.contains("  name: sa\n  namespace: prod\n"), "{t}");
    assert!(
        t.ends_with("subjects:\n- kind: ServiceAccount\n  name: sa\n  namespace: prod\n"),
        "{t}"
    );
}

#[test]
fn set_labels_covers_selectors_and_templates() {
    let config = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  app: shop\n  count: \"1\"\n";
    let out = run(
        "set-labels",
        config,
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\nspec:\n  template:\n    spec:\n      containers: []\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: s\nspec:\n  ports:\n  - port: 80\n",
    )
    .expect("runs");
    assert_eq!(
        text(&out),
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\n  labels:\n    app: shop\n    count: \"1\"\nspec:\n  template:\n    spec:\n      containers: []\n    metadata:\n      labels:\n        app: shop\n        count: \"1\"\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: s\n  labels:\n    app: shop\n    count: \"1\"\nspec:\n  ports:\n  - port: 80\n  selector:\n    app: shop\n    count: \"1\"\n"
    );
    assert_eq!(messages(&out), vec!["info: set 4 labels in total"]);
    let err = BuiltinRuntime::catalog()
        .run_named(
            "set-labels",
            items("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n"),
            None,
        )
        .expect_err("no config fails");
    assert!(
        err.to_string().contains("`FunctionConfig` is not given"),
        "{err}"
    );
}

#[test]
fn set_annotations_include_local_config_and_reject_empty_lists() {
    let config = "apiVersion: fn.kpt.dev/v1alpha1\nkind: SetAnnotations\nmetadata:\n  name: c\nannotations:\n  owner: team-a\n";
    let out = run(
        "set-annotations",
        config,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: local\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\n",
    )
    .expect("runs");
    assert!(
        text(&out).contains("    config.kubernetes.io/local-config: \"true\"\n    owner: team-a\n")
    );
    assert_eq!(
        out.results[0].field.as_ref().map(|f| f.path.as_str()),
        Some("metadata.annotations")
    );
    assert_eq!(
        out.results[0].file.as_ref().map(|f| f.path.as_str()),
        Some("res.yaml")
    );
    let empty = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata: {}\n";
    let err = run(
        "set-annotations",
        empty,
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n",
    )
    .expect_err("empty list fails");
    assert!(
        err.to_string()
            .contains("input annotation list cannot be empty")
    );
}

#[test]
fn apply_setters_fill_patterns_derive_values_and_set_arrays() {
    let config = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  tag: \"1.27\"\n  replicas: \"4\"\n  envs: \"[a, b]\"\n  empty: \"\"\n";
    let out = run(
        "apply-setters",
        config,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  replicas: 1 # kpt-set: ${replicas}\n  image: nginx:1.25 # kpt-set: ${image}:${tag}\n  list: # kpt-set: ${envs}\n  - x\n  flow: [] # kpt-set: ${envs}\n  blank: x # kpt-set: ${empty}\n  other: y # kpt-set: ${unknown}\n",
    )
    .expect("runs");
    assert_eq!(
        text(&out),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  replicas: 4 # kpt-set: ${replicas}\n  image: nginx:1.27 # kpt-set: ${image}:${tag}\n  list: # kpt-set: ${envs}\n  - a\n  - b\n  flow: [a, b] # kpt-set: ${envs}\n  blank: \"\" # kpt-set: ${empty}\n  other: y # kpt-set: ${unknown}\n"
    );
    let err = run(
        "apply-setters",
        config,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  v: abc # kpt-set: ${tag}-${missing}\n",
    )
    .expect_err("unresolvable placeholder");
    assert!(
        err.to_string()
            .contains("values for setters [${missing}] must be provided"),
        "{err}"
    );
    let none = run(
        "apply-setters",
        config,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n",
    )
    .expect("runs");
    assert_eq!(
        messages(&none),
        vec!["info: no matches for input setter(s)"]
    );
}

#[test]
fn ensure_name_substring_is_idempotent_and_updates_references() {
    let config = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  prepend: prod-\n";
    let input = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: prod-pod\nspec:\n  containers:\n  - name: c\n    envFrom:\n    - configMapRef:\n        name: cfg\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns\n";
    let once = run("ensure-name-substring", config, input).expect("runs");
    let expected = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: prod-cfg\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: prod-pod\nspec:\n  containers:\n  - name: c\n    envFrom:\n    - configMapRef:\n        name: prod-cfg\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns\n";
    assert_eq!(text(&once), expected);
    let twice = run("ensure-name-substring", config, expected).expect("runs");
    assert_eq!(text(&twice), expected);
    let bad =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  prepend: a\n  append: b\n";
    assert!(run("ensure-name-substring", bad, input).is_err());
}

#[test]
fn set_image_rewrites_containers_and_init_containers() {
    let config = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  name: nginx\n  newTag: \"1.27\"\n";
    let out = run(
        "set-image",
        config,
        "apiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: cj\nspec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          initContainers:\n          - name: init\n            image: nginx\n          containers:\n          - name: main\n            image: nginx:1.25 # pinned\n          - name: other\n            image: nginx-exporter:1.0\n",
    )
    .expect("runs");
    let t = text(&out);
    assert!(
        t.contains("image: nginx:1.27\n          containers:"),
        "{t}"
    );
    assert!(t.contains("image: nginx:1.27 # pinned\n"), "{t}");
    assert!(t.contains("image: nginx-exporter:1.0\n"), "{t}");
    assert_eq!(
        messages(&out),
        vec!["info: summary: updated a total of 2 image(s)"]
    );
    let bad = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  name: nginx\n";
    assert!(
        run(
            "set-image",
            bad,
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n"
        )
        .is_err()
    );
    let unknown =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  name: nginx\n  tag: x\n";
    assert!(
        run(
            "set-image",
            unknown,
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n"
        )
        .is_err()
    );
}

#[test]
fn search_replace_matches_whole_values_paths_and_files() {
    let input = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  a: foo-bar\n  b: foo\n  c: xfoo\n";
    let by_value = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  by-value: foo\n  put-value: baz\n";
    let out = run("search-replace", by_value, input).expect("runs");
    assert!(
        text(&out).contains("  a: foo-bar\n  b: baz\n  c: xfoo\n"),
        "{}",
        text(&out)
    );
    assert_eq!(out.results[0].message, "Mutated field value to \"baz\"");
    assert_eq!(
        out.results[0].field.as_ref().map(|f| f.path.as_str()),
        Some("data.b")
    );

    // The regex must match the whole value; groups fill the new value.
    let regex = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  by-value-regex: foo-(.*)\n  put-value: ${1}-new\n";
    let out = run("search-replace", regex, input).expect("runs");
    assert!(
        text(&out).contains("  a: bar-new\n  b: foo\n  c: xfoo\n"),
        "{}",
        text(&out)
    );

    let by_path = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  by-path: metadata.namespace\n  put-value: prod\n";
    let out = run("search-replace", by_path, input).expect("runs");
    assert!(
        text(&out).contains("metadata:\n  name: cm\n  namespace: prod\n"),
        "{}",
        text(&out)
    );

    let comment = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  by-path: data.*\n  by-value: foo\n  put-comment: \"kpt-set: ${tag}\"\n";
    let out = run("search-replace", comment, input).expect("runs");
    assert!(
        text(&out).contains("  b: foo # kpt-set: ${tag}\n"),
        "{}",
        text(&out)
    );

    let by_file = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  by-value: foo\n  by-file-path: other/*.yaml\n";
    let out = run("search-replace", by_file, input).expect("runs");
    assert_eq!(messages(&out), vec!["info: no matches"]);

    for bad in [
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  by-value: a\n  by-value-regex: b\n",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  unknown: a\n",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  by-value-regex: \"(\"\n",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  by-value-regex: foo\n  put-value: ${3}\n",
    ] {
        assert!(run("search-replace", bad, input).is_err(), "{bad}");
    }
}

#[test]
fn apply_replacements_copies_fields_with_delimiters_and_creation() {
    let config = r#"apiVersion: fn.kpt.dev/v1alpha1
kind: ApplyReplacements
metadata:
  name: r
replacements:
- source:
    kind: ConfigMap
    name: settings
    fieldPath: data.image
  targets:
  - select:
      kind: Job
    fieldPaths:
    - spec.template.spec.containers.[name=main].image
  - select:
      kind: Job
    fieldPaths:
    - metadata.annotations.image
    options:
      create: true
- source:
    kind: ConfigMap
    name: settings
    fieldPath: data.version
  targets:
  - select:
      kind: Job
    fieldPaths:
    - metadata.labels.release
    options:
      delimiter: "-"
      index: 1
"#;
    let input = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  image: registry.example.com/job:2.0\n  version: v2\n---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: job\n  labels:\n    release: app-v1 # release\nspec:\n  template:\n    spec:\n      containers:\n      - name: main\n        image: job:1.0\n      - name: side\n        image: side:1.0\n";
    let out = run("apply-replacements", config, input).expect("runs");
    let t = text(&out);
    assert!(t.contains("release: app-v2 # release\n"), "{t}");
    assert!(
        t.contains("  - name: main\n        image: registry.example.com/job:2.0\n"),
        "{t}"
    );
    assert!(
        t.contains("  - name: side\n        image: side:1.0\n"),
        "{t}"
    );
    assert!(
        t.contains("annotations:\n    image: registry.example.com/job:2.0\n"),
        "{t}"
    );

    for (config, message) in [
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n",
            "unknown functionConfig",
        ),
        (
            "apiVersion: fn.kpt.dev/v1alpha1\nkind: ApplyReplacements\nmetadata:\n  name: r\nreplacements:\n- source:\n    kind: Secret\n  targets: []\n",
            "nothing selected",
        ),
        (
            "apiVersion: fn.kpt.dev/v1alpha1\nkind: ApplyReplacements\nmetadata:\n  name: r\nreplacements:\n- sourceValue: x\n  targets:\n  - select:\n      kind: Job\n    fieldPaths: [spec.missing]\n",
            "unable to find field",
        ),
    ] {
        let err = run("apply-replacements", config, input).expect_err("fails");
        assert!(err.to_string().contains(message), "{message}: {err}");
    }
}

#[test]
fn starlark_scripts_change_items_and_keep_formatting() {
    let config = r#"apiVersion: fn.kpt.dev/v1alpha1
kind: StarlarkRun
metadata:
  name: set-ns
source: |
  def set_namespace(resources, namespace):
    for r in resources:
      r["metadata"]["namespace"] = namespace
  set_namespace(ctx.resource_list["items"], "prod")
  print("done")
"#;
    let input = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm # keep me\n  labels: {app: web}\ndata:\n  n: \"1\"\n  s: 'single'\n  list:\n  - a\n";
    let out = run("starlark", config, input).expect("runs");
    assert_eq!(
        text(&out),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm # keep me\n  labels: {app: web}\n  namespace: prod\ndata:\n  n: \"1\"\n  s: 'single'\n  list:\n  - a\n"
    );
    assert_eq!(out.items[0].origin.path, "res.yaml");
    assert_eq!(messages(&out), vec!["info: done\n"]);

    // New objects and removed ones.
    let config = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  source: |\n    ctx.resource_list[\"items\"] = [{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"gen\"}}]\n";
    let out = run("starlark", config, input).expect("runs");
    assert_eq!(
        text(&out),
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: gen\n"
    );
    assert_eq!(out.items[0].origin.path, "");

    // fail() and syntax errors fail the function.
    for source in ["fail(\"no way\")", "def x(:\n"] {
        let config = format!(
            "apiVersion: fn.kpt.dev/v1alpha1\nkind: StarlarkRun\nmetadata:\n  name: f\nsource: {}\n",
            serde_json::to_string(source).expect("json string")
        );
        let err = run("starlark", &config, input).expect_err("fails");
        assert!(err.to_string().contains("starlark"), "{err}");
    }
}
