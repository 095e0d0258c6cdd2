//! Backing off per prefix when the upstream says "slow down", as a layer around the upstream
//! ([`Throttled`]).
//!
//! S3 limits request rates per prefix (about 5,500 GETs a second) and answers `503 SlowDown`
//! past it. A cache multiplies its clients' requests into block fetches, so it is the one that
//! must slow down, and only where it was told to: other prefixes keep their pace.
//!
//! Each prefix (a bucket and its key's first segment, `lake/table/part-1` → `lake/table/`;
//! keys without `/` share their bucket's) has a request rate that is unlimited until the
//! upstream throttles it. From then on its requests draw tokens from a bucket refilled at a rate
//! that follows the AWS SDKs' adaptive retry mode: cut to `BETA` of what was being sent on a
//! throttle, grown back on success along a cubic curve (CUBIC) that returns to the old rate
//! after a while and then probes above it. Two things differ from the SDKs' rate limiter, which
//! is per client, not per prefix:
//! - only a throttle answer to a request sent under the current cut cuts again, so the answers
//!   of one burst cut once (the SDK's cuts once per answer, down to its floor);
//! - once the curve has grown to twice the rate that was throttled with no throttle since, the
//!   limit is lifted.
//!
//! A throttled request is sent again (it waits for its prefix's token) up to `max_attempts`
//! paced times, then its `SlowDown` is the answer. A refusal of a request sent while its
//! prefix was not paced does not count: that burst is how the limit is found (and the refusal
//! paces the prefix, so the next send is paced), and a block GET that runs out of attempts
//! fails its client's read. The S3 client does not retry these answers itself (`s3.rs`): its
//! backoff is per request and knows nothing of prefixes.
//! Waiting requests are tasks asleep until their prefix's next token, not a queue.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::Upstream;
use crate::model::{
    BodyStream, ByteRange, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
};
use crate::telemetry::labels::ThrottleEvent;
use crate::telemetry::metrics::Metrics;

/// The share of its rate a throttled prefix keeps (the AWS SDKs' adaptive mode: 0.7).
const BETA: f64 = 0.7;
/// How fast the rate grows back (the SDKs' CUBIC scale constant): requests per second³.
const SCALE: f64 = 0.4;
/// The lowest rate a prefix is cut to, in requests per second.
const MIN_RATE: f64 = 1.0;
/// Prefixes tracked at most. Past it, idle unthrottled ones are forgotten first, then all:
/// a forgotten limit is learnt again from the next throttle.
const MAX_PREFIXES: usize = 4096;
/// Longest single sleep waiting for a token; the wait is re-checked after it.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// Shortest: a token is never owed for less.
const MIN_WAIT: Duration = Duration::from_millis(1);

/// A prefix's state.
#[derive(Debug)]
struct Prefix {
    /// Requests sent in the previous and the current half second.
    sent: [u32; 2],
    /// The current half second (seconds × 2, from the layer's start).
    half: u64,
    /// When a request last used this prefix.
    last_used: f64,
    /// The limit in force since the upstream throttled this prefix.
    limit: Option<Limit>,
}

/// A throttled prefix's token bucket and its CUBIC curve.
#[derive(Debug)]
struct Limit {
    /// Tokens (requests) per second.
    rate: f64,
    tokens: f64,
    refilled: f64,
    /// The rate sent when last throttled, and when.
    last_max: f64,
    throttled_at: f64,
    /// Bumped by each cut: only requests sent under the current one may cut again.
    epoch: u64,
}

impl Prefix {
    fn new(now: f64) -> Self {
        Self {
            sent: [0, 0],
            half: (now * 2.0) as u64,
            last_used: now,
            limit: None,
        }
    }

    fn roll(&mut self, now: f64) {
        let half = (now * 2.0) as u64;
        match half.saturating_sub(self.half) {
            0 => {}
            1 => self.sent = [self.sent[1], 0],
            _ => self.sent = [0, 0],
        }
        self.half = half;
    }

    /// Requests per second sent over the last half second and the current one so far.
    fn sent_rate(&mut self, now: f64) -> f64 {
        self.roll(now);
        let span = 0.5 + (now - self.half as f64 / 2.0);
        f64::from(self.sent[0] + self.sent[1]) / span
    }

    /// Take a token to send a request now: `Ok` with the epoch it is sent under (`None` when
    /// the prefix is unlimited), or how long to wait for one.
    fn admit(&mut self, now: f64) -> Result<Option<u64>, Duration> {
        self.roll(now);
        self.last_used = now;
        let epoch = match &mut self.limit {
            None => None,
            Some(l) => {
                l.tokens = (l.tokens + (now - l.refilled) * l.rate).min(l.rate.max(1.0));
                l.refilled = now;
                if l.tokens < 1.0 {
                    // At least MIN_WAIT: a shortfall of a rounding error would otherwise be
                    // a zero sleep, and the caller would spin on it.
                    let wait = Duration::from_secs_f64((1.0 - l.tokens) / l.rate);
                    return Err(wait.max(MIN_WAIT));
                }
                l.tokens -= 1.0;
                Some(l.epoch)
            }
        };
        self.sent[1] = self.sent[1].saturating_add(1);
        Ok(epoch)
    }

