//! Properties checked on arbitrary input, one function per fuzz target.
//!
//! Each function takes the raw bytes libFuzzer generates and panics when a
//! property breaks: a panic inside the product code, or an answer that breaks
//! its contract. `fuzz/fuzz_targets/<name>.rs` calls `<name>`;
//! `it/fuzz_corpus.rs` replays every file of `fuzz/corpus/<name>/` and
//! `fuzz/regressions/<name>/` through the same function on stable Rust.

mod git;
mod krm;
mod names;
mod webhooks;

pub use git::{pktline, snapshot_manifest};
pub use krm::{kptfile, package_split_join, resourcelist};
pub use names::names;
pub use webhooks::{admission, conversion};

/// A property over one fuzz input; panics when it breaks.
pub type Property = fn(&[u8]);

/// The targets, by the name of their corpus directory.
pub const TARGETS: [(&str, Property); 8] = [
    ("admission", admission),
    ("conversion", conversion),
    ("kptfile", kptfile),
    ("resourcelist", resourcelist),
    ("package_split_join", package_split_join),
    ("names", names),
    ("pktline", pktline),
    ("snapshot_manifest", snapshot_manifest),
];
