//! Range-first: a cold range much smaller than its block is fetched exactly, not as the whole
//! block around it. A Parquet reader asking 256 KiB of an 8 MiB block then waits for 256 KiB,
//! not for the block up to its range, and the upstream sends 256 KiB, not 8 MiB.
//!
//! The bytes fetched are cached as a part: under their block's key and their span within it
//! (`crate::cache_key`), in memory and on disk like a block, found again only by a read of
//! exactly that span (a query reading the same column chunk again). The block itself is
//! fetched when something predicts it will be read: an in-order reader's read-ahead
//! (`prefetch`), a read of most of it, or `complete_block_after` different ranges of it
//! fetched while it is remembered, when the whole block is fetched behind the reader as
//! read-ahead. That last rule saves requests where ranges wander over a few hot objects (the
//! demo: 38 upstream GETs cold and none warm, against 106 and 72 without it) and costs them
//! where each range is read again exactly (the Parquet benchmark: more bytes, GETs and
//! latency); docs/benchmarks.md has both. A block already cached or in flight is always read
//! as a block. A multipart upload's part read by `partNumber` ([`Cut::Parts`]) is cut so
//! wherever it covers a block only in part, and completes no block: its reads ask for the
//! same spans every time.
//!
//! A block nothing holds whole whose pieces here tile it, first byte to last (the parts of an
//! object read by `partNumber`, then read whole or by ranges), is assembled from them
//! ([`BlockStore::tiling_pieces`]): no GET for bytes the cache holds. The pieces then give way
//! to the block, which every later read of them finds first.

use std::ops::Range;
use std::sync::Arc;

use cache_core::{BlockSlice, Miss, Tier};

use crate::cache_key::BlockId;
use crate::model::ObjectId;
use crate::telemetry::labels::{Lookup, Source};

use super::{BlockStore, Cut, OpenBlock, Purpose};

/// The spans of parts fetched recently, remembered by block to complete the block when a
/// different part of it is fetched. Bounded: a block forgotten costs one more part fetch, not
/// a wrong answer.
pub(super) const PARTS_REMEMBERED: u64 = 65_536;

/// Most pieces noted of one block ([`BlockStore::note_piece`]); a block cut finer is fetched
/// whole when read whole.
const PIECES_NOTED: usize = 64;

/// Most pieces noted in all ([`BlockStore::note_piece`]), each a span of 16 bytes: with the
/// blocks' keys, a few MiB at most.
pub(super) const PIECES_NOTED_IN_ALL: u64 = 65_536;

/// The pieces of `spans` (bytes of a block, any order) that tile `0..len`, in order: from
/// each end, the longest piece starting there. `None` if they leave a gap.
fn tiling(spans: &[Range<u64>], len: u64) -> Option<Vec<Range<u64>>> {
    let mut chain = Vec::new();
    let mut at = 0;
    while at < len {
        let next = spans
            .iter()
            .filter(|s| s.start == at && s.end > at && s.end <= len)
            .max_by_key(|s| s.end)?;
        chain.push(next.clone());
        at = next.end;
    }
    Some(chain)
}

/// Whether a slice of `len` bytes, read as `cut`, is fetched on its own rather than as its
/// block of `block_len`: a range's when the block would bring more than 1.5 times the bytes
/// asked; a part's whenever it is short of its block (the part's GET brings exactly its
/// bytes, and every later read of the part asks for the same ones).
pub(super) fn fetched_alone(len: u64, block_len: u64, cut: Cut) -> bool {
    match cut {
        Cut::Ranges => block_len.saturating_mul(2) > len.saturating_mul(3),
        Cut::Parts => len < block_len,
    }
}

impl BlockStore {
    /// The part `slice` is read as when its block (`block`, the block's key) is nowhere here:
    /// not in a tier, not in flight, not copied from its owner, not tiled by pieces held here
    /// ([`BlockStore::part_of`]).
    /// The one rule the read path and `X-Cache` both follow.
    pub(super) fn part_instead(
        &self,
        object: &ObjectId,
        etag: &Arc<str>,
        block: &BlockId,
        slice: &BlockSlice,
        purpose: Purpose,
    ) -> Option<(BlockId, BlockSlice)> {
        if self.cache.locate(block).is_some()
            || self.cache.in_flight(block)
            || self.has_copy(block)
            || self.tiling_pieces(object, etag, block, slice).is_some()
        {
            return None;
        }
        self.part_of(object, etag, slice, purpose)
    }

    /// The key and the slice `slice` is fetched as on its own (the part as a block of its own:
    /// its first byte, its length), when range-first reads are on, a client is reading, the
    /// whole block would bring more than 1.5 times the bytes asked, and no other replica owns
    /// the block (an owner caches whole blocks and is asked for them). `None`: the whole block.
    pub(super) fn part_of(
        &self,
        object: &ObjectId,
        etag: &Arc<str>,
        slice: &BlockSlice,
        purpose: Purpose,
    ) -> Option<(BlockId, BlockSlice)> {
        let len = slice.to - slice.from;
        if !self.exact_ranges
            || !purpose.demand()
            || !fetched_alone(len, slice.block_len, purpose.cut())
            || self.remote_owner(object, slice.index, purpose).is_some()
        {
            return None;
        }
        Some(self.part_at(object, etag, slice, slice.from..slice.to))
    }

