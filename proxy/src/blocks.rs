//! Block-aligned reads: a byte range of an object is served from fixed-size blocks, each found
//! in the memory tier or fetched from the origin once, however many readers want it.
//!
//! A block is cached under (bucket, key, ETag, index), and every upstream fetch carries
//! `If-Match: <ETag>`, so a block can only ever hold bytes of the version its key names: one
//! response never mixes two versions of an object.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cache_core::{
    BlockLayout, BlockSlice, CacheKey, DiskCache, FlightReader, FlightWriter, HybridCache, Joined,
    MemoryTier, SingleFlight, Tier, WritePolicy,
};
use futures::stream::{self, Stream, StreamExt};
use tokio::sync::Semaphore;

use crate::metrics::{Metrics, UpstreamStatus};
use crate::origin::{ObjectId, Origin, OriginError};
use tracing::Instrument;

/// A slice at most this fraction of its block (1 MiB of an 8 MiB block) is read from disk by
/// range rather than as a whole block.
const SMALL_SLICE_DIVISOR: u64 = 8;

/// The cache key of one block of one version of an object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockId {
    bucket: Arc<str>,
    key: Arc<str>,
    etag: Arc<str>,
    index: u64,
    /// Disk partition of the bucket (a function of `bucket`, so it changes nothing in equality).
    partition: Arc<str>,
}

impl BlockId {
    /// The key of block `index` of `object` at `etag`, cached in disk partition `partition`. The
    /// version id is deliberately not part of the key: an ETag names the bytes, and `If-Match`
    /// pins every fetch to it.
    pub fn new(object: &ObjectId, etag: &Arc<str>, index: u64, partition: Arc<str>) -> Self {
        Self {
            bucket: object.bucket.clone(),
            key: object.key.clone(),
            etag: etag.clone(),
            index,
            partition,
        }
    }
}

impl CacheKey for BlockId {
    /// Length-prefixed fields, so no choice of bucket, key or ETag can make two ids collide.
    fn disk_key(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + self.bucket.len() + self.key.len() + self.etag.len());
        out.extend_from_slice(b"s3b1");
        for part in [&self.bucket, &self.key, &self.etag] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out.extend_from_slice(&self.index.to_le_bytes());
        out
    }

    fn partition(&self) -> &str {
        &self.partition
    }
}

/// How a response's bytes are being found, for the `X-Cache` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheResult {
    /// Every block was in memory.
    HitMemory,
    /// Every block was in memory or on disk, at least one on disk.
    HitDisk,
    /// Some blocks were in memory, others fetched.
    Partial,
    /// No block was in memory; the first missing one was already being fetched by another request.
    Coalesced,
    /// No block was in memory.
    Miss,
}

impl CacheResult {
    /// The `X-Cache` header value, also used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheResult::HitMemory => "hit-memory",
            CacheResult::HitDisk => "hit-disk",
            CacheResult::Partial => "partial",
            CacheResult::Coalesced => "coalesced",
            CacheResult::Miss => "miss",
        }
    }
}

