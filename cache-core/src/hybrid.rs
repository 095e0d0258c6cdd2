//! The hybrid cache: memory first, then disk, then one fetch per key however many callers want
//! it. It is the engine the proxy serves from, and the API for embedding `cache-core`:
//!
//! - [`HybridCache::get_or_fetch`] for whole values: a miss runs one fetch, every caller gets its
//!   result;
//! - [`HybridCache::join`] for streaming: a miss returns a [`Fill`] that streams the value's
//!   bytes to every waiter as they arrive and then stores it in the tiers (or not, as the
//!   caller decides), while later callers for the same key get a [`FlightReader`] on the same
//!   bytes. Errors are the caller's own type `E`.
//!
//! ```no_run
//! use bytes::Bytes;
//! use cache_core::{CacheKey, DiskCache, DiskConfig, FetchError, HybridCache, WritePolicy};
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
//! let cache: HybridCache<Page, FetchError> =
//!     HybridCache::new(256 << 20, Some(disk), WritePolicy::OnInsert);
//! let page = cache
//!     .get_or_fetch(Page(7), || async { Ok(Bytes::from_static(b"...")) })
//!     .await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use bytes::Bytes;

use crate::disk::{DiskCache, Partition};
use crate::memory::MemoryTier;
use crate::single_flight::{Abandoned, FlightReader, FlightWriter, Joined, SingleFlight};

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
    /// When the memory tier evicts it: a fetched value is held once, in memory, until memory
    /// lets it go, so the two tiers' capacities add up (a value read back from disk stays on
    /// disk too, and is not written again). Fewer disk writes for short-lived values.
    /// [`HybridCache::spill`] writes the memory tier down at shutdown so that a restart keeps
    /// the hot set; a crash loses what was only in memory (never serving wrong bytes).
    OnEvict,
}

/// Which tier answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The memory tier.
    Memory,
    /// The disk tier (and perhaps now memory too: [`MemoryTier::insert_copy`]).
    Disk,
    /// Neither: the value was fetched (by this call or one it joined).
    Fetched,
}

/// A ready-made error type for [`HybridCache`], for fetches whose errors are only reported.
/// Any `E: Clone + From<Abandoned>` will do: every waiter gets a clone of the fetch's error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    /// The fetch failed (its message).
    #[error("fetch failed: {0}")]
    Failed(Arc<str>),
    /// The fetching task was cancelled or panicked.
    #[error(transparent)]
    Abandoned(#[from] Abandoned),
}

/// Memory tier, optional disk tier, and single-flight fetches failing with `E`. Cloning it is
/// cheap and shares everything.
pub struct HybridCache<K: CacheKey, E = FetchError> {
    memory: MemoryTier<K>,
    disk: Option<DiskCache>,
    policy: WritePolicy,
    flights: SingleFlight<K, E>,
}

impl<K: CacheKey, E> Clone for HybridCache<K, E> {
    fn clone(&self) -> Self {
        Self {
            memory: self.memory.clone(),
            disk: self.disk.clone(),
            policy: self.policy,
            flights: self.flights.clone(),
        }
    }
}

/// What [`HybridCache::join`] gives a caller.
pub enum Miss<K: CacheKey, E> {
    /// Nobody was fetching the key: the caller fetches it and feeds `fill` (from a task of its
    /// own, so that a caller going away does not cancel the fetch for the others); `reader`
    /// reads the same bytes as every other waiter.
    Fetch {
        /// Streams the value to the waiters, then into the tiers.
        fill: Fill<K, E>,
        /// This caller's view of the value.
        reader: FlightReader<E>,
    },
    /// A fetch was already running: this reader sees all of its bytes, from the first.
    Joined(FlightReader<E>),
}

/// The fetching caller's handle on a miss. Every chunk pushed reaches every waiter at once; the
/// way it ends says where the value goes. Dropped without ending, the waiters get
/// [`Abandoned`].
pub struct Fill<K: CacheKey, E> {
    key: K,
    writer: FlightWriter<K, E>,
    cache: HybridCache<K, E>,
    /// Another reader is known to want the value after its fetch ([`Fill::wanted_again`]).
    wanted_again: bool,
}

