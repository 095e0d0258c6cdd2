//! The S3 front in process, over the in-memory upstream: what a cached GET answers and what it
//! costs the upstream, without a network or MinIO.
// Helpers of a test file: an unwrap that fails is the test failing, with its message.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use bytes::Bytes;
use http::{header, HeaderMap, Method, StatusCode};
use http_body_util::BodyExt;
use larder::auth::Authenticator;
use larder::freshness::Freshness;
use larder::front::routes::{service, AppState};
use larder::model::{BodyStream, ObjectId, ObjectMeta, UpstreamError};
use larder::read::blocks::{BlockStore, BlockStoreConfig};
use larder::read::metadata::MetadataCache;
use larder::telemetry::metrics::Metrics;
use larder::upstream::memory::MemoryUpstream;
use larder::upstream::Upstream;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tower::ServiceExt;

fn app(origin: Arc<dyn Upstream>) -> Arc<AppState> {
    app_with(origin, false)
}

/// [`app`], with range-first reads (`cold_ranges = "exact"`, the binary's default) or not.
fn app_with(origin: Arc<dyn Upstream>, exact_ranges: bool) -> Arc<AppState> {
    let metrics = Arc::new(Metrics::default());
    let config = BlockStoreConfig {
        read_window: 2,
        upstream_concurrency: 8,
        exact_ranges,
        ..BlockStoreConfig::for_tests()
    };
    let metadata = Arc::new(MetadataCache::new(
        origin.clone(),
        Duration::from_secs(3600),
        Duration::ZERO,
        100,
    ));
    Arc::new(AppState {
        base_domain: None,
        auth: Authenticator::None,
        forwarder: Arc::new(common::forwarder_to_nowhere()),
        freshness: Arc::new(Freshness::local(metadata.clone(), metrics.clone())),
        listings: None,
        parts: Default::default(),
        metadata,
        blocks: Arc::new(BlockStore::new(config, origin.clone(), metrics.clone())),
        origin,
        metrics,
        larder_pays: false,
        profile: Default::default(),
    })
}

/// `len` bytes of a pattern repeating every 251 bytes: no two blocks or parts alike.
fn pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// An app over an upstream holding `k`: three 4 KiB blocks of a repeating pattern, at "v1".
fn three_blocks() -> (Bytes, Arc<MemoryUpstream>, Arc<AppState>) {
    let data = pattern(3 * 4096);
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data.clone(), "\"v1\"");
    let app = app(origin.clone());
    (data, origin, app)
}

async fn get(app: &Arc<AppState>, range: &str) -> (StatusCode, HeaderMap, Bytes) {
    get_key(app, "k", range).await
}

async fn get_key(app: &Arc<AppState>, key: &str, range: &str) -> (StatusCode, HeaderMap, Bytes) {
    let req = Request::builder()
        .uri(format!("/bucket/{key}"))
        .header(header::RANGE, range)
        .body(Body::empty())
        .unwrap();
    send(app, req).await
}

