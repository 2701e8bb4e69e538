//! The append-only message log: durability 1 and 2 on disk, with shared syncs.
//!
//! [`LogStore::record`] runs under the queue's lock: it encodes the change into a pending
//! buffer, notes where it will land, and returns a receipt for the record's end position (its
//! LSN, counted in bytes appended since start). One `write` takes the whole pending buffer,
//! and every receipt waiting for its record to be written completes then (durability 1). It
//! is made by the round writer, a task of the runtime the log runs in, once the requests
//! ready in the same turn have added their records ([`inline`]: no thread switch), or by the
//! log's `writer` thread wherever that write might not be quick (files busy, a new segment
//! file, a failed write, a slow disk) and where there is no runtime. A batch with a durability-2 change asks the [`syncer`] thread for a sync,
//! and one `fdatasync` answers every change written before it; what is written during a sync
//! goes in the next one. That is the group commit, and no timer delays a lone publisher.
//!
//! Segments are written in place into files made full of zeros ahead of time ([`spare`]), so
//! a sync writes the records and not the file's size too.
//!
//! Each message's latest record is known ([`Live`]), so the syncer can compact: the oldest
//! segment's live messages are appended again, in short steps, and once the copies are synced
//! the old file is removed; the segment is forgotten only when its file is gone. Tombstones in
//! the oldest segment are dropped with it: what they removed was in that segment or in an
//! older one, already gone, since a segment is only ever removed after every older one.
//!
//! Why no wake-up is lost between the queue, the writer, the syncer and a waiting reply (each
//! handoff is a flag or a position changed under the lock its waiter checks before sleeping):
//! - Records → round writer: the first `record` of a round sets `round_asked` under the state
//!   lock and wakes the task through a `Notify`, which keeps the wake as a permit if the task
//!   is not waiting yet; whoever writes clears `round_asked` in the same hold in which it takes
//!   `pending`, so a record appended after that take asks again. A round the task does not
//!   write stays pending with `round_asked` set, and the task wakes the writer thread for it
//!   (below), which takes everything pending.
//! - Records → writer: `record` appends under the state lock and wakes the writer if it
//!   found `writer_idle`; the writer sets `writer_idle` and waits on `records` in the same
//!   hold of that lock in which it found nothing pending (a condvar's wait lets the lock go
//!   only once it is waiting), so a record appended after its look finds the flag and wakes it.
//! - Writer → syncer: `sync_requested` (and `unsynced_began`, `compaction_due`) are set under
//!   the state lock before the syncer is woken, and the syncer looks at them under that lock
//!   before it waits.
//! - What a sync answers: the LSN up to which records are written is kept with the list of
//!   files written since the last sync, under the files' lock, and moves in the same hold as
//!   the write (`Files::written`); a sync takes both in one hold (`take_unsynced`). So a sync
//!   answers every record in the files it synced, and a sync that finds no file answers
//!   everything written (an earlier sync on the same thread took, and synced, its files).
//!   Issue 27 was this handoff: the syncer read how far the log was written from the
//!   *announced* progress, which the writer sends after it lets go of the files; a sync that
//!   ran in between synced a batch's file but answered only up to the batch before, and the
//!   batch's own sync request then found no file and answered nothing, so its durability-2
//!   publishes waited for the next unrelated write (seconds, or for ever on a quiet queue).
//! - Log → reply: a [`Ticket`] waits on the `progress` watch, whose `wait_for` looks at the
//!   current value before it sleeps, and every move of `written`, `synced`,
//!   `failed_through` and `broken` is sent through it, which wakes every waiter.
//!
//! When the disk fails:
//! - A failed `write` keeps its records in memory and tries them again (every 200 ms, or with
//!   the next records); their receipts answer 507 meanwhile. The bytes kept count against
//!   `max-messages-memory` ([`LogStore::backlog_bytes`]), so a disk that takes nothing ends in
//!   211 for new messages, not in memory without bound.
//! - A failed `fdatasync` (or directory sync) cannot be retried: Linux may already have
//!   dropped the pages it failed to write, and a second sync would report success for them.
//!   The log goes read-only for good: every change not synced is answered 507, nothing more
//!   is written, and the queue refuses new durable messages (502) while it goes on serving
//!   what it holds in memory. A restart reads back what the disk has.