impl<K: CacheKey, E: Clone + From<Abandoned>> Fill<K, E> {
    /// The key being fetched.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Hand `chunk` to every waiter.
    pub fn push(&self, chunk: Bytes) {
        self.writer.push(chunk);
    }

    /// The value will be `len` bytes: assemble it in one buffer as its chunks are pushed, so
    /// that storing it copies nothing more ([`crate::buffers::Assembly`]). Call it before the
    /// first chunk (it does nothing after one).
    pub fn assemble(&self, len: usize) {
        self.writer.assemble(len);
    }

    /// Another reader is known to want the value once it is fetched (one coming behind the
    /// readers of its fetch): it is committed as read again, as a value more than one reader
    /// read as it came is.
    pub fn wanted_again(&mut self) {
        self.wanted_again = true;
    }

    /// The value is complete: the waiters get its end, and it is stored as
    /// [`HybridCache::insert`] stores, counted as read again if more than one reader read it
    /// as it came or [`wanted_again`](Self::wanted_again) was called (a herd's block: the
    /// disk's `second-hit` admission then takes it when memory lets it go, where it would have
    /// turned away a block read once). Until this returns, callers joining the key find the
    /// finished value instead of starting a second fetch.
    pub async fn commit(mut self) -> Bytes {
        let value = self.writer.finish();
        let read_again = self.wanted_again || self.writer.readers() > 1;
        self.cache
            .store(self.key.clone(), value.clone(), read_again)
            .await;
        value
    }

    /// The value is complete: the waiters get its end, and it is stored as
    /// [`HybridCache::insert_cold`] stores (`false` if the disk tier turned it away).
    pub async fn commit_cold(mut self) -> bool {
        let value = self.writer.finish();
        self.cache.insert_cold(self.key.clone(), value).await
    }

    /// The value is complete but not to be cached here: the waiters get its end and it is
    /// returned.
    pub fn deliver(mut self) -> Bytes {
        self.writer.finish()
    }

    /// The value is complete but not to be cached, nor wanted in one buffer: the waiters get
    /// its end (they have its chunks), and nothing is copied.
    pub fn end(mut self) {
        self.writer.end();
    }

    /// Another reader of the value being fetched, from its first chunk.
    pub fn reader(&self) -> FlightReader<E> {
        self.writer.reader()
    }

    /// The fetch failed: every waiter gets `error`, and the next caller starts a new fetch.
    pub fn fail(self, error: E) {
        self.writer.fail(error);
    }
}

fn partition_of<K: CacheKey>(disk: &DiskCache, key: &K) -> Option<Partition> {
    disk.partition(key.partition())
        .or_else(|| disk.partition("default"))
}

