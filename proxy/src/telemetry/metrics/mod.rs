//! Metrics through OpenTelemetry: instruments on an SDK meter provider, read by a Prometheus
//! exporter for the admin `/metrics` endpoint and, with `otlp_endpoint`, pushed by OTLP too.
//!
//! Label values come from fixed sets (operation names, cache results, status codes, reasons) so
//! cardinality stays bounded; bucket names appear only for the buckets listed in
//! `metrics_buckets`. The cost counters price every request with [`Prices`], so that the net
//! saving is one query: `sum(larder_cost_direct_dollars_total) -
//! sum(larder_cost_upstream_dollars_total)`.

//!
//! This file sets up the instruments and records events; [`cost`] prices requests, `observe`
//! exports the gauges read at each collection (memory, disk, fleet, buffers), and [`snapshot`]
//! reads gathered metrics back (for the status page and tests).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::model::UpstreamOutcome;
use crate::telemetry::labels::{
    EventOutcome, Lookup, NoticeOutcome, PrefetchBlock, PrefetchBytes, Rejected, Source,
    ThrottleEvent, WriteDropped,
};
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;
use parking_lot::Mutex;
use prometheus::proto::MetricFamily;

pub mod cost;
mod observe;
pub mod snapshot;

pub use cost::{Prices, RequestClass};
pub use observe::FleetGauges;
pub use snapshot::Snapshot;

/// How metrics are exported beyond `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct MetricsOptions {
    /// Prices for the cost counters.
    pub prices: Prices,
    /// Buckets named in a `bucket` label; others are `other`. Empty: no `bucket` label.
    pub buckets: Vec<String>,
    /// OTLP/HTTP collector base URL (`http://collector:4318`) and push interval.
    pub otlp: Option<(String, Duration)>,
}

/// Why metrics could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("setting up metrics: {0}")]
pub struct MetricsError(String);

/// The upstream's recent health, for the status page.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct UpstreamHealth {
    /// The last upstream failure: seconds since the Unix epoch and what happened.
    pub last_error: Option<(u64, String)>,
}

/// Every metric Larder records.
pub struct Metrics {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
    meter: Meter,
    prices: Prices,
    /// The `bucket` label of each bucket listed in `metrics_buckets`, made once (a label's
    /// value is shared, not copied, per request).
    bucket_labels: Vec<(String, KeyValue)>,
    started: Instant,
    health: Mutex<UpstreamHealth>,
    requests: Counter<u64>,
    time_to_first_byte: Histogram<f64>,
    response_duration: Histogram<f64>,
    upstream_requests: Counter<u64>,
    upstream_duration: Histogram<f64>,
    upstream_bytes: Counter<u64>,
    served_bytes: Counter<u64>,
    lookups: Counter<u64>,
    coalesced: Counter<u64>,
    cache_writes_dropped: Counter<u64>,
    blocks_rejected: Counter<u64>,
    response_buffer_waits: Counter<u64>,
    cost_direct: Counter<f64>,
    cost_upstream: Counter<f64>,
    resumes: Counter<u64>,
    hedges: Counter<u64>,
    run_blocks: Counter<u64>,
    throttle: Counter<u64>,
    prefetch_blocks: Counter<u64>,
    prefetch_bytes: Counter<u64>,
    warm_jobs: Counter<u64>,
    warm_bytes: Counter<u64>,
    events: Counter<u64>,
    event_lag: Histogram<f64>,
    notices: Counter<u64>,
    peer_requests: Counter<u64>,
    peer_duration: Histogram<f64>,
    peer_fallbacks: Counter<u64>,
    peer_bytes: Counter<u64>,
    fleet_changes: Counter<u64>,
}

fn latency_boundaries() -> Vec<f64> {
    // 100 µs to ~26 s, doubling.
    (0..19).map(|i| 0.0001 * 2f64.powi(i)).collect()
}

fn kv(key: &'static str, value: &'static str) -> KeyValue {
    KeyValue::new(key, value)
}

/// The `status` label's value: the code as text, made once per code rather than per request.
fn status_value(status: u16) -> opentelemetry::Value {
    static CODES: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| (100..600u16).map(|c| c.to_string()).collect());
    match status
        .checked_sub(100)
        .and_then(|i| CODES.get(usize::from(i)))
    {
        Some(text) => text.as_str().into(),
        None => status.to_string().into(),
    }
}

