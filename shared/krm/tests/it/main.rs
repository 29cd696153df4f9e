//! Integration tests of porch-krm.

mod format;
mod support;
