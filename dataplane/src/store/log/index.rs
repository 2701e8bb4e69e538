//! What is where in the log: each durable message's latest record, how much of each segment
//! still matters, and which records a segment keeps only because of records in another.
//! Compaction decides by it; recovery builds it from the files; the store keeps it up to date
//! under its lock.
//!
//! Compaction takes the segment that matters least (most of it dead), wherever it stands,
//! so a long-lived backlog (delayed messages, the dead letter queue) is not copied again
//! every time the log doubles. A segment's records go with it, which is safe for every
//! record but two kinds, which are carried forward (appended again) instead while needed:
//! - a removal, while a segment it lists as holding a record of its message is on the disk
//!   (else that record would come back after a restart);
//! - a dead-letter or redrive mark, while its message's latest record is older than the mark
//!   (a copy made since carries the mark's state itself) and the message is still in the
//!   state the mark gives: a mark undone by a later one is dropped, because carried to the
//!   log's end it would come after the later one and undo it;
//! - a purge, as a removal, while a segment it lists is on the disk.
//!
//! A message can hold records in more than one segment for a while: compaction's copy, and
//! the original until its segment's removal is synced (or for good, when a restart found a
//! segment a compaction did not finish removing). Those are its `stale` records; a removal
//! lists them with the latest.

use crate::message::ids::{IdMap, MessageId};
use crate::message::Durability;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Where a live durable message's latest record is. There is one per stored message, so it
/// is packed into 8 bytes (a million of them, in the hash table's slots, take 8 MB less than
/// the 12 bytes of plain fields did).
#[derive(Debug, Clone, Copy)]
pub(super) struct Live {
    pub segment: u32,
    /// The record's length in bytes (below 2^29: a record is at most 64 MiB), and three flags.
    len_and_flags: u32,
}

impl Live {
    const DEAD: u32 = 1 << 31;
    /// Durability 2; without it, 1 (durability 0 is never written).
    const IMMEDIATE: u32 = 1 << 30;
    /// Redriven since its latest record: it waits, whatever due time that record gives (a
    /// message moved to the dead letter queue while delayed waits at once when redriven).
    const UNDELAYED: u32 = 1 << 29;
    const LEN: u32 = Live::UNDELAYED - 1;

    pub fn new(segment: u32, len: u32, dead: bool, durability: Durability) -> Live {
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

    pub fn len(self) -> u32 {
        self.len_and_flags & Live::LEN
    }

    pub fn dead(self) -> bool {
        self.len_and_flags & Live::DEAD != 0
    }

    pub fn durability(self) -> Durability {
        match self.len_and_flags & Live::IMMEDIATE {
            0 => Durability::Eventual,
            _ => Durability::Immediate,
        }
    }

    pub fn undelayed(self) -> bool {
        self.len_and_flags & Live::UNDELAYED != 0
    }

    pub fn mark_dead(&mut self) {
        self.len_and_flags |= Live::DEAD;
    }

    /// Redriven: back from the dead letter queue, and no longer delayed.
    pub fn mark_redriven(&mut self) {
        self.len_and_flags = (self.len_and_flags & !Live::DEAD) | Live::UNDELAYED;
    }

    /// The same message, its record now at `segment`, `len` bytes long.
    pub fn moved(self, segment: u32, len: u32) -> Live {
        debug_assert!(len <= Live::LEN);
        Live {
            segment,
            len_and_flags: (self.len_and_flags & !Live::LEN) | (len & Live::LEN),
        }
    }
}

/// How much of a segment file still matters.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SegmentUse {
    /// Bytes of the file written so far.
    pub bytes: u64,
    /// Of those, the bytes that still matter: latest message records, and what is kept
    /// because of records in other segments.
    pub live: u64,
    /// When the last deduplication window of a record in it ends (ms since 1970; 0: it
    /// has none): the segment is kept until then, whatever else matters in it, so that a
    /// restart within the window still knows the id (README, "Exactly-once publish").
    pub dedup_until_ms: u64,
}

/// What [`Index::remove_all`] found.
pub(super) struct Purge {
    /// The ids that were written (durability 1 or 2).
    pub written: Vec<MessageId>,
    /// The strongest durability among them; `None` if there are none.
    pub durability: Option<Durability>,
    /// Every segment holding a record of them.
    pub held_in: Vec<u32>,
}

/// The log's index; see the module's notes.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// Every durable message in the queue or the dead letter queue: where its latest record
    /// is.
    pub live: IdMap<MessageId, Live>,
    /// Every segment file there is, and how much of it still matters.
    pub segments: BTreeMap<u32, SegmentUse>,
    /// Segments other than a message's latest that still hold a record of it.
    stale: IdMap<MessageId, Vec<u32>>,
    /// The same, by segment, to forget a segment's share when it goes.
    stale_in: HashMap<u32, Vec<MessageId>>,
    /// Bytes kept in a segment (the inner key) because of records in another (the outer
    /// key): they count as mattering in the holder until the other is gone.
    kept_for: HashMap<u32, HashMap<u32, u64>>,
}

impl Index {
    /// `segment` holds a record whose deduplication window ends at `until_ms`.
    pub fn holds_dedup(&mut self, segment: u32, until_ms: u64) {
        let use_ = self.segments.entry(segment).or_default();
        use_.dedup_until_ms = use_.dedup_until_ms.max(until_ms);
    }

    /// `len` more bytes were appended to `segment`.
    pub fn grew(&mut self, segment: u32, len: u64) {
        self.segments.entry(segment).or_default().bytes += len;
    }

