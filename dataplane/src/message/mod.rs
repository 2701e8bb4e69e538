//! What a message is, below both the engine that moves it and the store that keeps it: its
//! ids ([`ids`]), its durability, why it is dead-lettered, the message as the queue keeps it,
//! the frames subscribers receive, and a message as the log reads it back
//! ([`RecoveredMessage`]).

pub mod ids;
pub mod json;

use bytes::Bytes;
use ids::MessageId;
use serde::Serialize;
use std::borrow::Cow;
use std::sync::Arc;

/// How safe a message is if the machine fails (the manual's Durability table). Ordered from
/// the weakest to the strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Durability {
    /// Memory only; lost on restart; cannot go to the dead letter queue.
    None = 0,
    /// Written to the disk; synced soon after.
    #[default]
    Eventual = 1,
    /// Written and synced before the publisher's reply.
    Immediate = 2,
}

impl Durability {
    pub fn from_number(n: u64) -> Option<Durability> {
        match n {
            0 => Some(Durability::None),
            1 => Some(Durability::Eventual),
            2 => Some(Durability::Immediate),
            _ => None,
        }
    }
}

/// The manual's message `type`.
/// Why a message is in the dead letter queue (`getdlqmsg`'s `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeadReason {
    /// A subscriber's nack, or an administrator's `movetodlq` (a restart cannot tell them
    /// apart: both are the same log mark).
    #[default]
    Rejected = 0,
    /// Its last allowed delivery failed (`max-receive-count`): its holder's session ended, or
    /// its visibility timeout passed, without an ack.
    MaxReceives = 1,
}

impl DeadReason {
    pub fn from_byte(byte: u8) -> Option<DeadReason> {
        match byte {
            0 => Some(DeadReason::Rejected),
            1 => Some(DeadReason::MaxReceives),
            _ => None,
        }
    }

    /// What `getdlqmsg` says.
    pub fn name(self) -> &'static str {
        match self {
            DeadReason::Rejected => "rejected",
            DeadReason::MaxReceives => "max-receive-count",
        }
    }
}

/// Why and since when a message is in the dead letter queue (`getdlqmsg`'s `dlqreason` and
/// `dlqdat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dead {
    pub reason: DeadReason,
    /// When it went there (ms since 1970); 0 when unknown: a log written by a node before
    /// 2026-12-04 kept no time.
    pub at_ms: u64,
}

impl Dead {
    /// When it went there, in seconds since 1970 (`dlqdat`); None when unknown.
    pub fn at_secs(self) -> Option<u64> {
        Some(self.at_ms / 1000).filter(|&secs| secs != 0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BodyType {
    #[default]
    Text = 1,
    /// The body is base64.
    Binary = 2,
}

/// A publish that passed validation, before the queue gives it an id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NewMessage<'a> {
    pub body_type: BodyType,
    /// The body as the subscriber receives it (base64 for binary); borrowed from the
    /// publish's frame when it can be, since the delivery frame is written from it at once.
    pub body: Cow<'a, str>,
    pub publisher_key: Option<Cow<'a, str>>,
    pub delay_secs: u64,
    pub durability: Durability,
    /// Seconds after its publish when the message is deleted if it is still in the queue; 0:
    /// only the queue's `message-retention-secs` applies.
    pub expires_secs: u64,
    /// SQS message attributes (the SQS face's SendMessage), a JSON object kept in the frame
    /// as `"attributes"` after the body, so a WebSocket subscriber receives them too.
    pub attributes: Option<Cow<'a, str>>,
    /// Its deduplication id (`dedupid`, SQS's `MessageDeduplicationId`): a publish with one
    /// seen within the window makes no message ([`crate::engine::dedup`]).
    pub dedup_id: Option<Cow<'a, str>>,
    /// Who sends it: the SQS access key's id, or the publisher login's name.
    pub sender: Option<Cow<'a, str>>,
    /// Its message group (`group`, SQS's `MessageGroupId`): messages of one group are
    /// delivered in order, one at a time ([`crate::engine::groups`]). In the frame, so a
    /// subscriber sees it and a restart reads it back.
    pub group: Option<Cow<'a, str>>,
}

/// A message the queue holds: waiting, held, delayed or dead-lettered.
#[derive(Debug, Clone)]
pub struct Message {
    // No id: it is the key of every map that holds a message, and 16 bytes a stored message.
    pub durability: Durability,
    pub body_type: BodyType,
    /// The delay the publisher asked for (shown to administrators); at most two days.
    pub delay_secs: u32,
    /// When the queue received it, in seconds since 1970 (u32 lasts until 2106; these two
    /// narrow fields keep a stored message small).
    pub recdat: u32,
    /// The exact frame a subscriber receives, built once at publish and shared by every
    /// delivery (see [`Message::frame_for_delivery`]); its length is the manual's `len`. An
    /// `Arc<[u8]>` is half the size of a `Bytes` handle, which counts per stored message.
    pub frame: Arc<[u8]>,
    /// Who sent it (SQS's `SenderId`), as the queue's table of senders numbers them (0: not
    /// known). In memory only: a restart forgets it. (Two bytes in what was padding.)
    pub sender: u16,
    /// Its group's key ([`crate::engine::groups::key_of`]); 0: none. (Four bytes in what
    /// was padding.)
    pub group: u32,
}

#[derive(Serialize)]
struct CopyFrame<'a> {
    #[serde(rename = "type")]
    body_type: u8,
    body: &'a str,
    recdat: u64,
}

impl Message {
    /// The frame as a delivery carries it: the same bytes, not a copy.
    pub fn frame_for_delivery(&self) -> Bytes {
        Bytes::from_owner(self.frame.clone())
    }

