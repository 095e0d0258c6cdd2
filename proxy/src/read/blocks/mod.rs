//! Block-aligned reads: a byte range of an object is served from fixed-size blocks, each found
//! in the memory tier or fetched from the origin once, however many readers want it.
//!
//! A block is cached under (bucket, key, ETag, index), and every upstream fetch carries
//! `If-Match: <ETag>`, so a block can only ever hold bytes of the version its key names: one
//! response never mixes two versions of an object.
//!
//! The store is one type, [`BlockStore`], whose methods live where their concern does:
//! - this file: the store, and a response's read of a byte range: each block from memory, the
//!   fleet's brief copies, disk, or a fetch joined through the cache's single-flight;
//! - `classify`: where a range's bytes would come from now (`X-Cache`);
//! - `fetch`: one block's fetch: from disk, its owner in the fleet, or the upstream,
//!   resumed where it broke, and where the bytes then go;
//! - `cold`: the first read of an object nothing is known of, whose GET brings its metadata;
//! - `part`: range-first: a cold range much smaller than its block fetched exactly;
//! - `ahead`: read-ahead and warm-up, fetches nobody is waiting for yet.
//! - `slots`: the upstream fetch budget, in which a response's first block goes before the
//!   blocks responses open ahead;
//! - `reading`: which blocks responses are reading now, so that a block fetched for one reader
//!   and wanted by others behind it counts as read again.

use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cache_core::{
    BlockLayout, BlockSlice, DiskCache, FlightReader, HybridCache, MemoryTier, Miss, Tier,
    WritePolicy,
};
use futures::future::{self, FutureExt};
use futures::stream::{self, Stream, StreamExt};
use tokio::sync::{oneshot, watch, Semaphore};

use crate::cache_key::{BlockId, KeySchema};
use crate::fleet::Fleet;
use crate::model::{ObjectId, UpstreamError};
use crate::read::prefetch::{Detector, PrefetchConfig};
use crate::telemetry::labels::{Lookup, PrefetchBytes, Rejected, Source};
use crate::telemetry::metrics::Metrics;
use crate::upstream::Upstream;
use slots::{Slot, Slots, Turn};
use tracing::Instrument;

mod ahead;
mod classify;
mod cold;
mod fetch;
mod gain;
mod pace;
mod part;
mod reading;
mod slots;
mod split;
#[cfg(test)]
mod tests;

use ahead::Prefetched;
pub use ahead::Warmed;
pub use classify::{CacheResult, Found};

/// A read's bytes in one buffer ([`BlockStore::read_in_one`]), holding their room in the
/// responses' buffer until dropped.
pub struct InMemory {
    /// The bytes asked.
    pub bytes: Bytes,
    _room: Slot,
}

/// A slice at most this fraction of its block (1 MiB of an 8 MiB block) is read from disk by
/// range rather than as a whole block.
const SMALL_SLICE_DIVISOR: u64 = 8;

enum OpenBlock {
    Ready(Bytes),
    /// Just the slice's bytes, read from disk.
    Part(Bytes),
    Streaming(FlightReader<UpstreamError>, Source),
}

/// What a slice is read from.
enum Opening {
    /// Its block, opened.
    Block(OpenBlock),
    /// A part of its own (key, and the part as a block): the block is nowhere here and would
    /// bring much more than the bytes asked.
    Part(BlockId, BlockSlice),
    /// The tail of its block from the slice's first byte, opened (`split`), and the slice of
    /// it to send.
    Tail(BlockSlice, OpenBlock),
}

