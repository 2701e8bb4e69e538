//! The log's syncer thread: syncs, the 1-second promise of durability 1, and compaction. Only
//! the slow `fdatasync` happens here, once for every durability-2 change written before it;
//! the writer thread writes the records (see `writer`).

use super::record::{
    encode_id, encode_message, encode_purged, encode_removed, read_at, Kind, MessageRecord, Read,
    Record,
};
use super::shipping::Shipment;
use super::{segment_path, Shared, State};
use crate::message::ids::{IdMap, MessageId};
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
        let Work {
            stopping,
            sync_requested,
        } = wait_for_work(shared);
        let synced = sync(shared);
        if let Some(since) = sync_requested.filter(|_| synced) {
            shared.rounds.sync.add(since.elapsed());
        }
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

/// What woke the syncer.
struct Work {
    /// The store stops. (The writer has stopped before it does, so the last sync covers
    /// every write.)
    stopping: bool,
    /// A sync was asked for, at this time.
    sync_requested: Option<Instant>,
}

/// Sleeps until a sync is asked for, the 1-second sync is due, compaction may be worth it, or
/// the store stops.
fn wait_for_work(shared: &Shared) -> Work {
    loop {
        // Read before the state's lock is taken: the writer takes the files' lock first.
        let unsynced_since = shared.files.lock().expect("never poisoned").unsynced_since;
        let due = unsynced_since.map(|t| t + SYNC_WITHIN);
        let mut state = shared.lock();
        if state.sync_requested.is_some() || state.compaction_due || state.stopping {
            state.compaction_due = false;
            return Work {
                stopping: state.stopping,
                sync_requested: state.sync_requested.take(),
            };
        }
        if state.unsynced_began {
            // Written data has a sync due now: look again at when.
            state.unsynced_began = false;
            continue;
        }
        let now = Instant::now();
        match due {
            Some(at) if at <= now => {
                return Work {
                    stopping: false,
                    sync_requested: None,
                }
            }
            Some(at) => drop(
                shared
                    .work
                    .wait_timeout(state, at - now)
                    .expect("never poisoned"),
            ),
            None => drop(shared.work.wait(state).expect("never poisoned")),
        }
    }
}

