//! The memory tier: a byte-weighted cache of immutable blocks.
//!
//! Two parts share its bytes: the main part (moka: TinyLFU admission, LRU eviction) and, from
//! tiers of [`RECENT_FROM`] up, a sixteenth kept for the values the main part let go
//! ([`recent`]), so that a block turned away by admission is still found by the readers that
//! come just after its fetch.

mod recent;

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use moka::future::Cache;
use moka::notification::RemovalCause;

use recent::Recent;

/// Called with each value the memory tier's main part evicts for size (or turns away when it
/// is full), and whether that value was read again while held.
pub type EvictionHook<K> = Arc<dyn Fn(&K, &Bytes, bool) + Send + Sync>;

/// A held value and whether it was read since it was inserted: what S3-FIFO calls a hit in the
/// small queue, and the disk tier's admission wants to know.
#[derive(Clone)]
struct Held {
    bytes: Bytes,
    read: Arc<AtomicBool>,
}

/// Values at least this long are always copied up from disk ([`MemoryTier::insert_copy`]): a
/// disk hit of one costs far more than its promotion. It copies the value out of the page
/// cache and checksums every byte, about 0.2 ms more CPU per 1 MiB hit than a memory hit in
/// the runs of docs/benchmarks.md, where an insert into a full tier cost about 6 µs.
const PROMOTE_ALWAYS_FROM: usize = 1 << 20;
/// A smaller value, while the tier is full, is copied up on one disk hit in
/// `PROMOTE_ALWAYS_FROM / len` (a 64 KiB one in 16, a 512 KiB one in 2), at most this many.
const PROMOTE_AT_MOST_ONE_IN: usize = 16;

/// Tiers of at least this many bytes keep [`1 / RECENT_SHARE`](RECENT_SHARE) of them for
/// values the main part let go. Smaller tiers keep none: a sixteenth of them would hold less
/// than two 8 MiB blocks, and a tier sized to hold just one block must still hold it whole.
const RECENT_FROM: u64 = 256 << 20;
/// The share of a tier's bytes kept for values its main part let go (one in this many). A
/// herd over a full 2 GiB tier needs its 8 MiB blocks held until its late readers came: a
/// sixteenth of the tier (128 MiB) held them. It cost single-client trace replays 0.2 to 0.3
/// points of hit ratio, for a main part a sixteenth smaller (docs/benchmarks.md, "Fixed: the
/// memory tier keeps what moka let go").
const RECENT_SHARE: u64 = 16;

/// A byte-weighted in-memory cache: moka (TinyLFU admission, LRU eviction), and the values it
/// let go kept a little longer in a share of the same bytes.
///
/// Values are immutable [`Bytes`]: a hit hands out a reference-counted view, never a copy.
#[derive(Clone)]
pub struct MemoryTier<K> {
    cache: Cache<K, Held>,
    recent: Arc<Recent<K>>,
    evictions: Arc<AtomicU64>,
    capacity: u64,
    /// Copies offered from the disk tier: stored, skipped, and draws of the sampling.
    promoted: Arc<AtomicU64>,
    promotions_skipped: Arc<AtomicU64>,
    draws: Arc<AtomicU64>,
}

/// A snapshot of the memory tier's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryTierStats {
    /// Configured capacity in bytes.
    pub capacity_bytes: u64,
    /// Bytes held (moka's weighted size, updated lazily by moka's housekeeping, plus the
    /// recent share's).
    pub used_bytes: u64,
    /// Entries held (a value the main part holds again may also still be in the recent
    /// share, and is then counted twice).
    pub entries: u64,
    /// Entries the main part evicted for size, or turned away, since start.
    pub evictions: u64,
    /// Of `used_bytes`, those of values the main part let go and the recent share keeps
    /// (each weighed with 128 bytes of bookkeeping).
    pub recent_bytes: u64,
    /// Reads served from the recent share since start: each a miss of the main part that
    /// would otherwise have gone to disk or upstream.
    pub recent_hits: u64,
    /// Values read from the disk tier and copied up here since start.
    pub promotions: u64,
    /// Values read from the disk tier and not copied up (see [`MemoryTier::insert_copy`]).
    pub promotions_skipped: u64,
}

