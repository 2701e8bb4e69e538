//! The append-only message log: durability 1 and 2 on disk, with shared syncs.
//!
//! [`LogStore::record`] runs under the queue's lock: it encodes the change into a pending
//! buffer, notes where it will land, and returns a receipt for the record's end position (its
//! LSN, counted in bytes appended since start). Waiting on the receipt (after the queue's
//! lock is released) first lets every other ready request add its record, then writes the
//! whole pending buffer with one `write` unless another request already did ([`files`]):
//! the durability-1 receipts complete with no thread handoff. A durability-2 receipt then asks
//! the [`syncer`] thread for a sync, and one `fdatasync` answers every change written before
//! it; what is written during a sync goes in the next one. That is the group commit, and no
//! timer delays a lone publisher.
//!
//! Segments are written in place into files made full of zeros ahead of time ([`spare`]), so
//! a sync writes the records and not the file's size too.
//!
//! Each message's latest record is known ([`Live`]), so the syncer can compact: the oldest
//! segment's live messages are appended again, synced, and the old file removed. Tombstones
//! in the oldest segment are dropped with it: what they removed was in that segment or in an
//! older one, already gone.

mod files;
pub mod record;
mod recovery;
mod spare;
mod syncer;

pub use recovery::{repair, DamagedRegion, Recovered, RecoveredMessage};

use super::{Change, Receipt, Store};
use crate::engine::{Durability, MessageId};
use record::{encode_id, encode_message, Kind, MessageRecord};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
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
}

/// Tuning of the log.
#[derive(Debug, Clone, Copy)]
pub struct LogOptions {
    /// A segment file is closed and a new one begun once it holds this many bytes.
    pub segment_bytes: u64,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes: 16 << 20,
        }
    }
}

/// Where a live durable message's latest record is. There is one per stored message, so it
/// is packed into 8 bytes (a million of them, in the hash table's slots, take 8 MB less than
/// the 12 bytes of plain fields did).
#[derive(Debug, Clone, Copy)]
struct Live {
    segment: u32,
    /// The record's length in bytes (below 2^30: a record is at most 64 MiB), and two flags.
    len_and_flags: u32,
}

impl Live {
    const DEAD: u32 = 1 << 31;
    /// Durability 2; without it, 1 (durability 0 is never written).
    const IMMEDIATE: u32 = 1 << 30;
    const LEN: u32 = Live::IMMEDIATE - 1;

    fn new(segment: u32, len: u32, dead: bool, durability: Durability) -> Live {
        debug_assert!(len <= Live::LEN);
        let mut len_and_flags = len & Live::LEN;
        if dead {
            len_and_flags |= Live::DEAD;
        }
        if durability == Durability::Immediate {
            len_and_flags |= Live::IMMEDIATE;
        }
        Live {
            segment,
            len_and_flags,
        }
    }

    fn len(self) -> u32 {
        self.len_and_flags & Live::LEN
    }

    fn dead(self) -> bool {
        self.len_and_flags & Live::DEAD != 0
    }

    fn durability(self) -> Durability {
        match self.len_and_flags & Live::IMMEDIATE {
            0 => Durability::Eventual,
            _ => Durability::Immediate,
        }
    }

    fn mark_dead(&mut self) {
        self.len_and_flags |= Live::DEAD;
    }

    /// The same message, its record now at `segment`, `len` bytes long.
    fn moved(self, segment: u32, len: u32) -> Live {
        Live::new(segment, len, self.dead(), self.durability())
    }
}

/// How much of a segment file still matters.
#[derive(Debug, Clone, Copy, Default)]
struct SegmentUse {
    bytes: u64,
    live: u64,
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
    /// The LSN at the end of `pending`.
    appended: u64,
    /// A durability-2 receipt waits for the next sync.
    sync_requested: bool,
    /// A segment filled up since the syncer last looked: time to consider compacting.
    compaction_due: bool,
    /// Every durable message in the queue or the dead letter queue.
    live: HashMap<MessageId, Live>,
    segments: BTreeMap<u32, SegmentUse>,
    /// The segment new records go to.
    active: u32,
    options: LogOptions,
    stopping: bool,
}

