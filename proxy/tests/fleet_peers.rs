//! Two block stores over one origin, the second serving the first over a real peer listener
//! on loopback: what the fleet promises, one replica's view at a time.
// Helpers of a test file: an unwrap that fails is the test failing, with its message.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};

use bytes::Bytes;

use larder::fleet::auth::PeerSecret;
use larder::fleet::client::{self, Info, PeerClient};
use larder::fleet::ring::{self, Member, Scope, View};
use larder::fleet::{CopyLimits, Fleet};
use larder::freshness::Freshness;
use larder::front::peer::{self as server, PeerState};
use larder::model::{ObjectId, PartNumber, PartSpan, UpstreamError};
use larder::read::blocks::{BlockStore, BlockStoreConfig};
use larder::read::metadata::MetadataCache;
use larder::read::parts::PartLayouts;
use larder::telemetry::metrics::Metrics;
use larder::upstream::memory::MemoryUpstream;

const BLOCK: u64 = 4096;
const SIZE: usize = 10 * BLOCK as usize + 123;

fn secret() -> PeerSecret {
    PeerSecret::new(b"unit-test-fleet-secret").unwrap()
}

fn data() -> Bytes {
    (0..SIZE)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into()
}

fn object() -> ObjectId {
    ObjectId {
        bucket: "b".into(),
        key: "k".into(),
        version_id: None,
    }
}

