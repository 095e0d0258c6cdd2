use std::sync::atomic::AtomicU32;

use super::*;

/// An upstream that throttles as S3 does: each prefix (bucket and the key's first segment)
/// answers `503 SlowDown` past `rps` requests a second (one second of burst), after `latency`.
/// Only HEAD is served; on tokio's paused clock, so the tests are deterministic.
struct RateLimited {
    rps: f64,
    latency: Duration,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
    served: AtomicU32,
    refused: AtomicU32,
    /// Answer every request with this status instead.
    always: Option<u16>,
}

impl RateLimited {
    fn new(rps: f64) -> Arc<Self> {
        Arc::new(Self {
            rps,
            latency: Duration::from_millis(10),
            buckets: Mutex::new(HashMap::new()),
            served: AtomicU32::new(0),
            refused: AtomicU32::new(0),
            always: None,
        })
    }

    fn failing(status: u16) -> Arc<Self> {
        let mut fake = Arc::into_inner(Self::new(1e9)).unwrap();
        fake.always = Some(status);
        Arc::new(fake)
    }

    fn counts(&self) -> (u32, u32) {
        (
            self.served.load(Ordering::SeqCst),
            self.refused.load(Ordering::SeqCst),
        )
    }
}

fn error(status: u16) -> UpstreamError {
    UpstreamError::Service {
        status,
        code: if status == 503 {
            "SlowDown"
        } else {
            "InternalError"
        }
        .into(),
        message: String::new(),
    }
}

#[async_trait::async_trait]
impl Upstream for RateLimited {
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        tokio::time::sleep(self.latency).await;
        if let Some(status) = self.always {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(error(status));
        }
        let segment = object.key.split('/').next().unwrap_or("");
        let now = Instant::now();
        let admitted = {
            let mut buckets = self.buckets.lock();
            let (tokens, last) = buckets
                .entry(format!("{}/{segment}", object.bucket))
                .or_insert((self.rps, now));
            *tokens = (*tokens + (now - *last).as_secs_f64() * self.rps).min(self.rps);
            *last = now;
            *tokens >= 1.0 && {
                *tokens -= 1.0;
                true
            }
        };
        if !admitted {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(error(503));
        }
        self.served.fetch_add(1, Ordering::SeqCst);
        Ok(ObjectMeta {
            size: 1,
            etag: "\"e\"".into(),
            last_modified: None,
            version_id: None,
            headers: Vec::new(),
            checksums: Vec::new(),
            checksums_known: true,
            response_headers: Default::default(),
        })
    }

    async fn get(
        &self,
        _: &ObjectId,
        _: Option<&str>,
        _: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        unimplemented!("the throttle tests send HEADs")
    }

    async fn list(
        &self,
        _: &str,
        _: &str,
        _: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        unimplemented!("the throttle tests send HEADs")
    }
}

fn throttled(fake: &Arc<RateLimited>, max_attempts: u32) -> (Arc<Throttled>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let layer = Throttled::new(fake.clone(), max_attempts, metrics.clone());
    (Arc::new(layer), metrics)
}

/// `readers` tasks sending `each` HEADs one after another under `prefix`; how many failed.
async fn load(upstream: Arc<dyn Upstream>, prefix: &str, readers: usize, each: usize) -> usize {
    let tasks: Vec<_> = (0..readers)
        .map(|r| {
            let upstream = upstream.clone();
            let prefix = prefix.to_owned();
            tokio::spawn(async move {
                let mut failed = 0;
                for i in 0..each {
                    let key = format!("{prefix}/r{r}-{i}");
                    if upstream
                        .head(&ObjectId::in_test_bucket(&key))
                        .await
                        .is_err()
                    {
                        failed += 1;
                    }
                }
                failed
            })
        })
        .collect();
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap();
    }
    failed
}

/// 32 readers wanting 3,200 requests a second of a prefix that allows 50: without the layer
/// (one attempt each) most requests are refused; with it the prefix is paced near what the
/// upstream allows and almost every request gets through.
#[tokio::test(start_paused = true)]
async fn a_throttled_prefix_is_paced_near_what_the_upstream_allows() {
    let bare = RateLimited::new(50.0);
    let failed_bare = load(bare.clone(), "hot", 32, 10).await;
    let (_, refused_bare) = bare.counts();

    let fake = RateLimited::new(50.0);
    let (layer, metrics) = throttled(&fake, 3);
    let started = Instant::now();
    let failed = load(layer.clone(), "hot", 32, 10).await;
    let took = started.elapsed();
    let (served, refused) = fake.counts();

    eprintln!("bare: {failed_bare} failed, {refused_bare} refused");
    eprintln!("layer: {failed} failed, {served} served, {refused} refused in {took:?}");
    assert!(
        failed_bare > 200,
        "{failed_bare} of 320 failed without the layer"
    );
    // The first burst (32 at once, 50 allowed in the first second) and a few probes above the
    // rate later are refused; everything else is paced.
    assert!(refused < 60, "refused {refused}, served {served}");
    assert!(failed <= 3, "{failed} of 320 failed");
    assert_eq!(served as usize, 320 - failed);
    // 320 requests at 50 a second, after a burst of 50: at least 5.4 s; paced well, not much more.
    assert!(took < Duration::from_secs(7), "took {took:?}");
    assert_eq!(layer.retries(), u64::from(refused) - failed as u64);
    let s = metrics.snapshot();
    let events = |e: &str| s.sum("larder_upstream_throttle_total", &[("event", e)]);
    assert_eq!(events("limited"), 1.0);
    assert!(events("delayed") > 100.0);
}