impl State {
    /// Appends one record; returns the segment it lands in, its LSN and its length.
    fn append(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> usize) -> (u32, u64, u32) {
        if self
            .segments
            .get(&self.active)
            .is_some_and(|s| s.bytes >= self.options.segment_bytes)
        {
            self.active += 1;
            self.compaction_due = true;
            self.segments.insert(self.active, SegmentUse::default());
        }
        let segment = self.active;
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
        self.segments.entry(segment).or_default().bytes += len;
        self.appended += len;
        (segment, self.appended, len as u32)
    }

    /// A live message's latest record moved or went.
    fn forget(&mut self, live: Live) {
        if let Some(segment) = self.segments.get_mut(&live.segment) {
            segment.live -= live.len() as u64;
        }
    }

    fn remember(&mut self, id: MessageId, live: Live) {
        self.segments.entry(live.segment).or_default().live += live.len() as u64;
        if let Some(old) = self.live.insert(id, live) {
            self.forget(old);
        }
    }

    /// The oldest segment, if compacting it now is worth it: it is mostly dead, or the whole
    /// log is, which bounds the log at about twice what is live.
    fn compaction_candidate(&self) -> Option<u32> {
        let (&oldest, use_) = self.segments.first_key_value()?;
        if oldest == self.active {
            return None;
        }
        let (bytes, live) = self
            .segments
            .values()
            .fold((0, 0), |(b, l), s| (b + s.bytes, l + s.live));
        (use_.live * 2 < use_.bytes || live * 2 < bytes).then_some(oldest)
    }
}

struct Shared {
    state: Mutex<State>,
    /// The files and the right to write them. Taken before `state` when both are needed.
    files: Mutex<files::Files>,
    /// Wakes the syncer: a sync is asked for, or it is time to stop.
    work: Condvar,
    progress: watch::Sender<Progress>,
    dir: PathBuf,
    /// The next segment file, made ahead of time.
    spares: Arc<spare::Spares>,
    /// Bytes written to and read from segment files since start (usage records).
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("the log lock is never poisoned")
    }

    fn wake_syncer(&self) {
        self.work.notify_one();
    }

    /// Asks for a sync of everything written so far; one wake however many ask.
    fn request_sync(&self) {
        let mut state = self.lock();
        if !state.sync_requested {
            state.sync_requested = true;
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
    /// Waits until the change is written (`synced` false) or synced (`synced` true); false if
    /// a write or sync failed first (the change is kept and retried).
    pub(super) async fn wait(self, synced: bool) -> bool {
        let lsn = self.lsn;
        let reached = |p: &Progress| {
            if synced {
                p.synced >= lsn
            } else {
                p.written >= lsn
            }
        };
        if self.shared.progress.borrow().written < lsn {
            // Let every request that is ready add its record first: one write for them all.
            tokio::task::yield_now().await;
            self.shared.write_pending();
        }
        if synced && !reached(&self.shared.progress.borrow()) {
            self.shared.request_sync();
        }
        let mut progress = self.shared.progress.subscribe();
        let outcome = progress
            .wait_for(|p| reached(p) || p.failed_through >= lsn)
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
        self.shared.lock().segments.values().map(|s| s.bytes).sum()
    }
}

/// The log, as the queue's [`Store`].
pub struct LogStore {
    shared: Arc<Shared>,
    syncer: Option<JoinHandle<()>>,
    spare_maker: Option<JoinHandle<()>>,
}

impl LogStore {
    /// Opens the log in `dir` (creating it), reads back what it holds, and starts the writer.
    pub fn open(dir: &Path, options: LogOptions) -> std::io::Result<(LogStore, Recovered)> {
        std::fs::create_dir_all(dir)?;
        let scan = recovery::scan(dir)?;
        // Every start writes to a new segment, so no file is ever appended after a torn tail.
        let active = scan.segments.keys().next_back().map_or(1, |last| last + 1);
        let mut segments = scan.segments;
        segments.insert(active, SegmentUse::default());
        let state = State {
            pending: Vec::new(),
            free_buffers: Vec::new(),
            appended: 0,
            sync_requested: false,
            compaction_due: false,
            live: scan.live,
            segments,
            active,
            options,
            stopping: false,
        };
        let (spares, spare_maker) = spare::Spares::start(dir, options.segment_bytes)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            files: Mutex::default(),
            work: Condvar::new(),
            progress: watch::Sender::new(Progress::default()),
            dir: dir.to_path_buf(),
            spares,
            bytes_written: AtomicU64::new(0),
            bytes_read: AtomicU64::new(scan.bytes_read),
        });
        let syncer = syncer::spawn(shared.clone())?;
        let store = LogStore {
            shared,
            syncer: Some(syncer),
            spare_maker: Some(spare_maker),
        };
        Ok((store, scan.recovered))
    }

    /// The log's files' total size, in bytes.
    pub fn disk_bytes(&self) -> u64 {
        self.meter().held()
    }

    /// A handle on the log's storage figures that outlives handing the store to the queue.
    pub fn meter(&self) -> StorageMeter {
        StorageMeter {
            shared: self.shared.clone(),
        }
    }

    fn receipt(&self, lsn: u64, durability: Durability) -> Receipt {
        let ticket = Ticket {
            lsn,
            shared: self.shared.clone(),
        };
        match durability {
            Durability::None => Receipt::Done,
            Durability::Eventual => Receipt::Written(ticket),
            Durability::Immediate => Receipt::Synced(ticket),
        }
    }
}

