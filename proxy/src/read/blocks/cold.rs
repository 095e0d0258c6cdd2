//! The first read of an object nothing is known of: one GET brings its metadata and its
//! first needed block (or, for a suffix range, just the bytes asked), saving a HEAD round
//! trip. The disk tier notes which objects it holds blocks of, so that after a restart they
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
use super::{BlockStore, Purpose};

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

    /// Metadata of an object nothing is known of, from a GET of its block `index` whose body
    /// then fills that block, saving the HEAD round trip; in a fleet, from the replica owning
    /// that block, which does the same (once for everyone asking). With the metadata comes how
    /// long ago the upstream said it. `Ok(None)` when the answer cannot stand for a HEAD (see
    /// [`crate::upstream::Upstream::get_with_meta`]). The fetch runs in a task of its own, like any block fetch,
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
}
