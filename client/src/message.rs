//! Messages: the builder a publisher sends, and the bodies a subscriber gets.

use crate::error::{Error, Result};
pub use crate::id::MessageId;
use base64::Engine;
use qe_shared::protocol::{is_valid_publisher_key, MAX_DELAY_SECS};
use qe_shared::Code;
use serde::Serialize;
use std::time::Duration;

/// How safe a message is if the machine fails (the manual's Durability).
///
/// ```
/// use qe_client::{Durability, Message};
/// assert_eq!(Durability::default(), Durability::Eventual);
/// assert_eq!(Durability::Immediate.number(), 2);
/// let synced = Message::text("payment 77").durability(Durability::Immediate);
/// # let _ = synced;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Durability {
    /// `0`: kept in memory only; lost if the queue restarts; cannot go to the dead letter
    /// queue.
    None,
    /// `1`, the default: written to the disk; a machine failure just after can lose it.
    #[default]
    Eventual,
    /// `2`: written to the disk and synced before the reply.
    Immediate,
}

impl Durability {
    /// The number on the wire.
    pub const fn number(self) -> u8 {
        match self {
            Durability::None => 0,
            Durability::Eventual => 1,
            Durability::Immediate => 2,
        }
    }

    /// The durability with this number.
    pub fn from_number(number: u64) -> Option<Durability> {
        match number {
            0 => Some(Durability::None),
            1 => Some(Durability::Eventual),
            2 => Some(Durability::Immediate),
            _ => None,
        }
    }
}

/// A message's content: text (`"type":1`) or bytes (`"type":2`, base64 on the wire; this
/// library encodes and decodes it).
///
/// ```
/// use qe_client::Body;
/// let text = Body::Text(r#"{"order":1234}"#.into());
/// assert_eq!(text.as_text(), Some(r#"{"order":1234}"#));
/// let order: serde_json::Value = text.json()?;
/// assert_eq!(order["order"], 1234);
/// let bytes = Body::Binary(vec![0, 159]);
/// assert!(bytes.is_binary() && bytes.as_text().is_none());
/// assert_eq!(bytes.as_bytes(), &[0, 159]);
/// # Ok::<(), qe_client::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Body {
    /// A text message.
    Text(String),
    /// A binary message, decoded.
    Binary(Vec<u8>),
}

impl Body {
    /// The text, if it is a text message.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Body::Text(text) => Some(text),
            Body::Binary(_) => None,
        }
    }

    /// The bytes: a binary message's, or a text message's UTF-8.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Body::Text(text) => text.as_bytes(),
            Body::Binary(bytes) => bytes,
        }
    }

    /// Whether it is binary (`"type":2`).
    pub fn is_binary(&self) -> bool {
        matches!(self, Body::Binary(_))
    }

    /// The body read as JSON (a publisher's [`Message::json`]), from text or bytes.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        Ok(serde_json::from_slice(self.as_bytes())?)
    }

    /// The body as the queue sends it: `(type, body)`.
    pub(crate) fn from_wire(message_type: u64, body: &str) -> Result<Body> {
        match message_type {
            1 => Ok(Body::Text(body.to_string())),
            2 => base64::engine::general_purpose::STANDARD
                .decode(body)
                .map(Body::Binary)
                .map_err(|e| Error::protocol(format!("a binary body that is not base64: {e}"))),
            other => Err(Error::protocol(format!("message type {other}"))),
        }
    }
}

/// What a publisher sends: a body and the options of the manual's publish.
///
/// Built in one expression and checked against the manual's ranges before it is sent, so
/// a mistake is an [`Error::Invalid`] with the code the queue would have given, and the
/// connection is not used.
///
/// ```
/// use qe_client::{Durability, Message};
///
/// let message = Message::text("Order 1234 is ready")
///     .delay_secs(60)
///     .durability(Durability::Immediate)
///     .publisher_key("order-1234");
/// assert!(message.validate().is_ok());
///
/// let bytes = Message::binary(vec![0, 159, 146, 150]);
/// let json = Message::json(&serde_json::json!({"order": 1234})).unwrap();
/// assert_eq!(json.body(), Some(&qe_client::Body::Text(r#"{"order":1234}"#.into())));
///
/// let too_late = Message::text("x").delay_secs(172_801);
/// assert_eq!(too_late.validate().unwrap_err().code(), Some(qe_client::Code::InvalidDelay));
/// # let _ = bytes;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    body: Payload,
    delay_secs: Option<u64>,
    durability: Option<Durability>,
    publisher_key: Option<String>,
    /// Send as given, without the client's checks (to see the queue's own answer).
    unchecked: bool,
}

/// A body as it will be sent.
#[derive(Debug, Clone, PartialEq)]
enum Payload {
    Body(Body),
    /// Already base64, sent as is with type 2.
    Base64(String),
}

