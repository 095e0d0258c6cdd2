//! Authentication of arbitrary requests: a request head as text (`METHOD URI` then `name: value`
//! lines) never panics the verifier, and nothing but the known key's exact signature passes.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use larder::auth::{sigv2, sigv4, KeyStore};
use larder::s3::query::Query;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split("\r\n");
    let Some((method, uri)) = lines.next().and_then(|l| l.split_once(' ')) else {
        return;
    };
    let mut builder = http::Request::builder().method(method).uri(uri);
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            builder = builder.header(name.trim(), value.trim());
        }
    }
    let Ok(request) = builder.body(()) else {
        return;
    };
    let (parts, ()) = request.into_parts();
    let keys = KeyStore::from_pairs([(
        "AKIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    )]);
    // The date of the AWS documentation's examples, which seed the corpus.
    let now = UNIX_EPOCH + Duration::from_secs(1_369_353_600);
    let query = Query::parse(parts.uri.query());
    let _ = sigv4::verify(&parts, &query, &keys, now);
    let _ = sigv4::payload_of(&parts);
    let _ = sigv2::verify(&parts, &query, parts.uri.path(), &keys, now);
});
