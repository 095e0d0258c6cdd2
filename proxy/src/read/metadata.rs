//! Object metadata, cached for as long as the freshness [`Policy`] trusts it (`metadata_ttl`,
//! or a rule's), with concurrent misses coalesced into one HEAD, and dropped early when a write
//! through Larder, an S3 event or another replica says it changed. A 404 is remembered the same
//! way for `negative_ttl` (off by default).
//!
//! With refresh-ahead (`metadata_refresh_ahead`), the metadata of an object read often is
//! revalidated behind the reader that finds it in the last tenth of its TTL: a hot object's
//! readers never wait for its HEAD, and no metadata is trusted longer than its TTL for it.
//!
//! A cold open's metadata comes from a ranged GET, which never carries the object's checksums.
//! When a client asks for them on a later whole read (`learn_checksums`), a HEAD behind that
//! reader brings them, once per entry, in the same way.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::future::Cache;

use crate::model::{ObjectId, ObjectMeta, UpstreamError};
use crate::upstream::Upstream;

use super::policy::{Defaults, Policy, Trust};

/// Metadata as cached: what the upstream said, and when it said it (for metadata learnt from
/// another replica, when that replica had it from the upstream).
#[derive(Clone)]
struct Entry {
    meta: Arc<ObjectMeta>,
    fetched: Instant,
    trust: Trust,
    /// What the cache's clones of it share.
    shared: Arc<Shared>,
    /// The changes counted when the upstream was asked for it: a reader that joins the fetch
    /// after a change must not take what it brings ([`MetadataCache::lookup`]).
    began: Watch,
}

/// What the clones of an [`Entry`] share.
#[derive(Default)]
struct Shared {
    /// Reads served from it: refresh-ahead is for objects read often enough to be read again
    /// after it.
    reads: AtomicU32,
    /// Whether a HEAD was sent for its checksums ([`MetadataCache::learn_checksums`]): once
    /// per entry, so an upstream refusing HEADs is not asked on every read.
    checksums_asked: AtomicBool,
}

/// Why [`MetadataCache::lookup_once`] has no entry to give.
enum Lookup {
    /// The upstream's answer (or a remembered 404), and whether it came from a HEAD.
    Failed(UpstreamError, bool),
    /// The fetch it joined began before a change counted before it came.
    BeganBeforeAChange,
}

/// Which fetch under way [`MetadataCache::lookup_once`] may take the answer of.
#[derive(Clone, Copy)]
enum Join {
    /// Not one begun before a change the caller came after: counted here when it came, or
    /// learnt at this instant by the replica asking.
    NotBeforeAChange(Option<Instant>),
    /// Any: the second look, so that changes in a row cannot keep a reader waiting.
    Any,
}

/// What a fetch of metadata brought: the metadata, and when the upstream said it.
struct Fetched {
    meta: Arc<ObjectMeta>,
    at: Instant,
}

/// A fetch's failure: the upstream's answer, whether it came from a HEAD (which has no error
/// code), and the changes counted when the upstream was asked.
type FlightError = (UpstreamError, bool, Watch);

/// Every entry expires its TTL (plus `extra`, for the stale copy) after the upstream said it,
/// however it reached this replica. A named version's bytes never change, but the version
/// itself can be deleted behind Larder's back, so its metadata is revalidated like any other:
/// a deleted version is not served past the staleness bound.
struct Ttl {
    extra: Duration,
}

impl moka::Expiry<ObjectId, Entry> for Ttl {
    fn expire_after_create(
        &self,
        _id: &ObjectId,
        entry: &Entry,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some((entry.trust.ttl + self.extra).saturating_sub(entry.fetched.elapsed()))
    }

    /// A replaced entry (a refresh's, or the stale copy of a revalidation) expires as a new
    /// one would: moka's default keeps the old entry's expiry.
    fn expire_after_update(
        &self,
        id: &ObjectId,
        entry: &Entry,
        updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(id, entry, updated_at)
    }
}

/// A remembered 404: the upstream's answer, whether it came from a HEAD (no error code), and
/// when.
#[derive(Clone)]
struct Missing {
    error: UpstreamError,
    from_head: bool,
    fetched: Instant,
    ttl: Duration,
}

impl moka::Expiry<ObjectId, Missing> for Ttl {
    fn expire_after_create(
        &self,
        _id: &ObjectId,
        missing: &Missing,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(missing.ttl.saturating_sub(missing.fetched.elapsed()))
    }

    fn expire_after_update(
        &self,
        id: &ObjectId,
        missing: &Missing,
        updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(id, missing, updated_at)
    }
}

/// Cached HeadObject answers.
pub struct MetadataCache {
    cache: Option<Cache<ObjectId, Entry>>,
    /// The same answers kept `serve_stale_on_error` longer, for when the upstream fails.
    stale: Option<Cache<ObjectId, Entry>>,
    /// Objects whose revalidation (a read's, or a refresh behind one) failed with an outage
    /// in the last [`OUTAGE_HELD_FOR`], with when. Their reads are served the stale copy (if
    /// `serve_stale_on_error` keeps one) at once: a hot object neither sends the failing
    /// upstream a HEAD per read nor makes a read wait for one. At most once per
    /// [`STALE_RETRY_AFTER`], such a read starts a revalidation behind it, which clears the
    /// mark when the upstream answers.
    failing: moka::sync::Cache<ObjectId, Instant>,
    /// Keys the upstream said do not exist (`negative_ttl`).
    missing: Option<Cache<ObjectId, Missing>>,
    policy: Arc<Policy>,
    /// Objects whose metadata was fetched before (and not invalidated since). These revalidate
    /// with a HEAD, cheap next to fetching a block again that is likely still cached; objects
    /// not in it are opened with a GET that brings metadata and a block at once.
    seen: Option<moka::sync::Cache<ObjectId, ()>>,
    /// What this replica learnt of changes, one record per slot of keys (a fixed table:
    /// bounded whatever the key count). [`MetadataCache::changed`] records one in its key's
    /// slot; a fetch that saw its slot's count move while it ran does not stay cached, so
    /// metadata read just before a change cannot outlive it (see [`KeySlot::announced`] for
    /// the exception).
    slots: Box<[KeySlot]>,
    /// Changes of whole buckets ([`MetadataCache::invalidate_bucket`]: a DeleteObjects names
    /// its keys only in its body), which every fetch running then must not outlive either.
    bulk: Changes,
    /// What [`Moment`]s count from.
    epoch: Instant,
    hasher: std::collections::hash_map::RandomState,
    origin: Arc<dyn Upstream>,
    /// Whether metadata is refreshed ahead of its expiry (`metadata_refresh_ahead`).
    refresh_ahead: bool,
    /// Whether a client asking for checksums the metadata could not carry sends a HEAD for
    /// them behind its read (`learn_checksums`).
    learn_checksums: bool,
    /// Objects being refreshed now: one HEAD per object, and at most [`MAX_REFRESHES`].
    refreshing: parking_lot::Mutex<HashSet<ObjectId>>,
    /// Refreshes by outcome, in [`Refresh::ALL`]'s order.
    refreshes: [AtomicU64; Refresh::ALL.len()],
}

/// Most refreshes under way at once: each is one HEAD; a read finding them all busy leaves its
/// object to expire and be revalidated by the read that finds it expired, as without
/// refresh-ahead.
const MAX_REFRESHES: usize = 32;

/// Reads an entry must have served (this one included) before a read in its [`refresh_window`]
/// refreshes it: objects read about every 4 s or more often at the default TTL. A refresh
/// saves one reader one round trip, once per TTL; it pays for its HEAD where many readers
/// would have waited together (a hot object), not where one read a minute would (a
/// 40,000-request Zipf run sent 53 % more HEADs when every read in the last quarter
/// refreshed, 31 % with 3 reads needed; docs/benchmarks.md).
const REFRESH_AFTER_READS: u32 = 16;

