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
    BlockLayout, BlockSlice, DiskCache, Fill, FlightReader, HybridCache, MemoryTier, Miss, Tier,
    WritePolicy,
};
use futures::future::{self, FutureExt};
use futures::stream::{self, Stream, StreamExt};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::cache_key::{BlockId, KeySchema};
use crate::fleet::client::PeerError;
use crate::fleet::Fleet;
use crate::model::{BodyStream, ByteRange, ObjectId, ObjectMeta, UpstreamError};
use crate::read::prefetch::{Detector, PrefetchConfig};
use crate::telemetry::labels::{
    Lookup, PrefetchBlock, PrefetchBytes, Rejected, Source, WriteDropped,
};
use crate::telemetry::metrics::Metrics;
use crate::upstream::Upstream;
use tracing::Instrument;

/// A slice at most this fraction of its block (1 MiB of an 8 MiB block) is read from disk by
/// range rather than as a whole block.
const SMALL_SLICE_DIVISOR: u64 = 8;

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
    /// No block was here; the first missing one is owned by another replica, which was asked.
    Peer,
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
            CacheResult::Peer => "peer",
        }
    }

    /// The `X-Cache` value when the object's metadata was served stale (the upstream failing).
    pub fn as_stale_str(self) -> &'static str {
        match self {
            CacheResult::HitMemory => "stale-hit-memory",
            CacheResult::HitDisk => "stale-hit-disk",
            CacheResult::Partial => "stale-partial",
            CacheResult::Coalesced => "stale-coalesced",
            CacheResult::Miss => "stale-miss",
            CacheResult::Peer => "stale-peer",
        }
    }
}

enum OpenBlock {
    Ready(Bytes),
    /// Just the slice's bytes, read from disk.
    Part(Bytes),
    Streaming(FlightReader<UpstreamError>, Source),
}

/// Blocks in memory, on disk, in flight, and the origin behind them.
pub struct BlockStore {
    /// The tiers, and the one fetch per missing block however many readers want it.
    cache: HybridCache<BlockId, UpstreamError>,
    keys: KeySchema,
    origin: Arc<dyn Upstream>,
    read_window: usize,
    /// Bytes (in KiB permits) of blocks all responses hold at once: the block each is sending
    /// and those opened ahead of it. Such blocks may have left the memory tier (or never been
    /// in it), so without this bound N responses could hold N × (read_window + 1) blocks.
    pinned: Arc<Semaphore>,
    pinned_total: u64,
    idle_timeout: Duration,
    upstream_slots: Semaphore,
    /// The same budget for fetches asked of another replica. Apart, because a replica serving a
    /// peer needs an upstream slot: were asks holding upstream slots, two busy replicas could
    /// each hold every slot waiting on the other, and both stall until the peer deadline.
    peer_slots: Semaphore,
    max_resumes: u32,
    prefetch: PrefetchConfig,
    sequences: Detector,
    prefetch_slots: Semaphore,
    /// Blocks read ahead and not yet read by anyone, with their size: read → used, evicted or
    /// expired → wasted.
    prefetched: moka::sync::Cache<BlockId, u64>,
    /// The other replicas, when this one is part of a fleet.
    fleet: Option<Arc<Fleet>>,
    metrics: Arc<Metrics>,
}

/// Why a block is being fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A client is reading it.
    Demand,
    /// Read-ahead: a client is expected to read it.
    Prefetch,
    /// A warm-up job: it goes to the disk tier, not into the hot memory set.
    Warm,
    /// Another replica, which found this one owns the block: fetched from here or the
    /// upstream, never from a third replica, so requests cannot chase each other around.
    Peer,
}

impl Purpose {
    /// Whether a block this replica does not own is asked of its owner.
    fn asks_owner(self) -> bool {
        self != Purpose::Peer
    }
}

/// Where a fetched block's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Supplier {
    /// S3 (at least some of them): the block is cached here as any fetched block is.
    Upstream,
    /// All from the replica owning it, which caches it: only a brief copy is kept here.
    Peer,
    /// Begun by a peer whose body broke, finished from S3. Served to the readers waiting, but
    /// never cached: the peer's part was never checked against S3's bytes.
    Mixed,
}

/// `bytes` in whole KiB, rounded up: the unit of the responses' buffer permits (a semaphore
/// counts at most `u32::MAX` per acquire).
fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024)
}

/// How a fetch starts.
enum FirstAttempt {
    /// With a body already arriving.
    Body(BodyStream, Supplier),
    /// By asking the block's owner.
    Owner(Arc<str>),
    /// By asking the upstream.
    Upstream,
}

/// What warming one block did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warmed {
    /// Fetched and written to the cold tier: this many bytes.
    Fetched(u64),
    /// Already on disk (or being fetched by someone else).
    AlreadyCached,
}

/// Most read-ahead blocks whose use is tracked (for the waste metric).
const PREFETCH_TRACKED: u64 = 65_536;

/// How a [`BlockStore`] reads and fetches.
#[derive(Clone)]
pub struct BlockStoreConfig {
    /// How objects are cut into blocks.
    pub layout: BlockLayout,
    /// Bytes of blocks the memory tier holds.
    pub memory_capacity: u64,
    /// Blocks a response opens ahead of the one it sends.
    pub read_window: usize,
    /// Most bytes of blocks all responses hold at once; a response whose next block would go
    /// over it waits. At least one block.
    pub response_buffer: u64,
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
    /// Times a broken upstream body is resumed before the fetch fails.
    pub max_resumes: u32,
    /// Read-ahead across requests.
    pub prefetch: PrefetchConfig,
    /// The fleet this replica is part of, if any.
    pub fleet: Option<Arc<Fleet>>,
}

#[cfg(test)]
impl BlockStoreConfig {
    /// Memory only, 4 KiB blocks, no read-ahead: what unit tests start from.
    pub(crate) fn for_tests() -> Self {
        Self {
            layout: BlockLayout::new(4096),
            memory_capacity: 1 << 20,
            read_window: 4,
            response_buffer: 64 << 20,
            idle_timeout: Duration::from_secs(5),
            upstream_concurrency: 4,
            disk: None,
            write_policy: WritePolicy::OnInsert,
            bucket_partitions: Default::default(),
            max_resumes: 3,
            prefetch: PrefetchConfig::off(),
            fleet: None,
        }
    }
}

