//! Cross-crate tests live in `it/`. The library holds the fuzz properties
//! ([`fuzz`]), shared by the libFuzzer targets in `fuzz/` and by the corpus
//! replay test.

pub mod fuzz;
