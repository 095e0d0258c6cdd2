//! Hedging: a second request for the same block once the first has waited longer than a chosen
//! percentile of recent upstream first-byte latencies ([`HedgePolicy`]), as a layer around the
//! upstream ([`Hedged`]). Only GETs pinned to a version (`If-Match`) with a range are hedged:
//! asking twice for them is safe, and they are the block fetches whose latency the policy tracks.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::Instrument;

use super::Upstream;
use crate::model::{
    BodyStream, ByteRange, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
};
use crate::telemetry::metrics::Metrics;

/// Latencies remembered.
const WINDOW: usize = 1024;
/// Latencies needed before hedging starts: a percentile of a handful is noise.
const MIN_SAMPLES: usize = 64;
/// The percentile is recomputed every this many samples.
const RECOMPUTE_EVERY: u64 = 32;

/// Tracks recent first-byte latencies and says how long to wait before hedging.
#[derive(Debug)]
pub struct HedgePolicy {
    quantile: Option<f64>,
    recent: Mutex<VecDeque<Duration>>,
    recorded: AtomicU64,
    /// The current threshold in nanoseconds; 0 while there are too few samples.
    threshold_ns: AtomicU64,
}

impl HedgePolicy {
    /// Hedge after the `quantile` (e.g. 0.95) of recent latencies; `None` never hedges.
    pub fn new(quantile: Option<f64>) -> Self {
        Self {
            quantile,
            recent: Mutex::new(VecDeque::with_capacity(WINDOW)),
            recorded: AtomicU64::new(0),
            threshold_ns: AtomicU64::new(0),
        }
    }

    /// How long the first request may wait before a second is sent; `None` to not hedge.
    pub fn delay(&self) -> Option<Duration> {
        self.quantile?;
        match self.threshold_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// A request's time to its response headers.
    pub fn record(&self, latency: Duration) {
        let Some(q) = self.quantile else { return };
        let n = {
            let mut recent = self.recent.lock();
            if recent.len() == WINDOW {
                recent.pop_front();
            }
            recent.push_back(latency);
            recent.len()
        };
        let count = self.recorded.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= MIN_SAMPLES && count.is_multiple_of(RECOMPUTE_EVERY) {
            let mut sorted: Vec<Duration> = self.recent.lock().iter().copied().collect();
            sorted.sort_unstable();
            let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
            let ns = sorted[at.min(sorted.len() - 1)].as_nanos().max(1) as u64;
            self.threshold_ns.store(ns, Ordering::Relaxed);
        }
    }
}

/// An upstream whose block GETs are hedged by a [`HedgePolicy`].
pub struct Hedged {
    inner: Arc<dyn Upstream>,
    policy: HedgePolicy,
    metrics: Arc<Metrics>,
}

impl Hedged {
    /// `inner`, hedged as `policy` says; hedges sent and won are counted in `metrics`.
    pub fn new(inner: Arc<dyn Upstream>, policy: HedgePolicy, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            policy,
            metrics,
        }
    }

    /// One GET, its latency recorded when it answers.
    async fn timed(
        &self,
        object: &ObjectId,
        if_match: &str,
        range: Range<u64>,
        hedge: bool,
    ) -> (Result<BodyStream, UpstreamError>, bool) {
        let started = Instant::now();
        let result = self
            .inner
            .get(object, Some(if_match), Some(range))
            .instrument(tracing::info_span!("attempt", larder.hedge = hedge))
            .await;
        if result.is_ok() {
            self.policy.record(started.elapsed());
        }
        (result, hedge)
    }
}

