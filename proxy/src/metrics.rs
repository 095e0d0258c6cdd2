//! Prometheus metrics for the admin `/metrics` endpoint.

use std::sync::atomic::AtomicU64;

use cache_core::disk::DropReason;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
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

/// Reads the disk tier's counters at each scrape (they live in cache-core, which knows nothing of
/// Prometheus).
struct DiskCollector(cache_core::DiskCache);

impl std::fmt::Debug for DiskCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DiskCollector")
    }
}

impl Collector for DiskCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.stats();
        let counters: [(&str, &str, u64); 13] = [
            (
                "disk_hits",
                "Disk tier reads served (including entries still in flight)",
                s.hits,
            ),
            (
                "disk_misses",
                "Disk tier reads that found nothing (including the faults below)",
                s.misses,
            ),
            (
                "disk_hit_bytes",
                "Value bytes served by the disk tier",
                s.hit_bytes,
            ),
            (
                "disk_corrupt_reads",
                "Disk reads that failed a checksum; served as misses",
                s.corrupt,
            ),
            (
                "disk_raced_reads",
                "Disk reads that lost a race with region reclaim; served as misses",
                s.raced,
            ),
            (
                "disk_hash_collisions",
                "Disk reads that found another key with the same hash",
                s.collisions,
            ),
            (
                "disk_io_errors",
                "Disk reads the device failed",
                s.io_errors,
            ),
            ("disk_writes", "Entries written to the disk tier", s.writes),
            (
                "disk_written_bytes",
                "Bytes written to the disk tier, headers and padding included",
                s.written_bytes,
            ),
            (
                "disk_reclaimed_regions",
                "Disk regions reclaimed",
                s.reclaimed_regions,
            ),
            (
                "disk_evicted_entries",
                "Disk entries evicted by reclaim",
                s.evicted_entries,
            ),
            (
                "disk_reinserted_entries",
                "Hit disk entries copied forward by reclaim",
                s.reinserted,
            ),
            (
                "disk_recovered_entries",
                "Entries recovered from the disk tier at start",
                self.0.recovery().entries,
            ),
        ];
        for (name, help, value) in counters {
            let m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(m)?;
        }
        let gauges: [(&str, &str, u64); 7] = [
            (
                "disk_capacity_bytes",
                "Bytes of disk regions",
                s.capacity_bytes,
            ),
            (
                "disk_live_bytes",
                "Bytes of indexed disk entries",
                s.live_bytes,
            ),
            ("disk_entries", "Entries in the disk index", s.entries),
            (
                "disk_inflight_entries",
                "Entries accepted for a disk write and not yet written",
                s.inflight_entries,
            ),
            (
                "disk_index_bytes",
                "Heap bytes of the disk index",
                s.index_bytes,
            ),
            ("disk_free_regions", "Disk regions free", s.free_regions),
            (
                "disk_recovery_milliseconds",
                "Time the disk tier took to open at start",
                self.0.recovery().duration.as_millis() as u64,
            ),
        ];
        for (name, help, value) in gauges {
            let m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value as i64).encode(m)?;
        }
        let mut family = encoder.encode_descriptor(
            "disk_writes_dropped",
            "Blocks offered to the disk tier and not written, by reason",
            None,
            MetricType::Counter,
        )?;
        for reason in DropReason::ALL {
            let labels = [("reason", reason.as_str())];
            let m = family.encode_family(&labels)?;
            ConstCounter::new(s.dropped(reason)).encode(m)?;
        }
        Ok(())
    }
}

impl Metrics {
    /// Also export the disk tier's counters.
    pub fn with_disk(mut self, disk: cache_core::DiskCache) -> Self {
        self.registry
            .register_collector(Box::new(DiskCollector(disk)));
        self
    }

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
