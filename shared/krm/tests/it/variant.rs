//! A PackageVariant's mutations on packages: each case in
//! `fixtures/variant/*.txtar` holds the variant (`variant.yaml`), the
//! in-cluster objects (`cluster.yaml`), the package (`in/…`) and either the
//! files the mutations change, with their exact new bytes (`out/…`; every
//! other file must keep its bytes), or the exact error (`error`).

use std::collections::BTreeMap;

use porch_api::kptfile::Kptfile;
use porch_api::variant::{PackageVariant, PackageVariantSpec};
use porch_krm::package::Files;
use porch_krm::variant::{InjectionPoint, Mutated, VariantError, mutate_package};
use porch_krm::yaml;
use pretty_assertions::assert_eq;
use serde_json::Value as Json;

use crate::support::{fixtures, identity_function, kpt_render, read_tree};

/// The name the package goes by in error messages.
const PACKAGE: &str = "default/prr";

#[derive(Debug, Default)]
struct Case {
    name: String,
    pv_name: String,
    spec: PackageVariantSpec,
    cluster: Vec<Json>,
    input: Files,
    output: Files,
    error: Option<String>,
}

/// The sections of a txtar file: `-- name --` lines, each followed by the
/// section's content; text before the first one is a comment.
fn sections(text: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_end_matches('\n');
        if let Some(name) = trimmed
            .strip_prefix("-- ")
            .and_then(|rest| rest.strip_suffix(" --"))
        {
            assert!(!out.contains_key(name), "section {name} twice");
            out.insert(name.to_owned(), String::new());
            current = Some(name.to_owned());
            continue;
        }
        if let Some(name) = &current {
            out.get_mut(name).expect("current section").push_str(line);
        }
    }
    out
}

fn yaml_values(text: &str) -> Vec<Json> {
    yaml::parse_documents(text)
        .expect("fixture YAML parses")
        .iter()
        .map(|d| yaml::to_json(&d.root).expect("fixture YAML is JSON"))
        .collect()
}

fn load_case(name: &str, text: &str) -> Case {
    let mut case = Case {
        name: name.to_owned(),
        ..Case::default()
    };
    for (section, content) in sections(text) {
        if let Some(path) = section.strip_prefix("in/") {
            case.input.insert(path.to_owned(), content.into_bytes());
        } else if let Some(path) = section.strip_prefix("out/") {
            case.output.insert(path.to_owned(), content.into_bytes());
        } else {
            match section.as_str() {
                "variant.yaml" => {
                    let [value] = yaml_values(&content).try_into().expect("one variant");
                    let pv: PackageVariant =
                        serde_json::from_value(value).expect("a PackageVariant");
                    case.pv_name = pv.metadata.name.clone().expect("a named variant");
                    case.spec = pv.spec;
                }
                "cluster.yaml" => case.cluster = yaml_values(&content),
                "error" => case.error = Some(content.trim_end_matches('\n').to_owned()),
                other => panic!("{name}: unknown section {other}"),
            }
        }
    }
    assert!(!case.pv_name.is_empty(), "{name}: no variant.yaml");
    for (path, bytes) in &case.output {
        assert_ne!(
            case.input.get(path),
            Some(bytes),
            "{name}: out/{path} is the same as in/{path}"
        );
    }
    case
}

fn cases() -> Vec<Case> {
    let dir = fixtures().join("variant");
    let mut cases: Vec<Case> = read_tree(&dir)
        .into_iter()
        .filter(|(path, _)| path.ends_with(".txtar"))
        .map(|(path, bytes)| {
            let text = String::from_utf8(bytes).expect("UTF-8 fixture");
            load_case(path.trim_end_matches(".txtar"), &text)
        })
        .collect();
    cases.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(cases.len() > 30, "fixtures found: {}", cases.len());
    cases
}

fn run(case: &Case, files: &Files) -> Result<Mutated, VariantError> {
    mutate_package(&case.pv_name, &case.spec, PACKAGE, files, &case.cluster)
}

fn text(files: &Files) -> BTreeMap<&str, String> {
    files
        .iter()
        .map(|(path, bytes)| (path.as_str(), String::from_utf8_lossy(bytes).into_owned()))
        .collect()
}