    /// Bytes `span` of `slice`'s block as a part: its key, and the part as a block of its own
    /// (its first byte, its length), all of it.
    pub(super) fn part_at(
        &self,
        object: &ObjectId,
        etag: &Arc<str>,
        slice: &BlockSlice,
        span: std::ops::Range<u64>,
    ) -> (BlockId, BlockSlice) {
        let len = span.end - span.start;
        let part = BlockSlice {
            index: slice.index,
            block_start: slice.block_start + span.start,
            block_len: len,
            from: 0,
            to: len,
            object_size: slice.object_size,
        };
        (self.keys.part(object, etag, slice.index, span), part)
    }

    /// Note that the piece `piece` (a part's slice, as [`BlockStore::part_at`] makes it) of
    /// `object` at `etag` is cached or being fetched, so that a read of its whole block can
    /// find the pieces that tile it. Best effort: a note lost or evicted costs a block GET.
    pub(super) fn note_piece(&self, object: &ObjectId, etag: &Arc<str>, piece: &BlockSlice) {
        let span = self.span_in_block(piece);
        let block = self.id(object, etag, piece.index);
        let noted = self.pieces.get(&block);
        let spans = noted.as_deref().unwrap_or(&[]);
        if spans.contains(&span) || spans.len() >= PIECES_NOTED {
            return;
        }
        let spans: Arc<[Range<u64>]> = spans.iter().cloned().chain([span]).collect();
        self.pieces.insert(block, spans);
    }

    /// The pieces held here (in memory or on disk) that tile `slice`'s block (key `block`),
    /// in order, each with its key, its slice and its tier; `None` unless they tile all of it.
    pub(super) fn tiling_pieces(
        &self,
        object: &ObjectId,
        etag: &Arc<str>,
        block: &BlockId,
        slice: &BlockSlice,
    ) -> Option<Vec<(BlockId, BlockSlice, Tier)>> {
        let spans = self.pieces.get(block)?;
        tiling(&spans, slice.block_len)?
            .into_iter()
            .map(|span| {
                let (id, piece) = self.part_at(object, etag, slice, span);
                let tier = self.cache.locate(&id)?;
                Some((id, piece, tier))
            })
            .collect()
    }

    /// The bytes of the pieces that tile a block ([`Self::tiling_pieces`]), each checked, in
    /// order, with the pieces' keys; `None` if a piece could not be read (gone since).
    pub(super) async fn read_pieces(
        &self,
        pieces: Vec<(BlockId, BlockSlice, Tier)>,
    ) -> Option<(Vec<BlockId>, Vec<bytes::Bytes>)> {
        let mut read = Vec::with_capacity(pieces.len());
        let mut ids = Vec::with_capacity(pieces.len());
        for (id, piece, _) in pieces {
            // From disk without promoting it: the block is what memory will hold.
            let bytes = match self.cache.memory().get(&id).await {
                Some(bytes) => bytes,
                None => self.cache.range_on_disk(&id, 0..piece.block_len).await?,
            };
            read.push(self.checked(bytes, &piece)?);
            ids.push(id);
        }
        Some((ids, read))
    }

    /// Drop the pieces `block` was assembled from, once the block is cached: every later read
    /// of a piece finds the block first, and the pieces would hold its bytes twice. (Dropped
    /// before the block is cached, a piece read in between would be fetched again.)
    pub(super) async fn drop_pieces(&self, block: &BlockId, pieces: Vec<BlockId>) {
        self.pieces.invalidate(block);
        for id in &pieces {
            self.cache.remove(id).await;
        }
    }

    /// Open part `part` (key `id`) of a block: from memory, or joined to its fetch, which
    /// reads the disk first and else GETs exactly the part. Fetching a part of a block another
    /// part of which was fetched recently also fetches the block behind it.
    pub(super) async fn open_part(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        id: BlockId,
        part: BlockSlice,
        purpose: Purpose,
    ) -> OpenBlock {
        self.note_piece(object, etag, &part);
        let in_memory = self.cache.memory().get(&id).await;
        if let Some(bytes) = in_memory.and_then(|b| self.checked(b, &part)) {
            self.metrics.lookup(Lookup::Part, true);
            return OpenBlock::Ready(bytes);
        }
        let on_disk = self.cache.locate(&id) == Some(Tier::Disk);
        self.metrics.lookup(Lookup::Part, on_disk);
        match self.cache.join(id) {
            Miss::Joined(reader) => {
                self.metrics.coalesced();
                OpenBlock::Streaming(reader, Source::Upstream)
            }
            Miss::Fetch { fill, reader } => {
                let tier = if on_disk {
                    Source::Disk
                } else {
                    self.complete_if_predicted(object, etag, &part, purpose);
                    Source::Upstream
                };
                let store = self.clone();
                let fetch = (object.clone(), etag.clone(), part);
                let span = tracing::info_span!(
                    "part fetch",
                    larder.block = part.index,
                    larder.source = tier.as_str()
                );
                tokio::spawn(tracing::Instrument::instrument(
                    async move { store.fetch(fill, fetch, None, None, purpose).await },
                    span,
                ));
                OpenBlock::Streaming(reader, tier)
            }
        }
    }

