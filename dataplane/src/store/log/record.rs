//! The log's record format, and reading it back with damage found and stepped over.
//!
//! A record is `[len: u32 LE][crc: u32 LE][kind: u8][payload]`, where `len` counts the kind and
//! the payload and `crc` is CRC32C over them. A message record is a whole snapshot of the
//! message (so a later copy replaces an earlier one); the other kinds name a message by id.
//! A removal also lists the segments that held a record of its message when it was written:
//! compaction must keep it while any of them is on the disk (a removal written by an older
//! node, without the list, is kept while any older segment is).
//! A purge is one record for many removals: the ids it removed and, as a removal does, the
//! segments that held records of them. It lists ids rather than naming a scope ("every
//! waiting message") because replaying a scope could not give the same set back: holding is
//! not logged (a held message reads back as waiting), whether a message is delayed depends
//! on the clock, and compaction carries a record forward to the log's end, past messages
//! published or redriven after it. An id is never used again, so a purge of ids means the
//! same wherever it is read. A redrive mark undoes a dead-letter mark: the message waits
//! again.
//! Segment files are made full of zeros ahead of use (see `spare`), so the written part of a
//! segment ends where only zeros follow: no record is all zeros (its length is never 0).

use crate::message::ids::MessageId;
use uuid::Uuid;

/// Bytes before the kind: the length and the checksum.
pub const HEADER_LEN: usize = 8;
/// No record is bigger: a message frame is at most a few MiB. A larger length is damage.
pub const MAX_RECORD_LEN: usize = 64 << 20;
/// Fixed bytes of a message record's payload before its frame.
const MESSAGE_FIXED_LEN: usize = 16 + 1 + 1 + 4 + 8 + 8;
/// What a [`Kind::MessageLife`] record adds before its frame: the receive count, the
/// expiry, and the dead letter reason.
const LIFE_LEN: usize = 4 + 8 + 1;
/// What a [`Kind::MessageDeduplicated`] record adds after the life: the key's hash and when
/// its window ends.
const DEDUP_LEN: usize = 16 + 8;
/// What a [`Kind::MessageDead`] record adds after the life: when it was dead-lettered.
const DEAD_AT_LEN: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Filler over a damaged region that has been repaired; skipped.
    Padding = 0,
    /// A message, in full.
    Message = 1,
    /// The message is gone (acked or deleted); written by nodes before the list below.
    Removed = 2,
    /// The message moved to the dead letter queue.
    DeadLettered = 3,
    /// The message is gone, and these segments held records of it: `[id][segment: u32 LE]…`.
    RemovedFrom = 4,
    /// Messages are gone (an administrator's purge), and these segments held records of them:
    /// `[segments: u32 LE][segment: u32 LE]…[id]…`, at least one id.
    Purged = 5,
    /// The message moved from the dead letter queue back to the queue (a redrive).
    Redriven = 6,
    /// A message, in full, with what the delivery rules keep of it (README, "Delivery
    /// rules"): a [`Kind::Message`] record's fields, then `[receives: u32][expires_ms: u64]
    /// [dead reason: u8]`, then the frame. Written only when one of them is not zero, so a
    /// queue that uses none of the rules writes what it always did.
    MessageLife = 7,
    /// A message published with a deduplication id (README, "Exactly-once publish"): a
    /// [`Kind::MessageLife`] record's fields, then `[key hash: 16][window ends, ms: u64]`,
    /// then the frame. Only a message's first record is one: its segment is kept until the
    /// window ends (`index`), so a restart within it still knows the id.
    MessageDeduplicated = 8,
    /// A message in the dead letter queue, with when it went there (README, "The dead letter
    /// queue"): a [`Kind::MessageLife`] record's fields, then `[dead-lettered at, ms: u64]`,
    /// then the frame. Nodes since 2026-12-04 dead-letter by writing one (a mark, which has no
    /// room for the time, is read but no longer written); an older node reads it as damage.
    MessageDead = 9,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Kind> {
        match byte {
            0 => Some(Kind::Padding),
            1 => Some(Kind::Message),
            2 => Some(Kind::Removed),
            3 => Some(Kind::DeadLettered),
            4 => Some(Kind::RemovedFrom),
            5 => Some(Kind::Purged),
            6 => Some(Kind::Redriven),
            7 => Some(Kind::MessageLife),
            8 => Some(Kind::MessageDeduplicated),
            9 => Some(Kind::MessageDead),
            _ => None,
        }
    }
}

