//! Addressing and query parsing: any host, path and query either parses or is an S3 error.
#![no_main]

use larder::s3::request::{target, ObjectQuery, Target, MAX_KEY_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let (host, path, query) = (parts.next(), parts.next().unwrap_or(""), parts.next());
    for domain in [None, Some("s3.example.com")] {
        if let Ok(Target::Object { bucket, key }) = target(host, path, domain) {
            assert!(key.len() <= MAX_KEY_LEN);
            assert!((3..=255).contains(&bucket.len()));
        }
    }
    let _ = ObjectQuery::parse(query);
});
