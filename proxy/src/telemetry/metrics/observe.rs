//! Gauges read at each collection rather than recorded as things happen: the memory and disk
//! tiers' occupancy and counters, the responses' buffer, the fleet's membership, the upstream
//! client's retries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::disk::{DiskStats, DropReason};
use cache_core::{DiskCache, MemoryTier};
use parking_lot::Mutex;

use super::tally::{KeyTally, Read as TallyRead};
use super::{kv, Metrics};
use crate::qos::Limits;
use crate::telemetry::labels::AuthFile;
use opentelemetry::KeyValue;

/// What the fleet's gauges show, read at each collection.
#[derive(Debug, Clone, Copy, Default)]
pub struct FleetGauges {
    /// Replicas this one sees, itself included.
    pub members: u64,
    /// Replicas that may own blocks for this one.
    pub owners: u64,
    /// Share of keys whose owner changed at the last membership change.
    pub moved: f64,
}

impl Metrics {
    /// Export the fleet's gauges (members, candidates, keys moved at the last change), each read
    /// from `read` at each collection.
    pub fn observe_fleet(&self, read: impl Fn() -> FleetGauges + Send + Sync + 'static) {
        let read = Arc::new(read);
        let members = read.clone();
        self.meter
            .u64_observable_gauge("larder.fleet.members")
            .with_description("Replicas this one sees, itself included")
            .with_callback(move |o| o.observe(members().members, &[]))
            .build();
        let owners = read.clone();
        self.meter
            .u64_observable_gauge("larder.fleet.owners")
            .with_description("Replicas that may own blocks for this one (its zone, or all)")
            .with_callback(move |o| o.observe(owners().owners, &[]))
            .build();
        self.meter
            .f64_observable_gauge("larder.fleet.keys.moved.ratio")
            .with_description(
                "Share of block keys whose owner changed at the last membership change",
            )
            .with_callback(move |o| o.observe(read().moved, &[]))
            .build();
    }

    /// Export the event stream's state: `read` says (healthy, seconds since the last event or
    /// heartbeat; `None` before the first).
    pub fn observe_events(&self, read: impl Fn() -> (bool, Option<f64>) + Send + Sync + 'static) {
        let read = Arc::new(read);
        let silence = read.clone();
        self.meter
            .u64_observable_gauge("larder.events.stream.healthy")
            .with_description(
                "1 while S3 events arrive within events_max_silence (metadata trusted for its full TTL); 0 while Larder falls back to events_fallback_ttl",
            )
            .with_callback(move |o| o.observe(u64::from(read().0), &[]))
            .build();
        self.meter
            .f64_observable_gauge("larder.events.silence.seconds")
            .with_description("Seconds since the last S3 event or heartbeat was received")
            .with_callback(move |o| {
                if let Some(s) = silence().1 {
                    o.observe(s, &[]);
                }
            })
            .build();
    }

    /// Export what parallel GETs gain: the upstream's bytes per second while several of
    /// Larder's bodies streamed over those while one did, from `read` (`None`, and nothing
    /// exported, until both were measured, and again once either has faded).
    pub fn observe_parallel_gain(&self, read: impl Fn() -> Option<f64> + Send + Sync + 'static) {
        self.meter
            .f64_observable_gauge("larder.upstream.parallel.gain")
            .with_description(
                "The upstream's bytes per second while several block GETs streamed, over those while one did (cold reads run one GET over more blocks the lower it is)",
            )
            .with_callback(move |o| {
                if let Some(gain) = read() {
                    o.observe(gain, &[]);
                }
            })
            .build();
    }

    /// Export how much of the responses' buffer is in use.
    /// `read` says (bytes in use, most allowed).
    pub fn observe_response_buffer(&self, read: impl Fn() -> (u64, u64) + Send + Sync + 'static) {
        let read = Arc::new(read);
        let limit = read.clone();
        self.meter
            .u64_observable_gauge("larder.response.buffer.bytes")
            .with_description("Bytes of blocks held by responses in flight")
            .with_callback(move |o| o.observe(read().0, &[]))
            .build();
        self.meter
            .u64_observable_gauge("larder.response.buffer.limit.bytes")
            .with_description("Most bytes of blocks responses may hold (response_buffer)")
            .with_callback(move |o| o.observe(limit().1, &[]))
            .build();
    }

