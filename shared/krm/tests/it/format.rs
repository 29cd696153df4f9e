//! Our YAML writer against kpt's: every fixture file, rendered by kpt with an
//! identity function, must come out byte-identical from parse + emit.

use porch_krm::yaml::{SeqIndent, emit_documents, parse_documents};
use pretty_assertions::assert_eq;

use crate::support::{fixtures, identity_function, kpt_render, read_tree};

#[test]
fn yaml_files_are_written_back_as_kpt_writes_them() -> anyhow::Result<()> {
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
    let sources = read_tree(&fixtures().join("format"));
    for (name, bytes) in &sources {
        std::fs::write(pkg.join(name), bytes)?;
    }
    kpt_render(&pkg);
    let rendered = read_tree(&pkg);
    for (name, bytes) in &sources {
        let docs = parse_documents(std::str::from_utf8(bytes)?)?;
        let ours = emit_documents(docs.iter().map(|d| (&d.root, SeqIndent::derive(&d.text))));
        let theirs = String::from_utf8(rendered[name].clone())?;
        assert_eq!(ours, theirs, "{name}");
    }
    Ok(())
}