mod files;
pub mod heard;
mod index;
mod inline;
pub mod lineage;
pub mod mirror;
pub mod record;
mod recovery;
pub mod rounds;
pub mod shipping;
mod spare;
mod syncer;
mod writer;

pub use heard::HoldGate;
pub use recovery::{repair, DamagedRegion, Recovered, Repair};
pub use shipping::{HoldChange, Shipment, Shipping};

use super::{Change, Receipt, Store};
use crate::message::ids::MessageId;
use crate::message::Durability;
use index::{Index, Live};
use record::{encode_id, encode_message, encode_purged, encode_removed, Kind, MessageRecord};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::watch;

/// How far the writer has got, in LSNs (bytes appended since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every record ending at or before this is in the operating system's hands.
    pub written: u64,
    /// Every record ending at or before this is synced to the disk.
    pub synced: u64,
    /// Records ending at or before this, and not yet written or synced, met a failed write or
    /// sync: their changes are kept in memory and written later (eventual durability).
    pub failed_through: u64,
    /// Syncs done so far (each one answers every durability-2 change written before it).
    pub syncs: u64,
    /// Compaction rounds done so far.
    pub compactions: u64,
    /// A sync failed: nothing not synced before it can be made safe, and nothing more is
    /// written.
    pub broken: bool,
    /// Every record ending at or before this is synced on the standby too (`shipping`).
    pub standby_synced: u64,
    /// A standby is attached and caught up: durability 2 waits for its sync.
    pub standby_in_sync: bool,
}

/// Tuning of the log.
#[derive(Debug, Clone, Copy)]
pub struct LogOptions {
    /// A segment file is closed and a new one begun once it holds this many bytes.
    pub segment_bytes: u64,
    /// Whether old segments are compacted. Only a benchmark turns it off, to measure what
    /// compaction costs: without it the log grows with everything ever written.
    pub compaction: bool,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes: 16 << 20,
            compaction: true,
        }
    }
}

/// Bytes waiting for the writer, all for one segment.
struct Chunk {
    segment: u32,
    bytes: Vec<u8>,
}

/// The log's state, shared by the store (under the queue's lock) and the writer thread.
struct State {
    pending: Vec<Chunk>,
    /// Buffers of written chunks, for new chunks: a fresh 64 KiB buffer for every write cost
    /// a page fault per 4 KiB once the allocator had given the last one back.
    free_buffers: Vec<Vec<u8>>,
    /// When the first record of `pending` was appended (the write round's start).
    pending_since: Option<Instant>,
    /// The LSN at the end of `pending`.
    appended: u64,
    /// `pending` holds a durability-2 change: the write that takes it asks for a sync.
    sync_wanted: bool,
    /// The writer thread waits for records (and wants to be woken for them).
    writer_idle: bool,
    /// The round writer on the runtime ([`inline`]) is woken for the records pending, and has
    /// not taken them yet (or handed them to the writer thread, which has not either).
    round_asked: bool,
    /// A sync is asked for, since when (the sync round's start).
    sync_requested: Option<Instant>,
    /// A segment filled up since the syncer last looked: time to consider compacting.
    compaction_due: bool,
    /// Written data became unsynced, maybe while the syncer slept with no sync due: it looks
    /// again at when its 1-second sync is due.
    unsynced_began: bool,
    /// What is where: every durable message's latest record, and every segment file there
    /// is (the ones being retired included) with how much of it still matters.
    index: Index,
    /// Segments whose live messages compaction has copied; each is forgotten once its
    /// file's removal is synced.
    retiring: BTreeSet<u32>,
    /// Segments compaction found damage in: never compacted in this run, since a damaged
    /// record may be a live message's, which copying would leave behind. The next start's
    /// recovery dead-letters the damage (reason `damaged`) and pads it over, as it does for
    /// damage anywhere, and the segment is compacted from then on.
    damaged: BTreeSet<u32>,
    /// The segment new records go to.
    active: u32,
    options: LogOptions,
    stopping: bool,
}

