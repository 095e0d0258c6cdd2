//! The first read of an object nothing is known of: the GET of its first needed block (or,
//! range-first, of the bytes asked of it, or of a suffix) brings its metadata, saving a HEAD
//! round trip; a range spanning blocks sends each block's GET at once, or, where one
//! connection brings more than a block within a round trip, one GET for as many of them as it
//! brings (`pace`). The disk tier notes which objects it holds blocks of, so that after a
//! restart they revalidate with a HEAD instead.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cache_core::{BlockSlice, Fill, Miss};
use futures::future;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::cache_key::BlockId;
use crate::model::{
    BodyStream, ByteRange, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
};
use crate::telemetry::labels::Source;
use tracing::Instrument;

use super::fetch::Supplier;
use super::pace::Carve;
use super::slots::{Slot, Turn};
use super::split::Split;
use super::{part, BlockStore, Cut, Purpose};

/// What a cold GET's body fills.
enum ColdFill {
    /// A block, or a part fetched as a block of its own: the flight, and what it fetches.
    /// (Both variants boxed: a flight's handle is 400 bytes.)
    Whole(Box<Fill<BlockId, UpstreamError>>, BlockSlice),
    /// The tail of a block fetched tail first.
    TailFirst(Box<Split>),
}

impl BlockStore {
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

    pub(super) fn remember(&self, object: &ObjectId) {
        if self.cache.disk().is_none() {
            return;
        }
        let marker = self.marker(object);
        if self.cache.locate(&marker).is_none() {
            // Best effort, like any disk write: a dropped note only costs a block GET later.
            // Admitted like a block (a page each: not worth it for objects read once).
            self.cache.offer_cold(&marker, Bytes::from_static(b"1"));
        }
    }

    /// The last `len` bytes of an object nothing is known of, and its metadata, from one GET
    /// (`Range: bytes=-len`): a Parquet reader's first request, where it is not cached as a part
    /// ([`BlockStore::opens_suffixes_as_parts`]). The body goes to the client as
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
                    metrics.upstream_received(&bucket, b.len() as u64);
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

    /// Metadata of an object nothing is known of, from the GET of the bytes a client asks
    /// (`asked`) whose body then fills what the read path will look for: the block under its
    /// first byte, or (range-first) the part of that block asked. A range spanning blocks
    /// sends the GET of each piece at once, so no piece waits a round trip for the metadata.
    /// In a fleet, the block comes from the replica owning it, which does the same (once for
    /// everyone asking). With the metadata comes how long ago the upstream said it. `Ok(None)`
    /// when the answer cannot stand for a HEAD (see
    /// [`crate::upstream::Upstream::get_with_meta`]). The fetches run in a task of their own,
    /// like any block fetch, so the bytes land even if the caller goes away. `changed`: how
    /// long ago this replica learnt that the object changed, which an owner asked for it is
    /// told, so that it does not answer with what it cached before then.
    pub async fn open_cold(
        self: &Arc<Self>,
        object: ObjectId,
        asked: ByteRange,
        changed: Option<Duration>,
    ) -> Result<Option<(ObjectMeta, Duration)>, UpstreamError> {
        self.open_cold_as(
            object,
            asked,
            Purpose::Demand(Turn::First, Cut::Ranges),
            changed,
        )
        .await
    }

    /// [`BlockStore::open_cold`] of block `index`, for another replica: never asks a third one.
    pub async fn open_cold_for_peer(
        self: &Arc<Self>,
        object: ObjectId,
        index: u64,
    ) -> Result<Option<(ObjectMeta, Duration)>, UpstreamError> {
        let first = index.saturating_mul(self.keys.layout().block_size());
        let asked = ByteRange::FromTo { first, last: None };
        self.open_cold_as(object, asked, Purpose::Peer, None).await
    }

    /// Whether reading block `index` of `object`'s version `etag` here would ask the upstream:
    /// it is held in no tier, and no fetch of it is under way to join.
    pub fn would_fetch(&self, object: &ObjectId, etag: &Arc<str>, index: u64) -> bool {
        let id = self.id(object, etag, index);
        self.cache.locate(&id).is_none() && !self.cache.in_flight(&id)
    }

