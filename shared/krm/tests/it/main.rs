//! Integration tests of porch-krm.

mod builtins;
mod failures;
mod format;
mod grpc;
mod merge;
mod render;
mod support;
mod variant;
mod vectors;
