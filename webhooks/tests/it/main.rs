//! Integration tests of porch-webhooks: fixture reviews through the router,
//! HTTP edge cases, SubjectAccessReview against a mock apiserver, and the
//! HTTPS binary end to end.

mod fixtures;
mod https;
mod router;
mod sar;
mod support;
