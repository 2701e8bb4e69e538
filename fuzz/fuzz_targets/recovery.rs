//! Recovery over arbitrary files: the input, cut into up to four segment files, is opened as a
//! message log, closed, and opened again. The first open may cut a torn tail; after it the
//! log reads back the same messages every time.

#![no_main]

use dataplane::store::log::{LogOptions, LogStore};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, rest)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a directory");
    let segments = (cuts % 4) as usize + 1;
    let size = rest.len().div_ceil(segments).max(1);
    for (n, bytes) in rest.chunks(size).enumerate() {
        let path = dir.path().join(format!("{:08}.log", n + 1));
        std::fs::write(path, bytes).expect("a segment file");
    }
    let options = LogOptions {
        segment_bytes: 4096,
        ..LogOptions::default()
    };
    let ids = |store_and_recovered: (LogStore, dataplane::store::log::Recovered)| {
        let (store, recovered) = store_and_recovered;
        drop(store);
        recovered.messages.iter().map(|m| m.id).collect::<Vec<_>>()
    };
    let Ok(first) = LogStore::open(dir.path(), options) else {
        return;
    };
    let first = ids(first);
    let second = ids(LogStore::open(dir.path(), options).expect("a log that opened opens again"));
    assert_eq!(first, second);
});
