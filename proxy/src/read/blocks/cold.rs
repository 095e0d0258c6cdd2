//! The first read of an object nothing is known of: one GET brings its metadata and its
//! first needed block (or, for a range much smaller than its block or a suffix range, just the
//! bytes asked), saving a HEAD round trip. The disk tier notes which objects it holds blocks of, so that after a restart they
//! revalidate with a HEAD instead.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cache_core::Miss;
use futures::stream::StreamExt;

use crate::cache_key::BlockId;
use crate::model::{BodyStream, ByteRange, ObjectId, ObjectMeta, UpstreamError};
use crate::telemetry::labels::Source;
use tracing::Instrument;

use super::fetch::Supplier;
use super::{part, BlockStore, Purpose};

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

    /// Metadata of an object nothing is known of, from a GET of the bytes a client asks
    /// (`first` to `last`, inclusive; `None`: to the end) whose body then fills the block
    /// under `first` (or, range-first, the part of it asked: `part`), saving the HEAD round
    /// trip; in a fleet, from the replica owning that block, which does the same (once for
    /// everyone asking). With the metadata comes how long ago the upstream said it. `Ok(None)`
    /// when the answer cannot stand for a HEAD (see
    /// [`crate::upstream::Upstream::get_with_meta`]). The fetch runs in a task of its own, like
    /// any block fetch, so the bytes land even if the caller goes away.
    pub async fn open_cold(
        self: &Arc<Self>,
        object: ObjectId,
        first: u64,
        last: Option<u64>,
    ) -> Result<Option<(ObjectMeta, Duration)>, UpstreamError> {
        self.open_cold_as(object, first, last, Purpose::Demand)
            .await
    }

    /// [`BlockStore::open_cold`] of block `index`, for another replica: never asks a third one.
    pub async fn open_cold_for_peer(
        self: &Arc<Self>,
        object: ObjectId,
        index: u64,
    ) -> Result<Option<(ObjectMeta, Duration)>, UpstreamError> {
        let first = index.saturating_mul(self.keys.layout().block_size());
        self.open_cold_as(object, first, None, Purpose::Peer).await
    }

    async fn open_cold_as(
        self: &Arc<Self>,
        object: ObjectId,
        first: u64,
        last: Option<u64>,
        purpose: Purpose,
    ) -> Result<Option<(ObjectMeta, Duration)>, UpstreamError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let store = self.clone();
        let span = tracing::info_span!(
            "block fetch",
            larder.block = first / self.keys.layout().block_size(),
            larder.source = "upstream"
        );
        tokio::spawn(
            async move { store.fetch_cold(object, (first, last), purpose, tx).await }
                .instrument(span),
        );
        rx.await.unwrap_or(Err(UpstreamError::Abandoned))
    }

    async fn fetch_cold(
        self: &Arc<Self>,
        object: ObjectId,
        (first, last): (u64, Option<u64>),
        purpose: Purpose,
        tx: tokio::sync::oneshot::Sender<Result<Option<(ObjectMeta, Duration)>, UpstreamError>>,
    ) {
        let block_size = self.keys.layout().block_size();
        let index = first / block_size;
        let block = index * block_size..(index * block_size).saturating_add(block_size);
        let asked = first..last.map_or(block.end, |l| l.saturating_add(1).min(block.end));
        let owner = self.remote_owner(&object, index, purpose);
        let Ok(slot) = self.slots(owner.is_some()).acquire().await else {
            let _ = tx.send(Err(UpstreamError::Abandoned));
            return;
        };
        let at_owner = match &owner {
            Some(peer) => self.open_at_owner(peer, &object, index).await,
            None => None,
        };
        // Range-first: only the bytes asked, when their block would bring more than 1.5 times
        // them. The object's size is not known yet: below, the body is kept only if it is what
        // the read path would fetch knowing it.
        let span = if owner.is_none()
            && self.exact_ranges
            && purpose == Purpose::Demand
            && part::fetched_alone(asked.end - asked.start, block_size)
        {
            asked
        } else {
            block
        };
        let result = match at_owner {
            Some(opened) => {
                opened.map(|o| o.map(|(meta, age, body)| (meta, age, body, Supplier::Peer)))
            }
            None => self
                .get_cold(&object, ByteRange::bytes(span.clone()))
                .await
                .map(|o| o.map(|(meta, body)| (meta, Duration::ZERO, body, Supplier::Upstream))),
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
        let got = span.start..span.end.min(meta.size);
        let Some(slice) = self
            .keys
            .layout()
            .slices(got.start, got.end, meta.size)
            .next()
        else {
            let _ = tx.send(Ok(None));
            return;
        };
        // What the read path will look for: the block, or the part the slice is fetched as.
        // A body that is neither (a range in a short last block, which only the size showed to
        // be most of its block) has served for the metadata alone.
        let (id, fetched, block) = match self.part_of(&object, &etag, &slice, purpose) {
            Some((id, part)) => (id, part, Some(slice)),
            None => (self.id(&object, &etag, index), slice, None),
        };
        if fetched.block_start != got.start || fetched.block_len != got.end - got.start {
            let _ = tx.send(Ok(Some((meta, age))));
            return;
        }
        // A block (or part) cached under this ETag (metadata forgotten for space, or a restart
        // with the disk tier kept) is served from there: this body is dropped, having cost one
        // request. So is a part whose whole block is here: the read path reads the block.
        let block_here =
            || block.is_some() && self.cache.locate(&self.id(&object, &etag, index)).is_some();
        if self.cache.locate(&id).is_some() || block_here() {
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
            if let Some(block) = block {
                self.complete_if_predicted(&object, &etag, &block);
            }
            let fetch = (object, etag, fetched);
            self.fetch(fill, fetch, Some(slot), Some((body, supplier)), purpose)
                .await;
        }
    }
}
