//! Writing the pending buffer to segment files: done by whoever needs it written first (a
//! request waiting for its receipt, or the syncer), under one lock. Records are written at
//! their place in the segment (a spare segment is full of zeros ahead of them), not appended.

use super::{segment_path, Chunk, Shared};
use std::fs::File;
use std::os::unix::fs::FileExt;
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
    /// When the oldest written-but-unsynced data was written.
    pub unsynced_since: Option<Instant>,
    /// Chunks whose write failed, written before anything newer.
    retry: Vec<Chunk>,
    /// When to retry `retry` if no new record comes first.
    pub retry_at: Option<Instant>,
}

pub(super) struct Current {
    segment: u32,
    file: Arc<File>,
    /// Where its next record goes: the bytes written to it so far.
    end: u64,
}

impl Files {
    /// Takes the files to sync; the caller syncs them and reports up to what it synced.
    pub fn take_unsynced(&mut self) -> Vec<Arc<File>> {
        self.unsynced_since = None;
        std::mem::take(&mut self.unsynced)
    }

    pub fn has_failed_writes(&self) -> bool {
        !self.retry.is_empty()
    }
}

impl Shared {
    /// Writes everything pending with one `write` per segment touched. Returns once the
    /// records appended before the call are written, or their write failed (then they are
    /// kept and retried, and `failed_through` tells their waiters).
    pub(super) fn write_pending(&self) {
        let mut files = self.files.lock().expect("never poisoned");
        let (mut chunks, end) = {
            let mut state = self.lock();
            if state.pending.is_empty() && files.retry.is_empty() {
                return;
            }
            (std::mem::take(&mut state.pending), state.appended)
        };
        let mut batch = std::mem::take(&mut files.retry);
        batch.append(&mut chunks);
        let mut batch = batch.into_iter();
        let mut written = Vec::new();
        while let Some(chunk) = batch.next() {
            if let Err(error) = self.append(&mut files, &chunk) {
                tracing::error!(%error, "writing the message log failed; will retry");
                files.retry.push(chunk);
                files.retry.extend(batch);
                files.retry_at = Some(Instant::now() + RETRY_AFTER);
                self.progress
                    .send_modify(|p| p.failed_through = p.failed_through.max(end));
                // The syncer retries if nothing else writes first.
                self.wake_syncer();
                return;
            }
            written.push(chunk.bytes);
        }
        self.reuse(written);
        files.retry_at = None;
        files.unsynced_since.get_or_insert_with(Instant::now);
        self.progress
            .send_modify(|p| p.written = p.written.max(end));
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
    fn append(&self, files: &mut Files, chunk: &Chunk) -> std::io::Result<()> {
        let current = self.file_for(files, chunk.segment)?;
        current.file.write_all_at(&chunk.bytes, current.end)?;
        let len = chunk.bytes.len() as u64;
        current.end += len;
        let file = current.file.clone();
        self.bytes_written
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        if !files.unsynced.iter().any(|f| Arc::ptr_eq(f, &file)) {
            files.unsynced.push(file);
        }
        Ok(())
    }

    /// The file of `segment`, made if need be from the spare (the old one stays in
    /// `unsynced` until the next sync).
    fn file_for<'a>(&self, files: &'a mut Files, segment: u32) -> std::io::Result<&'a mut Current> {
        if files.current.as_ref().is_none_or(|c| c.segment != segment) {
            let path = segment_path(&self.dir, segment);
            let file = match self.spares.take(&path) {
                Some(spare) => spare,
                None => File::create(&path)?,
            };
            // The new file's name must survive a crash as well as its contents.
            File::open(&self.dir)?.sync_all()?;
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
