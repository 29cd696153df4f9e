//! Bad packages, bad functions and hostile input: a clear error, and the
//! package as it was.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use porch_krm::package::{Files, PackageError, read_resources};
use porch_krm::render::{RenderError, RenderOptions, Rendered, render};
use porch_krm::resource::Resource;
use porch_krm::runtime::{
    Call, ExecLimits, ExecRuntime, FunctionError, FunctionOutput, FunctionRuntime, Runtimes,
};
use porch_krm::yaml::Node;

fn files(entries: &[(&str, &str)]) -> Files {
    entries
        .iter()
        .map(|(p, c)| ((*p).to_owned(), c.as_bytes().to_vec()))
        .collect::<BTreeMap<_, _>>()
}

fn kptfile(pipeline: &str) -> String {
    format!(
        "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: pkg\npipeline:\n  mutators:\n{pipeline}"
    )
}

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  a: \"1\"\n";

fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    let mut perms = std::fs::metadata(&path).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).expect("chmod");
    path.display().to_string()
}

fn no_status() -> RenderOptions {
    RenderOptions {
        record_status: false,
        ..RenderOptions::default()
    }
}

fn run_exec(script_path: &str, limits: ExecLimits, options: &RenderOptions) -> (Files, Rendered) {
    let input = files(&[
        ("Kptfile", &kptfile(&format!("  - exec: {script_path}\n"))),
        ("cm.yaml", CM),
        ("README.md", "# readme\n"),
    ]);
    let runtime = Runtimes::new().with(Arc::new(ExecRuntime::new(limits).allow(script_path)));
    let rendered = render(&input, &runtime, options);
    (input, rendered)
}

fn error_text(rendered: &Rendered) -> String {
    rendered
        .error
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default()
}

#[test]
fn a_failing_function_leaves_the_package_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = script(
        dir.path(),
        "fail.sh",
        "cat >/dev/null; echo boom >&2; exit 3",
    );
    let (input, rendered) = run_exec(&f, ExecLimits::default(), &no_status());
    assert!(
        error_text(&rendered).contains("function failure"),
        "{}",
        error_text(&rendered)
    );
    assert_eq!(rendered.files, input);
    assert_eq!(rendered.steps[0].exit_code, 3);
    assert_eq!(rendered.steps[0].stderr.trim(), "boom");
}

#[test]
fn a_failed_render_is_recorded_in_the_root_kptfile_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = script(dir.path(), "fail.sh", "cat >/dev/null; exit 1");
    let (input, rendered) = run_exec(&f, ExecLimits::default(), &RenderOptions::default());
    assert!(rendered.error.is_some());
    assert_eq!(rendered.files["cm.yaml"], input["cm.yaml"]);
    let kptfile = String::from_utf8_lossy(&rendered.files["Kptfile"]).into_owned();
    assert!(
        kptfile.contains("- type: Rendered\n      status: \"False\"\n      reason: RenderFailed"),
        "{kptfile}"
    );
    assert!(kptfile.contains("errorSummary:"), "{kptfile}");
}

#[test]
fn a_successful_render_records_rendered_true() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = script(dir.path(), "id.sh", "cat");
    let (_, rendered) = run_exec(&f, ExecLimits::default(), &RenderOptions::default());
    assert_eq!(rendered.error, None);
    let kptfile = String::from_utf8_lossy(&rendered.files["Kptfile"]).into_owned();
    assert!(
        kptfile.contains("status:\n  conditions:\n    - type: Rendered\n      status: \"True\"\n      reason: RenderSuccess\n  renderStatus:\n    mutationSteps:\n      - exec: "),
        "{kptfile}"
    );
    // Rendering again gives the same bytes: one condition, not two.
    let runtime = Runtimes::new().with(Arc::new(ExecRuntime::new(ExecLimits::default()).allow(&f)));
    let again = render(&rendered.files, &runtime, &RenderOptions::default());
    assert_eq!(again.files, rendered.files);
}

#[test]
fn a_function_that_hangs_is_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("child.pid");
    let f = script(
        dir.path(),
        "hang.sh",
        &format!("sleep 30 &\necho $! > {}\nwait", pidfile.display()),
    );
    let limits = ExecLimits {
        timeout: Duration::from_millis(300),
        ..ExecLimits::default()
    };
    let start = std::time::Instant::now();
    let (input, rendered) = run_exec(&f, limits, &no_status());
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(
        error_text(&rendered).contains("timed out"),
        "{}",
        error_text(&rendered)
    );
    assert_eq!(rendered.files, input);
    // What the function started is stopped with it.
    let pid = std::fs::read_to_string(&pidfile).expect("the function wrote its child's pid");
    std::thread::sleep(Duration::from_millis(200));
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap_or_default();
    assert!(
        status.is_empty() || status.contains("State:\tZ"),
        "{status}"
    );
}

