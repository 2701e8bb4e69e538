//! Reading the log back at start.

use super::index::{Index, Live};
use super::record::{all_zeros, read_at, Read, Record};
use super::segment_path;
use crate::message::ids::{IdMap, MessageId};
use crate::message::{DeadReason, Durability, RecoveredMessage};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

/// Bytes that failed their checksum, to be shown in the dead letter queue.
#[derive(Debug, Clone)]
pub struct DamagedRegion {
    pub segment: u32,
    pub offset: u64,
    pub bytes: Vec<u8>,
}

/// What the log held at start.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Live messages, queued and dead-lettered, in id order.
    pub messages: Vec<RecoveredMessage>,
    pub damaged: Vec<DamagedRegion>,
    /// Every deduplication id a record kept (its key, its message, when its window ends),
    /// whether or not the message is still in the queue: the engine takes back those whose
    /// windows have not ended.
    pub dedup: Vec<(u128, MessageId, u64)>,
}

/// The scan's result, including what the store needs to go on.
pub(super) struct Scan {
    pub recovered: Recovered,
    /// Bytes read from the segment files.
    pub bytes_read: u64,
    /// What is where, as the files say.
    pub index: Index,
}

/// Reads every segment in order. A record cut short at the end of the last segment (a write
/// torn by a crash) is cut off the file, and so are the zeros after a segment's last record
/// (the unwritten part of a segment made ahead of time). In the last segment, a record that
/// fails its checksum with only zeros after it is such a torn write too: a crash left part of
/// it unwritten. (After a clean stop the zeros are gone, so damage there is found as damage.)
pub(super) fn scan(dir: &Path) -> std::io::Result<Scan> {
    let numbers = segment_numbers(dir)?;
    let mut messages: IdMap<MessageId, RecoveredMessage> = IdMap::default();
    let mut scan = Scan {
        recovered: Recovered::default(),
        bytes_read: 0,
        index: Index::default(),
    };
    // Every file is known before any is read: a removal is weighed against all of them.
    for &segment in &numbers {
        scan.index.grew(segment, 0);
    }
    for (position, &segment) in numbers.iter().enumerate() {
        let path = segment_path(dir, segment);
        let bytes = std::fs::read(&path)?;
        scan.bytes_read += bytes.len() as u64;
        let is_last = position + 1 == numbers.len();
        let mut file_len = bytes.len();
        let mut offset = 0;
        while offset < bytes.len() {
            match read_at(&bytes, offset) {
                Read::Sound { record, len } => {
                    apply(&mut scan, &mut messages, segment, record, len);
                    offset += len;
                }
                Read::Damaged { len } if is_last && torn(&bytes, offset + len) => {
                    tracing::warn!(segment, offset, "cutting off a torn write at the log's end");
                    cut(&path, offset)?;
                    file_len = offset;
                    break;
                }
                Read::Damaged { len } => {
                    let region = bytes[offset..offset + len].to_vec();
                    scan.recovered.damaged.push(DamagedRegion {
                        segment,
                        offset: offset as u64,
                        bytes: region,
                    });
                    offset += len;
                }
                Read::Unfinished if is_last => {
                    tracing::warn!(segment, offset, "cutting off a torn write at the log's end");
                    cut(&path, offset)?;
                    file_len = offset;
                    break;
                }
                Read::End => {
                    cut(&path, offset)?;
                    file_len = offset;
                    break;
                }
                Read::Unfinished => {
                    scan.recovered.damaged.push(DamagedRegion {
                        segment,
                        offset: offset as u64,
                        bytes: bytes[offset..].to_vec(),
                    });
                    break;
                }
            }
        }
        scan.index.segments.entry(segment).or_default().bytes = file_len as u64;
    }
    let mut live: Vec<RecoveredMessage> = messages.into_values().collect();
    live.sort_unstable_by_key(|m| m.id);
    scan.recovered.messages = live;
    Ok(scan)
}

/// Whether a bad record ending at `end` is the torn last write: zeros, and only zeros, follow.
fn torn(bytes: &[u8], end: usize) -> bool {
    end < bytes.len() && all_zeros(&bytes[end..])
}

/// Cuts the segment file at `path` to `len` bytes, for good.
fn cut(path: &Path, len: usize) -> std::io::Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    file.set_len(len as u64)?;
    file.sync_all()
}

