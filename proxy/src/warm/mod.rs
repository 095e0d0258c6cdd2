//! Warm-up jobs: bring an object, a list of keys, a prefix, or byte ranges of them into the disk
//! tier ahead of the job that will read them, without touching the hot memory set.
//!
//! A job lists its objects page by page (so a prefix of millions costs one page of memory),
//! reads each object's metadata, and fetches the blocks the disk tier lacks, `warm_concurrency`
//! at a time and at most `warm_rate` bytes per second, through the same single-flight as client
//! reads (a block a client is fetching is not fetched twice). Jobs report progress and can be
//! cancelled; the blocks already fetched stay cached.
//!
//! A job may also name byte ranges object by object: what an access profile ([`profile`])
//! recorded clients reading.

pub mod cli;
pub mod profile;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::model::{
    range::{self, Resolved},
    ObjectId, UpstreamError,
};
use crate::read::blocks::{BlockStore, Warmed};
use crate::read::metadata::MetadataCache;
use crate::telemetry::metrics::Metrics;
use crate::upstream::Upstream;

/// Most jobs remembered (finished ones are forgotten oldest first).
const KEPT_JOBS: usize = 64;
/// Most jobs running at once.
const MAX_RUNNING: usize = 8;
/// Most keys a request may name.
const MAX_KEYS: usize = 10_000;

/// What to warm: `keys`, a `prefix` or `objects`, one of them.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WarmRequest {
    /// The bucket.
    pub bucket: String,
    /// Keys to warm whole (or `range` of each).
    #[serde(default)]
    pub keys: Vec<String>,
    /// Warm every object whose key starts with this (`""`: the whole bucket).
    #[serde(default)]
    pub prefix: Option<String>,
    /// An HTTP Range (`bytes=0-1023`, `bytes=-65536`) to warm of each object instead of all.
    #[serde(default)]
    pub range: Option<String>,
    /// Objects each with the ranges of it to warm, as an access profile lists them. Left out
    /// when there are none, so that requests of other kinds read as they always did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<WarmObject>,
}

/// One object of a [`WarmRequest`] and the ranges of it to warm.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WarmObject {
    /// The key.
    pub key: String,
    /// HTTP Ranges (`bytes=0-1023`) to warm of it; none: the whole object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<String>,
}

/// Why a warm-up request was refused.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    /// The request names nothing, or too much.
    #[error("{0}")]
    Invalid(String),
    /// Too many jobs are running.
    #[error("{MAX_RUNNING} warm-up jobs are running already; wait for one to finish")]
    Busy,
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Listing and fetching.
    Running,
    /// Finished; `errors` says whether every object made it.
    Done,
    /// Stopped by an error that ended the whole job (the listing failed).
    Failed,
    /// Stopped by a cancel request.
    Cancelled,
}

/// A job's progress, as the admin API reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress {
    /// The job's id.
    pub id: String,
    /// What it warms, its list of `objects` left out (`objects_total` counts them).
    pub request: WarmRequest,
    /// Where it is.
    pub state: State,
    /// Whether every object to warm has been found (a prefix is listed as the job goes).
    pub listing_done: bool,
    /// Objects found so far.
    pub objects_total: u64,
    /// Objects finished (warmed, already cached, or failed).
    pub objects_done: u64,
    /// Bytes to warm among the objects found so far.
    pub bytes_total: u64,
    /// Bytes warmed or found already cached.
    pub bytes_done: u64,
    /// Bytes fetched from upstream.
    pub bytes_fetched: u64,
    /// `bytes_done / bytes_total` in percent, once listing is done.
    pub percent: f64,
    /// Bytes per second fetched or confirmed, since the start.
    pub rate_bytes_per_second: f64,
    /// Objects that could not be warmed.
    pub errors: u64,
    /// The last error.
    pub last_error: Option<String>,
    /// Seconds since the job started.
    pub elapsed_seconds: f64,
}

