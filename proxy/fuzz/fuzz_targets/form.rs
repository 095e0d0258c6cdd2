//! Browser-form heads (`multipart/form-data` up to the file): whatever the bytes and however
//! they are cut, a parse that succeeds points the file inside the body, never asks for more
//! than it was given past the cap, and the same bytes with more appended parse the same.
#![no_main]

use larder::s3::form::{parse_head, MAX_HEAD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_head(data, "XyZ") {
        Ok(Some(head)) => {
            assert!(head.file_offset <= data.len());
            let mut longer = data.to_vec();
            longer.extend_from_slice(b"more file bytes");
            assert_eq!(parse_head(&longer, "XyZ").ok().flatten(), Some(head));
        }
        Ok(None) => assert!(data.len() < MAX_HEAD),
        Err(_) => {}
    }
});
