//! A publisher: every frame is a message to publish.

use super::flat::{self, set, Plain};
use super::reply::Context;
use super::request::{self, number_field, number_in, text_field, Field, Fields, Parsed, Text};
use super::{Data, Reply, Response};
use crate::engine::{now_ms, BodyType, Durability, NewMessage};
use crate::state::Node;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use qe_shared::protocol::{is_valid_publisher_key, QueueType, MAX_DELAY_SECS};
use qe_shared::Code;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::sync::Arc;

/// The fields of a publish; a login that has any of them publishes too.
const PUBLISH_FIELDS: [&str; 5] = ["body", "type", "delay", "durability", "publisherkey"];
// (`expires` and `dedupid`, beyond the manual, do not make a login publish: the manual's
// fields do.)

pub fn has_publish_fields(fields: &Fields) -> bool {
    PUBLISH_FIELDS.iter().any(|key| fields.contains_key(*key))
}

pub struct Publisher {
    node: Arc<Node>,
    queue_type: QueueType,
    /// The login that publishes: what its messages name as their sender (SQS's `SenderId`).
    sender: Option<Arc<str>>,
}

impl Publisher {
    pub fn new(node: Arc<Node>, queue_type: QueueType) -> Publisher {
        Publisher {
            node,
            queue_type,
            sender: None,
        }
    }

    /// Its messages name `username` as their sender.
    pub fn sent_by(self, username: &str) -> Publisher {
        Publisher {
            sender: Some(username.into()),
            ..self
        }
    }

    pub fn handle(&self, data: Data) -> Response {
        let text = match &data {
            // A binary frame is a binary message, sent on as base64.
            Data::Binary(payload) => {
                return self.publish(plain(BodyType::Binary, BASE64.encode(payload).into()));
            }
            Data::Text(text) => text.as_str(),
        };
        if let Some(response) = self.publish_typed(text) {
            return response;
        }
        match request::parse(text) {
            Parsed::Object(fields) => match request::context(&fields) {
                Ok(context) => self.publish_fields(fields).context(context),
                Err(code) => Response::reply(Reply::failure(code)),
            },
            // Text that only looks like a JSON object is a typing mistake, not a message.
            Parsed::NotJson if text.trim_start().starts_with('{') => {
                Response::reply(Reply::failure(Code::InvalidJson))
            }
            // Any other text, JSON or not, is itself the message.
            Parsed::NotJson | Parsed::OtherJson => self.publish(plain(BodyType::Text, text.into())),
        }
    }

    /// Publishes a JSON request read typed, if it can be (see `request`).
    fn publish_typed(&self, text: &str) -> Option<Response> {
        let (message, context) = read_typed(text, self.queue_type)?;
        let response = match message {
            Ok(message) => self.publish(message),
            Err(code) => Response::reply(Reply::failure(code)),
        };
        Some(response.context(context))
    }

    /// Publishes a JSON request's message (also used for a publish in the login).
    pub fn publish_fields(&self, fields: Fields) -> Response {
        match read_message(fields, self.queue_type) {
            Ok(message) => self.publish(message),
            Err(code) => Response::reply(Reply::failure(code)),
        }
    }

    fn publish<'a>(&'a self, mut message: NewMessage<'a>) -> Response {
        message.sender = self.sender.as_deref().map(Cow::Borrowed);
        match self.queue_type {
            QueueType::Copy => {
                let recdat = now_ms() / 1000;
                let subscribers = self
                    .node
                    .copy
                    .publish(message.body_type, &message.body, recdat);
                Response::reply(Reply::success().with("subscribers", subscribers))
            }
            QueueType::Distribute => Response::changed(self.node.queue.publish(&message)),
        }
    }
}