impl BlockStore {
    /// A store reading blocks of `origin` as `config` says.
    pub fn new(config: BlockStoreConfig, origin: Arc<dyn Upstream>, metrics: Arc<Metrics>) -> Self {
        let block_size = config.layout.block_size();
        let pinned_kib = kib(config.response_buffer.max(block_size));
        Self {
            cache: HybridCache::new(config.memory_capacity, config.disk, config.write_policy),
            keys: KeySchema::new(config.layout, config.bucket_partitions),
            origin,
            read_window: config.read_window,
            pinned: Arc::new(Semaphore::new(pinned_kib as usize)),
            pinned_total: pinned_kib * 1024,
            idle_timeout: config.idle_timeout,
            upstream_slots: Semaphore::new(config.upstream_concurrency),
            peer_slots: Semaphore::new(config.upstream_concurrency),
            max_resumes: config.max_resumes,
            prefetch: config.prefetch,
            sequences: Detector::new(config.prefetch, block_size),
            prefetch_slots: Semaphore::new(config.prefetch.max_inflight.max(1)),
            prefetched: {
                let metrics = metrics.clone();
                moka::sync::Cache::builder()
                    .max_capacity(PREFETCH_TRACKED)
                    .time_to_live(config.prefetch.unused_after)
                    .eviction_listener(move |_, bytes, cause| {
                        if cause != moka::notification::RemovalCause::Explicit
                            && cause != moka::notification::RemovalCause::Replaced
                        {
                            metrics.prefetch_bytes(PrefetchBytes::Wasted, bytes);
                        }
                    })
                    .build()
            },
            fleet: config.fleet,
            metrics,
        }
    }

    /// A client read `range` of `object` (`size` bytes) at `etag`: fetch ahead of it if it is
    /// part of an in-order sequence. Read-ahead never waits for an upstream slot, so it never
    /// delays a demand fetch; when none is free it is skipped (and counted).
    pub fn read_ahead(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        range: Range<u64>,
        size: u64,
    ) {
        if !self.prefetch.enabled() || object.version_id.is_some() {
            return;
        }
        let blocks = self.sequences.observe(
            (object.bucket.clone(), object.key.clone(), etag.clone()),
            range,
            size,
        );
        self.prefetch(object, etag, blocks, size);
    }

    /// Fetch the blocks under `range` in the background, as read-ahead does: `range` was just
    /// read straight from the upstream (a cold suffix range), and is likely to be read again.
    pub fn fetch_behind(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        range: Range<u64>,
        size: u64,
    ) {
        if !self.prefetch.enabled() {
            return;
        }
        let blocks = self
            .keys
            .layout()
            .slices(range.start, range.end, size)
            .map(|s| s.index);
        self.prefetch(object, etag, blocks, size);
    }

    /// Fetch `blocks` in tasks of their own, only with an upstream slot free (never ahead of a
    /// demand fetch) and within the read-ahead budget; counted as read-ahead.
    fn prefetch(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        blocks: impl IntoIterator<Item = u64>,
        size: u64,
    ) {
        for index in blocks {
            let id = self.id(object, etag, index);
            if self.cache.locate(&id).is_some() || self.cache.in_flight(&id) || self.has_copy(&id)
            {
                continue;
            }
            let Some(slice) = self.keys.layout().block(index, size) else {
                continue;
            };
            let remote = self
                .remote_owner(object, index, Purpose::Prefetch)
                .is_some();
            let (store, object, etag) = (self.clone(), object.clone(), etag.clone());
            tokio::spawn(async move {
                let Ok(_budget) = store.prefetch_slots.try_acquire() else {
                    store.metrics.prefetch_blocks(PrefetchBlock::SkippedBudget);
                    return;
                };
                let Ok(slot) = store.slots(remote).try_acquire() else {
                    store.metrics.prefetch_blocks(PrefetchBlock::SkippedBusy);
                    return;
                };
                if let Miss::Fetch { fill, .. } = store.cache.join(id.clone()) {
                    store.metrics.prefetch_blocks(PrefetchBlock::Issued);
                    // Marked before the fetch, so a reader that joins it in flight counts as a use.
                    store.prefetched.insert(id, slice.block_len);
                    let fetch = (object, etag, slice);
                    store
                        .fetch(fill, fetch, Some(slot), None, Purpose::Prefetch)
                        .await;
                }
            });
        }
    }

    /// Bring block `index` of `object` (`size` bytes) at `etag` into the disk tier (or memory,
    /// without a disk tier), unless it is already there.
    pub async fn warm(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        index: u64,
        size: u64,
    ) -> Result<Warmed, UpstreamError> {
        let id = self.id(object, etag, index);
        let target = if self.cache.disk().is_some() {
            Tier::Disk
        } else {
            Tier::Memory
        };
        match self.cache.locate(&id) {
            Some(tier) if tier == target => return Ok(Warmed::AlreadyCached),
            // Hot in memory but not on disk: copy it down, no upstream request needed.
            Some(Tier::Memory) => {
                if let Some(bytes) = self.cache.memory().get(&id).await {
                    if !self.cache.insert_cold(id, bytes).await {
                        self.metrics.cache_write_dropped(WriteDropped::WarmRejected);
                    }
                    return Ok(Warmed::AlreadyCached);
                }
            }
            _ => {}
        }
        let Some(slice) = self.keys.layout().block(index, size) else {
            return Ok(Warmed::AlreadyCached);
        };
        match self.cache.join(id) {
            Miss::Joined(mut reader) => {
                // Someone is fetching it already: wait for them, so the job's progress is true.
                while let Some(chunk) = reader.next_chunk().await {
                    chunk?;
                }
                Ok(Warmed::AlreadyCached)
            }
            Miss::Fetch { fill, mut reader } => {
                let store = self.clone();
                let fetch = (object.clone(), etag.clone(), slice);
                tokio::spawn(async move {
                    store.fetch(fill, fetch, None, None, Purpose::Warm).await
                });
                let mut bytes = 0;
                while let Some(chunk) = reader.next_chunk().await {
                    bytes += chunk?.len() as u64;
                }
                Ok(Warmed::Fetched(bytes))
            }
        }
    }