impl<K> MemoryTier<K>
where
    K: Hash + Eq + Send + Sync + Clone + 'static,
{
    /// A tier holding at most `capacity_bytes` bytes of values.
    ///
    /// A value larger than 4 GiB cannot be weighed by moka and is never admitted; blocks are far
    /// smaller than that.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::build(capacity_bytes, None)
    }

    /// Like [`new`](Self::new), calling `hook` with every value evicted for size (the hybrid
    /// cache's write-on-evict policy). The hook runs on moka's housekeeping path: it must not
    /// block.
    pub fn with_eviction_hook(capacity_bytes: u64, hook: EvictionHook<K>) -> Self {
        Self::build(capacity_bytes, Some(hook))
    }

    /// The largest value a tier of `capacity_bytes` stores: what its main part holds.
    pub fn largest_value(capacity_bytes: u64) -> u64 {
        capacity_bytes - recent_share(capacity_bytes)
    }

    fn build(capacity_bytes: u64, hook: Option<EvictionHook<K>>) -> Self {
        let evictions = Arc::new(AtomicU64::new(0));
        let counter = evictions.clone();
        let recent = Arc::new(Recent::new(recent_share(capacity_bytes)));
        let let_go = recent.clone();
        let cache = Cache::builder()
            .max_capacity(Self::largest_value(capacity_bytes))
            .weigher(|_k: &K, v: &Held| u32::try_from(v.bytes.len()).unwrap_or(u32::MAX))
            .eviction_listener(move |k: Arc<K>, v: Held, cause| {
                if cause == RemovalCause::Size {
                    counter.fetch_add(1, Ordering::Relaxed);
                    // Kept before the hook runs: the value left moka's table just before this
                    // call, and a reader looking now should find it again soon.
                    let_go.push(K::clone(&k), v.bytes.clone());
                    if let Some(hook) = &hook {
                        hook(&k, &v.bytes, v.read.load(Ordering::Relaxed));
                    }
                }
            })
            .build();
        Self {
            cache,
            recent,
            evictions,
            capacity: capacity_bytes,
            promoted: Arc::default(),
            promotions_skipped: Arc::default(),
            draws: Arc::default(),
        }
    }

    /// The value for `key`, if held.
    pub async fn get(&self, key: &K) -> Option<Bytes> {
        self.get_counted(key, true).await
    }

    /// The value for `key`, if held, read by the request whose fetch brought it: not counted
    /// as read again (the eviction hook's flag, which second-hit admission to disk relies on).
    pub async fn get_fetched(&self, key: &K) -> Option<Bytes> {
        self.get_counted(key, false).await
    }

    async fn get_counted(&self, key: &K, again: bool) -> Option<Bytes> {
        let bytes = match self.cache.get(key).await {
            Some(held) => {
                // Load first: a hot value's flag is set once, not written by every reader.
                if again && !held.read.load(Ordering::Relaxed) {
                    held.read.store(true, Ordering::Relaxed);
                }
                held.bytes
            }
            None => {
                // moka counted this miss in its frequencies, so the value stands a better
                // chance offered again on its first read here. Turned away again, it comes
                // back to the recent share as its newest value: read at least once a cycle,
                // it stays in memory.
                let found = self.recent.get(key, again)?;
                if found.first_read {
                    let held = Held {
                        bytes: found.bytes.clone(),
                        read: Arc::new(AtomicBool::new(true)),
                    };
                    self.cache.insert(key.clone(), held).await;
                }
                found.bytes
            }
        };
        // Counted toward lending its bytes to sockets (`buffers`; small values return at once).
        crate::buffers::read_again(&bytes);
        Some(bytes)
    }

    /// Whether `key` is held, without counting as an access.
    pub fn contains(&self, key: &K) -> bool {
        self.cache.contains_key(key) || self.recent.contains(key)
    }

    /// Store `value` under `key`. Values larger than [`largest_value`](Self::largest_value)
    /// are not stored.
    pub async fn insert(&self, key: K, value: Bytes) {
        self.store(key, value, false).await;
    }

    /// [`insert`](Self::insert), saying whether the value was read again already (by more than
    /// one reader of its fetch): the eviction hook's flag starts as that.
    pub(crate) async fn store(&self, key: K, value: Bytes, read_again: bool) {
        if value.len() as u64 > Self::largest_value(self.capacity)
            || u32::try_from(value.len()).is_err()
        {
            return;
        }
        let held = Held {
            bytes: value,
            read: Arc::new(AtomicBool::new(read_again)),
        };
        self.cache.insert(key, held).await;
    }

    /// Store a copy of `value`, which the disk tier holds, as a disk hit's promotion does;
    /// returns whether it was stored.
    ///
    /// Why not always: once the tier is full, each insert costs CPU (moka's key lock, its
    /// table, the admission and the eviction or refusal it leads to), however the admission
    /// then decides. With a working set of 64 KiB blocks eight times the tier, that churn was
    /// about a tenth of a disk hit's CPU (docs/benchmarks.md, "Disk hits: promotion
    /// sampled"). So while the tier has room, or for values of 1 MiB and up, the copy is
    /// always offered; otherwise one disk hit in `1 MiB / len` (at most one in 16) offers it,
    /// at random. A value read often is still offered soon (its `get`s count in TinyLFU's
    /// frequencies all along), and a value read once rarely pays for a copy nobody reads.
    pub async fn insert_copy(&self, key: K, value: Bytes) -> bool {
        if !self.promotes(value.len()) {
            self.promotions_skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.promoted.fetch_add(1, Ordering::Relaxed);
        self.insert(key, value).await;
        true
    }

    fn promotes(&self, len: usize) -> bool {
        let room = self.cache.weighted_size().saturating_add(len as u64)
            <= Self::largest_value(self.capacity);
        if room || len >= PROMOTE_ALWAYS_FROM {
            return true;
        }
        let one_in = (PROMOTE_ALWAYS_FROM / len.max(1)).clamp(1, PROMOTE_AT_MOST_ONE_IN) as u64;
        splitmix64(self.draws.fetch_add(1, Ordering::Relaxed)).is_multiple_of(one_in)
    }

    /// Drop `key`, if held. (Keys name immutable values, so this frees memory and is not
    /// needed for correctness: a value moka evicts for size while this runs may still reach
    /// the recent share after it.)
    pub async fn remove(&self, key: &K) {
        self.cache.invalidate(key).await;
        self.recent.remove(key);
    }

    /// Every entry held now (a snapshot of the main part taken as it goes, entries inserted
    /// meanwhile may or may not appear; then the recent share's, where a key may come again).
    pub fn entries(&self) -> impl Iterator<Item = (Arc<K>, Bytes)> + '_ {
        let recent = self
            .recent
            .snapshot()
            .into_iter()
            .map(|(k, v)| (Arc::new(k), v));
        self.cache.iter().map(|(k, v)| (k, v.bytes)).chain(recent)
    }

    /// Current counters.
    pub fn stats(&self) -> MemoryTierStats {
        let (recent_bytes, recent_entries, recent_hits) = self.recent.stats();
        MemoryTierStats {
            capacity_bytes: self.capacity,
            used_bytes: self.cache.weighted_size() + recent_bytes,
            entries: self.cache.entry_count() + recent_entries,
            evictions: self.evictions.load(Ordering::Relaxed),
            recent_bytes,
            recent_hits,
            promotions: self.promoted.load(Ordering::Relaxed),
            promotions_skipped: self.promotions_skipped.load(Ordering::Relaxed),
        }
    }

    /// Run moka's pending housekeeping, so that [`stats`](Self::stats) is exact. For tests and
    /// metrics scrapes; never needed for correctness.
    pub async fn sync(&self) {
        self.cache.run_pending_tasks().await;
    }
}