/// How long before metadata trusted for `max_age` expires a read may refresh it: the last
/// tenth, at least a second (a HEAD's time, with room for the next read to come), at most the
/// last quarter. Each refresh brings the next expiry forward by up to this much, so a hot
/// object costs up to a tenth more HEADs than without refresh-ahead at TTLs of 10 s and up.
fn refresh_window(max_age: Duration) -> Duration {
    (max_age / 10).max(Duration::from_secs(1)).min(max_age / 4)
}

/// How a background refresh of metadata ended (`larder_metadata_refreshes_total`'s `outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// The upstream still has the version cached: trusted for another TTL.
    Unchanged,
    /// The upstream has another version: cached in its place.
    Changed,
    /// The upstream no longer has the object: forgotten, so the next read asks.
    Gone,
    /// The HEAD failed (or a change arrived while it ran): the entry expires as it would have.
    Failed,
    /// Not started: [`MAX_REFRESHES`] were under way.
    Busy,
}

impl Refresh {
    /// Every outcome.
    pub const ALL: [Refresh; 5] = [
        Refresh::Unchanged,
        Refresh::Changed,
        Refresh::Gone,
        Refresh::Failed,
        Refresh::Busy,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refresh::Unchanged => "unchanged",
            Refresh::Changed => "changed",
            Refresh::Gone => "gone",
            Refresh::Failed => "failed",
            Refresh::Busy => "busy",
        }
    }
}

/// A cache of at most `capacity` entries, each expiring as [`Ttl`] says (plus `extra`).
fn expiring<V>(capacity: u64, extra: Duration) -> Cache<ObjectId, V>
where
    V: Clone + Send + Sync + 'static,
    Ttl: moka::Expiry<ObjectId, V>,
{
    Cache::builder()
        .max_capacity(capacity)
        .expire_after(Ttl { extra })
        .support_invalidation_closures()
        .build()
}

/// Changes learnt of, for one slot of keys or for whole buckets.
struct Changes {
    /// How many.
    count: AtomicU64,
    /// When the last was learnt ([`NO_MOMENT`]: never). Metadata another replica had cached
    /// since before then is not taken from it ([`MetadataCache::get_or_open_aged`]).
    at: AtomicU64,
}

impl Changes {
    fn new() -> Self {
        Self {
            count: AtomicU64::new(0),
            at: AtomicU64::new(NO_MOMENT),
        }
    }

    /// One more change, learnt `now`. The time goes first: a fetch that sees the count move
    /// sees this time or a later one.
    fn record(&self, now: Moment) {
        self.at.fetch_max(now, Ordering::AcqRel);
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    fn at(&self) -> Moment {
        self.at.load(Ordering::Acquire)
    }
}

/// One slot of keys in [`MetadataCache::slots`]. Keys sharing a slot only cost each other a
/// refetch.
struct KeySlot {
    changes: Changes,
    /// The version the slot's latest change announced (an event's ETag, as
    /// [`MetadataCache::version`] hashes it with its key; [`UNKNOWN`] when the change named
    /// none). A fetch that saw the count move yet brought this very version stays cached:
    /// nothing newer is known, and dropping it would only cost the next read a GET.
    announced: AtomicU64,
}

/// The change counts a fetch started under.
#[derive(Clone, Copy)]
struct Watch {
    /// The key's slot in [`MetadataCache::slots`].
    slot: usize,
    /// That slot's count.
    key: u64,
    /// [`MetadataCache::bulk`]'s count.
    bulk: u64,
    /// When the counts were read.
    at: Instant,
}

impl Watch {
    /// Whether a change of this watch's key (its slot) or bucket was counted between it and
    /// `then`, a later watch of the same key.
    fn changed_before(&self, then: &Watch) -> bool {
        self.key != then.key || self.bulk != then.bulk
    }
}

/// How long after a revalidation of an object failed with an outage its upstream is asked
/// again (behind a read served stale): one HEAD a second per hot object while the upstream is
/// down, instead of one per read.
pub const STALE_RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long an object whose revalidation failed with an outage is taken to be behind a
/// failing upstream when nothing has asked since: its reads are served stale without waiting
/// for the upstream (and its retries) meanwhile. Past it, the next read revalidates and waits,
/// as the first read of an outage does. Longer would serve stale copies longer after the
/// upstream is back to reads that nothing else asked for.
pub const OUTAGE_HELD_FOR: Duration = Duration::from_secs(10);

/// Slots of [`MetadataCache::slots`].
const CHANGE_SLOTS: usize = 4096;
/// A change that did not say which version it made (a write, a delete, a peer's notice).
const UNKNOWN: u64 = 0;

/// A moment: whole microseconds from [`MetadataCache`]'s epoch plus one, so that a change is
/// never taken for older than it is (it may be taken for up to a microsecond younger), or
/// [`NO_MOMENT`].
type Moment = u64;
/// No change recorded.
const NO_MOMENT: Moment = 0;

/// Where metadata came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The cache, within its TTL.
    Cached,
    /// The upstream, just now.
    Fetched,
    /// The cache, past its TTL, because the upstream failed (`serve_stale_on_error`).
    Stale,
}

impl MetadataCache {
    /// A cache trusting metadata for `ttl` (zero: never cached), holding at most `capacity`
    /// entries.
    /// With `stale_for` > 0, metadata is also kept that much longer than `ttl`, and served
    /// when the upstream fails.
    pub fn new(
        origin: Arc<dyn Upstream>,
        ttl: Duration,
        stale_for: Duration,
        capacity: u64,
    ) -> Self {
        let policy = Policy::defaults(Defaults {
            metadata: ttl,
            ..Defaults::default()
        });
        Self::with_policy(origin, Arc::new(policy), stale_for, capacity)
    }

    /// A cache trusting metadata (and remembering 404s) as `policy` says.
    pub fn with_policy(
        origin: Arc<dyn Upstream>,
        policy: Arc<Policy>,
        stale_for: Duration,
        capacity: u64,
    ) -> Self {
        let caches = policy.caches_metadata();
        Self {
            cache: caches.then(|| expiring(capacity, Duration::ZERO)),
            stale: (!stale_for.is_zero()).then(|| expiring(capacity, stale_for)),
            failing: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(OUTAGE_HELD_FOR)
                .build(),
            missing: policy
                .caches_misses()
                .then(|| expiring(capacity, Duration::ZERO)),
            policy,
            seen: caches.then(|| {
                moka::sync::Cache::builder()
                    .max_capacity(capacity)
                    .support_invalidation_closures()
                    .build()
            }),
            slots: (0..CHANGE_SLOTS)
                .map(|_| KeySlot {
                    changes: Changes::new(),
                    announced: AtomicU64::new(UNKNOWN),
                })
                .collect(),
            bulk: Changes::new(),
            epoch: Instant::now(),
            hasher: Default::default(),
            origin,
            refresh_ahead: false,
            learn_checksums: false,
            refreshing: Default::default(),
            refreshes: Default::default(),
        }
    }

    /// This cache, refreshing metadata read in its [`refresh_window`] behind the reader
    /// (`metadata_refresh_ahead`) when `on`.
    pub fn refreshing_ahead(mut self, on: bool) -> Self {
        self.refresh_ahead = on;
        self
    }

    /// This cache, learning the checksums a cold open's GET could not bring when a client
    /// asks for them (`learn_checksums`) when `on`.
    pub fn learning_checksums(mut self, on: bool) -> Self {
        self.learn_checksums = on;
        self
    }

    /// Refreshes so far, by outcome.
    pub fn refreshes(&self) -> [(Refresh, u64); Refresh::ALL.len()] {
        Refresh::ALL.map(|r| (r, self.refreshes[r as usize].load(Ordering::Relaxed)))
    }

