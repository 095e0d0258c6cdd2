//! One block's fetch: from the disk tier, from the replica that owns it, or from the
//! upstream pinned to its ETag; a body that breaks is resumed from the byte where it stopped,
//! a peer that fails is replaced by the upstream. How it ends decides where the block goes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cache_core::{BlockSlice, Fill};
use futures::stream::StreamExt;

use crate::cache_key::BlockId;
use crate::fleet::client::PeerError;
use crate::model::{BodyStream, ObjectId, UpstreamError};
use crate::telemetry::labels::{Lookup, WriteDropped};
use tracing::Instrument;

use super::slots::{Slot, Slots};
use super::{BlockStore, Purpose};

/// Where a fetched block's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Supplier {
    /// S3 (at least some of them): the block is cached here as any fetched block is.
    Upstream,
    /// All from the replica owning it, which caches it: only a brief copy is kept here.
    Peer,
    /// Begun by a peer or the disk whose body broke, finished from S3. Served to the readers
    /// waiting, but never cached: a peer's part was never checked against S3's bytes (the
    /// disk's was, but a block that failed on disk is rare enough to simply fetch again).
    Mixed,
}

/// Blocks up to this size are read from disk whole: streaming them in pieces measured no
/// faster and cost a third more CPU (the copy into one buffer for memory).
pub(super) const STREAMED_FROM: u64 = 1 << 20;

/// Blocks from this size on are cached (and joined, if not assembled) only after their readers
/// had the chunk that completed them ([`readers_first`]).
const READERS_FIRST_FROM: u64 = 1 << 20;

/// Let the readers the last chunk of a `len`-byte block woke take it before the block is cached
/// (and, where it was not assembled as it came, joined into one buffer: a copy of all of it,
/// milliseconds for 8 MiB, which held the last bytes of every cold read back before blocks were
/// assembled: docs/benchmarks.md). Woken from the fetch's task, they wait in this worker's slot
/// for the next task, which no other worker may take, until this task yields. Smaller blocks
/// are cached at once: the block is then cached before its first reader can ask for it again.
async fn readers_first(len: u64) {
    if len >= READERS_FIRST_FROM {
        tokio::task::yield_now().await;
    }
}

/// What the local tiers gave a fetch.
enum Local {
    /// The whole block, streamed from disk: promote it to memory.
    Served,
    /// The whole block, already in memory (or put there by the read).
    InMemory,
    /// The disk gave this many bytes, verified, then failed.
    StoppedAt(u64),
    /// Neither tier holds it.
    Absent,
}

/// A disk read in progress, counted while it lives.
struct DiskRead<'a> {
    count: &'a AtomicUsize,
    /// No other disk read was running when this one started.
    alone: bool,
}

impl<'a> DiskRead<'a> {
    fn start(count: &'a AtomicUsize) -> Self {
        let before = count.fetch_add(1, Ordering::AcqRel);
        Self {
            count,
            alone: before == 0,
        }
    }
}

impl Drop for DiskRead<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a fetch starts.
pub(super) enum FirstAttempt {
    /// With a body already arriving.
    Body(BodyStream, Supplier),
    /// By asking the block's owner.
    Owner(Arc<str>),
    /// By asking the upstream.
    Upstream,
    /// By asking the upstream for the rest of the block from this byte of it: the disk gave
    /// the bytes before it, verified, then failed.
    UpstreamFrom(u64),
}

impl BlockStore {
    /// The fetch budget for a block asked of its owner (`remote`) or of the upstream. A fetch
    /// that falls back from its owner to the upstream keeps the slot it has: memory stays within
    /// both budgets together.
    pub(super) fn slots(&self, remote: bool) -> &Slots {
        if remote {
            &self.peer_slots
        } else {
            &self.upstream_slots
        }
    }

    /// Whether a copy of a peer's block is kept here (in memory, apart from the memory tier).
    pub(super) fn has_copy(&self, id: &BlockId) -> bool {
        self.fleet.as_ref().is_some_and(|f| f.has_copy(id))
    }

