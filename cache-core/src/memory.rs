//! The memory tier: a byte-weighted cache of immutable blocks.

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use moka::future::Cache;
use moka::notification::RemovalCause;

/// Called with each value the memory tier evicts for size (or turns away when it is full), and
/// whether that value was read again while held.
pub type EvictionHook<K> = Arc<dyn Fn(&K, &Bytes, bool) + Send + Sync>;

/// A held value and whether it was read since it was inserted: what S3-FIFO calls a hit in the
/// small queue, and the disk tier's admission wants to know.
#[derive(Clone)]
struct Held {
    bytes: Bytes,
    read: Arc<AtomicBool>,
}

/// A byte-weighted in-memory cache on moka (TinyLFU admission, LRU eviction).
///
/// Values are immutable [`Bytes`]: a hit hands out a reference-counted view, never a copy.
#[derive(Clone)]
pub struct MemoryTier<K> {
    cache: Cache<K, Held>,
    evictions: Arc<AtomicU64>,
    capacity: u64,
}

/// A snapshot of the memory tier's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryTierStats {
    /// Configured capacity in bytes.
    pub capacity_bytes: u64,
    /// Bytes held (moka's weighted size; updated lazily by moka's housekeeping).
    pub used_bytes: u64,
    /// Entries held.
    pub entries: u64,
    /// Entries evicted for size since start.
    pub evictions: u64,
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

    fn build(capacity_bytes: u64, hook: Option<EvictionHook<K>>) -> Self {
        let evictions = Arc::new(AtomicU64::new(0));
        let counter = evictions.clone();
        let cache = Cache::builder()
            .max_capacity(capacity_bytes)
            .weigher(|_k: &K, v: &Held| u32::try_from(v.bytes.len()).unwrap_or(u32::MAX))
            .eviction_listener(move |k: Arc<K>, v: Held, cause| {
                if cause == RemovalCause::Size {
                    counter.fetch_add(1, Ordering::Relaxed);
                    if let Some(hook) = &hook {
                        hook(&k, &v.bytes, v.read.load(Ordering::Relaxed));
                    }
                }
            })
            .build();
        Self {
            cache,
            evictions,
            capacity: capacity_bytes,
        }
    }

    /// The value for `key`, if held.
    pub async fn get(&self, key: &K) -> Option<Bytes> {
        let held = self.cache.get(key).await?;
        // Load first: a hot value's flag is set once, not written by every reader.
        if !held.read.load(Ordering::Relaxed) {
            held.read.store(true, Ordering::Relaxed);
        }
        // Counted toward lending its bytes to sockets (`buffers`; small values return at once).
        crate::buffers::read_again(&held.bytes);
        Some(held.bytes)
    }

    /// Whether `key` is held, without counting as an access.
    pub fn contains(&self, key: &K) -> bool {
        self.cache.contains_key(key)
    }

    /// Store `value` under `key`. Values larger than the whole capacity are not stored.
    pub async fn insert(&self, key: K, value: Bytes) {
        if value.len() as u64 > self.capacity || u32::try_from(value.len()).is_err() {
            return;
        }
        let held = Held {
            bytes: value,
            read: Arc::new(AtomicBool::new(false)),
        };
        self.cache.insert(key, held).await;
    }

    /// Drop `key`, if held.
    pub async fn remove(&self, key: &K) {
        self.cache.invalidate(key).await;
    }

    /// Every entry held now (a snapshot taken as it goes; entries inserted meanwhile may or
    /// may not appear).
    pub fn entries(&self) -> impl Iterator<Item = (Arc<K>, Bytes)> + '_ {
        self.cache.iter().map(|(k, v)| (k, v.bytes))
    }

    /// Current counters.
    pub fn stats(&self) -> MemoryTierStats {
        MemoryTierStats {
            capacity_bytes: self.capacity,
            used_bytes: self.cache.weighted_size(),
            entries: self.cache.entry_count(),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    /// Run moka's pending housekeeping, so that [`stats`](Self::stats) is exact. For tests and
    /// metrics scrapes; never needed for correctness.
    pub async fn sync(&self) {
        self.cache.run_pending_tasks().await;
    }
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
        for k in 3..40u32 {
            tier.insert(k, Bytes::from(vec![0u8; 400])).await;
            tier.get(&k).await;
            tier.get(&k).await;
        }
        tier.sync().await;
        let seen = seen.lock();
        assert!(seen.contains(&(1, false)), "{seen:?}");
        assert!(seen.contains(&(2, true)), "{seen:?}");
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
