//! The log's syncer thread: syncs, the 1-second promise of durability 1, and compaction. Only
//! the slow `fdatasync` happens here, once for every durability-2 change written before it;
//! the writer thread writes the records (see `writer`).

use super::record::{encode_message, read_at, MessageRecord, Read, Record};
use super::{segment_path, Shared, State};
use std::fs::File;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Written data is synced at the latest this long after its write (durability 1's promise).
const SYNC_WITHIN: Duration = Duration::from_secs(1);

pub(super) fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("log-syncer".into())
        .spawn(move || run(&shared))
}

fn run(shared: &Shared) {
    let mut compaction = Compaction::default();
    loop {
        let stopping = wait_for_work(shared);
        sync(shared);
        if stopping {
            let files = shared.files.lock().expect("never poisoned");
            if files.has_failed_writes() {
                tracing::error!("stopping with records the disk would not take");
            }
            return;
        }
        compaction.run(shared);
    }
}

/// Sleeps until a sync is asked for, the 1-second sync is due, compaction may be worth it, or
/// the store stops; returns whether it stops. (The writer has stopped before it does, so
/// the last sync covers every write.)
fn wait_for_work(shared: &Shared) -> bool {
    let unsynced_since = shared.files.lock().expect("never poisoned").unsynced_since;
    let due = unsynced_since.map(|t| t + SYNC_WITHIN);
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
/// on the disk. A failure is final: the log is broken (see the module's notes).
fn sync(shared: &Shared) {
    let (files, written) = {
        let mut files = shared.files.lock().expect("never poisoned");
        (files.take_unsynced(), shared.progress.borrow().written)
    };
    if files.is_empty() || shared.is_broken() {
        return;
    }
    match files.iter().try_for_each(|file| file.sync_data()) {
        Ok(()) => shared.progress.send_modify(|p| {
            p.synced = p.synced.max(written);
            p.syncs += 1;
        }),
        Err(error) => shared.break_down(&error),
    }
}

/// Segments compacted in one round, under one sync.
const COMPACTION_ROUND: usize = 64;
/// Bytes of copies compaction appends under one hold of the log's lock: the queue's requests
/// wait for that lock, so it is held for a few microseconds at a time.
const COMPACTION_STEP_BYTES: usize = 64 << 10;

/// Compaction's own state, kept by the syncer between rounds.
#[derive(Default)]
struct Compaction {
    /// A retiring segment could not be removed: not tried again before this.
    retry_removal_at: Option<Instant>,
}

/// How long a segment that could not be removed waits before the next try.
const REMOVAL_RETRY: Duration = Duration::from_secs(1);

impl Compaction {
    /// Compacts from the oldest segment while that is worth it: copies the live messages of
    /// every such segment, syncs the copies once, then removes the old files, oldest first. A
    /// segment stays known (and no newer one is removed, nor copied) until its file is gone,
    /// so a round that fails part way leaves nothing a restart would read back wrongly.
    fn run(&mut self, shared: &Shared) {
        if !can_compact(shared) {
            return;
        }
        let stuck = !shared.lock().retiring.is_empty();
        if stuck && self.retry_removal_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        if !stuck {
            copy_oldest(shared);
        }
        if shared.lock().retiring.is_empty() || !can_compact(shared) {
            return;
        }
        // The copies (and whatever came meanwhile) must be safe before the originals go.
        shared.write_pending();
        let copied_through = shared.progress.borrow().written;
        sync(shared);
        if !can_compact(shared) || shared.progress.borrow().synced < copied_through {
            tracing::error!("compacted copies are not synced; keeping the old segments");
            return;
        }
        self.retry_removal_at = match retire(shared) {
            true => None,
            false => Some(Instant::now() + REMOVAL_RETRY),
        };
    }
}

/// Copies the live messages of the oldest segments worth compacting, up to a round's worth;
/// each becomes a retiring segment.
fn copy_oldest(shared: &Shared) {
    for _ in 0..COMPACTION_ROUND {
        if !can_compact(shared) {
            return;
        }
        // Bound first: the guard must be gone before copying takes the lock again.
        let candidate = shared.lock().compaction_candidate();
        let Some(oldest) = candidate else { return };
        // A segment's last records may still be pending: written, the file read below is the
        // whole segment. Records never reach a segment after it stops being the active one.
        shared.write_pending();
        if let Err(error) = copy_live(shared, oldest) {
            tracing::error!(%error, segment = oldest, "compacting the message log failed");
            return;
        }
        shared.lock().retiring.insert(oldest);
    }
}

/// Whether compacting is safe now: nothing waits for a retried write, and no sync failed.
fn can_compact(shared: &Shared) -> bool {
    !shared.is_broken()
        && !shared
            .files
            .lock()
            .expect("never poisoned")
            .has_failed_writes()
}

/// Removes the retiring segments' files, oldest first, and forgets each once its removal is
/// synced; true if every one is gone. Stops at the first that cannot be removed: no newer one
/// goes before it, so no tombstone goes while the message it removed stays on the disk.
/// (The retiring segments are always the oldest ones: compaction takes the oldest it has
/// not taken.)
fn retire(shared: &Shared) -> bool {
    let retiring: Vec<u32> = shared.lock().retiring.iter().copied().collect();
    let mut removed = Vec::new();
    for segment in retiring {
        match std::fs::remove_file(segment_path(&shared.dir, segment)) {
            Ok(()) => removed.push(segment),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => removed.push(segment),
            Err(error) => {
                tracing::error!(%error, segment, "removing a compacted segment failed");
                break;
            }
        }
    }
    if removed.is_empty() {
        return false;
    }
    if let Err(error) = File::open(&shared.dir).and_then(|dir| dir.sync_all()) {
        // The removals may not last; the segments stay known and are removed again later.
        tracing::error!(%error, "syncing the log directory failed");
        return false;
    }
    let mut state = shared.lock();
    for segment in removed {
        state.retiring.remove(&segment);
        state.segments.remove(&segment);
    }
    let all_gone = state.retiring.is_empty();
    drop(state);
    shared.progress.send_modify(|p| p.compactions += 1);
    all_gone
}

/// Appends every live message of `oldest` again, `COMPACTION_STEP_BYTES` of copies at a
/// time, each step written before the next.
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
        let mut step = 0;
        while offset < bytes.len() && step < COMPACTION_STEP_BYTES {
            let len = match read_at(&bytes, offset) {
                Read::Sound {
                    record: Record::Message(record),
                    len,
                } => {
                    step += copy_if_live(&mut state, oldest, &record);
                    len
                }
                Read::Sound { len, .. } | Read::Damaged { len } => len,
                Read::Unfinished | Read::End => bytes.len() - offset,
            };
            offset += len;
        }
        drop(state);
        shared.write_pending();
    }
    Ok(())
}

/// Appends `record` again if it is still its message's latest record, with the message's
/// current state; returns the bytes appended.
fn copy_if_live(state: &mut State, oldest: u32, record: &MessageRecord<'_>) -> usize {
    let Some(&live) = state.live.get(&record.id) else {
        return 0;
    };
    if live.segment != oldest {
        return 0;
    }
    let copy = MessageRecord {
        dead: live.dead(),
        ..record.clone()
    };
    let (segment, _, len) = state.append(|out| encode_message(out, &copy));
    state.remember(record.id, live.moved(segment, len));
    len as usize
}
