//! KRM packages and kpt's render pipeline (krm-functions spec §1–§3, §5).
//!
//! - [`yaml`]: YAML trees that keep comments and formatting, written back as
//!   kpt writes them.
//! - [`package`] and [`resource`]: files ⇄ resources with their origin.
//! - [`resourcelist`]: the ResourceList wire format and function results.
//! - [`runtime`]: where functions run (builtins, executables; the function
//!   runner client).
//! - [`builtins`]: catalog functions in Rust.
//! - [`grpc`]: the function runner API (client runtime and service).
//! - [`render`]: `kpt fn render`.
//! - [`merge`]: three-way merge of packages for upgrades (`kpt pkg update`).
//! - [`variant`]: the changes a PackageVariant makes to its downstream drafts.

pub mod builtins;
pub mod grpc;
pub mod merge;
pub mod package;
pub mod render;
pub mod resource;
pub mod resourcelist;
pub mod runtime;
pub mod variant;
pub mod yaml;
