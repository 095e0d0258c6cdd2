//! Metrics through OpenTelemetry: instruments on an SDK meter provider, read by a Prometheus
//! exporter for the admin `/metrics` endpoint and, with `otlp_endpoint`, pushed by OTLP too.
//!
//! Label values come from fixed sets (operation names, cache results, status codes, reasons) so
//! cardinality stays bounded; bucket names appear only for the buckets listed in
//! `metrics_buckets`. The cost counters price every request with [`Prices`], so that the net
//! saving is one query: `sum(larder_cost_direct_dollars_total) -
//! sum(larder_cost_upstream_dollars_total)`.

//!
//! This file sets up the instruments and records events; `bound` keeps the request path's
//! instruments bound to their label sets, [`cost`] prices requests, `observe`
//! exports the gauges read at each collection (memory, disk, fleet, buffers), and [`snapshot`]
//! reads gathered metrics back (for the status page and tests).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::model::UpstreamOutcome;
use crate::s3::operation::Operation;
use crate::telemetry::labels::{
    AuthFile, EventOutcome, Lookup, NoticeOutcome, PrefetchBlock, PrefetchBytes, Rejected, Source,
    ThrottleEvent, WriteDropped, XCache,
};
use bound::{Bind, Bound, Key};
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;
use parking_lot::Mutex;
use prometheus::proto::MetricFamily;

mod bound;
pub mod cost;
mod observe;
pub mod snapshot;
mod tally;

pub use cost::{Prices, RequestClass};
pub use observe::FleetGauges;
pub use snapshot::Snapshot;
pub use tally::KeyTally;

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
    requests: Bound<Counter<u64>>,
    time_to_first_byte: Bound<Histogram<f64>>,
    response_duration: Bound<Histogram<f64>>,
    upstream_requests: Bound<Counter<u64>>,
    upstream_duration: Bound<Histogram<f64>>,
    upstream_bytes: Counter<u64>,
    served_bytes: Bound<Counter<u64>>,
    lookups: Bound<Counter<u64>>,
    coalesced: Counter<u64>,
    cache_writes_dropped: Counter<u64>,
    blocks_rejected: Counter<u64>,
    response_buffer_waits: Counter<u64>,
    cost_direct: Bound<Counter<f64>>,
    cost_upstream: Bound<Counter<f64>>,
    resumes: Counter<u64>,
    hedges: Counter<u64>,
    run_blocks: Counter<u64>,
    throttle: Counter<u64>,
    prefetch_blocks: Counter<u64>,
    prefetch_bytes: Bound<Counter<u64>>,
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
    /// By [`AuthFile`].
    auth_reloads: Vec<Counter<u64>>,
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

/// Bits of a [`Key`] for each label: room for every value each can take.
const OPERATION_BITS: u32 = 6;
const CACHE_BITS: u32 = 4;
const STATUS_BITS: u32 = 16;
const BUCKET_BITS: u32 = 16;
const TIER_BITS: u32 = 3;

/// The `kind` label of the cost counters.
#[derive(Clone, Copy)]
enum CostKind {
    Requests,
    Transfer,
}

impl CostKind {
    fn label(self) -> KeyValue {
        kv(
            "kind",
            match self {
                CostKind::Requests => "requests",
                CostKind::Transfer => "transfer",
            },
        )
    }
}

/// The key of a series labelled by operation alone.
fn by_operation(operation: Operation) -> Key {
    Key::new().and(operation.index(), OPERATION_BITS)
}

