//! The standby's side of the log (issue 35): the primary's segment files, kept byte for byte
//! from what it ships ([`Shipment`]). A node started on the directory reads it back as it
//! would its own after a kill -9.
//!
//! A sync here is what the standby's answer promises: every file written since the last sync,
//! and the directory when a file was made or removed. As on the primary, a failed sync is
//! final: the caller stops, and the pages it may have lost are never trusted to a retry.
//!
//! What the standby says it holds is what it can read back: at start, each segment's records
//! are checked (as the node's recovery does) and only the sound ones from its start count, so
//! writes a machine crash lost before their sync (zeros, or a torn record, left in a file that
//! has its length) are sent again; from then on, what it writes. Nothing is cut until the
//! primary says so (`Shipment::Truncate`): a standby that starts while its primary is gone
//! keeps what a promoted node's recovery can still read past damage.

use super::record::{read_at, Read};
use super::segment_path;
use super::shipping::{head_of, Held, Shipment, HEAD_BYTES};
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
    /// Each segment there is: how much of it from its start holds what the primary sent, and
    /// the file's length.
    held: BTreeMap<u32, (u64, u64)>,
}

impl Mirror {
    /// The mirror in `dir` (made if need be), its segments read through once.
    pub fn open(dir: &Path) -> std::io::Result<Mirror> {
        std::fs::create_dir_all(dir)?;
        let mut held = BTreeMap::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let Some(segment) = segment_of(&entry.file_name().to_string_lossy()) else {
                continue;
            };
            // Nothing is cut here: what is not sound may be damage a promoted node's
            // recovery dead-letters, and the primary, if there is one, says what to cut.
            let bytes = std::fs::read(entry.path())?;
            let sound = sound_prefix(&bytes);
            held.insert(segment, (sound, bytes.len() as u64));
        }
        Ok(Mirror {
            dir: dir.to_path_buf(),
            open: BTreeMap::new(),
            unsynced: BTreeSet::new(),
            directory_unsynced: false,
            held,
        })
    }

    /// What it holds of each segment: what the primary need not send again, once it has
    /// checked that the segment is its own.
    pub fn have(&mut self) -> std::io::Result<Vec<Held>> {
        let mut have = Vec::with_capacity(self.held.len());
        let held: Vec<(u32, (u64, u64))> = self.held.iter().map(|(&s, &h)| (s, h)).collect();
        for (segment, (sound, len)) in held {
            let head = head_of(self.file(segment)?, sound.min(HEAD_BYTES))?;
            have.push(Held {
                segment,
                sound,
                len,
                // Shorter than it says (cut under it): it holds nothing that counts.
                head: head.unwrap_or(0),
            });
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
                // The primary sends each segment in order from what it was told is here.
                let end = offset + bytes.len() as u64;
                let (sound, len) = self.held.entry(*segment).or_default();
                if *offset <= *sound {
                    *sound = (*sound).max(end);
                }
                *len = (*len).max(end);
            }
            Shipment::Truncate { segment, len } => {
                self.file(*segment)?.set_len(*len)?;
                self.unsynced.insert(*segment);
                let (sound, _) = self.held.get(segment).copied().unwrap_or_default();
                self.held.insert(*segment, (sound.min(*len), *len));
            }
            Shipment::Remove { segment } => {
                self.sync()?;
                self.open.remove(segment);
                self.held.remove(segment);
                match std::fs::remove_file(segment_path(&self.dir, *segment)) {
                    Ok(()) => self.directory_unsynced = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            // Kept beside the log, by the standby (`replication::holds`).
            Shipment::Through { .. } | Shipment::Hold(_) => {}
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
                .read(true)
                .write(true)
                .open(path)?;
            self.directory_unsynced |= made;
            self.open.insert(segment, file);
        }
        Ok(&self.open[&segment])
    }
}

/// How many bytes from a segment's start are sound records: where a record first fails its
/// checksum, is cut short, or zeros begin.
fn sound_prefix(bytes: &[u8]) -> u64 {
    let mut offset = 0;
    while let Read::Sound { len, .. } = read_at(bytes, offset) {
        offset += len;
    }
    offset as u64
}

/// The segment a file name is of (`00000042.log`).
fn segment_of(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".log")?;
    (digits.len() == 8 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}
