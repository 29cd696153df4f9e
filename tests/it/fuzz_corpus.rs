//! Every committed fuzz input, seeds and crash reproducers alike, through the
//! property its target checks: `fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/`.

use porch_tests::fuzz::TARGETS;
use std::path::Path;

fn inputs(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .map(|e| e.expect("a corpus entry reads").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn committed_fuzz_inputs_keep_their_properties() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    for (target, check) in TARGETS {
        let seeds = inputs(&root.join("corpus").join(target));
        assert!(!seeds.is_empty(), "fuzz/corpus/{target} has no seeds");
        for file in seeds
            .iter()
            .chain(&inputs(&root.join("regressions").join(target)))
        {
            let data = std::fs::read(file).expect("a corpus file reads");
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(
                outcome.is_ok(),
                "{target}: {} breaks a property",
                file.display()
            );
        }
    }
}