    /// The replica owning block `index` of `object`, when it is not this one and `purpose`
    /// may ask it.
    pub(super) fn remote_owner(
        &self,
        object: &ObjectId,
        index: u64,
        purpose: Purpose,
    ) -> Option<Arc<str>> {
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

    /// Metadata and block `index` of `object` from `peer`, its owner, told that this replica
    /// learnt `changed` ago that the object changed; `None` when the peer could not be used
    /// (the caller asks the upstream).
    pub(super) async fn open_at_owner(
        &self,
        peer: &str,
        object: &ObjectId,
        index: u64,
        changed: Option<Duration>,
    ) -> Option<Result<Option<crate::fleet::client::Opened>, UpstreamError>> {
        let fleet = self.fleet.as_ref()?;
        match self
            .ask_peer("open", fleet.client().open(peer, object, index, changed))
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
    pub(super) async fn fetch(
        &self,
        fill: Fill<BlockId, UpstreamError>,
        (object, etag, slice): (ObjectId, Arc<str>, BlockSlice),
        slot: Option<Slot>,
        body: Option<(BodyStream, Supplier)>,
        purpose: Purpose,
    ) {
        // Memory, then disk, then the origin. Warming skips the tiers: it only fetches what the
        // disk does not hold, and must not promote into memory. A body already arriving (a cold
        // open) was checked against the tiers before it came here.
        let mut resume_at = 0;
        if purpose != Purpose::Warm && body.is_none() {
            match self.read_local(&fill, &slice).await {
                Local::Served => {
                    readers_first(slice.block_len).await;
                    let id = fill.key().clone();
                    let block = fill.deliver();
                    self.cache.memory().insert(id, block).await;
                    return;
                }
                Local::InMemory => {
                    fill.deliver();
                    return;
                }
                Local::StoppedAt(at) => resume_at = at,
                Local::Absent => {
                    if let Some(pieces) = self.assemble_pieces(&fill, &object, &etag, &slice).await
                    {
                        readers_first(slice.block_len).await;
                        let id = fill.key().clone();
                        let block = fill.deliver();
                        self.cache.memory().insert(id.clone(), block).await;
                        self.drop_pieces(&id, pieces).await;
                        return;
                    }
                }
            }
        }
        let first = match body {
            Some((body, supplier)) => FirstAttempt::Body(body, supplier),
            None if resume_at > 0 => FirstAttempt::UpstreamFrom(resume_at),
            None => match self.remote_owner(&object, slice.index, purpose) {
                Some(peer) => FirstAttempt::Owner(peer),
                None => FirstAttempt::Upstream,
            },
        };
        let slot = match slot {
            Some(slot) => slot,
            None => {
                let remote = matches!(first, FirstAttempt::Owner(_));
                self.slots(remote).acquire(purpose.turn()).await
            }
        };
        // Assembled as its bytes come, so caching it copies nothing more (a disk read that
        // stopped part-way began it already).
        fill.assemble(slice.block_len as usize);
        let result = self
            .fetch_into(&fill, &object, &etag, slice, slot, first)
            .await;
        if result.is_ok() {
            readers_first(slice.block_len).await;
        }
        self.settle(fill, result, (&object, &etag), &slice, purpose)
            .await;
    }

    /// End the fetch of block `slice` of `object` into `fill` as `result` and `purpose` say:
    /// cached here, cold, only kept as a brief copy (a peer's block), or failed.
    pub(super) async fn settle(
        &self,
        mut fill: Fill<BlockId, UpstreamError>,
        result: Result<Supplier, UpstreamError>,
        (object, etag): (&ObjectId, &Arc<str>),
        slice: &BlockSlice,
        purpose: Purpose,
    ) {
        let index = slice.index;
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
                // Noted while the fetch is still running, so a shutdown that waits for running
                // fetches (`BlockStore::fetches`) finds the note offered to disk with the block.
                self.remember(object);
                // Another response in progress reads this block too, after this fetch: it is
                // read again, though only one reader may have read it as it came.
                if self.reading.shared(object, etag, index) {
                    fill.wanted_again();
                }
                match purpose {
                    // A large block is cached in a task of its own: where it was not assembled
                    // as it came, joining it is a copy of all of it, which the next block of the
                    // same GET's body (`pace`) need not wait for. Still counted as a running
                    // fetch until it is cached.
                    Purpose::Demand(..) | Purpose::Prefetch | Purpose::Peer
                        if slice.block_len >= READERS_FIRST_FROM =>
                    {
                        tokio::spawn(fill.commit());
                    }
                    Purpose::Demand(..) | Purpose::Prefetch | Purpose::Peer => {
                        fill.commit().await;
                    }
                    Purpose::Warm => {
                        if !fill.commit_cold().await {
                            self.metrics.cache_write_dropped(WriteDropped::WarmRejected);
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(object = %object, block = index, error = %e, "block fetch failed");
                // A changed or deleted object is the upstream answering correctly.
                if !matches!(e, UpstreamError::Changed) && !e.is_not_found() {
                    self.metrics.upstream_failed(&e);
                }
                self.metrics.cache_write_dropped(WriteDropped::FetchFailed);
                if purpose == Purpose::Prefetch {
                    self.prefetched.forget(fill.key());
                }
                fill.fail(e);
            }
        }
    }

    /// Feed `fill` from memory or the disk tier, as far as they hold it. A block on disk is
    /// read one of two ways:
    /// - in pieces, each pushed as soon as it is read and verified, when the block is a whole
    ///   object larger than [`STREAMED_FROM`] and no other disk read is running: the reader's
    ///   first byte then waits for 256 KiB instead of the block, and the device reads while the
    ///   reader sends. Each piece is copied into one buffer as it comes, which memory keeps.
    /// - otherwise whole, in one read. A read of many blocks already overlaps its disk reads
    ///   with sending (the read window), a busy device gains nothing from pieces, and for all of
    ///   those the copy costs more CPU than the pieces save (measured: docs/benchmarks.md,
    ///   "Disk hits streamed in pieces").
    ///
    /// A disk read that stops part-way (a chunk failing its checksum, the region reclaimed) says
    /// where, and the upstream finishes it.
    async fn read_local(&self, fill: &Fill<BlockId, UpstreamError>, slice: &BlockSlice) -> Local {
        let in_memory = self.cache.memory().get(fill.key()).await;
        if let Some(bytes) = in_memory.and_then(|b| self.checked(b, slice)) {
            fill.push(bytes);
            return Local::InMemory;
        }
        let reading = DiskRead::start(&self.disk_reads);
        let whole_object = slice.block_start == 0 && slice.object_size == slice.block_len;
        if reading.alone && whole_object && slice.block_len > STREAMED_FROM {
            let Some(disk) = self.cache.disk_stream(fill.key()).await else {
                return Local::Absent;
            };
            return match self.stream_disk(fill, disk, slice).await {
                Ok(()) => Local::Served,
                Err(at) => Local::StoppedAt(at),
            };
        }
        // One buffer, promoted as it is: no copy.
        let found = self.cache.promote(fill.key()).await;
        match found.and_then(|b| self.checked(b, slice)) {
            Some(bytes) => {
                fill.push(bytes);
                Local::InMemory
            }
            None => Local::Absent,
        }
    }

    /// Feed `fill` the block `slice` from the pieces here that tile it
    /// ([`BlockStore::tiling_pieces`]): a block of an object read by its parts, read now as
    /// a block. The pieces' keys, to drop once the block is cached; `None`, having pushed
    /// nothing, if they do not tile it, or one could not be read.
    async fn assemble_pieces(
        &self,
        fill: &Fill<BlockId, UpstreamError>,
        object: &ObjectId,
        etag: &Arc<str>,
        slice: &BlockSlice,
    ) -> Option<Vec<BlockId>> {
        let pieces = self.tiling_pieces(object, etag, fill.key(), slice)?;
        let (ids, read) = self.read_pieces(pieces).await?;
        fill.assemble(slice.block_len as usize);
        for bytes in read {
            fill.push(bytes);
        }
        self.metrics.lookup(Lookup::Pieces, true);
        Some(ids)
    }

    /// Push the block `disk` streams into `fill` as each piece arrives verified. `Err` with the
    /// bytes pushed if it stopped part-way, or (with 0) if its length is not the block's.
    async fn stream_disk(
        &self,
        fill: &Fill<BlockId, UpstreamError>,
        mut disk: cache_core::disk::ValueStream,
        slice: &BlockSlice,
    ) -> Result<(), u64> {
        if !self.fits(disk.len(), slice) {
            return Err(0);
        }
        // Promoted to memory once read: assembled as its pieces come instead of joined then.
        fill.assemble(slice.block_len as usize);
        let mut got = 0;
        while let Some(piece) = disk.next().await {
            match piece {
                Ok(piece) => {
                    got += piece.len() as u64;
                    fill.push(piece);
                }
                Err(e) => {
                    tracing::warn!(block = slice.index, at = got, error = %e, "the upstream finishes a block the disk could not");
                    return Err(got);
                }
            }
        }
        Ok(())
    }

    /// Fetch `range` of `object` at `etag` into `fill`, starting as `first` says (from the
    /// block's first byte, unless the disk gave the bytes before it). The upstream's
    /// bodies arrive already resumed where they broke or stalled (the upstream's
    /// [`crate::upstream::resume`] layer), so their failures stand. A peer that fails, before its
    /// first byte or after, or stalls for `idle_timeout`, is replaced by the upstream from the
    /// byte where it stopped. Says who supplied the bytes. `_slot` is held until the body is
    /// complete: it bounds fetch buffers, not just requests.
    pub(super) async fn fetch_into(
        &self,
        fill: &Fill<BlockId, UpstreamError>,
        object: &ObjectId,
        etag: &str,
        slice: BlockSlice,
        _slot: Slot,
        first: FirstAttempt,
    ) -> Result<Supplier, UpstreamError> {
        let range = slice.block_start..slice.block_start + slice.block_len;
        let expected = range.end - range.start;
        let from = match first {
            FirstAttempt::UpstreamFrom(at) => at,
            _ => 0,
        };
        let mut first = Some(first);
        let mut supplied = Supplier::Peer;
        let mut got = from;
        // Bytes not from the upstream: a peer's, or the disk's before `from`.
        let mut elsewhere = from;
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
                Some(FirstAttempt::Upstream | FirstAttempt::UpstreamFrom(_)) | None => (
                    self.origin
                        .get(object, Some(etag), Some(range.start + got..range.end))
                        .await,
                    Supplier::Upstream,
                ),
            };
            if supplier == Supplier::Upstream {
                supplied = Supplier::Upstream;
            }
            // The upstream's body counted for what parallel GETs gain (`pace`), until it ends.
            let mut streaming = None;
            let failure = match attempt {
                Ok(mut body) => loop {
                    // The upstream's bodies are timed by its resume layer, which continues a
                    // stalled one; a second clock here could stop it first.
                    let next = if supplier == Supplier::Peer {
                        match tokio::time::timeout(self.idle_timeout, body.next()).await {
                            Ok(next) => next,
                            Err(_) => {
                                break UpstreamError::Timeout(format!(
                                    "no body bytes for {:?}",
                                    self.idle_timeout
                                ))
                            }
                        }
                    } else {
                        body.next().await
                    };
                    match next {
                        Some(Ok(chunk)) => {
                            got += chunk.len() as u64;
                            if got > expected {
                                return Err(UpstreamError::BodyLength { got, expected });
                            }
                            match supplier {
                                Supplier::Upstream => {
                                    self.metrics
                                        .upstream_received(&object.bucket, chunk.len() as u64);
                                    match &mut streaming {
                                        None => streaming = Some(self.pace.gain.started()),
                                        Some(s) => s.chunk(chunk.len() as u64),
                                    }
                                }
                                Supplier::Peer | Supplier::Mixed => {
                                    elsewhere += chunk.len() as u64;
                                    self.metrics.peer_bytes("received", chunk.len() as u64)
                                }
                            }
                            fill.push(chunk);
                        }
                        // Every byte arrived: a connection that breaks after them loses nothing.
                        Some(Err(_)) | None if got == expected => {
                            return Ok(match supplied {
                                Supplier::Upstream if elsewhere > 0 => Supplier::Mixed,
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
            return Err(failure);
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
