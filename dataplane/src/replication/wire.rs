//! The replication connection's frames. The standby's first is text, the hello; the rest are
//! binary: a kind byte, then little-endian fields.

use crate::message::ids::{MessageId, SessionId};
use crate::store::log::shipping::Held;
use crate::store::log::{HoldChange, Shipment};
use crate::store::meta::SavedSettings;
use crate::store::Holder;
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// The standby's first frame: its key, what it holds of each segment, and of which log
/// (`store::log::lineage`; None: it holds none, or one from before lineages).
#[derive(Serialize, Deserialize)]
pub struct Hello {
    pub key: String,
    pub have: Vec<Held>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<String>,
    /// It takes the lineage frame (a standby from before lineages would stop at it).
    #[serde(default)]
    pub takes_lineage: bool,
    /// The highest epoch it knows of (`replication::epoch`); None: a standby from before
    /// epochs, which also takes no epoch frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// It takes who holds what (`H`, `U`, `Z`; `replication::holds`).
    #[serde(default)]
    pub takes_holds: bool,
    /// It answers how many holds it has applied (`A`): deliveries wait for it
    /// (`store::log::heard`).
    #[serde(default)]
    pub answers_holds: bool,
}

const WRITE: u8 = b'W';
const TRUNCATE: u8 = b'T';
const REMOVE: u8 = b'R';
const THROUGH: u8 = b'L';
/// The primary's saved settings (JSON), at the catch-up and on every save.
const SETTINGS: u8 = b'C';
/// The SQS face's receipt key (its 32 bytes), at the catch-up.
const RECEIPT_KEY: u8 = b'K';
/// The log's lineage (text), after the epoch.
const LINEAGE: u8 = b'N';
/// The primary's epoch (u64), first of all, to a standby that says which it knows.
const EPOCH: u8 = b'E';
/// Who holds a durable message (`replication::holds`), to a standby that takes them: a
/// session holds one (id, session, capacity), an SQS receive holds one (id, until, receive
/// number), one is released (id), every hold forgotten.
const HELD: u8 = b'H';
const RECEIVED: u8 = b'V';
const RELEASED: u8 = b'U';
const HOLDS_CLEARED: u8 = b'Z';
/// Standby → primary: synced up to an LSN.
const SYNCED: u8 = b'S';
/// Standby → primary: how many hold changes (`H`, `V`, `U`, `Z`) it has applied on this
/// connection (u64).
const HOLDS_APPLIED: u8 = b'A';

/// What the standby answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Synced up to this LSN.
    Synced(u64),
    /// Applied this many hold changes since the connection began.
    HoldsApplied(u64),
}

/// The largest write in one frame: under the node's frame limit (the largest
/// `max-ws-msg-len`, 1 MiB), with room for the header.
pub const MAX_WRITE_BYTES: usize = 512 << 10;

pub fn encode(shipment: &Shipment) -> Bytes {
    let mut out = BytesMut::new();
    match shipment {
        Shipment::Write {
            segment,
            offset,
            bytes,
        } => {
            out.reserve(13 + bytes.len());
            out.put_u8(WRITE);
            out.put_u32_le(*segment);
            out.put_u64_le(*offset);
            out.put_slice(bytes);
        }
        Shipment::Truncate { segment, len } => {
            out.put_u8(TRUNCATE);
            out.put_u32_le(*segment);
            out.put_u64_le(*len);
        }
        Shipment::Remove { segment } => {
            out.put_u8(REMOVE);
            out.put_u32_le(*segment);
        }
        Shipment::Through { lsn, sync } => {
            out.put_u8(THROUGH);
            out.put_u64_le(*lsn);
            out.put_u8(u8::from(*sync));
        }
        Shipment::Hold(HoldChange::Held { id, holder }) => match holder {
            Holder::Session { session, capacity } => {
                out.put_u8(HELD);
                out.put_u128_le(id.0.as_u128());
                out.put_u128_le(session.0.as_u128());
                out.put_u64_le(*capacity);
            }
            Holder::Received { until_ms, receipt } => {
                out.put_u8(RECEIVED);
                out.put_u128_le(id.0.as_u128());
                out.put_u64_le(*until_ms);
                out.put_u64_le(*receipt);
            }
        },
        Shipment::Hold(HoldChange::Released(id)) => {
            out.put_u8(RELEASED);
            out.put_u128_le(id.0.as_u128());
        }
        Shipment::Hold(HoldChange::Cleared) => out.put_u8(HOLDS_CLEARED),
    }
    out.freeze()
}