enum OpenBlock {
    Ready(Bytes),
    /// Just the slice's bytes, read from disk.
    Part(Bytes),
    Streaming(FlightReader<OriginError>, &'static str),
}

/// Blocks in memory, on disk, in flight, and the origin behind them.
pub struct BlockStore {
    layout: BlockLayout,
    cache: HybridCache<BlockId>,
    bucket_partitions: std::collections::HashMap<String, Arc<str>>,
    default_partition: Arc<str>,
    flights: SingleFlight<BlockId, OriginError>,
    origin: Arc<dyn Origin>,
    read_window: usize,
    idle_timeout: Duration,
    upstream_slots: Semaphore,
    metrics: Arc<Metrics>,
}

/// How a [`BlockStore`] reads and fetches.
#[derive(Clone)]
pub struct BlockStoreConfig {
    /// How objects are cut into blocks.
    pub layout: BlockLayout,
    /// Bytes of blocks the memory tier holds.
    pub memory_capacity: u64,
    /// Blocks a response opens ahead of the one it sends.
    pub read_window: usize,
    /// Longest wait for upstream body bytes.
    pub idle_timeout: Duration,
    /// Most block fetches upstream at once.
    pub upstream_concurrency: usize,
    /// The disk tier, if any.
    pub disk: Option<DiskCache>,
    /// When blocks are written to disk.
    pub write_policy: WritePolicy,
    /// Bucket → disk partition; other buckets use `default`.
    pub bucket_partitions: std::collections::HashMap<String, String>,
}

impl BlockStore {
    /// A store reading blocks of `origin` as `config` says.
    pub fn new(config: BlockStoreConfig, origin: Arc<dyn Origin>, metrics: Arc<Metrics>) -> Self {
        Self {
            layout: config.layout,
            cache: HybridCache::new(config.memory_capacity, config.disk, config.write_policy),
            bucket_partitions: config
                .bucket_partitions
                .into_iter()
                .map(|(b, p)| (b, Arc::from(p)))
                .collect(),
            default_partition: Arc::from("default"),
            flights: SingleFlight::new(),
            origin,
            read_window: config.read_window,
            idle_timeout: config.idle_timeout,
            upstream_slots: Semaphore::new(config.upstream_concurrency),
            metrics,
        }
    }

    /// The memory tier, for metrics.
    pub fn memory(&self) -> &MemoryTier<BlockId> {
        self.cache.memory()
    }

    /// The disk tier, if configured.
    pub fn disk(&self) -> Option<&DiskCache> {
        self.cache.disk()
    }

    fn id(&self, object: &ObjectId, etag: &Arc<str>, index: u64) -> BlockId {
        let partition = self
            .bucket_partitions
            .get(object.bucket.as_ref())
            .unwrap_or(&self.default_partition)
            .clone();
        BlockId::new(object, etag, index, partition)
    }

    /// Where the bytes `[start, end)` of `object` at `etag` would come from right now.
    pub fn classify(
        &self,
        object: &ObjectId,
        etag: &Arc<str>,
        range: Range<u64>,
        size: u64,
    ) -> CacheResult {
        let (mut in_memory, mut on_disk, mut missing) = (0usize, 0usize, 0usize);
        let mut first_missing_in_flight = None;
        for slice in self.layout.slices(range.start, range.end, size) {
            let id = self.id(object, etag, slice.index);
            match self.cache.locate(&id) {
                Some(Tier::Memory) => in_memory += 1,
                Some(_) => on_disk += 1,
                None => {
                    missing += 1;
                    first_missing_in_flight.get_or_insert_with(|| self.flights.contains(&id));
                }
            }
        }
        match (
            in_memory + on_disk,
            on_disk,
            missing,
            first_missing_in_flight,
        ) {
            (_, 0, 0, _) => CacheResult::HitMemory,
            (_, _, 0, _) => CacheResult::HitDisk,
            (0, _, _, Some(true)) => CacheResult::Coalesced,
            (0, _, _, _) => CacheResult::Miss,
            _ => CacheResult::Partial,
        }
    }

