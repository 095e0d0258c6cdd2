//! Prometheus metrics for the admin `/metrics` endpoint.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, &'static str)>;

/// Every metric Larder records.
pub struct Metrics {
    registry: Registry,
    /// Client requests by `operation` and `cache` result.
    pub requests: Family<Labels, Counter>,
    /// Time from request to response headers, by `operation`.
    pub request_duration: Family<Labels, Histogram, fn() -> Histogram>,
    /// Requests sent upstream by `operation` and `outcome`.
    pub upstream_requests: Family<Labels, Counter>,
    /// Body bytes received from upstream.
    pub upstream_bytes: Counter,
    /// Body bytes sent to clients, by the `tier` they came from (`memory` or `upstream`).
    pub served_bytes: Family<Labels, Counter>,
    /// Block reads that joined a fetch already in flight instead of starting one.
    pub coalesced: Counter,
    /// Blocks fetched but not written to the cache, by `reason`.
    pub cache_writes_dropped: Family<Labels, Counter>,
    /// Memory tier capacity in bytes.
    pub memory_capacity: Gauge<u64, AtomicU64>,
    /// Memory tier bytes held.
    pub memory_used: Gauge<u64, AtomicU64>,
    /// Memory tier entries held.
    pub memory_entries: Gauge<u64, AtomicU64>,
    /// Memory tier evictions (including blocks the admission policy turned away).
    pub memory_evictions: Gauge<u64, AtomicU64>,
}

fn latency_histogram() -> Histogram {
    // 100 µs to ~26 s.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0001, 2.0, 19,
    ))
}

fn registered<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("larder");
        let latency =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        Self {
            requests: registered(
                &mut r,
                "requests",
                "Client requests by operation and cache result",
                Family::default(),
            ),
            request_duration: registered(
                &mut r,
                "request_duration_seconds",
                "Time from request to response headers",
                latency,
            ),
            upstream_requests: registered(
                &mut r,
                "upstream_requests",
                "Requests sent upstream by operation and outcome",
                Family::default(),
            ),
            upstream_bytes: registered(
                &mut r,
                "upstream_received_bytes",
                "Body bytes received from upstream",
                Counter::default(),
            ),
            served_bytes: registered(
                &mut r,
                "served_bytes",
                "Body bytes sent to clients by the tier they came from",
                Family::default(),
            ),
            coalesced: registered(
                &mut r,
                "singleflight_coalesced",
                "Block reads that joined a fetch already in flight",
                Counter::default(),
            ),
            cache_writes_dropped: registered(
                &mut r,
                "cache_writes_dropped",
                "Fetched blocks not written to the cache, by reason",
                Family::default(),
            ),
            memory_capacity: registered(
                &mut r,
                "memory_capacity_bytes",
                "Memory tier capacity",
                Gauge::default(),
            ),
            memory_used: registered(
                &mut r,
                "memory_used_bytes",
                "Memory tier bytes held",
                Gauge::default(),
            ),
            memory_entries: registered(
                &mut r,
                "memory_entries",
                "Memory tier entries held",
                Gauge::default(),
            ),
            memory_evictions: registered(
                &mut r,
                "memory_evictions",
                "Memory tier evictions, including admission rejections",
                Gauge::default(),
            ),
            registry: r,
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// Total of a labelled counter family over the label sets given.
    pub fn count(family: &Family<Labels, Counter>, labels: &[(&'static str, &'static str)]) -> u64 {
        family.get_or_create(&labels.to_vec()).get()
    }
}