impl Store for LogStore {
    fn record(&mut self, change: Change<'_>) -> Receipt {
        let mut state = self.shared.lock();
        let (lsn, durability) = match change {
            Change::Published {
                id,
                message,
                due_ms,
            } => {
                if message.durability == Durability::None {
                    return Receipt::Done;
                }
                let record = MessageRecord {
                    id,
                    durability: message.durability as u8,
                    dead: false,
                    delay_secs: message.delay_secs,
                    due_ms: due_ms.unwrap_or(0),
                    recdat: message.recdat as u64,
                    frame: &message.frame,
                };
                let (segment, lsn, len) = state.append(|out| encode_message(out, &record));
                let live = Live::new(segment, len, false, message.durability);
                state.remember(id, live);
                (lsn, message.durability)
            }
            Change::Acked(id) => {
                let Some(live) = state.live.remove(&id) else {
                    return Receipt::Done; // durability 0: never written
                };
                state.forget(live);
                let (_, lsn, _) = state.append(|out| encode_id(out, Kind::Removed, id));
                (lsn, live.durability())
            }
            Change::DeadLettered(id) => {
                let Some(live) = state.live.get_mut(&id) else {
                    return Receipt::Done;
                };
                live.mark_dead();
                let durability = live.durability();
                let (_, lsn, _) = state.append(|out| encode_id(out, Kind::DeadLettered, id));
                (lsn, durability)
            }
            // Holding is not kept: a restart ends every session.
            Change::Delivered { .. } | Change::Returned(_) => return Receipt::Done,
        };
        let compaction_due = state.compaction_due;
        drop(state);
        if compaction_due {
            self.shared.wake_syncer();
        }
        self.receipt(lsn, durability)
    }
}

impl Drop for LogStore {
    /// Writes and syncs what is pending, then stops the syncer; leaves the last segment
    /// without its unwritten zeros.
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.wake_syncer();
        if let Some(syncer) = self.syncer.take() {
            let _ = syncer.join();
        }
        self.shared.trim_current();
        self.shared.spares.stop();
        if let Some(maker) = self.spare_maker.take() {
            let _ = maker.join();
        }
    }
}

fn segment_path(dir: &Path, segment: u32) -> PathBuf {
    dir.join(format!("{segment:08}.log"))
}

#[cfg(test)]
mod tests;
