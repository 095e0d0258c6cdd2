//! The hybrid cache: memory first, then disk, then whoever fetches. This is the API for using
//! `cache-core` in-process; the proxy uses the same tiers and adds streaming on top.
//!
//! ```no_run
//! use bytes::Bytes;
//! use cache_core::{CacheKey, DiskCache, DiskConfig, HybridCache, WritePolicy};
//!
//! #[derive(Clone, Hash, PartialEq, Eq)]
//! struct Page(u64);
//! impl CacheKey for Page {
//!     fn disk_key(&self) -> Vec<u8> {
//!         self.0.to_le_bytes().to_vec()
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let disk = DiskCache::open(DiskConfig::new("/var/cache/app.larder", 10 << 30)).await?;
//! let cache = HybridCache::new(256 << 20, Some(disk), WritePolicy::OnInsert);
//! let page = cache
//!     .get_or_fetch(Page(7), || async { Ok::<_, std::io::Error>(Bytes::from_static(b"...")) })
//!     .await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use bytes::Bytes;

use crate::disk::{DiskCache, Partition};
use crate::memory::MemoryTier;
use crate::single_flight::{Abandoned, Joined, SingleFlight};

/// A key of the hybrid cache. `disk_key` is what the disk tier stores and compares on every
/// read, so it must identify the value completely (two keys with equal `disk_key` are the same
/// key) and name immutable bytes.
pub trait CacheKey: Hash + Eq + Clone + Send + Sync + 'static {
    /// The key's bytes on disk.
    fn disk_key(&self) -> Vec<u8>;

    /// The disk partition the key belongs to. Default `"default"`.
    fn partition(&self) -> &str {
        "default"
    }
}

/// When a value reaches the disk tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum WritePolicy {
    /// As soon as it is inserted. The default: a restart keeps everything recently fetched, and
    /// disk writes follow the fetch rate instead of arriving in bursts under memory pressure.
    #[default]
    OnInsert,
    /// When the memory tier evicts it: fewer disk writes for short-lived values, but whatever is
    /// only in memory is lost at a restart.
    OnEvict,
}

/// Which tier answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The memory tier.
    Memory,
    /// The disk tier (the value is now in memory too).
    Disk,
    /// Neither: the value was fetched (by this call or one it joined).
    Fetched,
}

/// Why a fetch through [`HybridCache::get_or_fetch`] failed, as every waiter sees it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    /// The fetch returned an error (its message).
    #[error("fetch failed: {0}")]
    Failed(Arc<str>),
    /// The fetching task was cancelled or panicked.
    #[error(transparent)]
    Abandoned(#[from] Abandoned),
}

/// Memory tier, optional disk tier, and single-flight fetches.
pub struct HybridCache<K: CacheKey> {
    memory: MemoryTier<K>,
    disk: Option<DiskCache>,
    policy: WritePolicy,
    flights: SingleFlight<K, FetchError>,
}

fn partition_of<K: CacheKey>(disk: &DiskCache, key: &K) -> Option<Partition> {
    disk.partition(key.partition())
        .or_else(|| disk.partition("default"))
}

impl<K: CacheKey> HybridCache<K> {
    /// A cache of `memory_bytes` in memory over `disk`, if any.
    pub fn new(memory_bytes: u64, disk: Option<DiskCache>, policy: WritePolicy) -> Self {
        let memory = match (&disk, policy) {
            (Some(d), WritePolicy::OnEvict) => {
                let d = d.clone();
                MemoryTier::with_eviction_hook(
                    memory_bytes,
                    Arc::new(move |k: &K, v: &Bytes| {
                        if let Some(p) = partition_of(&d, k) {
                            let key = k.disk_key();
                            // A value promoted from disk is already there. Dropped writes are
                            // counted by the disk tier.
                            if !p.contains(&key) {
                                let _ = p.insert(&key, v.clone());
                            }
                        }
                    }),
                )
            }
            _ => MemoryTier::new(memory_bytes),
        };
        Self {
            memory,
            disk,
            policy,
            flights: SingleFlight::new(),
        }
    }

