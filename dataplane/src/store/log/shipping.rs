//! What the log ships to its standby (issue 35, docs/standby-design.md): every write of
//! records at its place in its segment, and every removal of a compacted segment, in the order
//! the files saw them, so the standby's segment files are a byte-for-byte copy and its start
//! on them is a normal start (the recovery the kill -9 tests pin).
//!
//! Writes are in place, so a write shipped twice lands on the same bytes: a standby that
//! attaches is sent what each segment has beyond what the standby holds (read from the files
//! while the primary goes on writing), then every write made since it attached. Shipments are
//! queued under the files' lock, in the same hold as the write or removal they describe.
//!
//! What the standby holds is checked before it is trusted ([`Held`]): a segment whose first
//! bytes are not the primary's (a number used again by a primary whose new file's name a crash
//! lost before it was synced) is sent again from its start.
//!
//! A durability-2 change waits for the standby's sync as well as its own ([`super::Ticket`]);
//! while no standby is in sync, it is answered as a failed sync (507: it is on the primary's
//! disk, and reaches the standby's once one is in sync again).

use super::heard::HoldsHeard;
use super::{segment_path, Shared};
use crate::message::ids::MessageId;
use crate::store::Holder;
use bytes::Bytes;
use qe_shared::node_channel::StandbyLag;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// One change to the segment files, in the order the primary made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shipment {
    /// Bytes written at `offset` of `segment` (its file is made if new).
    Write {
        segment: u32,
        offset: u64,
        bytes: Bytes,
    },
    /// The standby's `segment` is to be `len` bytes long: what it has beyond is not the
    /// primary's.
    Truncate { segment: u32, len: u64 },
    /// `segment` is gone. The primary removed it only once the copies of what it kept were
    /// synced, so the standby syncs what it has before it removes it too.
    Remove { segment: u32 },
    /// Everything shipped before this is the log up to `lsn`: once synced, the standby says so.
    /// `sync`: a durability-2 change waits for it, so the standby syncs now; else it syncs
    /// within a second (durability 1's promise, as on the primary).
    Through { lsn: u64, sync: bool },
    /// Who holds a durable message changed. Not in the log (a restart ends every session):
    /// shipped so that a promoted standby keeps each session and what it holds
    /// (`replication::holds`).
    Hold(HoldChange),
}

/// A change to who holds which durable message, as its standby keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldChange {
    /// Forget every hold: what follows is the primary's whole table, then its changes.
    Cleared,
    /// `holder` holds message `id`, from now on.
    Held { id: MessageId, holder: Holder },
    /// `id` is back in the queue (returned, or moved to the dead letter queue). An ack or a
    /// purge is not shipped (`LogStore::ship_hold`).
    Released(MessageId),
}

/// What a standby says it holds of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub segment: u32,
    /// Bytes from its start that are sound records.
    pub sound: u64,
    /// The file's length (what follows `sound` may be zeros, or not the primary's).
    pub len: u64,
    /// The CRC32C of its first `min(sound, HEAD_BYTES)` bytes: whose segment it is.
    pub head: u32,
}

/// How much of a segment's start identifies it ([`Held::head`]): a segment's first records
/// carry ids and times no other run of the primary wrote.
pub const HEAD_BYTES: u64 = 4096;

/// The CRC32C of the first `len` bytes of `file`; None if it is shorter.
pub fn head_of(file: &File, len: u64) -> std::io::Result<Option<u32>> {
    let mut head = vec![0; len as usize];
    let mut filled = 0;
    while filled < head.len() {
        match file.read_at(&mut head[filled..], filled as u64)? {
            0 => return Ok(None),
            n => filled += n,
        }
    }
    Ok(Some(crc32c::crc32c(&head)))
}

impl Shipment {
    /// Bytes it keeps queued, with what a shipment costs beside its bytes.
    fn queued_bytes(&self) -> u64 {
        const EACH: u64 = 128;
        match self {
            Shipment::Write { bytes, .. } => EACH + bytes.len() as u64,
            _ => EACH,
        }
    }
}

