//! Who holds which durable message, carried to the standby (docs/standby-design.md, section 4),
//! so that a subscriber whose primary was lost resumes its session on the promoted copy, with
//! what it held, and nothing it holds goes to another subscriber meanwhile; and so that an SQS
//! receive stays invisible, and its receipt handle deletes it, on the promoted copy.
//!
//! Holds are not in the log (a restart ends every session), so they travel beside it: the
//! log ships every delivery of a durable message and every way one stops being held
//! ([`HoldChange`]); a standby that attaches is first sent the primary's whole table. The
//! standby keeps the table in memory and appends each change to a journal in its data
//! directory, `holds`, unsynced: the standby is stopped, not its machine, when its copy is
//! promoted. A node that starts on the copy takes the journal ([`take`]): every session in
//! it is a saved session from then, for `saved-session-timeout-secs`.
//!
//! A delivery is shipped before its frame is queued for the subscriber, and the frame is
//! written only once the standby has applied the hold and answered so (`store::log::heard`;
//! an SQS receive is answered likewise): a primary lost at any moment leaves every hold its
//! subscribers know of on the standby, so none moves to a second subscriber while the first
//! holds it. (A standby that does not answer holds, from before 2026-12-05, is not waited for.)

use super::wire;
use crate::engine::CarriedHolds;
use crate::message::ids::{IdMap, MessageId};
use crate::store::log::{HoldChange, Shipment};
use crate::store::{data_dir, Holder};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One held message's line in the journal, the largest kind ([`wire::encode`]'s `H`).
const HELD_BYTES: u64 = 41;
/// A received one's (`V`), a release's (`U`) and a clearing's (`Z`).
const RECEIVED_BYTES: usize = 33;
const RELEASED_BYTES: usize = 17;
/// The journal is written anew from the table once it is this long and four times what the
/// table needs: every change appends, so a long-lived session's acks would grow it without end.
const REWRITE_AT_BYTES: u64 = 1 << 20;

/// The standby's table and its journal.
pub struct Journal {
    table: IdMap<MessageId, Holder>,
    path: PathBuf,
    file: File,
    /// Its length on disk.
    len: u64,
    /// Changes applied and not yet appended ([`Journal::flush`]).
    pending: Vec<u8>,
}

impl Journal {
    /// The journal in `data_dir`, with what it holds. Kept until the primary sends its whole
    /// table again (after each connection's catch-up): a standby that restarts, or whose
    /// primary is lost while it catches up, keeps what it was last told.
    pub fn open(data_dir: &Path) -> std::io::Result<Journal> {
        let path = data_dir.join(data_dir::HOLDS);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut table = IdMap::default();
        apply_all(&mut table, &bytes);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        let mut journal = Journal {
            table,
            path,
            file,
            len: bytes.len() as u64,
            pending: Vec::new(),
        };
        // A record cut short at its end (a standby stopped in the middle of a write): written
        // anew, so what is appended next is read.
        if journal.len != sound_len(&bytes) {
            journal.rewrite()?;
        }
        Ok(journal)
    }

    pub fn apply(&mut self, change: HoldChange) {
        match change {
            HoldChange::Cleared => {
                self.table.clear();
                self.pending.clear();
                // What the journal has is replaced: written anew at the next flush.
                self.len = u64::MAX;
                return;
            }
            HoldChange::Held { id, holder } => {
                self.table.insert(id, holder);
            }
            HoldChange::Released(id) => {
                if self.table.remove(&id).is_none() {
                    return;
                }
            }
        }
        self.pending
            .extend_from_slice(&wire::encode(&Shipment::Hold(change)));
    }

