//! The block store over the in-memory upstream, in process: exact ranges, one fetch per block
//! however many readers, bounded buffers and fetches, warm-up, a changed object, and a restart
//! served from the disk tier.

// Helpers of a test file: an unwrap that fails is the test failing, with its message.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cache_core::{BlockLayout, DiskCache};
use futures::{Stream, StreamExt};
use larder::model::{ObjectId, UpstreamError};
use larder::read::blocks::{BlockStore, BlockStoreConfig, CacheResult, Warmed};
use larder::telemetry::metrics::Metrics;
use larder::upstream::memory::MemoryUpstream;

fn data(size: usize, seed: u8) -> Bytes {
    (0..size)
        .map(|i| (i % 251) as u8 ^ seed)
        .collect::<Vec<_>>()
        .into()
}

fn setup(
    size: usize,
    delay: Duration,
    upstream_concurrency: usize,
) -> (Arc<BlockStore>, Arc<MemoryUpstream>, ObjectId, Arc<str>) {
    let metrics = Arc::new(Metrics::default());
    setup_with(size, delay, upstream_concurrency, metrics, |_| {})
}

fn setup_with(
    size: usize,
    delay: Duration,
    upstream_concurrency: usize,
    metrics: Arc<Metrics>,
    tweak: impl FnOnce(&mut BlockStoreConfig),
) -> (Arc<BlockStore>, Arc<MemoryUpstream>, ObjectId, Arc<str>) {
    let origin = Arc::new(MemoryUpstream::with_delay(delay));
    origin.put("k", data(size, 0), "\"e1\"");
    let mut config = BlockStoreConfig {
        upstream_concurrency,
        ..BlockStoreConfig::for_tests()
    };
    tweak(&mut config);
    let store = Arc::new(BlockStore::new(config, origin.clone(), metrics));
    let id = ObjectId {
        bucket: "b".into(),
        key: "k".into(),
        version_id: None,
    };
    (store, origin, id, "\"e1\"".into())
}

async fn collect(
    s: impl Stream<Item = Result<Bytes, UpstreamError>>,
) -> Result<Vec<u8>, UpstreamError> {
    let mut out = Vec::new();
    futures::pin_mut!(s);
    while let Some(c) = s.next().await {
        out.extend_from_slice(&c?);
    }
    Ok(out)
}

/// `range` of the object read whole, once every fetch the read started has settled (cached or
/// failed): a fetch of a block of 1 MiB or more gives its readers the last bytes before it
/// caches the block.
async fn read_settled(
    store: &BlockStore,
    s: impl Stream<Item = Result<Bytes, UpstreamError>>,
) -> Result<Vec<u8>, UpstreamError> {
    let got = collect(s).await;
    assert!(store.settled(Duration::from_secs(5)).await);
    got
}