/// Bytes of shipments queued for a standby that has not taken them: past this the standby is
/// dropped (it reconnects and catches up from the files), so a slow or stuck standby costs the
/// primary bounded memory.
const MAX_QUEUED_BYTES: u64 = 256 << 20;

/// A shipment on the standby's queue, with its number if it is a hold ([`super::heard`]).
struct Queued {
    shipment: Shipment,
    hold: u64,
}

/// The attached standby's queue, kept with the files (see the module's notes).
pub(super) struct Follower {
    sender: mpsc::UnboundedSender<Queued>,
    queued: Arc<AtomicU64>,
}

impl Follower {
    /// Queues `shipment`; false once the standby is gone or too far behind.
    pub(super) fn ship(&self, shipment: Shipment) -> bool {
        ship_to(&self.sender, &self.queued, Queued { shipment, hold: 0 })
    }

    /// A handle that queues on the same channel without keeping it open: the log drops a
    /// standby by dropping its follower, and the holds' handle must not keep it attached.
    fn for_holds(&self) -> HoldsFollower {
        HoldsFollower {
            sender: self.sender.downgrade(),
            queued: self.queued.clone(),
        }
    }
}

fn ship_to(sender: &mpsc::UnboundedSender<Queued>, queued: &AtomicU64, shipment: Queued) -> bool {
    let bytes = shipment.shipment.queued_bytes();
    if queued.fetch_add(bytes, Ordering::Relaxed) + bytes > MAX_QUEUED_BYTES {
        tracing::warn!("the standby is too far behind: dropped, it catches up again");
        return false;
    }
    sender.send(shipment).is_ok()
}

/// Where hold changes go ([`Shipment::Hold`]): the attached standby's queue, reached without
/// the files' lock (the writer holds it through its writes, and a delivery must not wait
/// for the disk).
pub(super) struct HoldsFollower {
    sender: mpsc::WeakUnboundedSender<Queued>,
    queued: Arc<AtomicU64>,
}

impl HoldsFollower {
    /// Queues `change` under the number `heard` gives it; the number, None if it could not
    /// be queued. The caller holds the holds' follower's lock, so the numbers are queued in
    /// their order.
    pub(super) fn ship(&self, change: HoldChange, heard: &HoldsHeard) -> Option<u64> {
        let hold = heard.number_next();
        let sender = self.sender.upgrade()?;
        let shipment = Shipment::Hold(change);
        if ship_to(&sender, &self.queued, Queued { shipment, hold }) {
            return Some(hold);
        }
        // Too far behind: the log's own next shipment drops the standby. Meanwhile nothing
        // waits for a hold it will never hear.
        heard.wait_for_standby(false);
        None
    }
}

/// A segment's bytes the standby lacks, read from a file opened when it attached (so a
/// compaction that removes the file meanwhile does not cut the copy short; its removal is
/// shipped after).
pub struct SegmentCopy {
    pub segment: u32,
    pub file: File,
    pub from: u64,
    pub to: u64,
}

/// A standby's start: what to cut, what to copy from the files, what to write again, what
/// to remove once the copies are in, the LSN the copy reaches, and the writes from then on.
pub struct Attached {
    /// Names this attach, for [`Shipping::detach`] and [`Shipping::standby_synced`].
    pub generation: u64,
    pub truncated: Vec<(u32, u64)>,
    pub copies: Vec<SegmentCopy>,
    /// What the start's repair wrote over damage (`Shipping::repaired`), sent after the
    /// copies: the standby may hold those segments whole already.
    pub repairs: Vec<Shipment>,
    /// Segments the standby has and the primary does not: removed after the copies (the
    /// standby syncs them first), never before, or a standby that held a compacted segment's
    /// messages only there would be without them for a while.
    pub removed: Vec<u32>,
    pub through: u64,
    pub shipments: Shipments,
}