    /// The layout blocks are cut by.
    pub fn layout(&self) -> &BlockLayout {
        self.keys.layout()
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
        self.keys.block(object, etag, index)
    }

    /// `bytes` found in a tier for `slice`'s block, if they are as long as that block must be.
    /// A block of another length is never served: it was cut by another geometry or arrived
    /// truncated, and is counted and treated as a miss.
    fn checked(&self, bytes: Bytes, slice: &BlockSlice) -> Option<Bytes> {
        if bytes.len() as u64 == slice.block_len {
            Some(bytes)
        } else {
            tracing::warn!(
                block = slice.index,
                expected = slice.block_len,
                found = bytes.len(),
                "a cached block has the wrong length; fetching it again"
            );
            self.metrics.block_rejected(Rejected::Length);
            None
        }
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
        let mut first_missing = None;
        for slice in self.keys.layout().slices(range.start, range.end, size) {
            let id = self.id(object, etag, slice.index);
            match self.cache.locate(&id) {
                Some(Tier::Memory) => in_memory += 1,
                Some(_) => on_disk += 1,
                None if self.has_copy(&id) => in_memory += 1,
                None => {
                    missing += 1;
                    first_missing.get_or_insert_with(|| {
                        let owned_elsewhere = self
                            .fleet
                            .as_ref()
                            .is_some_and(|f| f.owner(object, slice.index).is_some());
                        (self.cache.in_flight(&id), owned_elsewhere)
                    });
                }
            }
        }
        match (in_memory + on_disk, on_disk, missing, first_missing) {
            (_, 0, 0, _) => CacheResult::HitMemory,
            (_, _, 0, _) => CacheResult::HitDisk,
            (0, _, _, Some((true, _))) => CacheResult::Coalesced,
            (0, _, _, Some((_, true))) => CacheResult::Peer,
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
    ) -> impl Stream<Item = Result<Bytes, UpstreamError>> + Send + 'static {
        self.read_as(object, etag, range, size, Purpose::Demand)
    }