impl State {
    /// Appends the record `change` makes (the index told where it lies and what it keeps):
    /// its LSN, and the durability its receipt waits for; None when nothing is written (a
    /// message the log does not hold, or one kept in memory only).
    fn append_change(&mut self, change: Change<'_>) -> Option<(u64, Durability)> {
        let written = match change {
            Change::Published {
                id,
                message,
                life,
                dedup,
            } => {
                let record = MessageRecord {
                    id,
                    durability: message.durability as u8,
                    dead: life.dead.is_some(),
                    delay_secs: message.delay_secs,
                    due_ms: life.due_ms.unwrap_or(0),
                    recdat: message.recdat as u64,
                    receives: life.receives,
                    expires_ms: life.expires_ms.unwrap_or(0),
                    dead_reason: life.dead.map_or(0, |dead| dead.reason as u8),
                    dead_at_ms: life.dead.map_or(0, |dead| dead.at_ms),
                    dedup,
                    frame: &message.frame,
                };
                let (segment, lsn, len) = self.append(|out| encode_message(out, &record));
                if let Some(dedup) = dedup {
                    self.index.holds_dedup(segment, dedup.until_ms);
                }
                // The record says it all: whatever marks came before, this replaces them.
                let live = Live::new(segment, len, record.dead, message.durability);
                self.index.remember(id, live);
                // A rewrite for the delivery rules (a receive counted) is not waited on and
                // does not ask for a sync of its own: a sync per delivery would halve a
                // durability-2 queue's rate for a count (README, "Delivery rules").
                let rewrite = life.receives > 0 && life.dead.is_none();
                match rewrite {
                    true => (lsn, Durability::Eventual),
                    false => (lsn, message.durability),
                }
            }
            Change::Acked(id) => {
                // None at durability 0: never written.
                let (live, held_in) = self.index.remove(id)?;
                let (segment, lsn, len) = self.append(|out| encode_removed(out, id, &held_in));
                // Kept while another segment holds a record of the message.
                self.index.keep_for_each(segment, &held_in, len as u64);
                (lsn, live.durability())
            }
            Change::DeadLettered(id) => {
                let live = self.index.live.get_mut(&id)?;
                live.mark_dead();
                let (latest, durability) = (live.segment, live.durability());
                let (segment, lsn, len) = self.append(|out| encode_id(out, Kind::DeadLettered, id));
                // Kept while the message's latest record, which says it is not dead, is older.
                self.index.keep_for(segment, latest, len as u64);
                (lsn, durability)
            }
            Change::Redriven(id) => {
                let live = self.index.live.get_mut(&id)?;
                live.mark_redriven();
                let (latest, durability) = (live.segment, live.durability());
                let (segment, lsn, len) = self.append(|out| encode_id(out, Kind::Redriven, id));
                // As a dead-letter mark: kept while the latest record, which says dead, is older.
                self.index.keep_for(segment, latest, len as u64);
                (lsn, durability)
            }
            Change::Purged(ids) => {
                let purge = self.index.remove_all(ids);
                // None at durability 0 only: nothing was written.
                let durability = purge.durability?;
                // Only the ids that were written: a restart knows nothing of the others.
                let (segment, lsn, len) = self.append(|out| {
                    encode_purged(out, purge.written.iter().copied(), &purge.held_in)
                });
                // Kept while another segment holds a record of a purged message.
                self.index
                    .keep_for_each(segment, &purge.held_in, len as u64);
                (lsn, durability)
            }
            // Not kept (above).
            Change::Delivered { .. } | Change::Returned(_) => return None,
        };
        Some(written)
    }