    fn count(&self, outcome: Refresh) {
        self.refreshes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The slot of `id`'s key in the change tables (every version of it shares one).
    fn slot(&self, id: &ObjectId) -> usize {
        let hash = self.hasher.hash_one((&id.bucket, &id.key));
        hash as usize % CHANGE_SLOTS
    }

    /// `id`'s key at the version whose ETag is `etag` (quoted or not), as a change announces
    /// it: never [`UNKNOWN`].
    fn version(&self, id: &ObjectId, etag: &str) -> u64 {
        self.hasher
            .hash_one((&id.bucket, &id.key, etag.trim_matches('"')))
            .max(1)
    }

    /// The change counters a fetch of `id` starts under, for [`MetadataCache::may_keep`].
    fn watch(&self, id: &ObjectId) -> Watch {
        let slot = self.slot(id);
        Watch {
            slot,
            key: self.slots[slot].changes.count(),
            bulk: self.bulk.count(),
            at: Instant::now(),
        }
    }

    /// Whether what a fetch of `id` begun under `watch` brought (metadata with ETag `etag`,
    /// or `None` for an error) may stay cached: nothing changed since, or only its key, to the
    /// very version that change announced. Otherwise it may predate the change: the reader
    /// that fetched it may use it (the two were concurrent), the cache must not keep it.
    fn may_keep(&self, id: &ObjectId, watch: &Watch, etag: Option<&str>) -> bool {
        if self.bulk.count() != watch.bulk {
            return false;
        }
        let slot = &self.slots[watch.slot];
        slot.changes.count() == watch.key
            || etag.is_some_and(|etag| {
                slot.announced.load(Ordering::Acquire) == self.version(id, etag)
            })
    }

    /// `id` changed upstream (a write through Larder, an S3 event, another replica's word):
    /// forget it, including what a fetch running now brings back.
    pub async fn changed(&self, id: &ObjectId) {
        self.changed_to(id, None).await;
    }

    /// [`MetadataCache::changed`], by a change that says it made the version whose ETag is
    /// `etag` (an S3 event's): a fetch running now that brings that very version is kept.
    pub async fn changed_to(&self, id: &ObjectId, etag: Option<&str>) {
        let slot = &self.slots[self.slot(id)];
        let version = etag.map_or(UNKNOWN, |etag| self.version(id, etag));
        // Announced before the count moves: a fetch that sees the count move then reads this
        // announcement or a later one, never an earlier one.
        slot.announced.store(version, Ordering::Release);
        slot.changes.record(self.now());
        self.invalidate(id).await;
    }

    /// Now, as a [`Moment`] (never [`NO_MOMENT`]).
    fn now(&self) -> Moment {
        u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// How long ago this replica last learnt that `id` (or anything sharing its slot, or a
    /// whole bucket) changed; `None` if it never did. An owner asked for the object is told
    /// it ([`MetadataCache::forget_older_than`]).
    pub fn since_change(&self, id: &ObjectId) -> Option<Duration> {
        let last = self.slots[self.slot(id)].changes.at().max(self.bulk.at());
        (last != NO_MOMENT).then(|| Duration::from_micros(self.now().saturating_sub(last)))
    }

    /// Another replica learnt `ago` that `id` changed, and this one may not have been told yet
    /// (the notices go out one by one): what it holds of `id` from before then (metadata, or a
    /// remembered 404) is dropped, as the notice will drop it, before it answers that replica.
    pub async fn forget_older_than(&self, id: &ObjectId, ago: Duration) {
        let meta = match &self.cache {
            Some(cache) => cache.get(id).await.map(|e| e.fetched),
            None => None,
        };
        let missing = match &self.missing {
            Some(missing) => missing.get(id).await.map(|m| m.fetched),
            None => None,
        };
        if meta.into_iter().chain(missing).any(|at| at.elapsed() > ago) {
            self.changed(id).await;
        }
    }

    /// The ETag cached for `id`, if any, without asking the upstream.
    pub async fn cached_etag(&self, id: &ObjectId) -> Option<Arc<str>> {
        let cache = self.cache.as_ref()?;
        cache.get(id).await.map(|e| e.meta.etag.clone())
    }

    /// The object's metadata, and where it came from.
    pub async fn get(
        self: &Arc<Self>,
        id: &ObjectId,
    ) -> Result<(Arc<ObjectMeta>, Source), UpstreamError> {
        let (entry, source) = self
            .lookup(id, self.head_fetch(id), None)
            .await
            .map_err(|(e, _)| e)?;
        Ok((entry.meta, source))
    }

    /// What a HEAD of `id` says, taken to be said when it is sent.
    async fn head_fetch(&self, id: &ObjectId) -> Result<Fetched, (UpstreamError, bool)> {
        let at = Instant::now();
        let meta = self.head(id).await.map_err(|e| (e, true))?;
        Ok(Fetched { meta, at })
    }

    /// Whether nothing is known of `id` (never fetched, or forgotten since), so that its first
    /// read may use [`MetadataCache::get_or_open`]. Never with a zero TTL: every read then asks
    /// the upstream, and a HEAD is the cheap way.
    pub fn is_unknown(&self, id: &ObjectId) -> bool {
        self.seen.as_ref().is_some_and(|s| !s.contains_key(id)) && !self.trust(id).ttl.is_zero()
    }

    fn trust(&self, id: &ObjectId) -> Trust {
        self.policy.metadata(&id.bucket, &id.key)
    }

    /// Like [`MetadataCache::get`], but the metadata comes from `open` (a GET that also brings
    /// a block, here or at the replica owning it), or from a HEAD when `open` says its answer
    /// cannot stand for one. `open` also says how old its metadata already is (learnt from
    /// another replica's cache), and it is trusted only for what remains of the TTL. Concurrent
    /// callers share one `open`. The error says whether it came from a HEAD (which has no
    /// error code).
    pub async fn get_or_open(
        self: &Arc<Self>,
        id: &ObjectId,
        open: impl std::future::Future<Output = Result<Option<(ObjectMeta, Duration)>, UpstreamError>>,
    ) -> Result<(Arc<ObjectMeta>, Source), (UpstreamError, bool)> {
        let (meta, source, _) = self.get_or_open_aged(id, open, None).await?;
        Ok((meta, source))
    }

    /// [`MetadataCache::get_or_open`], also saying how long ago the upstream said it (what a
    /// replica asked by another passes on). `changed_at`: when a replica asking this one
    /// learnt that the object changed, which this one may not have been told yet; a fetch
    /// begun before then is not joined ([`MetadataCache::lookup`]).
    pub async fn get_or_open_aged(
        self: &Arc<Self>,
        id: &ObjectId,
        open: impl std::future::Future<Output = Result<Option<(ObjectMeta, Duration)>, UpstreamError>>,
        changed_at: Option<Instant>,
    ) -> Result<(Arc<ObjectMeta>, Source, Duration), (UpstreamError, bool)> {
        let fetch = async {
            // Taken before the open is sent: what it brings is trusted from then, never longer,
            // and the age a replica asking this one is told is never short.
            let started = Instant::now();
            let since_change = self.since_change(id);
            let opened = open.await.map_err(|e| (e, false))?;
            // Another replica had it cached since before this one learnt that the object
            // changed (the change's notice may not have reached it yet): it may be the old
            // version, which must not be served, let alone kept for the rest of the TTL.
            let opened = opened.filter(|(_, age)| {
                let older = since_change.is_some_and(|since| *age > since);
                if older {
                    tracing::debug!(object = %id, ?age, ?since_change, "metadata from before a change: asking the upstream");
                }
                !older
            });
            match opened {
                Some((meta, age)) => Ok(Fetched {
                    meta: Arc::new(meta),
                    at: started.checked_sub(age).unwrap_or(started),
                }),
                None => self.head_fetch(id).await,
            }
        };
        let (entry, source) = self.lookup(id, fetch, changed_at).await?;
        Ok((entry.meta, source, entry.fetched.elapsed()))
    }

    /// The entry of `id`: cached, or fetched with `fetch`, concurrent callers sharing one
    /// fetch. A caller that came after a change (counted here, or learnt at `changed_at` by
    /// the replica asking), and found a fetch begun before it, asks again, with a HEAD: that
    /// fetch may bring what the change replaced (the 404 of an object just written, say),
    /// which a read begun after the change must not get. The caller that began it may take
    /// it: the two were concurrent. Asked again once only,
    /// so changes in a row cannot keep a reader waiting (and a key sharing the change slot of
    /// another that changed costs one HEAD more, not a wrong answer).
    async fn lookup(
        self: &Arc<Self>,
        id: &ObjectId,
        fetch: impl std::future::Future<Output = Result<Fetched, (UpstreamError, bool)>>,
        changed_at: Option<Instant>,
    ) -> Result<(Entry, Source), (UpstreamError, bool)> {
        match self
            .lookup_once(id, fetch, Join::NotBeforeAChange(changed_at))
            .await
        {
            Ok(found) => return Ok(found),
            Err(Lookup::Failed(e, from_head)) => return Err((e, from_head)),
            Err(Lookup::BeganBeforeAChange) => {}
        }
        // What that fetch brings is not kept either (`may_keep`, in the caller that began it);
        // dropped here too, so that this caller's HEAD does not find it cached. (Boxed, like
        // every path a hit does not take: see `lookup_once`.)
        Box::pin(async {
            self.invalidate(id).await;
            match self.lookup_once(id, self.head_fetch(id), Join::Any).await {
                Ok(found) => Ok(found),
                Err(Lookup::Failed(e, from_head)) => Err((e, from_head)),
                // Told to take any fetch's answer, it never says this.
                Err(Lookup::BeganBeforeAChange) => Err((UpstreamError::Abandoned, false)),
            }
        })
        .await
    }

    /// `id`'s metadata when it is cached and may still be served: what [`MetadataCache::get`]
    /// would answer without asking anyone, with the same side effects (a refresh-ahead when
    /// due, an entry past what may be trusted dropped). `None` asks nothing upstream either;
    /// the caller goes on to [`MetadataCache::get`] or [`MetadataCache::get_or_open`]. A hit
    /// then costs one lookup, before the questions only a miss needs ([`Self::is_unknown`]).
    pub async fn cached(self: &Arc<Self>, id: &ObjectId) -> Option<Arc<ObjectMeta>> {
        self.hit(id).await.map(|entry| entry.meta)
    }

    /// The cache's entry for `id`, if it may be served now.
    async fn hit(self: &Arc<Self>, id: &ObjectId) -> Option<Entry> {
        let cache = self.cache.as_ref()?;
        let entry = cache.get(id).await?;
        // Past what may be trusted now (the event stream went quiet): revalidated.
        if self.policy.expects_events()
            && entry.fetched.elapsed() > self.policy.max_age(entry.trust)
        {
            Box::pin(cache.invalidate(id)).await;
            return None;
        }
        if self.refresh_ahead {
            self.refresh_if_due(id, &entry);
        }
        Some(entry)
    }

    /// One look for [`MetadataCache::lookup`]: [`Lookup::BeganBeforeAChange`] when the fetch
    /// joined is one `join` does not allow.
    async fn lookup_once(
        self: &Arc<Self>,
        id: &ObjectId,
        fetch: impl std::future::Future<Output = Result<Fetched, (UpstreamError, bool)>>,
        join: Join,
    ) -> Result<(Entry, Source), Lookup> {
        if let Some(entry) = self.hit(id).await {
            return Ok((entry, Source::Cached));
        }
        // Boxed: the futures of a miss (the cache's insert, the flight, the stale copy's) are
        // many kilobytes, and a future holds room for every path it may take. Inline, every
        // hit's request future would carry them, and be copied whole as it is moved and boxed
        // (docs/benchmarks.md, "Request futures").
        Box::pin(self.fetch_once(id, fetch, join)).await
    }

    /// What [`MetadataCache::lookup_once`] does when `id` is not cached.
    async fn fetch_once(
        self: &Arc<Self>,
        id: &ObjectId,
        fetch: impl std::future::Future<Output = Result<Fetched, (UpstreamError, bool)>>,
        join: Join,
    ) -> Result<(Entry, Source), Lookup> {
        if let Some(missing) = &self.missing {
            if let Some(m) = missing.get(id).await {
                if m.fetched.elapsed() <= self.policy.negative_ttl(&id.bucket, &id.key) {
                    return Err(Lookup::Failed(m.error, m.from_head));
                }
            }
        }
        // The upstream was failing when last asked: stale again, without waiting for it; asked
        // again behind the read once a second.
        if let Some(stale) = &self.stale {
            if let Some(failed) = self.failing.get(id) {
                if let Some(entry) = stale.get(id).await {
                    if failed.elapsed() >= STALE_RETRY_AFTER
                        && !self.refresh_behind(id, &entry.meta.etag)
                    {
                        // No room to ask now ([`Refresh::Busy`]): tried again a second later,
                        // so a hot object counts one skip a second, not one per read.
                        self.failing.insert(id.clone(), Instant::now());
                    }
                    return Ok((entry, Source::Stale));
                }
            }
        }
        // Read only on a miss: a hit needs no change counter (nor the hash that finds it).
        let watch = self.watch(id);
        let flight = async {
            let began = self.watch(id);
            match fetch.await {
                Ok(Fetched { meta, at }) => Ok(Entry {
                    meta,
                    fetched: at,
                    trust: self.trust(id),
                    shared: Default::default(),
                    began,
                }),
                Err((e, from_head)) => Err((e, from_head, began)),
            }
        };
        let fetched: Result<Entry, FlightError> = match &self.cache {
            None => flight.await,
            Some(cache) => cache
                .try_get_with(id.clone(), flight)
                .await
                .map_err(|e| (*e).clone()),
        };
        // The fetch this caller joined began before a change it came after.
        let began = match &fetched {
            Ok(entry) => entry.began,
            Err((_, _, began)) => *began,
        };
        if let Join::NotBeforeAChange(changed_at) = join {
            if began.changed_before(&watch) || changed_at.is_some_and(|at| began.at < at) {
                return Err(Lookup::BeganBeforeAChange);
            }
        }
        let fetched = fetched.map_err(|(e, from_head, _)| (e, from_head));
        let answer = match (fetched, &self.stale) {
            (Ok(meta), Some(stale)) => {
                stale.insert(id.clone(), meta.clone()).await;
                // The upstream answers again: no more stale copies of this one.
                self.failing.invalidate(id);
                Ok((meta, Source::Fetched))
            }
            (Ok(meta), None) => Ok((meta, Source::Fetched)),
            (Err((e, from_head)), Some(stale)) if e.is_outage() => match stale.get(id).await {
                Some(meta) => {
                    tracing::warn!(object = %id, error = %e, "upstream failing: serving stale metadata");
                    self.failing.insert(id.clone(), Instant::now());
                    Ok((meta, Source::Stale))
                }
                None => Err((e, from_head)),
            },
            (Err(e), _) => Err(e),
        };
        if let (Ok((_, Source::Fetched)), Some(seen)) = (&answer, &self.seen) {
            seen.insert(id.clone(), ());
        }
        if let Err((e, from_head)) = &answer {
            if e.is_not_found() {
                self.remember_missing(id, e.clone(), *from_head).await;
            }
        }
        let etag = match &answer {
            Ok((entry, Source::Fetched)) => Some(&*entry.meta.etag),
            _ => None,
        };
        if !self.may_keep(id, &watch, etag) {
            self.invalidate(id).await;
        }
        answer.map_err(|(e, from_head)| Lookup::Failed(e, from_head))
    }

    /// Whether [`MetadataCache::learn_checksums`] would send a HEAD at all: the caller then
    /// need not look for what it would ask.
    pub fn learns_checksums(&self) -> bool {
        self.learn_checksums && self.cache.is_some()
    }

    /// A client asked for `id`'s checksums with a whole read, answered from metadata that
    /// could not carry them ([`ObjectMeta::checksums_known`]: a cold open's ranged GET). Sends
    /// the HEAD that brings them behind the reader, as a refresh-ahead does (one per object at
    /// a time, counted with the refreshes), once per cached entry; the reads after it are
    /// answered with them. The read that opened the object does not call this: an object read
    /// once costs no HEAD.
    pub async fn learn_checksums(self: &Arc<Self>, id: &ObjectId) {
        let (true, Some(cache)) = (self.learns_checksums(), &self.cache) else {
            return;
        };
        let Some(entry) = cache.get(id).await else {
            return;
        };
        if entry.meta.checksums_known || entry.shared.checksums_asked.swap(true, Ordering::Relaxed)
        {
            return;
        }
        if !self.refresh_behind(id, &entry.meta.etag) {
            // No room now ([`Refresh::Busy`]): a later read asks again.
            entry.shared.checksums_asked.store(false, Ordering::Relaxed);
        }
    }

    /// Start revalidating `id` behind the reader if `entry` is in the [`refresh_window`] of
    /// what it may be trusted for now, has served [`REFRESH_AFTER_READS`] reads, and no refresh of it
    /// is under way.
    fn refresh_if_due(self: &Arc<Self>, id: &ObjectId, entry: &Entry) {
        if entry.trust.immutable {
            return;
        }
        let reads = entry.shared.reads.fetch_add(1, Ordering::Relaxed) + 1;
        let max_age = self.policy.max_age(entry.trust);
        if reads < REFRESH_AFTER_READS
            || entry.fetched.elapsed() < max_age - refresh_window(max_age)
            || self
                .failing
                .get(id)
                .is_some_and(|failed| failed.elapsed() < STALE_RETRY_AFTER)
        {
            return;
        }
        self.refresh_behind(id, &entry.meta.etag);
    }

    /// Revalidate `id`, cached at `etag`, behind the reader, unless it is being revalidated
    /// already or [`MAX_REFRESHES`] are (then counted [`Refresh::Busy`], and false).
    fn refresh_behind(self: &Arc<Self>, id: &ObjectId, etag: &str) -> bool {
        {
            let mut refreshing = self.refreshing.lock();
            if refreshing.contains(id) {
                return true;
            }
            if refreshing.len() >= MAX_REFRESHES {
                drop(refreshing);
                self.count(Refresh::Busy);
                return false;
            }
            refreshing.insert(id.clone());
        }
        let this = self.clone();
        let id = id.clone();
        let etag = etag.to_owned();
        tokio::spawn(async move {
            let outcome = this.refresh(&id, &etag).await;
            this.refreshing.lock().remove(&id);
            this.count(outcome);
        });
        true
    }

    /// Revalidate `id`, cached at `etag`, with a HEAD, and cache what it says as a read that
    /// found the entry expired would have.
    async fn refresh(&self, id: &ObjectId, etag: &str) -> Refresh {
        let watch = self.watch(id);
        // Taken before the HEAD is sent: the answer is trusted from then, never longer.
        let fetched = Instant::now();
        let meta = match self.head(id).await {
            Ok(meta) => meta,
            Err(e) if e.is_not_found() => {
                self.invalidate(id).await;
                return Refresh::Gone;
            }
            Err(e) => {
                tracing::debug!(object = %id, error = %e, "metadata refresh failed");
                if e.is_outage() {
                    self.failing.insert(id.clone(), Instant::now());
                } else {
                    // An answer (a 403, say): the next read asks and gets it, not a stale copy.
                    self.failing.invalidate(id);
                }
                return Refresh::Failed;
            }
        };
        let outcome = if &*meta.etag == etag {
            Refresh::Unchanged
        } else {
            Refresh::Changed
        };
        let entry = Entry {
            meta,
            fetched,
            trust: self.trust(id),
            shared: Default::default(),
            began: watch,
        };
        for cache in self.cache.iter().chain(&self.stale) {
            cache.insert(id.clone(), entry.clone()).await;
        }
        self.failing.invalidate(id);
        if !self.may_keep(id, &watch, Some(&entry.meta.etag)) {
            self.invalidate(id).await;
            return Refresh::Failed;
        }
        outcome
    }

    /// Remember that `id` does not exist, for `negative_ttl` (if it is on here): `error` is
    /// the upstream's answer, refined with S3's code when a HEAD's bare 404 was explained.
    pub async fn remember_missing(&self, id: &ObjectId, error: UpstreamError, from_head: bool) {
        let Some(missing) = &self.missing else {
            return;
        };
        let ttl = self.policy.negative_ttl(&id.bucket, &id.key);
        if ttl.is_zero() {
            return;
        }
        let entry = Missing {
            error,
            from_head,
            fetched: Instant::now(),
            ttl,
        };
        missing.insert(id.clone(), entry).await;
    }

    /// Forget what is known of `id` (it changed upstream).
    pub async fn invalidate(&self, id: &ObjectId) {
        for cache in self.cache.iter().chain(&self.stale) {
            cache.invalidate(id).await;
        }
        if let Some(missing) = &self.missing {
            missing.invalidate(id).await;
        }
        if let Some(seen) = &self.seen {
            seen.invalidate(id);
        }
        self.failing.invalidate(id);
    }

    /// Forget every object of `bucket` (a write that names its keys only in its body).
    pub fn invalidate_bucket(&self, bucket: &str) {
        // Counted before the entries go, as in `changed_to`.
        self.bulk.record(self.now());
        for cache in self.cache.iter().chain(&self.stale) {
            let bucket: Arc<str> = bucket.into();
            // Fails only if closures were not enabled at build time, which they are.
            let _ = cache.invalidate_entries_if(move |id, _| id.bucket == bucket);
        }
        if let Some(missing) = &self.missing {
            let bucket: Arc<str> = bucket.into();
            let _ = missing.invalidate_entries_if(move |id, _| id.bucket == bucket);
        }
        if let Some(seen) = &self.seen {
            let bucket: Arc<str> = bucket.into();
            let _ = seen.invalidate_entries_if(move |id, _| id.bucket == bucket);
        }
    }

    async fn head(&self, id: &ObjectId) -> Result<Arc<ObjectMeta>, UpstreamError> {
        self.origin.head(id).await.map(Arc::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::memory::MemoryUpstream;
    use std::sync::atomic::Ordering;

    /// A cache over an upstream holding one object, `b/k`, with `body` under `etag`.
    fn one_object(
        body: &'static [u8],
        etag: &str,
        ttl: Duration,
        stale_for: Duration,
    ) -> (Arc<MemoryUpstream>, Arc<MetadataCache>, ObjectId) {
        let origin = Arc::new(MemoryUpstream::default());
        origin.put("k", bytes::Bytes::from_static(body), etag);
        let cache = Arc::new(MetadataCache::new(origin.clone(), ttl, stale_for, 100));
        let id = ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        };
        (origin, cache, id)
    }

    /// [`one_object`] (`data` at `"e"`) cached with a 50 ms TTL and kept `stale_for` longer
    /// for outages, then expired, and its upstream down.
    async fn expired_in_an_outage(
        stale_for: Duration,
    ) -> (Arc<MemoryUpstream>, Arc<MetadataCache>, ObjectId) {
        let (origin, cache, id) =
            one_object(b"data", "\"e\"", Duration::from_millis(50), stale_for);
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Fetched);
        tokio::time::sleep(Duration::from_millis(100)).await;
        origin.outage.store(true, Ordering::SeqCst);
        (origin, cache, id)
    }

    /// [`one_object`] (`v1` at `"e1"`, no stale serving) with refresh-ahead on.
    fn refreshing_object(ttl: Duration) -> (Arc<MemoryUpstream>, Arc<MetadataCache>, ObjectId) {
        let (origin, cache, id) = one_object(b"v1", "\"e1\"", ttl, Duration::ZERO);
        let cache = Arc::into_inner(cache).expect("the only handle");
        (origin, Arc::new(cache.refreshing_ahead(true)), id)
    }

    #[tokio::test]
    async fn a_named_version_expires_with_the_ttl_like_the_latest() {
        let origin = Arc::new(MemoryUpstream::default());
        origin.put("k", bytes::Bytes::from_static(b"data"), "\"e\"");
        let cache = Arc::new(MetadataCache::new(
            origin.clone(),
            Duration::from_millis(50),
            Duration::ZERO,
            100,
        ));
        let cached =
            |r: Result<(Arc<ObjectMeta>, Source), UpstreamError>| r.unwrap().1 == Source::Cached;
        let id = |version: Option<&str>| ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: version.map(Arc::from),
        };
        for v in [None, Some("v1")] {
            assert!(!cached(cache.get(&id(v)).await));
            assert!(cached(cache.get(&id(v)).await));
        }
        assert_eq!(origin.heads.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !cached(cache.get(&id(Some("v1"))).await),
            "a version can be deleted behind Larder's back: revalidated"
        );
        assert!(!cached(cache.get(&id(None)).await), "the latest expires");
        assert_eq!(origin.heads.load(Ordering::SeqCst), 4);
        cache.invalidate(&id(Some("v1"))).await;
        assert!(!cached(cache.get(&id(Some("v1"))).await));
        cache.invalidate_bucket("b");
        assert!(!cached(cache.get(&id(None)).await));
    }

    #[tokio::test]
    async fn cached_answers_what_get_would_without_asking_and_nothing_stale_or_expired() {
        let (origin, cache, id) =
            one_object(b"data", "\"e\"", Duration::from_millis(100), Duration::ZERO);
        assert!(cache.cached(&id).await.is_none(), "nothing fetched yet");
        assert_eq!(origin.heads.load(Ordering::SeqCst), 0, "and nothing asked");
        cache.get(&id).await.unwrap();
        let heads = origin.heads.load(Ordering::SeqCst);
        let meta = cache.cached(&id).await.expect("cached after a get");
        assert_eq!(&*meta.etag, "\"e\"");
        assert_eq!(origin.heads.load(Ordering::SeqCst), heads);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(cache.cached(&id).await.is_none(), "past the TTL");
        let (origin, cache, id) = expired_in_an_outage(Duration::from_secs(60)).await;
        assert!(
            cache.cached(&id).await.is_none(),
            "a stale copy is not a hit"
        );
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Stale);
        drop(origin);
    }