fn apply(
    scan: &mut Scan,
    messages: &mut IdMap<MessageId, RecoveredMessage>,
    segment: u32,
    record: Record<'_>,
    len: usize,
) {
    let index = &mut scan.index;
    match record {
        Record::Padding => {}
        Record::Message(record) => {
            let durability = match record.durability {
                2 => Durability::Immediate,
                _ => Durability::Eventual,
            };
            index.remember(
                record.id,
                Live::new(segment, len as u32, record.dead, durability),
            );
            if let Some(dedup) = record.dedup {
                index.holds_dedup(segment, dedup.until_ms);
                let kept = (dedup.key, record.id, dedup.until_ms);
                scan.recovered.dedup.push(kept);
            }
            messages.insert(
                record.id,
                RecoveredMessage {
                    id: record.id,
                    durability,
                    dead: record.dead,
                    delay_secs: record.delay_secs as u64,
                    due_ms: (record.due_ms != 0).then_some(record.due_ms),
                    recdat: record.recdat,
                    receives: record.receives,
                    expires_ms: (record.expires_ms != 0).then_some(record.expires_ms),
                    dead_reason: DeadReason::from_byte(record.dead_reason).unwrap_or_default(),
                    dead_at_ms: record.dead_at_ms,
                    frame: Arc::from(record.frame),
                },
            );
        }
        Record::Removed { id, held_in } => {
            index.remove(id);
            messages.remove(&id);
            let listed = held_in.map(|held_in| held_in.segments().collect());
            let still = index.still_holding(segment, listed);
            index.keep_for_each(segment, &still, len as u64);
        }
        Record::Purged { ids, held_in } => {
            for id in ids.iter() {
                index.remove(id);
                messages.remove(&id);
            }
            let still = index.still_holding(segment, Some(held_in.segments().collect()));
            index.keep_for_each(segment, &still, len as u64);
        }
        Record::Redriven(id) => {
            if let Some(message) = messages.get_mut(&id) {
                message.dead = false;
                message.due_ms = None;
                message.receives = 0;
                message.expires_ms = None;
                message.dead_reason = DeadReason::Rejected;
                message.dead_at_ms = 0;
            }
            if let Some(live) = index.live.get_mut(&id) {
                live.mark_redriven();
                let latest = live.segment;
                index.keep_for(segment, latest, len as u64);
            }
        }
        Record::DeadLettered(id) => {
            if let Some(message) = messages.get_mut(&id) {
                message.dead = true;
                message.dead_reason = DeadReason::Rejected;
                message.dead_at_ms = 0; // a mark (an older node's) has no time
            }
            if let Some(live) = index.live.get_mut(&id) {
                live.mark_dead();
                let latest = live.segment;
                index.keep_for(segment, latest, len as u64);
            }
        }
    }
}

fn segment_numbers(dir: &Path) -> std::io::Result<Vec<u32>> {
    let mut numbers = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(number) = name
            .strip_suffix(".log")
            .and_then(|n| n.parse::<u32>().ok())
        {
            numbers.push(number);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// Overwrites each damaged region with a padding record of its length, and syncs: call it once
/// the regions' dead-letter entries are safe, so a later start does not find them again.
pub fn repair(dir: &Path, regions: &[DamagedRegion]) -> std::io::Result<Vec<Repair>> {
    let mut repairs = Vec::new();
    for region in regions {
        if region.bytes.len() <= super::record::HEADER_LEN {
            continue; // too short to hold any record, or padding
        }
        let mut file = match OpenOptions::new()
            .write(true)
            .open(segment_path(dir, region.segment))
        {
            Ok(file) => file,
            // Compaction already dropped the segment, damage and all.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        file.seek(SeekFrom::Start(region.offset))?;
        let padding = super::record::padding(region.bytes.len());
        file.write_all(&padding)?;
        file.sync_data()?;
        repairs.push(Repair {
            segment: region.segment,
            offset: region.offset,
            bytes: padding,
        });
    }
    if !regions.is_empty() {
        File::open(dir)?.sync_all()?;
    }
    Ok(repairs)
}

/// Bytes [`repair`] wrote over damage: a standby that holds the segment already is sent them
/// too (`shipping`), or its copy would keep the record the primary dead-lettered.
#[derive(Debug, Clone)]
pub struct Repair {
    pub segment: u32,
    pub offset: u64,
    pub bytes: Vec<u8>,
}
