//! Integration tests of porch-git against the git CLI (tests may use git;
//! product code never does).

mod compat;
mod discovery;
mod operations;
mod remote;
mod repo;
mod s3;
mod snapshot;
mod store;
mod support;
