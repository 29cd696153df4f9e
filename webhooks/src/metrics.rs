//! Prometheus metrics: requests and latency by endpoint and result.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// Labels of every webhook metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    /// `allowed`, `denied`, `patched`, `converted`, `failed`, `invalid`, `ok`.
    pub result: &'static str,
}

/// Every (endpoint, result) pair the router records.
const SERIES: [(&str, &str); 11] = [
    ("validate", "allowed"),
    ("validate", "denied"),
    ("validate", "invalid"),
    ("mutate", "allowed"),
    ("mutate", "patched"),
    ("mutate", "denied"),
    ("mutate", "invalid"),
    ("convert", "converted"),
    ("convert", "failed"),
    ("healthz", "ok"),
    ("metrics", "ok"),
];

/// The registry and the metric families in it.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RequestLabels, Histogram>,
    /// Handles of the known series, so the hot path takes no lock.
    known: Arc<Vec<(&'static str, &'static str, Counter, Histogram)>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            // 50 µs .. ~1.6 s
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.00005, 2.0, 16,
            ))
        });
        let mut registry = Registry::with_prefix("porch_webhooks");
        registry.register(
            "requests",
            "Webhook requests by endpoint and result",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to answer a webhook request",
            latency.clone(),
        );
        let known = SERIES
            .iter()
            .map(|&(endpoint, result)| {
                let labels = RequestLabels { endpoint, result };
                let counter = requests.get_or_create(&labels).clone();
                let histogram = latency.get_or_create(&labels).clone();
                (endpoint, result, counter, histogram)
            })
            .collect();
        Self {
            registry: Arc::new(registry),
            requests,
            latency,
            known: Arc::new(known),
        }
    }
}

impl Metrics {
    /// Records one answered request.
    pub fn observe(&self, endpoint: &'static str, result: &'static str, elapsed: Duration) {
        if let Some((_, _, counter, histogram)) = self
            .known
            .iter()
            .find(|(e, r, _, _)| *e == endpoint && *r == result)
        {
            counter.inc();
            histogram.observe(elapsed.as_secs_f64());
            return;
        }
        let labels = RequestLabels { endpoint, result };
        self.requests.get_or_create(&labels).inc();
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