/// The writes made since a standby attached, in order.
pub struct Shipments {
    receiver: mpsc::UnboundedReceiver<Queued>,
    queued: Arc<AtomicU64>,
    /// The number of the last hold taken ([`super::heard`]).
    last_hold: u64,
}

impl Shipments {
    /// The next shipment if one is queued already.
    pub fn try_next(&mut self) -> Option<Shipment> {
        let queued = self.receiver.try_recv().ok()?;
        Some(self.taken(queued))
    }

    /// The next shipment; None once the log dropped the standby (too far behind) or stopped.
    pub async fn next(&mut self) -> Option<Shipment> {
        let queued = self.receiver.recv().await?;
        Some(self.taken(queued))
    }

    /// The number of the last hold taken: the standby has heard it once it has applied every
    /// hold sent to it so far.
    pub fn last_hold(&self) -> u64 {
        self.last_hold
    }

    fn taken(&mut self, queued: Queued) -> Shipment {
        let Queued { shipment, hold } = queued;
        self.queued
            .fetch_sub(shipment.queued_bytes(), Ordering::Relaxed);
        if hold != 0 {
            self.last_hold = hold;
        }
        shipment
    }
}

/// The log as its standby's connection sees it.
#[derive(Clone)]
pub struct Shipping {
    pub(super) shared: Arc<Shared>,
}