/// The answer to `req`, its body read whole.
async fn send(app: &Arc<AppState>, req: Request) -> (StatusCode, HeaderMap, Bytes) {
    let response = service(app.clone()).oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

#[tokio::test]
async fn an_object_changed_under_cached_metadata_is_served_whole_from_the_new_version() {
    let v1: Bytes = vec![1u8; 3 * 4096].into();
    let v2: Bytes = vec![2u8; 3 * 4096].into();
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", v1.clone(), "\"v1\"");
    let app = app(origin.clone());
    let (status, headers, body) = get(&app, "bytes=0-9").await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::PARTIAL_CONTENT, &v1[..10])
    );
    assert_eq!(headers[header::ETAG], "\"v1\"");

    // Overwritten upstream while v1's metadata is still trusted; block 2 was never fetched.
    origin.put("k", v2.clone(), "\"v2\"");
    let (status, headers, body) = get(&app, "bytes=8192-8201").await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::PARTIAL_CONTENT, &v2[8192..8202])
    );
    assert_eq!(
        headers[header::ETAG],
        "\"v2\"",
        "headers and bytes come from the same version"
    );
    // Both times nothing was known, so metadata came with a block GET: 1 for v1's block 0,
    // 1 refused (If-Match v1), 1 for v2's block 2.
    assert_eq!(origin.heads.load(Ordering::SeqCst), 0);
    assert_eq!(origin.gets.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_access_profile_holds_the_bytes_each_get_was_answered_with() {
    let (_, _, app) = three_blocks();
    get(&app, "bytes=0-9").await;
    app.profile.start(None);
    // A cold range, the same range again (a hit), a suffix, the whole object and a HEAD.
    get(&app, "bytes=5000-5009").await;
    get(&app, "bytes=5000-5009").await;
    get(&app, "bytes=-10").await;
    get_key(&app, "k", "").await;
    let head = Request::builder()
        .method(Method::HEAD)
        .uri("/bucket/k")
        .body(Body::empty())
        .unwrap();
    send(&app, head).await;
    // A range past the end is answered with no bytes: nothing read.
    let (status, _, _) = get(&app, "bytes=99999-").await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
    let report = app.profile.report();
    assert_eq!((report.reads, report.objects), (4, 1));
    assert_eq!(
        serde_json::to_value(&report.warm).unwrap(),
        serde_json::json!([{
            "bucket": "bucket", "keys": [], "prefix": null, "range": null,
            "objects": [{"key": "k", "ranges": ["bytes=0-12287"]}],
        }])
    );
    // Stopped: reads are no longer recorded.
    app.profile.stop();
    get(&app, "bytes=0-9").await;
    assert_eq!(app.profile.report().reads, 4);
}

#[tokio::test]
async fn a_cold_get_brings_metadata_and_its_block_in_one_request() {
    let (data, origin, app) = three_blocks();
    let (status, headers, body) = get(&app, "bytes=5000-5009").await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::PARTIAL_CONTENT, &data[5000..5010])
    );
    assert_eq!(headers[header::CONTENT_RANGE], "bytes 5000-5009/12288");
    // Values new in nearly every response: never indexed by HTTP/2's header compression.
    assert!(headers[header::CONTENT_RANGE].is_sensitive());
    assert!(headers["x-amz-request-id"].is_sensitive());
    assert_eq!(headers["x-cache"], "miss");
    assert_eq!(origin.heads.load(Ordering::SeqCst), 0);
    assert_eq!(origin.gets.load(Ordering::SeqCst), 1, "one GET, of block 1");
    let (_, headers, body) = get(&app, "bytes=4096-8191").await;
    assert_eq!(&body[..], &data[4096..8192]);
    // The block may still be arriving for the first reader's fetch: joined, not fetched again.
    assert!(["hit-memory", "coalesced"].contains(&headers["x-cache"].to_str().unwrap()));
    assert_eq!(origin.gets.load(Ordering::SeqCst), 1);

    // A suffix range asks for just those bytes, and gets the metadata with them. An empty
    // object refuses a ranged GET: HEAD then.
    origin.put("s", data.clone(), "\"s1\"");
    origin.put("e", Bytes::new(), "\"e1\"");
    for (key, range, want) in [
        ("s", Some("bytes=-10"), &data[12278..]),
        ("e", None, &[][..]),
    ] {
        let mut req = Request::builder().uri(format!("/bucket/{key}"));
        if let Some(range) = range {
            req = req.header(header::RANGE, range);
        }
        let req = req.body(Body::empty()).unwrap();
        let response = service(app.clone()).oneshot(req).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], want, "{key}");
    }
    assert_eq!(origin.heads.load(Ordering::SeqCst), 1, "the empty object's");
    // "s": one GET of its last 10 bytes; "e": one refused ranged GET.
    assert_eq!(origin.gets.load(Ordering::SeqCst), 1 + 1 + 1);
}

