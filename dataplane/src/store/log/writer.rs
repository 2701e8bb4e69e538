//! The log's writer thread: the only code that writes segment files.

use super::record::{encode_message, read_at, MessageRecord, Read, Record};
use super::{segment_path, Chunk, Live, Progress, Shared};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Written data is synced at the latest this long after its write (durability 1's promise).
const SYNC_WITHIN: Duration = Duration::from_secs(1);
/// After a failed write, wait this long before trying again.
const RETRY_AFTER: Duration = Duration::from_millis(200);
/// Records compaction checks under one hold of the lock.
const COMPACTION_STEP: usize = 1024;

pub(super) fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || Writer::new(shared).run())
}

/// A batch taken from the pending buffer.
struct Batch {
    chunks: Vec<Chunk>,
    /// The LSN at the batch's end.
    end: u64,
    sync_wanted: bool,
}

struct Writer {
    shared: Arc<Shared>,
    /// The segment file being appended to.
    file: Option<(u32, File)>,
    /// Chunks whose write failed, to write before anything newer.
    retry: Vec<Chunk>,
    /// When the oldest written-but-unsynced data was written.
    unsynced_since: Option<Instant>,
    /// When to try `retry` again if nothing new comes first.
    retry_at: Option<Instant>,
    progress: Progress,
}

impl Writer {
    fn new(shared: Arc<Shared>) -> Writer {
        Writer {
            shared,
            file: None,
            retry: Vec::new(),
            unsynced_since: None,
            retry_at: None,
            progress: Progress::default(),
        }
    }

    fn run(mut self) {
        while let Some(batch) = self.next_batch() {
            self.write(batch);
            if self.retry.is_empty() {
                self.compact();
            } else if self.shared.lock().stopping {
                tracing::error!("stopping with records the disk would not take");
                return;
            }
        }
    }

    /// Waits for work: pending records, a retry or a sync that is due, or the stop (`None`
    /// once nothing is left to write). New records end the wait even while a failed write
    /// waits for its retry, so their writers hear of a full disk at once.
    fn next_batch(&mut self) -> Option<Batch> {
        let shared = self.shared.clone();
        let mut state = shared.lock();
        loop {
            let now = Instant::now();
            let sync_at = self.unsynced_since.map(|since| since + SYNC_WITHIN);
            let due = [self.retry_at, sync_at].into_iter().flatten().min();
            if !state.pending.is_empty() || due.is_some_and(|at| at <= now) {
                break;
            }
            match due {
                Some(at) => {
                    state = shared
                        .work
                        .wait_timeout(state, at - now)
                        .expect("never poisoned")
                        .0;
                }
                None if state.stopping => return None,
                None => state = shared.work.wait(state).expect("never poisoned"),
            }
        }
        Some(self.take_batch(&mut state))
    }

    /// Everything to write now: failed chunks first, then the pending buffer.
    fn take_batch(&mut self, state: &mut super::State) -> Batch {
        let mut chunks = std::mem::take(&mut self.retry);
        chunks.append(&mut state.pending);
        Batch {
            chunks,
            end: state.appended,
            sync_wanted: std::mem::take(&mut state.sync_wanted) || state.stopping,
        }
    }

    fn write(&mut self, batch: Batch) {
        let mut chunks = batch.chunks.into_iter();
        while let Some(chunk) = chunks.next() {
            if let Err(error) = self.append(&chunk) {
                tracing::error!(%error, "writing the message log failed; will retry");
                self.retry.push(chunk);
                self.retry.extend(chunks);
                self.retry_at = Some(Instant::now() + RETRY_AFTER);
                self.publish(|p| p.failed_through = batch.end);
                return;
            }
        }
        self.retry_at = None;
        if batch.end > self.progress.written {
            self.publish(|p| p.written = batch.end);
            self.unsynced_since.get_or_insert_with(Instant::now);
        }
        let sync_due = self
            .unsynced_since
            .is_some_and(|t| t.elapsed() >= SYNC_WITHIN);
        if batch.sync_wanted || sync_due {
            self.sync();
        }
    }

