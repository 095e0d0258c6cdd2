//! One conformance suite for every [`Upstream`]: what the read path relies on, checked against
//! the in-memory upstream here, and against the real S3 client (`S3Upstream`) talking to a real
//! S3 server when `LARDER_CONFORMANCE_ENDPOINT` names one (e2e/tests/test_conformance.py runs
//! it against MinIO, with `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`). Tests that run on the
//! in-memory upstream can then stand for the real one in what the suite covers.
// Helpers of a test file: an unwrap that fails is the test failing, with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use larder::model::{BodyStream, ByteRange, ObjectId, PartNumber, UpstreamError};
use larder::upstream::memory::MemoryUpstream;
use larder::upstream::s3::{S3Upstream, S3UpstreamConfig};
use larder::upstream::Upstream;

const BUCKET: &str = "conformance";

fn id(key: &str) -> ObjectId {
    ObjectId {
        bucket: BUCKET.into(),
        key: key.into(),
        version_id: None,
    }
}

fn data(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

async fn collect(body: BodyStream) -> Result<Bytes, UpstreamError> {
    let mut out = Vec::new();
    futures::pin_mut!(body);
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out.into())
}

/// The objects every run starts from: `dir/a` (10,000 bytes), `dir/b` (3 bytes), `dir/c`
/// (1 byte), `other` (5 bytes).
fn objects() -> Vec<(&'static str, Bytes)> {
    vec![
        ("dir/a", data(10_000, 1)),
        ("dir/b", data(3, 2)),
        ("dir/c", data(1, 3)),
        ("other", data(5, 4)),
    ]
}

/// What the read path relies on, for `upstream` holding [`objects`].
async fn conforms(upstream: &dyn Upstream) {
    let a = data(10_000, 1);

    // HEAD: size and a non-empty ETag; a missing key is a 404.
    let meta = upstream.head(&id("dir/a")).await.expect("head");
    assert_eq!(meta.size, 10_000);
    assert!(!meta.etag.is_empty());
    let missing = upstream.head(&id("dir/none")).await.unwrap_err();
    assert!(missing.is_not_found(), "{missing:?}");

    // GET: the whole object, a range pinned to the ETag, and a pinned range of another
    // version failing as `Changed` (never other bytes).
    let whole = upstream.get(&id("dir/a"), None, None).await.expect("get");
    assert_eq!(collect(whole).await.unwrap(), a);
    let pinned = upstream
        .get(&id("dir/a"), Some(&meta.etag), Some(4_000..4_100))
        .await
        .expect("ranged get");
    assert_eq!(collect(pinned).await.unwrap(), a.slice(4_000..4_100));
    let stale = upstream
        .get(&id("dir/a"), Some("\"not-the-etag\""), Some(0..10))
        .await;
    assert!(
        matches!(stale, Err(UpstreamError::Changed)),
        "{:?}",
        stale.err()
    );
    let missing = upstream.get(&id("dir/none"), None, Some(0..10)).await;
    assert!(
        missing.as_ref().is_err_and(UpstreamError::is_not_found),
        "{:?}",
        missing.err()
    );

    // A GET that also brings metadata: a suffix, a range from an offset, and past the end
    // (`None`: the answer cannot stand for a HEAD).
    let (meta_get, body) = upstream
        .get_with_meta(&id("dir/a"), ByteRange::Suffix(100))
        .await
        .expect("suffix get")
        .expect("within the object");
    assert_eq!((meta_get.size, meta_get.etag), (10_000, meta.etag.clone()));
    assert_eq!(collect(body).await.unwrap(), a.slice(9_900..));
    let from = ByteRange::FromTo {
        first: 9_000,
        last: None,
    };
    let (_, body) = upstream
        .get_with_meta(&id("dir/a"), from)
        .await
        .expect("open range")
        .expect("within the object");
    assert_eq!(collect(body).await.unwrap(), a.slice(9_000..));
    let past = ByteRange::FromTo {
        first: 20_000,
        last: None,
    };
    assert!(upstream
        .get_with_meta(&id("dir/a"), past)
        .await
        .expect("past the end")
        .is_none());

    // A part (`partNumber`) of an object uploaded whole: its one part is the whole object,
    // at the object's ETag, with no count of parts; a part past it is `InvalidPartNumber`
    // (416), a missing key's part a 404.
    let one = PartNumber::parse("1").unwrap();
    let (meta_part, span, body) = upstream
        .get_part(&id("dir/a"), one)
        .await
        .expect("part 1")
        .expect("an answer read as a part's");
    assert_eq!((meta_part.size, &meta_part.etag), (10_000, &meta.etag));
    assert_eq!(
        (span.bytes, span.size, &span.etag),
        (0..10_000, 10_000, &meta.etag)
    );
    assert_eq!(span.parts_count, None);
    assert_eq!(collect(body).await.unwrap(), a);
    let two = PartNumber::parse("2").unwrap();
    match upstream.get_part(&id("dir/a"), two).await {
        Err(UpstreamError::Service { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (416, "InvalidPartNumber"))
        }
        other => panic!("{:?}", other.map(|o| o.map(|(m, s, _)| (m, s)))),
    }
    let missing = upstream.get_part(&id("dir/none"), one).await;
    assert!(
        missing.as_ref().is_err_and(UpstreamError::is_not_found),
        "{:?}",
        missing.err()
    );

    // LIST: every key under the prefix with its size, in key order, across pages.
    let mut listed = Vec::new();
    let mut token = None;
    for _ in 0..100 {
        let (page, next) = upstream
            .list(BUCKET, "dir/", token.take())
            .await
            .expect("list");
        listed.extend(page);
        match next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(
        listed,
        [
            ("dir/a".to_owned(), 10_000),
            ("dir/b".to_owned(), 3),
            ("dir/c".to_owned(), 1)
        ]
    );
}

#[tokio::test]
async fn the_in_memory_upstream_conforms() {
    let upstream = MemoryUpstream::default();
    for (key, bytes) in objects() {
        upstream.put(key, bytes, &format!("\"{key}-v1\""));
    }
    conforms(&upstream).await;
}

#[tokio::test]
async fn the_s3_client_conforms_against_a_real_s3_server() {
    let Ok(endpoint) = std::env::var("LARDER_CONFORMANCE_ENDPOINT") else {
        eprintln!("LARDER_CONFORMANCE_ENDPOINT is not set: e2e/tests/test_conformance.py runs this against MinIO");
        return;
    };
    let key = std::env::var("AWS_ACCESS_KEY_ID").expect("AWS_ACCESS_KEY_ID");
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").expect("AWS_SECRET_ACCESS_KEY");
    let credentials = aws_sdk_s3::config::Credentials::new(key, secret, None, None, "conformance");
    let config = S3UpstreamConfig {
        endpoint: Some(endpoint.clone()),
        path_style: true,
        credentials: Some(credentials.clone()),
        ..S3UpstreamConfig::default()
    };
    // The objects are written with the SDK itself: the upstream trait only reads.
    let sdk = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .endpoint_url(&endpoint)
            .region(aws_sdk_s3::config::Region::new(config.region.clone()))
            .credentials_provider(credentials)
            .force_path_style(true)
            .build(),
    );
    let _ = sdk.create_bucket().bucket(BUCKET).send().await;
    for (key, bytes) in objects() {
        sdk.put_object()
            .bucket(BUCKET)
            .key(key)
            .body(bytes.into())
            .send()
            .await
            .expect("put");
    }
    let upstream: Arc<dyn Upstream> = Arc::new(S3Upstream::new(&config).await.unwrap());
    conforms(upstream.as_ref()).await;
}