    /// Export the pool of reused large buffers (`cache_core::buffers`): what it holds, its
    /// bound, and the buffers it could not give (each allocated, zeroed and faulted in anew).
    pub fn observe_buffer_pool(&self) {
        use cache_core::buffers::pool_stats;
        self.meter
            .u64_observable_gauge("larder.buffer.pool.bytes")
            .with_description("Bytes of idle large buffers kept for reuse")
            .with_callback(|o| o.observe(pool_stats().held_bytes, &[]))
            .build();
        self.meter
            .u64_observable_gauge("larder.buffer.pool.limit.bytes")
            .with_description("Most bytes of idle buffers kept (a quarter of response_buffer)")
            .with_callback(|o| o.observe(pool_stats().limit_bytes, &[]))
            .build();
        self.meter
            .u64_observable_counter("larder.buffer.pool.fresh")
            .with_description(
                "Large buffers (disk reads and writes, assembled blocks) allocated anew because the pool held none of their length",
            )
            .with_callback(|o| o.observe(pool_stats().fresh, &[]))
            .build();
        self.meter
            .u64_observable_counter("larder.buffer.pool.given_back")
            .with_description(
                "Large buffers whose pages were sent to a client by reference, given back to the kernel before the buffer's reuse (its next use faults in fresh pages)",
            )
            .with_callback(|o| o.observe(pool_stats().given_back, &[]))
            .build();
        self.meter
            .u64_observable_counter("larder.buffer.pool.stranded")
            .with_description(
                "Large buffers whose pages were sent by reference and could not be given back: left allocated, never reused (not expected)",
            )
            .with_callback(|o| o.observe(pool_stats().stranded, &[]))
            .build();
        self.meter
            .u64_observable_counter("larder.buffer.pool.lent.bytes")
            .with_description(
                "Bytes of cached blocks sent to clients by reference (send_by_reference): pages spliced to the socket, not copied",
            )
            .with_callback(|o| o.observe(pool_stats().lent_bytes, &[]))
            .build();
    }

