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

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("larder");
        let requests = Family::<Labels, Counter>::default();
        registry.register(
            "requests",
            "Client requests by operation and cache result",
            requests.clone(),
        );
        let request_duration =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        registry.register(
            "request_duration_seconds",
            "Time from request to response headers",
            request_duration.clone(),
        );
        let upstream_requests = Family::<Labels, Counter>::default();
        registry.register(
            "upstream_requests",
            "Requests sent upstream by operation and outcome",
            upstream_requests.clone(),
        );
        let upstream_bytes = Counter::default();
        registry.register(
            "upstream_received_bytes",
            "Body bytes received from upstream",
            upstream_bytes.clone(),
        );
        let served_bytes = Family::<Labels, Counter>::default();
        registry.register(
            "served_bytes",
            "Body bytes sent to clients by the tier they came from",
            served_bytes.clone(),
        );
        let coalesced = Counter::default();
        registry.register(
            "singleflight_coalesced",
            "Block reads that joined a fetch already in flight",
            coalesced.clone(),
        );
        let cache_writes_dropped = Family::<Labels, Counter>::default();
        registry.register(
            "cache_writes_dropped",
            "Fetched blocks not written to the cache, by reason",
            cache_writes_dropped.clone(),
        );
        let memory_capacity = Gauge::default();
        registry.register(
            "memory_capacity_bytes",
            "Memory tier capacity",
            memory_capacity.clone(),
        );
        let memory_used = Gauge::default();
        registry.register(
            "memory_used_bytes",
            "Memory tier bytes held",
            memory_used.clone(),
        );
        let memory_entries = Gauge::default();
        registry.register(
            "memory_entries",
            "Memory tier entries held",
            memory_entries.clone(),
        );
        let memory_evictions = Gauge::default();
        registry.register(
            "memory_evictions",
            "Memory tier evictions, including admission rejections",
            memory_evictions.clone(),
        );
        Self {
            registry,
            requests,
            request_duration,
            upstream_requests,
            upstream_bytes,
            served_bytes,
            coalesced,
            cache_writes_dropped,
            memory_capacity,
            memory_used,
            memory_entries,
            memory_evictions,
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
