//! `x-amz-copy-source`: whatever the header's bytes, a source that parses names a valid bucket
//! and a key, and its re-encoding (what goes upstream) parses back to the very same source, so
//! what was authorised is what the upstream reads.
#![no_main]

use larder::s3::copy_source::CopySource;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(source) = CopySource::parse(data) {
        assert!(!source.bucket.contains('/') && !source.key.is_empty());
        let again = CopySource::parse(source.header_value().as_bytes())
            .unwrap_or_else(|e| panic!("{source:?} re-encoded does not parse: {e}"));
        assert_eq!(again, source);
    }
});