    /// Appends one record; returns the segment it lands in, its LSN and its length.
    fn append(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> usize) -> (u32, u64, u32) {
        if self
            .index
            .segments
            .get(&self.active)
            .is_some_and(|s| s.bytes >= self.options.segment_bytes)
        {
            self.active += 1;
            self.compaction_due = true;
            self.index.grew(self.active, 0);
        }
        let segment = self.active;
        self.pending_since.get_or_insert_with(Instant::now);
        if self
            .pending
            .last()
            .is_none_or(|chunk| chunk.segment != segment)
        {
            let bytes = self
                .free_buffers
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(64 << 10));
            self.pending.push(Chunk { segment, bytes });
        }
        let chunk = self.pending.last_mut().expect("just ensured");
        let len = encode(&mut chunk.bytes) as u64;
        self.index.grew(segment, len);
        self.appended += len;
        (segment, self.appended, len as u32)
    }

    /// The segment compaction should take next, if any is worth it (see [`Index`]).
    fn compaction_candidate(&self) -> Option<u32> {
        let now_ms = qe_shared::clock::now_ms();
        let skipped =
            |segment: &u32| self.retiring.contains(segment) || self.damaged.contains(segment);
        self.index
            .compaction_candidate(self.active, skipped, now_ms)
    }
}

struct Shared {
    state: Mutex<State>,
    /// The files and the right to write them: only the log's own threads take it. Taken
    /// before `state` when both are needed.
    files: Mutex<files::Files>,
    /// Wakes the syncer: a sync is asked for, or it is time to stop.
    work: Condvar,
    /// Wakes the writer: records are pending, or it is time to stop.
    records: Condvar,
    /// Bytes of records kept in memory because the disk would not take them.
    unwritten: AtomicU64,
    progress: watch::Sender<Progress>,
    dir: PathBuf,
    /// The next segment file, made ahead of time.
    spares: Arc<spare::Spares>,
    /// Bytes written to and read from segment files since start (usage records).
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    /// How long writes and syncs take.
    rounds: rounds::Rounds,
    /// The round writer on the runtime, when the log runs in one ([`inline`]).
    round_writer: Option<inline::RoundWriter>,
    /// Durability 2 waits for the standby's sync too, from when the node serves
    /// ([`Shipping::require_standby`]).
    standby: AtomicBool,
    /// What the start's repair wrote over damage, sent to every standby that attaches.
    repairs: Mutex<Vec<Repair>>,
    /// The attach whose standby is followed now (0: none): its answers alone count.
    attached: AtomicU64,
    /// Since when no standby has stayed (ms after `opened`): while none is attached, or the
    /// one attached has not yet settled ([`Shared::standby_settled`]).
    standby_absent_since_ms: AtomicU64,
    /// When the attached standby attached (ms after `opened`).
    standby_attached_at_ms: AtomicU64,
    /// Where the attached standby is told who holds what ([`LogStore::ship_hold`]).
    holds_follower: Mutex<Option<shipping::HoldsFollower>>,
    /// Holds shipped since the last whole table ([`Shipping::ship_holds`]).
    holds_shipped: AtomicU64,
    /// What the standby has heard of them: a durable delivery waits for it ([`heard`]).
    holds_heard: Arc<heard::HoldsHeard>,
    /// After how long without a live report answered the control plane may replace this
    /// node (ms; 0: never), and when the last answered one was sent (ms after `opened`, a
    /// clock that never steps): see [`Shared::unheard_too_long`].
    step_down_after_ms: AtomicU64,
    control_plane_heard_ms: AtomicU64,
    opened: Instant,
    /// Which log this is ([`lineage`]).
    lineage: String,
    /// At the last attach: the bytes its catch-up copies, and the LSN it reaches
    /// ([`Shipping::standing`]).
    catch_up: Mutex<(u64, u64)>,
    /// This start made the log: it had no lineage and no segment.
    began_empty: bool,
    /// Tests only: run by a write of records once it has let go of the files and before it
    /// says how far it wrote, so a test can put a sync in between (see `files`).
    #[cfg(test)]
    after_write: Mutex<Option<Box<dyn Fn() + Send>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("the log lock is never poisoned")
    }

    fn wake_syncer(&self) {
        self.work.notify_one();
    }

    fn wake_writer(&self) {
        self.records.notify_one();
    }

    /// Leaves the records pending to the writer thread (woken if it waits): the round writer
    /// on the runtime does not write them.
    fn hand_round_to_writer(&self) {
        let wake = std::mem::take(&mut self.lock().writer_idle);
        if wake {
            self.wake_writer();
        }
    }

    fn is_broken(&self) -> bool {
        self.progress.borrow().broken
    }

    /// Whether this node, the primary of a queue with a standby, may have been replaced: the
    /// control plane has not answered its reports for as long as it waits before it may
    /// promote the standby, and no standby is in sync (a promoted one stops following). Its
    /// publishes are refused then, whatever their durability: never two primaries taking
    /// them. (The clock first: on a queue without a standby, nothing is borrowed.)
    fn stepped_down(&self) -> bool {
        self.unheard_too_long() && !self.progress.borrow().standby_in_sync
    }

    /// Whether the control plane has not answered this node's reports for as long as it waits
    /// before it may promote the standby (a queue with a standby, told the limit, only).
    /// Meanwhile a standby still counted in sync may be one the control plane has promoted,
    /// whose silence this node has not noticed yet: durability 1 waits for its sync then, as
    /// durability 2 does ([`LogStore::receipt`]).
    fn unheard_too_long(&self) -> bool {
        let after = self.step_down_after_ms.load(Ordering::Relaxed);
        if after == 0 || !self.standby.load(Ordering::Relaxed) {
            return false;
        }
        let heard = self.control_plane_heard_ms.load(Ordering::Relaxed);
        self.now_ms() > heard.saturating_add(after)
    }

    /// Now, in ms after `opened` (a clock that never steps): the standby's and the control
    /// plane's times are kept so.
    fn now_ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    /// Asks for a sync of everything written so far; one wake however many ask.
    fn request_sync(&self) {
        let mut state = self.lock();
        if state.sync_requested.is_none() {
            state.sync_requested = Some(Instant::now());
            drop(state);
            self.wake_syncer();
        }
    }
}

