//! The whole server in process (both listeners, every layer between them), over the in-memory
//! upstream: a cold herd, then hits, through real HTTP on loopback. Fast and without MinIO; the
//! Python suite in `e2e/` runs the same paths against MinIO with real clients.
// Helpers of a test file: an unwrap that fails is the test failing, with its message.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use larder::auth::{AuthMode, Authenticator};
use larder::config::{ByteSize, Config};
use larder::front::server::{start, Running};
use larder::upstream::memory::MemoryUpstream;
use larder::upstream::Clients;

const BLOCK: u64 = 64 << 10;

async fn server(origin: Arc<MemoryUpstream>) -> Running {
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        auth: AuthMode::None,
        block_size: ByteSize(BLOCK),
        memory_capacity: ByteSize(16 << 20),
        ..Config::default()
    };
    let clients = Clients {
        origin,
        forwarder: std::sync::Arc::new(common::forwarder_to_nowhere()),
        credentials: None,
        extra_roots: None,
    };
    start(&config, clients, Authenticator::None)
        .await
        .expect("starts")
}

/// GET `url` with `range` (if any): status, `X-Cache` and body.
async fn get(url: String, range: Option<&str>) -> (u16, String, Bytes) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = http::Request::get(url);
    if let Some(range) = range {
        req = req.header(http::header::RANGE, range);
    }
    let response = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let cache = response
        .headers()
        .get("x-cache")
        .map_or(String::new(), |v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, cache, body)
}

fn data(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i * 7 % 251) as u8)
        .collect::<Vec<_>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_herd_costs_one_fetch_per_block_and_then_everything_is_a_hit() {
    let origin = Arc::new(MemoryUpstream::with_delay(Duration::from_millis(1)));
    let object = data(5 * BLOCK as usize + 10);
    origin.put("big.bin", object.clone(), "\"v1\"");
    let running = server(origin.clone()).await;
    let url = format!("http://{}/bucket/big.bin", running.s3_addr);

    let herd: Vec<_> = (0..16)
        .map(|_| tokio::spawn(get(url.clone(), None)))
        .collect();
    for reader in herd {
        let (status, _, body) = reader.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            body, object,
            "every reader of the herd gets the whole object"
        );
    }
    let blocks = object.len().div_ceil(BLOCK as usize);
    let fetches = origin.gets.load(Ordering::SeqCst) + origin.heads.load(Ordering::SeqCst);
    assert!(
        fetches == blocks,
        "16 cold readers of {blocks} blocks cost {fetches} upstream requests"
    );

    let before = origin.gets.load(Ordering::SeqCst) + origin.heads.load(Ordering::SeqCst);
    let (status, cache, body) = get(url.clone(), Some("bytes=70000-70009")).await;
    assert_eq!((status, cache.as_str()), (206, "hit-memory"));
    assert_eq!(body, object.slice(70_000..70_010));
    let (_, cache, body) = get(url, None).await;
    assert_eq!((cache.as_str(), body), ("hit-memory", object));
    let after = origin.gets.load(Ordering::SeqCst) + origin.heads.load(Ordering::SeqCst);
    assert_eq!(after, before, "hits cost the upstream nothing");

    let metrics = get(format!("http://{}/metrics", running.admin_addr), None).await;
    let text = String::from_utf8_lossy(&metrics.2).into_owned();
    assert!(
        text.contains("larder_requests_total"),
        "the admin listener serves the metrics"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_is_s3s_404_and_an_outage_is_a_503() {
    let origin = Arc::new(MemoryUpstream::default());
    let running = server(origin.clone()).await;
    let (status, _, body) = get(format!("http://{}/bucket/nope", running.s3_addr), None).await;
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("<Code>NoSuchKey</Code>"));

    origin.put("k", data(100), "\"v1\"");
    origin.outage.store(true, Ordering::SeqCst);
    let (status, _, body) = get(format!("http://{}/bucket/k", running.s3_addr), None).await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    running.shutdown().await;
}
