//! The watch relay: it keeps the objects it watches, asks the planner what
//! each one needs, invokes the handler for it and applies the Outcome.
//!
//! - [`cluster`]: what the relay needs of the API server, and the Outcome
//!   rules ([`cluster::apply_outcome`]).
//! - [`memory`]: a cluster in memory (the CLI's objects, the tests').
//! - [`kube`]: the API server through kube-rs.
//! - [`invoker`]: how a handler is reached: in-process or over HTTP
//!   (`cargo lambda watch`, Lambda function URLs).
//! - [`relay`]: the work queue, the planning and the retries.
//! - [`watch`]: Kubernetes watches feeding the relay.
//! - [`lease`]: leader election on a Lease.
//! - [`metrics`], [`server`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`app`]: the `porch-relay` process (configuration, leader election,
//!   graceful stop).

pub mod app;
pub mod cluster;
pub mod invoker;
pub mod kube;
pub mod lease;
pub mod memory;
pub mod metrics;
pub mod relay;
pub mod server;
pub mod watch;
