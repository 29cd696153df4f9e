//! KRM packages and kpt's render pipeline (krm-functions spec §2, §3, §5).
//!
//! - [`yaml`]: YAML trees that keep comments and formatting, written back as
//!   kpt writes them.

pub mod yaml;