    /// `live` is now the latest record of `id`; the one before (if any) no longer matters,
    /// though it stays on the disk until its segment goes (stale).
    pub fn remember(&mut self, id: MessageId, live: Live) {
        self.segments.entry(live.segment).or_default().live += live.len() as u64;
        if let Some(old) = self.live.insert(id, live) {
            self.forget_record(old);
            if old.segment != live.segment {
                self.note_stale(id, old.segment);
            }
        }
    }

    /// `id` is gone (acked, deleted): returns its latest record and every segment holding a
    /// record of it, which its removal lists.
    pub fn remove(&mut self, id: MessageId) -> Option<(Live, Vec<u32>)> {
        let live = self.live.remove(&id)?;
        self.forget_record(live);
        let mut held_in = vec![live.segment];
        held_in.extend(self.stale.remove(&id).unwrap_or_default());
        Some((live, held_in))
    }

    /// The messages `ids` are gone (a purge): returns those that were written, which the purge
    /// names, the strongest durability among them, and every segment holding a record of
    /// them, which the purge lists. Costs O(log n) per id.
    pub fn remove_all(&mut self, ids: &[MessageId]) -> Purge {
        let mut written = Vec::with_capacity(ids.len());
        let mut strongest = None;
        let mut held_in = BTreeSet::new();
        for &id in ids {
            let Some((live, segments)) = self.remove(id) else {
                continue; // durability 0: never written
            };
            written.push(id);
            strongest = strongest.max(Some(live.durability()));
            held_in.extend(segments);
        }
        Purge {
            written,
            durability: strongest,
            held_in: held_in.into_iter().collect(),
        }
    }

    /// `holder` keeps `len` bytes (a removal, a mark) because of records in `target`: they
    /// matter there until `target` is gone.
    pub fn keep_for(&mut self, holder: u32, target: u32, len: u64) {
        if holder == target {
            return;
        }
        *self
            .kept_for
            .entry(target)
            .or_default()
            .entry(holder)
            .or_default() += len;
        self.segments.entry(holder).or_default().live += len;
    }

    /// `holder` keeps `len` bytes (a removal) because of records in each of `targets`: they
    /// matter there until every one of them is gone. (Counted once per target, and given
    /// back once per target, so they matter exactly while any is left.)
    pub fn keep_for_each(&mut self, holder: u32, targets: &[u32], len: u64) {
        for &target in targets {
            self.keep_for(holder, target, len);
        }
    }

    /// Bytes of `segment` that still matter; a segment at 0 can go without being read.
    pub fn matters(&self, segment: u32) -> u64 {
        self.segments.get(&segment).map_or(0, |use_| use_.live)
    }

    /// Whether a removal that lists `held_in` (`None`: not listed) must be kept when
    /// `segment`, which holds it, goes; returns the segments it must still list.
    pub fn still_holding(&self, segment: u32, held_in: Option<Vec<u32>>) -> Vec<u32> {
        match held_in {
            Some(listed) => listed
                .into_iter()
                .filter(|s| *s != segment && self.segments.contains_key(s))
                .collect(),
            // Written before removals listed their segments: any older one may hold a record.
            None => self.segments.range(..segment).map(|(s, _)| *s).collect(),
        }
    }

    /// `segment`'s file is gone: it no longer holds stale records, and what other segments
    /// kept because of it no longer matters.
    pub fn forget_segment(&mut self, segment: u32) {
        self.segments.remove(&segment);
        for holders in self.kept_for.values_mut() {
            holders.remove(&segment);
        }
        for (holder, bytes) in self.kept_for.remove(&segment).unwrap_or_default() {
            if let Some(use_) = self.segments.get_mut(&holder) {
                use_.live = use_.live.saturating_sub(bytes);
            }
        }
        for id in self.stale_in.remove(&segment).unwrap_or_default() {
            if let Some(segments) = self.stale.get_mut(&id) {
                segments.retain(|s| *s != segment);
                if segments.is_empty() {
                    self.stale.remove(&id);
                }
            }
        }
    }

    /// The segment compaction should take next: of those it may take (not `active`, not
    /// `retiring`), the one that matters least, if most of it is dead. (Every segment left is
    /// then at least half live, which bounds the log at about twice what is live.)
    pub fn compaction_candidate(
        &self,
        active: u32,
        skipped: impl Fn(&u32) -> bool,
        now_ms: u64,
    ) -> Option<u32> {
        self.segments
            .iter()
            .filter(|(segment, _)| **segment != active && !skipped(segment))
            .filter(|(_, use_)| use_.dedup_until_ms <= now_ms)
            .filter(|(_, use_)| use_.live * 2 < use_.bytes || use_.bytes == 0)
            // The smallest share live: live_a / bytes_a < live_b / bytes_b, multiplied out.
            .min_by_key(|(_, use_)| {
                (use_.live as u128 * u64::MAX as u128) / (use_.bytes.max(1) as u128)
            })
            .map(|(segment, _)| *segment)
    }

    /// A record of `id` is not its latest any more but stays in `segment` until that goes.
    fn note_stale(&mut self, id: MessageId, segment: u32) {
        let segments = self.stale.entry(id).or_default();
        if !segments.contains(&segment) {
            segments.push(segment);
            self.stale_in.entry(segment).or_default().push(id);
        }
    }

    /// A message's record no longer matters.
    fn forget_record(&mut self, live: Live) {
        if let Some(segment) = self.segments.get_mut(&live.segment) {
            segment.live = segment.live.saturating_sub(live.len() as u64);
        }
    }
}