    /// The memory tier.
    pub fn memory(&self) -> &MemoryTier<K> {
        &self.memory
    }

    /// The disk tier, if configured.
    pub fn disk(&self) -> Option<&DiskCache> {
        self.disk.as_ref()
    }

    fn partition(&self, key: &K) -> Option<Partition> {
        partition_of(self.disk.as_ref()?, key)
    }

    /// Where `key` is held, without reading it: memory, disk, or nowhere.
    pub fn locate(&self, key: &K) -> Option<Tier> {
        if self.memory.contains(key) {
            Some(Tier::Memory)
        } else if self
            .partition(key)
            .is_some_and(|p| p.contains(&key.disk_key()))
        {
            Some(Tier::Disk)
        } else {
            None
        }
    }

    /// The value of `key` from memory, or from disk (then promoted to memory).
    pub async fn get(&self, key: &K) -> Option<(Bytes, Tier)> {
        if let Some(v) = self.memory.get(key).await {
            return Some((v, Tier::Memory));
        }
        let v = self.partition(key)?.get(&key.disk_key()).await?;
        self.memory.insert(key.clone(), v.clone()).await;
        Some((v, Tier::Disk))
    }

    /// Bytes `range` of the value of `key`: sliced from memory, or read from disk verifying only
    /// the 64 KiB chunks the range touches. A disk hit is not promoted (a small read should not
    /// pull a whole value into memory).
    pub async fn get_range(&self, key: &K, range: std::ops::Range<u64>) -> Option<(Bytes, Tier)> {
        if let Some(v) = self.memory.get(key).await {
            let len = v.len() as u64;
            let (from, to) = (range.start.min(len), range.end.min(len));
            return Some((v.slice(from as usize..to.max(from) as usize), Tier::Memory));
        }
        let v = self
            .partition(key)?
            .get_range(&key.disk_key(), range)
            .await?;
        Some((v, Tier::Disk))
    }

    /// Store `value` in memory and, under [`WritePolicy::OnInsert`], offer it to disk.
    pub async fn insert(&self, key: K, value: Bytes) {
        if self.policy == WritePolicy::OnInsert {
            if let Some(p) = self.partition(&key) {
                let _ = p.insert(&key.disk_key(), value.clone());
            }
        }
        self.memory.insert(key, value).await;
    }

    /// Store `value` where it does not displace the hot set: in the disk tier if there is one
    /// (`false` if the disk tier turned it away: rate limit, full write buffer, admission),
    /// otherwise in memory. For warming a cache ahead of a job.
    pub async fn insert_cold(&self, key: K, value: Bytes) -> bool {
        if self.disk.is_none() {
            self.memory.insert(key, value).await;
            return true;
        }
        match self.partition(&key) {
            Some(p) => p.insert(&key.disk_key(), value).is_ok(),
            None => false,
        }
    }

    /// Drop `key` from both tiers.
    pub async fn remove(&self, key: &K) {
        self.memory.remove(key).await;
        if let Some(p) = self.partition(key) {
            p.remove(&key.disk_key());
        }
    }