    /// Writes one chunk at the end of its segment; on failure, cuts the file back so a retry
    /// does not leave half a record in the middle of the log.
    fn append(&mut self, chunk: &Chunk) -> std::io::Result<()> {
        let file = self.file_for(chunk.segment)?;
        let before = file.metadata()?.len();
        let written = file.write_all(&chunk.bytes);
        if written.is_err() {
            let _ = file.set_len(before);
        }
        written
    }

    /// The file of `segment`, opened (and its predecessor synced and closed) if need be.
    fn file_for(&mut self, segment: u32) -> std::io::Result<&mut File> {
        if self.file.as_ref().is_none_or(|(open, _)| *open != segment) {
            if let Some((_, old)) = self.file.take() {
                // Syncs below only reach the current file: finish the old one now.
                old.sync_data()?;
            }
            let path = segment_path(&self.shared.dir, segment);
            let file = OpenOptions::new().create(true).append(true).open(path)?;
            // The new file's name must survive a crash as well as its contents.
            File::open(&self.shared.dir)?.sync_all()?;
            self.file = Some((segment, file));
        }
        Ok(&mut self.file.as_mut().expect("just opened").1)
    }

    fn sync(&mut self) {
        let written = self.progress.written;
        let synced = match &self.file {
            Some((_, file)) => file.sync_data(),
            None => Ok(()),
        };
        match synced {
            Ok(()) => {
                self.unsynced_since = None;
                self.publish(|p| {
                    p.synced = written;
                    p.syncs += 1;
                });
            }
            Err(error) => {
                tracing::error!(%error, "syncing the message log failed");
                self.publish(|p| p.failed_through = p.failed_through.max(written));
            }
        }
    }

    fn publish(&mut self, change: impl FnOnce(&mut Progress)) {
        change(&mut self.progress);
        let progress = self.progress;
        self.shared.progress.send_replace(progress);
    }

    /// Compacts the oldest segment while that is worth it.
    fn compact(&mut self) {
        loop {
            // Bound first: the guard must be gone before compacting takes the lock again.
            let candidate = self.shared.lock().compaction_candidate();
            let Some(oldest) = candidate else { return };
            if let Err(error) = self.compact_segment(oldest) {
                tracing::error!(%error, segment = oldest, "compacting the message log failed");
                return;
            }
        }
    }

    /// Appends the live messages of `oldest` again, syncs them, and removes its file.
    fn compact_segment(&mut self, oldest: u32) -> std::io::Result<()> {
        let path = segment_path(&self.shared.dir, oldest);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut offset = 0;
        while offset < bytes.len() {
            let mut state = self.shared.lock();
            for _ in 0..COMPACTION_STEP {
                let len = match read_at(&bytes, offset) {
                    Read::Sound {
                        record: Record::Message(record),
                        len,
                    } => {
                        copy_if_live(&mut state, oldest, &record);
                        len
                    }
                    Read::Sound { len, .. } | Read::Damaged { len } => len,
                    Read::Unfinished => bytes.len() - offset,
                };
                offset += len;
                if offset >= bytes.len() {
                    break;
                }
            }
        }
        // The copies (and whatever came meanwhile) must be safe before the original goes.
        let shared = self.shared.clone();
        let batch = self.take_batch(&mut shared.lock());
        self.write(Batch {
            sync_wanted: true,
            ..batch
        });
        if !self.retry.is_empty() || self.progress.synced < self.progress.written {
            return Err(std::io::Error::other("the compacted copies are not synced"));
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        File::open(&self.shared.dir)?.sync_all()?;
        self.shared.lock().segments.remove(&oldest);
        Ok(())
    }
}

/// Appends `record` again if it is still its message's latest record, with the message's
/// current state.
fn copy_if_live(state: &mut super::State, oldest: u32, record: &MessageRecord<'_>) {
    let Some(&live) = state.live.get(&record.id) else {
        return;
    };
    if live.segment != oldest {
        return;
    }
    let copy = MessageRecord {
        dead: live.dead,
        ..record.clone()
    };
    let (segment, _, len) = state.append(|out| encode_message(out, &copy));
    state.remember(
        record.id,
        Live {
            segment,
            len,
            ..live
        },
    );
}
