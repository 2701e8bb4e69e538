//! Amazon SQS's wire, as both planes serve it (docs/sqs.md): the node serves a queue's
//! messages, the control plane an account's queues (CreateQueue, ListQueues, ...). Both
//! check SigV4 signatures (`sigv4`), read the JSON protocol or the query protocol's forms
//! (`query`), and refuse in AWS's terms ([`SqsError`]).

pub mod query;
pub mod sigv4;

use crate::protocol::Role;
use crate::settings::Setting;
use serde_json::Value;

/// An SQS error in AWS's terms: its HTTP status, its JSON `__type`, and the legacy
/// (query-protocol) code the SDKs report, which goes in `x-amzn-query-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsError {
    /// Its HTTP status.
    pub status: u16,
    /// The shape's name after `#` in `__type`.
    pub shape: &'static str,
    /// The code boto3 and the other SDKs show (`Error.Code`).
    pub code: &'static str,
    pub message: String,
}

impl SqsError {
    fn new(status: u16, shape: &'static str, code: &'static str, message: String) -> Self {
        SqsError {
            status,
            shape,
            code,
            message,
        }
    }

    pub fn invalid_parameter(message: impl Into<String>) -> SqsError {
        let message = message.into();
        let (shape, code) = ("InvalidParameterValue", "InvalidParameterValue");
        SqsError::new(400, shape, code, message)
    }

    pub fn missing_parameter(name: &str) -> SqsError {
        let message = format!("The request must contain the parameter {name}.");
        let (shape, code) = ("MissingParameter", "MissingParameter");
        SqsError::new(400, shape, code, message)
    }

    pub fn queue_does_not_exist() -> SqsError {
        SqsError::new(
            400,
            "QueueDoesNotExist",
            "AWS.SimpleQueueService.NonExistentQueue",
            "The specified queue does not exist.".into(),
        )
    }

    pub fn receipt_handle_invalid(handle: &str) -> SqsError {
        let handle = shown(handle);
        SqsError::new(
            400,
            "ReceiptHandleIsInvalid",
            "ReceiptHandleIsInvalid",
            format!("The input receipt handle \"{handle}\" is not a valid receipt handle."),
        )
    }

    pub fn message_not_inflight() -> SqsError {
        SqsError::new(
            400,
            "MessageNotInflight",
            "AWS.SimpleQueueService.MessageNotInflight",
            "The message referred to isn't in flight.".into(),
        )
    }

    /// A batch's own faults: `shape` is also the name after `AWS.SimpleQueueService.`.
    pub fn batch(shape: &'static str, code: &'static str, message: &str) -> SqsError {
        SqsError::new(400, shape, code, message.into())
    }

    pub fn access_denied(action: &str, role: Role) -> SqsError {
        SqsError::new(
            403,
            "AccessDeniedException",
            "AccessDenied",
            format!("An access key of the {role:?} role may not call {action}."),
        )
    }

    pub fn signature(refused: sigv4::Refused) -> SqsError {
        let (shape, code) = match refused {
            sigv4::Refused::Missing => (
                "MissingAuthenticationTokenException",
                "MissingAuthenticationToken",
            ),
            sigv4::Refused::Incomplete(_) => {
                ("IncompleteSignatureException", "IncompleteSignature")
            }
            sigv4::Refused::UnknownKey => ("InvalidClientTokenId", "InvalidClientTokenId"),
            sigv4::Refused::Expired => ("RequestExpired", "RequestExpired"),
            sigv4::Refused::Mismatch => ("InvalidSignatureException", "SignatureDoesNotMatch"),
        };
        SqsError::new(403, shape, code, refused.to_string())
    }

    pub fn unavailable(message: &str) -> SqsError {
        SqsError::new(
            503,
            "ServiceUnavailable",
            "ServiceUnavailable",
            message.into(),
        )
    }

    pub fn over_limit(message: &str) -> SqsError {
        SqsError::new(403, "OverLimit", "OverLimit", message.into())
    }

    /// `CreateQueue` of a name the account has, with other attributes.
    pub fn queue_already_exists(name: &str) -> SqsError {
        SqsError::new(
            400,
            "QueueNameExists",
            "QueueAlreadyExists",
            format!(
                "A queue named {} already exists with different attributes.",
                shown(name)
            ),
        )
    }

    /// A message move task's source or handle that names nothing here.
    pub fn resource_not_found(message: &str) -> SqsError {
        SqsError::new(
            400,
            "ResourceNotFoundException",
            "ResourceNotFoundException",
            message.into(),
        )
    }

    pub fn purge_in_progress() -> SqsError {
        SqsError::new(
            403,
            "PurgeQueueInProgress",
            "AWS.SimpleQueueService.PurgeQueueInProgress",
            "Only one PurgeQueue operation on the queue is allowed every 60 seconds.".into(),
        )
    }

    pub fn unknown_operation(target: &str) -> SqsError {
        SqsError::new(
            400,
            "UnknownOperationException",
            "InvalidAction",
            format!(
                "The action {} is not valid for this endpoint.",
                shown(target)
            ),
        )
    }

    pub fn not_json() -> SqsError {
        SqsError::new(
            400,
            "SerializationException",
            "InvalidParameterValue",
            "The request body is not a JSON object.".into(),
        )
    }

    pub fn too_big() -> SqsError {
        SqsError::new(
            413,
            "RequestTooLarge",
            "AWS.SimpleQueueService.BatchRequestTooLong",
            "The request is too large.".into(),
        )
    }
}

/// What a client sent, as an error quotes it: at most 64 characters (a refusal is no echo
/// of a whole request).
fn shown(text: &str) -> String {
    text.chars().take(64).collect()
}