    /// The value of `key`, fetching it with `fetch` on a miss. Concurrent callers for the same
    /// key share one fetch; its result is cached. The fetch runs in a task of its own, so a
    /// caller that gives up does not cancel it for the others.
    pub async fn get_or_fetch<F, Fut, E>(
        &self,
        key: K,
        fetch: F,
    ) -> Result<(Bytes, Tier), FetchError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        if let Some(hit) = self.get(&key).await {
            return Ok(hit);
        }
        let mut reader = match self.flights.join(key.clone()) {
            Joined::Follower(reader) => reader,
            Joined::Leader { mut writer, reader } => {
                let fut = fetch();
                let memory = self.memory.clone();
                let disk = match self.policy {
                    WritePolicy::OnInsert => self.partition(&key),
                    WritePolicy::OnEvict => None,
                };
                tokio::spawn(async move {
                    match fut.await {
                        Ok(v) => {
                            // Offered to disk before the waiters wake, so a caller that closes
                            // the cache right after its get does not race the write.
                            if let Some(p) = disk {
                                let _ = p.insert(&key.disk_key(), v.clone());
                            }
                            writer.push(v);
                            let v = writer.finish();
                            memory.insert(key, v).await;
                        }
                        Err(e) => writer.fail(FetchError::Failed(e.to_string().into())),
                    }
                });
                reader
            }
        };
        let mut out = Vec::new();
        while let Some(chunk) = reader.next_chunk().await {
            out.push(chunk?);
        }
        Ok((bytes_concat(out), Tier::Fetched))
    }
}

fn bytes_concat(mut parts: Vec<Bytes>) -> Bytes {
    if parts.len() == 1 {
        return parts.remove(0);
    }
    parts.concat().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::DiskConfig;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Clone, Hash, PartialEq, Eq, Debug)]
    struct K(u32);
    impl CacheKey for K {
        fn disk_key(&self) -> Vec<u8> {
            format!("k{}", self.0).into_bytes()
        }
    }

    async fn disk(path: &std::path::Path) -> DiskCache {
        let mut cfg = DiskConfig::new(path, 9 << 20);
        cfg.region_size = 1 << 20;
        DiskCache::open(cfg).await.expect("open")
    }

    #[tokio::test]
    async fn memory_then_disk_then_fetch_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = HybridCache::new(
            1 << 20,
            Some(disk(&dir.path().join("c")).await),
            WritePolicy::OnInsert,
        );
        let fetches = Arc::new(AtomicUsize::new(0));
        let mut waiters = Vec::new();
        let cache = Arc::new(cache);
        for _ in 0..8 {
            let (cache, fetches) = (cache.clone(), fetches.clone());
            waiters.push(tokio::spawn(async move {
                cache
                    .get_or_fetch(K(1), move || async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        Ok::<_, std::io::Error>(Bytes::from(vec![7u8; 100_000]))
                    })
                    .await
            }));
        }
        for w in waiters {
            let (v, tier) = w.await.expect("join").expect("fetched");
            assert_eq!(v.len(), 100_000);
            assert_ne!(tier, Tier::Disk);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        assert_eq!(cache.get(&K(1)).await.map(|(_, t)| t), Some(Tier::Memory));
        cache.memory().remove(&K(1)).await;
        assert_eq!(cache.locate(&K(1)), Some(Tier::Disk));
        let (part, tier) = cache.get_range(&K(1), 70_000..70_010).await.expect("range");
        assert_eq!((part.len(), tier), (10, Tier::Disk));
        assert_eq!(
            cache.locate(&K(1)),
            Some(Tier::Disk),
            "a range read does not promote"
        );
        let (v, tier) = cache.get(&K(1)).await.expect("disk hit");
        assert_eq!((v.len(), tier), (100_000, Tier::Disk));
        assert_eq!(cache.locate(&K(1)), Some(Tier::Memory), "promoted");
        cache.remove(&K(1)).await;
        assert_eq!(cache.locate(&K(1)), None);
    }

    #[tokio::test]
    async fn on_evict_writes_what_memory_lets_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = disk(&dir.path().join("c")).await;
        let cache = HybridCache::new(200_000, Some(d.clone()), WritePolicy::OnEvict);
        for i in 0..10 {
            cache.insert(K(i), Bytes::from(vec![i as u8; 60_000])).await;
        }
        cache.memory().sync().await;
        d.flush().await;
        let written = d.stats().writes;
        assert!(written >= 5, "evicted values reach disk: {written}");
        for i in 0..10 {
            let (v, _) = cache.get(&K(i)).await.expect("memory or disk");
            assert_eq!(v, Bytes::from(vec![i as u8; 60_000]));
        }
    }
}
