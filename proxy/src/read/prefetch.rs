//! Read-ahead across requests: a reader that asks for adjacent ranges in ascending order gets
//! the blocks after its range fetched before it asks, with a window that doubles while it keeps
//! reading in order and closes on a jump.
//!
//! Within one response the `read_window` already opens blocks ahead; this is for readers that
//! read an object as a series of ranged GETs (stream processors, Parquet scanners, the aws CLI's
//! and SDKs' ranged downloads). Sequences are tracked per object version, so readers of one
//! object that interleave look random and get no read-ahead (a bounded cost, never a wrong byte).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// Read-ahead settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefetchConfig {
    /// Whether read-ahead runs at all.
    pub enabled: bool,
    /// Blocks fetched ahead when a sequence is first seen.
    pub min_window: u64,
    /// Most blocks fetched ahead of a reader.
    pub max_window: u64,
    /// Most prefetches running at once (each holds one block in flight).
    pub max_inflight: usize,
    /// A block read ahead and not read within this long counts as wasted.
    pub unused_after: Duration,
}

/// What [`PrefetchConfig::unused_after`] is outside tests: long enough for a slow reader.
pub const UNUSED_AFTER: Duration = Duration::from_secs(600);

impl PrefetchConfig {
    /// Read-ahead off.
    pub fn off() -> Self {
        Self {
            enabled: false,
            min_window: 1,
            max_window: 1,
            max_inflight: 1,
            unused_after: UNUSED_AFTER,
        }
    }

    /// Whether read-ahead runs.
    pub fn enabled(&self) -> bool {
        self.enabled
    }
}

/// Most object versions whose read sequence is remembered.
const TRACKED: u64 = 16_384;
/// A sequence not continued within this long is forgotten.
const IDLE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
struct Sequence {
    /// Where the last read started.
    last_start: u64,
    /// Where the next in-order read would start.
    next: u64,
    /// Blocks to keep fetched ahead; 0 until the reader has read in order once.
    window: u64,
    /// Blocks before this index are already prefetched (or were asked for).
    ahead_until: u64,
}

/// An object version: bucket, key, ETag.
pub type VersionKey = (Arc<str>, Arc<str>, Arc<str>);

/// Per-object read sequences.
pub struct Detector {
    config: PrefetchConfig,
    block_size: u64,
    sequences: moka::sync::Cache<VersionKey, Arc<Mutex<Sequence>>>,
}

impl Detector {
    /// A detector for blocks of `block_size` bytes.
    pub fn new(config: PrefetchConfig, block_size: u64) -> Self {
        Self {
            config,
            block_size,
            sequences: moka::sync::Cache::builder()
                .max_capacity(TRACKED)
                .time_to_idle(IDLE)
                .build(),
        }
    }

    /// A read of `range` of an object (`size` bytes) identified by bucket, key and ETag: the
    /// block indexes to fetch ahead of it, if any.
    pub fn observe(&self, object: VersionKey, range: Range<u64>, size: u64) -> Range<u64> {
        if !self.config.enabled || range.is_empty() {
            return 0..0;
        }
        let entry = self.sequences.get_with(object, || {
            Arc::new(Mutex::new(Sequence {
                last_start: u64::MAX,
                next: u64::MAX,
                window: 0,
                ahead_until: 0,
            }))
        });
        let mut seq = entry.lock();
        // In order: moves forward and starts where the last read ended, give or take an eighth
        // of a block (readers overlap a record boundary, or skip a little). Re-reading the same
        // range, or reading sparse ranges, is not a sequence.
        let slack = self.block_size / 8;
        let in_order = seq.next != u64::MAX
            && range.start > seq.last_start
            && range.start.abs_diff(seq.next) <= slack;
        seq.last_start = range.start;
        seq.window = match (in_order, seq.window) {
            (false, _) => 0,
            (true, 0) => self.config.min_window,
            (true, w) => (w * 2).min(self.config.max_window),
        };
        seq.next = range.end;
        if seq.window == 0 {
            seq.ahead_until = 0;
            return 0..0;
        }
        let blocks = size.div_ceil(self.block_size);
        // The read itself fetches its own blocks; read-ahead starts after its last one.
        let first = range.end.div_ceil(self.block_size).max(seq.ahead_until);
        let last = (range.end.div_ceil(self.block_size) + seq.window).min(blocks);
        if first >= last {
            return 0..0;
        }
        seq.ahead_until = last;
        first..last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = 100;

    fn detector() -> Detector {
        Detector::new(
            PrefetchConfig {
                enabled: true,
                min_window: 2,
                max_window: 8,
                max_inflight: 4,
                unused_after: UNUSED_AFTER,
            },
            B,
        )
    }

    fn id() -> VersionKey {
        ("b".into(), "k".into(), "e".into())
    }

    #[test]
    fn in_order_reads_grow_the_window_and_jumps_close_it() {
        let d = detector();
        let size = 100 * B;
        assert_eq!(
            d.observe(id(), 0..B, size),
            0..0,
            "one read is not a sequence"
        );
        assert_eq!(d.observe(id(), B..2 * B, size), 2..4);
        assert_eq!(
            d.observe(id(), 2 * B..3 * B, size),
            4..7,
            "window 4, from block 3"
        );
        assert_eq!(d.observe(id(), 3 * B..4 * B, size), 7..12, "window 8");
        assert_eq!(
            d.observe(id(), 4 * B..5 * B, size),
            12..13,
            "window stays at the max"
        );
        assert_eq!(
            d.observe(id(), 50 * B..51 * B, size),
            0..0,
            "a jump stops read-ahead"
        );
        assert_eq!(d.observe(id(), 51 * B..52 * B, size), 52..54);
    }

    #[test]
    fn repeated_and_sparse_reads_are_not_sequences() {
        let d = detector();
        let size = 100 * B;
        for _ in 0..4 {
            assert_eq!(d.observe(id(), 0..10, size), 0..0, "the same range again");
        }
        assert_eq!(d.observe(id(), 3 * B + 5..3 * B + 15, size), 0..0);
        assert_eq!(
            d.observe(id(), 4 * B - 2..4 * B + 2, size),
            0..0,
            "a gap of most of a block"
        );
        assert_eq!(
            d.observe(id(), 4 * B + 2..5 * B, size),
            5..7,
            "adjacent again"
        );
    }

    #[test]
    fn read_ahead_stops_at_the_end_of_the_object() {
        let d = detector();
        d.observe(id(), 0..B, 3 * B);
        assert_eq!(d.observe(id(), B..2 * B, 3 * B), 2..3);
        assert_eq!(d.observe(id(), 2 * B..3 * B, 3 * B), 0..0);
    }

    #[test]
    fn off_means_off() {
        let d = Detector::new(PrefetchConfig::off(), B);
        d.observe(id(), 0..B, 10 * B);
        assert_eq!(d.observe(id(), B..2 * B, 10 * B), 0..0);
    }
}
