//! Prometheus metrics of the relay: queue depth, invocations and their
//! latency by operation and result, retries, conflicts.

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of an invocation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InvocationLabels {
    pub operation: &'static str,
    /// `ok`, `retryable`, `invalid`.
    pub result: &'static str,
}

/// The registry and the metric families in it.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub invocations: Family<InvocationLabels, Counter>,
    pub latency: Family<InvocationLabels, Histogram>,
    pub retries: Counter,
    pub conflicts: Counter,
    pub queue_depth: Gauge<i64, AtomicI64>,
}

impl Default for Metrics {
    fn default() -> Self {
        let invocations = Family::<InvocationLabels, Counter>::default();
        let latency = Family::<InvocationLabels, Histogram>::new_with_constructor(|| {
            // 1 ms .. ~65 s
            Histogram::new(exponential_buckets(0.001, 2.0, 17))
        });
        let retries = Counter::default();
        let conflicts = Counter::default();
        let queue_depth = Gauge::<i64, AtomicI64>::default();
        let mut registry = Registry::with_prefix("porch_relay");
        registry.register(
            "invocations",
            "Handler invocations by operation and result",
            invocations.clone(),
        );
        registry.register(
            "invocation_duration_seconds",
            "Time from invoking a handler to its answer",
            latency.clone(),
        );
        registry.register(
            "retries",
            "Invocations and Outcome writes retried after a retryable failure",
            retries.clone(),
        );
        registry.register(
            "conflicts",
            "Outcome patches refused because the object had changed (re-read and re-planned)",
            conflicts.clone(),
        );
        registry.register(
            "queue_depth",
            "Revisions and repositories waiting for work",
            queue_depth.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            invocations,
            latency,
            retries,
            conflicts,
            queue_depth,
        }
    }
}

impl Metrics {
    /// Records one invocation.
    pub fn observe(&self, operation: &'static str, result: &'static str, elapsed: Duration) {
        let labels = InvocationLabels { operation, result };
        self.invocations.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // writing to a String cannot fail
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
