//! Flows across crates: the deployment manifests against the router and the
//! generated CRDs, and the Lambda host with real function URL events.

mod lambda;
mod manifests;