/// A message from a frame that is not a JSON request: no delay, key or durability of its own.
fn plain(body_type: BodyType, body: Cow<'_, str>) -> NewMessage<'_> {
    NewMessage {
        body_type,
        body,
        ..NewMessage::default()
    }
}

/// A publish's fields, as sent. Read typed, any other field sends the request to the general
/// reading: serde skips an unknown field's value without checking its escapes (a lone
/// surrogate), which the general reading refuses as not JSON.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct PublishFields<'a> {
    /// Read typed only (the general reading checks the context on its own).
    #[serde(borrow)]
    context: Field<&'a RawValue>,
    #[serde(borrow)]
    body: Field<Text<'a>>,
    #[serde(rename = "type")]
    body_type: Field<u64>,
    delay: Field<u64>,
    durability: Field<u64>,
    #[serde(borrow)]
    publisherkey: Field<Text<'a>>,
    /// Beyond the manual (README, "Delivery rules"): seconds after the publish when the
    /// message is deleted if it is still in the queue.
    expires: Field<u64>,
    /// Beyond the manual (README, "Exactly-once publish"): a publish again with the same id
    /// within five minutes makes no second message.
    #[serde(borrow)]
    dedupid: Field<Text<'a>>,
    /// Beyond the manual (README, "Message groups"): messages of one group are delivered in
    /// order, one at a time.
    #[serde(borrow)]
    group: Field<Text<'a>>,
}

/// The longest a message's own expiration may be: 14 days, as `message-retention-secs`.
const MAX_EXPIRES_SECS: u64 = 1_209_600;

/// A publish request read typed (see `request`), if it can be: its message or failure, and
/// the context to copy into the reply.
pub fn read_typed(
    text: &str,
    queue_type: QueueType,
) -> Option<(Result<NewMessage<'_>, Code>, Option<Context>)> {
    let (fields, context) = match read_flat(text) {
        Some(read) => read,
        None => {
            let fields: PublishFields = request::typed(text)?;
            let context = request::typed_context(&fields.context)?;
            (fields, context)
        }
    };
    Some((check(fields, queue_type), context))
}

/// A publish of the usual shape, read by hand (see `flat`), with its context.
fn read_flat(text: &str) -> Option<(PublishFields<'_>, Option<Context>)> {
    let mut fields = PublishFields::default();
    let mut context = None;
    flat::read(text, |key, value| match (key, value) {
        ("body", Plain::Text(body)) => set(&mut fields.body, Text(Cow::Borrowed(body))),
        ("type", Plain::Integer(n)) => set(&mut fields.body_type, n.parse().ok()?),
        ("delay", Plain::Integer(n)) => set(&mut fields.delay, n.parse().ok()?),
        ("durability", Plain::Integer(n)) => set(&mut fields.durability, n.parse().ok()?),
        ("publisherkey", Plain::Text(key)) => {
            set(&mut fields.publisherkey, Text(Cow::Borrowed(key)))
        }
        ("expires", Plain::Integer(n)) => set(&mut fields.expires, n.parse().ok()?),
        ("dedupid", Plain::Text(id)) => set(&mut fields.dedupid, Text(Cow::Borrowed(id))),
        ("group", Plain::Text(group)) => set(&mut fields.group, Text(Cow::Borrowed(group))),
        ("context", value) if context.is_none() => {
            context = Some(flat::context(value)?);
            Some(())
        }
        _ => None,
    })?;
    Some((fields, context))
}

/// Checks a JSON publish read the general way.
pub fn read_message(
    mut fields: Fields,
    queue_type: QueueType,
) -> Result<NewMessage<'static>, Code> {
    let fields = PublishFields {
        context: Field::Absent,
        body: text_field(&mut fields, "body"),
        body_type: number_field(&fields, "type"),
        delay: number_field(&fields, "delay"),
        durability: number_field(&fields, "durability"),
        expires: number_field(&fields, "expires"),
        publisherkey: text_field(&mut fields, "publisherkey"),
        dedupid: text_field(&mut fields, "dedupid"),
        group: text_field(&mut fields, "group"),
    };
    check(fields, queue_type)
}

