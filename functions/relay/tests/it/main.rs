//! Tests of the relay: the whole loop against a cluster in memory and real
//! git repositories through the in-process handlers; conflicts, retries and
//! refusals with scripted invokers; the kube-rs cluster and the Lambda-HTTP
//! invoker against mock servers with the API server's and Lambda's real
//! answers; a concurrency torture of many writers through the relay.

mod apiserver;
mod aws_lambda;
mod kube_cluster;
mod lambda_http;
mod lease;
mod relay_loop;
mod repository_status;
mod support;
mod torture;
mod variant;
mod variant_set;
mod watch;
