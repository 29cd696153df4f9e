//! Catalog examples with their published expected output.

use std::sync::Arc;

use porch_krm::builtins::BuiltinRuntime;
use porch_krm::render::{RenderOptions, render};
use porch_krm::runtime::Runtimes;
use pretty_assertions::assert_eq;

use crate::support::{fixtures, read_tree};

fn vector(name: &str) -> anyhow::Result<()> {
    let base = fixtures().join("vectors").join(name);
    let input = read_tree(&base.join("in"));
    let expected = read_tree(&base.join("out"));
    let runtime = Runtimes::new().with(Arc::new(BuiltinRuntime::catalog()));
    let rendered = render(&input, &runtime, &RenderOptions::default());
    assert_eq!(rendered.error, None, "{name}");
    for (path, bytes) in &expected {
        assert_eq!(
            String::from_utf8_lossy(&rendered.files[path]),
            String::from_utf8_lossy(bytes),
            "{name}: {path}"
        );
    }
    let kptfile = String::from_utf8(rendered.files["Kptfile"].clone())?;
    assert!(
        kptfile.contains("status:\n  conditions:\n    - type: Rendered\n      status: \"True\"\n      reason: RenderSuccess\n"),
        "{kptfile}"
    );
    Ok(())
}

#[test]
fn apply_setters_simple() -> anyhow::Result<()> {
    vector("apply-setters-simple")
}

#[test]
fn set_namespace_simple() -> anyhow::Result<()> {
    vector("set-namespace-simple")
}