/// What the primary sends: the log's shipments, and the rest of the data directory a
/// promoted standby needs.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    Log(Shipment),
    Settings(SavedSettings),
    ReceiptKey(Bytes),
    Lineage(String),
    Epoch(u64),
}

pub fn encode_epoch(epoch: u64) -> Bytes {
    let mut out = BytesMut::with_capacity(9);
    out.put_u8(EPOCH);
    out.put_u64_le(epoch);
    out.freeze()
}

pub fn encode_lineage(lineage: &str) -> Bytes {
    [&[LINEAGE][..], lineage.as_bytes()].concat().into()
}

pub fn encode_settings(settings: &SavedSettings) -> Bytes {
    let mut out = vec![SETTINGS];
    serde_json::to_writer(&mut out, settings).expect("settings serialize");
    out.into()
}

pub fn encode_receipt_key(key: &[u8]) -> Bytes {
    [&[RECEIPT_KEY][..], key].concat().into()
}

/// What a frame from the primary is; None if it is nothing the standby takes.
pub fn decode_sent(frame: &Bytes) -> Option<Sent> {
    match *frame.first()? {
        SETTINGS => serde_json::from_slice(&frame[1..]).ok().map(Sent::Settings),
        RECEIPT_KEY if frame.len() == 33 => Some(Sent::ReceiptKey(frame.slice(1..))),
        LINEAGE => lineage_of(&frame[1..]).map(Sent::Lineage),
        EPOCH => Some(Sent::Epoch(u64::from_le_bytes(
            frame.get(1..)?.try_into().ok()?,
        ))),
        _ => decode(frame).map(Sent::Log),
    }
}

