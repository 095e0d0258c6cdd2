//! Counters of the disk tier. Every write that does not reach the disk is counted by reason.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why an entry offered to the disk tier was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Larger than `max_entry` or than a region can hold, or its key is too long.
    TooLarge,
    /// The admission policy turned it away (first offer under `second-hit`).
    Admission,
    /// Over the write-rate limit.
    RateLimit,
    /// The in-flight write budget is spent: the disk is behind.
    Budget,
    /// The device failed the write.
    IoError,
    /// Removed or replaced while its write was in flight.
    Superseded,
    /// The cache is closing.
    Closed,
}

impl DropReason {
    /// Every reason, in a fixed order.
    pub const ALL: [DropReason; 7] = [
        DropReason::TooLarge,
        DropReason::Admission,
        DropReason::RateLimit,
        DropReason::Budget,
        DropReason::IoError,
        DropReason::Superseded,
        DropReason::Closed,
    ];

    /// A stable name for metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::TooLarge => "too_large",
            DropReason::Admission => "admission",
            DropReason::RateLimit => "rate_limit",
            DropReason::Budget => "budget",
            DropReason::IoError => "io_error",
            DropReason::Superseded => "superseded",
            DropReason::Closed => "closed",
        }
    }

    fn slot(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// How demand reads were served when they go through the page cache (`page_cache.rs`).
#[derive(Debug, Default)]
pub(crate) struct PageCacheCounters {
    /// Copied from the page cache on the caller's thread.
    pub(crate) inline: AtomicU64,
    /// Sent to an I/O thread (a page was not cached, or the read was large).
    pub(crate) engine: AtomicU64,
}

#[derive(Default)]
pub(crate) struct Counters {
    hits: AtomicU64,
    inflight_hits: AtomicU64,
    hit_bytes: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    raced: AtomicU64,
    collisions: AtomicU64,
    io_errors: AtomicU64,
    writes: AtomicU64,
    written_bytes: AtomicU64,
    dropped: [AtomicU64; 7],
    reclaimed_regions: AtomicU64,
    evicted_entries: AtomicU64,
    reinserted: AtomicU64,
}

fn inc(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn hit(&self, bytes: u64, inflight: bool) {
        inc(&self.hits, 1);
        inc(&self.hit_bytes, bytes);
        if inflight {
            inc(&self.inflight_hits, 1);
        }
    }
    pub(crate) fn miss(&self) {
        inc(&self.misses, 1);
    }
    pub(crate) fn corrupt(&self) {
        inc(&self.corrupt, 1);
    }
    pub(crate) fn raced(&self) {
        inc(&self.raced, 1);
    }
    pub(crate) fn collision(&self) {
        inc(&self.collisions, 1);
    }
    pub(crate) fn io_error(&self) {
        inc(&self.io_errors, 1);
    }
    pub(crate) fn written(&self, bytes: u64) {
        inc(&self.writes, 1);
        inc(&self.written_bytes, bytes);
    }
    pub(crate) fn dropped(&self, reason: DropReason) {
        inc(&self.dropped[reason.slot()], 1);
    }
    pub(crate) fn reclaimed(&self, evicted: u64) {
        inc(&self.reclaimed_regions, 1);
        inc(&self.evicted_entries, evicted);
    }
    pub(crate) fn reinserted(&self) {
        inc(&self.reinserted, 1);
    }

    pub(crate) fn add_to(&self, s: &mut DiskStats) {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        s.hits += g(&self.hits);
        s.inflight_hits += g(&self.inflight_hits);
        s.hit_bytes += g(&self.hit_bytes);
        s.misses += g(&self.misses);
        s.corrupt += g(&self.corrupt);
        s.raced += g(&self.raced);
        s.collisions += g(&self.collisions);
        s.io_errors += g(&self.io_errors);
        s.writes += g(&self.writes);
        s.written_bytes += g(&self.written_bytes);
        for (i, d) in self.dropped.iter().enumerate() {
            s.dropped[i] += g(d);
        }
        s.reclaimed_regions += g(&self.reclaimed_regions);
        s.evicted_entries += g(&self.evicted_entries);
        s.reinserted += g(&self.reinserted);
    }
}

/// A snapshot of the disk tier (one partition or the sum of all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Bytes of regions.
    pub capacity_bytes: u64,
    /// Regions in total.
    pub regions: u64,
    /// Regions free right now.
    pub free_regions: u64,
    /// Entries in the index.
    pub entries: u64,
    /// Entries accepted and not yet written (readable from memory).
    pub inflight_entries: u64,
    /// Heap bytes of the index tables.
    pub index_bytes: u64,
    /// Bytes of indexed entries on disk.
    pub live_bytes: u64,
    /// Reads served (from disk or from an entry in flight).
    pub hits: u64,
    /// Of `hits`, those served from an entry still in flight.
    pub inflight_hits: u64,
    /// Value bytes served.
    pub hit_bytes: u64,
    /// Reads that found nothing, including every fault below.
    pub misses: u64,
    /// Reads whose bytes failed a checksum or header check; the entry is dropped.
    pub corrupt: u64,
    /// Reads that lost a race with reclaim of their region.
    pub raced: u64,
    /// Reads that found another key with the same hash.
    pub collisions: u64,
    /// Reads the device failed.
    pub io_errors: u64,
    /// Entries written.
    pub writes: u64,
    /// Bytes written for entries (headers and padding included).
    pub written_bytes: u64,
    /// Entries not written, indexed like [`DropReason::ALL`].
    pub dropped: [u64; 7],
    /// Regions reclaimed.
    pub reclaimed_regions: u64,
    /// Entries evicted by reclaim.
    pub evicted_entries: u64,
    /// Hit entries copied forward by reclaim.
    pub reinserted: u64,
    /// Demand reads (a client waiting) copied from the kernel's page cache on the request's own
    /// thread, with [`DiskConfig::page_cache`](crate::disk::DiskConfig::page_cache). Device-wide:
    /// zero in a partition's stats.
    pub page_cache_reads: u64,
    /// Demand reads handed to an I/O thread with the page cache on (not every page cached, or
    /// longer than a 1 MiB value). Device-wide: zero in a partition's stats.
    pub io_thread_reads: u64,
}

impl DiskStats {
    /// Entries dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped[reason.slot()]
    }

    /// Index heap bytes per indexed entry.
    pub fn index_bytes_per_entry(&self) -> f64 {
        if self.entries == 0 {
            0.0
        } else {
            self.index_bytes as f64 / self.entries as f64
        }
    }
}