impl SqsError {
    /// Whether the fault is the server's (the query protocol's `Receiver`), not the caller's.
    pub fn is_server_error(&self) -> bool {
        self.status >= 500
    }

    /// The JSON protocol's error body: `{"__type":"com.amazonaws.sqs#SHAPE","message":..}`.
    pub fn json_body(&self) -> serde_json::Value {
        serde_json::json!({
            "__type": format!("com.amazonaws.sqs#{}", self.shape),
            "message": self.message,
        })
    }

    /// The `x-amzn-query-error` header's value: the legacy code the SDKs report.
    pub fn query_error_header(&self) -> String {
        format!("{};Sender", self.code)
    }
}

/// The characters SQS allows in a message's body and in its attributes' text (those XML 1.0
/// can carry): #x9, #xA, #xD, #x20–#xD7FF, #xE000–#xFFFD, #x10000–#x10FFFF.
pub fn allowed_in_text(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{a}' | '\u{d}' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}')
        || c >= '\u{10000}'
}

/// A new request's id: in its reply's header (`x-amzn-RequestId`, both protocols) and, on
/// the query protocol, in its body, as SQS gives them; SDKs log it and keep it with errors.
pub fn request_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// The node settings that SQS queue attributes (SetQueueAttributes, CreateQueue) set, all
/// checked before any is taken: `VisibilityTimeout`, `MaximumMessageSize`,
/// `MessageRetentionPeriod`, `RedrivePolicy`'s `maxReceiveCount`, `DelaySeconds` and
/// `ReceiveMessageWaitTimeSeconds`, `ContentBasedDeduplication`, and, when the queue is
/// being made (`creating`), `FifoQueue`.
/// Anything else is `InvalidAttributeName`; a value out of range, `InvalidAttributeValue`.
pub fn settings_of(
    given: &serde_json::Map<String, Value>,
    creating: bool,
) -> Result<Vec<(Setting, u64)>, SqsError> {
    let invalid_value = |name: &str| {
        SqsError::batch(
            "InvalidAttributeValue",
            "InvalidAttributeValue",
            &format!("Invalid value for the parameter {}.", shown(name)),
        )
    };
    let mut changes = Vec::new();
    for (name, value) in given {
        let text = value.as_str().ok_or_else(|| invalid_value(name))?;
        let (setting, number) = match name.as_str() {
            "VisibilityTimeout" => (Setting::VisibilityTimeoutSecs, text.parse().ok()),
            "MaximumMessageSize" => (Setting::MaxWsMsgLen, text.parse().ok()),
            "MessageRetentionPeriod" => (Setting::MessageRetentionSecs, text.parse().ok()),
            "RedrivePolicy" => {
                let policy: Value = serde_json::from_str(text).map_err(|_| invalid_value(name))?;
                let count = match &policy["maxReceiveCount"] {
                    Value::Number(n) => n.as_u64(),
                    Value::String(s) => s.parse().ok(),
                    _ => None,
                };
                (Setting::MaxReceiveCount, count)
            }
            "DelaySeconds" => (Setting::DelaySecs, text.parse().ok()),
            "ReceiveMessageWaitTimeSeconds" => (Setting::ReceiveWaitSecs, text.parse().ok()),
            "FifoQueue" if creating => (Setting::FifoQueue, boolean(text)),
            "ContentBasedDeduplication" => (Setting::ContentBasedDeduplication, boolean(text)),
            _ => {
                return Err(SqsError::batch(
                    "InvalidAttributeName",
                    "InvalidAttributeName",
                    &format!("Unknown Attribute {}.", shown(name)),
                ))
            }
        };
        match number.filter(|n| setting.accepts(*n)) {
            Some(number) => changes.push((setting, number)),
            None => return Err(invalid_value(name)),
        }
    }
    Ok(changes)
}

/// The queue a dead letter queue's ARN is of: `arn:aws:sqs:REGION:ACCOUNT:QUEUE-dlq` (the
/// queue's own dead letter queue, as its `RedrivePolicy` names it) gives `QUEUE`.
pub fn queue_of_dlq_arn(arn: &str) -> Option<&str> {
    let resource = arn.strip_prefix("arn:")?.rsplit(':').next()?;
    resource
        .strip_suffix("-dlq")
        .filter(|queue| !queue.is_empty())
}

/// A message move task's handle: its queue and its number there, opaque to clients.
pub fn move_task_handle(queue: &str, number: u64) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{queue}/{number}"))
}

/// The queue and number a message move task's handle names, if it reads as one.
pub fn read_move_task_handle(handle: &str) -> Option<(String, u64)> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(handle)
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (queue, number) = text.rsplit_once('/')?;
    Some((queue.to_string(), number.parse().ok()?))
}

/// SQS's booleans: `true` and `false`.
fn boolean(text: &str) -> Option<u64> {
    match text {
        "true" => Some(1),
        "false" => Some(0),
        _ => None,
    }
}

/// A message's `SequenceNumber` on a FIFO queue: its id as a number (ids grow with time,
/// and a repeat of a deduplicated send has the first's id, so the first's number).
pub fn sequence_number(id: u128) -> String {
    id.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_arn_names_its_queue_and_a_task_handle_reads_back() {
        let arn = "arn:aws:sqs:eu-west-1:000000000000:abc123-dlq";
        assert_eq!(queue_of_dlq_arn(arn), Some("abc123"));
        assert_eq!(
            queue_of_dlq_arn("arn:aws:sqs:eu-west-1:000000000000:abc123"),
            None
        );
        assert_eq!(queue_of_dlq_arn("abc123-dlq"), None);
        let handle = move_task_handle("abc123", 7);
        assert_eq!(read_move_task_handle(&handle), Some(("abc123".into(), 7)));
        assert_eq!(read_move_task_handle("not a handle"), None);
    }
}