#[test]
fn garbage_output_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, body, expected) in [
        (
            "garbage.sh",
            "cat >/dev/null; echo '{{{ not: yaml'",
            "failed to parse function output",
        ),
        (
            "notlist.sh",
            "cat >/dev/null; echo 'kind: Pod'",
            "not a ResourceList",
        ),
        (
            "nonkrm.sh",
            "cat >/dev/null; printf 'kind: ResourceList\\nitems:\\n- foo: bar\\n'",
            "must contain only KRM resources",
        ),
        (
            "escape.sh",
            "sed \"s|'cm.yaml'|'../../etc/passwd'|g\"",
            "must not modify resources outside of package",
        ),
        (
            "huge.sh",
            "cat >/dev/null; head -c 200000 /dev/zero | tr '\\0' a",
            "larger than the limit",
        ),
    ] {
        let f = script(dir.path(), name, body);
        let limits = ExecLimits {
            max_output: 100_000,
            ..ExecLimits::default()
        };
        let (input, rendered) = run_exec(&f, limits, &no_status());
        assert!(
            error_text(&rendered).contains(expected),
            "{name}: {}",
            error_text(&rendered)
        );
        assert_eq!(rendered.files, input, "{name}");
    }
}

#[test]
fn exec_functions_run_only_when_allowed() {
    let input = files(&[
        ("Kptfile", &kptfile("  - exec: /bin/cat\n")),
        ("cm.yaml", CM),
    ]);
    let rendered = render(&input, &Runtimes::new(), &no_status());
    assert!(
        error_text(&rendered).contains("--allow-exec"),
        "{}",
        error_text(&rendered)
    );
    assert_eq!(rendered.files, input);
}

#[test]
fn bad_packages_are_rejected_with_the_file_named() {
    let cases: Vec<(Files, &str)> = vec![
        (
            files(&[("Kptfile", &kptfile("")), ("bad.yaml", "a: [1, 2\n")]),
            "bad.yaml",
        ),
        (
            files(&[("Kptfile", &kptfile("")), ("dup.yaml", "a: 1\na: 2\n")]),
            "already defined",
        ),
        (
            files(&[("Kptfile", &kptfile("")), ("non-krm.yaml", "foo: bar\n")]),
            "non-krm.yaml: resource must have `apiVersion`",
        ),
        (
            files(&[(
                "Kptfile",
                "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: x\nbogus: 1\n",
            )]),
            "unknown field",
        ),
        (
            files(&[(
                "Kptfile",
                "apiVersion: kpt.dev/v1alpha2\nkind: Kptfile\nmetadata:\n  name: x\n",
            )]),
            "only kpt.dev/v1",
        ),
        (
            files(&[(
                "Kptfile",
                &kptfile("  - image: set-labels:v0.2\n    exec: ./x\n"),
            )]),
            "both `image` and `exec`",
        ),
        (
            files(&[("Kptfile", &kptfile("  - image: Bad_Image!\n"))]),
            "not a valid image",
        ),
        (
            files(&[(
                "Kptfile",
                &kptfile("  - image: set-labels:v0.2\n    configPath: ../outside.yaml\n"),
            )]),
            "relative path inside the package",
        ),
        (
            files(&[(
                "Kptfile",
                &kptfile("  - image: set-labels:v0.2\n    configPath: missing.yaml\n"),
            )]),
            "must exist in the package",
        ),
        (
            files(&[("Kptfile", &kptfile("")), ("bin.yaml", "\u{0}\u{1}")]),
            "bin.yaml",
        ),
    ];
    for (input, expected) in cases {
        let rendered = render(&input, &Runtimes::new(), &no_status());
        assert!(
            error_text(&rendered).contains(expected),
            "{expected}: {}",
            error_text(&rendered)
        );
        assert_eq!(rendered.files, input, "{expected}");
    }
}

#[test]
fn hostile_file_names_and_sizes_are_refused() {
    for path in [
        "../evil.yaml",
        "/abs.yaml",
        "a/../b.yaml",
        "a/./b.yaml",
        "a//b.yaml",
        "a\\b.yaml",
    ] {
        let input = files(&[("Kptfile", &kptfile("")), (path, CM)]);
        match read_resources(&input) {
            Err(PackageError::BadPath { .. }) => {}
            other => panic!("{path}: {other:?}"),
        }
    }
    let mut input = files(&[("Kptfile", &kptfile(""))]);
    input.insert("big.yaml".into(), vec![b'#'; 9 << 20]);
    assert!(matches!(
        read_resources(&input),
        Err(PackageError::TooLarge { .. })
    ));
    let mut input = files(&[("Kptfile", &kptfile(""))]);
    input.insert("latin1.yaml".into(), vec![0xff, 0xfe, b'a']);
    assert!(matches!(
        read_resources(&input),
        Err(PackageError::NotUtf8 { .. })
    ));
}