struct Job {
    id: String,
    request: WarmRequest,
    started: Instant,
    cancel: CancellationToken,
    state: Mutex<(State, Option<Instant>)>,
    listing_done: std::sync::atomic::AtomicBool,
    objects_total: AtomicU64,
    objects_done: AtomicU64,
    bytes_total: AtomicU64,
    bytes_done: AtomicU64,
    bytes_fetched: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Job {
    fn progress(&self) -> Progress {
        let (state, ended) = *self.state.lock();
        let elapsed = ended.unwrap_or_else(Instant::now) - self.started;
        let (total, done) = (
            self.bytes_total.load(Ordering::Relaxed),
            self.bytes_done.load(Ordering::Relaxed),
        );
        let listing_done = self.listing_done.load(Ordering::Relaxed);
        Progress {
            id: self.id.clone(),
            // Not the objects: a profile's job may list thousands, and progress is asked for
            // every quarter of a second.
            request: WarmRequest {
                objects: Vec::new(),
                ..self.request.clone()
            },
            state,
            listing_done,
            objects_total: self.objects_total.load(Ordering::Relaxed),
            objects_done: self.objects_done.load(Ordering::Relaxed),
            bytes_total: total,
            bytes_done: done,
            bytes_fetched: self.bytes_fetched.load(Ordering::Relaxed),
            percent: match (listing_done, total) {
                (_, 0) if listing_done => 100.0,
                (_, 0) => 0.0,
                _ => 100.0 * done as f64 / total as f64,
            },
            rate_bytes_per_second: done as f64 / elapsed.as_secs_f64().max(1e-3),
            errors: self.errors.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
            elapsed_seconds: elapsed.as_secs_f64(),
        }
    }

    fn failed_object(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock() = Some(what);
    }

    fn running(&self) -> bool {
        self.state.lock().0 == State::Running
    }
}

/// Limits every job runs under.
#[derive(Debug, Clone, Copy)]
pub struct WarmLimits {
    /// Blocks fetched at once per job.
    pub concurrency: usize,
    /// Most bytes per second per job.
    pub rate: u64,
}

/// The warm-up jobs of one Larder.
pub struct Warmer {
    blocks: Arc<BlockStore>,
    metadata: Arc<MetadataCache>,
    origin: Arc<dyn Upstream>,
    metrics: Arc<Metrics>,
    limits: WarmLimits,
    jobs: Mutex<VecDeque<Arc<Job>>>,
}

impl Warmer {
    /// Jobs that warm `blocks` from `origin`.
    pub fn new(
        blocks: Arc<BlockStore>,
        metadata: Arc<MetadataCache>,
        origin: Arc<dyn Upstream>,
        metrics: Arc<Metrics>,
        limits: WarmLimits,
    ) -> Self {
        Self {
            blocks,
            metadata,
            origin,
            metrics,
            limits,
            jobs: Mutex::new(VecDeque::new()),
        }
    }