/// Bytes of a tier of `capacity` kept for values its main part let go.
fn recent_share(capacity: u64) -> u64 {
    if capacity >= RECENT_FROM {
        capacity / RECENT_SHARE
    } else {
        0
    }
}

/// SplitMix64's output for `n`: consecutive counters give draws that look independent, so a
/// reader cycling through keys in a fixed order does not always land on the same skips.
fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn holds_and_evicts_by_bytes() {
        let tier = MemoryTier::new(1000);
        tier.insert(1u32, Bytes::from(vec![1u8; 400])).await;
        assert_eq!(tier.get(&1).await.as_deref(), Some(&[1u8; 400][..]));
        for k in 2..20u32 {
            tier.insert(k, Bytes::from(vec![k as u8; 400])).await;
            tier.get(&k).await;
        }
        tier.sync().await;
        let stats = tier.stats();
        assert!(
            stats.used_bytes <= 1000,
            "used {} > capacity",
            stats.used_bytes
        );
        assert!(stats.entries <= 2);
    }

    #[tokio::test]
    async fn eviction_hook_says_whether_the_value_was_read_again() {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let log = seen.clone();
        let tier = MemoryTier::with_eviction_hook(
            1000,
            Arc::new(move |k: &u32, _: &Bytes, read: bool| log.lock().push((*k, read))),
        );
        tier.insert(1, Bytes::from(vec![0u8; 400])).await;
        tier.insert(2, Bytes::from(vec![0u8; 400])).await;
        tier.get(&2).await;
        tier.remove(&1).await;
        tier.remove(&2).await;
        tier.sync().await;
        assert!(seen.lock().is_empty(), "removals are not evictions");
        tier.insert(1, Bytes::from(vec![0u8; 400])).await;
        tier.insert(2, Bytes::from(vec![0u8; 400])).await;
        tier.get(&2).await;
        // Read only by the request that fetched it: not read again.
        tier.insert(50, Bytes::from(vec![0u8; 400])).await;
        assert!(tier.get_fetched(&50).await.is_some());
        for k in 3..40u32 {
            tier.insert(k, Bytes::from(vec![0u8; 400])).await;
            tier.get(&k).await;
            tier.get(&k).await;
        }
        tier.sync().await;
        let seen = seen.lock();
        assert!(seen.contains(&(1, false)), "{seen:?}");
        assert!(seen.contains(&(2, true)), "{seen:?}");
        assert!(seen.contains(&(50, false)), "{seen:?}");
    }

    #[tokio::test]
    async fn copies_from_disk_are_stored_while_there_is_room_and_sampled_once_full() {
        const SMALL: usize = 64 << 10;
        let tier = MemoryTier::new(PROMOTE_ALWAYS_FROM as u64 * 2);
        for k in 0..32u32 {
            assert!(tier.insert_copy(k, Bytes::from(vec![0u8; SMALL])).await);
            tier.sync().await;
        }
        let full = tier.stats();
        assert_eq!(
            (full.promotions, full.promotions_skipped, full.used_bytes),
            (32, 0, 2 * PROMOTE_ALWAYS_FROM as u64),
            "every copy stored while there was room"
        );
        let mut stored = 0;
        for k in 100..420u32 {
            stored += u32::from(tier.insert_copy(k, Bytes::from(vec![0u8; SMALL])).await);
        }
        // One in 16 expected: 20 of 320. The draws are a fixed sequence, so this cannot flake;
        // the bounds only keep it from depending on that sequence's exact values.
        assert!(
            (6..=60).contains(&stored),
            "{stored} of 320 stored once full"
        );
        let sampled = tier.stats();
        assert_eq!(sampled.promotions, 32 + u64::from(stored));
        assert_eq!(sampled.promotions_skipped, 320 - u64::from(stored));
        // Large values are always worth their copy, full or not.
        for k in 1000..1004u32 {
            let large = Bytes::from(vec![0u8; PROMOTE_ALWAYS_FROM + 4096]);
            assert!(tier.insert_copy(k, large).await);
        }
    }

    /// The memory hit ratio of `requests` Zipf(1.0) reads over 1,024 values of 64 KiB, eight
    /// times the tier, each miss offering its value as a disk hit's promotion would.
    async fn zipf_memory_hits(sampled: bool, requests: u32) -> f64 {
        use rand::{Rng, SeedableRng};
        let weights: Vec<f64> = (1..=1024).map(|i| 1.0 / f64::from(i)).collect();
        let total: f64 = weights.iter().sum();
        let cdf: Vec<f64> = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w / total;
                Some(*acc)
            })
            .collect();
        let tier = MemoryTier::new(8 << 20);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut hits = 0u32;
        for i in 0..requests {
            let k = cdf.partition_point(|c| *c < rng.gen::<f64>()) as u32;
            if tier.get(&k).await.is_some() {
                hits += 1;
            } else if sampled {
                tier.insert_copy(k, Bytes::from(vec![0u8; 64 << 10])).await;
            } else {
                tier.insert(k, Bytes::from(vec![0u8; 64 << 10])).await;
            }
            if i % 1000 == 0 {
                tier.sync().await;
            }
        }
        f64::from(hits) / f64::from(requests)
    }

    #[tokio::test]
    async fn sampled_copies_keep_a_skewed_workloads_hot_values_in_memory() {
        // A hot value is read often, so it is offered soon; TinyLFU counts its reads all along.
        let always = zipf_memory_hits(false, 60_000).await;
        let sampled = zipf_memory_hits(true, 60_000).await;
        assert!(always > 0.5, "the workload has a hot set: {always}");
        assert!(
            sampled >= always - 0.02,
            "memory hits {sampled} sampled against {always} always"
        );
    }

    /// A tier whose main part is full of small values each read three times, and a large
    /// block `readers` missed while it was fetched, then inserted (the herd of
    /// docs/benchmarks.md, "The herd after a full tier").
    async fn full_of_small_values_then_a_missed_block(readers: usize) -> MemoryTier<u32> {
        const SMALL: usize = 16 << 10;
        let tier = MemoryTier::new(RECENT_FROM);
        let small = (MemoryTier::<u32>::largest_value(RECENT_FROM) / SMALL as u64) as u32;
        for k in 0..small {
            tier.insert(k, Bytes::from(vec![1u8; SMALL])).await;
        }
        for _ in 0..3 {
            for k in 0..small {
                tier.get(&k).await;
            }
        }
        tier.sync().await;
        for _ in 0..readers {
            assert!(tier.get(&u32::MAX).await.is_none());
        }
        tier.insert(u32::MAX, Bytes::from(vec![2u8; 8 << 20])).await;
        tier.sync().await;
        tier
    }

    #[tokio::test]
    async fn a_block_admission_turned_away_is_still_found_by_the_readers_after_its_fetch() {
        let tier = full_of_small_values_then_a_missed_block(20).await;
        for straggler in 0..20 {
            let got = tier.get(&u32::MAX).await;
            assert_eq!(got.map(|b| b.len()), Some(8 << 20), "straggler {straggler}");
            tier.sync().await;
        }
        let stats = tier.stats();
        // Served by the recent share: moka's admission did turn the block away (the sum of
        // the small values' counts beats any one count), so the main part alone would miss.
        assert!(stats.recent_hits >= 1, "{stats:?}");
        assert!(stats.used_bytes <= stats.capacity_bytes, "{stats:?}");
    }

    #[tokio::test]
    async fn the_recent_share_is_carved_out_of_the_capacity() {
        let tier = MemoryTier::new(RECENT_FROM);
        let largest = MemoryTier::<u32>::largest_value(RECENT_FROM);
        assert_eq!(largest, RECENT_FROM - RECENT_FROM / RECENT_SHARE);
        tier.insert(0u32, Bytes::from(vec![0u8; largest as usize + 1]))
            .await;
        assert!(!tier.contains(&0), "larger than the main part");
        for k in 1..100u32 {
            tier.insert(k, Bytes::from(vec![0u8; 8 << 20])).await;
            tier.get(&k).await;
            tier.sync().await;
        }
        let stats = tier.stats();
        assert!(stats.recent_bytes > 0, "{stats:?}");
        assert!(stats.used_bytes <= stats.capacity_bytes, "{stats:?}");
        // Below the threshold, the whole tier is the main part.
        assert_eq!(
            MemoryTier::<u32>::largest_value(RECENT_FROM - 1),
            RECENT_FROM - 1
        );
    }

    #[tokio::test]
    async fn refuses_values_larger_than_capacity() {
        let tier = MemoryTier::new(10);
        tier.insert("k", Bytes::from_static(b"01234567890")).await;
        assert!(tier.get(&"k").await.is_none());
        tier.insert("k", Bytes::from_static(b"0123")).await;
        tier.remove(&"k").await;
        assert!(tier.get(&"k").await.is_none());
    }
}