    /// Appends the changes applied since the last flush, in one write; writes the journal
    /// anew from the table instead when it was cleared or has grown past what it needs.
    pub fn flush(&mut self) -> std::io::Result<()> {
        let needed = self.table.len() as u64 * HELD_BYTES;
        let grown = self.len.saturating_add(self.pending.len() as u64);
        if grown > REWRITE_AT_BYTES.max(needed * 4) {
            return self.rewrite();
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        self.file.write_all(&self.pending)?;
        self.len += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    fn rewrite(&mut self) -> std::io::Result<()> {
        let mut whole = Vec::with_capacity(self.table.len() * HELD_BYTES as usize);
        for (&id, &holder) in &self.table {
            let held = HoldChange::Held { id, holder };
            whole.extend_from_slice(&wire::encode(&Shipment::Hold(held)));
        }
        qe_shared::files::write_whole(&self.path, &whole, 0o600)?;
        self.file = std::fs::OpenOptions::new().append(true).open(&self.path)?;
        self.len = whole.len() as u64;
        self.pending.clear();
        Ok(())
    }
}

/// At a node's start: the sessions its data directory's journal carries (a standby's copy,
/// promoted), saved for `saved_for_ms`; None if there is no journal. The journal is removed
/// once read: a later start of this node must not take sessions that were since ended.
pub fn take(data_dir: &Path, saved_for_ms: u64) -> std::io::Result<Option<CarriedHolds>> {
    let path = data_dir.join(data_dir::HOLDS);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut carried = CarriedHolds {
        holds: IdMap::default(),
        saved_for_ms,
    };
    apply_all(&mut carried.holds, &bytes);
    std::fs::remove_file(&path)?;
    qe_shared::files::sync_dir(&path)?;
    Ok(Some(carried))
}

/// Applies a journal's changes to `table`.
fn apply_all(table: &mut IdMap<MessageId, Holder>, bytes: &[u8]) {
    for (change, _) in records(bytes) {
        match change {
            HoldChange::Cleared => table.clear(),
            HoldChange::Held { id, holder } => {
                table.insert(id, holder);
            }
            HoldChange::Released(id) => {
                table.remove(&id);
            }
        }
    }
}

/// How many of a journal's `bytes` are whole records.
fn sound_len(bytes: &[u8]) -> u64 {
    records(bytes).map(|(_, len)| len as u64).sum()
}

/// The changes a journal's bytes hold, each with its length, up to the first that is cut
/// short (the standby was stopped in the middle of a write) or not one.
fn records(mut bytes: &[u8]) -> impl Iterator<Item = (HoldChange, usize)> + '_ {
    std::iter::from_fn(move || {
        let len = match *bytes.first()? {
            b'H' => HELD_BYTES as usize,
            b'V' => RECEIVED_BYTES,
            b'U' => RELEASED_BYTES,
            b'Z' => 1,
            _ => return None,
        };
        let record = bytes.get(..len)?;
        bytes = &bytes[len..];
        match wire::decode(&bytes::Bytes::copy_from_slice(record))? {
            Shipment::Hold(change) => Some((change, len)),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ids::SessionId;

    fn id(n: u128) -> MessageId {
        MessageId(uuid::Uuid::from_u128(n))
    }

    fn session(n: u128) -> SessionId {
        SessionId(uuid::Uuid::from_u128(n << 64))
    }

    fn held(message: u128, by: u128) -> HoldChange {
        let holder = Holder::Session {
            session: session(by),
            capacity: 3,
        };
        HoldChange::Held {
            id: id(message),
            holder,
        }
    }

    #[test]
    fn a_node_takes_what_the_standby_was_last_told_and_only_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.apply(held(1, 1));
        journal.apply(held(9, 9));
        journal.flush().unwrap();
        // A new connection: the primary's whole table again.
        journal.apply(HoldChange::Cleared);
        journal.apply(held(1, 1));
        journal.apply(held(2, 1));
        journal.apply(held(3, 2));
        journal.flush().unwrap();
        journal.apply(HoldChange::Released(id(2)));
        // Resumed under a new session id.
        journal.apply(held(3, 3));
        journal.flush().unwrap();
        let received = Holder::Received {
            until_ms: 7,
            receipt: 8,
        };
        journal.apply(HoldChange::Held {
            id: id(5),
            holder: received,
        });
        journal.flush().unwrap();
        // Applied, never flushed: the standby stopped before it wrote them.
        journal.apply(held(4, 1));

        let carried = take(dir.path(), 10_000).unwrap().unwrap();
        let mut holds: Vec<(u128, Holder)> = carried
            .holds
            .iter()
            .map(|(id, holder)| (id.0.as_u128(), *holder))
            .collect();
        holds.sort_by_key(|(id, _)| *id);
        let by = |n: u128| Holder::Session {
            session: session(n),
            capacity: 3,
        };
        assert_eq!(holds, [(1, by(1)), (3, by(3)), (5, received)]);
        assert_eq!(carried.saved_for_ms, 10_000);
        assert!(take(dir.path(), 10_000).unwrap().is_none(), "taken once");
    }

    /// A standby started again (or connected again) keeps what it was last told until the
    /// primary sends its whole table; a record cut short at the end is dropped, and what is
    /// appended after it is read.
    #[test]
    fn a_standby_started_again_keeps_its_journal() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.apply(held(1, 1));
        journal.apply(held(2, 1));
        journal.flush().unwrap();
        drop(journal);
        let path = dir.path().join(data_dir::HOLDS);
        let len = std::fs::metadata(&path).unwrap().len();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len - 5).unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.apply(held(3, 1));
        journal.flush().unwrap();
        let carried = take(dir.path(), 1).unwrap().unwrap();
        let mut ids: Vec<u128> = carried.holds.keys().map(|id| id.0.as_u128()).collect();
        ids.sort();
        assert_eq!(ids, [1, 3]);
    }

    #[test]
    fn a_journal_cut_short_gives_what_came_before_the_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.apply(held(1, 1));
        journal.apply(held(2, 1));
        journal.flush().unwrap();
        let path = dir.path().join(data_dir::HOLDS);
        let len = std::fs::metadata(&path).unwrap().len();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len - 5).unwrap();
        let carried = take(dir.path(), 1).unwrap().unwrap();
        assert_eq!(carried.holds.len(), 1);
        assert!(carried.holds.contains_key(&id(1)));
    }

    #[test]
    fn the_journal_is_written_anew_before_it_outgrows_its_table() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.apply(held(u128::MAX, 7));
        // A long-lived session's deliveries and acks.
        for n in 0..100_000 {
            journal.apply(held(n, 1));
            journal.apply(HoldChange::Released(id(n)));
            journal.flush().unwrap();
        }
        let len = std::fs::metadata(dir.path().join(data_dir::HOLDS))
            .unwrap()
            .len();
        assert!(len <= REWRITE_AT_BYTES + 2 * HELD_BYTES, "{len}");
        let carried = take(dir.path(), 1).unwrap().unwrap();
        assert_eq!(carried.holds.len(), 1);
        assert!(carried.holds.contains_key(&id(u128::MAX)));
    }
}