/// Syncs every file written since the last sync, and answers every record written to them
/// (the written position is taken with the files, not from the announced progress: see the
/// log's notes on lost wake-ups); returns whether there was anything to sync. A failure is
/// final: the log is broken (see the module's notes).
fn sync(shared: &Shared) -> bool {
    let unsynced = shared.files.lock().expect("never poisoned").take_unsynced();
    if shared.is_broken() {
        return false;
    }
    let synced = unsynced.files.iter().try_for_each(|file| file.sync_data());
    // A new segment's name, with its first records.
    let synced = synced.and_then(|()| match unsynced.directory {
        true => File::open(&shared.dir).and_then(|dir| dir.sync_all()),
        false => Ok(()),
    });
    match synced {
        Ok(()) => {
            shared.progress.send_if_modified(|p| {
                let answers = unsynced.written > p.synced;
                p.synced = p.synced.max(unsynced.written);
                if !unsynced.is_empty() {
                    p.syncs += 1;
                }
                answers || !unsynced.is_empty()
            });
            !unsynced.is_empty()
        }
        Err(error) => {
            shared.break_down(&error);
            false
        }
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
    /// Compacts while some segment is worth it (most of it dead, see `index`): copies what
    /// still matters of each such segment, syncs the copies once, then removes the old files.
    /// A segment stays known until its removal is synced, and what other segments keep
    /// because of it stays with them, so a round that fails part way leaves nothing a restart
    /// would read back wrongly. A segment that could not be removed is tried again a second
    /// later; the others go on.
    fn run(&mut self, shared: &Shared) {
        if !can_compact(shared) {
            return;
        }
        let retrying = self.retry_removal_at.is_some_and(|at| Instant::now() >= at);
        let copied = copy_worth_it(shared);
        if !(copied > 0 || retrying) || !can_compact(shared) {
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
        if copied == COMPACTION_ROUND {
            // A full round: more may be worth it, with nothing else to wake the syncer.
            shared.lock().compaction_due = true;
        }
    }
}

/// Copies what still matters of the segments worth compacting, up to a round's worth; each
/// becomes a retiring segment. Returns how many there were.
fn copy_worth_it(shared: &Shared) -> usize {
    let mut copied = 0;
    for _ in 0..COMPACTION_ROUND {
        if !can_compact(shared) {
            break;
        }
        // Bound first: the guard must be gone before copying takes the lock again.
        let candidate = shared.lock().compaction_candidate();
        let Some(segment) = candidate else { break };
        // Nothing in it matters: it goes without being read (most of a churning log's do).
        let nothing_matters = shared.lock().index.matters(segment) == 0;
        if !nothing_matters {
            // A segment's last records may still be pending: written, the file read below is
            // the whole segment. Records never reach a segment after it stops being active.
            shared.write_pending();
            match copy_live(shared, segment) {
                Ok(Copied::All) => {}
                Ok(Copied::NothingDamaged) => {
                    tracing::error!(segment, "a segment of the message log has damage: it is kept, and the next start dead-letters the damaged records");
                    shared.lock().damaged.insert(segment);
                    continue;
                }
                Err(error) => {
                    tracing::error!(%error, segment, "compacting the message log failed");
                    break;
                }
            }
        }
        shared.lock().retiring.insert(segment);
        copied += 1;
    }
    copied
}

/// Whether compacting is on and safe now: nothing waits for a retried write, and no sync
/// failed.
fn can_compact(shared: &Shared) -> bool {
    shared.lock().options.compaction
        && !shared.is_broken()
        && !shared
            .files
            .lock()
            .expect("never poisoned")
            .has_failed_writes()
}

/// Removes the retiring segments' files, and forgets each once its removal is synced; true
/// if every one is gone. One that cannot be removed stays known, and so does what other
/// segments keep because of it.
fn retire(shared: &Shared) -> bool {
    let retiring: Vec<u32> = shared.lock().retiring.iter().copied().collect();
    let mut removed = Vec::new();
    for segment in retiring {
        match std::fs::remove_file(segment_path(&shared.dir, segment)) {
            Ok(()) => removed.push(segment),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => removed.push(segment),
            Err(error) => {
                tracing::error!(%error, segment, "removing a compacted segment failed");
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
    // Shipped once the removal is synced here: the standby syncs the copies it was sent
    // before it removes the segment too.
    let mut files = shared.files.lock().expect("never poisoned");
    for &segment in &removed {
        shared.ship(&mut files, || Shipment::Remove { segment });
    }
    drop(files);
    let mut state = shared.lock();
    for segment in removed {
        state.retiring.remove(&segment);
        state.index.forget_segment(segment);
    }
    let all_gone = state.retiring.is_empty();
    drop(state);
    shared.progress.send_modify(|p| p.compactions += 1);
    all_gone
}

/// Appends again what still matters of `segment`: its messages' latest records, and the
/// removals and marks it must keep (see `index`), `COMPACTION_STEP_BYTES` at a time, each
/// step written before the next.
fn copy_live(shared: &Shared, segment: u32) -> std::io::Result<Copied> {
    let bytes = match std::fs::read(segment_path(&shared.dir, segment)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let read = bytes.len() as u64;
    shared
        .bytes_read
        .fetch_add(read, std::sync::atomic::Ordering::Relaxed);
    let Some(rewritten) = last_rewrites(&bytes) else {
        return Ok(Copied::NothingDamaged);
    };
    let mut offset = 0;
    while offset < bytes.len() {
        let mut state = shared.lock();
        let mut step = 0;
        while offset < bytes.len() && step < COMPACTION_STEP_BYTES {
            let len = match read_at(&bytes, offset) {
                // An earlier record of a message written again further on in this segment
                // (the delivery rules' rewrites): the later one is its latest.
                Read::Sound {
                    record: Record::Message(message),
                    len,
                } if rewritten.get(&message.id).is_some_and(|&at| at > offset) => len,
                Read::Sound { record, len } => {
                    step += carry(&mut state, segment, record);
                    len
                }
                Read::Damaged { len } => len,
                Read::Unfinished | Read::End => bytes.len() - offset,
            };
            offset += len;
        }
        drop(state);
        shared.write_pending();
    }
    Ok(Copied::All)
}

/// What [`copy_live`] did with a segment.
enum Copied {
    /// What still matters of it: it may go.
    All,
    /// Nothing, for it has damage: it must stay (see `State::damaged`).
    NothingDamaged,
}

/// Where in `bytes` (a segment) each message written again by the delivery rules has its last
/// record: the index knows a message's latest record by segment only, and only a rewrite (a
/// [`Kind::MessageLife`] record) puts two records of one message in one segment. (A
/// compaction copy goes to another segment than the one it copies from, and a publish is a
/// message's first record.)
///
/// None if the segment has damage anywhere.
fn last_rewrites(bytes: &[u8]) -> Option<IdMap<MessageId, usize>> {
    let mut last = IdMap::default();
    let mut offset = 0;
    while offset < bytes.len() {
        offset += match read_at(bytes, offset) {
            Read::Sound { record, len } => {
                if let Record::Message(message) = record {
                    if message.has_life() {
                        last.insert(message.id, offset);
                    }
                }
                len
            }
            Read::Damaged { .. } => return None,
            Read::Unfinished | Read::End => bytes.len() - offset,
        };
    }
    Some(last)
}

/// Appends `record` of `segment` again if it still matters when `segment` goes; returns the
/// bytes appended.
fn carry(state: &mut State, segment: u32, record: Record<'_>) -> usize {
    match record {
        Record::Message(record) => copy_if_live(state, segment, &record),
        Record::Removed { id, held_in } => {
            let listed = held_in.map(|held_in| held_in.segments().collect());
            let still = state.index.still_holding(segment, listed);
            if still.is_empty() {
                return 0;
            }
            let (to, _, len) = state.append(|out| encode_removed(out, id, &still));
            state.index.keep_for_each(to, &still, len as u64);
            len as usize
        }
        Record::Purged { ids, held_in } => {
            let still = state
                .index
                .still_holding(segment, Some(held_in.segments().collect()));
            if still.is_empty() {
                return 0;
            }
            let (to, _, len) = state.append(|out| encode_purged(out, ids.iter(), &still));
            state.index.keep_for_each(to, &still, len as u64);
            len as usize
        }
        Record::DeadLettered(id) => carry_mark(state, segment, id, Kind::DeadLettered, true),
        Record::Redriven(id) => carry_mark(state, segment, id, Kind::Redriven, false),
        Record::Padding => 0,
    }
}

/// Appends a dead-letter or redrive mark of `segment` again if it is still needed: its message's
/// latest record is older, and the message is still `dead` as the mark made it (a mark undone
/// by a later one would undo that one, carried past it to the log's end); returns the bytes
/// appended.
fn carry_mark(state: &mut State, segment: u32, id: MessageId, kind: Kind, dead: bool) -> usize {
    let Some(live) = state.index.live.get(&id).copied() else {
        return 0;
    };
    if live.segment >= segment || live.dead() != dead {
        return 0;
    }
    let (to, _, len) = state.append(|out| encode_id(out, kind, id));
    state.index.keep_for(to, live.segment, len as u64);
    len as usize
}

/// Appends `record` again if it is still its message's latest record, with the message's
/// current state; returns the bytes appended.
fn copy_if_live(state: &mut State, segment: u32, record: &MessageRecord<'_>) -> usize {
    let Some(&live) = state.index.live.get(&record.id) else {
        return 0;
    };
    if live.segment != segment {
        return 0;
    }
    // Marks since the record (a dead-letter mark, a redrive) changed what it says: a
    // redriven message waits, whatever its old due time said, and starts again, with no
    // receives and no expiry (as the engine redrives it); a mark puts a message in the dead
    // letter queue as rejected, at a time the mark does not say.
    let marked = live.undelayed() || live.dead() != record.dead;
    let copy = MessageRecord {
        dead: live.dead(),
        due_ms: match live.undelayed() {
            true => 0,
            false => record.due_ms,
        },
        receives: match live.undelayed() {
            true => 0,
            false => record.receives,
        },
        expires_ms: match live.undelayed() {
            true => 0,
            false => record.expires_ms,
        },
        dead_reason: match marked || !live.dead() {
            true => 0,
            false => record.dead_reason,
        },
        dead_at_ms: match marked || !live.dead() {
            true => 0,
            false => record.dead_at_ms,
        },
        // Copied only once its deduplication window ended (`Index::compaction_candidate`).
        dedup: None,
        ..record.clone()
    };
    let (to, _, len) = state.append(|out| encode_message(out, &copy));
    state.index.remember(record.id, live.moved(to, len));
    len as usize
}