/// A change's place in the log, to wait for.
#[derive(Debug)]
pub struct Ticket {
    /// The LSN the change's record ends at.
    lsn: u64,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// The LSN the change's record ends at.
    pub(super) fn lsn(&self) -> u64 {
        self.lsn
    }

    /// Of two tickets of this log, the one for the later record.
    pub(super) fn later(self, other: Ticket) -> Ticket {
        match self.lsn >= other.lsn {
            true => self,
            false => other,
        }
    }

    /// Waits until the change is written (`synced` false) or synced (`synced` true); false if
    /// a write or sync failed first (a failed write is retried; a failed sync is final).
    pub(super) async fn wait(self, synced: bool) -> bool {
        let lsn = self.lsn;
        let standby = synced && self.shared.standby.load(Ordering::Relaxed);
        let reached = |p: &Progress| match synced {
            true => p.synced >= lsn && (!standby || p.standby_synced >= lsn),
            false => p.written >= lsn,
        };
        // Synced here, and no standby in sync to sync it there: the reply says it failed,
        // with eventual durability (507), never that it is on two disks.
        let standby_missing = |p: &Progress| {
            standby && p.synced >= lsn && !p.standby_in_sync && p.standby_synced < lsn
        };
        let mut progress = self.shared.progress.subscribe();
        if synced {
            // The write that takes this record asks for the sync; this covers a record
            // written while the syncer was already at work.
            let written = progress
                .wait_for(|p| p.written >= lsn || p.failed_through >= lsn || p.broken)
                .await
                .map(|p| p.written >= lsn)
                .unwrap_or(false);
            if written && !reached(&progress.borrow()) {
                self.shared.request_sync();
            }
        }
        let outcome = progress
            .wait_for(|p| reached(p) || p.failed_through >= lsn || p.broken || standby_missing(p))
            .await;
        // The sender lives in `shared`, which this ticket holds: it cannot be gone.
        let outcome = *outcome.expect("the log's progress outlives its tickets");
        reached(&outcome)
    }
}

