//! sled, synced for real: the one way both planes make a sled write durable.
//!
//! sled's own flush is not a sync. sled 0.34 writes its log with `pwrite` and then
//! `sync_file_range` on Linux, which flushes neither the drive's write cache nor the file's
//! metadata, and whose failure a pass-through file system never even sees: what it reported
//! as flushed could be lost with the machine. [`SyncedSled::sync`] flushes sled and then
//! fsyncs its data file, as the message log syncs its segments.
//!
//! A failed sync is final. The kernel may already have dropped the pages it could not write,
//! and a later sync would report success without them, so after one failure no sync succeeds
//! again in this process: nothing written since counts as on the disk until a restart reads
//! back what is there.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct SyncedSled {
    db: sled::Db,
    /// sled's one data file (`DIR/db`), opened again to fsync it (an fsync syncs the file,
    /// whichever descriptor asks).
    file: std::fs::File,
    /// A sync failed: none is trusted again in this process.
    failed: AtomicBool,
}

/// A write that may not be on the disk: its sync failed, now or before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the store could not be synced; nothing written to it since counts as on the disk until the process restarts")]
pub struct NotSynced;

impl SyncedSled {
    /// Opens the database `config` describes (its path is `dir`), and syncs `dir`, so that the
    /// names of the files sled made last.
    pub fn open(config: sled::Config, dir: &Path) -> Result<SyncedSled, sled::Error> {
        let db = config.path(dir).open()?;
        let file = std::fs::File::open(dir.join("db"))?;
        std::fs::File::open(dir)?.sync_all()?;
        Ok(SyncedSled {
            db,
            file,
            failed: AtomicBool::new(false),
        })
    }

    /// The database, for its trees.
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// Makes everything written so far durable: sled's flush, then an fsync of its file.
    /// Fails at once after any failure before.
    pub fn sync(&self) -> Result<(), NotSynced> {
        if self.failed.load(Ordering::Acquire) {
            return Err(NotSynced);
        }
        if self.db.flush().is_err() || self.file.sync_all().is_err() {
            self.failed.store(true, Ordering::Release);
            return Err(NotSynced);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_synced_reads_back_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SyncedSled::open(sled::Config::new(), dir.path()).unwrap();
            store.db().insert("key", "value").unwrap();
            store.sync().unwrap();
        }
        // sled lets go of its lock a moment after the last handle drops.
        let reopened = (0..100)
            .find_map(|_| {
                let opened = SyncedSled::open(sled::Config::new(), dir.path()).ok();
                if opened.is_none() {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                opened
            })
            .expect("reopened");
        assert_eq!(reopened.db().get("key").unwrap().unwrap(), "value");
    }
}