/// A message as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRecord<'a> {
    pub id: MessageId,
    pub durability: u8,
    pub dead: bool,
    pub delay_secs: u32,
    /// When a delayed message falls due (ms since 1970); 0 when it is not delayed.
    pub due_ms: u64,
    pub recdat: u64,
    /// Deliveries so far.
    pub receives: u32,
    /// When the message expires (ms since 1970); 0 when it does not.
    pub expires_ms: u64,
    /// Why it is dead-lettered ([`crate::message::DeadReason`]); 0 when it is not, or rejected.
    pub dead_reason: u8,
    /// When it was dead-lettered (ms since 1970); 0 when it is not, or the time is unknown (a
    /// mark, or a record of an older node, put it there).
    pub dead_at_ms: u64,
    /// Its deduplication id's hash and when its window ends: in its first record only.
    pub dedup: Option<Dedup>,
    /// The frame a subscriber receives.
    pub frame: &'a [u8],
}

/// A deduplication id as the log keeps it: its hash, and when its window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dedup {
    pub key: u128,
    pub until_ms: u64,
}

impl MessageRecord<'_> {
    /// Whether the record needs [`Kind::MessageLife`] to say everything (and so is one).
    pub fn has_life(&self) -> bool {
        self.receives != 0 || self.expires_ms != 0 || self.dead_reason != 0
    }
}

/// Appends a message record to `out`; returns its length.
pub fn encode_message(out: &mut Vec<u8>, record: &MessageRecord<'_>) -> usize {
    // A message's first record alone has its deduplication id, and a first record is never
    // dead-lettered.
    debug_assert!(record.dedup.is_none() || record.dead_at_ms == 0);
    let kind = match (
        record.dedup.is_some(),
        record.dead_at_ms != 0,
        record.has_life(),
    ) {
        (true, _, _) => Kind::MessageDeduplicated,
        (false, true, _) => Kind::MessageDead,
        (false, false, true) => Kind::MessageLife,
        (false, false, false) => Kind::Message,
    };
    let start = begin(out, kind);
    out.extend_from_slice(record.id.0.as_bytes());
    out.push(record.durability);
    out.push(record.dead as u8);
    out.extend_from_slice(&record.delay_secs.to_le_bytes());
    out.extend_from_slice(&record.due_ms.to_le_bytes());
    out.extend_from_slice(&record.recdat.to_le_bytes());
    if kind != Kind::Message {
        out.extend_from_slice(&record.receives.to_le_bytes());
        out.extend_from_slice(&record.expires_ms.to_le_bytes());
        out.push(record.dead_reason);
    }
    if let Some(dedup) = record.dedup {
        out.extend_from_slice(&dedup.key.to_le_bytes());
        out.extend_from_slice(&dedup.until_ms.to_le_bytes());
    }
    if kind == Kind::MessageDead {
        out.extend_from_slice(&record.dead_at_ms.to_le_bytes());
    }
    out.extend_from_slice(record.frame);
    finish(out, start)
}

/// Appends the removal of message `id`, whose records are in the segments `held_in`; returns
/// its length.
pub fn encode_removed(out: &mut Vec<u8>, id: MessageId, held_in: &[u32]) -> usize {
    let start = begin(out, Kind::RemovedFrom);
    out.extend_from_slice(id.0.as_bytes());
    for segment in held_in {
        out.extend_from_slice(&segment.to_le_bytes());
    }
    finish(out, start)
}

/// Appends the purge of the messages `ids` (at least one), whose records are in the segments
/// `held_in`; returns its length.
pub fn encode_purged(
    out: &mut Vec<u8>,
    ids: impl IntoIterator<Item = MessageId>,
    held_in: &[u32],
) -> usize {
    let start = begin(out, Kind::Purged);
    out.extend_from_slice(&(held_in.len() as u32).to_le_bytes());
    for segment in held_in {
        out.extend_from_slice(&segment.to_le_bytes());
    }
    let ids_at = out.len();
    for id in ids {
        out.extend_from_slice(id.0.as_bytes());
    }
    debug_assert!(out.len() > ids_at, "a purge removes at least one message");
    finish(out, start)
}