impl Message {
    /// A text message (`"type":1`).
    pub fn text(body: impl Into<String>) -> Message {
        Message::of(Payload::Body(Body::Text(body.into())))
    }

    /// A binary message (`"type":2`): the bytes are sent as base64, and a subscriber of this
    /// library gets them back as [`Body::Binary`].
    pub fn binary(bytes: impl Into<Vec<u8>>) -> Message {
        Message::of(Payload::Body(Body::Binary(bytes.into())))
    }

    /// A binary message whose bytes are already base64 (standard alphabet, padded): sent as
    /// is. Text that is not base64 is refused with 202.
    pub fn base64(encoded: impl Into<String>) -> Message {
        Message::of(Payload::Base64(encoded.into()))
    }

    /// A value written as JSON into a text body (the manual: "to send JSON as the message,
    /// put it in the string"). A subscriber reads it back with [`Body::json`].
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Message> {
        Ok(Message::text(serde_json::to_string(value)?))
    }

    /// A message with this body.
    pub fn new(body: Body) -> Message {
        Message::of(Payload::Body(body))
    }

    fn of(body: Payload) -> Message {
        Message {
            body,
            delay_secs: None,
            durability: None,
            publisher_key: None,
            unchecked: false,
        }
    }

    /// Seconds to wait before delivery, 0 to 172800 (two days). Distribute queues only.
    pub fn delay_secs(mut self, secs: u64) -> Message {
        self.delay_secs = Some(secs);
        self
    }

    /// [`Message::delay_secs`] from a duration; a part of a second counts as a whole one, so
    /// the message never arrives early.
    pub fn delay(self, delay: Duration) -> Message {
        let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        self.delay_secs(secs)
    }

    /// How safe the message is kept ([`Durability::Eventual`] unless given). Distribute queues
    /// only.
    pub fn durability(mut self, durability: Durability) -> Message {
        self.durability = Some(durability);
        self
    }

    /// A label of your own that the subscriber receives: 1 to 128 of ASCII letters, digits
    /// and `- _ . : / + =`. Distribute queues only.
    pub fn publisher_key(mut self, key: impl Into<String>) -> Message {
        self.publisher_key = Some(key.into());
        self
    }

    /// Sends the message as it is, without the client's checks: the queue answers any fault
    /// itself (with the same codes). For tests and for ranges newer than this library.
    pub fn unchecked(mut self) -> Message {
        self.unchecked = true;
        self
    }

    /// The body; `None` for a [`Message::base64`] one, which is kept as given.
    pub fn body(&self) -> Option<&Body> {
        match &self.body {
            Payload::Body(body) => Some(body),
            Payload::Base64(_) => None,
        }
    }

    /// Checks the message against the manual's ranges for a distribute queue, as
    /// [`Publisher::publish`](crate::Publisher::publish) does before sending.
    pub fn validate(&self) -> Result<()> {
        self.check(false)
    }

    /// The checks, for a distribute or a copy queue. An unchecked message passes.
    pub(crate) fn check(&self, copy: bool) -> Result<()> {
        if self.unchecked {
            return Ok(());
        }
        if let Payload::Base64(encoded) = &self.body {
            if base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .is_err()
            {
                return Err(Error::invalid(Code::BodyNotBase64));
            }
        }
        if let Some(delay) = self.delay_secs {
            if copy {
                return Err(Error::invalid(Code::DelayOnCopy));
            }
            if delay > MAX_DELAY_SECS {
                return Err(Error::invalid_because(
                    Code::InvalidDelay,
                    format!("Invalid delay: {delay} is over {MAX_DELAY_SECS} seconds."),
                ));
            }
        }
        if self.durability.is_some() && copy {
            return Err(Error::invalid(Code::DurabilityOnCopy));
        }
        if let Some(key) = &self.publisher_key {
            if copy {
                return Err(Error::invalid(Code::PublisherKeyOnCopy));
            }
            if !is_valid_publisher_key(key) {
                return Err(Error::invalid_because(
                    Code::InvalidPublisherKey,
                    "Invalid publisher key: 1 to 128 of ASCII letters, digits and - _ . : / + =.",
                ));
            }
        }
        Ok(())
    }

    /// The publish request's fields, in the order the manual writes them; `context` last.
    pub(crate) fn to_request(&self, context: u64) -> Result<String> {
        let (message_type, body) = match &self.body {
            Payload::Body(Body::Text(text)) => (None, std::borrow::Cow::Borrowed(text.as_str())),
            Payload::Body(Body::Binary(bytes)) => (
                Some(2),
                std::borrow::Cow::Owned(base64::engine::general_purpose::STANDARD.encode(bytes)),
            ),
            Payload::Base64(encoded) => (Some(2), std::borrow::Cow::Borrowed(encoded.as_str())),
        };
        let request = PublishRequest {
            body: &body,
            message_type,
            delay: self.delay_secs,
            durability: self.durability.map(Durability::number),
            publisherkey: self.publisher_key.as_deref(),
            context,
        };
        Ok(serde_json::to_string(&request)?)
    }