    /// The bytes `[start, end)` of `object` (of `size` bytes) at `etag`, as a stream. Up to
    /// `read_window` blocks ahead of the one being sent are opened (and fetched if missing).
    /// Dropping the stream stops opening blocks; fetches already started run to completion and
    /// fill the cache.
    pub fn read(
        self: &Arc<Self>,
        object: ObjectId,
        etag: Arc<str>,
        range: Range<u64>,
        size: u64,
    ) -> impl Stream<Item = Result<Bytes, OriginError>> + Send + 'static {
        let store = self.clone();
        let slices: Vec<BlockSlice> = self.layout.slices(range.start, range.end, size).collect();
        let bucket = object.bucket.clone();
        stream::iter(slices)
            .map(move |slice| {
                let (store, object, etag) = (store.clone(), object.clone(), etag.clone());
                async move { (slice, store.open(&object, &etag, slice).await) }
            })
            .buffered(self.read_window)
            .flat_map({
                let store = self.clone();
                move |(slice, open)| match open {
                    OpenBlock::Ready(bytes) => {
                        let part = bytes.slice(slice.from as usize..slice.to as usize);
                        store.whole_part("memory", &bucket, part)
                    }
                    OpenBlock::Part(part) => store.whole_part("disk", &bucket, part),
                    OpenBlock::Streaming(reader, tier) => {
                        let (metrics, bucket) = (store.metrics.clone(), bucket.clone());
                        slice_of(reader, slice.from, slice.to)
                            .inspect(move |r| {
                                if let Ok(b) = r {
                                    metrics.served(tier, Some(&bucket), b.len() as u64);
                                }
                            })
                            .boxed()
                    }
                }
            })
    }

    /// A part already in hand, as a one-item stream, counted as served from `tier`.
    fn whole_part(
        &self,
        tier: &'static str,
        bucket: &str,
        part: Bytes,
    ) -> stream::BoxStream<'static, Result<Bytes, OriginError>> {
        self.metrics.served(tier, Some(bucket), part.len() as u64);
        stream::once(futures::future::ready(Ok(part))).boxed()
    }

    async fn open(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        slice: BlockSlice,
    ) -> OpenBlock {
        let id = self.id(object, etag, slice.index);
        if let Some(bytes) = self.cache.memory().get(&id).await {
            self.metrics.lookup("memory", true);
            return OpenBlock::Ready(bytes);
        }
        self.metrics.lookup("memory", false);
        let on_disk = self.cache.locate(&id) == Some(Tier::Disk);
        if self.cache.disk().is_some() {
            self.metrics.lookup("disk", on_disk);
        }
        // A small slice of a block on disk (a Parquet footer, a column chunk index) reads only
        // the 64 KiB chunks it touches, instead of the whole block through a flight.
        if on_disk
            && (slice.to - slice.from) * SMALL_SLICE_DIVISOR <= slice.block_len
            && !self.flights.contains(&id)
        {
            if let Some((part, _)) = self.cache.get_range(&id, slice.from..slice.to).await {
                if part.len() as u64 == slice.to - slice.from {
                    return OpenBlock::Part(part);
                }
            }
        }
        match self.flights.join(id.clone()) {
            Joined::Follower(reader) => {
                self.metrics.coalesced();
                OpenBlock::Streaming(reader, "upstream")
            }
            Joined::Leader { mut writer, reader } => {
                // A flight may have completed between the memory lookup and the join.
                if let Some(bytes) = self.cache.memory().get(&id).await {
                    writer.push(bytes);
                    writer.finish();
                    return OpenBlock::Streaming(reader, "memory");
                }
                let tier = if on_disk { "disk" } else { "upstream" };
                // The read runs in a task of its own: a client that goes away does not cancel
                // it for the readers that joined, and the block still lands in the cache.
                let store = self.clone();
                let object = object.clone();
                let etag = etag.clone();
                let span = tracing::info_span!(
                    "block fetch",
                    larder.block = slice.index,
                    larder.source = tier
                );
                tokio::spawn(
                    async move { store.fetch(writer, id, object, etag, slice).await }
                        .instrument(span),
                );
                OpenBlock::Streaming(reader, tier)
            }
        }
    }

    async fn fetch(
        &self,
        mut writer: FlightWriter<BlockId, OriginError>,
        id: BlockId,
        object: ObjectId,
        etag: Arc<str>,
        slice: BlockSlice,
    ) {
        // Disk first: one read, verified, then promoted to memory. A disk miss (evicted since
        // `locate`, or failed verification) falls through to the origin.
        if let Some((bytes, tier)) = self.cache.get(&id).await {
            debug_assert_ne!(tier, Tier::Fetched);
            writer.push(bytes);
            writer.finish();
            return;
        }
        let range = slice.block_start..slice.block_start + slice.block_len;
        let result = self.fetch_into(&writer, &object, &etag, range).await;
        match result {
            Ok(()) => {
                let block = writer.finish();
                self.cache.insert(id, block).await;
                drop(writer);
            }
            Err(e) => {
                tracing::warn!(object = %object, block = slice.index, error = %e, "block fetch failed");
                // A changed or deleted object is the upstream answering correctly.
                if !matches!(e, OriginError::Changed) && !e.is_not_found() {
                    self.metrics.upstream_failed(&e);
                }
                self.metrics.cache_write_dropped("fetch_failed");
                writer.fail(e);
            }
        }
    }

    async fn fetch_into(
        &self,
        writer: &FlightWriter<BlockId, OriginError>,
        object: &ObjectId,
        etag: &str,
        range: Range<u64>,
    ) -> Result<(), OriginError> {
        let expected = range.end - range.start;
        // The permit is held until the body is complete: it bounds fetch buffers, not just requests.
        let _slot = self
            .upstream_slots
            .acquire()
            .await
            .map_err(|_| OriginError::Abandoned)?;
        let started = Instant::now();
        let got_body = self
            .origin
            .get(object, Some(etag), Some(range))
            .instrument(tracing::info_span!(
                "upstream",
                otel.name = "GetObject",
                otel.kind = "client"
            ))
            .await;
        let status = match &got_body {
            Ok(_) => UpstreamStatus::Http(206),
            Err(e) => e.into(),
        };
        self.metrics
            .upstream("GetObject", status, started.elapsed());
        let mut body = got_body?;
        let mut got = 0u64;
        loop {
            let next = tokio::time::timeout(self.idle_timeout, body.next())
                .await
                .map_err(|_| {
                    OriginError::Timeout(format!("no body bytes for {:?}", self.idle_timeout))
                })?;
            let Some(chunk) = next else { break };
            let chunk = chunk?;
            got += chunk.len() as u64;
            if got > expected {
                return Err(OriginError::BodyLength { got, expected });
            }
            self.metrics.upstream_received(chunk.len() as u64);
            writer.push(chunk);
        }
        if got != expected {
            return Err(OriginError::BodyLength { got, expected });
        }
        Ok(())
    }
}