/// Every case: the exact files or error; the output has a Kptfile kpt
/// accepts; a second pass changes nothing.
#[test]
fn variant_mutations_give_the_expected_files() {
    for case in cases() {
        let name = &case.name;
        let result = run(&case, &case.input);
        if let Some(error) = &case.error {
            match result {
                Ok(m) => panic!("{name}: expected {error:?}, got {:#?}", text(&m.files)),
                Err(e) => assert!(
                    &e.to_string() == error,
                    "{name}: got\n{e}\nexpected\n{error}"
                ),
            }
            continue;
        }
        let mutated = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut expected = case.input.clone();
        expected.extend(case.output.clone());
        assert_eq!(text(&mutated.files), text(&expected), "{name}");
        assert_eq!(mutated.changed, !case.output.is_empty(), "{name}: changed");
        if let Some(kptfile) = mutated.files.get("Kptfile") {
            let decoded = Kptfile::from_yaml(std::str::from_utf8(kptfile).expect("UTF-8"));
            assert!(decoded.is_ok(), "{name}: {decoded:?}");
        }
        let again = run(&case, &mutated.files).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!again.changed, "{name}: a second pass changes the package");
        assert_eq!(
            text(&again.files),
            text(&mutated.files),
            "{name}: second pass"
        );
    }
}

/// The files the mutations wrote (all but Kptfiles) are as kpt writes
/// them: `kpt fn render` with a function that changes nothing leaves them
/// byte for byte.
#[test]
fn written_files_are_as_kpt_writes_them() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let function = identity_function(dir.path());
    let pkg = dir.path().join("pkg");
    std::fs::create_dir(&pkg)?;
    std::fs::write(
        pkg.join("Kptfile"),
        format!(
            "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: pkg\npipeline:\n  mutators:\n  - exec: {}\n",
            function.display()
        ),
    )?;
    let mut written = Files::new();
    for case in cases() {
        for path in case.output.keys() {
            if path.rsplit('/').next() == Some("Kptfile") {
                continue;
            }
            let target = format!("{}/{path}", case.name);
            written.insert(target.clone(), case.output[path].clone());
            let file = pkg.join(&target);
            std::fs::create_dir_all(file.parent().expect("a parent"))?;
            std::fs::write(file, &case.output[path])?;
        }
    }
    assert!(written.len() > 10, "files written: {}", written.len());
    kpt_render(&pkg);
    let rendered = read_tree(&pkg);
    for (path, bytes) in &written {
        assert_eq!(
            String::from_utf8_lossy(&rendered[path]),
            String::from_utf8_lossy(bytes),
            "{path}"
        );
    }
    Ok(())
}

