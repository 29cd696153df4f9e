//! Integration tests of porch-engine: handlers against real git
//! repositories on disk.

mod adopt;
mod bad_input;
mod delete;
mod e2e;
mod lifecycle;
mod render;
mod repository;
mod runner;
mod secrets;
mod source;
mod support;
mod sync;
mod variant;
mod variant_set;