    /// [`BlockStore::read`] for another replica that found this one owns the blocks: what is
    /// missing here comes from the upstream, never from a third replica.
    pub fn read_for_peer(
        self: &Arc<Self>,
        object: ObjectId,
        etag: Arc<str>,
        range: Range<u64>,
        size: u64,
    ) -> impl Stream<Item = Result<Bytes, UpstreamError>> + Send + 'static {
        self.read_as(object, etag, range, size, Purpose::Peer)
    }

    fn read_as(
        self: &Arc<Self>,
        object: ObjectId,
        etag: Arc<str>,
        range: Range<u64>,
        size: u64,
        purpose: Purpose,
    ) -> impl Stream<Item = Result<Bytes, UpstreamError>> + Send + 'static {
        let store = self.clone();
        let slices: Vec<BlockSlice> = self
            .keys
            .layout()
            .slices(range.start, range.end, size)
            .collect();
        // Bytes read for a peer are counted where they reach a client, by the peer.
        let bucket = (purpose != Purpose::Peer).then(|| object.bucket.clone());
        stream::iter(slices)
            .map(move |slice| {
                let (store, object, etag) = (store.clone(), object.clone(), etag.clone());
                let mut open = Box::pin(async move {
                    // Room for the whole block first, in order: `buffered` polls the window's
                    // opens in order and the semaphore is fair, so a response's next block is
                    // always ahead of its later ones.
                    let permit = store.pin(slice.block_len).await?;
                    let opened = store.open(&object, &etag, slice, purpose).await;
                    Ok::<_, UpstreamError>((slice, opened, permit))
                });
                // A block at hand (the usual hit) is opened right here. One that has to wait
                // goes on in a task of its own: `flat_map` polls this stream only between
                // blocks, so a paused open would otherwise wait for the block before it to be
                // sent, and the window would fetch one block at a time.
                match (&mut open).now_or_never() {
                    Some(opened) => future::Either::Left(future::ready(Ok(opened))),
                    None => future::Either::Right(tokio::spawn(open)),
                }
            })
            .buffered(self.read_window)
            .flat_map({
                let store = self.clone();
                move |opened| match opened {
                    Err(_) | Ok(Err(_)) => {
                        stream::once(future::ready(Err(UpstreamError::Abandoned))).boxed()
                    }
                    // The room is given back when the block's slice has been sent.
                    Ok(Ok((slice, open, permit))) => store
                        .send(bucket.as_deref(), slice, open)
                        .inspect(move |_| {
                            let _held = &permit;
                        })
                        .boxed(),
                }
            })
    }

    /// Room for a block of `len` bytes in the responses' buffer, waiting (and counting the
    /// wait) if it is full.
    async fn pin(&self, len: u64) -> Result<tokio::sync::OwnedSemaphorePermit, UpstreamError> {
        let permits = u32::try_from(kib(len)).unwrap_or(u32::MAX);
        if let Ok(permit) = self.pinned.clone().try_acquire_many_owned(permits) {
            return Ok(permit);
        }
        self.metrics.response_buffer_wait();
        self.pinned
            .clone()
            .acquire_many_owned(permits)
            .await
            .map_err(|_| UpstreamError::Abandoned)
    }

    /// Bytes of blocks responses hold now, and the most they may.
    pub fn response_buffer(&self) -> (u64, u64) {
        let total = self.pinned_total;
        let free = self.pinned.available_permits() as u64 * 1024;
        (total.saturating_sub(free), total)
    }

    /// The stream of one opened block's slice, counted as served from its tier to a client of
    /// `bucket` (`None`: not a client, not counted).
    fn send(
        &self,
        bucket: Option<&str>,
        slice: BlockSlice,
        open: OpenBlock,
    ) -> stream::BoxStream<'static, Result<Bytes, UpstreamError>> {
        match open {
            OpenBlock::Ready(bytes) => {
                let part = bytes.slice(slice.from as usize..slice.to as usize);
                self.whole_part(Source::Memory, bucket, part)
            }
            OpenBlock::Part(part) => self.whole_part(Source::Disk, bucket, part),
            OpenBlock::Streaming(reader, tier) => {
                let (metrics, bucket) = (self.metrics.clone(), bucket.map(str::to_owned));
                slice_of(reader, slice.from, slice.to)
                    .inspect(move |r| {
                        if let (Ok(b), Some(bucket)) = (r, &bucket) {
                            metrics.served(tier, Some(bucket), b.len() as u64);
                        }
                    })
                    .boxed()
            }
        }
    }

    /// A part already in hand, as a one-item stream, counted as served from `tier` (if to a
    /// client of `bucket`).
    fn whole_part(
        &self,
        tier: Source,
        bucket: Option<&str>,
        part: Bytes,
    ) -> stream::BoxStream<'static, Result<Bytes, UpstreamError>> {
        if let Some(bucket) = bucket {
            self.metrics.served(tier, Some(bucket), part.len() as u64);
        }
        stream::once(futures::future::ready(Ok(part))).boxed()
    }

    async fn open(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        slice: BlockSlice,
        purpose: Purpose,
    ) -> OpenBlock {
        let id = self.id(object, etag, slice.index);
        if self.prefetch.enabled() {
            if let Some(bytes) = self.prefetched.remove(&id) {
                self.metrics.prefetch_bytes(PrefetchBytes::Used, bytes);
            }
        }
        let in_memory = self.cache.memory().get(&id).await;
        if let Some(bytes) = in_memory.and_then(|b| self.checked(b, &slice)) {
            self.metrics.lookup(Lookup::Memory, true);
            return OpenBlock::Ready(bytes);
        }
        self.metrics.lookup(Lookup::Memory, false);
        if let Some(fleet) = &self.fleet {
            let copy = fleet.copy(&id).await;
            if let Some(bytes) = copy.and_then(|b| self.checked(b, &slice)) {
                self.metrics.lookup(Lookup::PeerCopy, true);
                return OpenBlock::Ready(bytes);
            }
            if fleet.keeps_copies() {
                self.metrics.lookup(Lookup::PeerCopy, false);
            }
        }
        let on_disk = self.cache.locate(&id) == Some(Tier::Disk);
        if self.cache.disk().is_some() {
            self.metrics.lookup(Lookup::Disk, on_disk);
        }
        // A small slice of a block on disk (a Parquet footer, a column chunk index) reads only
        // the 64 KiB chunks it touches, instead of the whole block through a flight.
        if on_disk
            && (slice.to - slice.from) * SMALL_SLICE_DIVISOR <= slice.block_len
            && !self.cache.in_flight(&id)
        {
            if let Some((part, _)) = self.cache.get_range(&id, slice.from..slice.to).await {
                if part.len() as u64 == slice.to - slice.from {
                    return OpenBlock::Part(part);
                }
            }
        }
        match self.cache.join(id.clone()) {
            Miss::Joined(reader) => {
                self.metrics.coalesced();
                OpenBlock::Streaming(reader, Source::Upstream)
            }
            Miss::Fetch { fill, reader } => {
                // A fetch may have completed between the memory lookup and the join.
                let in_memory = self.cache.memory().get(&id).await;
                if let Some(bytes) = in_memory.and_then(|b| self.checked(b, &slice)) {
                    fill.push(bytes);
                    fill.deliver();
                    return OpenBlock::Streaming(reader, Source::Memory);
                }
                let tier = match (on_disk, self.remote_owner(object, slice.index, purpose)) {
                    (true, _) => Source::Disk,
                    (false, Some(_)) => Source::Peer,
                    (false, None) => Source::Upstream,
                };
                // The read runs in a task of its own: a client that goes away does not cancel
                // it for the readers that joined, and the block still lands in the cache.
                let store = self.clone();
                let object = object.clone();
                let etag = etag.clone();
                let span = tracing::info_span!(
                    "block fetch",
                    larder.block = slice.index,
                    larder.source = tier.as_str()
                );
                tokio::spawn(
                    async move {
                        let fetch = (object, etag, slice);
                        store.fetch(fill, fetch, None, None, purpose).await
                    }
                    .instrument(span),
                );
                OpenBlock::Streaming(reader, tier)
            }
        }
    }

    /// The disk tier's note that blocks of `object` were cached: a tiny entry under a block
    /// index no object reaches, with no ETag.
    fn marker(&self, object: &ObjectId) -> BlockId {
        self.id(object, &Arc::from(""), u64::MAX)
    }

    /// Whether the disk tier notes that blocks of `object` were cached. After a restart the
    /// metadata is gone but the disk tier is not: such an object is revalidated with a HEAD
    /// (its blocks are likely still there) rather than opened with a block GET.
    pub fn known_on_disk(&self, object: &ObjectId) -> bool {
        self.cache.disk().is_some() && self.cache.locate(&self.marker(object)).is_some()
    }

    async fn remember(&self, object: &ObjectId) {
        if self.cache.disk().is_none() {
            return;
        }
        let marker = self.marker(object);
        if self.cache.locate(&marker).is_none() {
            // Best effort, like any disk write: a dropped note only costs a block GET later.
            self.cache
                .insert_cold(marker, Bytes::from_static(b"1"))
                .await;
        }
    }

    /// The last `len` bytes of an object nothing is known of, and its metadata, from one GET
    /// (`Range: bytes=-len`): a Parquet reader's first request. The body goes to the client as
    /// it arrives, counted like a block fetch's; `Ok(None)` when the answer cannot stand for a
    /// HEAD.
    pub async fn open_tail(
        &self,
        object: &ObjectId,
        len: u64,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        let Some((meta, body)) = self.get_cold(object, ByteRange::Suffix(len)).await? else {
            return Ok(None);
        };
        let (metrics, bucket) = (self.metrics.clone(), object.bucket.clone());
        let body = body
            .inspect(move |chunk| {
                if let Ok(b) = chunk {
                    metrics.upstream_received(b.len() as u64);
                    metrics.served(Source::Upstream, Some(&bucket), b.len() as u64);
                }
            })
            .boxed();
        Ok(Some((meta, body)))
    }

    /// A GET that also brings metadata ([`Upstream::get_with_meta`]).
    async fn get_cold(
        &self,
        object: &ObjectId,
        span: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        self.origin.get_with_meta(object, span).await
    }

    /// Metadata of an object nothing is known of, from a GET of its block `index` whose body
    /// then fills that block, saving the HEAD round trip; in a fleet, from the replica owning
    /// that block, which does the same (once for everyone asking). With the metadata comes how
    /// long ago the upstream said it. `Ok(None)` when the answer cannot stand for a HEAD (see
    /// [`Upstream::get_with_meta`]). The fetch runs in a task of its own, like any block fetch,
    /// so the block lands even if the caller goes away.
    pub async fn open_cold(
        self: &Arc<Self>,
        object: ObjectId,
        index: u64,
    ) -> Result<Option<(ObjectMeta, Duration)>, UpstreamError> {
        self.open_cold_as(object, index, Purpose::Demand).await
    }

    /// [`BlockStore::open_cold`] for another replica: never asks a third one.
    pub async fn open_cold_for_peer(
        self: &Arc<Self>,
        object: ObjectId,
        index: u64,
    ) -> Result<Option<(ObjectMeta, Duration)>, UpstreamError> {
        self.open_cold_as(object, index, Purpose::Peer).await
    }

    async fn open_cold_as(
        self: &Arc<Self>,
        object: ObjectId,
        index: u64,
        purpose: Purpose,
    ) -> Result<Option<(ObjectMeta, Duration)>, UpstreamError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let store = self.clone();
        let span = tracing::info_span!(
            "block fetch",
            larder.block = index,
            larder.source = "upstream"
        );
        tokio::spawn(
            async move { store.fetch_cold(object, index, purpose, tx).await }.instrument(span),
        );
        rx.await.unwrap_or(Err(UpstreamError::Abandoned))
    }

    async fn fetch_cold(
        &self,
        object: ObjectId,
        index: u64,
        purpose: Purpose,
        tx: tokio::sync::oneshot::Sender<Result<Option<(ObjectMeta, Duration)>, UpstreamError>>,
    ) {
        let owner = self.remote_owner(&object, index, purpose);
        let Ok(slot) = self.slots(owner.is_some()).acquire().await else {
            let _ = tx.send(Err(UpstreamError::Abandoned));
            return;
        };
        let at_owner = match owner {
            Some(peer) => self.open_at_owner(&peer, &object, index).await,
            None => None,
        };
        let result = match at_owner {
            Some(opened) => {
                opened.map(|o| o.map(|(meta, age, body)| (meta, age, body, Supplier::Peer)))
            }
            None => {
                let block_size = self.keys.layout().block_size();
                let start = index.saturating_mul(block_size);
                let span = ByteRange::bytes(start..start.saturating_add(block_size));
                self.get_cold(&object, span)
                    .await
                    .map(|o| o.map(|(meta, body)| (meta, Duration::ZERO, body, Supplier::Upstream)))
            }
        };
        let (meta, age, body, supplier) = match result {
            Ok(Some(found)) => found,
            Ok(None) => {
                let _ = tx.send(Ok(None));
                return;
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        let etag: Arc<str> = meta.etag.as_str().into();
        let Some(slice) = self.keys.layout().block(index, meta.size) else {
            let _ = tx.send(Ok(None));
            return;
        };
        let id = self.id(&object, &etag, index);
        // A block cached under this ETag (metadata forgotten for space, or a restart with the
        // disk tier kept) is served from there: this body is dropped, having cost one request.
        if self.cache.locate(&id).is_some() {
            let _ = tx.send(Ok(Some((meta, age))));
            return;
        }
        // Joined before the metadata is handed over, so the reader finds this fetch in flight
        // instead of starting its own.
        let fill = match self.cache.join(id) {
            Miss::Fetch { fill, .. } => Some(fill),
            Miss::Joined(_) => None,
        };
        let _ = tx.send(Ok(Some((meta, age))));
        if let Some(fill) = fill {
            let fetch = (object, etag, slice);
            self.fetch(fill, fetch, Some(slot), Some((body, supplier)), purpose)
                .await;
        }
    }

    /// The fetch budget for a block asked of its owner (`remote`) or of the upstream. A fetch
    /// that falls back from its owner to the upstream keeps the slot it has: memory stays within
    /// both budgets together.
    fn slots(&self, remote: bool) -> &Semaphore {
        if remote {
            &self.peer_slots
        } else {
            &self.upstream_slots
        }
    }

    /// Whether a copy of a peer's block is kept here (in memory, apart from the memory tier).
    fn has_copy(&self, id: &BlockId) -> bool {
        self.fleet.as_ref().is_some_and(|f| f.has_copy(id))
    }

    /// The replica owning block `index` of `object`, when it is not this one and `purpose`
    /// may ask it.
    fn remote_owner(&self, object: &ObjectId, index: u64, purpose: Purpose) -> Option<Arc<str>> {
        if !purpose.asks_owner() {
            return None;
        }
        self.fleet.as_ref()?.owner(object, index)
    }

    /// A call to a peer, traced and counted; a peer that fails is counted as a fallback.
    async fn ask_peer<T>(
        &self,
        kind: &'static str,
        call: impl std::future::Future<Output = Result<T, PeerError>>,
    ) -> Result<T, PeerError> {
        let started = Instant::now();
        let result = call
            .instrument(tracing::info_span!(
                "peer",
                otel.name = kind,
                otel.kind = "client"
            ))
            .await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(PeerError::Answer(_)) => "answer",
            Err(PeerError::Unavailable { reason, message }) => {
                tracing::info!(kind, reason, %message, "peer unavailable; asking the upstream");
                self.metrics.peer_fallback(reason);
                "unavailable"
            }
        };
        self.metrics
            .peer_request("made", kind, outcome, Some(started.elapsed()));
        result
    }

    /// Metadata and block `index` of `object` from `peer`, its owner; `None` when the peer
    /// could not be used (the caller asks the upstream).
    async fn open_at_owner(
        &self,
        peer: &str,
        object: &ObjectId,
        index: u64,
    ) -> Option<Result<Option<crate::fleet::client::Opened>, UpstreamError>> {
        let fleet = self.fleet.as_ref()?;
        match self
            .ask_peer("open", fleet.client().open(peer, object, index))
            .await
        {
            Ok(opened) => Some(Ok(opened)),
            Err(PeerError::Answer(e)) => Some(Err(e)),
            Err(PeerError::Unavailable { .. }) => None,
        }
    }

    /// Fetch block `slice` of `object` at `etag` into `fill`, from the disk tier, the block's
    /// owner or the upstream, and end it as `purpose` says: cached here, cold, or (a peer's
    /// block) only kept as a brief copy.
    async fn fetch(
        &self,
        fill: Fill<BlockId, UpstreamError>,
        (object, etag, slice): (ObjectId, Arc<str>, BlockSlice),
        slot: Option<SemaphorePermit<'_>>,
        body: Option<(BodyStream, Supplier)>,
        purpose: Purpose,
    ) {
        // Disk first: one read, verified, then promoted to memory. A disk miss (evicted since
        // `locate`, or failed verification) falls through to the origin. Warming skips it: it
        // only fetches what the disk does not hold, and must not promote into memory. A body
        // already arriving (a cold open) was checked against the tiers before it came here.
        if purpose != Purpose::Warm && body.is_none() {
            let found = self.cache.get(fill.key()).await.map(|(bytes, _)| bytes);
            if let Some(bytes) = found.and_then(|b| self.checked(b, &slice)) {
                fill.push(bytes);
                fill.deliver();
                return;
            }
        }
        let first = match body {
            Some((body, supplier)) => FirstAttempt::Body(body, supplier),
            None => match self.remote_owner(&object, slice.index, purpose) {
                Some(peer) => FirstAttempt::Owner(peer),
                None => FirstAttempt::Upstream,
            },
        };
        let result = self
            .fetch_into(&fill, &object, &etag, slice, slot, first)
            .await;
        match result {
            // The owner caches it; here only a brief copy for the next local reader (and none
            // for a warm-up, whose point is the owner's disk).
            Ok(Supplier::Peer) => {
                let id = fill.key().clone();
                let block = fill.deliver();
                if let (Some(fleet), false) = (&self.fleet, purpose == Purpose::Warm) {
                    fleet.keep_copy(id, block).await;
                }
            }
            Ok(Supplier::Mixed) => {
                fill.deliver();
                self.metrics.cache_write_dropped(WriteDropped::MixedSource);
            }
            Ok(Supplier::Upstream) => {
                match purpose {
                    Purpose::Demand | Purpose::Prefetch | Purpose::Peer => {
                        fill.commit().await;
                    }
                    Purpose::Warm => {
                        if !fill.commit_cold().await {
                            self.metrics.cache_write_dropped(WriteDropped::WarmRejected);
                        }
                    }
                }
                self.remember(&object).await;
            }
            Err(e) => {
                tracing::warn!(object = %object, block = slice.index, error = %e, "block fetch failed");
                // A changed or deleted object is the upstream answering correctly.
                if !matches!(e, UpstreamError::Changed) && !e.is_not_found() {
                    self.metrics.upstream_failed(&e);
                }
                self.metrics.cache_write_dropped(WriteDropped::FetchFailed);
                if purpose == Purpose::Prefetch {
                    self.prefetched.invalidate(fill.key());
                }
                fill.fail(e);
            }
        }
    }

    /// Fetch `range` of `object` at `etag` into `writer`, starting as `first` says. A body that
    /// breaks or stalls is resumed from the byte where it stopped, with a new ranged GET pinned
    /// to the same ETag (`If-Match`), up to `max_resumes` times: the readers see one
    /// uninterrupted stream, and a changed object fails the resume rather than mixing versions.
    /// A peer that fails, before its first byte or after, is replaced by the upstream from the
    /// byte where it stopped (a fallback, not a resume). Says who supplied the bytes.
    async fn fetch_into(
        &self,
        fill: &Fill<BlockId, UpstreamError>,
        object: &ObjectId,
        etag: &str,
        slice: BlockSlice,
        slot: Option<SemaphorePermit<'_>>,
        first: FirstAttempt,
    ) -> Result<Supplier, UpstreamError> {
        let range = slice.block_start..slice.block_start + slice.block_len;
        let expected = range.end - range.start;
        // The permit is held until the body is complete: it bounds fetch buffers, not just requests.
        let _slot = match slot {
            Some(slot) => slot,
            None => self
                .slots(matches!(first, FirstAttempt::Owner(_)))
                .acquire()
                .await
                .map_err(|_| UpstreamError::Abandoned)?,
        };
        let mut first = Some(first);
        let mut supplied = Supplier::Peer;
        let mut got = 0u64;
        let mut from_peer = 0u64;
        let mut resumes = 0;
        loop {
            let (attempt, supplier) = match first.take() {
                Some(FirstAttempt::Body(body, supplier)) => (Ok(body), supplier),
                Some(FirstAttempt::Owner(peer)) => {
                    match self.ask_owner(&peer, object, etag, &slice).await {
                        Ok(body) => (Ok(body), Supplier::Peer),
                        Err(PeerError::Answer(e)) => return Err(e),
                        Err(PeerError::Unavailable { .. }) => (
                            self.origin
                                .get(object, Some(etag), Some(range.clone()))
                                .await,
                            Supplier::Upstream,
                        ),
                    }
                }
                Some(FirstAttempt::Upstream) | None => (
                    self.origin
                        .get(object, Some(etag), Some(range.start + got..range.end))
                        .await,
                    Supplier::Upstream,
                ),
            };
            if supplier == Supplier::Upstream {
                supplied = Supplier::Upstream;
            }
            let failure = match attempt {
                Ok(mut body) => loop {
                    let next = match tokio::time::timeout(self.idle_timeout, body.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            break UpstreamError::Timeout(format!(
                                "no body bytes for {:?}",
                                self.idle_timeout
                            ))
                        }
                    };
                    match next {
                        Some(Ok(chunk)) => {
                            got += chunk.len() as u64;
                            if got > expected {
                                return Err(UpstreamError::BodyLength { got, expected });
                            }
                            match supplier {
                                Supplier::Upstream => {
                                    self.metrics.upstream_received(chunk.len() as u64)
                                }
                                Supplier::Peer | Supplier::Mixed => {
                                    from_peer += chunk.len() as u64;
                                    self.metrics.peer_bytes("received", chunk.len() as u64)
                                }
                            }
                            fill.push(chunk);
                        }
                        // Every byte arrived: a connection that breaks after them loses nothing.
                        Some(Err(_)) | None if got == expected => {
                            return Ok(match supplied {
                                Supplier::Upstream if from_peer > 0 => Supplier::Mixed,
                                other => other,
                            })
                        }
                        Some(Err(e)) => break e,
                        None => break UpstreamError::BodyLength { got, expected },
                    }
                },
                Err(e) => e,
            };
            if supplier == Supplier::Peer {
                // Whatever broke the peer's body, the upstream takes over where it stopped.
                tracing::info!(object = %object, at = range.start + got, error = %failure, "peer body broke; the upstream takes over");
                self.metrics.peer_fallback("broken");
                continue;
            }
            // Only a body that started and broke is resumed; a request that failed outright was
            // already retried by the client library.
            let resumable = got > 0 && failure.is_resumable();
            if !resumable || resumes >= self.max_resumes {
                return Err(failure);
            }
            resumes += 1;
            self.metrics.resumed();
            tracing::info!(object = %object, at = range.start + got, error = %failure, "resuming a broken upstream body");
        }
    }

    /// `slice`'s whole block of `object` at `etag` from `peer`, the block's owner.
    async fn ask_owner(
        &self,
        peer: &str,
        object: &ObjectId,
        etag: &str,
        slice: &BlockSlice,
    ) -> Result<BodyStream, PeerError> {
        let Some(fleet) = &self.fleet else {
            return Err(PeerError::Unavailable {
                reason: "error",
                message: "not in a fleet".into(),
            });
        };
        let range = slice.block_start..slice.block_start + slice.block_len;
        let asked = fleet
            .client()
            .block(peer, object, etag, range, slice.object_size);
        self.ask_peer("block", asked).await
    }
}