/// The bytes `[from, to)` of a block arriving through `reader`. Stops reading (and drops the
/// reader) once `to` is reached.
fn slice_of(
    reader: FlightReader<OriginError>,
    from: u64,
    to: u64,
) -> impl Stream<Item = Result<Bytes, OriginError>> + Send {
    stream::unfold(Some((reader, 0u64)), move |state| async move {
        let (mut reader, mut pos) = state?;
        while pos < to {
            let chunk = match reader.next_chunk().await {
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => return Some((Err(e), None)),
                None => {
                    return Some((
                        Err(OriginError::BodyLength {
                            got: pos,
                            expected: to,
                        }),
                        None,
                    ))
                }
            };
            let (start, end) = (pos, pos + chunk.len() as u64);
            pos = end;
            if end <= from {
                continue;
            }
            let lo = from.saturating_sub(start) as usize;
            let hi = (to.min(end) - start) as usize;
            return Some((Ok(chunk.slice(lo..hi)), Some((reader, pos))));
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::origin::fake::FakeOrigin;
    use std::sync::atomic::Ordering;

    fn data(size: usize, seed: u8) -> Bytes {
        (0..size)
            .map(|i| (i % 251) as u8 ^ seed)
            .collect::<Vec<_>>()
            .into()
    }

    fn setup(
        size: usize,
        delay: Duration,
        upstream_concurrency: usize,
    ) -> (Arc<BlockStore>, Arc<FakeOrigin>, ObjectId, Arc<str>) {
        let origin = Arc::new(FakeOrigin::with_delay(delay));
        origin.put("k", data(size, 0), "\"e1\"");
        let config = BlockStoreConfig {
            layout: BlockLayout::new(4096),
            memory_capacity: 1 << 20,
            read_window: 4,
            idle_timeout: Duration::from_secs(5),
            upstream_concurrency,
            disk: None,
            write_policy: cache_core::WritePolicy::OnInsert,
            bucket_partitions: Default::default(),
        };
        let store = Arc::new(BlockStore::new(
            config,
            origin.clone(),
            Arc::new(Metrics::default()),
        ));
        let id = ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        };
        (store, origin, id, "\"e1\"".into())
    }

    async fn collect(
        s: impl Stream<Item = Result<Bytes, OriginError>>,
    ) -> Result<Vec<u8>, OriginError> {
        let mut out = Vec::new();
        futures::pin_mut!(s);
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c?);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn ranges_are_exact_and_blocks_fetched_once() {
        let (store, origin, id, etag) = setup(10_000, Duration::ZERO, 2);
        let want = data(10_000, 0);
        let size = 10_000;
        for (a, b) in [
            (0, 10_000),
            (4095, 4097),
            (0, 1),
            (9_999, 10_000),
            (5000, 9000),
            (100, 4096),
        ] {
            let got = collect(store.read(id.clone(), etag.clone(), a..b, size))
                .await
                .unwrap();
            assert_eq!(got, want[a as usize..b as usize], "range {a}..{b}");
        }
        assert_eq!(
            origin.gets.load(Ordering::SeqCst),
            3,
            "three blocks, one GET each"
        );
        assert_eq!(
            store.classify(&id, &etag, 0..10_000, size),
            CacheResult::HitMemory
        );
    }

    #[tokio::test]
    async fn concurrent_cold_readers_share_fetches() {
        let (store, origin, id, etag) = setup(20_000, Duration::from_millis(1), 2);
        let readers: Vec<_> = (0..32)
            .map(|_| {
                tokio::spawn(collect(store.read(
                    id.clone(),
                    etag.clone(),
                    0..20_000,
                    20_000,
                )))
            })
            .collect();
        for r in readers {
            assert_eq!(r.await.unwrap().unwrap(), data(20_000, 0));
        }
        assert_eq!(origin.gets.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn a_changed_object_fails_instead_of_mixing_versions() {
        let (store, _origin, id, _) = setup(10_000, Duration::ZERO, 2);
        let stale: Arc<str> = "\"old\"".into();
        let err = collect(store.read(id.clone(), stale.clone(), 0..10_000, 10_000))
            .await
            .unwrap_err();
        assert_eq!(err, OriginError::Changed);
        assert_eq!(
            store.classify(&id, &stale, 0..10_000, 10_000),
            CacheResult::Miss
        );
    }

    #[tokio::test]
    async fn a_reader_that_leaves_early_still_fills_the_cache() {
        let (store, origin, id, etag) = setup(4096, Duration::from_millis(1), 2);
        {
            let s = store.read(id.clone(), etag.clone(), 0..4096, 4096);
            futures::pin_mut!(s);
            s.next().await.unwrap().unwrap();
        }
        for _ in 0..200 {
            if store.classify(&id, &etag, 0..4096, 4096) == CacheResult::HitMemory {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            store.classify(&id, &etag, 0..4096, 4096),
            CacheResult::HitMemory
        );
        assert_eq!(origin.gets.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn upstream_fetches_never_exceed_the_cap() {
        let (store, origin, id, etag) = setup(16 * 4096, Duration::from_millis(1), 2);
        let readers: Vec<_> = (0..4u64)
            .map(|i| {
                tokio::spawn(collect(store.read(
                    id.clone(),
                    etag.clone(),
                    i * 4096..16 * 4096,
                    16 * 4096,
                )))
            })
            .collect();
        for r in readers {
            r.await.unwrap().unwrap();
        }
        assert_eq!(origin.gets.load(Ordering::SeqCst), 16);
        assert_eq!(origin.most_open_bodies.load(Ordering::SeqCst), 2);
    }
}

#[cfg(test)]
mod disk_tests {
    use super::*;
    use crate::origin::fake::FakeOrigin;
    use cache_core::disk::DiskConfig;

    async fn store_over(
        path: &std::path::Path,
        origin: Arc<FakeOrigin>,
    ) -> (Arc<BlockStore>, DiskCache) {
        let mut cfg = DiskConfig::new(path, 9 << 20);
        cfg.region_size = 1 << 20;
        let disk = DiskCache::open(cfg).await.expect("disk");
        let config = BlockStoreConfig {
            layout: BlockLayout::new(64 * 1024),
            memory_capacity: 1 << 20,
            read_window: 4,
            idle_timeout: Duration::from_secs(5),
            upstream_concurrency: 4,
            disk: Some(disk.clone()),
            write_policy: WritePolicy::OnInsert,
            bucket_partitions: Default::default(),
        };
        let store = BlockStore::new(config, origin, Arc::new(Metrics::default()));
        (Arc::new(store), disk)
    }

    #[tokio::test]
    async fn a_restarted_store_serves_from_disk_without_the_origin() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache");
        let origin = Arc::new(FakeOrigin::with_delay(Duration::ZERO));
        let body: Bytes = (0..300_000u32)
            .map(|i| (i % 241) as u8)
            .collect::<Vec<_>>()
            .into();
        origin.put("k", body.clone(), "\"e1\"");
        let id = ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        };
        let etag: Arc<str> = "\"e1\"".into();
        let (store, disk) = store_over(&path, origin.clone()).await;
        let got: Vec<Bytes> = store
            .read(id.clone(), etag.clone(), 0..300_000, 300_000)
            .map(|r| r.expect("read"))
            .collect()
            .await;
        assert_eq!(got.concat(), body.to_vec());
        let fetched = origin.gets.load(std::sync::atomic::Ordering::SeqCst);
        disk.close().await;
        drop((store, disk));

        let (store, _disk) = store_over(&path, origin.clone()).await;
        assert_eq!(
            store.classify(&id, &etag, 1000..250_000, 300_000),
            CacheResult::HitDisk
        );
        let got: Vec<Bytes> = store
            .read(id.clone(), etag.clone(), 1000..250_000, 300_000)
            .map(|r| r.expect("read"))
            .collect()
            .await;
        assert_eq!(got.concat(), body[1000..250_000].to_vec());
        assert_eq!(
            origin.gets.load(std::sync::atomic::Ordering::SeqCst),
            fetched,
            "no upstream GET after restart"
        );
        // Promoted: now every touched block is in memory.
        assert_eq!(
            store.classify(&id, &etag, 1000..250_000, 300_000),
            CacheResult::HitMemory
        );

        // A small range of a block only on disk reads just that range's chunk from disk.
        let before = store.disk().expect("disk").stats();
        let got: Vec<Bytes> = store
            .read(id.clone(), etag.clone(), 270_000..270_100, 300_000)
            .map(|r| r.expect("read"))
            .collect()
            .await;
        assert_eq!(got.concat(), body[270_000..270_100].to_vec());
        let after = store.disk().expect("disk").stats();
        assert_eq!(after.hits - before.hits, 1);
        assert_eq!(after.hit_bytes - before.hit_bytes, 100);
        assert_eq!(
            store.classify(&id, &etag, 270_000..270_100, 300_000),
            CacheResult::HitDisk,
            "a small range is not promoted"
        );
        assert_eq!(
            origin.gets.load(std::sync::atomic::Ordering::SeqCst),
            fetched
        );
    }
}