/// Measure the series of `instrument` labelled by `operation` alone.
fn per_operation<I: Bind>(
    instrument: &Bound<I>,
    operation: Operation,
    measure: impl FnOnce(&I::Handle),
) {
    instrument.with(
        by_operation(operation),
        || vec![kv("operation", operation.as_str())],
        measure,
    );
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
        if options.buckets.len() >= (1 << BUCKET_BITS) - 2 {
            return Err(MetricsError(format!(
                "metrics_buckets lists {} buckets; at most {} can be labelled",
                options.buckets.len(),
                (1 << BUCKET_BITS) - 3
            )));
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
        let prefetch_bytes = Bound::new(counter(
            "larder.prefetch.bytes",
            "Read-ahead bytes later read by a client (used) or never read (wasted)",
        ));
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
            prefetch_bytes
                .unbound()
                .add(0, &[kv("outcome", outcome.as_str())]);
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
        let auth_reloads = AuthFile::ALL
            .iter()
            .map(|&file| {
                let reloads = counter(
                    file.metric_names().0,
                    match file {
                        AuthFile::Credentials => "Changes of the client credentials file by outcome: applied (its keys are in force), refused (it did not load; the keys in force were kept)",
                        AuthFile::Policies => "Changes of the configuration file by outcome: applied (its auth_policies are in force), refused (they did not load; the policies in force were kept)",
                    },
                );
                for outcome in ["applied", "refused"] {
                    reloads.add(0, &[kv("outcome", outcome)]);
                }
                reloads
            })
            .collect();
        Ok(Self {
            auth_reloads,
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
            requests: Bound::new(counter(
                "larder.requests",
                "Client requests by operation, status and cache result",
            )),
            time_to_first_byte: Bound::new(latency(
                "larder.request.ttfb.seconds",
                "Time from request to response headers, by operation",
            )),
            response_duration: Bound::new(latency(
                "larder.response.duration.seconds",
                "Time from request to the last body byte sent (or the client leaving), by operation",
            )),
            upstream_requests: Bound::new(counter(
                "larder.upstream.requests",
                "Requests sent upstream by operation and status",
            )),
            upstream_duration: Bound::new(latency(
                "larder.upstream.duration.seconds",
                "Upstream response time to headers, by operation",
            )),
            upstream_bytes: counter(
                "larder.upstream.received.bytes",
                "Object bytes received from upstream for the cache",
            ),
            served_bytes: Bound::new(counter(
                "larder.served.bytes",
                "Object bytes sent to clients by the tier they came from",
            )),
            lookups: Bound::new(counter(
                "larder.cache.lookups",
                "Block lookups by tier and result (hit or miss)",
            )),
            coalesced,
            cache_writes_dropped,
            blocks_rejected,
            response_buffer_waits: counter(
                "larder.response.buffer.waits",
                "Blocks a response waited to open because response_buffer was full",
            ),
            cost_direct: Bound::new(dollars(
                "larder.cost.direct.dollars",
                "What the clients' requests would have cost sent straight to S3, by kind",
            )),
            cost_upstream: Bound::new(dollars(
                "larder.cost.upstream.dollars",
                "What Larder's own upstream requests cost, by kind",
            )),
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

    /// Which `bucket` label `bucket` takes: 0 when buckets are not labelled, `1..=n` for the
    /// listed ones, `n + 1` for `other`.
    fn bucket_slot(&self, bucket: Option<&str>) -> usize {
        if self.bucket_labels.is_empty() {
            return 0;
        }
        bucket
            .and_then(|b| self.bucket_labels.iter().position(|(name, _)| name == b))
            .map_or(self.bucket_labels.len() + 1, |i| i + 1)
    }

    /// `labels`, then the `bucket` label of `slot` (see [`Self::bucket_slot`]).
    fn with_bucket<const N: usize>(&self, labels: [KeyValue; N], slot: usize) -> Vec<KeyValue> {
        let bucket = match slot {
            0 => None,
            i => Some(
                self.bucket_labels
                    .get(i - 1)
                    .map_or_else(|| kv("bucket", "other"), |(_, label)| label.clone()),
            ),
        };
        labels.into_iter().chain(bucket).collect()
    }

    /// Add `dollars` to `counter` under `kind` (and `bucket`'s slot).
    fn cost(&self, counter: &Bound<Counter<f64>>, kind: CostKind, bucket: usize, dollars: f64) {
        let key = Key::new().and(kind as usize, 1).and(bucket, BUCKET_BITS);
        counter.with(
            key,
            || self.with_bucket([kind.label()], bucket),
            |c| c.add(dollars),
        );
    }

    /// A client request answered: its headers are on their way.
    pub fn request(
        &self,
        operation: Operation,
        bucket: Option<&str>,
        status: u16,
        cache: XCache,
        ttfb: Duration,
    ) {
        let bucket = self.bucket_slot(bucket);
        let key = by_operation(operation)
            .and(cache.index(), CACHE_BITS)
            .and(bucket, BUCKET_BITS)
            .and(usize::from(status), STATUS_BITS);
        let labels = || {
            let labels = [
                kv("operation", operation.as_str()),
                KeyValue::new("status", status_value(status)),
                kv("cache", cache.as_str()),
            ];
            self.with_bucket(labels, bucket)
        };
        self.requests.with(key, labels, |c| c.add(1));
        per_operation(&self.time_to_first_byte, operation, |h| {
            h.record(ttfb.as_secs_f64())
        });
        let price = self.prices.request(RequestClass::of(operation));
        if price > 0.0 {
            self.cost(&self.cost_direct, CostKind::Requests, bucket, price);
        }
    }

    /// A client response's body ended (or the client left) `elapsed` after the request came in.
    pub fn response_done(&self, operation: Operation, elapsed: Duration) {
        per_operation(&self.response_duration, operation, |h| {
            h.record(elapsed.as_secs_f64())
        });
    }

    /// A request upstream for `bucket` (`None`: of no bucket, ListBuckets) answered with
    /// `status` (or failed, as `status` says) after `elapsed`.
    pub fn upstream(
        &self,
        operation: Operation,
        bucket: Option<&str>,
        status: UpstreamOutcome,
        elapsed: Duration,
    ) {
        let with_operation = |status: KeyValue| vec![kv("operation", operation.as_str()), status];
        match status {
            UpstreamOutcome::Http(code) => {
                let key = by_operation(operation).and(usize::from(code), STATUS_BITS);
                let labels = || with_operation(KeyValue::new("status", status_value(code)));
                self.upstream_requests.with(key, labels, |c| c.add(1));
            }
            // Failures are rare and their reasons text: counted without a bound handle.
            UpstreamOutcome::Failed(reason) => self
                .upstream_requests
                .unbound()
                .add(1, &with_operation(kv("status", reason))),
        }
        per_operation(&self.upstream_duration, operation, |h| {
            h.record(elapsed.as_secs_f64())
        });
        let price = self.prices.request(RequestClass::of(operation));
        if price > 0.0 {
            let bucket = self.bucket_slot(bucket);
            self.cost(&self.cost_upstream, CostKind::Requests, bucket, price);
        }
    }

    /// Remember an upstream failure for the status page.
    pub fn upstream_failed(&self, what: &impl std::fmt::Display) {
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.health.lock().last_error = Some((at, what.to_string()));
    }

    /// Object bytes of `bucket` received from upstream for the cache.
    pub fn upstream_received(&self, bucket: &str, bytes: u64) {
        self.upstream_bytes.add(bytes, &[]);
        if self.prices.transfer_byte > 0.0 {
            let dollars = bytes as f64 * self.prices.transfer_byte;
            let bucket = self.bucket_slot(Some(bucket));
            self.cost(&self.cost_upstream, CostKind::Transfer, bucket, dollars);
        }
    }

    /// Object bytes sent to a client, from `tier`.
    pub fn served(&self, tier: Source, bucket: Option<&str>, bytes: u64) {
        let bucket = self.bucket_slot(bucket);
        let key = Key::new()
            .and(tier.index(), TIER_BITS)
            .and(bucket, BUCKET_BITS);
        let labels = || self.with_bucket([kv("tier", tier.as_str())], bucket);
        self.served_bytes.with(key, labels, |c| c.add(bytes));
        if self.prices.transfer_byte > 0.0 {
            let dollars = bytes as f64 * self.prices.transfer_byte;
            self.cost(&self.cost_direct, CostKind::Transfer, bucket, dollars);
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
        self.prefetch_bytes.with(
            Key::new().and(outcome.index(), 1),
            || vec![kv("outcome", outcome.as_str())],
            |c| c.add(bytes),
        );
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

    /// `file` changed, and what it says was put in force (`applied`) or refused.
    pub fn auth_file_reloaded(&self, file: AuthFile, applied: bool) {
        let outcome = if applied { "applied" } else { "refused" };
        self.auth_reloads[file.index()].add(1, &[kv("outcome", outcome)]);
    }

    /// Membership changed ownership.
    pub fn fleet_changed(&self) {
        self.fleet_changes.add(1, &[]);
    }

    /// A block looked up in `tier`.
    pub fn lookup(&self, tier: Lookup, hit: bool) {
        let key = Key::new()
            .and(tier.index(), TIER_BITS)
            .and(usize::from(hit), 1);
        let labels = || {
            let result = if hit { "hit" } else { "miss" };
            vec![kv("tier", tier.as_str()), kv("result", result)]
        };
        self.lookups.with(key, labels, |c| c.add(1));
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
        use Operation as O;
        for op in [
            O::GetObject,
            O::HeadObject,
            O::HeadBucket,
            O::GetObjectAttributes,
        ] {
            assert_eq!(RequestClass::of(op), RequestClass::Get, "{op:?}");
        }
        for op in [
            O::PutObject,
            O::PostObject,
            O::CopyObject,
            O::ListObjectsV2,
            O::ListBuckets,
            O::CreateMultipartUpload,
            O::UploadPart,
            O::CompleteMultipartUpload,
        ] {
            assert_eq!(RequestClass::of(op), RequestClass::Put, "{op:?}");
        }
        for op in [O::DeleteObject, O::DeleteObjects, O::AbortMultipartUpload] {
            assert_eq!(RequestClass::of(op), RequestClass::Free, "{op:?}");
        }
    }

    #[test]
    fn bound_and_unbound_measurements_of_a_label_set_are_one_series() {
        let m = Metrics::default();
        // The start-up zero is unbound; these are bound.
        m.prefetch_bytes(PrefetchBytes::Used, 5);
        m.prefetch_bytes(PrefetchBytes::Used, 7);
        m.prefetch_bytes(PrefetchBytes::Wasted, 1);
        m.lookup(Lookup::Memory, true);
        m.lookup(Lookup::Memory, true);
        m.lookup(Lookup::Memory, false);
        m.lookup(Lookup::Disk, true);
        let text = m.render();
        let lines = |name: &str| text.lines().filter(|l| l.starts_with(name)).count();
        assert_eq!(lines("larder_prefetch_bytes_total{"), 2, "{text}");
        assert_eq!(lines("larder_cache_lookups_total{"), 3, "{text}");
        let s = m.snapshot();
        assert_eq!(
            s.sum("larder_prefetch_bytes_total", &[("outcome", "used")]),
            12.0
        );
        assert_eq!(
            s.sum(
                "larder_cache_lookups_total",
                &[("tier", "memory"), ("result", "hit")]
            ),
            2.0
        );
        assert_eq!(
            s.sum(
                "larder_cache_lookups_total",
                &[("tier", "disk"), ("result", "miss")]
            ),
            0.0
        );
    }

    #[test]
    fn requests_of_each_label_set_count_apart() {
        let m = Metrics::new(MetricsOptions {
            buckets: vec!["lake".into(), "logs".into()],
            ..Default::default()
        })
        .unwrap();
        let cases = [
            (
                Operation::GetObject,
                Some("lake"),
                200,
                XCache::HitMemory,
                1,
            ),
            (
                Operation::GetObject,
                Some("lake"),
                206,
                XCache::HitMemory,
                2,
            ),
            (
                Operation::GetObject,
                Some("logs"),
                200,
                XCache::HitMemory,
                3,
            ),
            (
                Operation::GetObject,
                Some("other"),
                200,
                XCache::HitMemory,
                4,
            ),
            (Operation::GetObject, Some("lake"), 200, XCache::Miss, 5),
            (
                Operation::HeadObject,
                Some("lake"),
                200,
                XCache::HitMemory,
                6,
            ),
            (Operation::HeadObject, None, 200, XCache::HitMemory, 7),
        ];
        for (op, bucket, status, cache, n) in cases {
            for _ in 0..n {
                m.request(op, bucket, status, cache, Duration::ZERO);
            }
        }
        let s = m.snapshot();
        let status_text = |code: u16| code.to_string();
        for (op, bucket, status, cache, n) in cases {
            // Unlisted buckets and requests without one share the `other` series.
            let (bucket, want) = match bucket {
                Some(b @ ("lake" | "logs")) => (b, n),
                _ if op == Operation::GetObject => ("other", 4),
                _ => ("other", 7),
            };
            let status = status_text(status);
            let labels = [
                ("operation", op.as_str()),
                ("bucket", bucket),
                ("status", status.as_str()),
                ("cache", cache.as_str()),
            ];
            assert_eq!(
                s.sum("larder_requests_total", &labels),
                f64::from(want),
                "{labels:?}"
            );
        }
        assert_eq!(s.sum("larder_requests_total", &[]), 28.0);
    }

    #[test]
    fn costs_add_up_to_the_net_saving_and_split_by_bucket() {
        let m = Metrics::new(MetricsOptions {
            prices: Prices {
                get_request: 0.001,
                put_request: 0.01,
                transfer_byte: 0.5,
            },
            buckets: vec!["lake".into()],
            ..Default::default()
        })
        .unwrap();
        // Ten GETs of 4 bytes served from memory; one upstream GET of 8 bytes filled the cache.
        for _ in 0..10 {
            m.request(
                Operation::GetObject,
                Some("lake"),
                200,
                XCache::HitMemory,
                Duration::ZERO,
            );
            m.served(Source::Memory, Some("lake"), 4);
        }
        m.upstream(
            Operation::GetObject,
            Some("lake"),
            UpstreamOutcome::Http(206),
            Duration::ZERO,
        );
        m.upstream_received("lake", 8);
        // Another bucket's miss: one GET of 2 bytes, asked and fetched.
        m.request(
            Operation::GetObject,
            Some("logs"),
            200,
            XCache::Miss,
            Duration::ZERO,
        );
        m.served(Source::Upstream, Some("logs"), 2);
        m.upstream(
            Operation::GetObject,
            Some("logs"),
            UpstreamOutcome::Http(206),
            Duration::ZERO,
        );
        m.upstream_received("logs", 2);
        let s = m.snapshot();
        let close = |got: f64, want: f64| assert!((got - want).abs() < 1e-9, "{got} {want}");
        let direct = |bucket| s.sum("larder_cost_direct_dollars_total", &[("bucket", bucket)]);
        let upstream = |bucket| s.sum("larder_cost_upstream_dollars_total", &[("bucket", bucket)]);
        close(direct("lake"), 10.0 * 0.001 + 40.0 * 0.5);
        close(upstream("lake"), 0.001 + 8.0 * 0.5);
        // A miss saves nothing: what it would have cost is what it cost.
        close(direct("other"), 0.001 + 2.0 * 0.5);
        close(upstream("other"), direct("other"));
        close(
            s.sum("larder_cost_direct_dollars_total", &[])
                - s.sum("larder_cost_upstream_dollars_total", &[]),
            10.0 * 0.001 + 40.0 * 0.5 - (0.001 + 8.0 * 0.5),
        );
        assert_eq!(
            s.sum(
                "larder_requests_total",
                &[("cache", "hit-memory"), ("status", "200")]
            ),
            10.0
        );
        assert_eq!(
            s.sum("larder_upstream_requests_total", &[("status", "206")]),
            2.0
        );
    }

    #[test]
    fn each_keys_saving_is_priced_at_collection() {
        let m = Metrics::new(MetricsOptions {
            prices: Prices {
                get_request: 0.001,
                put_request: 0.01,
                transfer_byte: 0.5,
            },
            ..Default::default()
        })
        .unwrap();
        let (a, b) = (Arc::new(KeyTally::default()), Arc::new(KeyTally::default()));
        let keys = [("team-a", a.clone()), ("team-b", b.clone())];
        m.observe_key_savings(move || {
            keys.iter()
                .map(|(k, t)| ((*k).to_owned(), t.clone()))
                .collect()
        });
        for cache in [XCache::HitMemory, XCache::HitDisk, XCache::Miss] {
            a.request(Operation::GetObject, cache);
            a.object_bytes(cache, 10);
        }
        a.request(Operation::ListObjectsV2, XCache::HitMemory);
        b.request(Operation::PutObject, XCache::Pass);
        let s = m.snapshot();
        let get = |name: &str, key: &str, kind: Option<&str>| {
            let mut labels = vec![("access_key", key)];
            labels.extend(kind.map(|k| ("kind", k)));
            s.sum(name, &labels)
        };
        assert_eq!(get("larder_key_requests_total", "team-a", None), 4.0);
        assert_eq!(get("larder_key_requests_cached_total", "team-a", None), 3.0);
        assert_eq!(get("larder_key_bytes_total", "team-a", None), 30.0);
        assert_eq!(get("larder_key_bytes_cached_total", "team-a", None), 20.0);
        let close = |got: f64, want: f64| assert!((got - want).abs() < 1e-12, "{got} {want}");
        let direct = "larder_key_cost_direct_dollars_total";
        let saved = "larder_key_cost_saved_dollars_total";
        close(get(direct, "team-a", Some("requests")), 0.003 + 0.01);
        close(get(saved, "team-a", Some("requests")), 0.002 + 0.01);
        close(get(direct, "team-a", Some("transfer")), 15.0);
        close(get(saved, "team-a", Some("transfer")), 10.0);
        close(get(direct, "team-b", Some("requests")), 0.01);
        assert_eq!(get(saved, "team-b", None), 0.0);
        assert_eq!(get("larder_key_requests_total", "team-b", None), 1.0);
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
            m.request(
                Operation::GetObject,
                None,
                200,
                XCache::Miss,
                Duration::from_millis(ms),
            );
        }
        let text = m.render();
        for name in [
            "larder_requests_total",
            "larder_request_ttfb_seconds_bucket",
            "larder_memory_capacity_bytes 1048576",
            "larder_memory_evictions_total",
            "larder_memory_recent_bytes 0",
            "larder_memory_recent_hits_total 0",
            "larder_memory_promotions_total{outcome=\"skipped\"} 0",
            "larder_buffer_pool_bytes",
            "larder_buffer_pool_limit_bytes",
            "larder_buffer_pool_fresh_total",
            "larder_buffer_pool_given_back_total",
            "larder_buffer_pool_stranded_total",
            "larder_buffer_pool_lent_bytes_total",
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