    #[tokio::test]
    async fn metadata_learnt_with_an_age_is_trusted_only_for_the_rest_of_the_ttl() {
        let (origin, cache, id) =
            one_object(b"data", "\"e\"", Duration::from_millis(400), Duration::ZERO);
        let meta = origin.head(&id).await.unwrap();
        // Another replica had it from the upstream 300 ms ago: 100 ms of the TTL are left.
        let open = async { Ok(Some((meta, Duration::from_millis(300)))) };
        let (_, source, age) = cache.get_or_open_aged(&id, open, None).await.unwrap();
        assert_eq!(source, Source::Fetched);
        assert!(age >= Duration::from_millis(300), "{age:?}");
        let heads = origin.heads.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            cache.get(&id).await.unwrap().1,
            Source::Fetched,
            "expired early"
        );
        assert_eq!(origin.heads.load(Ordering::SeqCst), heads + 1);
    }

    #[tokio::test]
    async fn stale_metadata_is_served_only_in_an_outage_and_only_for_so_long() {
        let (origin, cache, id) = expired_in_an_outage(Duration::from_millis(300)).await;
        let (meta, source) = cache.get(&id).await.unwrap();
        assert_eq!((source, &*meta.etag), (Source::Stale, "\"e\""));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            cache.get(&id).await.is_err(),
            "older than ttl + stale window"
        );
        // A 404 is an answer, not an outage: never covered by stale data.
        origin.outage.store(false, Ordering::SeqCst);
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Fetched);
        origin.delete("k");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(cache.get(&id).await.unwrap_err().is_not_found());
    }

    #[tokio::test]
    async fn a_failing_upstream_is_asked_once_a_second_not_once_per_read() {
        // A hot object's metadata expires while the upstream is down: its reads are served
        // stale, only the first asks the upstream and waits for it; after that, one read a
        // second starts a revalidation behind it, and no read waits.
        let (origin, cache, id) = expired_in_an_outage(Duration::from_secs(60)).await;
        let heads = || origin.heads.load(Ordering::SeqCst);
        let before = heads();
        for _ in 0..50 {
            assert_eq!(cache.get(&id).await.unwrap().1, Source::Stale);
        }
        assert_eq!(heads(), before + 1, "one HEAD for 50 reads");
        assert_eq!(
            refreshed(&cache, Refresh::Failed),
            0,
            "that one in the read"
        );
        tokio::time::sleep(STALE_RETRY_AFTER + Duration::from_millis(100)).await;
        for _ in 0..50 {
            assert_eq!(cache.get(&id).await.unwrap().1, Source::Stale);
        }
        refresh_ends(&cache, Refresh::Failed).await;
        assert_eq!(heads(), before + 2, "asked again a second later, once");
        // Back up: the next read due to ask is served stale at once and revalidates behind
        // itself; the reads after it have the fresh answer.
        origin.outage.store(false, Ordering::SeqCst);
        tokio::time::sleep(STALE_RETRY_AFTER + Duration::from_millis(100)).await;
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Stale);
        refresh_ends(&cache, Refresh::Unchanged).await;
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Cached);
        // Nothing asked while the upstream stayed down: past OUTAGE_HELD_FOR the next read
        // asks and waits again, as the outage's first did (not tested: 10 s).
    }

    #[tokio::test]
    async fn a_stale_read_with_no_room_to_revalidate_counts_one_skip_a_second() {
        // Every refresh slot is taken (more hot objects than MAX_REFRESHES in an outage):
        // the reads past the object's second are served stale, and one skip is counted for
        // them, not one per read; a second later the next is.
        let (_origin, cache, id) = expired_in_an_outage(Duration::from_secs(60)).await;
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Stale);
        let others = (0..MAX_REFRESHES).map(|i| ObjectId {
            bucket: "b".into(),
            key: format!("other-{i}").into(),
            version_id: None,
        });
        cache.refreshing.lock().extend(others);
        for round in 1..=2 {
            tokio::time::sleep(STALE_RETRY_AFTER + Duration::from_millis(100)).await;
            for _ in 0..50 {
                assert_eq!(cache.get(&id).await.unwrap().1, Source::Stale);
            }
            assert_eq!(refreshed(&cache, Refresh::Busy), round);
        }
    }

    #[tokio::test]
    async fn an_answer_other_than_an_outage_ends_stale_serving_at_once() {
        // A revalidation behind a stale read gets a 404: the next read gets it too.
        let (origin, cache, id) = expired_in_an_outage(Duration::from_secs(60)).await;
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Stale);
        origin.outage.store(false, Ordering::SeqCst);
        origin.delete("k");
        tokio::time::sleep(STALE_RETRY_AFTER + Duration::from_millis(100)).await;
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Stale);
        refresh_ends(&cache, Refresh::Gone).await;
        assert!(cache.get(&id).await.unwrap_err().is_not_found());
    }

    #[tokio::test]
    async fn metadata_fetched_across_a_change_is_used_once_and_not_kept() {
        // The object changes (an S3 event), or its whole bucket does (a DeleteObjects through
        // Larder names its keys only in its body), while its metadata is being fetched.
        for bucket_wide in [false, true] {
            let (origin, cache, id) =
                one_object(b"v1", "\"e1\"", Duration::from_secs(3600), Duration::ZERO);
            let meta = origin.head(&id).await.unwrap();
            let open = async {
                if bucket_wide {
                    cache.invalidate_bucket("b");
                } else {
                    cache.changed(&id).await;
                }
                Ok(Some((meta, Duration::ZERO)))
            };
            let (got, source) = cache.get_or_open(&id, open).await.unwrap();
            assert_eq!((&*got.etag, source), ("\"e1\"", Source::Fetched));
            assert_eq!(
                cache.cached_etag(&id).await,
                None,
                "not kept past the change (bucket-wide: {bucket_wide})"
            );
            // Fetched with no change in between, it is kept.
            cache.get(&id).await.unwrap();
            assert_eq!(cache.cached_etag(&id).await.as_deref(), Some("\"e1\""));
        }
    }

    #[tokio::test]
    async fn a_read_after_a_write_does_not_join_a_fetch_begun_before_it() {
        // A reader's GET of a key not yet written is under way when the key is written (through
        // Larder: the change is counted here; or through another replica, which says so when it
        // asks this one: `changed_at`). A second reader, come after the write, must not be
        // answered by that GET's 404. The first may: it was concurrent with the write.
        for told_by_the_asker in [false, true] {
            let (origin, cache, id) =
                one_object(b"v1", "\"e1\"", Duration::from_secs(3600), Duration::ZERO);
            origin.delete("k");
            let (began_tx, began) = tokio::sync::oneshot::channel();
            let (answer, answered) = tokio::sync::oneshot::channel::<()>();
            let first = tokio::spawn({
                let (cache, id) = (cache.clone(), id.clone());
                async move {
                    let open = async {
                        let _ = began_tx.send(());
                        let _ = answered.await;
                        Err(UpstreamError::Service {
                            status: 404,
                            code: "NoSuchKey".into(),
                            message: "not yet".into(),
                        })
                    };
                    cache.get_or_open(&id, open).await
                }
            });
            began.await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
            origin.put("k", bytes::Bytes::from_static(b"v1"), "\"e1\"");
            let changed_at = if told_by_the_asker {
                Some(Instant::now())
            } else {
                cache.changed(&id).await;
                None
            };
            let second = tokio::spawn({
                let (cache, id) = (cache.clone(), id.clone());
                async move {
                    // Not sent while the first reader's GET is under way: the second joins it.
                    let open = async { Ok(None) };
                    cache.get_or_open_aged(&id, open, changed_at).await
                }
            });
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
            answer.send(()).unwrap();
            let first = first.await.unwrap();
            assert!(first.is_err_and(|(e, _)| e.is_not_found()));
            let (meta, _, _) = second
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("told by the asker: {told_by_the_asker}: {e:?}"));
            assert_eq!(&*meta.etag, "\"e1\"");
            // One HEAD: the second reader's, asked again after the GET it had joined.
            assert_eq!(origin.heads.load(Ordering::SeqCst), 1);
        }
    }

    #[tokio::test]
    async fn another_replicas_metadata_older_than_a_change_known_here_is_not_taken() {
        // This replica was told that `b/k` changed; the replica owning it may not have been
        // yet, and answers an open with what it cached before. That answer is older than the
        // change, so the upstream is asked instead: v1 is what it holds now. An answer younger
        // than the change is taken, and before any change any age is (within the TTL).
        let (origin, cache, id) =
            one_object(b"v1", "\"e1\"", Duration::from_secs(3600), Duration::ZERO);
        let mut old = origin.head(&id).await.unwrap();
        old.etag = "\"e0\"".into();
        let open = |age: Duration| {
            let old = old.clone();
            async move { Ok(Some((old, age))) }
        };
        let (got, _) = cache
            .get_or_open(&id, open(Duration::from_secs(30)))
            .await
            .unwrap();
        assert_eq!(&*got.etag, "\"e0\"", "no change known: taken");

        cache.changed(&id).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (got, source) = cache
            .get_or_open(&id, open(Duration::from_millis(200)))
            .await
            .unwrap();
        assert_eq!((&*got.etag, source), ("\"e1\"", Source::Fetched));
        assert_eq!(cache.cached_etag(&id).await.as_deref(), Some("\"e1\""));

        cache.invalidate(&id).await;
        let (got, _) = cache
            .get_or_open(&id, open(Duration::from_millis(1)))
            .await
            .unwrap();
        assert_eq!(
            &*got.etag, "\"e0\"",
            "cached after the change was learnt: taken"
        );

        // A whole bucket's change counts too.
        cache.invalidate_bucket("b");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (got, _) = cache
            .get_or_open(&id, open(Duration::from_millis(200)))
            .await
            .unwrap();
        assert_eq!(&*got.etag, "\"e1\"");
    }

    #[tokio::test]
    async fn metadata_fetched_across_an_event_announcing_its_own_version_is_kept() {
        // A write straight to the bucket, read at once through Larder: the write's event often
        // arrives while that first read's GET is in flight. What the GET brings is the version
        // the event announces, so it stays cached; any other version is dropped as before.
        let (origin, cache, id) =
            one_object(b"v1", "\"e1\"", Duration::from_secs(3600), Duration::ZERO);
        let meta = origin.head(&id).await.unwrap();
        let across = |announced: Option<&'static str>| {
            let (cache, meta) = (&cache, meta.clone());
            let id = id.clone();
            async move {
                cache.invalidate(&id).await;
                let open = async {
                    cache.changed_to(&id, announced).await;
                    Ok(Some((meta.clone(), Duration::ZERO)))
                };
                let (_, source) = cache.get_or_open(&id, open).await.unwrap();
                assert_eq!(source, Source::Fetched);
                cache.cached_etag(&id).await
            }
        };
        assert_eq!(across(Some("e1")).await.as_deref(), Some("\"e1\""));
        assert_eq!(across(Some("\"e1\"")).await.as_deref(), Some("\"e1\""));
        assert_eq!(across(Some("e2")).await, None, "another version announced");
        assert_eq!(across(None).await, None, "a change naming no version");
        // A version is its key's: the same ETag announced for another key (which may share
        // the slot) is not this key's version.
        let other = ObjectId {
            key: "other".into(),
            ..id.clone()
        };
        assert_ne!(cache.version(&id, "e1"), cache.version(&other, "e1"));
    }

    #[tokio::test]
    async fn a_lookup_does_not_carry_the_futures_of_a_miss() {
        // Every read's request future holds the lookup's; a future holds room for every path
        // it may take and is copied whole whenever it is moved or boxed, so the miss path
        // (kilobytes of the cache's futures) is boxed where it starts, not held inline.
        let (_, cache, id) = one_object(b"x", "e", Duration::from_secs(60), Duration::ZERO);
        let lookup = std::mem::size_of_val(&cache.get(&id));
        let miss = std::mem::size_of_val(&cache.fetch_once(&id, cache.head_fetch(&id), Join::Any));
        assert!(
            lookup < miss,
            "a lookup's future ({lookup} bytes) holds its miss path's ({miss})"
        );
    }

    #[tokio::test]
    async fn a_404_is_remembered_for_negative_ttl_and_dropped_by_a_change() {
        let origin = Arc::new(MemoryUpstream::default());
        let policy = Policy::defaults(Defaults {
            metadata: Duration::from_secs(3600),
            negative: Duration::from_secs(3600),
            ..Defaults::default()
        });
        let cache = Arc::new(MetadataCache::with_policy(
            origin.clone(),
            Arc::new(policy),
            Duration::ZERO,
            100,
        ));
        let id = ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        };
        for _ in 0..3 {
            assert!(cache.get(&id).await.unwrap_err().is_not_found());
        }
        assert_eq!(
            origin.heads.load(Ordering::SeqCst),
            1,
            "one HEAD for three 404s"
        );
        // Written (through Larder, or an event says so): found at once.
        origin.put("k", bytes::Bytes::from_static(b"now"), "\"e\"");
        cache.changed(&id).await;
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Fetched);
        // Off by default: every 404 asks again.
        let (origin, cache, id) =
            one_object(b"x", "\"e\"", Duration::from_secs(60), Duration::ZERO);
        origin.delete("k");
        for _ in 0..2 {
            assert!(cache.get(&id).await.unwrap_err().is_not_found());
        }
        assert_eq!(origin.heads.load(Ordering::SeqCst), 2);
    }

    /// Waits (at most 5 s) until `origin` has answered `n` HEADs.
    async fn heads_reach(origin: &MemoryUpstream, n: usize) {
        for _ in 0..500 {
            if origin.heads.load(Ordering::SeqCst) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{n} HEADs never came");
    }

    /// How many refreshes ended with `outcome`.
    fn refreshed(cache: &MetadataCache, outcome: Refresh) -> u64 {
        cache.refreshes()[outcome as usize].1
    }

    /// Waits (at most 5 s) until a refresh has ended with `outcome`.
    async fn refresh_ends(cache: &MetadataCache, outcome: Refresh) {
        for _ in 0..500 {
            if refreshed(cache, outcome) >= 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no refresh ended {outcome:?}");
    }

    /// Metadata a cold open's GET brought cannot carry the checksums: a client asking for them
    /// sends one HEAD behind its read (which then brings them), none once they are known, none
    /// with `learn_checksums` off, and one per entry even when it fails (an upstream refusing
    /// HEADs is not asked on every read).
    #[tokio::test]
    async fn checksums_a_get_could_not_bring_are_learnt_once_behind_a_read() {
        for on in [true, false] {
            let (origin, cache, id) =
                one_object(b"data", "\"e\"", Duration::from_secs(60), Duration::ZERO);
            let cache = Arc::new(Arc::into_inner(cache).unwrap().learning_checksums(on));
            let heads = || origin.heads.load(Ordering::SeqCst);
            // What a ranged GET would have brought.
            let mut opened = origin.head(&id).await.unwrap();
            opened.checksums_known = false;
            let open = async { Ok(Some((opened, Duration::ZERO))) };
            cache.get_or_open(&id, open).await.unwrap();
            let before = heads();
            cache.learn_checksums(&id).await;
            if on {
                refresh_ends(&cache, Refresh::Unchanged).await;
                assert_eq!(heads(), before + 1);
                assert!(cache.cached(&id).await.unwrap().checksums_known);
            }
            cache.learn_checksums(&id).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(heads(), before + usize::from(on), "learning on: {on}");
            assert_eq!(cache.cached(&id).await.unwrap().checksums_known, on);
        }
        let (origin, cache, id) =
            one_object(b"data", "\"e\"", Duration::from_secs(60), Duration::ZERO);
        let cache = Arc::new(Arc::into_inner(cache).unwrap().learning_checksums(true));
        let mut opened = origin.head(&id).await.unwrap();
        opened.checksums_known = false;
        cache
            .get_or_open(&id, async { Ok(Some((opened, Duration::ZERO))) })
            .await
            .unwrap();
        origin.outage.store(true, Ordering::SeqCst);
        let before = origin.heads.load(Ordering::SeqCst);
        cache.learn_checksums(&id).await;
        refresh_ends(&cache, Refresh::Failed).await;
        for _ in 0..5 {
            cache.learn_checksums(&id).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(origin.heads.load(Ordering::SeqCst), before + 1);
        assert!(cache.cached(&id).await.is_some(), "still served");
    }

    #[test]
    fn the_refresh_window_is_a_tenth_of_the_ttl_within_a_second_and_a_quarter() {
        let s = Duration::from_secs;
        for (ttl, window) in [
            (s(3600), s(360)),
            (s(60), s(6)),
            (s(10), s(1)),
            (s(4), s(1)),
        ] {
            assert_eq!(refresh_window(ttl), window, "{ttl:?}");
        }
        assert_eq!(refresh_window(s(2)), Duration::from_millis(500));
    }

    #[tokio::test]
    async fn metadata_read_late_in_its_ttl_is_refreshed_behind_the_reader() {
        let ttl = Duration::from_millis(1200);
        let (origin, cache, id) = refreshing_object(ttl);
        let start = Instant::now();
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Fetched);
        // Early in the TTL: a hit, nothing more.
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Cached);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Cached);
        assert_eq!(origin.heads.load(Ordering::SeqCst), 1);
        // In its refresh window, read often: still a hit, and a HEAD behind it.
        tokio::time::sleep(
            (ttl * 3 / 4 + Duration::from_millis(50)).saturating_sub(start.elapsed()),
        )
        .await;
        for _ in 0..REFRESH_AFTER_READS {
            assert_eq!(cache.get(&id).await.unwrap().1, Source::Cached);
        }
        heads_reach(&origin, 2).await;
        // Past the first answer's TTL, the second one's is trusted: no reader waits.
        tokio::time::sleep((ttl + Duration::from_millis(100)).saturating_sub(start.elapsed()))
            .await;
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Cached);
        assert_eq!(
            origin.heads.load(Ordering::SeqCst),
            2,
            "one HEAD per refresh"
        );
        assert_eq!(refreshed(&cache, Refresh::Unchanged), 1);
    }

    #[tokio::test]
    async fn a_refresh_caches_the_new_version_and_forgets_a_deleted_object() {
        let ttl = Duration::from_millis(400);
        let (origin, cache, id) = refreshing_object(ttl);
        cache.get(&id).await.unwrap();
        origin.put("k", bytes::Bytes::from_static(b"v2"), "\"e2\"");
        tokio::time::sleep(ttl * 3 / 4 + Duration::from_millis(20)).await;
        // Within its TTL the old version is still what may be served...
        for _ in 0..REFRESH_AFTER_READS {
            let (meta, source) = cache.get(&id).await.unwrap();
            assert_eq!((&*meta.etag, source), ("\"e1\"", Source::Cached));
        }
        refresh_ends(&cache, Refresh::Changed).await;
        // ...and the refresh brings the new one.
        let (meta, source) = cache.get(&id).await.unwrap();
        assert_eq!((&*meta.etag, source), ("\"e2\"", Source::Cached));
        // Deleted: the refresh forgets it, and the next read asks.
        origin.delete("k");
        tokio::time::sleep(ttl * 3 / 4 + Duration::from_millis(20)).await;
        for _ in 1..REFRESH_AFTER_READS {
            cache.get(&id).await.unwrap();
        }
        refresh_ends(&cache, Refresh::Gone).await;
        assert_eq!(origin.heads.load(Ordering::SeqCst), 3);
        assert!(cache.get(&id).await.unwrap_err().is_not_found());
    }

    #[tokio::test]
    async fn an_object_read_rarely_is_not_refreshed() {
        let ttl = Duration::from_millis(800);
        let (origin, cache, id) = refreshing_object(ttl);
        cache.get(&id).await.unwrap();
        tokio::time::sleep(ttl * 3 / 4 + Duration::from_millis(20)).await;
        // Its first read in the refresh window: a refresh would most likely be a HEAD for
        // nobody.
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Cached);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(origin.heads.load(Ordering::SeqCst), 1);
        // Read often enough, it is.
        for _ in 1..REFRESH_AFTER_READS {
            assert_eq!(cache.get(&id).await.unwrap().1, Source::Cached);
        }
        heads_reach(&origin, 2).await;
    }

    #[tokio::test]
    async fn a_revalidation_extends_the_stale_copy_too() {
        // Metadata trusted 200 ms, kept 400 ms longer for an outage.
        let (origin, cache, id) = one_object(
            b"v1",
            "\"e1\"",
            Duration::from_millis(200),
            Duration::from_millis(400),
        );
        cache.get(&id).await.unwrap();
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Fetched);
        // 650 ms after the first answer (past its 600 ms), 300 after the second: the stale
        // copy is the second answer's.
        tokio::time::sleep(Duration::from_millis(300)).await;
        origin.outage.store(true, Ordering::SeqCst);
        assert_eq!(cache.get(&id).await.unwrap().1, Source::Stale);
    }
}
