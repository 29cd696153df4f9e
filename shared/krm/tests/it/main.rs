//! Integration tests of porch-krm.

mod builtins;
mod failures;
mod format;
mod render;
mod support;