/// A paced prefix does not slow another: its requests go out at once.
#[tokio::test(start_paused = true)]
async fn other_prefixes_keep_their_pace() {
    let fake = RateLimited::new(20.0);
    let (layer, _) = throttled(&fake, 3);
    let hot = tokio::spawn(load(layer.clone(), "hot", 16, 20));
    // Let the hot prefix be throttled and paced.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(fake.counts().1 > 0, "the hot prefix was never throttled");
    let started = Instant::now();
    assert_eq!(load(layer.clone(), "cool", 10, 1).await, 0);
    assert_eq!(
        started.elapsed(),
        fake.latency,
        "10 requests of another prefix waited for the hot one's pace"
    );
    // Flat keys share their bucket's prefix, which is neither.
    let started = Instant::now();
    layer.head(&ObjectId::in_test_bucket("flat")).await.unwrap();
    assert_eq!(started.elapsed(), fake.latency);
    hot.abort();
}

#[tokio::test(start_paused = true)]
async fn a_request_throttled_on_every_attempt_answers_slowdown_after_its_attempts() {
    // The first send, before the prefix was paced, found the limit; then three paced attempts.
    let fake = RateLimited::failing(503);
    let (layer, _) = throttled(&fake, 3);
    let err = layer
        .head(&ObjectId::in_test_bucket("k/1"))
        .await
        .unwrap_err();
    assert!(err.is_throttled(), "{err:?}");
    assert_eq!(fake.counts().1, 4, "attempts sent");
    assert_eq!(layer.retries(), 3);
    // Once the prefix is paced, every send counts.
    let err = layer
        .head(&ObjectId::in_test_bucket("k/2"))
        .await
        .unwrap_err();
    assert!(err.is_throttled(), "{err:?}");
    assert_eq!(fake.counts().1, 7, "three more attempts");
}

#[tokio::test(start_paused = true)]
async fn other_failures_are_answered_at_once_and_never_pace() {
    let fake = RateLimited::failing(500);
    let (layer, metrics) = throttled(&fake, 3);
    for _ in 0..5 {
        let started = Instant::now();
        layer
            .head(&ObjectId::in_test_bucket("k/1"))
            .await
            .unwrap_err();
        assert_eq!(started.elapsed(), fake.latency);
    }
    assert_eq!(fake.counts().1, 5, "one attempt each");
    assert_eq!(layer.retries(), 0);
    let s = metrics.snapshot();
    assert_eq!(s.sum("larder_upstream_throttle_total", &[]), 0.0);
}

#[test]
fn one_bursts_answers_cut_once_and_the_rate_grows_back_until_lifted() {
    let mut p = Prefix::new(0.0);
    let epochs: Vec<_> = (0..100).map(|_| p.admit(0.1).unwrap()).collect();
    assert!(
        epochs.iter().all(Option::is_none),
        "unlimited until throttled"
    );
    // 100 requests in 0.1 s (167 a second over the window), all refused together.
    assert_eq!(p.answered(0.11, true, None), Some(ThrottleEvent::Limited));
    let rate = p.limit.as_ref().unwrap().rate;
    assert!((110.0..125.0).contains(&rate), "{rate}");
    for _ in 0..99 {
        assert_eq!(p.answered(0.11, true, None), None);
    }
    assert_eq!(p.limit.as_ref().unwrap().rate, rate, "one burst, one cut");
    // The tokens start empty: the next request waits for one.
    assert!(p.admit(0.11).is_err());
    let epoch = p.admit(0.2).expect("a token is due after 1/rate");
    assert_eq!(p.answered(0.21, true, epoch), Some(ThrottleEvent::Cut));
    let cut = p.limit.as_ref().unwrap().rate;
    assert!(cut < rate * 0.75, "{cut} after {rate}");
    // Successes grow it back along the curve, past where it was, and then lift it.
    let mut now = 0.3;
    let mut lifted = false;
    while now < 60.0 {
        if let Ok(e) = p.admit(now) {
            if p.answered(now, false, e) == Some(ThrottleEvent::Lifted) {
                lifted = true;
                break;
            }
        }
        now += 0.01;
    }
    assert!(lifted, "still limited after a minute without throttling");
    assert!(now > 2.0, "lifted after {now} s");
    assert!(p.admit(now).unwrap().is_none());
}