#[tokio::test]
async fn a_cold_range_across_blocks_is_a_miss_though_its_first_blocks_landed_first() {
    let (data, origin, app) = three_blocks();
    // Nothing known: the GETs that bring the metadata bring the first two blocks too (landed
    // or still arriving when the answer is labelled); the third is fetched after. All of it
    // came from the upstream for this request: a miss, not a partial hit.
    let (status, headers, body) = get(&app, "bytes=100-12000").await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::PARTIAL_CONTENT, &data[100..12001])
    );
    assert_eq!(headers["x-cache"], "miss");
    // Once the object is known, a range over a cached block and one never read is partial.
    origin.put("p", data.clone(), "\"p1\"");
    let (_, headers, _) = get_key(&app, "p", "bytes=0-10").await;
    assert_eq!(headers["x-cache"], "miss");
    assert!(app.blocks.settled(Duration::from_secs(5)).await);
    let (_, headers, body) = get_key(&app, "p", "bytes=4000-12287").await;
    assert_eq!(&body[..], &data[4000..]);
    assert_eq!(headers["x-cache"], "partial");
}

/// An S3 error answer: `status`, an XML body naming `code`, a request id, `X-Cache: error`.
fn assert_s3_error(answer: (StatusCode, HeaderMap, Bytes), status: StatusCode, code: &str) {
    let (got, headers, body) = answer;
    assert_eq!(got, status);
    assert!(!headers["x-amz-request-id"].is_empty());
    assert_eq!(headers["x-cache"], "error");
    assert!(std::str::from_utf8(&body)
        .unwrap()
        .contains(&format!("<Code>{code}</Code>")));
}

#[tokio::test]
async fn errors_are_s3_xml_with_a_request_id() {
    let app = app(Arc::new(MemoryUpstream::default()));
    assert_s3_error(
        get(&app, "bytes=0-1").await,
        StatusCode::NOT_FOUND,
        "NoSuchKey",
    );
}

/// An upstream client with a bug: every call panics.
struct Panicking;

#[async_trait::async_trait]
impl Upstream for Panicking {
    async fn head(&self, _: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        panic!("a bug in the upstream client (HEAD)")
    }
    async fn get(
        &self,
        _: &ObjectId,
        _: Option<&str>,
        _: Option<std::ops::Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        panic!("a bug in the upstream client (GET)")
    }
    async fn list(
        &self,
        _: &str,
        _: &str,
        _: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        panic!("a bug in the upstream client (LIST)")
    }
}

#[tokio::test]
async fn a_handler_that_panics_answers_500_internal_error_and_the_next_request_is_served() {
    let app = app(Arc::new(Panicking));
    for _ in 0..2 {
        // Without the catch, the panic unwinds out of the service and this test fails there.
        assert_s3_error(
            get(&app, "bytes=0-1").await,
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
        );
    }
    // Counted as any failed request is.
    let counted = app.metrics.snapshot().sum(
        "larder_requests_total",
        &[("status", "500"), ("cache", "error")],
    );
    assert_eq!(counted, 2.0);
}

async fn get_part(app: &Arc<AppState>, key: &str, n: u16) -> (StatusCode, HeaderMap, Bytes) {
    let req = Request::builder()
        .uri(format!("/bucket/{key}?partNumber={n}"))
        .body(Body::empty())
        .unwrap();
    send(app, req).await
}

/// Part `n` of `k` (`data`, uploaded in parts of `part_size` bytes), checked: a 206 with the
/// part's bytes; its headers.
async fn read_part(app: &Arc<AppState>, data: &Bytes, part_size: u64, n: u16) -> HeaderMap {
    let (status, headers, body) = get_part(app, "k", n).await;
    let first = (n as usize - 1) * part_size as usize;
    let end = (first + part_size as usize).min(data.len());
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&body[..], &data[first..end], "part {n} of {part_size}");
    headers
}

