//! Flows across crates: the deployment manifests against the router and the
//! generated CRDs, the AWS template against the functions and the relay, and
//! the Lambda host with real function URL events.

mod aws_template;
mod lambda;
mod manifests;
