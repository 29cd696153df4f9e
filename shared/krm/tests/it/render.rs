//! The render pipeline against `kpt fn render` with the same exec function.

use std::path::Path;
use std::sync::Arc;

use porch_krm::package::Files;
use porch_krm::render::{RenderOptions, render};
use porch_krm::runtime::{ExecLimits, ExecRuntime, Runtimes};
use pretty_assertions::assert_eq;

use crate::support::{fixtures, identity_function, kpt_render, read_tree};

/// Copies a fixture package, pointing `exec: IDENTITY` at a real script.
fn prepare(fixture: &str, dir: &Path, function: &Path) -> Files {
    let mut files = read_tree(&fixtures().join("render").join(fixture));
    for (path, bytes) in files.iter_mut() {
        if path.ends_with("Kptfile") {
            let text = String::from_utf8(bytes.clone()).expect("utf-8 Kptfile");
            *bytes = text
                .replace("IDENTITY", &function.display().to_string())
                .into_bytes();
        }
    }
    for (path, bytes) in &files {
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::write(target, bytes).expect("write");
    }
    files
}

fn exec_runtime(function: &Path) -> Runtimes {
    Runtimes::new().with(Arc::new(
        ExecRuntime::new(ExecLimits::default()).allow(function),
    ))
}

fn kpt_options() -> RenderOptions {
    // kpt 1.0.0-beta.56 does not record render status in the Kptfile.
    RenderOptions {
        record_status: false,
        attribution: Some("kpt-fn".into()),
        ..RenderOptions::default()
    }
}

#[test]
fn nested_packages_render_byte_identical_to_kpt() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let function = identity_function(dir.path());
    let pkg = dir.path().join("pkg");
    let files = prepare("nested", &pkg, &function);
    kpt_render(&pkg);
    let expected = read_tree(&pkg);

    let rendered = render(&files, &exec_runtime(&function), &kpt_options());
    assert_eq!(rendered.error, None);
    for (path, bytes) in &expected {
        assert_eq!(
            String::from_utf8_lossy(&rendered.files[path]),
            String::from_utf8_lossy(bytes),
            "{path}"
        );
    }
    assert_eq!(
        rendered.files.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    // Five steps ran: sub's, then the root's three; deep has no pipeline.
    assert_eq!(rendered.steps.len(), 4);
    assert_eq!(rendered.steps[0].package, "sub");
    Ok(())
}

/// Records which objects each call saw.
#[derive(Debug, Default)]
struct Recorder(std::sync::Mutex<Vec<(String, Vec<String>)>>);

impl porch_krm::runtime::FunctionRuntime for Recorder {
    fn run(
        &self,
        call: porch_krm::runtime::Call<'_>,
    ) -> Result<porch_krm::runtime::FunctionOutput, porch_krm::runtime::FunctionError> {
        let names = call
            .items
            .iter()
            .map(|r| format!("{}/{}", r.kind(), r.name()))
            .collect();
        self.0
            .lock()
            .expect("lock")
            .push((call.package.to_owned(), names));
        Ok(porch_krm::runtime::FunctionOutput {
            items: call.items,
            ..Default::default()
        })
    }
}

fn tree(bfs: bool) -> Files {
    let annotation = if bfs {
        "  annotations:\n    kpt.dev/bfs-rendering: \"true\"\n"
    } else {
        ""
    };
    let kptfile = |name: &str, extra: &str| {
        format!(
            "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: {name}\n{extra}pipeline:\n  mutators:\n  - image: record\n"
        )
    };
    let cm = |name: &str| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n");
    [
        ("Kptfile".to_owned(), kptfile("root", annotation)),
        ("root.yaml".to_owned(), cm("root")),
        ("a/Kptfile".to_owned(), kptfile("a", "")),
        ("a/a.yaml".to_owned(), cm("a")),
        ("a/b/Kptfile".to_owned(), kptfile("b", "")),
        ("a/b/b.yaml".to_owned(), cm("b")),
        ("c/Kptfile".to_owned(), kptfile("c", "")),
        ("c/c.yaml".to_owned(), cm("c")),
    ]
    .into_iter()
    .map(|(p, c)| (p, c.into_bytes()))
    .collect()
}

#[test]
fn packages_render_depth_first_or_breadth_first() {
    let recorder = Recorder::default();
    let rendered = render(&tree(false), &recorder, &kpt_options());
    assert_eq!(rendered.error, None);
    let calls = recorder.0.lock().expect("lock").clone();
    let order: Vec<&str> = calls.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(order, vec!["a/b", "a", "c", ""]);
    // Each package sees itself and its descendants, own resources first.
    assert_eq!(
        calls[1].1,
        vec!["Kptfile/a", "ConfigMap/a", "Kptfile/b", "ConfigMap/b"]
    );
    assert_eq!(calls[3].1.len(), 8);

    let recorder = Recorder::default();
    let rendered = render(&tree(true), &recorder, &kpt_options());
    assert_eq!(rendered.error, None);
    let calls = recorder.0.lock().expect("lock").clone();
    let order: Vec<&str> = calls.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(order, vec!["", "a", "c", "a/b"]);
    assert_eq!(calls[0].1.len(), 8);
    assert_eq!(calls[3].1, vec!["Kptfile/b", "ConfigMap/b"]);
    // Nothing changed, so nothing moved.
    assert_eq!(rendered.files, tree(true));
}