    /// The first read of part `part` of `object` (a multipart upload's) whose place is not
    /// known: one GET of the part ([`Upstream::get_part`](crate::upstream::Upstream::get_part)),
    /// whose answer says where the part lies and brings the object's metadata. Its body fills
    /// what a read of that range will look for, as a cold range's GET does
    /// ([`BlockStore::cold_run`]: the blocks it covers, or range-first the pieces of them it
    /// holds), and the reader then reads the range through the block store, joining those
    /// fills. `Ok(None)`: the answer cannot be read so, and the caller passes the read
    /// through. Only outside a fleet ([`BlockStore::opens_upload_parts`]).
    pub async fn open_upload_part(
        self: &Arc<Self>,
        object: ObjectId,
        part: PartNumber,
    ) -> Result<Option<(ObjectMeta, PartSpan)>, UpstreamError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let store = self.clone();
        let span = tracing::info_span!("block fetch", larder.source = "upstream");
        tokio::spawn(
            async move { store.fetch_upload_part(object, part, tx).await }.instrument(span),
        );
        rx.await.unwrap_or(Err(UpstreamError::Abandoned))
    }

    /// Whether a part's first read is opened by [`BlockStore::open_upload_part`]: outside a
    /// fleet, where the blocks a part covers may be other replicas' to fetch and keep.
    pub fn opens_upload_parts(&self) -> bool {
        self.fleet.is_none()
    }

    async fn fetch_upload_part(
        self: &Arc<Self>,
        object: ObjectId,
        part: PartNumber,
        tx: tokio::sync::oneshot::Sender<Result<Option<(ObjectMeta, PartSpan)>, UpstreamError>>,
    ) {
        let purpose = Purpose::Demand(Turn::First, Cut::Parts);
        let slot = self.slots(false).acquire(purpose.turn()).await;
        let sent = Instant::now();
        let (meta, span, body) = match self.origin.get_part(&object, part).await {
            Ok(Some(answer)) => answer,
            other => {
                let _ = tx.send(other.map(|_| None));
                return;
            }
        };
        self.pace.answered(sent.elapsed());
        let etag = meta.etag.clone();
        let got = ByteRange::bytes(span.bytes.clone());
        let fills = self.cold_run(&object, &etag, meta.size, got, purpose);
        let len = span.bytes.end - span.bytes.start;
        // Joined before the place is handed over, so the reader finds them in flight.
        let _ = tx.send(Ok(Some((meta, span))));
        let target = (&object, &etag);
        self.fill_run(
            target,
            (body, Supplier::Upstream),
            len,
            fills,
            slot,
            purpose,
        )
        .await;
    }

    /// Whether a cold suffix read is opened like any range ([`BlockStore::open_cold`], its
    /// bytes cached as a part of the last block) rather than streamed through
    /// ([`BlockStore::open_tail`]): with range-first reads, outside a fleet (where the owner of
    /// the last block, unknown until the size is, caches it).
    pub fn opens_suffixes_as_parts(&self) -> bool {
        self.exact_ranges && self.fleet.is_none()
    }

    async fn open_cold_as(
        self: &Arc<Self>,
        object: ObjectId,
        asked: ByteRange,
        purpose: Purpose,
        changed: Option<Duration>,
    ) -> Result<Option<(ObjectMeta, Duration)>, UpstreamError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let store = self.clone();
        let span = tracing::info_span!("block fetch", larder.source = "upstream");
        tokio::spawn(
            async move {
                store
                    .fetch_cold(object, (asked, changed), purpose, tx)
                    .await
            }
            .instrument(span),
        );
        rx.await.unwrap_or(Err(UpstreamError::Abandoned))
    }

    /// The GETs a cold read of `asked` opens with, before the object's size is known, one per
    /// piece: the block under the first byte (or, range-first, the bytes asked of it), then
    /// for a bounded range spanning blocks each further block's piece, up to `read_window`
    /// pieces, except those owned by another replica (asked of it once the metadata is known).
    /// A suffix is one piece, the suffix. Where one connection brings more than a block
    /// within a round trip (`pace`), the first GET runs on past its first piece instead:
    /// over the next pieces of the range, or to the object's end from a block's first byte.
    fn cold_spans(&self, object: &ObjectId, asked: ByteRange, purpose: Purpose) -> Vec<ByteRange> {
        let block_size = self.keys.layout().block_size();
        let (first, last) = match asked {
            ByteRange::Suffix(_) => return vec![asked],
            ByteRange::FromTo { first, last } => (first, last),
        };
        let index = first / block_size;
        let pieces = last.map_or(1, |l| (l / block_size).saturating_sub(index) + 1);
        let mut spans: Vec<Range<u64>> = (index
            ..index.saturating_add(pieces.min(self.read_window as u64)))
            .filter_map(|i| {
                let remote = self.remote_owner(object, i, purpose).is_some();
                if remote && i != index {
                    return None;
                }
                let block = i * block_size..(i * block_size).saturating_add(block_size);
                let end = last.map_or(block.end, |l| l.saturating_add(1).min(block.end));
                let piece = first.max(block.start)..end;
                let exact = self.exact_ranges && purpose.demand() && !remote;
                let len = piece.end - piece.start;
                Some(
                    if exact && part::fetched_alone(len, block_size, purpose.cut()) {
                        piece
                    } else if exact && piece.start > block.start {
                        // Tail first (`split`): the head is asked once the metadata is known.
                        piece.start..block.end
                    } else {
                        block
                    },
                )
            })
            .collect();
        // Not in a fleet, where the blocks past the first may be another replica's.
        let past = match (purpose.demand(), &self.fleet) {
            (true, None) => {
                let most = self.read_window.saturating_sub(1) as u64;
                self.pace.blocks_past(block_size, most)
            }
            _ => 0,
        };
        if past > 0 {
            match last {
                // To the object's end: as far as the connection brings.
                None if first.is_multiple_of(block_size) => {
                    spans[0].end = first.saturating_add((past + 1).saturating_mul(block_size));
                }
                None => {}
                // A range: its pieces are consecutive (none is another replica's here), and
                // the first `past` after the first join it; `cold_run` hands each its bytes.
                Some(_) => {
                    let joined = (past as usize + 1).min(spans.len());
                    let end = spans[joined - 1].end;
                    spans.drain(1..joined);
                    spans[0].end = end;
                }
            }
        }
        spans.into_iter().map(ByteRange::bytes).collect()
    }

    async fn fetch_cold(
        self: &Arc<Self>,
        object: ObjectId,
        (asked, changed): (ByteRange, Option<Duration>),
        purpose: Purpose,
        tx: tokio::sync::oneshot::Sender<Result<Option<(ObjectMeta, Duration)>, UpstreamError>>,
    ) {
        let block_size = self.keys.layout().block_size();
        let first_index = match asked {
            ByteRange::FromTo { first, .. } => Some(first / block_size),
            ByteRange::Suffix(_) => None,
        };
        let owner = first_index.and_then(|i| self.remote_owner(&object, i, purpose));
        let slot = self.slots(owner.is_some()).acquire(purpose.turn()).await;
        let at_owner = match (&owner, first_index) {
            (Some(peer), Some(index)) => self.open_at_owner(peer, &object, index, changed).await,
            _ => None,
        };
        let mut spans = self.cold_spans(&object, asked, purpose).into_iter();
        let Some(first_span) = spans.next() else {
            let _ = tx.send(Ok(None));
            return;
        };
        let mut first = std::pin::pin!(async {
            match at_owner {
                Some(opened) => {
                    opened.map(|o| o.map(|(meta, age, body)| (meta, age, body, Supplier::Peer)))
                }
                None => {
                    let sent = Instant::now();
                    let answer = self.get_cold(&object, first_span).await;
                    if let Ok(Some(_)) = answer {
                        self.pace.answered(sent.elapsed());
                    }
                    answer.map(|o| {
                        o.map(|(meta, body)| (meta, Duration::ZERO, body, Supplier::Upstream))
                    })
                }
            }
        });
        // The further pieces' GETs go out with the first, each holding an upstream slot. Only
        // slots free now: waiting for one while holding the first's could deadlock, and a
        // piece not sent here is fetched by the read path once the metadata is known.
        let target = &object;
        let rest: Vec<_> = spans
            .map_while(|span| Some((span, self.upstream_slots.try_acquire(Turn::Ahead)?)))
            .collect();
        let mut answers =
            std::pin::pin!(future::join_all(rest.iter().map(|&(span, _)| async move {
                self.get_cold(target, span).await.ok().flatten()
            })));
        // The metadata is handed over as soon as the first piece's GET says it, not after the
        // slowest piece's: the others' flights are joined first, and filled when they answer.
        let mut answered = None;
        let first = loop {
            tokio::select! {
                // The first piece's GET is sent first: the upstream answers in about the
                // order it is asked, and its answer is the one the reader waits for.
                biased;
                first = first.as_mut() => break first,
                all = answers.as_mut(), if answered.is_none() => answered = Some(all),
            }
        };
        let (meta, age, body, supplier) = match first {
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
        let etag = meta.etag.clone();
        let (size, version) = (meta.size, meta.etag.clone());
        let first_fills = self.cold_run(&object, &etag, size, first_span, purpose);
        let rest_fills: Vec<_> = rest
            .into_iter()
            .map(|(span, slot)| (self.cold_fill(&object, &etag, size, span, purpose), slot))
            .collect();
        // Joined before the metadata is handed over, so the reader finds them in flight
        // instead of starting its own.
        let _ = tx.send(Ok(Some((meta, age))));
        let got = first_span.within(size);
        let first_fetch = self.fill_run(
            (&object, &etag),
            (body, supplier),
            got.end - got.start,
            first_fills,
            slot,
            purpose,
        );
        let rest_fetches = async {
            let answers = match answered {
                Some(all) => all,
                None => answers.await,
            };
            let fetches =
                rest_fills
                    .into_iter()
                    .zip(answers)
                    .filter_map(|((fill, slot), answer)| {
                        // Another version answered (the object changed between the GETs), or none
                        // did: fetched again, pinned to this ETag.
                        let body = answer
                            .filter(|(m, _)| m.etag == version && m.size == size)
                            .map(|(_, body)| (body, Supplier::Upstream));
                        let target = (&object, &etag);
                        Some(self.fetch_cold_fill(fill?, target, Some(slot), body, purpose))
                    });
            future::join_all(fetches).await;
        };
        tokio::join!(first_fetch, rest_fetches);
    }

    /// Hand a cold GET's `body` (`len` bytes, from `supplier`) to `fills`, each its own share
    /// in order ([`BlockStore::cold_run`]): each block goes on filling (and caching) while the
    /// next takes the body's bytes after its own. What the body does not reach (it broke, or
    /// came too slowly to go on: `pace`) is fetched on its own.
    async fn fill_run(
        self: &Arc<Self>,
        (object, etag): (&ObjectId, &Arc<str>),
        (body, supplier): (BodyStream, Supplier),
        len: u64,
        fills: Vec<(ColdFill, u64)>,
        slot: Slot,
        purpose: Purpose,
    ) {
        let block_size = self.keys.layout().block_size();
        let carve = Carve::new(body, len);
        let mut slot = Some(slot);
        let mut fills = fills.into_iter();
        // Each block goes on filling (and caching) while the next takes the body's bytes
        // after its own: the next starts once this one's were read, not once it is done.
        // A block's tail fetched tail first is then still waiting for its head's GET.
        let mut running = FuturesUnordered::new();
        let mut first = true;
        while let Some((fill, len)) = fills.next() {
            let (read_tx, mut read) = tokio::sync::oneshot::channel::<()>();
            // Dropped, and so `read` told, when the fill has read its bytes or gave up.
            let body = carve.next(len).inspect(move |_| {
                let _held = &read_tx;
            });
            let body = Some((body.boxed(), supplier));
            running.push(self.fetch_cold_fill(fill, (object, etag), slot.take(), body, purpose));
            loop {
                tokio::select! {
                    _ = &mut read => break,
                    Some(()) = running.next() => {}
                }
            }
            if !carve.whole() {
                break;
            }
            if !first {
                self.metrics.run_block();
            } else if supplier == Supplier::Upstream {
                let rate = carve.measure(&self.pace);
                if !self.pace.keeps(rate, fills.len() as u64, block_size) {
                    // Too slow to go on, but the next block's bytes are on their way
                    // already: it keeps them (a GET of its own would ask them again, a
                    // round trip later), and only the blocks past it are asked for now.
                    let next = fills.next();
                    for (fill, _) in fills {
                        let alone = (object, etag);
                        running.push(self.fetch_cold_fill(fill, alone, None, None, purpose));
                    }
                    fills = Vec::from_iter(next).into_iter();
                }
            }
            first = false;
        }
        // The body broke, or came too slowly to go on past the next block: the blocks it
        // did not reach are fetched on their own, at once; its connection is let go.
        drop(carve);
        let alone =
            fills.map(|(fill, _)| self.fetch_cold_fill(fill, (object, etag), None, None, purpose));
        tokio::join!(future::join_all(alone), running.collect::<Vec<()>>());
    }

    /// Fetch what a cold GET's body fills (`body`, or asked again when none).
    async fn fetch_cold_fill(
        &self,
        fill: ColdFill,
        (object, etag): (&ObjectId, &Arc<str>),
        slot: Option<Slot>,
        body: Option<(BodyStream, Supplier)>,
        purpose: Purpose,
    ) {
        let target = (object.clone(), etag.clone());
        match fill {
            ColdFill::Whole(fill, fetched) => {
                let fetch = (target.0, target.1, fetched);
                self.fetch(*fill, fetch, slot, body, purpose).await
            }
            ColdFill::TailFirst(split) => self.fetch_split(*split, target, body, slot).await,
        }
    }

    /// What a cold GET of `span` fills, in order, with the bytes of its body each takes: one
    /// flight ([`BlockStore::cold_fill`]), or for a GET run on past its first block (`pace`),
    /// each block's, as far as none is cached or being fetched already.
    fn cold_run(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        size: u64,
        span: ByteRange,
        purpose: Purpose,
    ) -> Vec<(ColdFill, u64)> {
        let block_size = self.keys.layout().block_size();
        let got = span.within(size);
        if got.end - got.start <= block_size - got.start % block_size {
            let fill = self.cold_fill(object, etag, size, span, purpose);
            return fill.map(|f| (f, got.end - got.start)).into_iter().collect();
        }
        // Cut at block boundaries: a range's first piece may start inside its block.
        let bounds = (got.start / block_size + 1..)
            .map(|i| i * block_size)
            .take_while(|&b| b < got.end);
        std::iter::once(got.start)
            .chain(bounds)
            .map_while(|start| {
                let end = (start - start % block_size + block_size).min(got.end);
                let fill =
                    self.cold_fill(object, etag, size, ByteRange::bytes(start..end), purpose)?;
                Some((fill, end - start))
            })
            .collect()
    }

    /// The flight a cold GET of `span` fills, of an object of `size` bytes at `etag`: what the
    /// read path will look for (the block, the part the slice is fetched as, or the tail of a
    /// block fetched tail first), joined. `None` when the body is of no use: it is none of
    /// those (a range in a short last block, which only the size showed to be most of its
    /// block), or what it would fill is cached already (metadata forgotten for space, a
    /// restart with the disk tier kept, or the whole block of a part) or being fetched.
    fn cold_fill(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        size: u64,
        span: ByteRange,
        purpose: Purpose,
    ) -> Option<ColdFill> {
        let got = span.within(size);
        let slice = self.keys.layout().slices(got.start, got.end, size).next()?;
        let block_id = self.id(object, etag, slice.index);
        if self.tail_first(object, &slice, purpose) {
            if got.end != slice.block_start + slice.block_len
                || self.cache.locate(&block_id).is_some()
            {
                return None;
            }
            let (split, _) = self.split(object, etag, block_id, &slice)?;
            return Some(ColdFill::TailFirst(Box::new(split)));
        }
        let (id, fetched, part) = match self.part_of(object, etag, &slice, purpose) {
            Some((id, part)) => (id, part, true),
            None => (block_id.clone(), slice, false),
        };
        if fetched.block_start != got.start || fetched.block_len != got.end - got.start {
            return None;
        }
        if self.cache.locate(&id).is_some() || (part && self.cache.locate(&block_id).is_some()) {
            return None;
        }
        match self.cache.join(id) {
            Miss::Fetch { fill, .. } => {
                if part {
                    self.note_piece(object, etag, &fetched);
                    self.complete_if_predicted(object, etag, &fetched, purpose);
                }
                Some(ColdFill::Whole(Box::new(fill), fetched))
            }
            Miss::Joined(_) => None,
        }
    }
}