    /// The message with its delivery frame,
    /// `{"id":..,["publisherkey":..,]["group":..,]"type":..,"body":..,"recdat":..}`, written straight into
    /// an allocation of its length.
    pub fn new(id: MessageId, new: &NewMessage<'_>, recdat: u64) -> Message {
        let write = |out: &mut Vec<u8>| {
            out.extend_from_slice(br#"{"id":"#);
            json::push_id(out, id);
            if let Some(key) = &new.publisher_key {
                out.extend_from_slice(br#","publisherkey":"#);
                json::push_str(out, key);
            }
            if let Some(group) = &new.group {
                out.extend_from_slice(br#","group":"#);
                json::push_str(out, group);
            }
            let body_type: &[u8] = match new.body_type {
                BodyType::Text => br#","type":1,"body":"#,
                BodyType::Binary => br#","type":2,"body":"#,
            };
            out.extend_from_slice(body_type);
            json::push_str(out, &new.body);
            if let Some(attributes) = &new.attributes {
                out.extend_from_slice(br#","attributes":"#);
                out.extend_from_slice(attributes.as_bytes());
            }
            out.extend_from_slice(br#","recdat":"#);
            json::push_integer(out, recdat);
            out.push(b'}');
        };
        Message {
            durability: new.durability,
            body_type: new.body_type,
            delay_secs: new.delay_secs as u32,
            recdat: recdat as u32,
            frame: json::written(write, |frame: &[u8]| Arc::from(frame)),
            sender: 0,
            group: 0,
        }
    }
}

/// The biggest damaged file shown whole in a dead-letter entry; a bigger one is left out.
pub const DAMAGED_FILE_MAX_BYTES: usize = 48 << 10;

#[derive(Serialize)]
struct DamagedFrame {
    id: String,
    damaged: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

impl Message {
    /// A dead-letter entry for bytes of the store that failed their checksum:
    /// `{"id":..,"damaged":true,"file":base64}`.
    pub fn damaged(id: MessageId, file: &[u8], recdat: u64) -> Message {
        use base64::Engine;
        let file = (file.len() <= DAMAGED_FILE_MAX_BYTES)
            .then(|| base64::engine::general_purpose::STANDARD.encode(file));
        let frame = serde_json::to_vec(&DamagedFrame {
            id: id.to_string(),
            damaged: true,
            file,
        })
        .expect("a frame of strings serializes");
        Message {
            // Synced before the damaged bytes are padded over, so it is never lost between.
            durability: Durability::Immediate,
            body_type: BodyType::Text,
            delay_secs: 0,
            recdat: recdat as u32,
            frame: frame.into(),
            sender: 0,
            group: 0,
        }
    }
}

impl Message {
    /// Whether this is a dead-letter entry for damaged bytes of the store (see
    /// [`Message::damaged`]), not a message: its frame is `{"id":"..","damaged":true,..}`,
    /// where a message's frame has `"type"` or `"publisherkey"` after the id.
    pub fn is_damaged(&self) -> bool {
        const AFTER_ID: usize = r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f""#.len();
        self.frame
            .get(AFTER_ID..)
            .is_some_and(|rest| rest.starts_with(br#","damaged":true"#))
    }
}

/// The body type written in one of our own frames. A publisher key, which comes before the
/// type, cannot hold a quote, so the first `"type":` is the type's.
pub fn frame_body_type(frame: &[u8]) -> BodyType {
    const KEY: &[u8] = b"\"type\":";
    match frame.windows(KEY.len()).position(|w| w == KEY) {
        Some(at) if frame.get(at + KEY.len()) == Some(&b'2') => BodyType::Binary,
        _ => BodyType::Text,
    }
}

/// The group written in one of our own frames, if any: after the id and publisher key and
/// before the type, none of which can hold a quote, so the first `"group":"` before the
/// first `"type":` is the group's.
pub fn frame_group(frame: &[u8]) -> Option<&str> {
    const TYPE: &[u8] = b"\"type\":";
    const GROUP: &[u8] = b",\"group\":\"";
    let head = &frame[..frame.windows(TYPE.len()).position(|w| w == TYPE)?];
    let at = head.windows(GROUP.len()).position(|w| w == GROUP)? + GROUP.len();
    let len = head[at..].iter().position(|&b| b == b'"')?;
    std::str::from_utf8(&head[at..at + len]).ok()
}

/// A notice to a subscriber that an administrator took a message it holds: `kind` is
/// `deleted` or `movedtodlq`.
pub fn notice_frame(kind: &str, id: MessageId) -> Bytes {
    format!(r#"{{"{kind}":true,"id":"{id}"}}"#).into()
}

/// The frame a copy-queue subscriber receives: no id, because there is nothing to ack.
pub fn copy_frame(body_type: BodyType, body: &str, recdat: u64) -> Bytes {
    serde_json::to_vec(&CopyFrame {
        body_type: body_type as u8,
        body,
        recdat,
    })
    .expect("a frame of strings and numbers serializes")
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manuals_hello_frame_is_89_bytes() {
        let id = MessageId::parse("01a1c09f-62da-7000-a30b-0817c9a42e3f").unwrap();
        let new = NewMessage {
            body: "hello".into(),
            ..NewMessage::default()
        };
        let message = Message::new(id, &new, 1_794_233_033);
        assert_eq!(
            std::str::from_utf8(&message.frame).unwrap(),
            r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","type":1,"body":"hello","recdat":1794233033}"#
        );
        assert_eq!(message.frame.len(), 89);
    }

    #[test]
    fn publisher_key_comes_after_the_id() {
        let id = MessageId::parse("01a1c09f-62e2-7000-b616-7c246d151566").unwrap();
        let new = NewMessage {
            body: "Order 1234 is ready".into(),
            publisher_key: Some("order-1234".into()),
            ..NewMessage::default()
        };
        let frame = Message::new(id, &new, 1_794_233_033).frame;
        assert_eq!(
            std::str::from_utf8(&frame).unwrap(),
            r#"{"id":"01a1c09f-62e2-7000-b616-7c246d151566","publisherkey":"order-1234","type":1,"body":"Order 1234 is ready","recdat":1794233033}"#
        );
    }

    #[test]
    fn texts_that_need_escapes_are_delivered_as_they_were_sent() {
        let id = MessageId::parse("01a1c09f-62e2-7000-b616-7c246d151566").unwrap();
        let body = format!("{}\"quoted\"\\\n\u{1}ü ✓", "x".repeat(100));
        let new = NewMessage {
            body: body.as_str().into(),
            publisher_key: Some("a \"key\"".into()),
            group: Some("tab\tgroup".into()),
            attributes: Some(r#"{"a":{"DataType":"String"}}"#.into()),
            ..NewMessage::default()
        };
        let frame = Message::new(id, &new, 7).frame;
        let delivered: serde_json::Value = serde_json::from_slice(&frame).unwrap();
        let sent = serde_json::json!({
            "id": id.to_string(),
            "publisherkey": "a \"key\"",
            "group": "tab\tgroup",
            "type": 1,
            "body": body,
            "attributes": {"a": {"DataType": "String"}},
            "recdat": 7,
        });
        assert_eq!(delivered, sent);
    }
}

/// A message as the store reads it back at start, for the engine to restore.
#[derive(Debug, Clone)]
pub struct RecoveredMessage {
    pub id: MessageId,
    pub durability: Durability,
    pub dead: bool,
    pub delay_secs: u64,
    /// When a delayed message falls due (ms since 1970).
    pub due_ms: Option<u64>,
    pub recdat: u64,
    /// Deliveries so far (kept by the delivery rules; 0 in a record without them).
    pub receives: u32,
    /// When it expires (ms since 1970).
    pub expires_ms: Option<u64>,
    /// Why it is dead-lettered, when it is.
    pub dead_reason: DeadReason,
    /// When it was dead-lettered (ms since 1970); 0 when it is not, or unknown.
    pub dead_at_ms: u64,
    pub frame: Arc<[u8]>,
}
