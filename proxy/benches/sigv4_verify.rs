//! What verifying a SigV4 signature costs per request, header-signed and presigned.
//!
//! `cargo bench -p larder --bench sigv4_verify` prints the mean time of one `verify` (with the
//! query's parse, as the authenticator does it) over a few hundred thousand calls of each form,
//! with the AWS documentation's example requests (a ranged GET and a presigned GET). Not part of the test suite: it measures, it does not
//! assert. docs/benchmarks.md records its figures beside a memory hit's CPU.

use std::hint::black_box;
use std::time::{Duration, Instant};

use http::request::Parts;
use larder::auth::sigv4::{self, parse_amz_date, Verified};
use larder::auth::KeyStore;
use larder::s3::query::Query;

const AK: &str = "AKIAIOSFODNN7EXAMPLE";
const SK: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

fn parts(request: http::request::Builder) -> Parts {
    request.body(()).expect("request").into_parts().0
}

fn header_signed() -> Parts {
    parts(
        http::Request::get("/test.txt")
            .header("host", "examplebucket.s3.amazonaws.com")
            .header("range", "bytes=0-9")
            .header(
                "x-amz-content-sha256",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            )
            .header("x-amz-date", "20130524T000000Z")
            .header(
                "authorization",
                format!(
                    "AWS4-HMAC-SHA256 Credential={AK}/20130524/us-east-1/s3/aws4_request,\
                     SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,\
                     Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
                ),
            ),
    )
}

fn presigned() -> Parts {
    parts(
        http::Request::get(
            "/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256\
             &X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request\
             &X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host\
             &X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404",
        )
        .header("host", "examplebucket.s3.amazonaws.com"),
    )
}

/// What the authenticator does per request: parse the query, then verify.
fn verify(request: &Parts, keys: &KeyStore, now: std::time::SystemTime) -> Option<Verified> {
    sigv4::verify(request, &Query::parse(request.uri.query()), keys, now).ok()
}

fn main() {
    let keys = KeyStore::from_pairs([(AK, SK)]);
    let now = parse_amz_date("20130524T000500Z").expect("date");
    for (name, request) in [
        ("header-signed GET", header_signed()),
        ("presigned GET", presigned()),
    ] {
        assert!(verify(&request, &keys, now).is_some(), "{name} must verify");
        // Warm up, then time batches until about a second has passed.
        for _ in 0..10_000 {
            black_box(verify(black_box(&request), &keys, now).is_some());
        }
        let (mut calls, start) = (0u32, Instant::now());
        while start.elapsed() < Duration::from_secs(1) {
            for _ in 0..10_000 {
                black_box(verify(black_box(&request), &keys, now).is_some());
            }
            calls += 10_000;
        }
        let per_call = start.elapsed() / calls;
        println!("{name}: {per_call:?} per verify ({calls} calls)");
    }
}