    /// Export the background refreshes of metadata (`metadata_refresh_ahead`) by outcome, read
    /// from `read` at each collection.
    pub fn observe_metadata_refreshes<const N: usize>(
        &self,
        read: impl Fn() -> [(&'static str, u64); N] + Send + Sync + 'static,
    ) {
        self.meter
            .u64_observable_counter("larder.metadata.refreshes")
            .with_description(
                "Metadata revalidated behind a reader shortly before its TTL ran out, by outcome",
            )
            .with_callback(move |o| {
                for (outcome, n) in read() {
                    o.observe(n, &[kv("outcome", outcome)]);
                }
            })
            .build();
    }

    /// Export the memory tier's gauges, read at each collection.
    pub fn observe_memory<K>(&self, tier: MemoryTier<K>)
    where
        K: std::hash::Hash + Eq + Send + Sync + Clone + 'static,
    {
        type Read<K> = fn(&MemoryTier<K>) -> u64;
        let gauges: [(&'static str, &'static str, Read<K>); 4] = [
            (
                "larder.memory.capacity.bytes",
                "Memory tier capacity",
                |t| t.stats().capacity_bytes,
            ),
            ("larder.memory.used.bytes", "Memory tier bytes held", |t| {
                t.stats().used_bytes
            }),
            ("larder.memory.entries", "Memory tier entries held", |t| {
                t.stats().entries
            }),
            (
                "larder.memory.recent.bytes",
                "Memory tier bytes of blocks its main part let go, kept a little longer",
                |t| t.stats().recent_bytes,
            ),
        ];
        for (name, help, read) in gauges {
            let tier = tier.clone();
            self.meter
                .u64_observable_gauge(name)
                .with_description(help)
                .with_callback(move |o| o.observe(read(&tier), &[]))
                .build();
        }
        let recent = tier.clone();
        self.meter
            .u64_observable_counter("larder.memory.recent_hits")
            .with_description(
                "Memory tier reads served from blocks its main part let go (evicted or turned away)",
            )
            .with_callback(move |o| o.observe(recent.stats().recent_hits, &[]))
            .build();
        let evicted = tier.clone();
        self.meter
            .u64_observable_counter("larder.memory.evictions")
            .with_description("Memory tier evictions for size")
            .with_callback(move |o| o.observe(evicted.stats().evictions, &[]))
            .build();
        self.meter
            .u64_observable_counter("larder.memory.promotions")
            .with_description(
                "Disk hits whose block was copied up to the memory tier (promoted) or not (skipped)",
            )
            .with_callback(move |o| {
                let stats = tier.stats();
                o.observe(stats.promotions, &[kv("outcome", "promoted")]);
                o.observe(stats.promotions_skipped, &[kv("outcome", "skipped")]);
            })
            .build();
    }

    /// Export the upstream client's retry count, read from `retries` at each collection.
    pub fn observe_retries(&self, retries: impl Fn() -> u64 + Send + Sync + 'static) {
        self.meter
            .u64_observable_counter("larder.upstream.retries")
            .with_description(
                "Upstream requests sent again by the S3 client after a failed attempt",
            )
            .with_callback(move |o| o.observe(retries(), &[]))
            .build();
    }

    /// Export what each limited client key was held back by (`auth_policies`' rates): its
    /// requests refused with `SlowDown`, and the seconds its responses waited for its byte
    /// rate, of the keys `keys` gives at each collection (the keys in force). Only keys with
    /// limits are labelled, so the label's values are the configuration's.
    pub fn observe_client_limits(
        &self,
        keys: impl Fn() -> Vec<(String, Arc<Limits>)> + Send + Sync + 'static,
    ) {
        let keys = Arc::new(keys);
        type Read = fn(&Limits) -> f64;
        let counters: [(&'static str, &'static str, Read); 2] = [
            (
                "larder.client.throttled",
                "Requests refused with SlowDown because their key sent more than its requests_per_second",
                |l| l.refused() as f64,
            ),
            (
                "larder.client.paced.seconds",
                "Seconds responses to a key waited for its bytes_per_second, summed over its responses",
                Limits::paced_seconds,
            ),
        ];
        for (name, description, read) in counters {
            let keys = keys.clone();
            self.meter
                .f64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| {
                    for (key, limits) in keys() {
                        o.observe(read(&limits), &[KeyValue::new("access_key", key)]);
                    }
                })
                .build();
        }
    }

    /// Export what each client key asked of Larder and what the cache saved it
    /// ([`KeyTally`]): its requests and object bytes, those answered from the cache, and both
    /// in dollars at the cost counters' prices, of the keys `keys` gives at each collection
    /// (the credentials file's keys in force, so the label's values are the configuration's).
    pub fn observe_key_savings(
        &self,
        keys: impl Fn() -> Vec<(String, Arc<KeyTally>)> + Send + Sync + 'static,
    ) {
        let keys = Arc::new(keys);
        let prices = self.prices;
        type Counted = fn(&TallyRead) -> u64;
        let counts: [(&'static str, &'static str, Counted); 4] = [
            (
                "larder.key.requests",
                "Requests of each client key that S3 would have billed (GET and PUT class)",
                |r| r.requests.all,
            ),
            (
                "larder.key.requests.cached",
                "Of those, the ones Larder answered without an upstream request of their own",
                |r| r.requests.cached,
            ),
            (
                "larder.key.bytes",
                "Object bytes sent to each client key from cached reads",
                |r| r.bytes.all,
            ),
            (
                "larder.key.bytes.cached",
                "Of those, the bytes of reads answered from the cache",
                |r| r.bytes.cached,
            ),
        ];
        for (name, description, read) in counts {
            let keys = keys.clone();
            self.meter
                .u64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| {
                    for (key, tally) in keys() {
                        let label = KeyValue::new("access_key", key);
                        o.observe(read(&tally.read(&prices)), &[label]);
                    }
                })
                .build();
        }
        type Dollars = fn(&TallyRead) -> [f64; 2];
        let dollars: [(&'static str, &'static str, Dollars); 2] = [
            (
                "larder.key.cost.direct.dollars",
                "What each client key's requests would have cost sent straight to S3, by kind",
                |r| r.direct,
            ),
            (
                "larder.key.cost.saved.dollars",
                "Of that, what Larder answered from the cache, by kind",
                |r| r.saved,
            ),
        ];
        for (name, description, read) in dollars {
            let keys = keys.clone();
            self.meter
                .f64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| {
                    for (key, tally) in keys() {
                        let label = KeyValue::new("access_key", key);
                        let [requests, transfer] = read(&tally.read(&prices));
                        for (kind, dollars) in [("requests", requests), ("transfer", transfer)] {
                            o.observe(dollars, &[label.clone(), kv("kind", kind)]);
                        }
                    }
                })
                .build();
        }
    }

    /// Export whether each of the client keys' files as it is now was refused (1) or is in
    /// force (0), read from `refused` at each collection: a gauge an alert can hold, where the
    /// reload counter moves once per change.
    pub fn observe_auth_files(
        &self,
        refused: impl Fn(AuthFile) -> bool + Send + Sync + Clone + 'static,
    ) {
        for &file in AuthFile::ALL {
            let refused = refused.clone();
            self.meter
                .u64_observable_gauge(file.metric_names().1)
                .with_description(match file {
                    AuthFile::Credentials => "1 while the client credentials file as it is now did not load, so the keys in force are older than it; 0 once a version of it is in force",
                    AuthFile::Policies => "1 while the auth_policies of the configuration file as it is now did not load, so the policies in force are older than them; 0 once a version of them is in force",
                })
                .with_callback(move |o| o.observe(u64::from(refused(file)), &[]))
                .build();
        }
    }

    /// Export the disk tier's counters and gauges, read at each collection.
    pub fn observe_disk(&self, disk: DiskCache) {
        // One read of the disk counters serves every instrument of a collection.
        let stats = Arc::new(CachedStats {
            disk: disk.clone(),
            last: Mutex::new(None),
        });
        type Read = fn(&DiskStats) -> u64;
        let counters: [(&'static str, &'static str, Read); 14] = [
            (
                "larder.disk.hits",
                "Disk tier reads served (including entries still in flight)",
                |s| s.hits,
            ),
            (
                "larder.disk.misses",
                "Disk tier reads that found nothing (including the faults below)",
                |s| s.misses,
            ),
            (
                "larder.disk.hit.bytes",
                "Value bytes served by the disk tier",
                |s| s.hit_bytes,
            ),
            (
                "larder.disk.corrupt.reads",
                "Disk reads that failed a checksum; served as misses",
                |s| s.corrupt,
            ),
            (
                "larder.disk.raced.reads",
                "Disk reads that lost a race with region reclaim; served as misses",
                |s| s.raced,
            ),
            (
                "larder.disk.hash.collisions",
                "Disk reads that found another key with the same hash",
                |s| s.collisions,
            ),
            (
                "larder.disk.io.errors",
                "Disk reads the device failed",
                |s| s.io_errors,
            ),
            (
                "larder.disk.page_cache.reads",
                "Disk hits copied from the kernel's page cache on the request's thread",
                |s| s.page_cache_reads,
            ),
            (
                "larder.disk.io_thread.reads",
                "Disk hits read on an I/O thread with the page cache on (not all cached, or large)",
                |s| s.io_thread_reads,
            ),
            (
                "larder.disk.writes",
                "Entries written to the disk tier (admissions)",
                |s| s.writes,
            ),
            (
                "larder.disk.written.bytes",
                "Bytes written to the disk tier, headers and padding included",
                |s| s.written_bytes,
            ),
            (
                "larder.disk.reclaimed.regions",
                "Disk regions reused, what they held evicted",
                |s| s.reclaimed_regions,
            ),
            (
                "larder.disk.evicted.entries",
                "Disk entries evicted when their region was reused",
                |s| s.evicted_entries,
            ),
            (
                "larder.disk.reinserted.entries",
                "Disk entries copied forward by reclaim, read since written",
                |s| s.reinserted,
            ),
        ];
        for (name, help, read) in counters {
            let stats = stats.clone();
            self.meter
                .u64_observable_counter(name)
                .with_description(help)
                .with_callback(move |o| o.observe(read(&stats.get()), &[]))
                .build();
        }
        let gauges: [(&'static str, &'static str, Read); 6] = [
            ("larder.disk.capacity.bytes", "Bytes of disk regions", |s| {
                s.capacity_bytes
            }),
            (
                "larder.disk.live.bytes",
                "Bytes of indexed disk entries",
                |s| s.live_bytes,
            ),
            ("larder.disk.entries", "Entries in the disk index", |s| {
                s.entries
            }),
            (
                "larder.disk.inflight.entries",
                "Entries accepted for a disk write and not yet written",
                |s| s.inflight_entries,
            ),
            (
                "larder.disk.index.bytes",
                "Heap bytes of the disk index",
                |s| s.index_bytes,
            ),
            (
                "larder.disk.free.regions",
                "Disk regions ready for writing (readable until reused)",
                |s| s.free_regions,
            ),
        ];
        for (name, help, read) in gauges {
            let stats = stats.clone();
            self.meter
                .u64_observable_gauge(name)
                .with_description(help)
                .with_callback(move |o| o.observe(read(&stats.get()), &[]))
                .build();
        }
        let recovered = disk.recovery().entries;
        let recovery_ms = disk.recovery().duration.as_millis() as u64;
        self.meter
            .u64_observable_counter("larder.disk.recovered.entries")
            .with_description("Entries recovered from the disk tier at start")
            .with_callback(move |o| o.observe(recovered, &[]))
            .build();
        self.meter
            .u64_observable_gauge("larder.disk.recovery.milliseconds")
            .with_description("Time the disk tier took to open at start")
            .with_callback(move |o| o.observe(recovery_ms, &[]))
            .build();
        // For an audit: whether what reaches the device is sealed (disk_encryption_key_file).
        // The key's fingerprint as a label: a rotation's progress across a fleet.
        let sealed = u64::from(disk.recovery().sealed);
        let key: Vec<_> = disk
            .recovery()
            .key_fingerprint
            .clone()
            .map(|f| KeyValue::new("key", f))
            .into_iter()
            .collect();
        self.meter
            .u64_observable_gauge("larder.disk.encrypted")
            .with_description("1 if every disk entry is encrypted at rest, 0 if in clear")
            .with_callback(move |o| o.observe(sealed, &key))
            .build();
        self.meter
            .u64_observable_counter("larder.disk.writes.dropped")
            .with_description("Blocks offered to the disk tier and not written, by reason")
            .with_callback(move |o| {
                let s = stats.get();
                for reason in DropReason::ALL {
                    o.observe(s.dropped(reason), &[kv("reason", reason.as_str())]);
                }
            })
            .build();
    }
}

/// The disk counters, read at most once per 100 ms (a collection reads ~20 instruments).
struct CachedStats {
    disk: DiskCache,
    last: Mutex<Option<(Instant, DiskStats)>>,
}

impl CachedStats {
    fn get(&self) -> DiskStats {
        let mut last = self.last.lock();
        match &*last {
            Some((at, s)) if at.elapsed() < Duration::from_millis(100) => s.clone(),
            _ => {
                let s = self.disk.stats();
                *last = Some((Instant::now(), s.clone()));
                s
            }
        }
    }
}