/// Blocks in memory, on disk, in flight, and the origin behind them.
pub struct BlockStore {
    /// The tiers, and the one fetch per missing block however many readers want it.
    cache: HybridCache<BlockId, UpstreamError>,
    keys: KeySchema,
    origin: Arc<dyn Upstream>,
    read_window: usize,
    /// Bytes (in KiB units) of blocks all responses hold at once: the block each is sending
    /// and those opened ahead of it. Such blocks may have left the memory tier (or never been
    /// in it), so without this bound N responses could hold N × (read_window + 1) blocks. The
    /// block a response starts with goes first here too, and blocks past a response's next
    /// take only room to spare ([`slots`]).
    pinned: Slots,
    pinned_total: u64,
    idle_timeout: Duration,
    /// The fetch budget (`upstream_concurrency`), in which the blocks responses start with go
    /// first and an eighth is kept for them ([`slots`]).
    upstream_slots: Slots,
    /// The same budget for fetches asked of another replica. Apart, because a replica serving a
    /// peer needs an upstream slot: were asks holding upstream slots, two busy replicas could
    /// each hold every slot waiting on the other, and both stall until the peer deadline.
    peer_slots: Slots,
    prefetch: PrefetchConfig,
    sequences: Detector,
    prefetch_slots: Semaphore,
    /// Blocks read ahead and not yet read by anyone.
    prefetched: Prefetched,
    /// Whether a cold range much smaller than its block is fetched exactly (`part`).
    exact_ranges: bool,
    /// Distinct parts of a block fetched before the block is fetched whole (0: never).
    complete_block_after: u32,
    /// Blocks parts of which were fetched recently, with the parts' spans: each different
    /// one counts toward `complete_block_after`, the same one fetched again does not.
    parts_fetched: moka::sync::Cache<BlockId, Arc<[std::ops::Range<u64>]>>,
    /// Blocks pieces of which were fetched, with the pieces' spans (`part`): a block read
    /// whole whose pieces tile it is assembled from them.
    pieces: moka::sync::Cache<BlockId, Arc<[std::ops::Range<u64>]>>,
    /// The other replicas, when this one is part of a fleet.
    fleet: Option<Arc<Fleet>>,
    /// Blocks being read from the disk tier now: one alone is streamed in pieces.
    disk_reads: AtomicUsize,
    /// How far a cold read's first GET runs past its first block.
    pace: pace::Pace,
    /// Which blocks responses of more than one block are reading now: a block another of
    /// them will read too is committed as read again.
    reading: Arc<reading::Reading>,
    metrics: Arc<Metrics>,
}

/// How a client's read cuts an object, which decides what a slice of a block nothing here
/// holds is fetched and cached as (`part`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Ranges of any offset and length: a slice much shorter than its block is a piece of its
    /// own, found again by a read of that span, and pieces of one block read one after
    /// another predict the block (`complete_block_after`).
    Ranges,
    /// The parts of a multipart upload (`partNumber`): read again as the same spans, so every
    /// slice short of its block is a piece of its own, and no block is completed from its
    /// pieces. Two parts that share a block then cost the upstream their own bytes, once,
    /// rather than theirs and the block's (docs/benchmarks.md).
    Parts,
}

/// Why a block is being fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A client is reading it: first in its response, or opened ahead of the block the
    /// response sends ([`Turn`]), as its read cuts the object ([`Cut`]).
    Demand(Turn, Cut),
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

    /// Whether a client is reading the block now.
    fn demand(self) -> bool {
        matches!(self, Purpose::Demand(..))
    }

    /// How the read the block is for cuts the object: by ranges unless a client reads parts.
    fn cut(self) -> Cut {
        match self {
            Purpose::Demand(_, cut) => cut,
            Purpose::Prefetch | Purpose::Warm | Purpose::Peer => Cut::Ranges,
        }
    }

    /// Where in the fetch budget the block waits for a slot: read-ahead and warm-up go behind
    /// the blocks readers wait for first; a peer's block may be its reader's first.
    fn turn(self) -> Turn {
        match self {
            Purpose::Demand(turn, _) => turn,
            Purpose::Prefetch | Purpose::Warm => Turn::Ahead,
            Purpose::Peer => Turn::First,
        }
    }
}

/// `bytes` in whole KiB, rounded up: the unit the responses' buffer counts in.
fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024)
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
    /// Longest wait for the next bytes of a peer's body (the upstream's are timed by its
    /// resume layer).
    pub idle_timeout: Duration,
    /// Most block fetches upstream at once.
    pub upstream_concurrency: usize,
    /// The disk tier, if any.
    pub disk: Option<DiskCache>,
    /// When blocks are written to disk.
    pub write_policy: WritePolicy,
    /// Bucket → disk partition; other buckets use `default`.
    pub bucket_partitions: std::collections::HashMap<String, String>,
    /// Read-ahead across requests.
    pub prefetch: PrefetchConfig,
    /// Whether a cold range whose block would bring more than 1.5 times its bytes is fetched
    /// exactly (range-first) instead of as the whole block.
    pub exact_ranges: bool,
    /// Parts of one block fetched (within `prefetch.unused_after`) after which the whole block
    /// is fetched behind the reader, as read-ahead; 0 never.
    pub complete_block_after: u32,
    /// The fleet this replica is part of, if any.
    pub fleet: Option<Arc<Fleet>>,
}

