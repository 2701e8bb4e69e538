//! The log's background thread: syncs, the 1-second promise of durability 1, retries of
//! failed writes, and compaction. Requests write their own records (see `files`); only the
//! slow `fdatasync` happens here, once for every durability-2 change written before it.

use super::record::{encode_message, read_at, MessageRecord, Read, Record};
use super::{segment_path, Shared, State};
use std::fs::File;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Written data is synced at the latest this long after its write (durability 1's promise).
const SYNC_WITHIN: Duration = Duration::from_secs(1);
/// Records compaction checks under one hold of the lock.
const COMPACTION_STEP: usize = 1024;

pub(super) fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("log-syncer".into())
        .spawn(move || run(&shared))
}

fn run(shared: &Shared) {
    loop {
        let stopping = wait_for_work(shared);
        shared.write_pending();
        sync(shared);
        if stopping {
            if shared
                .files
                .lock()
                .expect("never poisoned")
                .has_failed_writes()
            {
                tracing::error!("stopping with records the disk would not take");
            }
            return;
        }
        compact(shared);
    }
}

/// Sleeps until a sync is asked for, a sync or a retry is due, or the store stops; returns
/// whether it stops.
fn wait_for_work(shared: &Shared) -> bool {
    let (unsynced_since, retry_at) = {
        let files = shared.files.lock().expect("never poisoned");
        (files.unsynced_since, files.retry_at)
    };
    let due = [unsynced_since.map(|t| t + SYNC_WITHIN), retry_at]
        .into_iter()
        .flatten()
        .min();
    let mut state = shared.lock();
    loop {
        if state.sync_requested || state.compaction_due || state.stopping {
            state.sync_requested = false;
            state.compaction_due = false;
            return state.stopping;
        }
        let now = Instant::now();
        match due {
            Some(at) if at <= now => return false,
            Some(at) => {
                state = shared
                    .work
                    .wait_timeout(state, at - now)
                    .expect("never poisoned")
                    .0;
            }
            None => state = shared.work.wait(state).expect("never poisoned"),
        }
    }
}

/// Syncs every file written since the last sync; everything written before it started is then
/// on the disk.
fn sync(shared: &Shared) {
    let (files, written) = {
        let mut files = shared.files.lock().expect("never poisoned");
        (files.take_unsynced(), shared.progress.borrow().written)
    };
    if files.is_empty() {
        return;
    }
    match files.iter().try_for_each(|file| file.sync_data()) {
        Ok(()) => shared.progress.send_modify(|p| {
            p.synced = p.synced.max(written);
            p.syncs += 1;
        }),
        Err(error) => {
            tracing::error!(%error, "syncing the message log failed");
            shared
                .progress
                .send_modify(|p| p.failed_through = p.failed_through.max(written));
        }
    }
}

/// Segments compacted in one round, under one sync.
const COMPACTION_ROUND: usize = 64;

/// Compacts from the oldest segment while that is worth it: copies the live messages of every
/// such segment, syncs the copies once, then removes the old files.
fn compact(shared: &Shared) {
    let mut retired = Vec::new();
    while retired.len() < COMPACTION_ROUND {
        // A segment's last records (this round's copies among them) may still be pending:
        // write them, so the file read below is the whole segment. Records never reach a
        // segment after the segment is no longer the active one.
        shared.write_pending();
        if shared
            .files
            .lock()
            .expect("never poisoned")
            .has_failed_writes()
        {
            break;
        }
        // Bound first: the guard must be gone before copying takes the lock again.
        let candidate = shared.lock().compaction_candidate();
        let Some(oldest) = candidate else { break };
        if let Err(error) = copy_live(shared, oldest) {
            tracing::error!(%error, segment = oldest, "compacting the message log failed");
            break;
        }
        // Its messages now live in newer segments; the file is garbage from here on (if the
        // copies cannot be made safe below, it simply stays until a restart reads it).
        shared.lock().segments.remove(&oldest);
        retired.push(oldest);
    }
    if retired.is_empty() {
        return;
    }
    // The copies (and whatever came meanwhile) must be safe before the originals go.
    shared.write_pending();
    let copied_through = shared.progress.borrow().written;
    sync(shared);
    let failed = shared
        .files
        .lock()
        .expect("never poisoned")
        .has_failed_writes();
    if failed || shared.progress.borrow().synced < copied_through {
        tracing::error!("compacted copies are not synced; keeping the old segments");
        return;
    }
    // Oldest first: a crash that undoes some removals undoes the newest ones, so no tombstone
    // can vanish while the message it removed comes back.
    for segment in retired {
        match std::fs::remove_file(segment_path(&shared.dir, segment)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => tracing::error!(%error, segment, "removing a compacted segment failed"),
        }
    }
    if let Err(error) = File::open(&shared.dir).and_then(|dir| dir.sync_all()) {
        tracing::error!(%error, "syncing the log directory failed");
    }
    shared.progress.send_modify(|p| p.compactions += 1);
}

/// Appends every live message of `oldest` again.
fn copy_live(shared: &Shared, oldest: u32) -> std::io::Result<()> {
    let bytes = match std::fs::read(segment_path(&shared.dir, oldest)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let read = bytes.len() as u64;
    shared
        .bytes_read
        .fetch_add(read, std::sync::atomic::Ordering::Relaxed);
    let mut offset = 0;
    while offset < bytes.len() {
        let mut state = shared.lock();
        for _ in 0..COMPACTION_STEP {
            let len = match read_at(&bytes, offset) {
                Read::Sound {
                    record: Record::Message(record),
                    len,
                } => {
                    copy_if_live(&mut state, oldest, &record);
                    len
                }
                Read::Sound { len, .. } | Read::Damaged { len } => len,
                Read::Unfinished | Read::End => bytes.len() - offset,
            };
            offset += len;
            if offset >= bytes.len() {
                break;
            }
        }
    }
    Ok(())
}

/// Appends `record` again if it is still its message's latest record, with the message's
/// current state.
fn copy_if_live(state: &mut State, oldest: u32, record: &MessageRecord<'_>) {
    let Some(&live) = state.live.get(&record.id) else {
        return;
    };
    if live.segment != oldest {
        return;
    }
    let copy = MessageRecord {
        dead: live.dead(),
        ..record.clone()
    };
    let (segment, _, len) = state.append(|out| encode_message(out, &copy));
    state.remember(record.id, live.moved(segment, len));
}