impl Shipping {
    /// Attaches a standby that holds `have`, replacing any other: from now on every write is
    /// queued for it. Opens the segment files, so it blocks: run it off the runtime.
    pub fn attach(&self, have: &[Held]) -> std::io::Result<Attached> {
        let shared = &self.shared;
        let mut files = shared.files.lock().expect("never poisoned");
        let (sender, receiver) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicU64::new(0));
        let current = files.current_end();
        let segments: Vec<(u32, u64)> = {
            let state = shared.lock();
            let ends = state.index.segments.iter().map(|(&segment, used)| {
                let end = match current {
                    Some((active, end)) if active == segment => end,
                    _ => used.bytes,
                };
                (segment, end)
            });
            ends.collect()
        };
        let generation = files.attaches + 1;
        files.attaches = generation;
        let mut attached = Attached {
            generation,
            truncated: Vec::new(),
            copies: Vec::new(),
            repairs: Vec::new(),
            removed: Vec::new(),
            through: files.written(),
            shipments: Shipments {
                receiver,
                queued: queued.clone(),
                last_hold: 0,
            },
        };
        let have: BTreeMap<u32, Held> = have.iter().map(|held| (held.segment, *held)).collect();
        for (segment, end) in segments {
            let file = match File::open(segment_path(&shared.dir, segment)) {
                Ok(file) => file,
                // Removed by compaction, its removal synced: the standby removes it too.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let from = match have.get(&segment) {
                Some(held) => usable_prefix(&file, held, end)?,
                None => 0,
            };
            let len = have.get(&segment).map_or(0, |held| held.len);
            if len > from {
                // What follows the usable prefix is written again or is not the primary's.
                attached.truncated.push((segment, from));
            }
            attached.copies.push(SegmentCopy {
                segment,
                file,
                from,
                to: end,
            });
        }
        let copied: Vec<u32> = attached.copies.iter().map(|c| c.segment).collect();
        let repairs = shared.repairs.lock().expect("never poisoned");
        let in_copied = repairs.iter().filter(|r| copied.contains(&r.segment));
        attached.repairs = in_copied
            .map(|repair| Shipment::Write {
                segment: repair.segment,
                offset: repair.offset,
                bytes: Bytes::copy_from_slice(&repair.bytes),
            })
            .collect();
        drop(repairs);
        let gone = have.keys().filter(|segment| !copied.contains(segment));
        attached.removed = gone.copied().collect();
        let copying: u64 = attached.copies.iter().map(|c| c.to - c.from).sum();
        *shared.catch_up.lock().expect("never poisoned") = (copying, attached.through);
        files.follower = Some(Follower { sender, queued });
        // Holds go to it only from its first whole table on ([`Shipping::ship_holds`]), and
        // deliveries wait for no standby until it is in sync.
        *shared.holds_follower.lock().expect("never poisoned") = None;
        shared.holds_heard.wait_for_standby(false);
        let now = shared.now_ms();
        shared.standby_leaves(now);
        shared.standby_attached_at_ms.store(now, Ordering::Relaxed);
        shared.attached.store(generation, Ordering::Relaxed);
        // A standby that attaches is not in sync until it has caught up; one it replaces
        // is answered for no more.
        shared
            .progress
            .send_if_modified(|p| std::mem::take(&mut p.standby_in_sync));
        Ok(attached)
    }

    /// Queues for the attached standby, if any, who holds what now: every hold is forgotten,
    /// then `table` is the whole of them. The caller holds the queue's lock, so no hold change
    /// comes in between: the changes before it are queued before it, and the ones after, after.
    ///
    /// The first table starts the hold changes to the attached standby (after its catch-up,
    /// and only to one that takes them): until then none is queued for it. Each table is
    /// queued to the standby attached now. (The files' lock is let go before the holds' is
    /// taken: an attach takes them the other way round.)
    pub fn ship_holds(&self, table: Vec<HoldChange>) {
        let files = self.shared.files.lock().expect("never poisoned");
        let attached = files.follower.as_ref().map(Follower::for_holds);
        drop(files);
        let mut follower = self.shared.holds_follower.lock().expect("never poisoned");
        *follower = attached;
        let Some(follower) = follower.as_ref() else {
            return;
        };
        let heard = &self.shared.holds_heard;
        follower.ship(HoldChange::Cleared, heard);
        for held in table {
            follower.ship(held, heard);
        }
        self.shared.holds_shipped.store(0, Ordering::Relaxed);
    }

    /// Holds shipped since the last whole table: the standby keeps them (those of acked
    /// messages too, see `LogStore::ship_hold`) until the next.
    pub fn holds_shipped(&self) -> u64 {
        self.shared.holds_shipped.load(Ordering::Relaxed)
    }

    /// The control plane may replace this node once it has gone `after` without answering
    /// its reports (None: never): from then on, while no standby is in sync, durable writes
    /// are refused (`LogStore::is_writable`).
    pub fn step_down_after(&self, after: Option<std::time::Duration>) {
        let after_ms = after.map_or(0, |after| after.as_millis().max(1) as u64);
        self.shared
            .step_down_after_ms
            .store(after_ms, Ordering::Relaxed);
    }

    /// A live report sent at `sent` was answered.
    pub fn control_plane_heard(&self, sent: std::time::Instant) {
        let sent_ms = sent
            .saturating_duration_since(self.shared.opened)
            .as_millis() as u64;
        self.shared
            .control_plane_heard_ms
            .fetch_max(sent_ms, Ordering::Relaxed);
    }

    /// Whether this node refuses durable writes because it may have been replaced.
    pub fn stepped_down(&self) -> bool {
        self.shared.stepped_down()
    }

    /// Which log this is ([`super::lineage`]).
    pub fn lineage(&self) -> &str {
        &self.shared.lineage
    }

    /// Whether this start made the log (no lineage, no segment before it).
    pub fn began_empty(&self) -> bool {
        self.shared.began_empty
    }

    /// From now on durability 2 is synced on the standby too, or failed (507) while none is in
    /// sync. Not before the node serves: what its start writes (the recovery's dead-letter
    /// entries) is synced here and reaches the standby with its catch-up.
    pub fn require_standby(&self) {
        self.shared.standby.store(true, Ordering::Relaxed);
    }

    /// What the start's repair wrote over damage: sent to every standby that attaches.
    pub fn repaired(&self, repairs: Vec<super::Repair>) {
        self.shared
            .repairs
            .lock()
            .expect("never poisoned")
            .extend(repairs);
    }

    /// The standby of `generation` synced everything up to `lsn` (an answer on a connection
    /// another standby has replaced since counts for nothing).
    pub fn standby_synced(&self, generation: u64, lsn: u64) {
        if self.shared.attached.load(Ordering::Relaxed) != generation {
            return;
        }
        self.shared.progress.send_if_modified(|p| {
            let moved = lsn > p.standby_synced;
            p.standby_synced = p.standby_synced.max(lsn);
            moved
        });
    }

    /// The standby of `generation` applied every hold up to `number` (an answer on a
    /// connection another standby has replaced since counts for nothing).
    pub fn holds_heard(&self, generation: u64, number: u64) {
        if self.shared.attached.load(Ordering::Relaxed) == generation {
            self.shared.holds_heard.heard(number);
        }
    }

    /// The standby of `generation` caught up: durability 2 counts on it from now on, and so
    /// do deliveries if it `answers_holds`.
    pub fn in_sync(&self, generation: u64, answers_holds: bool) {
        let files = self.shared.files.lock().expect("never poisoned");
        if files.follower.is_some() && self.shared.attached.load(Ordering::Relaxed) == generation {
            self.shared.progress.send_if_modified(|p| {
                let changed = !p.standby_in_sync;
                p.standby_in_sync = true;
                changed
            });
            self.shared.holds_heard.wait_for_standby(answers_holds);
        }
    }

    /// How the standby stands: whether one is in sync; how many bytes of the log it lacks
    /// (at most): in sync, what was written here and not yet synced there; catching up, what
    /// its catch-up copies and what was written since it began; with none attached, the whole
    /// log, which the next one may have to copy; and how long no standby has stayed
    /// ([`Shared::standby_absent_ms`](super::Shared::standby_absent_ms)).
    pub fn standing(&self) -> StandbyLag {
        let absent_ms = self.shared.standby_absent_ms(self.shared.now_ms());
        let progress = *self.shared.progress.borrow();
        if progress.standby_in_sync {
            let lag_bytes = progress.written.saturating_sub(progress.standby_synced);
            return StandbyLag {
                in_sync: true,
                lag_bytes,
                absent_ms,
            };
        }
        if self.shared.attached.load(Ordering::Relaxed) == 0 {
            let meter = super::StorageMeter {
                shared: self.shared.clone(),
            };
            return StandbyLag {
                in_sync: false,
                lag_bytes: meter.held(),
                absent_ms,
            };
        }
        let (copying, through) = *self.shared.catch_up.lock().expect("never poisoned");
        StandbyLag {
            in_sync: false,
            lag_bytes: copying + progress.written.saturating_sub(through),
            absent_ms,
        }
    }

    /// The standby of `generation` went away (or was dropped, having answered nothing for
    /// `silent_for`): nothing more is queued for it, and durability-2 changes waiting for it
    /// are answered (see the module). Its stay ended when it went silent.
    pub fn detach(&self, generation: u64, silent_for: std::time::Duration) {
        let mut files = self.shared.files.lock().expect("never poisoned");
        if self.shared.attached.load(Ordering::Relaxed) == generation {
            *self.shared.holds_follower.lock().expect("never poisoned") = None;
            self.shared.standby_gone(&mut files, silent_for);
        }
    }
}

/// How much of `held` (the standby's copy of a segment whose primary file is `file`, `end`
/// bytes written) can stay: its sound records, if its first bytes are the primary's; else
/// nothing.
fn usable_prefix(file: &File, held: &Held, end: u64) -> std::io::Result<u64> {
    let head_len = held.sound.min(HEAD_BYTES);
    if head_len > end {
        return Ok(0);
    }
    match head_of(file, head_len)? {
        Some(head) if head == held.head => Ok(held.sound.min(end)),
        _ => Ok(0),
    }
}
