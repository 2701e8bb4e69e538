//! Writing the pending buffer to segment files: done by whoever needs it written first (a
//! request waiting for its receipt, or the syncer), under one lock.

use super::{segment_path, Chunk, Shared};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// After a failed write, new records are still tried at once, but a retry of only the failed
/// ones waits this long.
pub(super) const RETRY_AFTER: Duration = Duration::from_millis(200);

/// The segment files being written, and what is written but not yet synced.
#[derive(Default)]
pub(super) struct Files {
    /// The segment file being appended to.
    current: Option<(u32, Arc<File>)>,
    /// Files written since the last sync (the current one, and any just closed).
    unsynced: Vec<Arc<File>>,
    /// When the oldest written-but-unsynced data was written.
    pub unsynced_since: Option<Instant>,
    /// Chunks whose write failed, written before anything newer.
    retry: Vec<Chunk>,
    /// When to retry `retry` if no new record comes first.
    pub retry_at: Option<Instant>,
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
        }
        files.retry_at = None;
        files.unsynced_since.get_or_insert_with(Instant::now);
        self.progress
            .send_modify(|p| p.written = p.written.max(end));
    }

    /// Writes one chunk at the end of its segment; on failure, cuts the file back so a retry
    /// does not leave half a record in the middle of the log.
    fn append(&self, files: &mut Files, chunk: &Chunk) -> std::io::Result<()> {
        let file = self.file_for(files, chunk.segment)?;
        let before = file.metadata()?.len();
        let written = (&*file).write_all(&chunk.bytes);
        if written.is_ok() {
            let len = chunk.bytes.len() as u64;
            self.bytes_written
                .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        }
        if written.is_err() {
            let _ = file.set_len(before);
        } else if !files.unsynced.iter().any(|f| Arc::ptr_eq(f, &file)) {
            files.unsynced.push(file);
        }
        written
    }

    /// The file of `segment`, opened if need be (the old one stays in `unsynced` until the
    /// next sync).
    fn file_for(&self, files: &mut Files, segment: u32) -> std::io::Result<Arc<File>> {
        match &files.current {
            Some((open, file)) if *open == segment => Ok(file.clone()),
            _ => {
                let path = segment_path(&self.dir, segment);
                let file = OpenOptions::new().create(true).append(true).open(path)?;
                // The new file's name must survive a crash as well as its contents.
                File::open(&self.dir)?.sync_all()?;
                let file = Arc::new(file);
                files.current = Some((segment, file.clone()));
                Ok(file)
            }
        }
    }
}
