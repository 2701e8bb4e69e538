//! The spare segment: the next segment file, made full of zeros and synced before it is
//! needed, on a thread of its own.
//!
//! Why: `fdatasync` after an append must also write the file's new size (the inode), a second
//! synchronous write; after an overwrite inside a file whose blocks are already written it
//! writes only the data. Measured on this project's VM (ext4): 4 KiB append + fdatasync
//! 5,500/s, the same overwriting a zeroed file 8,500/s. So records are written into segments
//! made ahead of time, and durability 2 waits for shorter syncs. Zeros mark the unwritten rest
//! (see `record`); a clean stop cuts it off, a start after a crash does too.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// A spare is made only with this many times its size free on the disk, so it never takes
/// the space that records need.
const FREE_SPACE_FACTOR: u64 = 4;

/// The one spare, and the thread that makes it.
pub(super) struct Spares {
    dir: PathBuf,
    /// The size of a spare: a segment's.
    size: u64,
    slot: Mutex<Slot>,
    work: Condvar,
    /// Told each time the maker is done with a spare (made or not).
    done: Condvar,
}

#[derive(Default)]
struct Slot {
    /// `spare` in the log's directory is whole and synced.
    ready: bool,
    /// A spare should be made.
    wanted: bool,
    /// One is being made.
    making: bool,
    stopping: bool,
}

impl Spares {
    /// Takes on a spare an earlier run left (if it is whole), or makes one now, so the first
    /// segment of this run is one (16 MiB of zeros took 10 ms here); then starts the thread
    /// that makes the next.
    pub fn start(dir: &Path, size: u64) -> std::io::Result<(Arc<Spares>, JoinHandle<()>)> {
        // A spare being made when the process stopped is half made.
        let _ = std::fs::remove_file(dir.join("spare.tmp"));
        let mut spares = Spares {
            dir: dir.to_path_buf(),
            size,
            slot: Mutex::default(),
            work: Condvar::new(),
            done: Condvar::new(),
        };
        let left = std::fs::metadata(dir.join("spare")).is_ok_and(|m| m.len() == size);
        spares.slot.get_mut().expect("never poisoned").ready = left || spares.make();
        let spares = Arc::new(spares);
        let maker = spares.clone();
        let thread = std::thread::Builder::new()
            .name("log-spare".into())
            .spawn(move || maker.run())?;
        Ok((spares, thread))
    }

    /// Makes `path` the next segment file: the spare renamed, if one is ready (`None` when
    /// not: the caller makes an empty file). A new spare is made either way.
    pub fn take(&self, path: &Path) -> Option<File> {
        let mut slot = self.slot.lock().expect("never poisoned");
        let ready = std::mem::take(&mut slot.ready);
        slot.wanted = true;
        drop(slot);
        self.work.notify_one();
        if !ready {
            return None;
        }
        let taken = std::fs::rename(self.dir.join("spare"), path)
            .and_then(|()| OpenOptions::new().write(true).open(path));
        match taken {
            Ok(file) => Some(file),
            Err(error) => {
                tracing::warn!(%error, "the spare segment could not be used");
                None
            }
        }
    }

    pub fn stop(&self) {
        self.slot.lock().expect("never poisoned").stopping = true;
        self.work.notify_one();
    }

    fn run(&self) {
        super::batch_scheduling();
        loop {
            let mut slot = self.slot.lock().expect("never poisoned");
            while !slot.wanted && !slot.stopping {
                slot = self.work.wait(slot).expect("never poisoned");
            }
            if slot.stopping {
                return;
            }
            slot.wanted = false;
            slot.making = true;
            drop(slot);
            let made = self.make();
            let mut slot = self.slot.lock().expect("never poisoned");
            (slot.ready, slot.making) = (made, false);
            drop(slot);
            self.done.notify_all();
        }
    }

    /// Waits until a spare is ready (true) or the maker gave up on the one wanted (false).
    #[cfg(test)]
    pub fn wait_until_made(&self) -> bool {
        let slot = self.slot.lock().expect("never poisoned");
        let slot = self
            .done
            .wait_while(slot, |slot| !slot.ready && (slot.wanted || slot.making))
            .expect("never poisoned");
        slot.ready
    }

    /// Writes `spare.tmp` full of zeros, syncs it and renames it `spare`; false if there is
    /// too little room or the disk refused (then the next segment simply grows as written).
    fn make(&self) -> bool {
        let room = free_bytes(&self.dir).unwrap_or(0);
        if room < self.size.saturating_mul(FREE_SPACE_FACTOR) {
            return false;
        }
        let tmp = self.dir.join("spare.tmp");
        let made =
            zeros(&tmp, self.size).and_then(|()| std::fs::rename(&tmp, self.dir.join("spare")));
        match made {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, "a spare segment could not be made");
                let _ = std::fs::remove_file(&tmp);
                false
            }
        }
    }
}

/// The size of each write of a spare's zeros. The page cache keeps a file's pages in folios
/// as large as the writes that made them (ext4 since Linux 6.16), and every later write into
/// a folio, and every `fdatasync` of one, walks all its blocks: zeros written a MiB at a time
/// made every record's `pwrite` walk 256 blocks (`ext4_block_write_begin`, 2.7% of the node's
/// core at 16 × 1 durability 1) and every sync as many. 16 KiB keeps that to four, for 1,024
/// writes a 16 MiB segment on the spare's own thread (docs/performance.md, "Spare segments
/// written 16 KiB at a time").
const ZEROS_PER_WRITE: usize = 16 << 10;

/// A file of `size` zeros at `path`, synced.
fn zeros(path: &Path, size: u64) -> std::io::Result<()> {
    let mut file = File::create(path)?;
    let chunk = vec![0u8; ZEROS_PER_WRITE];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    file.sync_data()
}

/// Bytes an unprivileged writer may still use on the file system of `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    if unsafe { libc::statvfs(path.as_ptr(), stats.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded, so it filled the buffer.
    let stats = unsafe { stats.assume_init() };
    Some(stats.f_bavail * stats.f_frsize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spare_is_its_size_in_zeros_whatever_its_last_write() {
        let dir = tempfile::tempdir().unwrap();
        for size in [
            0,
            1,
            ZEROS_PER_WRITE as u64,
            3 * ZEROS_PER_WRITE as u64 + 100,
        ] {
            let path = dir.path().join(format!("spare-{size}"));
            zeros(&path, size).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(bytes.len() as u64, size);
            assert!(bytes.iter().all(|&b| b == 0));
        }
    }
}
