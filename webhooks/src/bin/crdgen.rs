//! Writes every CRD to `infra/crds/` (or the directory given as the only argument).

use anyhow::Context;
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/crds")));
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    for (file, crd) in porch_api::crd::all()? {
        let path = dir.join(file);
        std::fs::write(&path, porch_api::crd::to_yaml(&crd)?)
            .with_context(|| format!("failed to write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