/// `labels`, then the `bucket` label when buckets are labelled, as one slice on the stack: it
/// is made on every request, so not in a `Vec`.
fn with_bucket<const N: usize>(labels: [KeyValue; N], bucket: &Option<KeyValue>) -> LabelSet {
    let mut set = LabelSet {
        slots: std::array::from_fn(|_| kv("", "")),
        len: 0,
    };
    for label in labels.into_iter().chain(bucket.clone()) {
        set.slots[set.len] = label;
        set.len += 1;
    }
    set
}

/// At most four labels, the most any per-request instrument takes.
struct LabelSet {
    slots: [KeyValue; 4],
    len: usize,
}

impl std::ops::Deref for LabelSet {
    type Target = [KeyValue];
    fn deref(&self) -> &[KeyValue] {
        &self.slots[..self.len]
    }
}

impl Default for Metrics {
    fn default() -> Self {
        // Without OTLP nothing can fail.
        Self::new(MetricsOptions::default()).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Metrics {
    /// Instruments on a meter provider of their own (not the global one, so tests stay apart).
    pub fn new(options: MetricsOptions) -> Result<Self, MetricsError> {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_units()
            .scope_info_enabled(false)
            .build()
            .map_err(|e| MetricsError(e.to_string()))?;
        let mut builder = SdkMeterProvider::builder()
            .with_resource(resource())
            .with_reader(exporter);
        if let Some((endpoint, interval)) = &options.otlp {
            let otlp = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_endpoint(otlp_url(endpoint, "metrics"))
                .build()
                .map_err(|e| MetricsError(e.to_string()))?;
            builder = builder.with_reader(
                PeriodicReader::builder(otlp)
                    .with_interval(*interval)
                    .build(),
            );
        }
        let provider = builder.build();
        let meter = provider.meter("larder");
        let counter = |name: &'static str, help: &'static str| {
            meter.u64_counter(name).with_description(help).build()
        };
        let dollars = |name: &'static str, help: &'static str| {
            meter.f64_counter(name).with_description(help).build()
        };
        let latency = |name: &'static str, help: &'static str| {
            meter
                .f64_histogram(name)
                .with_description(help)
                .with_boundaries(latency_boundaries())
                .build()
        };
        let cache_writes_dropped = counter(
            "larder.cache.writes.dropped",
            "Fetched blocks not written to the cache, by reason",
        );
        // Series that may stay at zero are exported from the start, so dashboards and alerts
        // see 0 rather than nothing.
        for reason in ["fetch_failed", "warm_rejected", "mixed_source"] {
            cache_writes_dropped.add(0, &[kv("reason", reason)]);
        }
        let blocks_rejected = counter(
            "larder.cache.blocks.rejected",
            "Blocks found in a tier but refused and fetched again, by reason",
        );
        blocks_rejected.add(0, &[kv("reason", "length")]);
        let coalesced = counter(
            "larder.singleflight.coalesced",
            "Block reads that joined a fetch already in flight",
        );
        coalesced.add(0, &[]);
        let resumes = counter(
            "larder.upstream.resumes",
            "Upstream bodies that broke and were resumed from the byte where they stopped",
        );
        resumes.add(0, &[]);
        let hedges = counter(
            "larder.upstream.hedges",
            "Hedged block GETs sent (outcome=sent) and those that answered first (outcome=won)",
        );
        let run_blocks = counter(
            "larder.upstream.run_blocks",
            "Blocks a cold read's first GET brought past its first block, each a GET not sent",
        );
        run_blocks.add(0, &[]);
        let throttle = counter(
            "larder.upstream.throttle",
            "The per-prefix throttle, by event: limited (a prefix answered SlowDown and is paced), cut (answered it again), lifted (no longer paced), delayed (a request waited for its prefix's pace)",
        );
        for event in ThrottleEvent::ALL {
            throttle.add(0, &[kv("event", event.as_str())]);
        }
        let prefetch_blocks = counter(
            "larder.prefetch.blocks",
            "Read-ahead blocks by outcome: issued, skipped_busy (no free upstream slot), skipped_budget",
        );
        let prefetch_bytes = counter(
            "larder.prefetch.bytes",
            "Read-ahead bytes later read by a client (used) or never read (wasted)",
        );
        let warm_jobs = counter(
            "larder.warm.jobs",
            "Warm-up jobs by how they ended: done, failed, cancelled",
        );
        let warm_bytes = counter(
            "larder.warm.bytes",
            "Bytes warm-up jobs fetched into the cache",
        );
        for outcome in ["sent", "won"] {
            hedges.add(0, &[kv("outcome", outcome)]);
        }
        for outcome in PrefetchBlock::ALL {
            prefetch_blocks.add(0, &[kv("outcome", outcome.as_str())]);
        }
        for outcome in PrefetchBytes::ALL {
            prefetch_bytes.add(0, &[kv("outcome", outcome.as_str())]);
        }
        for outcome in ["done", "failed", "cancelled"] {
            warm_jobs.add(0, &[kv("outcome", outcome)]);
        }
        warm_bytes.add(0, &[]);
        let peer_fallbacks = counter(
            "larder.peer.fallbacks",
            "Peer requests given up for the upstream, by reason: unreachable, timeout, error, broken (body cut mid-way)",
        );
        for reason in ["unreachable", "timeout", "error", "broken"] {
            peer_fallbacks.add(0, &[kv("reason", reason)]);
        }
        let events = counter(
            "larder.events",
            "S3 event notifications' changes by outcome: applied, unchanged, not_cached, malformed",
        );
        for outcome in EventOutcome::ALL {
            events.add(0, &[kv("outcome", outcome.as_str())]);
        }
        let notices = counter(
            "larder.fleet.notices",
            "Changes told between replicas (a write through one, an S3 event received by one) by outcome: sent, failed, dropped, received",
        );
        for outcome in NoticeOutcome::ALL {
            notices.add(0, &[kv("outcome", outcome.as_str())]);
        }
        let fleet_changes = counter(
            "larder.fleet.membership.changes",
            "Membership changes that moved block ownership",
        );
        fleet_changes.add(0, &[]);
        Ok(Self {
            peer_requests: counter(
                "larder.peer.requests",
                "Requests between replicas by direction (made, served), kind (block, open) and outcome",
            ),
            peer_duration: latency(
                "larder.peer.duration.seconds",
                "Time for a peer to start answering, by kind",
            ),
            peer_fallbacks,
            peer_bytes: counter(
                "larder.peer.bytes",
                "Block bytes between replicas by direction (received, sent)",
            ),
            fleet_changes,
            resumes,
            hedges,
            run_blocks,
            throttle,
            prefetch_blocks,
            prefetch_bytes,
            warm_jobs,
            warm_bytes,
            events,
            notices,
            event_lag: latency(
                "larder.events.lag.seconds",
                "Time from a change in the bucket (the event's eventTime) to Larder applying it",
            ),
            requests: counter(
                "larder.requests",
                "Client requests by operation, status and cache result",
            ),
            time_to_first_byte: latency(
                "larder.request.ttfb.seconds",
                "Time from request to response headers, by operation",
            ),
            response_duration: latency(
                "larder.response.duration.seconds",
                "Time from request to the last body byte sent (or the client leaving), by operation",
            ),
            upstream_requests: counter(
                "larder.upstream.requests",
                "Requests sent upstream by operation and status",
            ),
            upstream_duration: latency(
                "larder.upstream.duration.seconds",
                "Upstream response time to headers, by operation",
            ),
            upstream_bytes: counter(
                "larder.upstream.received.bytes",
                "Object bytes received from upstream for the cache",
            ),
            served_bytes: counter(
                "larder.served.bytes",
                "Object bytes sent to clients by the tier they came from",
            ),
            lookups: counter(
                "larder.cache.lookups",
                "Block lookups by tier and result (hit or miss)",
            ),
            coalesced,
            cache_writes_dropped,
            blocks_rejected,
            response_buffer_waits: counter(
                "larder.response.buffer.waits",
                "Blocks a response waited to open because response_buffer was full",
            ),
            cost_direct: dollars(
                "larder.cost.direct.dollars",
                "What the clients' requests would have cost sent straight to S3, by kind",
            ),
            cost_upstream: dollars(
                "larder.cost.upstream.dollars",
                "What Larder's own upstream requests cost, by kind",
            ),
            provider,
            registry,
            meter,
            prices: options.prices,
            bucket_labels: options
                .buckets
                .into_iter()
                .map(|b| {
                    let label = KeyValue::new("bucket", Arc::<str>::from(b.as_str()));
                    (b, label)
                })
                .collect(),
            started: Instant::now(),
            health: Mutex::new(UpstreamHealth::default()),
        })
    }

    /// The label value for `bucket`, if buckets are labelled at all.
    fn bucket_label(&self, bucket: Option<&str>) -> Option<KeyValue> {
        if self.bucket_labels.is_empty() {
            return None;
        }
        let listed = bucket.and_then(|b| self.bucket_labels.iter().find(|(name, _)| name == b));
        Some(listed.map_or_else(|| kv("bucket", "other"), |(_, label)| label.clone()))
    }

    /// A client request answered: its headers are on their way.
    pub fn request(
        &self,
        operation: &'static str,
        bucket: Option<&str>,
        status: u16,
        cache: &'static str,
        ttfb: Duration,
    ) {
        let bucket = self.bucket_label(bucket);
        let labels = [
            kv("operation", operation),
            KeyValue::new("status", status_value(status)),
            kv("cache", cache),
        ];
        self.requests.add(1, &with_bucket(labels, &bucket));
        self.time_to_first_byte
            .record(ttfb.as_secs_f64(), &[kv("operation", operation)]);
        let price = self.prices.request(RequestClass::of(operation));
        if price > 0.0 {
            let labels = [kv("kind", "requests")];
            self.cost_direct.add(price, &with_bucket(labels, &bucket));
        }
    }

    /// A client response's body ended (or the client left) `elapsed` after the request came in.
    pub fn response_done(&self, operation: &'static str, elapsed: Duration) {
        self.response_duration
            .record(elapsed.as_secs_f64(), &[kv("operation", operation)]);
    }

    /// A request upstream answered with `status` (or failed, as `status` says) after `elapsed`.
    pub fn upstream(&self, operation: &'static str, status: UpstreamOutcome, elapsed: Duration) {
        let status_label = match status {
            UpstreamOutcome::Http(code) => KeyValue::new("status", status_value(code)),
            UpstreamOutcome::Failed(reason) => kv("status", reason),
        };
        self.upstream_requests
            .add(1, &[kv("operation", operation), status_label]);
        self.upstream_duration
            .record(elapsed.as_secs_f64(), &[kv("operation", operation)]);
        let price = self.prices.request(RequestClass::of(operation));
        if price > 0.0 {
            self.cost_upstream.add(price, &[kv("kind", "requests")]);
        }
    }

    /// Remember an upstream failure for the status page.
    pub fn upstream_failed(&self, what: &impl std::fmt::Display) {
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.health.lock().last_error = Some((at, what.to_string()));
    }

    /// Object bytes received from upstream for the cache.
    pub fn upstream_received(&self, bytes: u64) {
        self.upstream_bytes.add(bytes, &[]);
        if self.prices.transfer_byte > 0.0 {
            self.cost_upstream.add(
                bytes as f64 * self.prices.transfer_byte,
                &[kv("kind", "transfer")],
            );
        }
    }

    /// Object bytes sent to a client, from `tier`.
    pub fn served(&self, tier: Source, bucket: Option<&str>, bytes: u64) {
        let bucket = self.bucket_label(bucket);
        let labels = [kv("tier", tier.as_str())];
        self.served_bytes.add(bytes, &with_bucket(labels, &bucket));
        if self.prices.transfer_byte > 0.0 {
            let labels = [kv("kind", "transfer")];
            self.cost_direct.add(
                bytes as f64 * self.prices.transfer_byte,
                &with_bucket(labels, &bucket),
            );
        }
    }

    /// A broken upstream body was resumed.
    pub fn resumed(&self) {
        self.resumes.add(1, &[]);
    }

    /// A hedged GET was sent (`won: false`), or answered before the original (`won: true`).
    pub fn hedged(&self, won: bool) {
        let outcome = if won { "won" } else { "sent" };
        self.hedges.add(1, &[kv("outcome", outcome)]);
    }

    /// A cold read's first GET brought a block past its first (`read/blocks/pace.rs`).
    pub fn run_block(&self) {
        self.run_blocks.add(1, &[]);
    }

    /// The per-prefix throttle did `event`.
    pub fn throttle(&self, event: ThrottleEvent) {
        self.throttle.add(1, &[kv("event", event.as_str())]);
    }

    /// A read-ahead block issued or skipped.
    pub fn prefetch_blocks(&self, outcome: PrefetchBlock) {
        self.prefetch_blocks
            .add(1, &[kv("outcome", outcome.as_str())]);
    }

    /// Read-ahead bytes used or wasted.
    pub fn prefetch_bytes(&self, outcome: PrefetchBytes, bytes: u64) {
        self.prefetch_bytes
            .add(bytes, &[kv("outcome", outcome.as_str())]);
    }

    /// A warm-up job ended.
    pub fn warm_job(&self, outcome: &'static str) {
        self.warm_jobs.add(1, &[kv("outcome", outcome)]);
    }

    /// Bytes a warm-up job fetched.
    pub fn warm_bytes(&self, bytes: u64) {
        self.warm_bytes.add(bytes, &[]);
    }

    /// One change from an S3 event notification, and how long after the change it arrived
    /// (`lag`; zero when the event has no time or the clocks disagree). A refused notification
    /// is counted with [`EventOutcome::Malformed`].
    pub fn event(&self, outcome: EventOutcome, lag: Duration) {
        self.events.add(1, &[kv("outcome", outcome.as_str())]);
        if outcome != EventOutcome::Malformed {
            self.event_lag.record(lag.as_secs_f64(), &[]);
        }
    }

    /// A change told to another replica, or received from one.
    pub fn notice(&self, outcome: NoticeOutcome) {
        self.notices.add(1, &[kv("outcome", outcome.as_str())]);
    }

    /// A request between replicas: `direction` `made` or `served`, `kind` `block` or `open`,
    /// and how it went; a request made also records how long the peer took to answer.
    pub fn peer_request(
        &self,
        direction: &'static str,
        kind: &'static str,
        outcome: &'static str,
        elapsed: Option<Duration>,
    ) {
        self.peer_requests.add(
            1,
            &[
                kv("direction", direction),
                kv("kind", kind),
                kv("outcome", outcome),
            ],
        );
        if let Some(elapsed) = elapsed {
            self.peer_duration
                .record(elapsed.as_secs_f64(), &[kv("kind", kind)]);
        }
    }

    /// A peer could not be used and the upstream was asked instead.
    pub fn peer_fallback(&self, reason: &'static str) {
        self.peer_fallbacks.add(1, &[kv("reason", reason)]);
    }

    /// Block bytes received from or sent to another replica.
    pub fn peer_bytes(&self, direction: &'static str, bytes: u64) {
        self.peer_bytes.add(bytes, &[kv("direction", direction)]);
    }

    /// Membership changed ownership.
    pub fn fleet_changed(&self) {
        self.fleet_changes.add(1, &[]);
    }

    /// A block looked up in `tier`.
    pub fn lookup(&self, tier: Lookup, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.lookups
            .add(1, &[kv("tier", tier.as_str()), kv("result", result)]);
    }

    /// A block read joined a fetch in flight.
    pub fn coalesced(&self) {
        self.coalesced.add(1, &[]);
    }

    /// A response waited for room in the responses' buffer (`response_buffer`).
    pub fn response_buffer_wait(&self) {
        self.response_buffer_waits.add(1, &[]);
    }

    /// A block found in a tier was refused and fetched again.
    pub fn block_rejected(&self, reason: Rejected) {
        self.blocks_rejected
            .add(1, &[kv("reason", reason.as_str())]);
    }

    /// A fetched block was not written to the cache.
    pub fn cache_write_dropped(&self, reason: WriteDropped) {
        self.cache_writes_dropped
            .add(1, &[kv("reason", reason.as_str())]);
    }

    /// The upstream's recent health.
    pub fn upstream_health(&self) -> UpstreamHealth {
        self.health.lock().clone()
    }

    /// How long this process has been recording.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Every metric, as Prometheus families.
    pub fn gather(&self) -> Vec<MetricFamily> {
        self.registry.gather()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        // Encoding gathered families into a Vec cannot fail.
        let _ = prometheus::TextEncoder::new().encode(&self.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// A point-in-time view of every metric, for sums over labels.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.gather())
    }

    /// Push what OTLP has not sent yet; called at shutdown.
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::debug!(error = %e, "metrics flush");
        }
    }
}

fn resource() -> Resource {
    Resource::builder().with_service_name("larder").build()
}

/// The OTLP/HTTP URL of `signal` (`metrics`, `traces`) under a collector's base URL.
pub fn otlp_url(base: &str, signal: &str) -> String {
    format!("{}/v1/{signal}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_s3_pricing() {
        for op in [
            "GetObject",
            "HeadObject",
            "HeadBucket",
            "GetObjectAttributes",
        ] {
            assert_eq!(RequestClass::of(op), RequestClass::Get, "{op}");
        }
        for op in [
            "PutObject",
            "PostObject",
            "CopyObject",
            "ListObjectsV2",
            "ListBuckets",
            "CreateMultipartUpload",
            "UploadPart",
            "CompleteMultipartUpload",
        ] {
            assert_eq!(RequestClass::of(op), RequestClass::Put, "{op}");
        }
        for op in ["DeleteObject", "DeleteObjects", "AbortMultipartUpload"] {
            assert_eq!(RequestClass::of(op), RequestClass::Free, "{op}");
        }
    }

    #[test]
    fn costs_add_up_to_the_net_saving() {
        let m = Metrics::new(MetricsOptions {
            prices: Prices {
                get_request: 0.001,
                put_request: 0.01,
                transfer_byte: 0.5,
            },
            ..Default::default()
        })
        .unwrap();
        // Ten GETs of 4 bytes served from memory; one upstream GET of 8 bytes filled the cache.
        for _ in 0..10 {
            m.request("GetObject", None, 200, "hit-memory", Duration::ZERO);
            m.served(Source::Memory, None, 4);
        }
        m.upstream("GetObject", UpstreamOutcome::Http(206), Duration::ZERO);
        m.upstream_received(8);
        let s = m.snapshot();
        let direct = s.sum("larder_cost_direct_dollars_total", &[]);
        let upstream = s.sum("larder_cost_upstream_dollars_total", &[]);
        assert!(
            (direct - (10.0 * 0.001 + 40.0 * 0.5)).abs() < 1e-9,
            "{direct}"
        );
        assert!((upstream - (0.001 + 8.0 * 0.5)).abs() < 1e-9, "{upstream}");
        assert_eq!(
            s.sum(
                "larder_requests_total",
                &[("cache", "hit-memory"), ("status", "200")]
            ),
            10.0
        );
        assert_eq!(
            s.sum("larder_upstream_requests_total", &[("status", "206")]),
            1.0
        );
    }

    #[test]
    fn status_labels_are_the_code_as_text() {
        for code in [99, 100, 200, 206, 304, 404, 503, 599, 600, 1000] {
            assert_eq!(status_value(code).as_str(), code.to_string());
        }
    }

    #[test]
    fn bucket_labels_only_for_listed_buckets() {
        let m = Metrics::new(MetricsOptions {
            buckets: vec!["lake".into()],
            ..Default::default()
        })
        .unwrap();
        m.served(Source::Memory, Some("lake"), 1);
        m.served(Source::Memory, Some("secret-name-42"), 1);
        let text = m.render();
        assert!(text.contains("bucket=\"lake\""), "{text}");
        assert!(text.contains("bucket=\"other\""), "{text}");
        assert!(!text.contains("secret-name-42"), "{text}");
        let unlabelled = Metrics::default();
        unlabelled.served(Source::Memory, Some("lake"), 1);
        assert!(!unlabelled.render().contains("bucket="));
    }

    #[test]
    fn exposition_names_and_quantiles() {
        let m = Metrics::default();
        m.observe_memory(cache_core::MemoryTier::<u32>::new(1 << 20));
        m.observe_buffer_pool();
        for ms in [1u64, 2, 3, 4, 100] {
            m.request("GetObject", None, 200, "miss", Duration::from_millis(ms));
        }
        let text = m.render();
        for name in [
            "larder_requests_total",
            "larder_request_ttfb_seconds_bucket",
            "larder_memory_capacity_bytes 1048576",
            "larder_memory_evictions_total",
            "larder_memory_promotions_total{outcome=\"skipped\"} 0",
            "larder_buffer_pool_bytes",
            "larder_buffer_pool_limit_bytes",
            "larder_buffer_pool_fresh_total",
            "larder_buffer_pool_given_back_total",
            "larder_buffer_pool_stranded_total",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        let p50 = m
            .snapshot()
            .quantile("larder_request_ttfb_seconds", 0.5)
            .unwrap();
        assert!((0.0016..=0.0033).contains(&p50), "p50 {p50}");
        assert_eq!(
            m.snapshot()
                .quantile("larder_upstream_duration_seconds", 0.5),
            None
        );
    }
}