impl BlockStoreConfig {
    /// Memory only, 4 KiB blocks, no read-ahead, whole blocks for every range: what tests
    /// start from.
    pub fn for_tests() -> Self {
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
            prefetch: PrefetchConfig::off(),
            exact_ranges: false,
            complete_block_after: 2,
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
            pinned: Slots::new(pinned_kib as usize),
            pinned_total: pinned_kib * 1024,
            idle_timeout: config.idle_timeout,
            upstream_slots: Slots::new(config.upstream_concurrency),
            peer_slots: Slots::new(config.upstream_concurrency),
            prefetch: config.prefetch,
            sequences: Detector::new(config.prefetch, block_size),
            prefetch_slots: Semaphore::new(config.prefetch.max_inflight.max(1)),
            prefetched: Prefetched::new(
                PREFETCH_TRACKED,
                config.prefetch.unused_after,
                metrics.clone(),
            ),
            exact_ranges: config.exact_ranges,
            complete_block_after: config.complete_block_after,
            parts_fetched: moka::sync::Cache::builder()
                .max_capacity(part::PARTS_REMEMBERED)
                .weigher(|_, spans: &Arc<[std::ops::Range<u64>]>| spans.len() as u32)
                .time_to_live(config.prefetch.unused_after)
                .build(),
            pieces: moka::sync::Cache::builder()
                .max_capacity(part::PIECES_NOTED_IN_ALL)
                .weigher(|_, spans: &Arc<[std::ops::Range<u64>]>| spans.len() as u32)
                .build(),
            fleet: config.fleet,
            disk_reads: AtomicUsize::new(0),
            pace: Default::default(),
            reading: Default::default(),
            metrics,
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

    /// Wait, at most `within`, for the fetches running now (blocks and parts, read-ahead's
    /// included) to land; whether they all did. A fetch of a large block hands its readers the
    /// last bytes before it caches the block, so a read can end a moment before the cache holds
    /// it: a shutdown (and tests) wait here before they look.
    pub async fn settled(&self, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.cache.fetches() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        true
    }

    /// Write the blocks only memory holds down to disk, for at most `within` (at shutdown,
    /// with writes on evict, the default); the number written.
    pub async fn spill(&self, within: std::time::Duration) -> usize {
        self.cache.spill(within).await
    }

    fn id(&self, object: &ObjectId, etag: &Arc<str>, index: u64) -> BlockId {
        self.keys.block(object, etag, index)
    }

    /// `bytes` found in a tier for `slice`'s block, if they are as long as that block must be.
    /// A block of another length is never served: it was cut by another geometry or arrived
    /// truncated, and is counted and treated as a miss.
    fn checked(&self, bytes: Bytes, slice: &BlockSlice) -> Option<Bytes> {
        self.fits(bytes.len() as u64, slice).then_some(bytes)
    }

    /// Whether a cached value of `len` bytes can be `slice`'s block (see [`Self::checked`]).
    fn fits(&self, len: u64, slice: &BlockSlice) -> bool {
        if len == slice.block_len {
            return true;
        }
        tracing::warn!(
            block = slice.index,
            expected = slice.block_len,
            found = len,
            "a cached block has the wrong length; fetching it again"
        );
        self.metrics.block_rejected(Rejected::Length);
        false
    }

    /// The bytes `[start, end)` of `object` (of `size` bytes) at `etag`, as a stream. Up to
    /// `read_window` blocks ahead of the one being sent are opened (and fetched if missing):
    /// the next one always, those past it while the responses' buffer has room to spare.
    /// Dropping the stream stops opening blocks; fetches already started run to completion and
    /// fill the cache.
    pub fn read(
        self: &Arc<Self>,
        object: ObjectId,
        etag: Arc<str>,
        range: Range<u64>,
        size: u64,
    ) -> impl Stream<Item = Result<Bytes, UpstreamError>> + Send + 'static {
        self.read_by(object, etag, range, size, Cut::Ranges)
    }

