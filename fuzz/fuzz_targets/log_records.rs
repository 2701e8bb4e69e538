//! A segment of the message log as arbitrary bytes, read record by record: each read is a
//! sound record, damage stepped over, or the end, always moving on, in one pass.

#![no_main]

use dataplane::store::log::record::{read_at, Read};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut offset = 0;
    while offset < data.len() {
        match read_at(data, offset) {
            Read::Sound { len, .. } | Read::Damaged { len } => {
                assert!(len > 0 && offset + len <= data.len(), "{len} at {offset}");
                offset += len;
            }
            Read::Unfinished | Read::End => break,
        }
    }
});