    /// The upstream answered a request sent under `epoch`, throttled or not: what that did to
    /// the prefix's limit (`None`: nothing), as the metrics count it.
    fn answered(&mut self, now: f64, throttled: bool, epoch: Option<u64>) -> Option<ThrottleEvent> {
        if self.limit.is_none() && !throttled {
            return None;
        }
        let sent = self.sent_rate(now);
        match (&mut self.limit, throttled) {
            (None, false) => None,
            (None, true) => {
                let rate = (BETA * sent).max(MIN_RATE);
                self.limit = Some(Limit {
                    rate,
                    tokens: 0.0,
                    refilled: now,
                    last_max: sent.max(MIN_RATE),
                    throttled_at: now,
                    epoch: 0,
                });
                Some(ThrottleEvent::Limited)
            }
            (Some(l), true) if epoch == Some(l.epoch) => {
                let before = l.rate.min(sent.max(MIN_RATE));
                l.last_max = before;
                l.rate = (BETA * before).max(MIN_RATE);
                l.tokens = l.tokens.min(0.0);
                l.throttled_at = now;
                l.epoch += 1;
                Some(ThrottleEvent::Cut)
            }
            // An answer to a request sent before the last cut: that cut already counted it.
            (Some(_), true) => None,
            (Some(l), false) => {
                // The cubic curve through (throttled_at, BETA × last_max), back at last_max
                // after `k` seconds.
                let k = (l.last_max * (1.0 - BETA) / SCALE).cbrt();
                let t = now - l.throttled_at - k;
                let rate = SCALE * t * t * t + l.last_max;
                if rate >= 2.0 * l.last_max {
                    self.limit = None;
                    return Some(ThrottleEvent::Lifted);
                }
                l.rate = rate.max(MIN_RATE);
                None
            }
        }
    }
}

/// An upstream whose requests slow down per prefix when it throttles them.
pub struct Throttled {
    inner: Arc<dyn Upstream>,
    max_attempts: u32,
    prefixes: Mutex<HashMap<String, Arc<Mutex<Prefix>>>>,
    started: Instant,
    retries: AtomicU64,
    metrics: Arc<Metrics>,
}

impl Throttled {
    /// `inner`, each request sent at most `max_attempts` paced times while throttled (sends
    /// while its prefix was not paced do not count); events counted in `metrics`.
    pub fn new(inner: Arc<dyn Upstream>, max_attempts: u32, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            max_attempts: max_attempts.max(1),
            prefixes: Mutex::new(HashMap::new()),
            started: Instant::now(),
            retries: AtomicU64::new(0),
            metrics,
        }
    }

    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The state of the prefix `key` of `bucket` is under.
    fn prefix(&self, bucket: &str, key: &str) -> Arc<Mutex<Prefix>> {
        let segment = key.find('/').map_or("", |end| &key[..=end]);
        let name = format!("{bucket}/{segment}");
        let now = self.now();
        let mut prefixes = self.prefixes.lock();
        if let Some(p) = prefixes.get(&name) {
            return p.clone();
        }
        if prefixes.len() >= MAX_PREFIXES {
            prefixes.retain(|_, p| {
                let p = p.lock();
                p.limit.is_some() || now - p.last_used < 1.0
            });
            if prefixes.len() >= MAX_PREFIXES {
                prefixes.clear();
            }
        }
        prefixes
            .entry(name)
            .or_insert_with(|| Arc::new(Mutex::new(Prefix::new(now))))
            .clone()
    }

    /// Send a request for `key` of `bucket` as its prefix's rate allows, again while it is
    /// throttled and attempts remain.
    async fn paced<T, F, Fut>(&self, bucket: &str, key: &str, send: F) -> Result<T, UpstreamError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, UpstreamError>>,
    {
        let prefix = self.prefix(bucket, key);
        let mut attempt = 1;
        loop {
            let mut waited = false;
            let epoch = loop {
                let admitted = prefix.lock().admit(self.now());
                match admitted {
                    Ok(epoch) => break epoch,
                    Err(wait) => {
                        waited = true;
                        tokio::time::sleep(wait.min(MAX_WAIT)).await;
                    }
                }
            };
            if waited {
                self.metrics.throttle(ThrottleEvent::Delayed);
            }
            let result = send().await;
            let throttled = matches!(&result, Err(e) if e.is_throttled());
            let event = prefix.lock().answered(self.now(), throttled, epoch);
            if let Some(event) = event {
                self.metrics.throttle(event);
            }
            if throttled && (epoch.is_none() || attempt < self.max_attempts) {
                // Sent unpaced (`epoch` is `None`): the prefix is paced from now on, and the
                // request's attempts start with its first paced one.
                if epoch.is_some() {
                    attempt += 1;
                }
                self.retries.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            return result;
        }
    }
}

#[async_trait::async_trait]
impl Upstream for Throttled {
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        self.paced(&object.bucket, &object.key, || self.inner.head(object))
            .await
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        self.paced(&object.bucket, &object.key, || {
            self.inner.get(object, if_match, range.clone())
        })
        .await
    }

    async fn get_with_meta(
        &self,
        object: &ObjectId,
        span: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        self.paced(&object.bucket, &object.key, || {
            self.inner.get_with_meta(object, span)
        })
        .await
    }

    async fn get_part(
        &self,
        object: &ObjectId,
        part: PartNumber,
    ) -> Result<Option<(ObjectMeta, PartSpan, BodyStream)>, UpstreamError> {
        self.paced(&object.bucket, &object.key, || {
            self.inner.get_part(object, part)
        })
        .await
    }

    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        self.paced(bucket, prefix, || {
            self.inner.list(bucket, prefix, token.clone())
        })
        .await
    }

    fn retries(&self) -> u64 {
        self.inner.retries() + self.retries.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