    /// [`BlockStore::read`] of bytes a client's read cuts as `cut` (a part's, or a range's).
    pub fn read_by(
        self: &Arc<Self>,
        object: ObjectId,
        etag: Arc<str>,
        range: Range<u64>,
        size: u64,
        cut: Cut,
    ) -> impl Stream<Item = Result<Bytes, UpstreamError>> + Send + 'static {
        self.read_as(object, etag, range, size, Purpose::Demand(Turn::First, cut))
    }

    /// The bytes `[start, end)` of `object` (of `size` bytes) when they lie in one block that
    /// memory holds, or that the disk holds and a read of it takes in one read
    /// ([`BlockStore::read_on_disk`]): nearly every hit of an object up to a block long, and
    /// every range inside one block. `found` is what `classify` said (`HitMemory` or
    /// `HitDisk`, with the block's key, which names the ETag; anything else is `None`). The
    /// bytes hold the room their block takes in the responses' buffer until they are sent,
    /// and are counted as [`BlockStore::read`] counts them. `None`, with nothing counted,
    /// otherwise: then [`BlockStore::read`]. That stream of blocks opened ahead, and the
    /// wrappers around it, were 8 of a 4 KiB hit's 53 allocations (docs/benchmarks.md, "Small
    /// hits in one buffer").
    pub async fn read_in_one(
        &self,
        object: &ObjectId,
        range: Range<u64>,
        size: u64,
        found: Found,
    ) -> Option<InMemory> {
        let mut slices = self.keys.layout().slices(range.start, range.end, size);
        let (slice, None, Some(id)) = (slices.next()?, slices.next(), found.block) else {
            return None;
        };
        let (found, fetched_here) = (found.result, found.fetched_here);
        match found {
            CacheResult::HitMemory => {}
            // A block the disk gives only through its flight is `read`'s, looked up once.
            CacheResult::HitDisk if in_one_disk_read(&slice) => {}
            _ => return None,
        }
        // Looked up in memory either way, as `read` does: the lookup counts in the memory
        // tier's admission of the block (TinyLFU), which promoting it from disk relies on.
        let memory = self.cache.memory();
        let in_memory = if fetched_here {
            memory.get_fetched(&id).await
        } else {
            memory.get(&id).await
        };
        let (bytes, room, source) = match in_memory {
            Some(bytes) => {
                // A block of another length is `read`'s to count and refuse (`checked`).
                if bytes.len() as u64 != slice.block_len {
                    return None;
                }
                self.metrics.lookup(Lookup::Memory, true);
                let room = self.pin(slice.block_len, Turn::First).await;
                let part = bytes.slice(slice.from as usize..slice.to as usize);
                (part, room, Source::Memory)
            }
            None if found == CacheResult::HitDisk => {
                // The room first, as `read` takes it: the read makes a buffer of its own.
                let room = self.pin(slice.block_len, Turn::First).await;
                let part = self.read_on_disk(&id, &slice).await?;
                self.metrics.lookup(Lookup::Memory, false);
                self.metrics.lookup(Lookup::Disk, true);
                (part, room, Source::Disk)
            }
            None => return None,
        };
        self.prefetch_used(&id);
        self.metrics
            .served(source, Some(&*object.bucket), bytes.len() as u64);
        Some(InMemory { bytes, _room: room })
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
        let last = slices.len().saturating_sub(1);
        // Told when the block before has its room in the responses' buffer.
        let mut room_before: Option<oneshot::Receiver<()>> = None;
        // The block the response is sending (its place in `slices`): blocks further ahead
        // that found no room to spare wait to be the next one. A response of one or two
        // blocks (every small hit) has none, and no channel.
        let (sending, sending_now) = if slices.len() > 2 {
            let (tx, rx) = watch::channel(0usize);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        // Held as long as the response's stream: the blocks it covers are read by it.
        let entered = match (slices.first(), slices.last()) {
            (Some(first), Some(last)) if first.index != last.index => Some(self.reading.enter(
                &object,
                &etag,
                first.index..last.index + 1,
            )),
            _ => None,
        };
        stream::iter(slices)
            .enumerate()
            .map(move |(i, slice)| {
                let (store, object, etag) = (store.clone(), object.clone(), etag.clone());
                let mut sending_now = sending_now.clone();
                // The response's reader waits for its first block; the others are opened
                // ahead, and wait behind other readers' first blocks for an upstream slot.
                let purpose = match purpose {
                    Purpose::Demand(_, cut) if i > 0 => Purpose::Demand(Turn::Ahead, cut),
                    purpose => purpose,
                };
                let before = room_before.take();
                let has_room = (i < last).then(|| {
                    let (tx, rx) = oneshot::channel();
                    room_before = Some(rx);
                    tx
                });
                let mut open = Box::pin(async move {
                    // Room for the whole block first, in order: a block asks only once the
                    // one before has its room. A block the response would send later must
                    // never hold room its next block waits for: it is given back only when
                    // sent, after that one. First blocks go before blocks ahead in the
                    // buffer, so without this a response's second block could get room
                    // before its first.
                    if let Some(before) = before {
                        let _ = before.await;
                    }
                    let Some(permit) = store
                        .room(i, slice.block_len, purpose.turn(), sending_now.as_mut())
                        .await
                    else {
                        return Err(UpstreamError::Abandoned);
                    };
                    if let Some(has_room) = has_room {
                        let _ = has_room.send(());
                    }
                    let (slice, opened) = store.open(&object, &etag, slice, purpose).await;
                    Ok::<_, UpstreamError>((i, slice, opened, permit))
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
                    Ok(Ok((i, slice, open, permit))) => {
                        let _reading = &entered;
                        if let Some(sending) = &sending {
                            sending.send_replace(i);
                        }
                        store
                            .send(bucket.as_deref(), slice, open)
                            .inspect(move |_| {
                                let _held = &permit;
                            })
                            .boxed()
                    }
                }
            })
    }

    /// Room in the responses' buffer for block `i` of a response (of `len` bytes, taking
    /// `turn`), whose response is sending the block `sending` says (responses of three blocks
    /// or more have one); `None` if the response is gone. The first two take their turn in
    /// the queue. A block further ahead is held only in room the buffer can spare, and waits
    /// for that until it is the next. Without that, readers that take their bytes slowly (a
    /// training job's data loader, a query engine that parses as it reads) held the block
    /// they sent and `read_window` more each for as long as they took to read them: a few
    /// filled the buffer, and every other response's next block queued behind theirs
    /// (docs/benchmarks.md, "Slow readers").
    async fn room(
        &self,
        i: usize,
        len: u64,
        turn: Turn,
        sending: Option<&mut watch::Receiver<usize>>,
    ) -> Option<Slot> {
        if let Some(sending) = sending.filter(|_| i > 1) {
            // A block that is already the next takes its turn in the queue.
            tokio::select! {
                biased;
                is_next = sending.wait_for(|&s| s + 1 >= i) => {
                    is_next.ok()?;
                }
                spare = self.pinned.acquire_spare(kib(len) as usize) => return Some(spare),
            }
        }
        Some(self.pin(len, turn).await)
    }

    /// Room for a block of `len` bytes in the responses' buffer, for a block taking `turn`,
    /// waiting (and counting the wait) if there is none.
    async fn pin(&self, len: u64, turn: Turn) -> Slot {
        let units = kib(len) as usize;
        if let Some(slot) = self.pinned.try_acquire_units(turn, units) {
            return slot;
        }
        self.metrics.response_buffer_wait();
        self.pinned.acquire_units(turn, units).await
    }

    /// What parallel GETs gain from the upstream, once measured (`gain`).
    pub fn parallel_gain(&self) -> Option<f64> {
        self.pace.gain.gain()
    }

    /// Bytes of blocks responses hold now, and the most they may.
    pub fn response_buffer(&self) -> (u64, u64) {
        let total = self.pinned_total;
        let free = self.pinned.available() as u64 * 1024;
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

    /// Open `slice`'s block, or the part of it the slice is fetched as: what to send, and the
    /// slice of what was opened to send it from.
    async fn open(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        slice: BlockSlice,
        purpose: Purpose,
    ) -> (BlockSlice, OpenBlock) {
        match self.open_block(object, etag, slice, purpose).await {
            Opening::Block(block) => (slice, block),
            Opening::Part(id, part) => {
                (part, self.open_part(object, etag, id, part, purpose).await)
            }
            Opening::Tail(tail, opened) => (tail, opened),
        }
    }

    /// Count block `id` as read, if read-ahead fetched it.
    fn prefetch_used(&self, id: &BlockId) {
        if self.prefetch.enabled() {
            if let Some(bytes) = self.prefetched.take(id) {
                self.metrics.prefetch_bytes(PrefetchBytes::Used, bytes);
            }
        }
    }

    /// `slice` of block `id`, which the disk holds, read here when a read of it takes one
    /// read; `None` when it goes through the block's flight instead (being fetched, or large),
    /// or the read failed (the flight then reads the disk again, or the upstream).
    /// - A small slice of a block (a Parquet footer, a column chunk index) reads only the 64
    ///   KiB chunks it touches, instead of the whole block through a flight, not promoted.
    /// - A small block is read and verified whole, in one read, and promoted as its fetch
    ///   would have: for a block this small, a task and a flight cost more than the read
    ///   (docs/benchmarks.md, "Small disk hits"). Readers that race read it each, from the
    ///   page cache as a rule; a block being fetched is joined instead.
    async fn read_on_disk(&self, id: &BlockId, slice: &BlockSlice) -> Option<Bytes> {
        if self.cache.in_flight(id) {
            return None;
        }
        if small_slice(slice) {
            if let Some(part) = self.cache.range_on_disk(id, slice.from..slice.to).await {
                if part.len() as u64 == slice.to - slice.from {
                    return Some(part);
                }
            }
        }
        if slice.block_len > fetch::STREAMED_FROM {
            return None;
        }
        let block = self.cache.promote(id).await?;
        let block = self.checked(block, slice)?;
        Some(block.slice(slice.from as usize..slice.to as usize))
    }

    /// Open `slice`'s block from a tier or its fetch, or say which part to open instead.
    async fn open_block(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        slice: BlockSlice,
        purpose: Purpose,
    ) -> Opening {
        let id = self.id(object, etag, slice.index);
        self.prefetch_used(&id);
        let in_memory = self.cache.memory().get(&id).await;
        if let Some(bytes) = in_memory.and_then(|b| self.checked(b, &slice)) {
            self.metrics.lookup(Lookup::Memory, true);
            return Opening::Block(OpenBlock::Ready(bytes));
        }
        self.metrics.lookup(Lookup::Memory, false);
        if let Some(fleet) = &self.fleet {
            let copy = fleet.copy(&id).await;
            if let Some(bytes) = copy.and_then(|b| self.checked(b, &slice)) {
                self.metrics.lookup(Lookup::PeerCopy, true);
                return Opening::Block(OpenBlock::Ready(bytes));
            }
            if fleet.keeps_copies() {
                self.metrics.lookup(Lookup::PeerCopy, false);
            }
        }
        let on_disk = self.cache.locate(&id) == Some(Tier::Disk);
        if self.cache.disk().is_some() {
            self.metrics.lookup(Lookup::Disk, on_disk);
        }
        if on_disk {
            if let Some(part) = self.read_on_disk(&id, &slice).await {
                return Opening::Block(OpenBlock::Part(part));
            }
        }
        // Nowhere here and not being fetched: a slice much smaller than its block is read as
        // a part of its own (range-first), which an earlier read may have cached.
        if let Some((id, part)) = self.part_instead(object, etag, &id, &slice, purpose) {
            return Opening::Part(id, part);
        }
        // Nowhere here either, but most of the block from inside it: the block is fetched
        // tail first, the reader reading the tail.
        if !on_disk
            && self.tail_first(object, &slice, purpose)
            && !self.has_copy(&id)
            && self.tiling_pieces(object, etag, &id, &slice).is_none()
        {
            if let Some(opening) = self.open_tail_first(object, etag, &id, &slice) {
                return opening;
            }
        }
        match self.cache.join(id.clone()) {
            Miss::Joined(reader) => {
                self.metrics.coalesced();
                Opening::Block(OpenBlock::Streaming(reader, Source::Upstream))
            }
            Miss::Fetch { fill, reader } => {
                // A fetch may have completed between the memory lookup and the join.
                let in_memory = self.cache.memory().get(&id).await;
                if let Some(bytes) = in_memory.and_then(|b| self.checked(b, &slice)) {
                    fill.push(bytes);
                    fill.deliver();
                    return Opening::Block(OpenBlock::Streaming(reader, Source::Memory));
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
                Opening::Block(OpenBlock::Streaming(reader, tier))
            }
        }
    }
}

/// Whether `slice` is at most 1/[`SMALL_SLICE_DIVISOR`] of its block: read from disk by range.
fn small_slice(slice: &BlockSlice) -> bool {
    (slice.to - slice.from) * SMALL_SLICE_DIVISOR <= slice.block_len
}

/// Whether a read of `slice` from disk takes one read ([`BlockStore::read_on_disk`]): a
/// small slice's chunks, or a whole small block.
fn in_one_disk_read(slice: &BlockSlice) -> bool {
    small_slice(slice) || slice.block_len <= fetch::STREAMED_FROM
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
