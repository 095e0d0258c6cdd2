//! Where a range's bytes would come from right now, without reading them: the `X-Cache`
//! header's answer.

use std::ops::Range;
use std::sync::Arc;

use cache_core::Tier;

use crate::cache_key::BlockId;
use crate::model::ObjectId;
use crate::telemetry::labels::XCache;

use super::slots::Turn;
use super::{BlockStore, Cut, Purpose};

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

/// Where a range's bytes would come from right now ([`BlockStore::classify`]).
#[derive(Debug, Clone)]
pub struct Found {
    /// What the `X-Cache` header says.
    pub result: CacheResult,
    /// The key of the one block the range lies in, when it lies in one and that whole block is
    /// here: [`BlockStore::read_in_one`] reads it by this key rather than make it again (each
    /// key made is the bucket, key and ETag hashed, about 3 % of a small hit).
    pub(super) block: Option<BlockId>,
    /// Set by a request whose own upstream GET brought the block (a cold open, which may have
    /// cached it before this look): its read is the block's first, not a read again, so it
    /// must not count toward the block's admission to disk.
    pub fetched_here: bool,
}

impl CacheResult {
    /// The `X-Cache` header value (and metric label); `stale`: the object's metadata was
    /// served stale (the upstream failing).
    pub fn label(self, stale: bool) -> XCache {
        match (self, stale) {
            (CacheResult::HitMemory, false) => XCache::HitMemory,
            (CacheResult::HitDisk, false) => XCache::HitDisk,
            (CacheResult::Partial, false) => XCache::Partial,
            (CacheResult::Coalesced, false) => XCache::Coalesced,
            (CacheResult::Miss, false) => XCache::Miss,
            (CacheResult::Peer, false) => XCache::Peer,
            (CacheResult::HitMemory, true) => XCache::StaleHitMemory,
            (CacheResult::HitDisk, true) => XCache::StaleHitDisk,
            (CacheResult::Partial, true) => XCache::StalePartial,
            (CacheResult::Coalesced, true) => XCache::StaleCoalesced,
            (CacheResult::Miss, true) => XCache::StaleMiss,
            (CacheResult::Peer, true) => XCache::StalePeer,
        }
    }
}

impl BlockStore {
    /// Where the bytes `[start, end)` of `object` at `etag` would come from right now.
    pub fn classify(
        &self,
        object: &ObjectId,
        etag: &Arc<str>,
        range: Range<u64>,
        size: u64,
    ) -> Found {
        self.classify_by(object, etag, range, size, Cut::Ranges)
    }

    /// [`BlockStore::classify`] of bytes a client's read cuts as `cut`, which decides the
    /// pieces of blocks they are looked for as.
    pub fn classify_by(
        &self,
        object: &ObjectId,
        etag: &Arc<str>,
        range: Range<u64>,
        size: u64,
        cut: Cut,
    ) -> Found {
        let purpose = Purpose::Demand(Turn::First, cut);
        let (mut in_memory, mut on_disk, mut missing) = (0usize, 0usize, 0usize);
        let mut first_missing = None;
        let (mut slices, mut block) = (0usize, None);
        for slice in self.keys.layout().slices(range.start, range.end, size) {
            slices += 1;
            let mut id = self.id(object, etag, slice.index);
            let mut tier = self.cache.locate(&id);
            if slices == 1 && tier.is_some() {
                block = Some(id.clone());
            }
            // Read as a part of its own when its block is nowhere here (`part`): looked up only
            // then, so a hit costs one lookup.
            if tier.is_none() {
                if let Some(pieces) = self.tiling_pieces(object, etag, &id, &slice) {
                    // Assembled from the pieces that tile it, with no GET.
                    let in_memory = pieces.iter().all(|(_, _, t)| *t == Tier::Memory);
                    tier = Some(if in_memory { Tier::Memory } else { Tier::Disk });
                } else if let Some((part, _)) =
                    self.part_instead(object, etag, &id, &slice, purpose)
                {
                    tier = self.cache.locate(&part);
                    id = part;
                }
            }
            match tier {
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
        let result = match (in_memory + on_disk, on_disk, missing, first_missing) {
            (_, 0, 0, _) => CacheResult::HitMemory,
            (_, _, 0, _) => CacheResult::HitDisk,
            (0, _, _, Some((true, _))) => CacheResult::Coalesced,
            (0, _, _, Some((_, true))) => CacheResult::Peer,
            (0, _, _, _) => CacheResult::Miss,
            _ => CacheResult::Partial,
        };
        Found {
            result,
            block: block.filter(|_| slices == 1),
            fetched_here: false,
        }
    }
}
