//! Integration tests of porch-krm.

mod failures;
mod format;
mod render;
mod support;
