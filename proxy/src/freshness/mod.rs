//! Freshness: what Larder drops when an object changes, however it learns of the change, and
//! whether it can trust S3 events to tell it.
//!
//! A change is learnt three ways, and [`Freshness`] is the one place that acts on each:
//! - a write through this replica (PUT, DELETE, copy, multipart completion, form upload);
//! - an S3 event notification ([`events`]: MinIO's webhook or SNS on `POST /v1/events`, or
//!   an SQS queue, [`sqs`]);
//! - another replica telling this one (`fleet::notify`), because the write or the event
//!   reached it.
//!
//! Each drops the object's metadata (and a remembered 404) and every listing page that could
//! show it; blocks need no dropping, being keyed by ETag. The first two are also told to the
//! other replicas of the fleet.
//!
//! Events let metadata be trusted far longer than a TTL could safely allow (`metadata_ttl =
//! 1h`), but only while they flow: [`Freshness::watch`] marks the stream unhealthy when no
//! event (nor heartbeat, [`heartbeat`]) arrived within `events_max_silence`, and the
//! [`Policy`] then holds everything mutable to `events_fallback_ttl` until events return.

pub mod events;
pub mod heartbeat;
pub mod sns;
pub mod sqs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::fleet::notify::{ChangeNotice, Notice};
use crate::fleet::Fleet;
use crate::model::ObjectId;
use crate::read::listing::ListingCache;
use crate::read::metadata::MetadataCache;
use crate::read::policy::Policy;
use crate::telemetry::labels::{EventOutcome, NoticeOutcome};
use crate::telemetry::metrics::Metrics;
use events::{Change, ChangeKind};

/// How a change was learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learnt {
    /// A write through this replica.
    Write,
    /// An S3 event received by this replica.
    Event,
    /// Another replica's notice: not told on again.
    Peer,
}

/// What a change drops, and the health of the event stream.
pub struct Freshness {
    metadata: Arc<MetadataCache>,
    listings: Option<Arc<ListingCache>>,
    policy: Arc<Policy>,
    fleet: Option<Arc<Fleet>>,
    metrics: Arc<Metrics>,
    started: Instant,
    /// Milliseconds from `started` to the last event or heartbeat; `u64::MAX` before the first.
    last_heard: AtomicU64,
    max_silence: Duration,
}

/// Never heard.
const NEVER: u64 = u64::MAX;

impl Freshness {
    /// Freshness over these caches, telling `fleet` (if any) of changes; the event stream is
    /// healthy while events arrive within `max_silence`.
    pub fn new(
        metadata: Arc<MetadataCache>,
        listings: Option<Arc<ListingCache>>,
        policy: Arc<Policy>,
        fleet: Option<Arc<Fleet>>,
        metrics: Arc<Metrics>,
        max_silence: Duration,
    ) -> Self {
        Self {
            metadata,
            listings,
            policy,
            fleet,
            metrics,
            started: Instant::now(),
            last_heard: AtomicU64::new(NEVER),
            max_silence,
        }
    }

    /// Freshness for `metadata` alone: no listing cache, no fleet, no events expected.
    pub fn local(metadata: Arc<MetadataCache>, metrics: Arc<Metrics>) -> Self {
        let policy = Arc::new(Policy::default());
        Self::new(
            metadata,
            None,
            policy,
            None,
            metrics,
            Duration::from_secs(60),
        )
    }

    /// The metadata cache.
    pub fn metadata(&self) -> &Arc<MetadataCache> {
        &self.metadata
    }

    /// `id` changed: drop what is held of it (and tell the fleet unless a peer told us).
    pub async fn object_changed(&self, id: &ObjectId, learnt: Learnt) {
        self.object_changed_to(id, None, learnt).await;
    }

    /// [`Freshness::object_changed`], by a change that says which version it made (an S3
    /// event's ETag, without quotes): a read fetching that very version now keeps it.
    async fn object_changed_to(&self, id: &ObjectId, etag: Option<&str>, learnt: Learnt) {
        self.metadata.changed_to(&id.latest(), etag).await;
        if id.version_id.is_some() {
            self.metadata.changed_to(id, etag).await;
        }
        if let Some(listings) = &self.listings {
            listings.changed(&id.bucket, &id.key);
        }
        self.tell(&id.bucket, Some(&id.key), learnt);
    }