/// An object read by its parts, then whole or by ranges: the blocks its parts cut into pieces
/// are assembled from those pieces, with no GET, and then serve the parts too.
#[tokio::test]
async fn blocks_cut_into_pieces_by_parts_are_assembled_from_them() {
    let data = pattern(3 * 4096);
    // 6,000-byte parts cut blocks 1 and 2 into two pieces each (block 0 is part 1's whole);
    // 3,500-byte parts cut every block.
    for part_size in [6000u64, 3500] {
        let origin = Arc::new(MemoryUpstream::default().with_parts(part_size));
        origin.put("k", data.clone(), "\"v1\"");
        let app = app_with(origin.clone(), true);
        let parts = data.len().div_ceil(part_size as usize) as u16;
        for n in 1..=parts {
            assert_eq!(get_part(&app, "k", n).await.0, StatusCode::PARTIAL_CONTENT);
        }
        let fetched = origin.gets.load(Ordering::SeqCst);
        assert_eq!(fetched, parts as usize, "one GET a part");
        // Whole, then a range in one block and one across two: every byte from the pieces.
        for range in ["bytes=0-", "bytes=100-200", "bytes=4000-9000"] {
            let (status, headers, body) = get(&app, range).await;
            let (first, last) = match range {
                "bytes=0-" => (0, data.len() - 1),
                "bytes=100-200" => (100, 200),
                _ => (4000, 9000),
            };
            assert_eq!(status, StatusCode::PARTIAL_CONTENT, "{range}");
            assert_eq!(
                &body[..],
                &data[first..=last],
                "{range} of parts of {part_size}"
            );
            assert_eq!(
                headers["x-cache"], "hit-memory",
                "{range} of parts of {part_size}"
            );
        }
        assert_eq!(
            origin.gets.load(Ordering::SeqCst),
            fetched,
            "parts of {part_size}: no GET after the parts"
        );
        // The parts again: from the blocks, which took the pieces' place.
        for n in 1..=parts {
            let headers = read_part(&app, &data, part_size, n).await;
            assert_eq!(headers["x-cache"], "hit-memory");
        }
        assert_eq!(origin.gets.load(Ordering::SeqCst), fetched);
        let memory = app.blocks.memory();
        memory.sync().await;
        assert_eq!(
            memory.stats().entries,
            3,
            "parts of {part_size}: the three blocks, no pieces beside them"
        );
    }
}

/// A part read first is one GET of that part: its answer says where the part lies and its body
/// fills the blocks it covers, so the next read of any part costs the upstream nothing. Parts
/// on block boundaries (4 KiB) cost one GET each; parts across them (6,000 bytes) fetch the
/// blocks a part's GET did not cover whole, once.
#[tokio::test]
async fn a_part_read_first_is_one_get_of_the_part_and_fills_the_cache() {
    let data = pattern(3 * 4096);
    // Range-first (the default): parts on blocks, parts across them, and parts most of a
    // block long cost one GET a part, whatever their place, the pieces of blocks they cover
    // cached as the parts cut them. Whole blocks only: a part across blocks also fetches the
    // blocks it covers in part.
    let cases = [
        (true, 4096u64, 3),
        (true, 6000, 3),
        (true, 3500, 4),
        (false, 4096, 3),
        (false, 6000, 5),
    ];
    for (exact_ranges, part_size, first_round_gets) in cases {
        let origin = Arc::new(MemoryUpstream::default().with_parts(part_size));
        origin.put("k", data.clone(), "\"v1\"");
        let app = app_with(origin.clone(), exact_ranges);
        let parts = data.len().div_ceil(part_size as usize) as u16;
        for round in 0..2 {
            for n in 1..=parts {
                let headers = read_part(&app, &data, part_size, n).await;
                let first = (n as usize - 1) * part_size as usize;
                let end = (first + part_size as usize).min(data.len());
                let range = format!("bytes {}-{}/{}", first, end - 1, data.len());
                assert_eq!(headers[header::CONTENT_RANGE], range.as_str());
                assert_eq!(headers["x-amz-mp-parts-count"], parts.to_string().as_str());
                let cache = headers["x-cache"].to_str().unwrap();
                if round == 0 {
                    assert_eq!(cache, "miss", "part {n} of {part_size}");
                } else {
                    assert!(["hit-memory", "coalesced"].contains(&cache), "{cache}");
                }
            }
            assert_eq!(
                origin.gets.load(Ordering::SeqCst),
                first_round_gets,
                "parts of {part_size}, round {round}"
            );
        }
        assert_eq!(origin.heads.load(Ordering::SeqCst), 0);
        // A part past the last: the upstream's own answer (passed through, which this app
        // cannot reach: a 5xx), never a part of the cache's making.
        let (status, _, _) = get_part(&app, "k", parts + 1).await;
        assert!(
            status.is_server_error() || status.is_client_error(),
            "{status}"
        );
    }
}
