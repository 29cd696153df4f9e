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