    /// The same fields as an admin's `addmsg`.
    pub(crate) fn to_addmsg(&self, context: u64) -> Result<String> {
        let text = self.to_request(context)?;
        // `{"body":..` → `{"cmd":"addmsg","body":..`: the one field in front.
        Ok(format!(r#"{{"cmd":"addmsg",{}"#, &text[1..]))
    }
}

#[derive(Serialize)]
struct PublishRequest<'a> {
    body: &'a str,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    message_type: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    durability: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    publisherkey: Option<&'a str>,
    context: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(message: &Message, copy: bool) -> Option<Code> {
        message.check(copy).err().and_then(|e| e.code())
    }

    #[test]
    fn the_manuals_ranges_are_checked_before_sending() {
        assert_eq!(code(&Message::text("x").delay_secs(0), false), None);
        assert_eq!(code(&Message::text("x").delay_secs(172_800), false), None);
        assert_eq!(
            code(&Message::text("x").delay_secs(172_801), false),
            Some(Code::InvalidDelay)
        );
        assert_eq!(
            code(&Message::text("x").publisher_key("order-1234"), false),
            None
        );
        assert_eq!(
            code(&Message::text("x").publisher_key("a:b/c+d=e_f.g"), false),
            None
        );
        for bad in ["", "has space", "é", &"k".repeat(129)] {
            assert_eq!(
                code(&Message::text("x").publisher_key(bad), false),
                Some(Code::InvalidPublisherKey),
                "{bad:?}"
            );
        }
        assert_eq!(
            code(&Message::text("x").publisher_key("k".repeat(128)), false),
            None
        );
        assert_eq!(code(&Message::base64("aGVsbG8="), false), None);
        assert_eq!(
            code(&Message::base64("%%%"), false),
            Some(Code::BodyNotBase64)
        );
    }

    #[test]
    fn a_copy_queue_refuses_the_distribute_only_options() {
        assert_eq!(code(&Message::text("x"), true), None);
        assert_eq!(code(&Message::binary(vec![1, 2]), true), None);
        assert_eq!(
            code(&Message::text("x").delay_secs(1), true),
            Some(Code::DelayOnCopy)
        );
        assert_eq!(
            code(&Message::text("x").durability(Durability::None), true),
            Some(Code::DurabilityOnCopy)
        );
        assert_eq!(
            code(&Message::text("x").publisher_key("k"), true),
            Some(Code::PublisherKeyOnCopy)
        );
    }

    #[test]
    fn unchecked_messages_pass_to_the_queue() {
        let message = Message::text("x").delay_secs(999_999).unchecked();
        assert_eq!(message.check(false), Ok(()));
        assert_eq!(message.check(true), Ok(()));
    }

    #[test]
    fn a_delay_rounds_up_to_whole_seconds() {
        let message = Message::text("x").delay(Duration::from_millis(1500));
        assert_eq!(message.delay_secs, Some(2));
        let message = Message::text("x").delay(Duration::from_secs(3));
        assert_eq!(message.delay_secs, Some(3));
    }

    #[test]
    fn requests_are_written_as_the_manual_shows_them() {
        let full = Message::text("Order 1234 is ready")
            .delay_secs(60)
            .durability(Durability::Immediate)
            .publisher_key("order-1234");
        assert_eq!(
            full.to_request(7).unwrap(),
            r#"{"body":"Order 1234 is ready","delay":60,"durability":2,"publisherkey":"order-1234","context":7}"#
        );
        assert_eq!(
            Message::binary(b"hello".to_vec()).to_request(1).unwrap(),
            r#"{"body":"aGVsbG8=","type":2,"context":1}"#
        );
        assert_eq!(
            Message::text("a \"quote\"").to_addmsg(3).unwrap(),
            r#"{"cmd":"addmsg","body":"a \"quote\"","context":3}"#
        );
        assert_eq!(
            Message::json(&serde_json::json!({"a": [1, 2]}))
                .unwrap()
                .to_request(0)
                .unwrap(),
            r#"{"body":"{\"a\":[1,2]}","context":0}"#
        );
    }

    #[test]
    fn bodies_decode_from_the_wire() {
        assert_eq!(
            Body::from_wire(2, "aGVsbG8=").unwrap(),
            Body::Binary(b"hello".to_vec())
        );
        assert_eq!(Body::from_wire(1, "hi").unwrap().as_text(), Some("hi"));
        assert!(Body::from_wire(2, "%%").is_err());
        let body = Body::Text(r#"{"n":1}"#.into());
        assert_eq!(body.json::<serde_json::Value>().unwrap()["n"], 1);
    }
}
