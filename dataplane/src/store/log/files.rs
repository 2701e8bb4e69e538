//! Writing the pending buffer to segment files, under one lock: by the log's writer thread, the
//! syncer while it compacts, and the round writer on the runtime where the write is quick
//! ([`Shared::try_write_pending`], `inline.rs`). Records are written at their place in the
//! segment (a spare segment is full of zeros ahead of them), not appended.

use super::shipping::{Follower, Shipment};
use super::{segment_path, Chunk, Shared};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// After a failed write, new records are still tried at once, but a retry of only the failed
/// ones waits this long.
pub(super) const RETRY_AFTER: Duration = Duration::from_millis(200);

/// The segment files being written, and what is written but not yet synced.
#[derive(Default)]
pub(super) struct Files {
    /// The segment file being written.
    current: Option<Current>,
    /// Files written since the last sync (the current one, and any just closed).
    unsynced: Vec<Arc<File>>,
    /// A segment file was made since the last sync: the directory is synced with the files,
    /// so that its name lasts as long as what is in it.
    directory_unsynced: bool,
    /// When the oldest written-but-unsynced data was written.
    pub unsynced_since: Option<Instant>,
    /// Every record ending at or before this LSN is written to a file in `unsynced`, or is
    /// synced already. It moves with `unsynced`, under this lock, in the same hold as the
    /// write: a sync that takes `unsynced` answers exactly up to here (see the log's notes).
    written: u64,
    /// Chunks whose write failed, written before anything newer.
    retry: Vec<Chunk>,
    /// When to retry `retry` if no new record comes first.
    pub retry_at: Option<Instant>,
    /// The standby every write and removal is shipped to, if one is attached (`shipping`).
    pub follower: Option<Follower>,
    /// Standbys attached since start (names each attach).
    pub attaches: u64,
}

pub(super) struct Current {
    segment: u32,
    file: Arc<File>,
    /// Where its next record goes: the bytes written to it so far.
    end: u64,
}

impl Files {
    /// Takes what a sync must make safe: once its files (and the directory, if asked) are
    /// synced, every record up to its `written` is.
    pub fn take_unsynced(&mut self) -> Unsynced {
        self.unsynced_since = None;
        Unsynced {
            files: std::mem::take(&mut self.unsynced),
            directory: std::mem::take(&mut self.directory_unsynced),
            written: self.written,
        }
    }

    /// The segment being written and where its written part ends.
    pub fn current_end(&self) -> Option<(u32, u64)> {
        self.current.as_ref().map(|c| (c.segment, c.end))
    }

    /// The LSN every record up to which is written.
    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn has_failed_writes(&self) -> bool {
        !self.retry.is_empty()
    }

    /// Bytes of the chunks kept for a retry.
    fn retry_bytes(&self) -> u64 {
        self.retry.iter().map(|c| c.bytes.len() as u64).sum()
    }
}

/// What one sync must make safe, taken from [`Files`] in one hold of its lock.
pub(super) struct Unsynced {
    pub files: Vec<Arc<File>>,
    /// A segment file was made: its name is synced too.
    pub directory: bool,
    /// The LSN up to which everything is safe once these are synced. With no file and no
    /// directory to sync, everything up to it is safe already: an earlier sync (on the same
    /// thread, finished) took its files.
    pub written: u64,
}

impl Unsynced {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && !self.directory
    }
}

/// Why a chunk did not reach its file: the write failed, and the chunk, still ours, is
/// written again later.
struct Fault(std::io::Error);

impl Shared {
    /// Writes everything pending with one `write` per segment touched. Returns once the
    /// records appended before the call are written, or their write failed (then they are
    /// kept and retried, and `failed_through` tells their waiters). A batch that holds a
    /// durability-2 change asks for a sync once it is written.
    pub(super) fn write_pending(&self) {
        let files = self.files.lock().expect("never poisoned");
        self.write_pending_to(files);
    }

    /// [`Shared::write_pending`] on the async runtime (the round writer, `inline.rs`), where
    /// it is quick: false, and nothing written, when the files are busy, a failed write waits
    /// for its retry, the log stops, or a record pending begins a segment file.
    pub(super) fn try_write_pending(&self) -> bool {
        let files = match self.files.try_lock() {
            Ok(files) => files,
            Err(std::sync::TryLockError::WouldBlock) => return false,
            Err(std::sync::TryLockError::Poisoned(_)) => panic!("never poisoned"),
        };
        if !files.retry.is_empty() {
            return false;
        }
        let current = files.current.as_ref().map(|c| c.segment);
        {
            let state = self.lock();
            let in_current = |chunk: &Chunk| Some(chunk.segment) == current;
            if state.stopping || !state.pending.iter().all(in_current) {
                return false;
            }
        }
        self.write_pending_to(files);
        true
    }