/// The log's storage figures, for usage records.
#[derive(Clone)]
pub struct StorageMeter {
    shared: Arc<Shared>,
}

impl StorageMeter {
    /// Bytes written to segment files since start.
    pub fn written(&self) -> u64 {
        self.shared.bytes_written.load(Ordering::Relaxed)
    }

    /// Bytes read from segment files since start (recovery and compaction).
    pub fn read(&self) -> u64 {
        self.shared.bytes_read.load(Ordering::Relaxed)
    }

    /// The segment files' total size now.
    pub fn held(&self) -> u64 {
        let state = self.shared.lock();
        state.index.segments.values().map(|s| s.bytes).sum()
    }

    /// Writes and syncs since start, by how long they took (see [`rounds`]).
    pub fn rounds(&self) -> &rounds::Rounds {
        &self.shared.rounds
    }
}

/// The log, as the queue's [`Store`].
pub struct LogStore {
    shared: Arc<Shared>,
    /// The round writer on the runtime, if the log runs in one.
    round_task: Option<tokio::task::JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
    syncer: Option<JoinHandle<()>>,
    spare_maker: Option<JoinHandle<()>>,
}

impl LogStore {
    /// Opens the log in `dir` (creating it), reads back what it holds, and starts the writer.
    pub fn open(dir: &Path, options: LogOptions) -> std::io::Result<(LogStore, Recovered)> {
        std::fs::create_dir_all(dir)?;
        let had_lineage = lineage::of(dir)?.is_some();
        let lineage = lineage::ensure(dir)?;
        let scan = recovery::scan(dir)?;
        let began_empty = !had_lineage && scan.index.segments.is_empty();
        // Every start writes to a new segment, so no file is ever appended after a torn tail.
        let mut index = scan.index;
        let active = index.segments.keys().next_back().map_or(1, |last| last + 1);
        index.grew(active, 0);
        let state = State {
            pending: Vec::new(),
            free_buffers: Vec::new(),
            pending_since: None,
            appended: 0,
            sync_wanted: false,
            writer_idle: false,
            round_asked: false,
            sync_requested: None,
            compaction_due: false,
            unsynced_began: false,
            index,
            retiring: BTreeSet::new(),
            damaged: BTreeSet::new(),
            active,
            options,
            stopping: false,
        };
        let (spares, spare_maker) = spare::Spares::start(dir, options.segment_bytes)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            files: Mutex::default(),
            work: Condvar::new(),
            records: Condvar::new(),
            unwritten: AtomicU64::new(0),
            progress: watch::Sender::new(Progress::default()),
            dir: dir.to_path_buf(),
            spares,
            bytes_written: AtomicU64::new(0),
            bytes_read: AtomicU64::new(scan.bytes_read),
            rounds: rounds::Rounds::default(),
            round_writer: tokio::runtime::Handle::try_current()
                .is_ok()
                .then(inline::RoundWriter::new),
            standby: AtomicBool::new(false),
            repairs: Mutex::default(),
            attached: AtomicU64::new(0),
            standby_absent_since_ms: AtomicU64::new(0),
            standby_attached_at_ms: AtomicU64::new(0),
            holds_follower: Mutex::default(),
            holds_shipped: AtomicU64::new(0),
            holds_heard: Arc::default(),
            step_down_after_ms: AtomicU64::new(0),
            // Placed a moment ago: as good as heard.
            control_plane_heard_ms: AtomicU64::new(0),
            opened: Instant::now(),
            lineage,
            catch_up: Mutex::default(),
            began_empty,
            #[cfg(test)]
            after_write: Mutex::new(None),
        });
        let writer = writer::spawn(shared.clone())?;
        let syncer = syncer::spawn(shared.clone())?;
        let store = LogStore {
            round_task: inline::spawn(&shared),
            shared,
            writer: Some(writer),
            syncer: Some(syncer),
            spare_maker: Some(spare_maker),
        };
        Ok((store, scan.recovered))
    }

    /// The log's files' total size, in bytes.
    pub fn disk_bytes(&self) -> u64 {
        self.meter().held()
    }

    /// The log as a standby's connection sees it (`shipping`).
    pub fn shipping(&self) -> Shipping {
        Shipping {
            shared: self.shared.clone(),
        }
    }

    /// A handle on the log's storage figures that outlives handing the store to the queue.
    pub fn meter(&self) -> StorageMeter {
        StorageMeter {
            shared: self.shared.clone(),
        }
    }

    /// Bytes of records kept in memory because the disk would not take them (they count
    /// against `max-messages-memory`).
    pub fn backlog_bytes(&self) -> u64 {
        self.shared.unwritten.load(Ordering::Relaxed)
    }

    fn receipt(&self, lsn: u64, durability: Durability) -> Receipt {
        let ticket = Ticket {
            lsn,
            shared: self.shared.clone(),
        };
        match durability {
            Durability::None => Receipt::Done,
            // Unheard by the control plane for its silence limit: written here alone, it
            // might be on no copy the control plane has promoted since.
            Durability::Eventual if self.shared.unheard_too_long() => Receipt::Synced(ticket),
            Durability::Eventual => Receipt::Written(ticket),
            Durability::Immediate => Receipt::Synced(ticket),
        }
    }
}

