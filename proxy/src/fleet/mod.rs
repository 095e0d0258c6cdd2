//! One cache across many replicas: each block has an owner among the replicas
//! ([`ring`], rendezvous hashing, within the zone by default); a replica asked for a block it
//! does not own gets it from the owner ([`client`]; the owner answers from its peer listener,
//! `front::peer`), whose single-flight then
//! deduplicates across the whole fleet, so a block leaves S3 once per fleet (or zone).
//!
//! Membership comes from what the platform already knows ([`membership`]: a list, a file, or
//! the DNS of a Kubernetes headless Service), never from a protocol of our own. A replica that
//! is down or slow costs a fallback to S3, never a failed read.
//!
//! Replicas sign what they ask and seal what they answer with the fleet secret ([`auth`],
//! [`seal`]); with certificates ([`tls`]) they also speak TLS, so no block crosses the network
//! between them in clear.

pub mod auth;
pub mod client;
pub mod membership;
pub mod notify;
pub mod ring;
pub mod seal;
pub mod tls;
pub mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;

use crate::cache_key::BlockId;
use crate::model::ObjectId;
use crate::telemetry::metrics::Metrics;
use client::PeerClient;
use ring::View;

/// Keys sampled to measure how many moved at a membership change.
const MOVED_SAMPLES: u64 = 4096;

/// How blocks fetched from a peer are kept here.
#[derive(Debug, Clone, Copy)]
pub struct CopyLimits {
    /// Bytes of peer blocks kept in memory; 0 keeps none.
    pub capacity: u64,
    /// How long one is kept.
    pub ttl: Duration,
}

/// This replica's part in the fleet: who owns what, and how to reach them.
pub struct Fleet {
    view: RwLock<Arc<View>>,
    client: PeerClient,
    /// Blocks fetched from their owner, kept briefly for the next reader here (TinyLFU admits
    /// the hot ones): a small memory of its own, so peers' blocks never push this replica's
    /// own blocks out of its memory tier.
    copies: Option<moka::future::Cache<BlockId, Bytes>>,
    /// The share of keys that moved at the last membership change, in millionths.
    moved_ppm: AtomicU64,
    changes: AtomicU64,
    metrics: Arc<Metrics>,
    /// Changes to tell the other replicas ([`notify`]).
    notices: tokio::sync::mpsc::Sender<notify::Notice>,
    pending_notices: parking_lot::Mutex<Option<tokio::sync::mpsc::Receiver<notify::Notice>>>,
    /// Members listed but left out of the view at the last refresh, and why.
    absent: RwLock<Arc<[Absent]>>,
}

/// A listed member this replica does not share blocks with, and why (for `GET /fleet`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Absent {
    /// Its name in the member list.
    pub name: String,
    /// Why it is left out: the last probe's error (a refused certificate, a 403, a refused
    /// connection), or another block size.
    pub error: String,
}

impl Fleet {
    /// A fleet seen as `view` to begin with (usually this replica alone).
    pub fn new(view: View, client: PeerClient, copies: CopyLimits, metrics: Arc<Metrics>) -> Self {
        let copies = (copies.capacity > 0).then(|| {
            moka::future::Cache::builder()
                .max_capacity(copies.capacity)
                .weigher(|_, v: &Bytes| u32::try_from(v.len()).unwrap_or(u32::MAX))
                .time_to_live(copies.ttl)
                .build()
        });
        let (notices, pending) = notify::queue();
        Self {
            notices,
            pending_notices: parking_lot::Mutex::new(Some(pending)),
            view: RwLock::new(Arc::new(view)),
            client,
            copies,
            moved_ppm: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            metrics,
            absent: RwLock::new(Arc::new([])),
        }
    }

    /// The name of the replica owning block `index` of `object`, or `None` when it is this one.
    pub fn owner(&self, object: &ObjectId, index: u64) -> Option<Arc<str>> {
        let key = ring::block_key(&object.bucket, &object.key, index);
        self.view.read().owner(key).map(|m| m.name.clone())
    }

    /// The current view.
    pub fn view(&self) -> Arc<View> {
        self.view.read().clone()
    }

    /// Adopt `next` if it places any key differently, recording how many keys moved.
    pub fn update(&self, next: View) {
        let current = self.view();
        if current.same_owners(&next) && current.members() == next.members() {
            return;
        }
        let moved = current.moved_fraction(&next, MOVED_SAMPLES);
        tracing::info!(
            members = next.members().len(),
            candidates = next.candidates(),
            moved = format!("{:.3}", moved),
            "fleet membership changed"
        );
        self.moved_ppm
            .store((moved * 1e6) as u64, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::Relaxed);
        self.metrics.fleet_changed();
        *self.view.write() = Arc::new(next);
    }

    /// Record the members listed but left out of the view, and why.
    pub fn set_absent(&self, absent: Vec<Absent>) {
        *self.absent.write() = absent.into();
    }

    /// The members listed but left out of the view at the last refresh.
    pub fn absent(&self) -> Arc<[Absent]> {
        self.absent.read().clone()
    }

    /// The share of keys that moved at the last membership change.
    pub fn last_moved(&self) -> f64 {
        self.moved_ppm.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Membership changes since start.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// The client reaching the other replicas.
    pub fn client(&self) -> &PeerClient {
        &self.client
    }

    /// A block fetched from its owner earlier, if still kept.
    pub async fn copy(&self, id: &BlockId) -> Option<Bytes> {
        self.copies.as_ref()?.get(id).await
    }

    /// Whether a copy of the block is kept here.
    pub fn has_copy(&self, id: &BlockId) -> bool {
        self.copies.as_ref().is_some_and(|c| c.contains_key(id))
    }

    /// Keep a block fetched from its owner for the next reader here.
    pub async fn keep_copy(&self, id: BlockId, block: Bytes) {
        if let Some(copies) = &self.copies {
            copies.insert(id, block).await;
        }
    }

    /// Whether copies are kept at all.
    pub fn keeps_copies(&self) -> bool {
        self.copies.is_some()
    }
}