    /// Start a job; its id comes back at once.
    pub fn start(self: &Arc<Self>, request: WarmRequest) -> Result<Progress, WarmError> {
        if request.bucket.is_empty() {
            return Err(WarmError::Invalid("bucket is required".into()));
        }
        let given = [
            !request.keys.is_empty(),
            request.prefix.is_some(),
            !request.objects.is_empty(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(WarmError::Invalid(
                "give one of keys, a prefix (an empty prefix warms the whole bucket) or objects"
                    .into(),
            ));
        }
        if request.keys.len().max(request.objects.len()) > MAX_KEYS {
            return Err(WarmError::Invalid(format!(
                "at most {MAX_KEYS} keys or objects per job"
            )));
        }
        if !request.objects.is_empty() && request.range.is_some() {
            return Err(WarmError::Invalid(
                "objects give their own ranges; a range for all of them is not taken".into(),
            ));
        }
        if let Some(o) = request
            .objects
            .iter()
            .find(|o| o.ranges.len() > profile::MAX_RANGES)
        {
            return Err(WarmError::Invalid(format!(
                "{}: at most {} ranges per object",
                o.key,
                profile::MAX_RANGES
            )));
        }
        let ranges = request
            .range
            .iter()
            .chain(request.objects.iter().flat_map(|o| o.ranges.iter()));
        for r in ranges {
            // Checked against a huge size: only the syntax can be wrong here.
            if matches!(range::resolve(Some(r), u64::MAX), Resolved::Whole) {
                return Err(WarmError::Invalid(format!(
                    "range {r:?} is not a byte range"
                )));
            }
        }
        let job = {
            let mut jobs = self.jobs.lock();
            if jobs.iter().filter(|j| j.running()).count() >= MAX_RUNNING {
                return Err(WarmError::Busy);
            }
            while jobs.len() >= KEPT_JOBS {
                match jobs.iter().position(|j| !j.running()) {
                    Some(i) => {
                        jobs.remove(i);
                    }
                    None => break,
                }
            }
            let job = Arc::new(Job {
                id: format!("{:016x}", rand::random::<u64>()),
                request,
                started: Instant::now(),
                cancel: CancellationToken::new(),
                state: Mutex::new((State::Running, None)),
                listing_done: Default::default(),
                objects_total: Default::default(),
                objects_done: Default::default(),
                bytes_total: Default::default(),
                bytes_done: Default::default(),
                bytes_fetched: Default::default(),
                errors: Default::default(),
                last_error: Default::default(),
            });
            jobs.push_back(job.clone());
            job
        };
        let this = self.clone();
        let running = job.clone();
        tokio::spawn(async move {
            let outcome = tokio::select! {
                r = this.run(&running) => r,
                _ = running.cancel.cancelled() => Ok(()),
            };
            let state = if running.cancel.is_cancelled() {
                State::Cancelled
            } else if let Err(e) = outcome {
                running.failed_object(format!("listing failed: {e}"));
                State::Failed
            } else {
                State::Done
            };
            this.metrics.warm_job(match state {
                State::Cancelled => "cancelled",
                State::Failed => "failed",
                _ => "done",
            });
            tracing::info!(job = %running.id, ?state, bytes = running.bytes_done.load(Ordering::Relaxed), errors = running.errors.load(Ordering::Relaxed), "warm-up job ended");
            *running.state.lock() = (state, Some(Instant::now()));
        });
        Ok(job.progress())
    }

    /// Every job remembered, oldest first.
    pub fn list(&self) -> Vec<Progress> {
        self.jobs.lock().iter().map(|j| j.progress()).collect()
    }

    /// One job.
    pub fn get(&self, id: &str) -> Option<Progress> {
        self.find(id).map(|j| j.progress())
    }

    /// Stop a job; blocks already fetched stay cached.
    pub fn cancel(&self, id: &str) -> Option<Progress> {
        let job = self.find(id)?;
        job.cancel.cancel();
        Some(job.progress())
    }

    fn find(&self, id: &str) -> Option<Arc<Job>> {
        self.jobs.lock().iter().find(|j| j.id == id).cloned()
    }

    /// List and warm, page by page.
    async fn run(&self, job: &Arc<Job>) -> Result<(), UpstreamError> {
        let request = &job.request;
        // A key with the job's range, if any (else the whole object).
        let whole_or = |key: &String| -> (String, Vec<String>) {
            (key.clone(), request.range.iter().cloned().collect())
        };
        if !request.objects.is_empty() {
            let objects = request.objects.iter();
            let objects = objects.map(|o| (o.key.clone(), o.ranges.clone()));
            self.warm_objects(job, objects.collect()).await;
        } else if !request.keys.is_empty() {
            self.warm_objects(job, request.keys.iter().map(whole_or).collect())
                .await;
        } else {
            let prefix = request.prefix.clone().unwrap_or_default();
            let mut token = None;
            loop {
                let (page, next) = self.origin.list(&request.bucket, &prefix, token).await?;
                let keys = page.iter().map(|(k, _)| whole_or(k));
                self.warm_objects(job, keys.collect()).await;
                match next {
                    Some(t) => token = Some(t),
                    None => break,
                }
            }
        }
        job.listing_done.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Warm `objects`, each the blocks under its ranges (none: all of it), `concurrency` at a
    /// time across the page.
    async fn warm_objects(&self, job: &Arc<Job>, objects: Vec<(String, Vec<String>)>) {
        job.objects_total
            .fetch_add(objects.len() as u64, Ordering::Relaxed);
        let mut blocks = Vec::new();
        for (key, ranges) in objects {
            let id = ObjectId {
                bucket: job.request.bucket.as_str().into(),
                key: key.as_str().into(),
                version_id: None,
            };
            let meta = match self.metadata.get(&id).await {
                Ok((meta, _)) => meta,
                Err(e) => {
                    job.failed_object(format!("{id}: {e}"));
                    job.objects_done.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            let spans: Vec<(u64, u64)> = if ranges.is_empty() {
                vec![(0, meta.size)]
            } else {
                ranges
                    .iter()
                    .filter_map(|r| match range::resolve(Some(r), meta.size) {
                        Resolved::Whole => Some((0, meta.size)),
                        Resolved::Partial { start, end } => Some((start, end)),
                        // A range past the end of an object that shrank since it was read.
                        Resolved::Unsatisfiable => None,
                    })
                    .collect()
            };
            // Each block once, however many ranges it lies under, in the order of the object.
            let mut slices = std::collections::BTreeMap::new();
            for (start, end) in spans {
                for s in self.blocks.layout().slices(start, end, meta.size) {
                    slices.entry(s.index).or_insert(s);
                }
            }
            let etag = meta.etag.clone();
            let object_bytes: u64 = slices.values().map(|s| s.block_len).sum();
            job.bytes_total.fetch_add(object_bytes, Ordering::Relaxed);
            let remaining = Arc::new(AtomicU64::new(slices.len() as u64));
            if slices.is_empty() {
                job.objects_done.fetch_add(1, Ordering::Relaxed);
            }
            for slice in slices.into_values() {
                blocks.push((
                    id.clone(),
                    etag.clone(),
                    slice,
                    meta.size,
                    remaining.clone(),
                ));
            }
        }
        let limits = self.limits;
        futures::stream::iter(blocks)
            .for_each_concurrent(limits.concurrency, |(id, etag, slice, size, remaining)| {
                let job = job.clone();
                async move {
                    // Pace to the rate: wait until the bytes done so far are within it.
                    let done = job.bytes_done.load(Ordering::Relaxed);
                    let due = Duration::from_secs_f64(done as f64 / limits.rate as f64);
                    if let Some(wait) = due.checked_sub(job.started.elapsed()) {
                        tokio::time::sleep(wait).await;
                    }
                    match self.blocks.warm(&id, &etag, slice.index, size).await {
                        Ok(Warmed::Fetched(bytes)) => {
                            job.bytes_fetched.fetch_add(bytes, Ordering::Relaxed);
                            self.metrics.warm_bytes(bytes);
                        }
                        Ok(Warmed::AlreadyCached) => {}
                        Err(e) => job.failed_object(format!("{id} block {}: {e}", slice.index)),
                    }
                    job.bytes_done.fetch_add(slice.block_len, Ordering::Relaxed);
                    if remaining.fetch_sub(1, Ordering::Relaxed) == 1 {
                        job.objects_done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::blocks::BlockStoreConfig;
    use crate::upstream::memory::MemoryUpstream;
    use bytes::Bytes;

    fn warmer() -> (Arc<Warmer>, Arc<MemoryUpstream>) {
        let origin = Arc::new(MemoryUpstream::default());
        for (key, size) in [("p/a", 10_000), ("p/b", 5000), ("p/c", 1), ("q/d", 9000)] {
            origin.put(key, Bytes::from(vec![7u8; size]), "\"e\"");
        }
        let metrics = Arc::new(Metrics::default());
        let blocks = Arc::new(BlockStore::new(
            BlockStoreConfig::for_tests(),
            origin.clone(),
            metrics.clone(),
        ));
        let metadata = Arc::new(MetadataCache::new(
            origin.clone(),
            Duration::from_secs(60),
            Duration::ZERO,
            100,
        ));
        let limits = WarmLimits {
            concurrency: 2,
            rate: 1 << 30,
        };
        (
            Arc::new(Warmer::new(
                blocks,
                metadata,
                origin.clone(),
                metrics,
                limits,
            )),
            origin,
        )
    }

    async fn finished(w: &Warmer, id: &str) -> Progress {
        for _ in 0..500 {
            let p = w.get(id).unwrap();
            if p.state != State::Running {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("job {id} did not finish");
    }

    #[tokio::test]
    async fn a_prefix_is_listed_page_by_page_and_warmed_once() {
        let (w, origin) = warmer();
        let request = WarmRequest {
            bucket: "b".into(),
            keys: vec![],
            prefix: Some("p/".into()),
            range: None,
            objects: vec![],
        };
        let p = finished(&w, &w.start(request.clone()).unwrap().id).await;
        assert_eq!(p.state, State::Done);
        assert_eq!((p.objects_total, p.objects_done, p.errors), (3, 3, 0));
        assert_eq!(p.bytes_done, 15_001);
        assert_eq!(p.bytes_fetched, 15_001);
        assert_eq!(p.percent, 100.0);
        // 3 + 2 + 1 blocks.
        assert_eq!(origin.gets.load(Ordering::SeqCst), 6);
        let again = finished(&w, &w.start(request).unwrap().id).await;
        assert_eq!((again.bytes_done, again.bytes_fetched), (15_001, 0));
        assert_eq!(origin.gets.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn ranges_missing_keys_and_bad_requests() {
        let (w, origin) = warmer();
        let p = w
            .start(WarmRequest {
                bucket: "b".into(),
                keys: vec!["q/d".into(), "missing".into()],
                prefix: None,
                range: Some("bytes=-100".into()),
                objects: vec![],
            })
            .unwrap();
        let p = finished(&w, &p.id).await;
        assert_eq!(p.state, State::Done);
        assert_eq!((p.objects_done, p.errors), (2, 1));
        assert!(p.last_error.unwrap().contains("missing"));
        // The last 100 bytes of 9000 live in block 2 (808 bytes long).
        assert_eq!(p.bytes_fetched, 9000 - 2 * 4096);
        assert_eq!(origin.gets.load(Ordering::SeqCst), 1);
        for bad in [
            WarmRequest {
                bucket: "b".into(),
                keys: vec![],
                prefix: None,
                range: None,
                objects: vec![],
            },
            WarmRequest {
                bucket: "b".into(),
                keys: vec!["k".into()],
                prefix: None,
                range: Some("lines=1-2".into()),
                objects: vec![],
            },
            // Two kinds of target at once.
            WarmRequest {
                bucket: "b".into(),
                keys: vec!["k".into()],
                objects: vec![object("k", &[])],
                ..Default::default()
            },
            WarmRequest {
                bucket: "b".into(),
                objects: vec![object("k", &["bytes=0-1"])],
                range: Some("bytes=0-1".into()),
                ..Default::default()
            },
            WarmRequest {
                bucket: "b".into(),
                objects: vec![object("k", &["bytes=0-1", "rows=2-3"])],
                ..Default::default()
            },
            WarmRequest {
                bucket: "b".into(),
                objects: vec![object("k", &["bytes=0-1"; profile::MAX_RANGES + 1])],
                ..Default::default()
            },
        ] {
            assert!(matches!(w.start(bad), Err(WarmError::Invalid(_))));
        }
    }

    fn object(key: &str, ranges: &[&str]) -> WarmObject {
        WarmObject {
            key: key.into(),
            ranges: ranges.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[tokio::test]
    async fn objects_warm_the_blocks_under_their_own_ranges_each_once() {
        let (w, origin) = warmer();
        // Blocks of 4096: p/a (10,000 bytes) is blocks 0 to 2, q/d (9000) blocks 0 to 2.
        let request = WarmRequest {
            bucket: "b".into(),
            objects: vec![
                // Two ranges in block 0, one across blocks 1 and 2... of p/a: all three once.
                object("p/a", &["bytes=0-9", "bytes=100-199", "bytes=4000-8999"]),
                // The last byte of q/d: block 2 only.
                object("q/d", &["bytes=-1"]),
                // Past the end of p/c (1 byte): nothing to warm, not an error.
                object("p/c", &["bytes=5-9"]),
                // No ranges: the whole object.
                object("p/b", &[]),
            ],
            ..Default::default()
        };
        let p = finished(&w, &w.start(request).unwrap().id).await;
        assert_eq!(p.state, State::Done);
        assert_eq!((p.objects_total, p.objects_done, p.errors), (4, 4, 0));
        assert_eq!(p.bytes_fetched, 10_000 + (9000 - 2 * 4096) + 5000);
        assert_eq!(origin.gets.load(Ordering::SeqCst), 3 + 1 + 2);
        // Progress leaves the objects out.
        assert!(p.request.objects.is_empty() && p.request.bucket == "b");
    }

    #[tokio::test]
    async fn a_cancelled_job_stops() {
        let (w, _origin) = warmer();
        let slow = WarmLimits {
            concurrency: 1,
            rate: 1000,
        };
        let w = Arc::new(Warmer::new(
            w.blocks.clone(),
            w.metadata.clone(),
            w.origin.clone(),
            w.metrics.clone(),
            slow,
        ));
        let p = w
            .start(WarmRequest {
                bucket: "b".into(),
                keys: vec!["p/a".into()],
                prefix: None,
                range: None,
                objects: vec![],
            })
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(w.cancel(&p.id).unwrap().id, p.id);
        let p = finished(&w, &p.id).await;
        assert_eq!(p.state, State::Cancelled);
        assert!(p.bytes_done < 10_000, "{p:?}");
    }
}