impl Store for LogStore {
    fn record(&mut self, change: Change<'_>) -> Receipt {
        let gate = self.ship_hold(&change);
        // Every message's publish, delivery and ack pass here: what writes nothing (holding,
        // which a restart ends anyway, and a message kept in memory only) takes no lock.
        match &change {
            Change::Delivered { .. } => {
                return gate.map_or(Receipt::Done, Receipt::Heard);
            }
            // Written nowhere either; a caller answered once the standby has heard it waits.
            Change::Returned(_) => return gate.map_or(Receipt::Done, Receipt::Heard),
            Change::Published { message, .. } if message.durability == Durability::None => {
                return Receipt::Done;
            }
            _ => {}
        }
        if self.shared.is_broken() {
            // Nothing is written any more: a durable change's receipt fails at once (its
            // LSN is never reached).
            return self.receipt_of_unwritten(&change);
        }
        let mut state = self.shared.lock();
        let compaction_was_due = state.compaction_due;
        let Some((lsn, durability)) = state.append_change(change) else {
            return Receipt::Done;
        };
        if durability == Durability::Immediate {
            state.sync_wanted = true;
        }
        // One wake a round. The round writer on the runtime when it takes rounds: the
        // first change of the round wakes it, and the rest find it asked (and read no
        // clock). Else the writer thread, by the change that finds it waiting: it runs on the
        // node's core only once the runtime lets it, and until then every change would find
        // it still idle, a futex call per change (two per message at durability 1).
        let round_writer = self.shared.round_writer.as_ref();
        let (wake_round_writer, wake_writer) = if state.round_asked {
            (false, false)
        } else if round_writer.is_some_and(|w| w.takes_rounds()) {
            state.round_asked = true;
            (true, false)
        } else {
            (false, std::mem::take(&mut state.writer_idle))
        };
        let wake_syncer = state.compaction_due && !compaction_was_due;
        drop(state);
        if let (true, Some(round_writer)) = (wake_round_writer, round_writer) {
            round_writer.wake();
        }
        if wake_writer {
            self.shared.wake_writer();
        }
        if wake_syncer {
            self.shared.wake_syncer();
        }
        self.receipt(lsn, durability)
    }

    fn is_writable(&self) -> bool {
        !self.shared.is_broken() && !self.shared.stepped_down()
    }

    fn stepped_down(&self) -> bool {
        self.shared.stepped_down()
    }

    fn receipt_at(&self, lsn: u64, durability: Durability) -> Receipt {
        self.receipt(lsn, durability)
    }

    fn backlog_bytes(&self) -> u64 {
        LogStore::backlog_bytes(self)
    }