/// Appends a record that names a message by id; returns its length.
pub fn encode_id(out: &mut Vec<u8>, kind: Kind, id: MessageId) -> usize {
    let start = begin(out, kind);
    out.extend_from_slice(id.0.as_bytes());
    finish(out, start)
}

/// A padding record exactly `total_len` bytes long (at least `HEADER_LEN + 1`).
pub fn padding(total_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(total_len);
    let start = begin(&mut out, Kind::Padding);
    out.resize(total_len, 0);
    finish(&mut out, start);
    out
}

fn begin(out: &mut Vec<u8>, kind: Kind) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    out.push(kind as u8);
    start
}

fn finish(out: &mut [u8], start: usize) -> usize {
    let body = &out[start + HEADER_LEN..];
    let len = body.len() as u32;
    let crc = crc32c::crc32c(body);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    out.len() - start
}

/// A record read back.
#[derive(Debug, PartialEq, Eq)]
pub enum Record<'a> {
    Padding,
    Message(MessageRecord<'a>),
    /// `held_in` is `None` for a removal written without the list.
    Removed {
        id: MessageId,
        held_in: Option<HeldIn<'a>>,
    },
    DeadLettered(MessageId),
    /// A purge: every id in `ids` is gone.
    Purged {
        ids: PurgedIds<'a>,
        held_in: HeldIn<'a>,
    },
    Redriven(MessageId),
}

/// The ids a purge removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgedIds<'a>(&'a [u8]);

impl PurgedIds<'_> {
    pub fn iter(&self) -> impl Iterator<Item = MessageId> + '_ {
        self.0
            .chunks_exact(16)
            .map(|bytes| MessageId(Uuid::from_bytes(bytes.try_into().expect("16 bytes"))))
    }

    pub fn len(&self) -> usize {
        self.0.len() / 16
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The segments a removal lists as holding records of its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldIn<'a>(&'a [u8]);

impl HeldIn<'_> {
    pub fn segments(&self) -> impl Iterator<Item = u32> + '_ {
        self.0
            .chunks_exact(4)
            .map(|bytes| u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }
}

/// What lies at a position of a segment.
#[derive(Debug, PartialEq, Eq)]
pub enum Read<'a> {
    /// A sound record of `len` bytes.
    Sound { record: Record<'a>, len: usize },
    /// Bytes that fail their checksum (or do not parse), up to the next sound record.
    Damaged { len: usize },
    /// From here to the end there is no sound record: a write cut short.
    Unfinished,
    /// From here to the end there are only zeros: the part of the segment not written yet.
    End,
}

/// Whether `bytes` are all zeros (an empty slice is).
pub fn all_zeros(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Reads the record at `offset` of `segment`.
pub fn read_at(segment: &[u8], offset: usize) -> Read<'_> {
    if let Some((record, len)) = sound_record_at(segment, offset) {
        return Read::Sound { record, len };
    }
    if all_zeros(&segment[offset..]) {
        return Read::End;
    }
    // Damage: up to the next sound record, looked for byte by byte. The length field says
    // where the damaged record ends only when no sound record starts before that, and zeros
    // (the unwritten rest) or a sound record start there: a damaged length field may claim a
    // span with sound records in it, and trusting it once hid removals, so that acked
    // messages came back (found by fuzzing recovery).
    let next_sound = (offset + 1..segment.len()).find(|&p| sound_record_at(segment, p).is_some());
    if let Some(claimed) = claimed_len(segment, offset) {
        let end = offset + claimed;
        let nothing_sound_inside = next_sound.is_none_or(|next| next >= end);
        let then_zeros_or_sound = next_sound == Some(end) || all_zeros(&segment[end..]);
        if nothing_sound_inside && then_zeros_or_sound {
            return Read::Damaged { len: claimed };
        }
    }
    match next_sound {
        Some(next) => Read::Damaged { len: next - offset },
        None => Read::Unfinished,
    }
}

/// The total length the header at `offset` claims, if it fits in the segment.
fn claimed_len(segment: &[u8], offset: usize) -> Option<usize> {
    let header = segment.get(offset..offset + HEADER_LEN)?;
    let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
    ((1..=MAX_RECORD_LEN).contains(&len) && offset + HEADER_LEN + len <= segment.len())
        .then_some(HEADER_LEN + len)
}

