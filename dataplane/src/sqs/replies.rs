//! The answers of the actions every message passes through (sends, receives, deletes),
//! in the JSON protocol's shapes, rendered straight from what the action holds: no
//! `serde_json::Value` is built for them, its maps and strings allocated only to be
//! rendered and dropped (a batch's answer was some 100 allocations). The other actions
//! answer with `json!` values; `actions::run` renders either.

use super::attributes::Attributes;
use super::SqsError;
use crate::engine::MessageId;
use serde::{Serialize, Serializer};
use std::borrow::Cow;

/// A message sent: SendMessage's answer, and a SendMessageBatch entry's (with its `Id`).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Sent<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    #[serde(serialize_with = "message_id")]
    pub message_id: MessageId,
    #[serde(rename = "MD5OfMessageBody")]
    pub md5_of_message_body: &'a str,
    #[serde(
        rename = "MD5OfMessageAttributes",
        skip_serializing_if = "Option::is_none"
    )]
    pub md5_of_message_attributes: Option<&'a str>,
    /// A FIFO queue's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<String>,
}

/// A batch's entry that succeeded with nothing more to say than its `Id` (a delete, a
/// visibility change).
#[derive(Serialize)]
pub struct Done<'a> {
    #[serde(rename = "Id")]
    pub id: &'a str,
}

/// A batch's entry that failed, in AWS's terms.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Failed<'a> {
    pub id: &'a str,
    pub sender_fault: bool,
    pub code: &'static str,
    pub message: String,
}

/// A batch's answer: what succeeded and what failed, each by entry id.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Batch<'a, Succeeded> {
    pub successful: Vec<Succeeded>,
    pub failed: Vec<Failed<'a>>,
}

impl<'a, Succeeded> Batch<'a, Succeeded> {
    pub fn with_room_for(entries: usize) -> Self {
        Batch {
            successful: Vec::with_capacity(entries),
            failed: Vec::new(),
        }
    }

    pub fn fail(&mut self, id: &'a str, error: &SqsError) {
        self.failed.push(Failed {
            id,
            sender_fault: !error.is_server_error(),
            code: error.code,
            message: error.message.clone(),
        });
    }
}

/// ReceiveMessage's answer: no `Messages` at all when none came (as AWS answers).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Receipts<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Received<'a>>,
}

/// A received message.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Received<'a> {
    #[serde(serialize_with = "message_id")]
    pub message_id: MessageId,
    pub receipt_handle: String,
    #[serde(rename = "MD5OfBody")]
    pub md5_of_body: String,
    /// The system attributes asked for, by name (values are text, as AWS gives them).
    #[serde(skip_serializing_if = "SystemAttributes::is_empty")]
    pub attributes: SystemAttributes,
    #[serde(
        rename = "MD5OfMessageAttributes",
        skip_serializing_if = "Option::is_none"
    )]
    pub md5_of_message_attributes: Option<String>,
    /// The message attributes asked for.
    #[serde(skip_serializing_if = "Attributes::is_empty")]
    pub message_attributes: Attributes,
    pub body: Cow<'a, str>,
}

/// A received message's system attributes, in the order they were added.
#[derive(Default)]
pub struct SystemAttributes(Vec<(&'static str, String)>);

impl SystemAttributes {
    pub fn add(&mut self, name: &'static str, value: String) {
        self.0.push((name, value));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for SystemAttributes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(name, value)| (name, value)))
    }
}

/// A message id as its text, without allocating it.
fn message_id<S: Serializer>(id: &MessageId, serializer: S) -> Result<S::Ok, S::Error> {
    let text = id.text();
    serializer.serialize_str(std::str::from_utf8(&text).expect("hex digits and hyphens"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The shapes the SDKs read, field for field (the integration tests read them through
    /// boto3, the Rust SDK and the query protocol).
    #[test]
    fn answers_render_in_the_json_protocols_shapes() {
        let id = MessageId::parse("01a1c09f-62da-7000-a30b-0817c9a42e3f").unwrap();
        let sent = Sent {
            id: Some("a"),
            message_id: id,
            md5_of_message_body: "md5",
            md5_of_message_attributes: None,
            sequence_number: None,
        };
        let mut batch = Batch::with_room_for(2);
        batch.successful.push(sent);
        batch.fail("b", &SqsError::not_stored("not stored"));
        assert_eq!(
            serde_json::to_value(&batch).unwrap(),
            json!({
                "Successful": [{"Id": "a", "MessageId": id.to_string(), "MD5OfMessageBody": "md5"}],
                "Failed": [{"Id": "b", "SenderFault": false, "Code": "InternalFailure", "Message": "not stored"}],
            })
        );
        let mut attributes = SystemAttributes::default();
        attributes.add("SenderId", "AKID".into());
        let received = Received {
            message_id: id,
            receipt_handle: "handle".into(),
            md5_of_body: "md5".into(),
            attributes,
            md5_of_message_attributes: None,
            message_attributes: Attributes::new(),
            body: "hello".into(),
        };
        let receipts = Receipts {
            messages: vec![received],
        };
        assert_eq!(
            serde_json::to_value(&receipts).unwrap(),
            json!({"Messages": [{
                "MessageId": id.to_string(),
                "ReceiptHandle": "handle",
                "MD5OfBody": "md5",
                "Attributes": {"SenderId": "AKID"},
                "Body": "hello",
            }]})
        );
        let none = Receipts { messages: vec![] };
        assert_eq!(serde_json::to_value(&none).unwrap(), json!({}));
    }
}