    /// Anything in `bucket` may have changed (a multi-object delete names its keys in a body
    /// Larder streams on unread): drop all of it.
    pub async fn bucket_changed(&self, bucket: &str, learnt: Learnt) {
        self.metadata.invalidate_bucket(bucket);
        if let Some(listings) = &self.listings {
            listings.bucket_changed(bucket);
        }
        self.tell(bucket, None, learnt);
    }

    fn tell(&self, bucket: &str, key: Option<&str>, learnt: Learnt) {
        match (&self.fleet, learnt) {
            (Some(fleet), Learnt::Write | Learnt::Event) => {
                fleet.notify(Notice::Changed(ChangeNotice {
                    bucket: bucket.into(),
                    key: key.map(Into::into),
                    from_event: learnt == Learnt::Event,
                }))
            }
            (Some(_), Learnt::Peer) => self.metrics.notice(NoticeOutcome::Received),
            (None, _) => {}
        }
    }

    /// Apply the changes of one S3 event notification, counting each by what it did. A
    /// notification of any kind (even one with no object change, like MinIO's test event)
    /// shows the stream is alive.
    pub async fn apply(&self, changes: &[Change]) {
        self.heard();
        for change in changes {
            let held = self.metadata.cached_etag(&change.object.latest()).await;
            let outcome = match (&change.kind, held) {
                // Larder already holds the version the event announces (written through
                // Larder, or read since): nothing to drop here.
                (ChangeKind::Created(Some(etag)), Some(held)) if held.trim_matches('"') == etag => {
                    EventOutcome::Unchanged
                }
                (_, None) => EventOutcome::NotCached,
                _ => EventOutcome::Applied,
            };
            // Not cached still counts as a change: a fetch in flight when the event arrived
            // must not keep what it brings (unless it brings the version announced), a named
            // version may be cached when the latest is not, and listings may show the key.
            if outcome != EventOutcome::Unchanged {
                let etag = match &change.kind {
                    ChangeKind::Created(etag) => etag.as_deref(),
                    ChangeKind::Removed => None,
                };
                self.object_changed_to(&change.object, etag, Learnt::Event)
                    .await;
            } else {
                // The other replicas may still hold the old version: they hear of it anyway.
                self.tell(
                    &change.object.bucket,
                    Some(&change.object.key),
                    Learnt::Event,
                );
            }
            let lag = change
                .at
                .and_then(|at| SystemTime::now().duration_since(at).ok())
                .unwrap_or(Duration::ZERO);
            self.metrics.event(outcome, lag);
        }
    }

    /// The event stream showed it is alive.
    pub fn heard(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(NEVER - 1);
        self.last_heard.store(ms, Ordering::Relaxed);
    }

    /// How long since the last event or heartbeat; `None` before the first.
    pub fn silence(&self) -> Option<Duration> {
        match self.last_heard.load(Ordering::Relaxed) {
            NEVER => None,
            ms => Some(
                self.started
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms)),
            ),
        }
    }

    /// Whether events are expected and arriving.
    pub fn healthy(&self) -> bool {
        self.policy.events_healthy()
    }

    /// Whether events are expected at all.
    pub fn expects_events(&self) -> bool {
        self.policy.expects_events()
    }

    /// Keep the stream's health current (and say when it changes) until `shutdown`.
    pub async fn watch(self: Arc<Self>, shutdown: CancellationToken) {
        if !self.policy.expects_events() {
            return;
        }
        let tick = (self.max_silence / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned_never = false;
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let silence = self.silence();
            let healthy = silence.is_some_and(|s| s <= self.max_silence);
            if self.policy.set_events_healthy(healthy) {
                if healthy {
                    tracing::info!("S3 events are arriving: metadata is trusted for its full TTL");
                } else {
                    tracing::warn!(
                        silence = ?silence,
                        max_silence = ?self.max_silence,
                        "no S3 event within events_max_silence: falling back to events_fallback_ttl until events arrive again"
                    );
                }
            } else if !healthy
                && silence.is_none()
                && !warned_never
                && self.started.elapsed() > self.max_silence
            {
                warned_never = true;
                tracing::warn!(
                    max_silence = ?self.max_silence,
                    "no S3 event received since start: metadata is trusted only for events_fallback_ttl"
                );
            }
        }
    }
}
