//! The standby's side of the log (issue 35): the primary's segment files, kept byte for byte
//! from what it ships ([`Shipment`]). A node started on the directory reads it back as it
//! would its own after a kill -9.
//!
//! A sync here is what the standby's answer promises: every file written since the last sync,
//! and the directory when a file was made or removed. As on the primary, a failed sync is
//! final: the caller stops, and the pages it may have lost are never trusted to a retry.

use super::segment_path;
use super::shipping::Shipment;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub struct Mirror {
    dir: PathBuf,
    /// The segment files open for writing.
    open: BTreeMap<u32, File>,
    /// Segments written since the last sync.
    unsynced: BTreeSet<u32>,
    /// A file was made or removed since the last sync.
    directory_unsynced: bool,
}

impl Mirror {
    /// The mirror in `dir` (made if need be).
    pub fn open(dir: &Path) -> std::io::Result<Mirror> {
        std::fs::create_dir_all(dir)?;
        Ok(Mirror {
            dir: dir.to_path_buf(),
            open: BTreeMap::new(),
            unsynced: BTreeSet::new(),
            directory_unsynced: false,
        })
    }

    /// Each segment file there is, and its length: what the primary need not send again.
    pub fn have(&self) -> std::io::Result<BTreeMap<u32, u64>> {
        let mut have = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(segment) = segment_of(&name.to_string_lossy()) else {
                continue;
            };
            have.insert(segment, entry.metadata()?.len());
        }
        Ok(have)
    }

    /// Applies one shipment. A removal syncs what was written first: the primary removed the
    /// segment only once the copies of what it kept were synced.
    pub fn apply(&mut self, shipment: &Shipment) -> std::io::Result<()> {
        match shipment {
            Shipment::Write {
                segment,
                offset,
                bytes,
            } => {
                self.file(*segment)?.write_all_at(bytes, *offset)?;
                self.unsynced.insert(*segment);
            }
            Shipment::Truncate { segment, len } => {
                self.file(*segment)?.set_len(*len)?;
                self.unsynced.insert(*segment);
            }
            Shipment::Remove { segment } => {
                self.sync()?;
                self.open.remove(segment);
                match std::fs::remove_file(segment_path(&self.dir, *segment)) {
                    Ok(()) => self.directory_unsynced = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            Shipment::Through { .. } => {}
        }
        Ok(())
    }

    /// Syncs every file written since the last sync, and the directory if a file came or
    /// went.
    pub fn sync(&mut self) -> std::io::Result<()> {
        for segment in std::mem::take(&mut self.unsynced) {
            if let Some(file) = self.open.get(&segment) {
                file.sync_data()?;
            }
        }
        if std::mem::take(&mut self.directory_unsynced) {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }

    fn file(&mut self, segment: u32) -> std::io::Result<&File> {
        if !self.open.contains_key(&segment) {
            let path = segment_path(&self.dir, segment);
            let made = !path.exists();
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)?;
            self.directory_unsynced |= made;
            self.open.insert(segment, file);
        }
        Ok(&self.open[&segment])
    }
}

/// The segment a file name is of (`00000042.log`).
fn segment_of(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".log")?;
    (digits.len() == 8 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}
