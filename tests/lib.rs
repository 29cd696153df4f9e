//! Cross-crate tests live in `it/`; this library is empty.
