//! The builtin functions against kpt: kpt runs them as executables
//! (`fn-runner exec <name>`), our render runs them in-process; the packages
//! must come out byte-identical.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use porch_krm::builtins::BuiltinRuntime;
use porch_krm::render::{RenderOptions, render};
use porch_krm::runtime::{
    Call, FunctionError, FunctionOutput, FunctionRef, FunctionRuntime, Runtimes,
};
use pretty_assertions::assert_eq;

const FN_RUNNER: &str = env!("CARGO_BIN_EXE_fn-runner");

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                out.insert(
                    rel.to_string_lossy().into_owned(),
                    std::fs::read(&path).expect("read"),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// `exec: <fn-runner> exec <name>` runs the builtin of that name in-process.
#[derive(Debug)]
struct ExecAsBuiltin(BuiltinRuntime);

impl FunctionRuntime for ExecAsBuiltin {
    fn run(&self, call: Call<'_>) -> Result<FunctionOutput, FunctionError> {
        let FunctionRef::Exec(command) = call.function else {
            return Err(FunctionError::NotFound(call.function.display().to_owned()));
        };
        let name = command.rsplit(' ').next().unwrap_or("");
        self.0.run_named(name, call.items, call.config)
    }
}

fn conformance(fixture: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pkg = dir.path().join("pkg");
    let mut files = read_tree(&fixtures().join(fixture));
    for (path, bytes) in files.iter_mut() {
        if path.ends_with("Kptfile") {
            *bytes = String::from_utf8(bytes.clone())?
                .replace("FN ", &format!("{FN_RUNNER} exec "))
                .into_bytes();
        }
        let target = pkg.join(path);
        std::fs::create_dir_all(target.parent().expect("parent"))?;
        std::fs::write(target, &bytes)?;
    }
    let output = Command::new("kpt")
        .args(["fn", "render", "--allow-exec", "--truncate-output=false"])
        .arg(&pkg)
        .output()?;
    assert!(
        output.status.success(),
        "kpt: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let expected = read_tree(&pkg);

    let runtime = Runtimes::new().with(Arc::new(ExecAsBuiltin(BuiltinRuntime::catalog())));
    let options = RenderOptions {
        record_status: false,
        attribution: Some("kpt-fn".into()),
        ..RenderOptions::default()
    };
    let rendered = render(&files, &runtime, &options);
    assert_eq!(rendered.error, None);
    for (path, bytes) in &expected {
        assert_eq!(
            String::from_utf8_lossy(&rendered.files[path]),
            String::from_utf8_lossy(bytes),
            "{path}"
        );
    }
    assert_eq!(rendered.files.len(), expected.len());
    Ok(())
}

#[test]
fn catalog_functions_match_kpt_running_them_as_executables() -> anyhow::Result<()> {
    conformance("catalog")
}

#[test]
fn set_image_and_search_replace_match_kpt() -> anyhow::Result<()> {
    conformance("catalog-more")
}