fn sound_record_at(segment: &[u8], offset: usize) -> Option<(Record<'_>, usize)> {
    let total = claimed_len(segment, offset)?;
    let crc = u32::from_le_bytes(segment[offset + 4..offset + 8].try_into().unwrap());
    let body = &segment[offset + HEADER_LEN..offset + total];
    // Parsed before the checksum is computed: damage is looked through byte by byte, and
    // at nearly every place bytes that are no record fail to parse long before a checksum
    // over the megabytes their length claims would fail. (A checksum first made a scan of a
    // segment of garbage take hours.)
    let record = parse(body)?;
    (crc32c::crc32c(body) == crc).then_some((record, total))
}

fn parse(body: &[u8]) -> Option<Record<'_>> {
    let (&kind, payload) = body.split_first()?;
    match Kind::from_byte(kind)? {
        // Padding is all zeros past its kind (see `padding`).
        Kind::Padding => all_zeros(payload).then_some(Record::Padding),
        Kind::Removed | Kind::DeadLettered | Kind::Redriven if payload.len() != 16 => None,
        Kind::Removed => Some(Record::Removed {
            id: id_of(payload)?,
            held_in: None,
        }),
        Kind::RemovedFrom => {
            let segments = payload.get(16..)?;
            (segments.len() % 4 == 0).then_some(())?;
            Some(Record::Removed {
                id: id_of(payload)?,
                held_in: Some(HeldIn(segments)),
            })
        }
        Kind::DeadLettered => Some(Record::DeadLettered(id_of(payload)?)),
        Kind::Redriven => Some(Record::Redriven(id_of(payload)?)),
        Kind::Purged => {
            let listed = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
            let segments_end = listed.checked_mul(4)?.checked_add(4)?;
            let segments = payload.get(4..segments_end)?;
            let ids = payload.get(segments_end..)?;
            (!ids.is_empty() && ids.len() % 16 == 0).then_some(())?;
            Some(Record::Purged {
                ids: PurgedIds(ids),
                held_in: HeldIn(segments),
            })
        }
        kind @ (Kind::Message
        | Kind::MessageLife
        | Kind::MessageDeduplicated
        | Kind::MessageDead) => {
            let frame_at = match kind {
                Kind::MessageDeduplicated => MESSAGE_FIXED_LEN + LIFE_LEN + DEDUP_LEN,
                Kind::MessageDead => MESSAGE_FIXED_LEN + LIFE_LEN + DEAD_AT_LEN,
                Kind::MessageLife => MESSAGE_FIXED_LEN + LIFE_LEN,
                _ => MESSAGE_FIXED_LEN,
            };
            // Durability 1 or 2 (0 is never written), a flag, a known dead letter reason,
            // and a frame that is a JSON object.
            let well_formed = payload.len() > frame_at
                && matches!(payload[16], 1 | 2)
                && payload[17] <= 1
                && payload[frame_at] == b'{';
            if !well_formed {
                return None;
            }
            let u32_at = |at: usize| u32::from_le_bytes(payload[at..at + 4].try_into().unwrap());
            let u64_at = |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().unwrap());
            let (receives, expires_ms, dead_reason) = match kind {
                Kind::Message => (0, 0, 0),
                _ => {
                    let at = MESSAGE_FIXED_LEN;
                    (u32_at(at), u64_at(at + 4), payload[at + 12])
                }
            };
            let dedup = (kind == Kind::MessageDeduplicated).then(|| {
                let at = MESSAGE_FIXED_LEN + LIFE_LEN;
                let key = u128::from_le_bytes(payload[at..at + 16].try_into().unwrap());
                Dedup {
                    key,
                    until_ms: u64_at(at + 16),
                }
            });
            let dead_at_ms = match kind {
                Kind::MessageDead => u64_at(MESSAGE_FIXED_LEN + LIFE_LEN),
                _ => 0,
            };
            // A dead record says it is dead, and when.
            if kind == Kind::MessageDead && (payload[17] == 0 || dead_at_ms == 0) {
                return None;
            }
            crate::message::DeadReason::from_byte(dead_reason)?;
            Some(Record::Message(MessageRecord {
                id: id_of(payload)?,
                durability: payload[16],
                dead: payload[17] != 0,
                delay_secs: u32_at(18),
                due_ms: u64_at(22),
                recdat: u64_at(30),
                receives,
                expires_ms,
                dead_reason,
                dead_at_ms,
                dedup,
                frame: &payload[frame_at..],
            }))
        }
    }
}