/// A runtime that runs a closure.
type Body = Box<dyn Fn(Vec<Resource>) -> Result<Vec<Resource>, FunctionError> + Send + Sync>;

struct Closure(Body);

impl std::fmt::Debug for Closure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Closure")
    }
}

impl FunctionRuntime for Closure {
    fn run(&self, call: Call<'_>) -> Result<FunctionOutput, FunctionError> {
        (self.0)(call.items).map(|items| FunctionOutput {
            items,
            ..FunctionOutput::default()
        })
    }
}

#[test]
fn a_resource_matched_by_two_selectors_is_sent_once() {
    // kpt sends it twice and fails with "resource at path ... already
    // exists"; we send it once.
    let pipeline = "  - image: counter\n    selectors:\n    - kind: ConfigMap\n    - name: cm\n";
    let input = files(&[("Kptfile", &kptfile(pipeline)), ("cm.yaml", CM)]);
    let seen = Arc::new(std::sync::Mutex::new(0usize));
    let counter = seen.clone();
    let runtime = Closure(Box::new(move |items| {
        *counter.lock().expect("lock") = items.len();
        Ok(items)
    }));
    let rendered = render(&input, &runtime, &no_status());
    assert_eq!(rendered.error, None);
    assert_eq!(*seen.lock().expect("lock"), 1);
}

#[test]
fn deleted_resources_remove_their_files_and_new_ones_get_default_paths() {
    let input = files(&[
        ("Kptfile", &kptfile("  - image: gen\n")),
        ("cm.yaml", CM),
        (
            "other.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: other\n",
        ),
    ]);
    let runtime = Closure(Box::new(|mut items: Vec<Resource>| {
        items.retain(|r| r.name() != "other");
        let mut object = Node::mapping();
        object.set("apiVersion", Node::plain("v1"));
        object.set("kind", Node::plain("Secret"));
        let mut metadata = Node::mapping();
        metadata.set("name", Node::plain("gen"));
        metadata.set("namespace", Node::plain("ns1"));
        object.set("metadata", metadata);
        items.push(Resource::new(object, Default::default()));
        Ok(items)
    }));
    let rendered = render(&input, &runtime, &no_status());
    assert_eq!(rendered.error, None);
    assert!(!rendered.files.contains_key("other.yaml"));
    assert_eq!(
        String::from_utf8_lossy(&rendered.files["ns1/secret_gen.yaml"]),
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: gen\n  namespace: ns1\n"
    );
}

#[test]
fn validators_cannot_change_the_package() {
    let pipeline = "  - image: noop\nvalidators:\n  - image: mutating-validator\n";
    let text =
        kptfile(pipeline).replace("  mutators:\n  - image: noop\nvalidators:", "  validators:");
    let input = files(&[("Kptfile", &text), ("cm.yaml", CM)]);
    let runtime = Closure(Box::new(|mut items: Vec<Resource>| {
        for r in &mut items {
            r.set_label("changed", "yes");
        }
        Ok(items)
    }));
    let rendered = render(&input, &runtime, &no_status());
    assert_eq!(rendered.error, None);
    assert_eq!(rendered.files, input);
}

#[test]
fn save_on_render_failure_keeps_the_steps_that_succeeded() {
    let text = kptfile("  - image: label\n  - image: fail\n").replace(
        "  name: pkg\n",
        "  name: pkg\n  annotations:\n    kpt.dev/save-on-render-failure: \"true\"\n",
    );
    let input = files(&[("Kptfile", &text), ("cm.yaml", CM)]);
    #[derive(Debug)]
    struct TwoStep;
    impl FunctionRuntime for TwoStep {
        fn run(&self, call: Call<'_>) -> Result<FunctionOutput, FunctionError> {
            if call.function.display().contains("fail") {
                return Err(FunctionError::Failed {
                    message: "no".into(),
                    results: Vec::new(),
                    stderr: String::new(),
                    exit_code: 1,
                });
            }
            let mut items = call.items;
            for r in &mut items {
                r.set_label("step", "one");
            }
            Ok(FunctionOutput {
                items,
                ..FunctionOutput::default()
            })
        }
    }
    let rendered = render(&input, &TwoStep, &no_status());
    assert!(matches!(rendered.error, Some(RenderError::Function { .. })));
    assert!(String::from_utf8_lossy(&rendered.files["cm.yaml"]).contains("step: one"));
}