#[tokio::test]
async fn responses_together_hold_no_more_than_the_response_buffer() {
    let size = 10 * 4096;
    let metrics = Arc::new(Metrics::default());
    let (store, _origin, id, etag) = setup_with(size, Duration::ZERO, 8, metrics.clone(), |c| {
        c.response_buffer = 2 * 4096;
    });
    let size = size as u64;
    // A reader that takes one chunk and stops reading: its window fills the buffer.
    let mut stalled = Box::pin(store.read(id.clone(), etag.clone(), 0..size, size));
    let mut got = stalled.next().await.unwrap().unwrap().to_vec();
    tokio::time::timeout(Duration::from_secs(5), async {
        while store.response_buffer().0 < 2 * 4096 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the stalled reader's window holds the buffer");
    assert_eq!(store.response_buffer(), (2 * 4096, 2 * 4096));
    // A second reader waits for room rather than holding more...
    let other = tokio::spawn(collect(store.read(id.clone(), etag.clone(), 0..size, size)));
    tokio::time::timeout(Duration::from_secs(5), async {
        while metrics
            .snapshot()
            .sum("larder_response_buffer_waits_total", &[])
            < 1.0
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the second reader waited");
    assert!(!other.is_finished());
    assert!(store.response_buffer().0 <= 2 * 4096);
    // ...and both finish, exact, once the first reads on.
    while let Some(chunk) = stalled.next().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    assert!(got == data(size as usize, 0), "the first reader's bytes");
    let other = other.await.unwrap().unwrap();
    assert!(other == data(size as usize, 0), "the second reader's bytes");
    assert_eq!(store.response_buffer().0, 0, "all room given back");
}

#[tokio::test]
async fn warming_fetches_only_what_is_missing() {
    let (store, origin, id, etag) = setup(3 * 4096, Duration::ZERO, 4);
    assert_eq!(
        store.warm(&id, &etag, 0, 3 * 4096).await.unwrap(),
        Warmed::Fetched(4096)
    );
    assert_eq!(
        store.warm(&id, &etag, 0, 3 * 4096).await.unwrap(),
        Warmed::AlreadyCached
    );
    assert_eq!(
        store.warm(&id, &etag, 2, 3 * 4096).await.unwrap(),
        Warmed::Fetched(4096)
    );
    assert_eq!(origin.gets.load(Ordering::SeqCst), 2);
    // Without a disk tier the warmed blocks are in memory: a read needs no upstream.
    let got = collect(store.read(id, etag, 0..4096, 3 * 4096))
        .await
        .unwrap();
    assert_eq!(got, &data(3 * 4096, 0)[..4096]);
    assert_eq!(origin.gets.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn ranges_are_exact_and_blocks_fetched_once() {
    let (store, origin, id, etag) = setup(10_000, Duration::ZERO, 2);
    let want = data(10_000, 0);
    let size = 10_000;
    for (a, b) in [
        (0, 10_000),
        (4095, 4097),
        (0, 1),
        (9_999, 10_000),
        (5000, 9000),
        (100, 4096),
    ] {
        let got = read_settled(&store, store.read(id.clone(), etag.clone(), a..b, size))
            .await
            .unwrap();
        assert_eq!(got, want[a as usize..b as usize], "range {a}..{b}");
    }
    assert_eq!(
        origin.gets.load(Ordering::SeqCst),
        3,
        "three blocks, one GET each"
    );
    assert_eq!(
        store.classify(&id, &etag, 0..10_000, size).result,
        CacheResult::HitMemory
    );
}

#[tokio::test]
async fn concurrent_cold_readers_share_fetches() {
    let (store, origin, id, etag) = setup(20_000, Duration::from_millis(1), 2);
    let readers: Vec<_> = (0..32)
        .map(|_| {
            tokio::spawn(collect(store.read(
                id.clone(),
                etag.clone(),
                0..20_000,
                20_000,
            )))
        })
        .collect();
    for r in readers {
        assert_eq!(r.await.unwrap().unwrap(), data(20_000, 0));
    }
    assert_eq!(origin.gets.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn a_changed_object_fails_instead_of_mixing_versions() {
    let (store, _origin, id, _) = setup(10_000, Duration::ZERO, 2);
    let stale: Arc<str> = "\"old\"".into();
    let err = collect(store.read(id.clone(), stale.clone(), 0..10_000, 10_000))
        .await
        .unwrap_err();
    assert_eq!(err, UpstreamError::Changed);
    assert_eq!(
        store.classify(&id, &stale, 0..10_000, 10_000).result,
        CacheResult::Miss
    );
}

#[tokio::test]
async fn a_reader_that_leaves_early_still_fills_the_cache() {
    let (store, origin, id, etag) = setup(4096, Duration::from_millis(1), 2);
    {
        let s = store.read(id.clone(), etag.clone(), 0..4096, 4096);
        futures::pin_mut!(s);
        s.next().await.unwrap().unwrap();
    }
    for _ in 0..200 {
        if store.classify(&id, &etag, 0..4096, 4096).result == CacheResult::HitMemory {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        store.classify(&id, &etag, 0..4096, 4096).result,
        CacheResult::HitMemory
    );
    assert_eq!(origin.gets.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn one_reader_fetches_its_window_of_blocks_at_once() {
    // 16 blocks of 4 chunks each, 5 ms per chunk: one at a time would take 320 ms.
    let (store, origin, id, etag) = setup(16 * 4096, Duration::from_millis(5), 8);
    let body = collect(store.read(id, etag, 0..16 * 4096, 16 * 4096)).await;
    assert_eq!(body.unwrap(), data(16 * 4096, 0).to_vec());
    assert_eq!(origin.gets.load(Ordering::SeqCst), 16);
    // The window is 4 blocks: the block being sent and the ones opened ahead of it.
    assert!(origin.most_open_bodies.load(Ordering::SeqCst) >= 3);
}

#[tokio::test]
async fn upstream_fetches_never_exceed_the_cap() {
    let (store, origin, id, etag) = setup(16 * 4096, Duration::from_millis(1), 2);
    let readers: Vec<_> = (0..4u64)
        .map(|i| {
            tokio::spawn(collect(store.read(
                id.clone(),
                etag.clone(),
                i * 4096..16 * 4096,
                16 * 4096,
            )))
        })
        .collect();
    for r in readers {
        r.await.unwrap().unwrap();
    }
    assert_eq!(origin.gets.load(Ordering::SeqCst), 16);
    assert_eq!(origin.most_open_bodies.load(Ordering::SeqCst), 2);
}

/// A store reading ranges range-first, over 4 blocks of 4,096 bytes.
fn range_first(
    metrics: &Arc<Metrics>,
    tweak: impl FnOnce(&mut BlockStoreConfig),
) -> (Arc<BlockStore>, Arc<MemoryUpstream>, ObjectId, Arc<str>) {
    setup_with(4 * 4096, Duration::ZERO, 4, metrics.clone(), |c| {
        c.exact_ranges = true;
        tweak(c);
    })
}

/// Read-ahead on, one block ahead.
fn read_ahead(c: &mut BlockStoreConfig) {
    c.prefetch = larder::read::prefetch::PrefetchConfig {
        enabled: true,
        min_window: 1,
        max_window: 1,
        max_inflight: 4,
        unused_after: Duration::from_secs(60),
    };
}

/// Bytes received from the upstream once they reach `expected` (or 5 s passed): a fetch runs
/// on after the reader that started it has its bytes, in a task of its own.
async fn upstream_bytes(metrics: &Metrics, expected: f64) -> f64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let got = metrics
            .snapshot()
            .sum("larder_upstream_received_bytes_total", &[]);
        if got >= expected || tokio::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn a_cold_range_much_smaller_than_its_block_fetches_only_its_bytes_once() {
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, etag) = range_first(&metrics, |_| {});
    let want = data(4 * 4096, 0);
    let size = 4 * 4096;
    for _ in 0..3 {
        let got = read_settled(&store, store.read(id.clone(), etag.clone(), 100..300, size)).await;
        assert_eq!(got.unwrap(), want[100..300]);
    }
    // One GET of exactly the 200 bytes asked; the same range again is a hit on the part.
    assert_eq!(origin.gets.load(Ordering::SeqCst), 1);
    assert_eq!(upstream_bytes(&metrics, 200.0).await, 200.0);
    assert_eq!(
        store.classify(&id, &etag, 100..300, size).result,
        CacheResult::HitMemory
    );
    // Another range of that block is not the part: a miss, fetched exactly as well.
    assert_eq!(
        store.classify(&id, &etag, 100..301, size).result,
        CacheResult::Miss
    );
    // A range spanning two blocks takes a part of each; one that covers two thirds of its
    // block or more takes the block.
    let got = collect(store.read(id.clone(), etag.clone(), 4000..4200, size)).await;
    assert_eq!(got.unwrap(), want[4000..4200]);
    assert_eq!(upstream_bytes(&metrics, 400.0).await, 400.0);
    let got = collect(store.read(id.clone(), etag.clone(), 8192..11_000, size)).await;
    assert_eq!(got.unwrap(), want[8192..11_000]);
    assert_eq!(
        upstream_bytes(&metrics, 400.0 + 4096.0).await,
        400.0 + 4096.0
    );
    assert_eq!(origin.gets.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn whole_blocks_when_range_first_is_off() {
    let metrics = Arc::new(Metrics::default());
    let (store, _, id, etag) = setup_with(4 * 4096, Duration::ZERO, 4, metrics.clone(), |_| {});
    let got = collect(store.read(id, etag, 100..300, 4 * 4096)).await;
    assert_eq!(got.unwrap(), data(4 * 4096, 0)[100..300]);
    assert_eq!(upstream_bytes(&metrics, 4096.0).await, 4096.0);
}

#[tokio::test]
async fn a_herd_on_one_cold_range_makes_one_get() {
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, etag) = setup_with(
        4 * 4096,
        Duration::from_millis(2),
        4,
        metrics.clone(),
        |c| c.exact_ranges = true,
    );
    let readers: Vec<_> = (0..16)
        .map(|_| {
            tokio::spawn(collect(store.read(
                id.clone(),
                etag.clone(),
                0..2500,
                4 * 4096,
            )))
        })
        .collect();
    for r in readers {
        assert_eq!(r.await.unwrap().unwrap(), data(4 * 4096, 0)[0..2500]);
    }
    assert_eq!(origin.gets.load(Ordering::SeqCst), 1);
    assert_eq!(upstream_bytes(&metrics, 2500.0).await, 2500.0);
}

#[tokio::test]
async fn a_second_range_of_a_block_fetches_the_block_behind_the_reader() {
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, etag) = range_first(&metrics, read_ahead);
    let want = data(4 * 4096, 0);
    let size = 4 * 4096;
    let got = collect(store.read(id.clone(), etag.clone(), 100..300, size)).await;
    assert_eq!(got.unwrap(), want[100..300]);
    assert_eq!(origin.gets.load(Ordering::SeqCst), 1);
    // A second, different range of block 0: its part, and the whole block behind it.
    let got = collect(store.read(id.clone(), etag.clone(), 1000..1100, size)).await;
    assert_eq!(got.unwrap(), want[1000..1100]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.classify(&id, &etag, 0..4096, size).result != CacheResult::HitMemory
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        store.classify(&id, &etag, 0..4096, size).result,
        CacheResult::HitMemory
    );
    assert_eq!(origin.gets.load(Ordering::SeqCst), 3);
    // Any range of it is now a hit, and the read-ahead counted as used.
    let got = collect(store.read(id.clone(), etag.clone(), 2000..2100, size)).await;
    assert_eq!(got.unwrap(), want[2000..2100]);
    assert_eq!(origin.gets.load(Ordering::SeqCst), 3);
    let s = metrics.snapshot();
    assert_eq!(
        s.sum("larder_prefetch_bytes_total", &[("outcome", "used")]),
        4096.0
    );
    // One range of another block only: that block stays unfetched.
    let got = collect(store.read(id.clone(), etag.clone(), 5000..5100, size)).await;
    assert_eq!(got.unwrap(), want[5000..5100]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(origin.gets.load(Ordering::SeqCst), 4);
    assert_eq!(
        store.classify(&id, &etag, 4096..8192, size).result,
        CacheResult::Miss
    );
}

#[tokio::test]
async fn blocks_are_never_completed_from_parts_when_told_so() {
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, etag) = range_first(&metrics, |c| {
        read_ahead(c);
        c.complete_block_after = 0;
    });
    for (a, b) in [(100, 300), (1000, 1100), (2000, 2100)] {
        let got = collect(store.read(id.clone(), etag.clone(), a..b, 4 * 4096)).await;
        assert_eq!(got.unwrap(), data(4 * 4096, 0)[a as usize..b as usize]);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(origin.gets.load(Ordering::SeqCst), 3);
    assert_eq!(upstream_bytes(&metrics, 400.0).await, 400.0);
}

#[tokio::test]
async fn the_same_range_fetched_again_completes_no_block_but_a_different_one_does() {
    // A memory tier too small for the 200-byte part, so each read of it fetches it again, as
    // when a full tier let it go or turned it away.
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, etag) = range_first(&metrics, |c| {
        read_ahead(c);
        c.memory_capacity = 150;
    });
    let want = data(4 * 4096, 0);
    for _ in 0..3 {
        let got = collect(store.read(id.clone(), etag.clone(), 100..300, 4 * 4096)).await;
        assert_eq!(got.unwrap(), want[100..300]);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(origin.gets.load(Ordering::SeqCst), 3);
    assert_eq!(upstream_bytes(&metrics, 600.0).await, 600.0);
    // A different range of the block: its part, and the whole block behind it.
    let got = collect(store.read(id.clone(), etag.clone(), 1000..1100, 4 * 4096)).await;
    assert_eq!(got.unwrap(), want[1000..1100]);
    assert_eq!(
        upstream_bytes(&metrics, 600.0 + 100.0 + 4096.0).await,
        600.0 + 100.0 + 4096.0
    );
    assert_eq!(origin.gets.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn a_cold_range_spanning_blocks_sends_every_piece_at_once() {
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, _) = setup_with(
        4 * 4096,
        Duration::from_millis(2),
        8,
        metrics.clone(),
        |c| c.exact_ranges = true,
    );
    // Bytes 0..=9000: blocks 0 and 1 whole, 809 bytes of block 2 (a part): three GETs, all
    // sent before the metadata came back. (A range from inside block 0 opens with its tail:
    // `a_cold_range_from_inside_its_block_opens_with_its_tail`.)
    let asked = larder::model::ByteRange::FromTo {
        first: 0,
        last: Some(9000),
    };
    let (meta, _) = store
        .open_cold(id.clone(), asked, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(origin.gets.load(Ordering::SeqCst), 3);
    let etag: Arc<str> = meta.etag.clone();
    let got = collect(store.read(id.clone(), etag.clone(), 0..9001, meta.size)).await;
    assert_eq!(got.unwrap(), data(4 * 4096, 0)[0..9001]);
    assert_eq!(origin.gets.load(Ordering::SeqCst), 3);
    assert_eq!(
        upstream_bytes(&metrics, 8192.0 + 809.0).await,
        8192.0 + 809.0
    );
    // A suffix is one piece: a part of the last block, found again by the same suffix.
    origin.put("k2", data(4 * 4096, 3), "\"e2\"");
    let other = ObjectId {
        key: "k2".into(),
        ..id
    };
    let asked = larder::model::ByteRange::Suffix(100);
    let (meta, _) = store
        .open_cold(other.clone(), asked, None)
        .await
        .unwrap()
        .unwrap();
    let etag: Arc<str> = meta.etag.clone();
    let tail = 4 * 4096 - 100..4 * 4096;
    for _ in 0..2 {
        let got = collect(store.read(other.clone(), etag.clone(), tail.clone(), meta.size)).await;
        assert_eq!(got.unwrap(), data(4 * 4096, 3)[tail.start as usize..]);
    }
    assert_eq!(origin.gets.load(Ordering::SeqCst), 4);
}

/// The in-memory upstream, recording the span of every GET (`true`: one that brought the
/// metadata of a cold read), and holding GETs from byte 0 until `held` is released, or failing
/// them when `fail_held` is set.
struct Recording {
    inner: MemoryUpstream,
    gets: parking_lot::Mutex<Vec<(bool, std::ops::Range<u64>)>>,
    held: tokio::sync::Semaphore,
    fail_held: std::sync::atomic::AtomicBool,
}

impl Recording {
    fn new(size: usize) -> Arc<Self> {
        let inner = MemoryUpstream::default();
        inner.put("k", data(size, 0), "\"e1\"");
        Arc::new(Self {
            inner,
            gets: Default::default(),
            held: tokio::sync::Semaphore::new(0),
            fail_held: Default::default(),
        })
    }

    fn gets(&self) -> Vec<(bool, std::ops::Range<u64>)> {
        let mut gets = self.gets.lock().clone();
        gets.sort_by_key(|(_, r)| (r.start, r.end));
        gets
    }
}

#[async_trait::async_trait]
impl larder::upstream::Upstream for Recording {
    async fn head(&self, object: &ObjectId) -> Result<larder::model::ObjectMeta, UpstreamError> {
        self.inner.head(object).await
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<std::ops::Range<u64>>,
    ) -> Result<larder::model::BodyStream, UpstreamError> {
        let range = range.unwrap_or(0..u64::MAX);
        self.gets.lock().push((false, range.clone()));
        if range.start == 0 {
            if self.fail_held.load(Ordering::SeqCst) {
                return Err(UpstreamError::Transport("connection reset".into()));
            }
            let _ = self.held.acquire().await.unwrap();
        }
        self.inner.get(object, if_match, Some(range)).await
    }

    async fn get_with_meta(
        &self,
        object: &ObjectId,
        span: larder::model::ByteRange,
    ) -> Result<Option<(larder::model::ObjectMeta, larder::model::BodyStream)>, UpstreamError> {
        let within = span.within(self.inner.head(object).await?.size);
        self.gets.lock().push((true, within));
        self.inner.get_with_meta(object, span).await
    }

    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        self.inner.list(bucket, prefix, token).await
    }
}

/// A range-first store over [`Recording`] (4 blocks of 4,096 bytes).
fn over_recording(metrics: &Arc<Metrics>) -> (Arc<BlockStore>, Arc<Recording>, ObjectId, Arc<str>) {
    let origin = Recording::new(4 * 4096);
    let config = BlockStoreConfig {
        exact_ranges: true,
        ..BlockStoreConfig::for_tests()
    };
    let store = Arc::new(BlockStore::new(config, origin.clone(), metrics.clone()));
    let id = ObjectId {
        bucket: "b".into(),
        key: "k".into(),
        version_id: None,
    };
    (store, origin, id, "\"e1\"".into())
}

/// Wait (at most 5 s) for `range` of the object to be a memory hit.
async fn until_in_memory(
    store: &BlockStore,
    id: &ObjectId,
    etag: &Arc<str>,
    range: std::ops::Range<u64>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.classify(id, etag, range.clone(), 4 * 4096).result != CacheResult::HitMemory
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn a_range_from_inside_its_block_is_read_before_the_bytes_before_it_arrive() {
    // Bytes 1000..4096 are three quarters of block 0: the block is fetched, tail first. The
    // GET of the head (from byte 0) is held, and the reader must still get its bytes: fetched
    // from the block's start, as before, they waited for the head.
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, etag) = over_recording(&metrics);
    let want = data(4 * 4096, 0);
    let read = collect(store.read(id.clone(), etag.clone(), 1000..4096, 4 * 4096));
    let got = tokio::time::timeout(Duration::from_secs(5), read).await;
    assert_eq!(
        got.expect("the tail waited for the head").unwrap(),
        want[1000..4096]
    );
    // The head comes, and the block is cached whole: each of its bytes fetched once.
    origin.held.add_permits(1);
    until_in_memory(&store, &id, &etag, 0..4096).await;
    assert_eq!(
        store.classify(&id, &etag, 0..4096, 4 * 4096).result,
        CacheResult::HitMemory
    );
    assert_eq!(origin.gets(), vec![(false, 0..1000), (false, 1000..4096)]);
    assert_eq!(upstream_bytes(&metrics, 4096.0).await, 4096.0);
    let got = collect(store.read(id.clone(), etag.clone(), 0..4096, 4 * 4096)).await;
    assert_eq!(got.unwrap(), want[0..4096]);
    assert_eq!(origin.gets().len(), 2);
}

#[tokio::test]
async fn a_cold_range_from_inside_its_block_opens_with_its_tail() {
    // The first read of the object: the tail's GET brings the metadata, the other pieces go
    // with it, and the head (held) follows once the metadata is known.
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, _) = over_recording(&metrics);
    let asked = larder::model::ByteRange::FromTo {
        first: 1000,
        last: Some(9000),
    };
    let (meta, _) = store
        .open_cold(id.clone(), asked, None)
        .await
        .unwrap()
        .unwrap();
    let etag: Arc<str> = meta.etag.clone();
    let read = collect(store.read(id.clone(), etag.clone(), 1000..9001, meta.size));
    let got = tokio::time::timeout(Duration::from_secs(5), read).await;
    assert_eq!(
        got.expect("the tail waited for the head").unwrap(),
        data(4 * 4096, 0)[1000..9001]
    );
    origin.held.add_permits(1);
    until_in_memory(&store, &id, &etag, 0..4096).await;
    assert_eq!(
        origin.gets(),
        vec![
            (false, 0..1000),
            (true, 1000..4096),
            (true, 4096..8192),
            (true, 8192..9001)
        ]
    );
    assert_eq!(
        upstream_bytes(&metrics, 8192.0 + 809.0).await,
        8192.0 + 809.0
    );
}

#[tokio::test]
async fn a_herd_on_a_range_read_tail_first_makes_one_get_of_each_half() {
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, etag) = over_recording(&metrics);
    origin.held.add_permits(64);
    let readers: Vec<_> = (0..16)
        .map(|i| {
            // Half of them read the tail's range, half the whole block.
            let range = if i % 2 == 0 { 1000..4096 } else { 0..4096 };
            let read = collect(store.read(id.clone(), etag.clone(), range.clone(), 4 * 4096));
            tokio::spawn(async move { (range, read.await) })
        })
        .collect();
    let want = data(4 * 4096, 0);
    for r in readers {
        let (range, got) = r.await.unwrap();
        assert_eq!(got.unwrap(), want[range.start as usize..range.end as usize]);
    }
    until_in_memory(&store, &id, &etag, 0..4096).await;
    assert_eq!(origin.gets(), vec![(false, 0..1000), (false, 1000..4096)]);
}

#[tokio::test]
async fn a_head_that_fails_costs_the_reader_nothing_and_caches_nothing() {
    let metrics = Arc::new(Metrics::default());
    let (store, origin, id, etag) = over_recording(&metrics);
    origin.fail_held.store(true, Ordering::SeqCst);
    let got = collect(store.read(id.clone(), etag.clone(), 1000..4096, 4 * 4096)).await;
    assert_eq!(got.unwrap(), data(4 * 4096, 0)[1000..4096]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The block failed (counted as a dropped write), so nothing claims to hold it.
    assert_eq!(
        store.classify(&id, &etag, 0..4096, 4 * 4096).result,
        CacheResult::Miss
    );
    let s = metrics.snapshot();
    assert_eq!(
        s.sum(
            "larder_cache_writes_dropped_total",
            &[("reason", "fetch_failed")]
        ),
        1.0
    );
    // The next read of the block fetches it again, and gets it.
    origin.fail_held.store(false, Ordering::SeqCst);
    origin.held.add_permits(8);
    let got = collect(store.read(id.clone(), etag.clone(), 0..4096, 4 * 4096)).await;
    assert_eq!(got.unwrap(), data(4 * 4096, 0)[0..4096]);
}

mod disk_tests {
    use super::*;
    use cache_core::disk::DiskConfig;

    /// `body` as object `b/k` at ETag `"e1"`.
    fn put(origin: &MemoryUpstream, body: &Bytes) -> (ObjectId, Arc<str>) {
        origin.put("k", body.clone(), "\"e1\"");
        let id = ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        };
        (id, "\"e1\"".into())
    }

    async fn store_over(
        path: &std::path::Path,
        origin: Arc<MemoryUpstream>,
    ) -> (Arc<BlockStore>, DiskCache) {
        let metrics = Arc::new(Metrics::default());
        store_with(path, origin, (64 * 1024, 1 << 20), metrics).await
    }

    /// A store of `block`-byte blocks over a disk of 8 `region`-byte regions.
    async fn store_with(
        path: &std::path::Path,
        origin: Arc<MemoryUpstream>,
        (block, region): (u64, u64),
        metrics: Arc<Metrics>,
    ) -> (Arc<BlockStore>, DiskCache) {
        let mut cfg = DiskConfig::new(path, (1 << 20) + 8 * region);
        cfg.region_size = region;
        let disk = DiskCache::open(cfg).await.expect("disk");
        let config = BlockStoreConfig {
            layout: BlockLayout::new(block),
            disk: Some(disk.clone()),
            ..BlockStoreConfig::for_tests()
        };
        let store = BlockStore::new(config, origin, metrics);
        (Arc::new(store), disk)
    }

    #[tokio::test]
    async fn a_block_failing_its_checksum_part_way_on_disk_is_finished_by_the_upstream() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache");
        let origin = Arc::new(MemoryUpstream::with_delay(Duration::ZERO));
        // One block, and no period, so its bytes are found on the device by their first 4 KiB.
        let size = 2 << 20;
        let body: Bytes = (0..size)
            .map(|i: u64| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect::<Vec<_>>()
            .into();
        let (id, etag) = put(&origin, &body);
        let geometry = (2 << 20, 4 << 20);
        let metrics = Arc::new(Metrics::default());
        let (store, disk) = store_with(&path, origin.clone(), geometry, metrics).await;
        let got = collect(store.read(id.clone(), etag.clone(), 0..size, size)).await;
        assert_eq!(got.unwrap(), body);
        assert!(store.settled(Duration::from_secs(5)).await);
        disk.close().await;
        drop((store, disk));

        // One byte 1.5 MiB into block 0 flips: its first pieces verify, a later one does not.
        let mut device = std::fs::read(&path).expect("read");
        let start = device
            .windows(4096)
            .position(|w| w == &body[..4096])
            .expect("block 0 is on the device");
        device[start + (3 << 19)] ^= 0x5a;
        std::fs::write(&path, &device).expect("write");

        let gets = origin.gets.load(Ordering::SeqCst);
        let metrics = Arc::new(Metrics::default());
        let (store, disk) = store_with(&path, origin.clone(), geometry, metrics.clone()).await;
        // A whole object of one block, the only disk read: streamed in pieces.
        let got = collect(store.read(id.clone(), etag.clone(), 0..size, size)).await;
        assert_eq!(
            got.unwrap(),
            body,
            "right bytes, from disk then the upstream"
        );
        assert_eq!(disk.stats().corrupt, 1);
        assert_eq!(origin.gets.load(Ordering::SeqCst), gets + 1);
        // The upstream sent the rest of block 0 from the last verified piece, not the block.
        let fetched = upstream_bytes(&metrics, 1.0).await;
        assert!(
            fetched > 0.0 && fetched < f64::from(2 << 20) * 0.75,
            "{fetched} bytes from the upstream"
        );
    }

    #[tokio::test]
    async fn a_small_block_failing_its_checksum_on_disk_is_served_from_the_upstream() {
        // Blocks of up to 1 MiB on disk are read in the reader's own open, not through a
        // flight: a read that fails its check must still end in the right bytes.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache");
        let origin = Arc::new(MemoryUpstream::with_delay(Duration::ZERO));
        let size = 3 * 64 * 1024;
        let body: Bytes = (0..size)
            .map(|i: u64| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect::<Vec<_>>()
            .into();
        let (id, etag) = put(&origin, &body);
        let (store, disk) = store_over(&path, origin.clone()).await;
        let got = collect(store.read(id.clone(), etag.clone(), 0..size, size)).await;
        assert_eq!(got.unwrap(), body);
        assert!(store.settled(Duration::from_secs(5)).await);
        disk.close().await;
        drop((store, disk));

        // One byte of block 1 flips on the device.
        let mut device = std::fs::read(&path).expect("read");
        let block1 = &body[64 * 1024..68 * 1024];
        let start = device
            .windows(4096)
            .position(|w| w == block1)
            .expect("block 1 is on the device");
        device[start + 1000] ^= 0x5a;
        std::fs::write(&path, &device).expect("write");

        let gets = origin.gets.load(Ordering::SeqCst);
        let (store, disk) = store_over(&path, origin.clone()).await;
        assert_eq!(
            store.classify(&id, &etag, 0..size, size).result,
            CacheResult::HitDisk
        );
        let got = collect(store.read(id.clone(), etag.clone(), 0..size, size)).await;
        assert_eq!(got.unwrap(), body, "right bytes: blocks 0 and 2 from disk");
        assert_eq!(disk.stats().corrupt, 1);
        assert_eq!(
            origin.gets.load(Ordering::SeqCst),
            gets + 1,
            "block 1 alone from the upstream"
        );
        // Read again: all from memory now, the upstream's block 1 included.
        let got = collect(store.read(id.clone(), etag.clone(), 0..size, size)).await;
        assert_eq!(got.unwrap(), body);
        assert_eq!(origin.gets.load(Ordering::SeqCst), gets + 1);
    }

    #[tokio::test]
    async fn a_read_within_one_block_on_disk_is_one_buffer_holding_its_room() {
        // The one-buffer path of a disk hit: the bytes asked of the one block under them, read
        // from disk, with the block's room held until they are dropped, counted as served
        // from disk; a read across blocks is left to `read` with nothing counted.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache");
        let origin = Arc::new(MemoryUpstream::with_delay(Duration::ZERO));
        let body: Bytes = (0..200_000u32)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<_>>()
            .into();
        let size = body.len() as u64;
        let (id, etag) = put(&origin, &body);
        let (store, disk) = store_over(&path, origin.clone()).await;
        collect(store.read(id.clone(), etag.clone(), 0..size, size))
            .await
            .expect("read");
        assert!(store.settled(Duration::from_secs(5)).await);
        disk.close().await;
        drop((store, disk));

        let metrics = Arc::new(Metrics::default());
        let geometry = (64 * 1024, 1 << 20);
        let (store, _disk) = store_with(&path, origin.clone(), geometry, metrics.clone()).await;
        let gets = origin.gets.load(Ordering::SeqCst);
        let served = || {
            metrics
                .snapshot()
                .sum("larder_served_bytes_total", &[("tier", "disk")])
        };
        let across = 60_000..70_000;
        let found = store.classify(&id, &etag, across.clone(), size);
        assert_eq!(found.result, CacheResult::HitDisk);
        let held = store.read_in_one(&id, across, size, found).await;
        assert!(held.is_none(), "two blocks: `read`'s");
        assert_eq!(served(), 0.0, "nothing counted for it");

        let held = store
            .read_in_one(
                &id,
                66_000..130_000,
                size,
                store.classify(&id, &etag, 66_000..130_000, size),
            )
            .await
            .expect("one block on disk");
        assert_eq!(held.bytes, body[66_000..130_000]);
        assert_eq!(
            store.response_buffer().0,
            64 * 1024,
            "the block's room is held"
        );
        assert_eq!(served(), 64_000.0);
        drop(held);
        assert_eq!(store.response_buffer().0, 0, "and given back");
        // The tier had room: the block read whole from disk is in memory now.
        assert_eq!(
            store.classify(&id, &etag, 66_000..130_000, size).result,
            CacheResult::HitMemory
        );
        // A small slice reads only its chunk, and leaves the block on disk alone.
        let held = store
            .read_in_one(
                &id,
                140_000..141_000,
                size,
                store.classify(&id, &etag, 140_000..141_000, size),
            )
            .await
            .expect("a small slice on disk");
        assert_eq!(held.bytes, body[140_000..141_000]);
        assert_eq!(served(), 65_000.0);
        drop(held);
        assert_eq!(
            store.classify(&id, &etag, 140_000..141_000, size).result,
            CacheResult::HitDisk
        );
        assert_eq!(origin.gets.load(Ordering::SeqCst), gets, "no upstream GET");
    }

    #[tokio::test]
    async fn a_restarted_store_serves_from_disk_without_the_origin() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache");
        let origin = Arc::new(MemoryUpstream::with_delay(Duration::ZERO));
        let body: Bytes = (0..300_000u32)
            .map(|i| (i % 241) as u8)
            .collect::<Vec<_>>()
            .into();
        let (id, etag) = put(&origin, &body);
        let (store, disk) = store_over(&path, origin.clone()).await;
        let got: Vec<Bytes> = store
            .read(id.clone(), etag.clone(), 0..300_000, 300_000)
            .map(|r| r.expect("read"))
            .collect()
            .await;
        assert_eq!(got.concat(), body.to_vec());
        let fetched = origin.gets.load(std::sync::atomic::Ordering::SeqCst);
        assert!(store.settled(Duration::from_secs(5)).await);
        disk.close().await;
        drop((store, disk));

        let (store, _disk) = store_over(&path, origin.clone()).await;
        assert_eq!(
            store.classify(&id, &etag, 1000..250_000, 300_000).result,
            CacheResult::HitDisk
        );
        let got: Vec<Bytes> = store
            .read(id.clone(), etag.clone(), 1000..250_000, 300_000)
            .map(|r| r.expect("read"))
            .collect()
            .await;
        assert_eq!(got.concat(), body[1000..250_000].to_vec());
        assert_eq!(
            origin.gets.load(std::sync::atomic::Ordering::SeqCst),
            fetched,
            "no upstream GET after restart"
        );
        assert!(store.settled(Duration::from_secs(5)).await);
        // Promoted: now every touched block is in memory.
        assert_eq!(
            store.classify(&id, &etag, 1000..250_000, 300_000).result,
            CacheResult::HitMemory
        );

        // A small range of a block only on disk reads just that range's chunk from disk.
        let before = store.disk().expect("disk").stats();
        let got: Vec<Bytes> = store
            .read(id.clone(), etag.clone(), 270_000..270_100, 300_000)
            .map(|r| r.expect("read"))
            .collect()
            .await;
        assert_eq!(got.concat(), body[270_000..270_100].to_vec());
        let after = store.disk().expect("disk").stats();
        assert_eq!(after.hits - before.hits, 1);
        assert_eq!(after.hit_bytes - before.hit_bytes, 100);
        assert_eq!(
            store.classify(&id, &etag, 270_000..270_100, 300_000).result,
            CacheResult::HitDisk,
            "a small range is not promoted"
        );
        assert_eq!(
            origin.gets.load(std::sync::atomic::Ordering::SeqCst),
            fetched
        );
    }
}