    /// Writes everything pending to `files`, whose lock the caller holds.
    fn write_pending_to(&self, mut files: std::sync::MutexGuard<'_, Files>) {
        let (mut chunks, end, wants_sync, since) = {
            let mut state = self.lock();
            // Whoever writes takes the round the round writer was asked for.
            state.round_asked = false;
            if self.is_broken() {
                // After a failed sync nothing more is written; the records are not needed
                // (the queue holds their messages in memory).
                state.pending.clear();
                return;
            }
            if state.pending.is_empty() && files.retry.is_empty() {
                return;
            }
            let chunks = std::mem::take(&mut state.pending);
            (
                chunks,
                state.appended,
                std::mem::take(&mut state.sync_wanted),
                state.pending_since.take(),
            )
        };
        let mut batch = std::mem::take(&mut files.retry);
        let retrying = !batch.is_empty();
        batch.append(&mut chunks);
        let mut batch = batch.into_iter();
        let mut written = Vec::new();
        while let Some(chunk) = batch.next() {
            match self.append(&mut files, &chunk) {
                Ok(()) => written.push(chunk.bytes),
                Err(Fault(error)) => {
                    tracing::error!(%error, "writing the message log failed; will retry");
                    files.retry.push(chunk);
                    files.retry.extend(batch);
                    files.retry_at = Some(Instant::now() + RETRY_AFTER);
                    self.unwritten.store(files.retry_bytes(), Ordering::Relaxed);
                    self.progress
                        .send_modify(|p| p.failed_through = p.failed_through.max(end));
                    return;
                }
            }
        }
        self.reuse(written);
        if let Some(since) = since {
            self.rounds.write.add(since.elapsed());
        }
        files.retry_at = None;
        self.unwritten.store(0, Ordering::Relaxed);
        if retrying {
            tracing::info!("the message log is written again: the records kept are on the disk");
        }
        let unsynced_began = files.unsynced_since.is_none();
        files.unsynced_since.get_or_insert_with(Instant::now);
        // With the files it is written to, under the same hold: whichever sync takes them
        // answers these records, even one that runs before the write is announced below.
        files.written = files.written.max(end);
        self.ship(&mut files, || Shipment::Through {
            lsn: end,
            sync: wants_sync,
        });
        drop(files);
        #[cfg(test)]
        if let Some(hook) = &*self.after_write.lock().expect("never poisoned") {
            hook();
        }
        self.progress
            .send_modify(|p| p.written = p.written.max(end));
        if wants_sync {
            self.request_sync();
        } else if unsynced_began {
            // The syncer may sleep with no sync due; this one is due within a second.
            self.lock().unsynced_began = true;
            self.wake_syncer();
        }
    }

    /// A sync failed: the log writes nothing more, and every change not yet synced is
    /// answered with its failure.
    pub(super) fn break_down(&self, error: &std::io::Error) {
        tracing::error!(
            %error,
            "a sync of the message log failed: durable changes are refused until the node restarts"
        );
        self.progress.send_modify(|p| p.broken = true);
        self.lock().pending.clear();
        self.unwritten.store(0, Ordering::Relaxed);
    }

    /// Keeps a few written chunks' buffers for the next chunks.
    fn reuse(&self, buffers: Vec<Vec<u8>>) {
        const KEPT: usize = 4;
        let mut state = self.lock();
        // Not one a big message made big: it would stay big.
        let usual = buffers.into_iter().filter(|b| b.capacity() <= 1 << 20);
        for mut buffer in usual {
            if state.free_buffers.len() >= KEPT {
                break;
            }
            buffer.clear();
            state.free_buffers.push(buffer);
        }
    }

    /// Writes one chunk where its segment's written part ends. A failed write moves nothing
    /// on: its retry writes over whatever part of it reached the file.
    fn append(&self, files: &mut Files, chunk: &Chunk) -> Result<(), Fault> {
        let current = self.file_for(files, chunk.segment)?;
        let offset = current.end;
        current
            .file
            .write_all_at(&chunk.bytes, offset)
            .map_err(Fault)?;
        let len = chunk.bytes.len() as u64;
        current.end += len;
        let file = current.file.clone();
        self.ship(files, || Shipment::Write {
            segment: chunk.segment,
            offset,
            bytes: bytes::Bytes::copy_from_slice(&chunk.bytes),
        });
        self.bytes_written.fetch_add(len, Ordering::Relaxed);
        if !files.unsynced.iter().any(|f| Arc::ptr_eq(f, &file)) {
            files.unsynced.push(file);
        }
        Ok(())
    }