/// The bytes `[from, to)` of a block arriving through `reader`. Stops reading (and drops the
/// reader) once `to` is reached.
fn slice_of(
    reader: FlightReader<UpstreamError>,
    from: u64,
    to: u64,
) -> impl Stream<Item = Result<Bytes, UpstreamError>> + Send {
    stream::unfold(Some((reader, 0u64)), move |state| async move {
        let (mut reader, mut pos) = state?;
        while pos < to {
            let chunk = match reader.next_chunk().await {
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => return Some((Err(e), None)),
                None => {
                    return Some((
                        Err(UpstreamError::BodyLength {
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
    use crate::upstream::fake::FakeUpstream;
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
    ) -> (Arc<BlockStore>, Arc<FakeUpstream>, ObjectId, Arc<str>) {
        setup_with(size, delay, upstream_concurrency, |_| {})
    }

    fn setup_with(
        size: usize,
        delay: Duration,
        upstream_concurrency: usize,
        tweak: impl FnOnce(&mut BlockStoreConfig),
    ) -> (Arc<BlockStore>, Arc<FakeUpstream>, ObjectId, Arc<str>) {
        let origin = Arc::new(FakeUpstream::with_delay(delay));
        origin.put("k", data(size, 0), "\"e1\"");
        let mut config = BlockStoreConfig {
            upstream_concurrency,
            ..BlockStoreConfig::for_tests()
        };
        tweak(&mut config);
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
        s: impl Stream<Item = Result<Bytes, UpstreamError>>,
    ) -> Result<Vec<u8>, UpstreamError> {
        let mut out = Vec::new();
        futures::pin_mut!(s);
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c?);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn a_broken_body_is_resumed_where_it_broke() {
        let (store, origin, id, etag) = setup(10_000, Duration::ZERO, 4);
        origin.break_at.store(2500, Ordering::SeqCst);
        origin.breaks_left.store(2, Ordering::SeqCst);
        // One block of 4096 bytes: breaks at 2500, resumes, breaks again 2500 bytes later (past
        // the block's end, so not at all), and the bytes are exact.
        let got = collect(store.read(id.clone(), etag.clone(), 0..4096, 10_000))
            .await
            .unwrap();
        assert_eq!(got, &data(10_000, 0)[..4096]);
        assert_eq!(origin.gets.load(Ordering::SeqCst), 2);
        assert_eq!(
            store
                .metrics
                .snapshot()
                .sum("larder_upstream_resumes_total", &[]),
            1.0
        );
        // Resumes are bounded: a body that keeps breaking fails the read.
        origin.break_at.store(100, Ordering::SeqCst);
        origin.breaks_left.store(100, Ordering::SeqCst);
        let err = collect(store.read(id, etag, 4096..8192, 10_000)).await;
        assert!(matches!(err, Err(UpstreamError::Transport(_))), "{err:?}");
        assert_eq!(origin.gets.load(Ordering::SeqCst), 2 + 4, "1 + 3 resumes");
    }

    #[tokio::test]
    async fn in_order_ranged_reads_are_read_ahead_and_waste_is_counted() {
        let unused_after = Duration::from_millis(300);
        let (store, origin, id, etag) = setup_with(64 * 4096, Duration::ZERO, 8, |c| {
            c.prefetch = PrefetchConfig {
                enabled: true,
                min_window: 2,
                max_window: 4,
                max_inflight: 8,
                unused_after,
            }
        });
        let size = 64 * 4096;
        let mut hits = 0;
        for i in 0..8u64 {
            let range = i * 4096..(i + 1) * 4096;
            // Give the read-ahead of the reads before a generous while to land: waited for, not
            // slept on, so a loaded machine neither fails this nor lets a broken read-ahead pass
            // (it would never land, and the block below would be a miss).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while i >= 2
                && store.classify(&id, &etag, range.clone(), size) != CacheResult::HitMemory
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            if store.classify(&id, &etag, range.clone(), size) == CacheResult::HitMemory {
                hits += 1;
            }
            store.read_ahead(&id, &etag, range.clone(), size);
            let got = collect(store.read(id.clone(), etag.clone(), range.clone(), size))
                .await
                .unwrap();
            assert_eq!(
                got,
                &data(size as usize, 0)[range.start as usize..range.end as usize]
            );
        }
        // Reads 0 and 1 establish the sequence; from read 2 on, each block was already there.
        assert_eq!(hits, 6);
        // Let the last read-ahead land (every fetch it issued finished), then count.
        let issued = || {
            store
                .metrics
                .snapshot()
                .sum("larder_prefetch_blocks_total", &[("outcome", "issued")])
        };
        // Yield first (a sleep runs every task already spawned, on this single-threaded
        // runtime), then check: the last read's read-ahead tasks may not have started yet.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let settled = store.cache.fetches() == 0
                && store.prefetch_slots.available_permits() == 8
                && origin.gets.load(Ordering::SeqCst) as f64 == 2.0 + issued();
            if settled || tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        let s = store.metrics.snapshot();
        let issued = issued();
        assert!(issued >= 7.0, "{issued}");
        // Every block was fetched once: read-ahead replaced demand fetches, it did not add any
        // but the ones ahead of the last read.
        assert_eq!(origin.gets.load(Ordering::SeqCst) as f64, 2.0 + issued);
        assert_eq!(
            s.sum("larder_prefetch_bytes_total", &[("outcome", "used")]),
            6.0 * 4096.0
        );
        // The blocks read ahead of the last read were never read: once unread for
        // `unused_after`, exactly they are counted as wasted.
        assert_eq!(
            s.sum("larder_prefetch_bytes_total", &[("outcome", "wasted")]),
            0.0
        );
        let unread = (issued - 6.0) * 4096.0;
        assert!(unread > 0.0);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let wasted = loop {
            store.prefetched.run_pending_tasks();
            let wasted = store
                .metrics
                .snapshot()
                .sum("larder_prefetch_bytes_total", &[("outcome", "wasted")]);
            if wasted >= unread || tokio::time::Instant::now() >= deadline {
                break wasted;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(wasted, unread);
    }

    #[tokio::test]
    async fn responses_together_hold_no_more_than_the_response_buffer() {
        let size = 10 * 4096;
        let (store, _origin, id, etag) = setup_with(size, Duration::ZERO, 8, |c| {
            c.response_buffer = 2 * 4096;
        });
        let size = size as u64;
        // A reader that takes one chunk and stops reading: its window fills the buffer.
        let mut stalled = Box::pin(store.read(id.clone(), etag.clone(), 0..size, size));
        let mut got = stalled.next().await.unwrap().unwrap().to_vec();
        tokio::time::timeout(Duration::from_secs(5), async {
            while store.response_buffer().0 < 2 * 4096 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the stalled reader's window holds the buffer");
        assert_eq!(store.response_buffer(), (2 * 4096, 2 * 4096));
        // A second reader waits for room rather than holding more...
        let other = tokio::spawn(collect(store.read(id.clone(), etag.clone(), 0..size, size)));
        tokio::time::timeout(Duration::from_secs(5), async {
            while store
                .metrics
                .snapshot()
                .sum("larder_response_buffer_waits_total", &[])
                < 1.0
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the second reader waited");
        assert!(!other.is_finished());
        assert!(store.response_buffer().0 <= 2 * 4096);
        // ...and both finish, exact, once the first reads on.
        while let Some(chunk) = stalled.next().await {
            got.extend_from_slice(&chunk.unwrap());
        }
        assert!(got == data(size as usize, 0), "the first reader's bytes");
        let other = other.await.unwrap().unwrap();
        assert!(other == data(size as usize, 0), "the second reader's bytes");
        assert_eq!(store.response_buffer().0, 0, "all room given back");
    }

    #[tokio::test]
    async fn warming_fetches_only_what_is_missing() {
        let (store, origin, id, etag) = setup(3 * 4096, Duration::ZERO, 4);
        assert_eq!(
            store.warm(&id, &etag, 0, 3 * 4096).await.unwrap(),
            Warmed::Fetched(4096)
        );
        assert_eq!(
            store.warm(&id, &etag, 0, 3 * 4096).await.unwrap(),
            Warmed::AlreadyCached
        );
        assert_eq!(
            store.warm(&id, &etag, 2, 3 * 4096).await.unwrap(),
            Warmed::Fetched(4096)
        );
        assert_eq!(origin.gets.load(Ordering::SeqCst), 2);
        // Without a disk tier the warmed blocks are in memory: a read needs no upstream.
        let got = collect(store.read(id, etag, 0..4096, 3 * 4096))
            .await
            .unwrap();
        assert_eq!(got, &data(3 * 4096, 0)[..4096]);
        assert_eq!(origin.gets.load(Ordering::SeqCst), 2);
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
        assert_eq!(err, UpstreamError::Changed);
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
    async fn one_reader_fetches_its_window_of_blocks_at_once() {
        // 16 blocks of 4 chunks each, 5 ms per chunk: one at a time would take 320 ms.
        let (store, origin, id, etag) = setup(16 * 4096, Duration::from_millis(5), 8);
        let body = collect(store.read(id, etag, 0..16 * 4096, 16 * 4096)).await;
        assert_eq!(body.unwrap(), data(16 * 4096, 0).to_vec());
        assert_eq!(origin.gets.load(Ordering::SeqCst), 16);
        // The window is 4 blocks: the block being sent and the ones opened ahead of it.
        assert!(origin.most_open_bodies.load(Ordering::SeqCst) >= 3);
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
    use crate::upstream::fake::FakeUpstream;
    use cache_core::disk::DiskConfig;

    async fn store_over(
        path: &std::path::Path,
        origin: Arc<FakeUpstream>,
    ) -> (Arc<BlockStore>, DiskCache) {
        let mut cfg = DiskConfig::new(path, 9 << 20);
        cfg.region_size = 1 << 20;
        let disk = DiskCache::open(cfg).await.expect("disk");
        let config = BlockStoreConfig {
            layout: BlockLayout::new(64 * 1024),
            disk: Some(disk.clone()),
            ..BlockStoreConfig::for_tests()
        };
        let store = BlockStore::new(config, origin, Arc::new(Metrics::default()));
        (Arc::new(store), disk)
    }

    #[tokio::test]
    async fn a_restarted_store_serves_from_disk_without_the_origin() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache");
        let origin = Arc::new(FakeUpstream::with_delay(Duration::ZERO));
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
