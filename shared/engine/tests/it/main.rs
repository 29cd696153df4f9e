//! Integration tests of porch-engine: handlers against real git
//! repositories on disk.

mod lifecycle;
mod render;
mod source;
mod support;