#[async_trait::async_trait]
impl Upstream for Hedged {
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        self.inner.head(object).await
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        let (Some(etag), Some(range)) = (if_match, range.clone()) else {
            return self.inner.get(object, if_match, range).await;
        };
        let first = self.timed(object, etag, range.clone(), false);
        let Some(after) = self.policy.delay() else {
            return first.await.0;
        };
        tokio::pin!(first);
        tokio::select! {
            (result, _) = &mut first => return result,
            _ = tokio::time::sleep(after) => {}
        }
        self.metrics.hedged(false);
        let second = self.timed(object, etag, range, true);
        tokio::pin!(second);
        // The first answer wins; the other request is dropped (cancelled) with its future.
        let (result, hedge) = tokio::select! {
            r = &mut first => r,
            r = &mut second => r,
        };
        if hedge {
            self.metrics.hedged(true);
        }
        result
    }

    async fn get_with_meta(
        &self,
        object: &ObjectId,
        range: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        let started = Instant::now();
        let result = self.inner.get_with_meta(object, range).await;
        if let Ok(Some(_)) = &result {
            self.policy.record(started.elapsed());
        }
        result
    }

    async fn get_part(
        &self,
        object: &ObjectId,
        part: PartNumber,
    ) -> Result<Option<(ObjectMeta, PartSpan, BodyStream)>, UpstreamError> {
        let started = Instant::now();
        let result = self.inner.get_part(object, part).await;
        if let Ok(Some(_)) = &result {
            self.policy.record(started.elapsed());
        }
        result
    }

    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        self.inner.list(bucket, prefix, token).await
    }

    fn retries(&self) -> u64 {
        self.inner.retries()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_enough_samples_then_tracks_the_percentile() {
        let h = HedgePolicy::new(Some(0.9));
        for ms in 1..=63 {
            h.record(Duration::from_millis(ms));
        }
        assert_eq!(h.delay(), None, "too few samples");
        for ms in 64..=128 {
            h.record(Duration::from_millis(ms));
        }
        let d = h.delay().unwrap();
        assert!(
            (Duration::from_millis(105)..=Duration::from_millis(120)).contains(&d),
            "{d:?}"
        );
        let off = HedgePolicy::new(None);
        for ms in 1..=200 {
            off.record(Duration::from_millis(ms));
        }
        assert_eq!(off.delay(), None);
    }

    /// The first GET stalls; every later one answers at once with `fast`.
    #[derive(Default)]
    struct FirstStalls {
        gets: AtomicU64,
    }

    #[async_trait::async_trait]
    impl Upstream for FirstStalls {
        async fn head(&self, _: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
            unreachable!("not asked")
        }

        async fn get(
            &self,
            _: &ObjectId,
            _: Option<&str>,
            _: Option<Range<u64>>,
        ) -> Result<BodyStream, UpstreamError> {
            use futures::StreamExt;
            let body: &'static [u8] = if self.gets.fetch_add(1, Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_secs(60)).await;
                b"slow"
            } else {
                b"fast"
            };
            Ok(futures::stream::once(async move { Ok(bytes::Bytes::from_static(body)) }).boxed())
        }

        async fn list(
            &self,
            _: &str,
            _: &str,
            _: Option<String>,
        ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
            unreachable!("not asked")
        }
    }

    fn object() -> ObjectId {
        ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        }
    }

    fn trained() -> HedgePolicy {
        let policy = HedgePolicy::new(Some(0.9));
        for _ in 0..MIN_SAMPLES as u64 + RECOMPUTE_EVERY {
            policy.record(Duration::from_millis(1));
        }
        policy
    }

    #[tokio::test]
    async fn a_block_get_slower_than_the_quantile_is_asked_again_and_the_first_answer_wins() {
        use futures::StreamExt;
        let inner = Arc::new(FirstStalls::default());
        let metrics = Arc::new(Metrics::default());
        let hedged = Hedged::new(inner.clone(), trained(), metrics.clone());
        let mut body = hedged
            .get(&object(), Some("\"e\""), Some(0..4))
            .await
            .unwrap();
        assert_eq!(&body.next().await.unwrap().unwrap()[..], b"fast");
        assert_eq!(inner.gets.load(Ordering::SeqCst), 2);
        let s = metrics.snapshot();
        assert_eq!(
            s.sum("larder_upstream_hedges_total", &[("outcome", "sent")]),
            1.0
        );
        assert_eq!(
            s.sum("larder_upstream_hedges_total", &[("outcome", "won")]),
            1.0
        );
    }

    #[tokio::test]
    async fn a_get_not_pinned_to_a_version_is_never_asked_twice() {
        let inner = Arc::new(FirstStalls::default());
        let hedged = Hedged::new(inner.clone(), trained(), Arc::new(Metrics::default()));
        // The first GET stalls far past the hedge delay (1 ms): a hedging layer would have
        // sent the second long before this gives up.
        let stalled = tokio::time::timeout(
            Duration::from_millis(200),
            hedged.get(&object(), None, Some(0..1)),
        )
        .await;
        assert!(stalled.is_err(), "the stalled GET answered");
        assert_eq!(inner.gets.load(Ordering::SeqCst), 1);
    }
}