    fn everything_recorded(&self) -> Receipt {
        let appended = self.shared.lock().appended;
        self.receipt(appended, Durability::Eventual)
    }
}

impl LogStore {
    /// Tells the attached standby, if any, who holds which durable message now: the engine
    /// tells the store of every delivery and of every return of a held message. The gate of
    /// the last change shipped, when a standby that answers holds is in sync: a delivery
    /// waits for it, and so does the answer to a receiver that made its message visible
    /// again ([`heard`]).
    ///
    /// An ack is not shipped: it is one in every message's life, and the standby needs no
    /// word of it (a promoted node takes holds only of messages its log still has, and ids are
    /// never used again); nor is a purge, for the same reason. What the standby keeps of them
    /// is dropped by the next whole table ([`Shipping::ship_holds`]). A move to the dead
    /// letter queue is shipped: a redrive brings the message back under its id.
    fn ship_hold(&self, change: &Change<'_>) -> Option<HoldGate> {
        let released: &[MessageId] = match change {
            Change::Delivered { .. } => &[],
            Change::Returned(id) | Change::DeadLettered(id) => std::slice::from_ref(id),
            Change::Published {
                id,
                life: super::Life { dead: Some(_), .. },
                ..
            } => std::slice::from_ref(id),
            Change::Published { .. }
            | Change::Acked(_)
            | Change::Purged(_)
            | Change::Redriven(_) => return None,
        };
        if self.shared.attached.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let follower = self.shared.holds_follower.lock().expect("never poisoned");
        let follower = follower.as_ref()?;
        let heard = &self.shared.holds_heard;
        let mut number = None;
        for &id in released {
            number = follower.ship(HoldChange::Released(id), heard);
        }
        if let Change::Delivered { id, holder } = *change {
            number = follower.ship(HoldChange::Held { id, holder }, heard);
            if number.is_some() {
                self.shared.holds_shipped.fetch_add(1, Ordering::Relaxed);
            }
        }
        heard.gate(number?)
    }

    /// The receipt of a change the log no longer writes: done for what was never durable,
    /// failed for the rest.
    fn receipt_of_unwritten(&self, change: &Change<'_>) -> Receipt {
        let durability = match change {
            Change::Published { message, .. } => message.durability,
            Change::Acked(id) | Change::DeadLettered(id) | Change::Redriven(id) => {
                match self.shared.lock().index.live.get(id) {
                    Some(live) => live.durability(),
                    None => Durability::None,
                }
            }
            Change::Purged(ids) => {
                let index = &self.shared.lock().index;
                let written = ids.iter().filter_map(|id| index.live.get(id));
                written
                    .map(|live| live.durability())
                    .max()
                    .unwrap_or(Durability::None)
            }
            Change::Delivered { .. } | Change::Returned(_) => Durability::None,
        };
        self.receipt(u64::MAX, durability)
    }
}

impl Drop for LogStore {
    /// Writes and syncs what is pending, then stops the syncer; leaves the last segment
    /// without its unwritten zeros.
    fn drop(&mut self) {
        if let Some(task) = self.round_task.take() {
            task.abort();
        }
        self.shared.lock().stopping = true;
        self.shared.wake_writer();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        self.shared.wake_syncer();
        if let Some(syncer) = self.syncer.take() {
            let _ = syncer.join();
        }
        if !self.shared.is_broken() {
            self.shared.trim_current();
        }
        self.shared.spares.stop();
        if let Some(maker) = self.spare_maker.take() {
            let _ = maker.join();
        }
    }
}

/// Asks the kernel not to let this thread preempt the one that woke it, nor to favour it
/// over the runtime's (SCHED_BATCH, same weight): for the log's threads that do bulk work
/// beside the requests (the writer, the spare maker).
fn batch_scheduling() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets this thread's own policy from a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        tracing::debug!("a log thread keeps the default scheduling");
    }
}

fn segment_path(dir: &Path, segment: u32) -> PathBuf {
    dir.join(format!("{segment:08}.log"))
}

#[cfg(test)]
mod tests;
