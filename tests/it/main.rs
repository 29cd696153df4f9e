//! Flows across crates: the deployment manifests against the router and the
//! generated CRDs, the AWS template against the functions and the relay, the
//! Lambda host with real function URL events, and the committed fuzz inputs
//! through their properties.

mod aws_template;
mod fuzz_corpus;
mod lambda;
mod manifests;