/// Checks a publish's fields, lowest failure code first.
fn check(fields: PublishFields<'_>, queue_type: QueueType) -> Result<NewMessage<'_>, Code> {
    let body = match fields.body {
        Field::Absent => None,
        Field::Is(Text(body)) => Some(body),
        Field::Wrong => return Err(Code::InvalidBody),
    };
    let body_type = match number_in(fields.body_type, 1..=2, Code::InvalidType)? {
        Some(2) => BodyType::Binary,
        _ => BodyType::Text,
    };
    if body_type == BodyType::Binary && body.as_ref().is_some_and(|b| BASE64.decode(&**b).is_err())
    {
        return Err(Code::BodyNotBase64);
    }
    let delay = number_in(fields.delay, 0..=MAX_DELAY_SECS, Code::InvalidDelay)?;
    let durability = number_in(fields.durability, 0..=2, Code::InvalidDurability)?
        .map(|n| Durability::from_number(n).expect("0..=2 are durabilities"));
    let publisher_key = match fields.publisherkey {
        Field::Absent => None,
        Field::Is(Text(key)) if is_valid_publisher_key(&key) => Some(key),
        _ => return Err(Code::InvalidPublisherKey),
    };
    let dedup_id = match fields.dedupid {
        Field::Absent => None,
        Field::Is(Text(id)) if is_valid_publisher_key(&id) => Some(id),
        _ => return Err(Code::InvalidDeduplicationId),
    };
    let group = match fields.group {
        Field::Absent => None,
        Field::Is(Text(group)) if is_valid_publisher_key(&group) => Some(group),
        _ => return Err(Code::InvalidGroup),
    };
    let body = body.ok_or(Code::MissingBody)?;
    let expires = number_in(
        fields.expires,
        1..=MAX_EXPIRES_SECS,
        Code::InvalidExpiration,
    )?;
    if queue_type == QueueType::Copy {
        if delay.is_some() {
            return Err(Code::DelayOnCopy);
        }
        if durability.is_some() {
            return Err(Code::DurabilityOnCopy);
        }
        if publisher_key.is_some() {
            return Err(Code::PublisherKeyOnCopy);
        }
        if expires.is_some() {
            return Err(Code::ExpirationOnCopy);
        }
        if dedup_id.is_some() {
            return Err(Code::DeduplicationOnCopy);
        }
        if group.is_some() {
            return Err(Code::GroupOnCopy);
        }
    }
    Ok(NewMessage {
        body_type,
        body,
        publisher_key,
        delay_secs: delay.unwrap_or(0),
        durability: durability.unwrap_or_default(),
        expires_secs: expires.unwrap_or(0),
        attributes: None,
        dedup_id,
        sender: None,
        group,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn read(value: Value, queue_type: QueueType) -> Result<NewMessage<'static>, Code> {
        read_message(value.as_object().unwrap().clone(), queue_type)
    }

    fn code(value: Value) -> Code {
        read(value, QueueType::Distribute).unwrap_err()
    }

    #[test]
    fn the_usual_publishes_are_read_by_hand() {
        for text in [
            r#"{"body":"x","durability":1,"context":7}"#,
            r#"{"body": "x", "durability": 2, "context": "c-1"}"#,
            r#"{"body":"aGk=","type":2,"delay":60,"publisherkey":"k","expires":9}"#,
            r#"{"body":"x","dedupid":"d","group":"g"}"#,
        ] {
            assert!(read_flat(text).is_some(), "{text}");
        }
        let (fields, context) = read_flat(r#"{"body":"x","context":-3}"#).unwrap();
        assert_eq!(fields.body, Field::Is(Text("x".into())));
        assert_eq!(context, Some(Context::Integer(-3)));
        // Left to serde's typed reading: an escape, a repeat, a value of another type.
        for text in [
            r#"{"body":"a\"b"}"#,
            r#"{"body":"x","body":"y"}"#,
            r#"{"body":"x","context":1,"context":2}"#,
            r#"{"body":"x","durability":"1"}"#,
            r#"{"body":"x","durability":-0}"#,
        ] {
            assert!(read_flat(text).is_none(), "{text}");
        }
    }

    #[test]
    fn a_full_publish() {
        let message = read(
            json!({"body":"Order 1234 is ready","delay":60,"durability":2,"publisherkey":"order-1234"}),
            QueueType::Distribute,
        )
        .unwrap();
        assert_eq!(message.delay_secs, 60);
        assert_eq!(message.durability, Durability::Immediate);
        assert_eq!(message.publisher_key.as_deref(), Some("order-1234"));
        assert_eq!(message.body_type, BodyType::Text);
    }

    #[test]
    fn an_expiration_beyond_the_manual_is_checked_and_kept() {
        /// As a connection reads a publish: typed, or the general way when typed reading
        /// cannot (a field of the wrong JSON type).
        fn typed(text: &str, queue_type: QueueType) -> Result<u64, Code> {
            match read_typed(text, queue_type) {
                Some((message, _)) => message.map(|message| message.expires_secs),
                None => {
                    let value: Value = serde_json::from_str(text).unwrap();
                    read(value, queue_type).map(|message| message.expires_secs)
                }
            }
        }
        let distribute = QueueType::Distribute;
        assert_eq!(typed(r#"{"body":"x","expires":60}"#, distribute), Ok(60));
        assert_eq!(typed(r#"{"body":"x"}"#, distribute), Ok(0));
        let general = read(json!({"body": "x", "expires": 1_209_600}), distribute);
        assert_eq!(general.unwrap().expires_secs, 1_209_600);
        for bad in [
            json!(0),
            json!(1_209_601),
            json!(1.5),
            json!("60"),
            json!(-1),
        ] {
            let request = json!({"body": "x", "expires": bad});
            assert_eq!(code(request.clone()), Code::InvalidExpiration, "{request}");
            let text = request.to_string();
            assert_eq!(
                typed(&text, distribute),
                Err(Code::InvalidExpiration),
                "{text}"
            );
        }
        let copy = typed(r#"{"body":"x","expires":60}"#, QueueType::Copy);
        assert_eq!(copy, Err(Code::ExpirationOnCopy));
    }

    #[test]
    fn each_field_has_its_code() {
        assert_eq!(code(json!({"body": 5})), Code::InvalidBody);
        assert_eq!(code(json!({"body": null})), Code::InvalidBody);
        assert_eq!(code(json!({"body": "x", "type": 3})), Code::InvalidType);
        assert_eq!(code(json!({"body": "x", "type": "2"})), Code::InvalidType);
        assert_eq!(
            code(json!({"body": "not base64!", "type": 2})),
            Code::BodyNotBase64
        );
        assert_eq!(
            code(json!({"body": "x", "delay": 172_801})),
            Code::InvalidDelay
        );
        assert_eq!(code(json!({"body": "x", "delay": -1})), Code::InvalidDelay);
        assert_eq!(code(json!({"body": "x", "delay": 1.5})), Code::InvalidDelay);
        assert_eq!(
            code(json!({"body": "x", "durability": 3})),
            Code::InvalidDurability
        );
        assert_eq!(
            code(json!({"body": "x", "durability": 1.0})),
            Code::InvalidDurability
        );
        assert_eq!(
            code(json!({"body": "x", "publisherkey": ""})),
            Code::InvalidPublisherKey
        );
        assert_eq!(
            code(json!({"body": "x", "publisherkey": "a b"})),
            Code::InvalidPublisherKey
        );
        assert_eq!(code(json!({"delay": 5})), Code::MissingBody);
        assert!(read(
            json!({"body": "x", "delay": 172_800}),
            QueueType::Distribute
        )
        .is_ok());
        assert!(read(json!({"body": "", "type": 2}), QueueType::Distribute).is_ok());
    }

    #[test]
    fn the_lowest_code_wins() {
        assert_eq!(
            code(json!({"delay": -1})),
            Code::InvalidDelay,
            "203 before 206"
        );
        assert_eq!(code(json!({"body": 1, "type": 9})), Code::InvalidBody);
        let copy = |v| read(v, QueueType::Copy).unwrap_err();
        assert_eq!(copy(json!({"body": "x", "delay": -1})), Code::InvalidDelay);
        assert_eq!(copy(json!({"body": "x", "delay": 0})), Code::DelayOnCopy);
        assert_eq!(
            copy(json!({"body": "x", "durability": 1})),
            Code::DurabilityOnCopy
        );
        assert_eq!(
            copy(json!({"body": "x", "publisherkey": "k"})),
            Code::PublisherKeyOnCopy
        );
        assert_eq!(
            copy(json!({"body": "x", "durability": 0, "publisherkey": "k"})),
            Code::DurabilityOnCopy
        );
        assert!(read(json!({"body": "aGk=", "type": 2}), QueueType::Copy).is_ok());
    }
}