/// A shipment from a frame; None if it is not one.
pub fn decode(frame: &Bytes) -> Option<Shipment> {
    let (&kind, rest) = frame.split_first()?;
    let u32_at = |at: usize| Some(u32::from_le_bytes(rest.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(rest.get(at..at + 8)?.try_into().ok()?));
    let uuid_at = |at: usize| {
        let bytes = rest.get(at..at + 16)?.try_into().ok()?;
        Some(uuid::Uuid::from_u128(u128::from_le_bytes(bytes)))
    };
    match kind {
        WRITE if rest.len() >= 12 => Some(Shipment::Write {
            segment: u32_at(0)?,
            offset: u64_at(4)?,
            bytes: frame.slice(13..),
        }),
        TRUNCATE if rest.len() == 12 => Some(Shipment::Truncate {
            segment: u32_at(0)?,
            len: u64_at(4)?,
        }),
        REMOVE if rest.len() == 4 => Some(Shipment::Remove {
            segment: u32_at(0)?,
        }),
        THROUGH if rest.len() == 9 && rest[8] <= 1 => Some(Shipment::Through {
            lsn: u64_at(0)?,
            sync: rest[8] == 1,
        }),
        HELD if rest.len() == 40 => Some(Shipment::Hold(HoldChange::Held {
            id: MessageId(uuid_at(0)?),
            holder: Holder::Session {
                session: SessionId(uuid_at(16)?),
                capacity: u64_at(32)?,
            },
        })),
        RECEIVED if rest.len() == 32 => Some(Shipment::Hold(HoldChange::Held {
            id: MessageId(uuid_at(0)?),
            holder: Holder::Received {
                until_ms: u64_at(16)?,
                receipt: u64_at(24)?,
            },
        })),
        RELEASED if rest.len() == 16 => {
            Some(Shipment::Hold(HoldChange::Released(MessageId(uuid_at(0)?))))
        }
        HOLDS_CLEARED if rest.is_empty() => Some(Shipment::Hold(HoldChange::Cleared)),
        _ => None,
    }
}

/// A lineage as the log makes them: 32 hex digits.
fn lineage_of(text: &[u8]) -> Option<String> {
    let fine = text.len() == 32 && text.iter().all(u8::is_ascii_hexdigit);
    fine.then(|| String::from_utf8_lossy(text).into_owned())
}

pub fn encode_answer(answer: Answer) -> Bytes {
    let (kind, number) = match answer {
        Answer::Synced(lsn) => (SYNCED, lsn),
        Answer::HoldsApplied(count) => (HOLDS_APPLIED, count),
    };
    let mut out = BytesMut::with_capacity(9);
    out.put_u8(kind);
    out.put_u64_le(number);
    out.freeze()
}

pub fn decode_answer(frame: &[u8]) -> Option<Answer> {
    let (&kind, rest) = frame.split_first()?;
    let number = u64::from_le_bytes(rest.try_into().ok()?);
    match kind {
        SYNCED => Some(Answer::Synced(number)),
        HOLDS_APPLIED => Some(Answer::HoldsApplied(number)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipment_comes_back_as_it_went() {
        let shipments = [
            Shipment::Write {
                segment: 7,
                offset: 1 << 33,
                bytes: Bytes::from_static(b"records"),
            },
            Shipment::Write {
                segment: 1,
                offset: 0,
                bytes: Bytes::new(),
            },
            Shipment::Truncate {
                segment: u32::MAX,
                len: 12,
            },
            Shipment::Remove { segment: 3 },
            Shipment::Through {
                lsn: u64::MAX,
                sync: true,
            },
            Shipment::Through {
                lsn: 5,
                sync: false,
            },
            Shipment::Hold(HoldChange::Held {
                id: MessageId(uuid::Uuid::from_u128(u128::MAX - 1)),
                holder: Holder::Session {
                    session: SessionId(uuid::Uuid::from_u128(7 << 100)),
                    capacity: 1024,
                },
            }),
            Shipment::Hold(HoldChange::Held {
                id: MessageId(uuid::Uuid::from_u128(5)),
                holder: Holder::Received {
                    until_ms: u64::MAX,
                    receipt: 1 << 60,
                },
            }),
            Shipment::Hold(HoldChange::Released(MessageId(uuid::Uuid::from_u128(3)))),
            Shipment::Hold(HoldChange::Cleared),
        ];
        for shipment in shipments {
            assert_eq!(decode(&encode(&shipment)), Some(shipment));
        }
        for answer in [Answer::Synced(42), Answer::HoldsApplied(7)] {
            assert_eq!(decode_answer(&encode_answer(answer)), Some(answer));
        }
        let settings = SavedSettings {
            values: vec![("max-subscriber-capacity".into(), 7)],
            changed_at: Some(1_800_000_000),
        };
        let sent = decode_sent(&encode_settings(&settings));
        assert_eq!(sent, Some(Sent::Settings(settings)));
        let key = [9u8; 32];
        let sent = decode_sent(&encode_receipt_key(&key));
        assert_eq!(sent, Some(Sent::ReceiptKey(Bytes::copy_from_slice(&key))));
        let lineage = "0123456789abcdef0123456789abcdef";
        let sent = decode_sent(&encode_lineage(lineage));
        assert_eq!(sent, Some(Sent::Lineage(lineage.to_string())));
        assert_eq!(decode_sent(&encode_lineage("../../etc/passwd")), None);
        assert_eq!(
            decode_sent(&encode_epoch(u64::MAX)),
            Some(Sent::Epoch(u64::MAX))
        );
        assert_eq!(decode_sent(&Bytes::from_static(b"E1234567")), None);
        assert_eq!(decode_sent(&Bytes::from_static(b"E123456789")), None);
        assert_eq!(decode_sent(&Bytes::from_static(b"K123")), None);
        assert_eq!(decode_sent(&Bytes::from_static(b"C{")), None);
    }

    #[test]
    fn what_is_not_a_shipment_is_refused() {
        for bad in [
            &b""[..],
            b"W123",
            b"T1234567890123",
            b"R12",
            b"L12345678",
            b"L123456782",
            b"H1234567890123456",
            b"V12345678901234567890123456789012345678901",
            b"U123",
            b"Z1",
            b"X",
        ] {
            assert_eq!(decode(&Bytes::copy_from_slice(bad)), None, "{bad:?}");
        }
        assert_eq!(decode_answer(b"S1234"), None);
        assert_eq!(decode_answer(b"L12345678"), None);
        assert_eq!(decode_answer(b"A123456789"), None);
    }
}