impl<K: CacheKey, E: Clone + From<Abandoned>> HybridCache<K, E> {
    /// A cache of `memory_bytes` in memory over `disk`, if any.
    pub fn new(memory_bytes: u64, disk: Option<DiskCache>, policy: WritePolicy) -> Self {
        let memory = match (&disk, policy) {
            (Some(d), WritePolicy::OnEvict) => {
                let d = d.clone();
                MemoryTier::with_eviction_hook(
                    memory_bytes,
                    Arc::new(move |k: &K, v: &Bytes, read_again: bool| {
                        if let Some(p) = partition_of(&d, k) {
                            let key = k.disk_key();
                            // A value promoted from disk is already there; read again in
                            // memory, it counts as read on disk too, or the disk's reclaim
                            // would see the hottest blocks (served from memory) as unread.
                            // Dropped writes are counted by the disk tier, whose admission
                            // decides on reuse.
                            let held = if read_again {
                                p.touch(&key)
                            } else {
                                p.contains(&key)
                            };
                            if !held {
                                let _ = if read_again {
                                    p.insert_proven(&key, v.clone())
                                } else {
                                    p.insert(&key, v.clone())
                                };
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

    /// The value of `key` from memory, or from disk (then promoted to memory, as
    /// [`MemoryTier::insert_copy`] decides).
    pub async fn get(&self, key: &K) -> Option<(Bytes, Tier)> {
        if let Some(v) = self.memory.get(key).await {
            return Some((v, Tier::Memory));
        }
        self.promote(key).await.map(|v| (v, Tier::Disk))
    }

    /// The value of `key` from disk, in one read, then promoted to memory as
    /// [`MemoryTier::insert_copy`] decides (for a caller that looked in memory already: a
    /// second lookup would count twice in its admission).
    pub async fn promote(&self, key: &K) -> Option<Bytes> {
        let v = self.partition(key)?.get(&key.disk_key()).await?;
        self.memory.insert_copy(key.clone(), v.clone()).await;
        Some(v)
    }

    /// Write every value held only in memory down to disk, waiting for the disk's write
    /// buffer rather than dropping any, for at most `within`; under [`WritePolicy::OnEvict`],
    /// so that a restart finds the hot set. Returns the values written. The disk still has to
    /// be flushed or closed afterwards.
    pub async fn spill(&self, within: std::time::Duration) -> usize {
        if self.policy == WritePolicy::OnInsert {
            return 0;
        }
        let deadline = tokio::time::Instant::now() + within;
        let mut written = 0;
        for (key, value) in self.memory.entries() {
            let Some(partition) = self.partition(&key) else {
                continue;
            };
            let disk_key = key.disk_key();
            if partition.contains(&disk_key) {
                continue;
            }
            match tokio::time::timeout_at(deadline, partition.insert_waiting(&disk_key, value))
                .await
            {
                Ok(Ok(())) => written += 1,
                Ok(Err(_)) => {}
                Err(_) => break,
            }
        }
        written
    }

    /// Bytes `range` of the value of `key` read from disk, verifying only the 64 KiB chunks the
    /// range touches; not promoted (a small read should not pull a whole value into memory).
    /// Memory is not looked at: this is for a caller that looked there already, as for
    /// [`HybridCache::promote`], since a second lookup would count twice in its admission.
    pub async fn range_on_disk(&self, key: &K, range: std::ops::Range<u64>) -> Option<Bytes> {
        self.partition(key)?.get_range(&key.disk_key(), range).await
    }

    /// The value of `key` from disk as a stream of verified pieces (see
    /// [`Partition::stream`](crate::disk::Partition::stream)); not promoted to memory, which is
    /// the caller's choice once the stream is whole. `None` if the disk does not hold it.
    pub async fn disk_stream(&self, key: &K) -> Option<crate::disk::ValueStream> {
        self.partition(key)?.stream(&key.disk_key()).await
    }

    /// Store `value` in memory and, under [`WritePolicy::OnInsert`], offer it to disk.
    pub async fn insert(&self, key: K, value: Bytes) {
        self.store(key, value, false).await;
    }

    /// [`insert`](Self::insert), for a value `read_again` already (by more than one reader of
    /// its fetch): the disk's admission takes it as it takes a value memory saw read again.
    async fn store(&self, key: K, value: Bytes, read_again: bool) {
        if self.policy == WritePolicy::OnInsert {
            if let Some(p) = self.partition(&key) {
                let disk_key = key.disk_key();
                let _ = if read_again {
                    p.insert_proven(&disk_key, value.clone())
                } else {
                    p.insert(&disk_key, value.clone())
                };
            }
        }
        self.memory.store(key, value, read_again).await;
    }

    /// Store `value` where it does not displace the hot set: in the disk tier if there is one
    /// (`false` if the disk tier turned it away: rate limit, full write buffer; it was asked
    /// for, so admission lets it through), otherwise in memory. For warming a cache ahead of a
    /// job.
    pub async fn insert_cold(&self, key: K, value: Bytes) -> bool {
        if self.disk.is_none() {
            self.memory.insert(key, value).await;
            return true;
        }
        match self.partition(&key) {
            Some(p) => p.insert_proven(&key.disk_key(), value).is_ok(),
            None => false,
        }
    }

    /// Offer `value` to the disk tier only, like a block memory let go unread: the disk's
    /// admission decides (`false` if it turned it away). Without a disk tier, nothing is
    /// stored. For small notes that are worth keeping only as much as what they describe.
    pub fn offer_cold(&self, key: &K, value: Bytes) -> bool {
        self.partition(key)
            .is_some_and(|p| p.insert(&key.disk_key(), value).is_ok())
    }

    /// Drop `key` from both tiers.
    pub async fn remove(&self, key: &K) {
        self.memory.remove(key).await;
        if let Some(p) = self.partition(key) {
            p.remove(&key.disk_key());
        }
    }

    /// Join the fetch of `key`, starting it if nobody is fetching: the one place where
    /// concurrent misses become one fetch. Callers look in the tiers first ([`Self::get`],
    /// [`Self::locate`]); a fetch that completed between that look and this join is found by
    /// looking again after becoming the fetcher.
    pub fn join(&self, key: K) -> Miss<K, E> {
        match self.flights.join(key.clone()) {
            Joined::Follower(reader) => Miss::Joined(reader),
            Joined::Leader { writer, reader } => Miss::Fetch {
                fill: Fill {
                    key,
                    writer,
                    cache: self.clone(),
                    wanted_again: false,
                },
                reader,
            },
        }
    }

    /// Whether a fetch of `key` is running.
    pub fn in_flight(&self, key: &K) -> bool {
        self.flights.contains(key)
    }

    /// Number of fetches running.
    pub fn fetches(&self) -> usize {
        self.flights.in_flight()
    }

    /// The value of `key`, fetching it with `fetch` on a miss. Concurrent callers for the same
    /// key share one fetch; its result is cached before any caller returns. The fetch runs in a
    /// task of its own, so a caller that gives up does not cancel it for the others.
    pub async fn get_or_fetch<F, Fut>(&self, key: K, fetch: F) -> Result<(Bytes, Tier), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
        E: Send + Sync + 'static,
    {
        if let Some(hit) = self.get(&key).await {
            return Ok(hit);
        }
        let mut reader = match self.join(key) {
            Miss::Joined(reader) => reader,
            Miss::Fetch { fill, reader } => {
                let fut = fetch();
                tokio::spawn(async move {
                    match fut.await {
                        Ok(value) => {
                            // Stored before the waiters wake: a caller that reads the cache (or
                            // closes it) right after its get finds the value there.
                            fill.cache.insert(fill.key.clone(), value.clone()).await;
                            fill.push(value);
                            fill.deliver();
                        }
                        Err(e) => fill.fail(e),
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

    /// A disk tier of nine 1 MiB regions with `second-hit` admission, its never-used space
    /// filled first (until then everything is admitted), and its default partition.
    async fn full_second_hit_disk(dir: &std::path::Path) -> (DiskCache, crate::disk::Partition) {
        let mut cfg = DiskConfig::new(dir.join("c"), 9 << 20);
        cfg.region_size = 1 << 20;
        cfg.admission = crate::disk::Admission::SecondHit;
        let d = DiskCache::open(cfg).await.expect("open");
        let part = d.partition("default").unwrap();
        let mut i = 1000;
        while part.stats().free_regions > 2 {
            part.insert(&K(i).disk_key(), Bytes::from(vec![0u8; 60_000]))
                .expect("admitted");
            part.flush().await;
            i += 1;
        }
        (d, part)
    }

    /// Values read more often push K(0) and K(1) out of `cache`'s memory (its admission is by
    /// frequency: it takes a few rounds), and what memory let go reaches the disk.
    async fn push_out_k0_and_k1(cache: &HybridCache<K>, d: &DiskCache) {
        let value = |i: u32| Bytes::from(vec![i as u8; 60_000]);
        for _ in 0..5 {
            for i in 2..12 {
                if cache.get(&K(i)).await.is_none() {
                    cache.insert(K(i), value(i)).await;
                }
                cache.get(&K(i)).await;
            }
        }
        cache.memory().sync().await;
        d.flush().await;
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
                        Ok::<_, FetchError>(Bytes::from(vec![7u8; 100_000]))
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
        let part = cache
            .range_on_disk(&K(1), 70_000..70_010)
            .await
            .expect("range");
        assert_eq!(part.len(), 10);
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

    /// Its callers looked in memory already; a second look would count twice in the memory
    /// tier's admission. Memory holding other bytes under the key shows it is not looked at.
    #[tokio::test]
    async fn a_range_on_disk_is_read_from_disk_whatever_memory_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = HybridCache::<K>::new(
            1 << 20,
            Some(disk(&dir.path().join("c")).await),
            WritePolicy::OnInsert,
        );
        cache.insert(K(3), Bytes::from(vec![1u8; 100_000])).await;
        cache
            .memory()
            .insert(K(3), Bytes::from(vec![2u8; 100_000]))
            .await;
        assert_eq!(cache.locate(&K(3)), Some(Tier::Memory));
        let part = cache.range_on_disk(&K(3), 70_000..70_010).await;
        assert_eq!(part.as_deref(), Some(&[1u8; 10][..]));
        assert_eq!(cache.range_on_disk(&K(4), 0..10).await, None, "not held");
    }

    #[tokio::test]
    async fn a_streamed_miss_reaches_every_waiter_and_its_ending_decides_where_it_goes() {
        let cache = HybridCache::<K>::new(1 << 20, None, WritePolicy::OnInsert);
        let Miss::Fetch { fill, mut reader } = cache.join(K(1)) else {
            panic!("the first caller fetches");
        };
        fill.push(Bytes::from_static(b"ab"));
        let Miss::Joined(mut late) = cache.join(K(1)) else {
            panic!("a second caller joins the running fetch");
        };
        assert!(cache.in_flight(&K(1)));
        fill.push(Bytes::from_static(b"cd"));
        assert_eq!(fill.commit().await, Bytes::from_static(b"abcd"));
        for r in [&mut reader, &mut late] {
            let mut got = Vec::new();
            while let Some(chunk) = r.next_chunk().await {
                got.extend_from_slice(&chunk.expect("chunk"));
            }
            assert_eq!(got, b"abcd", "every waiter sees every byte, from the first");
        }
        assert_eq!(cache.locate(&K(1)), Some(Tier::Memory), "committed");
        assert!(!cache.in_flight(&K(1)));

        let Miss::Fetch { fill, .. } = cache.join(K(2)) else {
            panic!("nobody fetches K(2)");
        };
        fill.push(Bytes::from_static(b"x"));
        assert_eq!(fill.deliver(), Bytes::from_static(b"x"));
        assert_eq!(cache.locate(&K(2)), None, "delivered, not cached");

        let Miss::Fetch { fill, mut reader } = cache.join(K(3)) else {
            panic!("nobody fetches K(3)");
        };
        fill.fail(FetchError::Failed("boom".into()));
        assert!(matches!(
            reader.next_chunk().await,
            Some(Err(FetchError::Failed(_)))
        ));
        assert!(
            matches!(cache.join(K(3)), Miss::Fetch { .. }),
            "a failed fetch leaves room for the next"
        );
    }

    #[tokio::test]
    async fn on_evict_writes_what_memory_lets_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = disk(&dir.path().join("c")).await;
        let cache = HybridCache::<K>::new(200_000, Some(d.clone()), WritePolicy::OnEvict);
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

    #[tokio::test]
    async fn second_hit_writes_what_memory_saw_read_again_and_refuses_one_offs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (d, part) = full_second_hit_disk(dir.path()).await;
        let cache = HybridCache::<K>::new(200_000, Some(d.clone()), WritePolicy::OnEvict);
        let value = |i: u32| Bytes::from(vec![i as u8; 60_000]);
        cache.insert(K(0), value(0)).await;
        cache.insert(K(1), value(1)).await;
        assert!(cache.get(&K(1)).await.is_some(), "read again in memory");
        push_out_k0_and_k1(&cache, &d).await;
        assert!(!cache.memory().contains(&K(0)) && !cache.memory().contains(&K(1)));
        assert!(
            part.contains(&K(1).disk_key()),
            "read again in memory: written"
        );
        assert!(
            !part.contains(&K(0).disk_key()),
            "fetched once, never read again: refused"
        );
        assert!(part.stats().dropped(crate::disk::DropReason::Admission) >= 1);
    }

    #[tokio::test]
    async fn a_disk_value_read_again_in_memory_counts_as_read_on_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = disk(&dir.path().join("c")).await;
        let part = d.partition("default").unwrap();
        let cache = HybridCache::<K>::new(200_000, Some(d.clone()), WritePolicy::OnEvict);
        let value = |i: u32| Bytes::from(vec![i as u8; 60_000]);
        for i in [0, 1] {
            part.insert(&K(i).disk_key(), value(i)).expect("accepted");
        }
        part.flush().await;
        // Each read from disk once, promoted to memory; K(1) read again there.
        for i in [0, 1] {
            assert_eq!(cache.get(&K(i)).await, Some((value(i), Tier::Disk)));
        }
        assert_eq!(cache.get(&K(1)).await, Some((value(1), Tier::Memory)));
        push_out_k0_and_k1(&cache, &d).await;
        assert!(!cache.memory().contains(&K(0)) && !cache.memory().contains(&K(1)));
        assert_eq!(part.reads_counted(&K(0).disk_key()), Some(1));
        assert_eq!(
            part.reads_counted(&K(1).disk_key()),
            Some(2),
            "the read in memory counts towards the disk keeping it"
        );
    }

    #[tokio::test]
    async fn second_hit_writes_a_value_two_readers_read_as_it_was_fetched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (d, part) = full_second_hit_disk(dir.path()).await;
        let cache = HybridCache::<K>::new(200_000, Some(d.clone()), WritePolicy::OnEvict);
        let value = |i: u32| Bytes::from(vec![i as u8; 60_000]);
        // K(0): a herd's value, its fetch read by its leader and a follower. K(1): read by its
        // leader alone. Neither is read from memory afterwards.
        for (key, readers) in [(K(0), 2), (K(1), 1)] {
            let Miss::Fetch { fill, reader } = cache.join(key.clone()) else {
                panic!("nobody fetches it yet");
            };
            let mut readers: Vec<_> = std::iter::once(reader)
                .chain((1..readers).map(|_| match cache.join(key.clone()) {
                    Miss::Joined(r) => r,
                    Miss::Fetch { .. } => panic!("the fetch is running"),
                }))
                .collect();
            fill.push(value(key.0));
            for r in &mut readers {
                assert_eq!(r.next_chunk().await.unwrap().unwrap(), value(key.0));
            }
            fill.commit().await;
        }
        push_out_k0_and_k1(&cache, &d).await;
        assert!(!cache.memory().contains(&K(0)) && !cache.memory().contains(&K(1)));
        assert!(
            part.contains(&K(0).disk_key()),
            "read by two as it was fetched: written"
        );
        assert!(!part.contains(&K(1).disk_key()), "read by one: refused");
    }

    #[tokio::test]
    async fn on_evict_holds_a_fetched_value_once_and_spills_memory_at_shutdown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c");
        let d = disk(&path).await;
        let cache = HybridCache::<K>::new(200_000, Some(d.clone()), WritePolicy::OnEvict);
        let value = |i: u32| Bytes::from(vec![i as u8; 60_000]);
        let disk_part = d.partition("default").unwrap();
        cache.insert(K(0), value(0)).await;
        assert_eq!(cache.locate(&K(0)), Some(Tier::Memory));
        assert!(
            !disk_part.contains(&K(0).disk_key()),
            "a fetch is not written at once"
        );
        for i in 1..10 {
            cache.insert(K(i), value(i)).await;
        }
        cache.memory().sync().await;
        d.flush().await;
        let both = (0..10)
            .filter(|i| cache.memory().contains(&K(*i)) && disk_part.contains(&K(*i).disk_key()))
            .count();
        assert_eq!(both, 0, "a fetched value is held once");
        // Shutdown: memory is written down, and a reopened cache holds every value.
        let in_memory = (0..10).filter(|i| cache.memory().contains(&K(*i))).count();
        assert!(in_memory > 0);
        assert_eq!(
            cache.spill(std::time::Duration::from_secs(10)).await,
            in_memory
        );
        d.close().await;
        drop(cache);
        drop(d);
        let reopened = disk(&path).await;
        let part = reopened.partition("default").unwrap();
        for i in 0..10 {
            assert_eq!(
                part.get(&K(i).disk_key()).await,
                Some(value(i)),
                "K({i}) after a restart"
            );
        }
    }
}
