//! Integration tests of porch-krm.

mod format;
mod render;
mod support;