fn named(name: &str) -> Case {
    cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

#[test]
fn each_injection_point_is_reported() {
    let case = named("injection-mixed");
    let mutated = run(&case, &case.input).expect("mutates");
    let point = |kind: &str, name: &str, required, injected: &str| InjectionPoint {
        file: "more.yaml".into(),
        kind: kind.into(),
        name: name.into(),
        condition_type: format!("config.injection.{kind}.{name}"),
        required,
        injected: Some(injected.into()),
        errors: vec![],
    };
    assert_eq!(
        mutated.injection_points,
        [
            point("ConfigMap", "my-cm", false, "us-east2-endpoints"),
            point("Team", "team", true, "dev-team-beta"),
        ]
    );
    let case = named("injection-field-missing");
    let mutated = run(&case, &case.input).expect("mutates");
    assert_eq!(mutated.injection_points.len(), 1);
    assert_eq!(mutated.injection_points[0].injected, None);
    assert_eq!(
        mutated.injection_points[0].errors,
        [r#"field "spec" not found in resource "no-spec""#]
    );
}

/// Objects that are not KRM objects in the cluster list are passed over.
#[test]
fn junk_in_the_cluster_list_is_ignored() {
    let mut case = named("injection-configmap");
    let expected = run(&case, &case.input).expect("mutates").files;
    let mut junk: Vec<Json> = vec![
        Json::Null,
        Json::from(3),
        Json::from("text"),
        serde_json::json!([{"kind": "ConfigMap"}]),
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap"}),
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": 7}}),
        serde_json::json!({"apiVersion": 1, "kind": "ConfigMap", "metadata": {"name": "us-east1-endpoints"}}),
    ];
    junk.append(&mut case.cluster);
    case.cluster = junk;
    assert_eq!(
        text(&run(&case, &case.input).expect("mutates").files),
        text(&expected)
    );
}

#[test]
fn bad_paths_are_refused() {
    let case = named("context-add");
    for bad in ["../escape.yaml", "/abs.yaml", "a//b.yaml", "a\\b.yaml"] {
        let mut files = case.input.clone();
        files.insert(bad.into(), b"a: 1\n".to_vec());
        let err = run(&case, &files).expect_err(bad);
        assert!(matches!(err, VariantError::Package(_)), "{bad}: {err:?}");
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
    }
}

#[test]
fn unreadable_files_are_refused() {
    let case = named("injection-none");
    let mut files = case.input.clone();
    files.insert("latin1.yaml".into(), b"a: caf\xe9\n".to_vec());
    let err = run(&case, &files).expect_err("not UTF-8");
    assert_eq!(err.to_string(), "latin1.yaml: file is not UTF-8");
    let mut files = case.input.clone();
    let big = porch_krm::package::MAX_FILE_BYTES + 1;
    files.insert("big.yaml".into(), vec![b'#'; big]);
    let err = run(&case, &files).expect_err("too large");
    assert_eq!(
        err.to_string(),
        format!(
            "big.yaml: file has {big} bytes, more than the limit of {}",
            big - 1
        )
    );
    // files kpt does not read as KRM are not read at all
    let mut files = case.input.clone();
    files.insert("blob.bin".into(), vec![0xff; 16]);
    files.insert("notes.txt".into(), vec![b'#'; big]);
    let mutated = run(&case, &files).expect("mutates");
    assert!(!mutated.changed);
    assert_eq!(mutated.files, files);
}

/// Large maps are merged in time linear in their size.
#[test]
fn large_context_maps_are_handled() {
    let mut case = named("context-add");
    let existing = 40_000;
    let mut context = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kptfile.kpt.dev\ndata:\n",
    );
    for i in 0..existing {
        context.push_str(&format!("  key-{i:05}: value\n"));
    }
    case.input
        .insert("package-context.yaml".into(), context.into_bytes());
    let package_context = case.spec.package_context.get_or_insert_default();
    for i in 0..existing {
        if i % 2 == 0 {
            package_context
                .data
                .insert(format!("key-{i:05}"), "changed".into());
        }
        package_context
            .data
            .insert(format!("new-{i:05}"), "added".into());
    }
    package_context.remove_keys = (0..existing)
        .filter(|i| i % 4 == 1)
        .map(|i| format!("key-{i:05}"))
        .collect();
    let started = std::time::Instant::now();
    let mutated = run(&case, &case.input).expect("mutates");
    let elapsed = started.elapsed();
    let out = String::from_utf8(mutated.files["package-context.yaml"].clone()).expect("UTF-8");
    assert_eq!(out.matches(": changed\n").count(), existing / 2);
    assert_eq!(out.matches(": added\n").count(), existing);
    assert_eq!(out.matches(": value\n").count(), existing / 4);
    assert!(out.contains("  key-39999: value\n  foo: bar\n  new-00000: added\n"));
    // under a second here; a quadratic merge or parse takes over 15
    assert!(
        elapsed < std::time::Duration::from_secs(10),
        "took {elapsed:?}"
    );
}

/// Nesting deep enough to exhaust a recursive reader is a parse error.
#[test]
fn deeply_nested_files_are_refused() {
    let case = named("injection-none");
    let mut files = case.input.clone();
    let depth = 100_000;
    let nested = format!("a: {}{}\n", "[".repeat(depth), "]".repeat(depth));
    files.insert("deep.yaml".into(), nested.into_bytes());
    let err = run(&case, &files).expect_err("too deep");
    assert_eq!(
        err.to_string(),
        "deep.yaml: failed to parse input bytes: yaml: line 1: recursion limit exceeded"
    );
}