fn id_of(payload: &[u8]) -> Option<MessageId> {
    let bytes: [u8; 16] = payload.get(..16)?.try_into().ok()?;
    Some(MessageId(Uuid::from_bytes(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> MessageId {
        MessageId(Uuid::from_bytes([n; 16]))
    }

    fn message(n: u8, frame: &[u8]) -> MessageRecord<'_> {
        MessageRecord {
            id: id(n),
            durability: 2,
            dead: false,
            delay_secs: 60,
            due_ms: 1_794_233_093_000,
            recdat: 1_794_233_033,
            receives: 0,
            expires_ms: 0,
            dead_reason: 0,
            dead_at_ms: 0,
            dedup: None,
            frame,
        }
    }

    #[test]
    fn a_dead_lettered_message_keeps_when_it_went_there() {
        let dead = MessageRecord {
            dead: true,
            dead_at_ms: 1_794_233_100_123,
            ..message(4, b"{\"body\":\"d\"}")
        };
        let mut out = Vec::new();
        let len = encode_message(&mut out, &dead);
        assert_eq!(out[HEADER_LEN], Kind::MessageDead as u8);
        assert_eq!(
            len,
            HEADER_LEN + 1 + MESSAGE_FIXED_LEN + LIFE_LEN + DEAD_AT_LEN + 12
        );
        match read_at(&out, 0) {
            Read::Sound { record, .. } => assert_eq!(record, Record::Message(dead)),
            other => panic!("{other:?}"),
        }
        // A dead record that says it is not dead is no record.
        let mut bad = out.clone();
        bad[HEADER_LEN + 1 + 17] = 0;
        let body = bad[HEADER_LEN..].to_vec();
        bad[4..8].copy_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        assert!(!matches!(read_at(&bad, 0), Read::Sound { .. }));
    }

    #[test]
    fn a_deduplicated_message_keeps_its_key_and_window_and_its_life() {
        let record = MessageRecord {
            receives: 2,
            dedup: Some(Dedup {
                key: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
                until_ms: 1_794_233_333_000,
            }),
            ..message(3, b"{\"body\":\"c\"}")
        };
        let mut out = Vec::new();
        let len = encode_message(&mut out, &record);
        assert_eq!(out[HEADER_LEN], Kind::MessageDeduplicated as u8);
        assert_eq!(
            len,
            HEADER_LEN + 1 + MESSAGE_FIXED_LEN + LIFE_LEN + DEDUP_LEN + 12
        );
        match read_at(&out, 0) {
            Read::Sound {
                record: Record::Message(read),
                len: read_len,
            } => {
                assert_eq!(read, record);
                assert_eq!(read_len, len);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_message_with_life_reads_back_whole_and_one_without_is_written_as_before() {
        let plain = message(1, b"{\"body\":\"a\"}");
        let mut out = Vec::new();
        let len = encode_message(&mut out, &plain);
        assert_eq!(
            out[HEADER_LEN],
            Kind::Message as u8,
            "no life: the old kind"
        );
        assert_eq!(len, HEADER_LEN + 1 + MESSAGE_FIXED_LEN + 12);
        let lived = MessageRecord {
            dead: true,
            receives: 3,
            expires_ms: 1_794_233_999_000,
            dead_reason: 1,
            ..message(2, b"{\"body\":\"b\"}")
        };
        let at = out.len();
        encode_message(&mut out, &lived);
        assert_eq!(out[at + HEADER_LEN], Kind::MessageLife as u8);
        match read_at(&out, 0) {
            Read::Sound { record, .. } => assert_eq!(record, Record::Message(plain)),
            other => panic!("{other:?}"),
        }
        match read_at(&out, at) {
            Read::Sound { record, .. } => assert_eq!(record, Record::Message(lived)),
            other => panic!("{other:?}"),
        }
        // An unknown dead letter reason is no record.
        let mut bad = out[at..].to_vec();
        let reason_at = HEADER_LEN + 1 + MESSAGE_FIXED_LEN + 12;
        bad[reason_at] = 9;
        let body = bad[HEADER_LEN..].to_vec();
        bad[4..8].copy_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        assert!(!matches!(read_at(&bad, 0), Read::Sound { .. }));
    }

    /// Three records: a message, a removal, a dead-lettering; with their offsets.
    fn segment() -> (Vec<u8>, [usize; 3]) {
        let mut out = Vec::new();
        let a = 0;
        encode_message(&mut out, &message(1, b"{\"body\":\"first\"}"));
        let b = out.len();
        encode_id(&mut out, Kind::Removed, id(1));
        let c = out.len();
        encode_id(&mut out, Kind::DeadLettered, id(2));
        (out, [a, b, c])
    }

    fn read_all(segment: &[u8]) -> Vec<String> {
        let mut offset = 0;
        let mut seen = Vec::new();
        while offset < segment.len() {
            match read_at(segment, offset) {
                Read::Sound { record, len } => {
                    seen.push(format!("{record:?}").chars().take(12).collect());
                    offset += len;
                }
                Read::Damaged { len } => {
                    seen.push(format!("damaged {len}"));
                    offset += len;
                }
                Read::Unfinished => {
                    seen.push("unfinished".into());
                    break;
                }
                Read::End => {
                    seen.push("end".into());
                    break;
                }
            }
        }
        seen
    }

    #[test]
    fn records_read_back_as_written() {
        let (bytes, [_, b, c]) = segment();
        let Read::Sound { record, len } = read_at(&bytes, 0) else {
            panic!()
        };
        assert_eq!(record, Record::Message(message(1, b"{\"body\":\"first\"}")));
        assert_eq!(len, b);
        assert_eq!(
            read_at(&bytes, b),
            Read::Sound {
                record: Record::Removed {
                    id: id(1),
                    held_in: None
                },
                len: c - b
            }
        );
        let tail = read_at(&bytes, c);
        assert_eq!(
            tail,
            Read::Sound {
                record: Record::DeadLettered(id(2)),
                len: bytes.len() - c
            }
        );
    }

    #[test]
    fn a_flipped_byte_damages_one_record_and_hides_no_other() {
        let (mut bytes, [_, b, _]) = segment();
        bytes[20] ^= 0x40; // inside the first record's payload
        assert_eq!(
            read_all(&bytes),
            ["damaged 63", "Removed { id", "DeadLettered"]
        );
        assert_eq!(b, 63);
    }

    #[test]
    fn a_damaged_length_is_stepped_over_to_the_next_sound_record() {
        let (mut bytes, [_, b, _]) = segment();
        bytes[1] = 0x7f; // the first record's length now claims far too much
        assert_eq!(
            read_all(&bytes),
            [
                format!("damaged {b}"),
                "Removed { id".into(),
                "DeadLettered".into()
            ]
        );
    }

    #[test]
    fn a_cut_short_tail_is_unfinished() {
        let (bytes, [_, _, c]) = segment();
        for cut in [c + 3, c + 9, bytes.len() - 1] {
            assert_eq!(
                read_all(&bytes[..cut]).last().unwrap(),
                "unfinished",
                "cut at {cut}"
            );
            assert_eq!(read_all(&bytes[..cut]).len(), 3);
        }
    }

    #[test]
    fn the_zeros_after_the_last_record_are_the_end_and_damage_before_them_is_found() {
        let (mut bytes, [_, _, c]) = segment();
        bytes.resize(bytes.len() + 4096, 0);
        assert_eq!(
            read_all(&bytes),
            ["Message(Mess", "Removed { id", "DeadLettered", "end"]
        );
        assert_eq!(read_all(&[0; 100]), ["end"], "a segment not written at all");
        // The last record damaged: found as damage, not taken for the end.
        bytes[c + HEADER_LEN + 3] ^= 0x01;
        assert_eq!(
            read_all(&bytes),
            ["Message(Mess", "Removed { id", "damaged 25", "end"]
        );
        // Torn by a machine crash, zeros after its first bytes: here it cannot be told from a
        // damaged record (recovery can: see `recovery::scan`).
        let (whole, _) = segment();
        let mut torn = whole[..c + 2].to_vec();
        torn.resize(c + 4096, 0);
        assert_eq!(
            read_all(&torn),
            ["Message(Mess", "Removed { id", "damaged 25", "end"]
        );
        // Torn inside its length: no length to go by, so the rest is unfinished.
        let mut torn = whole[..c + 1].to_vec();
        torn.push(0x80);
        torn.resize(c + 4096, 0);
        assert_eq!(read_all(&torn).last().unwrap(), "unfinished");
    }

    #[test]
    fn a_removal_lists_the_segments_that_held_its_message() {
        let mut out = Vec::new();
        let len = encode_removed(&mut out, id(7), &[3, 9]);
        let Read::Sound { record, len: read } = read_at(&out, 0) else {
            panic!()
        };
        assert_eq!(read, len);
        let Record::Removed {
            id: removed,
            held_in,
        } = record
        else {
            panic!("{record:?}")
        };
        assert_eq!(removed, id(7));
        assert_eq!(held_in.unwrap().segments().collect::<Vec<_>>(), [3, 9]);
    }

    #[test]
    fn a_purge_lists_its_ids_and_segments_and_a_redrive_names_its_message() {
        let mut out = Vec::new();
        let len = encode_purged(&mut out, [id(1), id(2), id(3)], &[4, 5]);
        assert_eq!(len, HEADER_LEN + 1 + 4 + 2 * 4 + 3 * 16);
        let at = out.len();
        encode_id(&mut out, Kind::Redriven, id(9));
        let Read::Sound { record, len: read } = read_at(&out, 0) else {
            panic!()
        };
        assert_eq!(read, len);
        let Record::Purged { ids, held_in } = record else {
            panic!("{record:?}")
        };
        assert_eq!(ids.iter().collect::<Vec<_>>(), [id(1), id(2), id(3)]);
        assert_eq!(held_in.segments().collect::<Vec<_>>(), [4, 5]);
        assert!(matches!(
            read_at(&out, at),
            Read::Sound {
                record: Record::Redriven(redriven),
                ..
            } if redriven == id(9)
        ));
    }

    #[test]
    fn a_purge_whose_lengths_do_not_add_up_is_damage() {
        for (listed, ids_bytes) in [(2u32, 16), (0, 0), (0, 15), (9, 32), (u32::MAX, 16)] {
            let mut out = Vec::new();
            let start = begin(&mut out, Kind::Purged);
            out.extend_from_slice(&listed.to_le_bytes());
            out.extend_from_slice(&[0u8; 8]);
            out.resize(out.len() + ids_bytes, 7);
            finish(&mut out, start);
            // Two segments and one id is the only reading that fits the first case's bytes.
            let sound = matches!(read_at(&out, 0), Read::Sound { .. });
            assert_eq!(
                sound,
                (listed, ids_bytes) == (2, 16),
                "{listed} {ids_bytes}"
            );
        }
    }

    #[test]
    fn a_damaged_length_that_claims_sound_records_does_not_hide_them() {
        // A message, then a record whose length field (damaged) claims everything to the end
        // of the segment, then the message's removal, whole and sound.
        let mut bytes = Vec::new();
        encode_message(&mut bytes, &message(1, b"{\"body\":\"first\"}"));
        let damaged_at = bytes.len();
        encode_id(&mut bytes, Kind::DeadLettered, id(9));
        let removal_at = bytes.len();
        encode_removed(&mut bytes, id(1), &[1]);
        let claimed = (bytes.len() - damaged_at - HEADER_LEN) as u32;
        bytes[damaged_at..damaged_at + 4].copy_from_slice(&claimed.to_le_bytes());
        assert_eq!(
            read_at(&bytes, damaged_at),
            Read::Damaged {
                len: removal_at - damaged_at
            }
        );
        assert!(matches!(
            read_at(&bytes, removal_at),
            Read::Sound {
                record: Record::Removed { .. },
                ..
            }
        ));
    }

    #[test]
    fn a_segment_of_garbage_is_read_through_in_one_pass() {
        // 16 MiB of noise: at about one place in 250 the length field claims a record that
        // fits, and a checksum over each of those would be terabytes of work.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..16 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let mut offset = 0;
        while offset < noise.len() {
            match read_at(&noise, offset) {
                Read::Sound { len, .. } | Read::Damaged { len } => offset += len,
                Read::Unfinished | Read::End => break,
            }
        }
    }

    #[test]
    fn padding_is_a_sound_record_of_the_asked_length() {
        let pad = padding(40);
        assert_eq!(pad.len(), 40);
        assert_eq!(
            read_at(&pad, 0),
            Read::Sound {
                record: Record::Padding,
                len: 40
            }
        );
    }
}