async fn collect(s: impl Stream<Item = Result<Bytes, UpstreamError>>) -> Vec<u8> {
    let mut out = Vec::new();
    futures::pin_mut!(s);
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

/// Serve `blocks` to peers on `listener`, as a replica whose id is `id`; the places of parts
/// it is told.
fn serve_peers(
    listener: tokio::net::TcpListener,
    blocks: Arc<BlockStore>,
    origin: Arc<MemoryUpstream>,
    metrics: Arc<Metrics>,
    id: u64,
) -> PartLayouts {
    let metadata = Arc::new(MetadataCache::new(
        origin,
        Duration::from_secs(60),
        Duration::ZERO,
        100,
    ));
    let freshness = Arc::new(Freshness::local(metadata.clone(), metrics.clone()));
    let parts = PartLayouts::default();
    let state = Arc::new(PeerState {
        blocks,
        metadata,
        freshness,
        parts: parts.clone(),
        secret: secret(),
        info: Info {
            id,
            zone: None,
            block_size: BLOCK,
        },
        metrics,
        opening: Default::default(),
    });
    let service =
        axum::ServiceExt::<axum::extract::Request>::into_make_service(server::service(state));
    tokio::spawn(async move { axum::serve(listener, service).await });
    parts
}

/// A replica that owns blocks and serves them on a loopback peer listener; its address and
/// metrics.
async fn owner_replica(origin: Arc<MemoryUpstream>) -> (SocketAddr, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let blocks = Arc::new(BlockStore::new(
        BlockStoreConfig::for_tests(),
        origin.clone(),
        metrics.clone(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    serve_peers(listener, blocks, origin, metrics.clone(), 7);
    (addr, metrics)
}

/// A replica called `me` in a fleet of two with `other`, giving it `deadline` to answer,
/// fetching at most `upstream_concurrency` blocks at once and keeping no copies.
fn replica_of_two(
    origin: Arc<MemoryUpstream>,
    me: &str,
    other: &str,
    deadline: Duration,
    upstream_concurrency: usize,
) -> (Arc<BlockStore>, Arc<Fleet>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let view = View::new(
        Member::new(me, None),
        [Member::new(other, None)],
        Scope::Zone,
    );
    let client = PeerClient::new(secret(), deadline, BLOCK, None);
    let copies = CopyLimits {
        capacity: 0,
        ttl: Duration::from_secs(1),
    };
    let fleet = Arc::new(Fleet::new(view, client, copies, metrics.clone()));
    let config = BlockStoreConfig {
        fleet: Some(fleet.clone()),
        upstream_concurrency,
        ..BlockStoreConfig::for_tests()
    };
    let store = Arc::new(BlockStore::new(config, origin, metrics.clone()));
    (store, fleet, metrics)
}

/// How many of the object's blocks `b` owns in a fleet of `a` and `b`.
fn owned_by_second(a: &str, b: &str) -> usize {
    let view = View::new(Member::new(a, None), [Member::new(b, None)], Scope::Zone);
    (0..=(SIZE as u64 / BLOCK))
        .filter(|&i| view.owner(ring::block_key("b", "k", i)).is_some())
        .count()
}

/// A replica that sees itself and `peer`, asking it and serving no one. It is named so that the
/// peer owns some of the object's blocks and it owns the others (ownership depends on the
/// peer's port, which the system picks).
fn asking_replica(
    origin: Arc<MemoryUpstream>,
    peer: &str,
) -> (Arc<BlockStore>, Arc<Fleet>, Arc<Metrics>) {
    let blocks = SIZE / BLOCK as usize + 1;
    let me = (0..1000)
        .map(|i| format!("me-{i}"))
        .find(|me| (1..blocks).contains(&owned_by_second(me, peer)))
        .expect("some name splits the blocks");
    replica_of_two(origin, &me, peer, Duration::from_secs(2), 4)
}

fn owned_by_peer(fleet: &Fleet) -> Vec<u64> {
    (0..=(SIZE as u64 / BLOCK))
        .filter(|&i| fleet.owner(&object(), i).is_some())
        .collect()
}

#[tokio::test]
async fn blocks_owned_elsewhere_come_from_their_owner_once() {
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data(), "\"e1\"");
    let (peer, owner_metrics) = owner_replica(origin.clone()).await;
    let (store, fleet, metrics) = asking_replica(origin.clone(), &peer.to_string());
    let remote = owned_by_peer(&fleet);
    assert!(!remote.is_empty() && remote.len() < 11, "{remote:?}");
    let etag: Arc<str> = "\"e1\"".into();
    for _ in 0..2 {
        let got = collect(store.read(object(), etag.clone(), 0..SIZE as u64, SIZE as u64)).await;
        assert_eq!(got, data());
    }
    // Each block once: the asker's own blocks from its memory the second time, the owner's
    // from the owner's memory.
    assert_eq!(origin.gets.load(Ordering::SeqCst), 11);
    let made = metrics.snapshot().sum(
        "larder_peer_requests_total",
        &[("direction", "made"), ("outcome", "ok")],
    );
    assert_eq!(made, 2.0 * remote.len() as f64);
    assert_eq!(
        metrics.snapshot().sum("larder_peer_fallbacks_total", &[]),
        0.0
    );
    // Bytes count as served where they reach a client: here, not at the owner.
    let served = |m: &Metrics| m.snapshot().sum("larder_served_bytes_total", &[]);
    assert_eq!(served(&metrics), 2.0 * SIZE as f64);
    assert_eq!(served(&owner_metrics), 0.0);
    let peer_bytes = |m: &Metrics, d| {
        m.snapshot()
            .sum("larder_peer_bytes_total", &[("direction", d)])
    };
    let sent = peer_bytes(&owner_metrics, "sent");
    assert!(sent > 0.0);
    assert_eq!(sent, peer_bytes(&metrics, "received"));
}

/// An owner asked for an object by a replica that learnt it changed, before the owner itself
/// was told (notices go out one by one), drops what it cached before then instead of
/// answering with the old version; asked without that, it answers from its cache.
#[tokio::test]
async fn an_owner_told_of_a_change_by_an_open_drops_what_it_cached_before() {
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data(), "\"e1\"");
    let (peer, _) = owner_replica(origin.clone()).await;
    let client = PeerClient::new(secret(), Duration::from_secs(2), BLOCK, None);
    let peer = peer.to_string();
    let etag = |opened: Option<client::Opened>| opened.expect("found").0.etag.to_string();
    assert_eq!(
        etag(client.open(&peer, &object(), 0, None).await.unwrap()),
        "\"e1\""
    );
    // Written straight to the bucket; the owner's metadata is cached for 60 s.
    origin.put("k", Bytes::from_static(b"v2"), "\"e2\"");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        etag(client.open(&peer, &object(), 0, None).await.unwrap()),
        "\"e1\""
    );
    // Learnt a change longer ago than the owner fetched: nothing to drop.
    let long_ago = Some(Duration::from_secs(30));
    assert_eq!(
        etag(client.open(&peer, &object(), 0, long_ago).await.unwrap()),
        "\"e1\""
    );
    // Learnt it 5 ms ago: the owner's metadata is older, and goes.
    let just_now = Some(Duration::from_millis(5));
    assert_eq!(
        etag(client.open(&peer, &object(), 0, just_now).await.unwrap()),
        "\"e2\""
    );
    assert_eq!(
        etag(client.open(&peer, &object(), 0, None).await.unwrap()),
        "\"e2\""
    );
}

#[tokio::test]
async fn a_cold_object_opens_at_its_owner_with_one_upstream_get() {
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data(), "\"e1\"");
    let (peer, _) = owner_replica(origin.clone()).await;
    let (store, fleet, _) = asking_replica(origin.clone(), &peer.to_string());
    let index = owned_by_peer(&fleet)[0];
    let (meta, age) = store
        .open_cold(
            object(),
            larder::model::ByteRange::FromTo {
                first: index * BLOCK,
                last: None,
            },
            None,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!((meta.size, &*meta.etag), (SIZE as u64, "\"e1\""));
    assert!(age < Duration::from_secs(5));
    let start = index * BLOCK;
    let end = (start + BLOCK).min(SIZE as u64);
    let got = collect(store.read(object(), meta.etag.clone(), start..end, SIZE as u64)).await;
    assert_eq!(got, &data()[start as usize..end as usize]);
    assert_eq!(
        origin.gets.load(Ordering::SeqCst),
        1,
        "metadata and block in one GET"
    );
    assert_eq!(origin.heads.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_owner_learns_the_metadata_of_an_object_from_the_get_of_a_block_asked() {
    // A distant upstream, so that the requests below overlap.
    let origin = Arc::new(MemoryUpstream::default().with_round_trip(Duration::from_millis(50)));
    origin.put("k", data(), "\"e1\"");
    let (peer, _) = owner_replica(origin.clone()).await;
    let client = PeerClient::new(secret(), Duration::from_secs(2), BLOCK, None);
    let peer = peer.to_string();
    let (size, id) = (SIZE as u64, object());
    // Asked at once for block 1 twice (as two replicas may) and block 2, of an object it
    // knows nothing of: one GET each block. The second ask for block 1 joins the open.
    let block = |i: u64| client.block(&peer, &id, "\"e1\"", i * BLOCK..(i + 1) * BLOCK, size);
    let (one, again, two) = tokio::join!(block(1), block(1), block(2));
    let bytes = |i: u64| data().slice((i * BLOCK) as usize..((i + 1) * BLOCK) as usize);
    assert_eq!(collect(one.unwrap()).await, bytes(1));
    assert_eq!(collect(again.unwrap()).await, bytes(1));
    assert_eq!(collect(two.unwrap()).await, bytes(2));
    assert_eq!(origin.gets.load(Ordering::SeqCst), 2);
    // Opened there now (as the owner's own clients' first read is), block 1 comes with the
    // metadata learnt from its GET, and nothing is asked of the upstream: not the metadata
    // again, nor the block it holds.
    let (meta, _, body) = client
        .open(&peer, &object(), 1, None)
        .await
        .unwrap()
        .expect("found");
    assert_eq!((&*meta.etag, meta.size), ("\"e1\"", size));
    assert_eq!(collect(body).await, bytes(1));
    assert_eq!(origin.gets.load(Ordering::SeqCst), 2);
    assert_eq!(origin.heads.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_owner_that_is_gone_costs_a_fallback_not_a_failure() {
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data(), "\"e1\"");
    // Nothing listens there.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (store, fleet, metrics) = asking_replica(origin.clone(), &dead.to_string());
    let remote = owned_by_peer(&fleet);
    let got = collect(store.read(object(), "\"e1\"".into(), 0..SIZE as u64, SIZE as u64)).await;
    assert_eq!(got, data());
    assert_eq!(origin.gets.load(Ordering::SeqCst), 11);
    assert_eq!(
        metrics
            .snapshot()
            .sum("larder_peer_fallbacks_total", &[("reason", "unreachable")]),
        remote.len() as f64
    );
}

#[tokio::test]
async fn an_owner_relays_the_upstreams_answer_instead_of_a_fallback() {
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data(), "\"e2\"");
    let (peer, _) = owner_replica(origin.clone()).await;
    let (store, fleet, metrics) = asking_replica(origin.clone(), &peer.to_string());
    let index = owned_by_peer(&fleet)[0];
    let start = index * BLOCK;
    // The asker's metadata is out of date: the owner's If-Match GET says so, and that answer
    // is passed on (the read starts over), not retried against S3 as if the owner had failed.
    let s = store.read(object(), "\"e1\"".into(), start..start + 1, SIZE as u64);
    futures::pin_mut!(s);
    assert_eq!(s.next().await.unwrap().unwrap_err(), UpstreamError::Changed);
    assert_eq!(
        metrics.snapshot().sum("larder_peer_fallbacks_total", &[]),
        0.0
    );
    assert_eq!(origin.gets.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unsigned_or_mis_cut_requests_are_refused() {
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data(), "\"e1\"");
    let peer = owner_replica(origin.clone()).await.0.to_string();
    let other_secret = PeerClient::new(
        PeerSecret::new(b"some-other-fleet-secret").unwrap(),
        Duration::from_secs(2),
        BLOCK,
        None,
    );
    assert!(other_secret.info(&peer).await.is_err());
    let ok = PeerClient::new(secret(), Duration::from_secs(2), BLOCK, None);
    assert_eq!(ok.info(&peer).await.unwrap().id, 7);
    // A replica cutting 8 KiB blocks must not be served 4 KiB ones under the same index.
    let other_cut = PeerClient::new(secret(), Duration::from_secs(2), 2 * BLOCK, None);
    let refused = other_cut
        .block(&peer, &object(), "\"e1\"", 0..2 * BLOCK, SIZE as u64)
        .await;
    assert!(matches!(
        refused,
        Err(client::PeerError::Unavailable { .. })
    ));
    // Not one whole block; and a block cut short of its end, which the owner would otherwise
    // fetch and cache truncated under the real block's name.
    for range in [100..200, 0..100, BLOCK..2 * BLOCK - 1] {
        let refused = ok
            .block(&peer, &object(), "\"e1\"", range.clone(), SIZE as u64)
            .await;
        assert!(
            matches!(refused, Err(client::PeerError::Unavailable { .. })),
            "{range:?}"
        );
    }
    assert_eq!(origin.gets.load(Ordering::SeqCst), 0);
    // The whole block is served whole.
    let mut body = ok
        .block(&peer, &object(), "\"e1\"", 0..BLOCK, SIZE as u64)
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Some(chunk) = body.next().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(got, data()[..BLOCK as usize]);
}

#[tokio::test]
async fn a_part_told_by_a_peer_is_remembered_and_a_part_that_cannot_be_is_refused() {
    let origin = Arc::new(MemoryUpstream::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = listener.local_addr().unwrap().to_string();
    let blocks = Arc::new(BlockStore::new(
        BlockStoreConfig::for_tests(),
        origin.clone(),
        Arc::new(Metrics::default()),
    ));
    let metrics = Arc::new(Metrics::default());
    let parts = serve_peers(listener, blocks, origin, metrics, 7);
    let told = PeerClient::new(secret(), Duration::from_secs(2), BLOCK, None);
    let span = |bytes: std::ops::Range<u64>| PartSpan {
        etag: "\"e1-3\"".into(),
        size: 12_000,
        bytes,
        parts_count: Some(3),
        checksums: vec![(
            http::HeaderName::from_static("x-amz-checksum-crc32"),
            http::HeaderValue::from_static("AAAAAA=="),
        )],
    };
    let two = PartNumber::parse("2").unwrap();
    told.part(&peer, &object(), two, &span(5000..10_000))
        .await
        .unwrap();
    assert_eq!(
        parts.get(&object(), two).as_deref(),
        Some(&span(5000..10_000))
    );
    // Empty, reversed, or past the object's end: refused, and nothing remembered.
    let three = PartNumber::parse("3").unwrap();
    // A reversed range is what a faulty or hostile peer could send, which clippy would refuse.
    #[allow(clippy::reversed_empty_ranges)]
    let bad = [10_000..10_000, 11_000..10_000, 10_000..12_001];
    for bytes in bad {
        let refused = told
            .part(&peer, &object(), three, &span(bytes.clone()))
            .await;
        assert!(refused.is_err(), "{bytes:?}");
        assert!(parts.get(&object(), three).is_none(), "{bytes:?}");
    }
    // From a replica cutting other blocks (whose reads of the part it would not share) or
    // without the fleet's secret: refused.
    let other_cut = PeerClient::new(secret(), Duration::from_secs(2), 2 * BLOCK, None);
    let impostor = PeerClient::new(
        PeerSecret::new(b"some-other-fleet-secret").unwrap(),
        Duration::from_secs(2),
        BLOCK,
        None,
    );
    for client in [other_cut, impostor] {
        assert!(client
            .part(&peer, &object(), three, &span(10_000..12_000))
            .await
            .is_err());
        assert!(parts.get(&object(), three).is_none());
    }
}

/// A replica in a fleet of two with one upstream slot, serving its peer on `listener`.
fn busy_replica(
    origin: Arc<MemoryUpstream>,
    listener: tokio::net::TcpListener,
    other: SocketAddr,
) -> (Arc<BlockStore>, Arc<Fleet>, Arc<Metrics>) {
    let me = listener.local_addr().unwrap().to_string();
    let (store, fleet, metrics) = replica_of_two(
        origin.clone(),
        &me,
        &other.to_string(),
        Duration::from_secs(3),
        1,
    );
    serve_peers(
        listener,
        store.clone(),
        origin,
        metrics.clone(),
        rand::random(),
    );
    (store, fleet, metrics)
}

#[tokio::test]
async fn two_busy_replicas_asking_each_other_do_not_stall() {
    let origin = Arc::new(MemoryUpstream::with_delay(Duration::from_millis(50)));
    origin.put("k", data(), "\"e1\"");
    // Two ports whose owners split the object's blocks, so each replica owns one the other
    // reads (ownership depends on the ports, which the system picks).
    let blocks = SIZE / BLOCK as usize + 1;
    let mut pair = None;
    for _ in 0..100 {
        let la = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let lb = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (a, b) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
        if (1..blocks).contains(&owned_by_second(&a.to_string(), &b.to_string())) {
            pair = Some((la, lb));
            break;
        }
    }
    let (la, lb) = pair.expect("some pair of ports splits the blocks");
    let (a_addr, b_addr) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    let (a, fleet_a, metrics_a) = busy_replica(origin.clone(), la, b_addr);
    let (b, _, metrics_b) = busy_replica(origin.clone(), lb, a_addr);
    let blocks = 0..=(SIZE as u64 / BLOCK);
    let x = blocks
        .clone()
        .find(|&i| fleet_a.owner(&object(), i).is_none())
        .unwrap();
    let y = blocks
        .clone()
        .find(|&i| fleet_a.owner(&object(), i).is_some())
        .unwrap();
    let range = |i: u64| i * BLOCK..((i + 1) * BLOCK).min(SIZE as u64);
    // Each asks the other for a block while holding its own fetch budget; each owner needs an
    // upstream slot to answer. Sharing one budget, they would wait on each other until the
    // peer deadline, then both fall back to S3.
    let etag: Arc<str> = "\"e1\"".into();
    let (got_y, got_x) = tokio::join!(
        collect(a.read(object(), etag.clone(), range(y), SIZE as u64)),
        collect(b.read(object(), etag.clone(), range(x), SIZE as u64)),
    );
    assert_eq!(
        got_y,
        &data()[range(y).start as usize..range(y).end as usize]
    );
    assert_eq!(
        got_x,
        &data()[range(x).start as usize..range(x).end as usize]
    );
    for metrics in [metrics_a, metrics_b] {
        assert_eq!(
            metrics.snapshot().sum("larder_peer_fallbacks_total", &[]),
            0.0
        );
    }
    assert_eq!(
        origin.gets.load(Ordering::SeqCst),
        2,
        "each block once, by its owner"
    );
}

/// A replica that speaks the peer protocol without the fleet's secret (a spoofed DNS member,
/// or a box on the path of cleartext h2c): its answers look right but are not sealed.
async fn impostor() -> String {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let info = serde_json::to_vec(&Info {
        id: 9,
        zone: None,
        block_size: BLOCK,
    })
    .unwrap();
    let not_found = serde_json::to_vec(&larder::fleet::wire::WireError::Service {
        status: 404,
        code: "NoSuchKey".into(),
        message: "forged".into(),
    })
    .unwrap();
    let router = axum::Router::new()
        .route("/v1/info", get(move || async move { info.clone() }))
        .route("/v1/block", get(|| async { vec![0x66u8; BLOCK as usize] }))
        .route(
            "/v1/open",
            get(move || async move { (http::StatusCode::NOT_FOUND, not_found.clone()) }),
        );
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

#[tokio::test]
async fn answers_from_a_peer_without_the_secret_are_never_used() {
    let peer = impostor().await;
    let client = PeerClient::new(secret(), Duration::from_secs(2), BLOCK, None);
    // Not admitted as a member: its info does not verify.
    assert!(client.info(&peer).await.is_err());
    // Its block bytes never reach a reader: the stream fails before the first byte.
    let mut body = client
        .block(&peer, &object(), "\"e1\"", 0..BLOCK, SIZE as u64)
        .await
        .unwrap();
    match body.next().await {
        Some(Err(_)) => {}
        other => panic!("unsealed bytes were released: {other:?}"),
    }
    // Its error answers are not relayed as the upstream's (a fallback to S3 instead).
    assert!(matches!(
        client.open(&peer, &object(), 0, None).await,
        Err(client::PeerError::Unavailable { .. })
    ));
}