    /// The bytes of its block a piece (a part's slice, as [`BlockStore::part_at`] makes it)
    /// covers.
    fn span_in_block(&self, piece: &BlockSlice) -> Range<u64> {
        let base = piece.index * self.keys.layout().block_size();
        piece.block_start - base..piece.block_start - base + piece.block_len
    }

    /// A part of a block is being fetched (`part`, a part's slice) for a read of ranges:
    /// its span is counted for its block while remembered, unless that span already was; at
    /// the `complete_block_after`th different one, the whole block is fetched behind the
    /// reader, as read-ahead (counted as such, used or wasted, and only with a free upstream
    /// slot and read-ahead on). The same range fetched again (the memory tier let it go, or
    /// turned it away when full) predicts nothing more of its block. Counted again, as it was
    /// until 2026-12-05, a Parquet query reading its column chunks again through a full
    /// memory tier had their 8 MiB blocks completed behind it, and its repeat pass fetched
    /// 353 MiB for the 90 it read, against 32 MiB now (docs/benchmarks.md). Never for a read
    /// of parts ([`Cut`]).
    pub(super) fn complete_if_predicted(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        part: &BlockSlice,
        purpose: Purpose,
    ) {
        if !self.prefetch.enabled() || self.complete_block_after == 0 || purpose.cut() == Cut::Parts
        {
            return;
        }
        let id = self.id(object, etag, part.index);
        let span = self.span_in_block(part);
        let seen = self.parts_fetched.get(&id);
        let spans = seen.as_deref().unwrap_or(&[]);
        if spans.contains(&span) {
            return;
        }
        if spans.len() as u64 + 1 >= u64::from(self.complete_block_after) {
            self.parts_fetched.invalidate(&id);
            self.prefetch(object, etag, [part.index], part.object_size);
        } else {
            let spans: Arc<[Range<u64>]> = spans.iter().cloned().chain([span]).collect();
            self.parts_fetched.insert(id, spans);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fetched_alone, tiling};
    use crate::read::blocks::Cut;

    #[test]
    fn a_range_is_fetched_alone_only_when_its_block_brings_over_half_as_much_again() {
        let block = 8 << 20;
        let alone = |len, block_len| fetched_alone(len, block_len, Cut::Ranges);
        assert!(alone(256 << 10, block));
        assert!(alone(5 << 20, block));
        // 6 MiB of 8: the block is 1.33 times the bytes asked.
        assert!(!alone(6 << 20, block));
        assert!(!alone(block, block));
        // Exactly 1.5 times: the block.
        assert!(!alone(2, 3));
        assert!(alone(1, 2));
        assert!(!alone(u64::MAX, u64::MAX));
    }

    #[test]
    fn pieces_tile_a_block_only_from_its_first_byte_to_its_last() {
        // Parts of 5 and 3 bytes in a block of 8, noted in any order.
        assert_eq!(tiling(&[5..8, 0..5], 8), Some(vec![0..5, 5..8]));
        // Overlapping pieces: the longest from each end.
        assert_eq!(tiling(&[0..2, 0..5, 2..8, 5..8], 8), Some(vec![0..5, 5..8]));
        // A gap, a missing start or end, a piece past the block: no tiling.
        assert_eq!(tiling(&[0..4, 5..8], 8), None);
        assert_eq!(tiling(&[1..8, 8..8], 8), None);
        assert_eq!(tiling(&[0..5, 0..4], 8), None);
        assert_eq!(tiling(&[0..5, 5..9], 8), None);
        assert_eq!(tiling(&[], 8), None);
        // A short last block, all of it one piece.
        let whole = tiling(&[0..3, 0..2], 3).unwrap();
        assert_eq!((whole.len(), whole[0].clone()), (1, 0..3));
    }

    #[test]
    fn a_part_is_fetched_alone_whenever_it_is_short_of_its_block() {
        let block = 8 << 20;
        let alone = |len, block_len| fetched_alone(len, block_len, Cut::Parts);
        assert!(alone(6 << 20, block));
        assert!(alone(block - 1, block));
        assert!(!alone(block, block));
        // A short last block, all of it.
        assert!(!alone(100, 100));
    }
}
