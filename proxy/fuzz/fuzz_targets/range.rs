//! Range headers: whatever the header and size, a resolved range lies inside the object.
#![no_main]

use larder::model::range::{resolve, Resolved};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let size = u64::from_le_bytes(data[..8].try_into().unwrap()) >> (data[0] % 64);
    let header = String::from_utf8_lossy(&data[8..]);
    if let Resolved::Partial { start, end } = resolve(Some(&header), size) {
        assert!(
            start < end && end <= size,
            "{header:?} on {size}: {start}..{end}"
        );
    }
});
