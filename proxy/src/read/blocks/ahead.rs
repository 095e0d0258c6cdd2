//! Fetches nobody waits for yet: read-ahead of in-order readers, the blocks behind a cold
//! suffix read, and warm-up jobs. Read-ahead only takes upstream slots that are free, so it
//! never delays a demand fetch.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cache_core::{Miss, Tier};

use crate::model::{ObjectId, UpstreamError};
use crate::telemetry::labels::{PrefetchBlock, PrefetchBytes, WriteDropped};
use crate::telemetry::metrics::Metrics;

use super::slots::Turn;
use super::{BlockId, BlockStore, Purpose};

/// Blocks read ahead and not yet read by anyone, with their size: read → used, evicted or
/// expired → wasted.
pub(super) struct Prefetched {
    blocks: moka::sync::Cache<BlockId, u64>,
    /// Never fewer than the blocks in `blocks`: raised before each insert, lowered after each
    /// removal (the eviction listener sees every cause). While it is zero a read need not
    /// look: every hit would otherwise pay a hash and a lookup here even when nothing is read
    /// ahead (docs/benchmarks.md). Should a removal go unreported, it only stays above zero.
    held: Arc<AtomicUsize>,
}

impl Prefetched {
    /// Tracks at most `capacity` blocks, each for `unused_after`.
    pub(super) fn new(capacity: u64, unused_after: Duration, metrics: Arc<Metrics>) -> Self {
        let held = Arc::new(AtomicUsize::new(0));
        let blocks = {
            let held = held.clone();
            moka::sync::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(unused_after)
                .eviction_listener(move |_, bytes, cause| {
                    held.fetch_sub(1, Ordering::AcqRel);
                    if cause != moka::notification::RemovalCause::Explicit
                        && cause != moka::notification::RemovalCause::Replaced
                    {
                        metrics.prefetch_bytes(PrefetchBytes::Wasted, bytes);
                    }
                })
                .build()
        };
        Self { blocks, held }
    }

    /// Block `id` (`bytes` long) is being read ahead.
    fn insert(&self, id: BlockId, bytes: u64) {
        self.held.fetch_add(1, Ordering::AcqRel);
        self.blocks.insert(id, bytes);
    }

    /// Block `id`'s read-ahead failed: neither used nor wasted.
    pub(super) fn forget(&self, id: &BlockId) {
        self.blocks.invalidate(id);
    }

    /// Block `id` was read: its size, if it was read ahead (and not counted before).
    pub(super) fn take(&self, id: &BlockId) -> Option<u64> {
        if self.held.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.blocks.remove(id)
    }

    #[cfg(test)]
    pub(super) fn run_pending_tasks(&self) {
        self.blocks.run_pending_tasks();
    }
}

/// What warming one block did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warmed {
    /// Fetched and written to the cold tier: this many bytes.
    Fetched(u64),
    /// Already on disk (or being fetched by someone else).
    AlreadyCached,
}

impl BlockStore {
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
        // A read to the object's end has nothing after it to fetch, and no read can follow it
        // in order: every whole-object GET is one, so it skips the sequence bookkeeping.
        if !self.prefetch.enabled() || object.version_id.is_some() || range.end >= size {
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
    pub(super) fn prefetch(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        blocks: impl IntoIterator<Item = u64>,
        size: u64,
    ) {
        for index in blocks {
            let id = self.id(object, etag, index);
            if self.cache.locate(&id).is_some() || self.cache.in_flight(&id) || self.has_copy(&id) {
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
                let Some(slot) = store.slots(remote).try_acquire(Turn::Ahead) else {
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
                tokio::spawn(
                    async move { store.fetch(fill, fetch, None, None, Purpose::Warm).await },
                );
                let mut bytes = 0;
                while let Some(chunk) = reader.next_chunk().await {
                    bytes += chunk?.len() as u64;
                }
                Ok(Warmed::Fetched(bytes))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache_key::KeySchema;
    use cache_core::BlockLayout;

    fn block(index: u64) -> BlockId {
        let object = ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        };
        KeySchema::new(BlockLayout::new(4096), Default::default()).block(
            &object,
            &"\"e\"".into(),
            index,
        )
    }

    #[test]
    fn a_block_read_ahead_is_used_once_and_nothing_is_looked_up_once_none_is_held() {
        let tracked = Prefetched::new(16, Duration::from_secs(60), Arc::new(Metrics::default()));
        assert_eq!(tracked.take(&block(0)), None);
        tracked.insert(block(0), 10);
        tracked.insert(block(1), 20);
        tracked.insert(block(1), 20);
        assert_eq!(
            tracked.held.load(Ordering::Acquire),
            2,
            "a replaced entry is one"
        );
        assert_eq!(tracked.take(&block(0)), Some(10));
        assert_eq!(tracked.take(&block(0)), None, "used once");
        tracked.forget(&block(1));
        tracked.run_pending_tasks();
        assert_eq!(tracked.held.load(Ordering::Acquire), 0);
        assert_eq!(tracked.take(&block(1)), None);
    }
}