    /// The file of `segment`, made if need be from the spare (the old one stays in
    /// `unsynced` until the next sync). Its name is synced with the next sync, not here: a
    /// name need not outlast a machine failure before what is in it is synced, and a
    /// directory sync would hold every write back for a journal commit.
    fn file_for<'a>(&self, files: &'a mut Files, segment: u32) -> Result<&'a mut Current, Fault> {
        if files.current.as_ref().is_none_or(|c| c.segment != segment) {
            let path = segment_path(&self.dir, segment);
            let file = match self.spares.take(&path) {
                Some(spare) => spare,
                None => File::create(&path).map_err(Fault)?,
            };
            files.directory_unsynced = true;
            files.current = Some(Current {
                segment,
                file: Arc::new(file),
                end: 0,
            });
        }
        Ok(files.current.as_mut().expect("just made"))
    }

    /// Cuts the zeros after the written part of the segment being written, for a clean stop.
    pub(super) fn trim_current(&self) {
        let files = self.files.lock().expect("never poisoned");
        if let Some(current) = &files.current {
            let trimmed = current.file.set_len(current.end);
            if let Err(error) = trimmed.and_then(|()| current.file.sync_all()) {
                tracing::warn!(%error, "the last segment keeps its unwritten zeros");
            }
        }
    }
}

/// How long a standby stays attached before its absence ends: one that attaches and is
/// dropped again and again (it crashes while it catches up, its link flaps) is still absent
/// to the control plane, which replaces it after the silence limit, as it does one that never
/// attaches. At most half that limit (the node's step-down time), so that a standby which
/// comes straight back is never judged absent for its settling alone.
const STANDBY_SETTLE_MS: u64 = 30_000;

impl Shared {
    /// Whether a standby is attached and has been for its settling time at `now_ms` (after
    /// `opened`).
    pub(super) fn standby_settled(&self, now_ms: u64) -> bool {
        if self.attached.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let step_down_after = self.step_down_after_ms.load(Ordering::Relaxed);
        let settle = match step_down_after {
            0 => STANDBY_SETTLE_MS,
            after => STANDBY_SETTLE_MS.min(after / 2),
        };
        let attached_at = self.standby_attached_at_ms.load(Ordering::Relaxed);
        now_ms.saturating_sub(attached_at) >= settle
    }

    /// The attached standby's stay ended at `left_ms` (it went silent then, or went, or
    /// another attached in its place): if it had settled by then, the absence begins then; if
    /// not, it goes on from before it came.
    pub(super) fn standby_leaves(&self, left_ms: u64) {
        if self.standby_settled(left_ms) {
            // (Never before it came, should its silence be longer than its stay.)
            let attached_at = self.standby_attached_at_ms.load(Ordering::Relaxed);
            let since = left_ms.max(attached_at);
            self.standby_absent_since_ms.store(since, Ordering::Relaxed);
        }
    }

    /// How long no standby has stayed, at `now_ms` (at least 1; 0 while one has settled):
    /// from when the last one that had settled went (or the start) until now, or, while one
    /// is attached and settling, until it attached: one that comes back is judged by how long
    /// it was gone, one that keeps being dropped by all the time since it last stayed.
    pub(super) fn standby_absent_ms(&self, now_ms: u64) -> u64 {
        if self.standby_settled(now_ms) {
            return 0;
        }
        let until = match self.attached.load(Ordering::Relaxed) {
            0 => now_ms,
            _ => self.standby_attached_at_ms.load(Ordering::Relaxed),
        };
        let since = self.standby_absent_since_ms.load(Ordering::Relaxed);
        until.saturating_sub(since).max(1)
    }

    /// Queues `shipment` for the standby, if one is attached, under the files' lock the
    /// caller holds. A standby that is gone or too far behind is dropped, and durability 2
    /// stops counting on it at once.
    pub(super) fn ship(&self, files: &mut Files, shipment: impl FnOnce() -> Shipment) {
        let Some(follower) = &files.follower else {
            return;
        };
        if !follower.ship(shipment()) {
            self.standby_gone(files, std::time::Duration::ZERO);
        }
    }

    /// No standby is attached from now on (under the files' lock the caller holds):
    /// durability 2 and deliveries stop waiting for one, and its absence counts from when it
    /// went silent (`silent_for` ago: 0 unless it was dropped for its silence)
    /// ([`Shipping::standing`](super::Shipping::standing)), or, if it had not settled by then,
    /// from when the last one that had went.
    pub(super) fn standby_gone(&self, files: &mut Files, silent_for: std::time::Duration) {
        let went_silent = self.now_ms().saturating_sub(silent_for.as_millis() as u64);
        self.standby_leaves(went_silent);
        files.follower = None;
        self.attached.store(0, Ordering::Relaxed);
        self.holds_heard.wait_for_standby(false);
        self.progress
            .send_if_modified(|p| std::mem::take(&mut p.standby_in_sync));
    }
}
