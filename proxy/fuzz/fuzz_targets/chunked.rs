//! aws-chunked decoding: any body, split anywhere, is decoded or refused; what is decoded never
//! exceeds the announced length.
#![no_main]

use bytes::Bytes;
use larder::auth::chunked::Decoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let (trailer, piece, expected) = (
        data[0] & 1 == 1,
        usize::from(data[1]).max(1),
        u64::from(data[2]) * 7,
    );
    let mut decoder = Decoder::new(None, trailer, expected);
    let mut out = Vec::new();
    let mut failed = false;
    for p in data[3..].chunks(piece) {
        if decoder.push(Bytes::copy_from_slice(p), &mut out).is_err() {
            failed = true;
            break;
        }
    }
    let decoded: usize = out.iter().map(Bytes::len).sum();
    assert!(decoded as u64 <= expected);
    if !failed && decoder.finish().is_ok() {
        assert_eq!(decoded as u64, expected);
    }
});
