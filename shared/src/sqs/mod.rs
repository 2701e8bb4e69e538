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

    /// A change the node made but could not make as durable as it promises (a write or a
    /// sync of its log failed): AWS's `InternalFailure` (500), which the SDKs retry.
    pub fn not_stored(message: &str) -> SqsError {
        SqsError::new(500, "InternalFailure", "InternalFailure", message.into())
    }

    /// A request whose body did not arrive whole in time.
    pub fn incomplete_body() -> SqsError {
        SqsError::new(
            400,
            "IncompleteBody",
            "IncompleteBody",
            "The request body did not arrive within the time allowed.".into(),
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

    /// The `x-amzn-query-error` header's value: the legacy code the SDKs report, and whose
    /// fault it is (the node's for a 5xx, which the SDKs retry).
    pub fn query_error_header(&self) -> String {
        let fault = match self.is_server_error() {
            true => "Receiver",
            false => "Sender",
        };
        format!("{};{fault}", self.code)
    }
}

/// The characters SQS allows in a message's body and in its attributes' text (those XML 1.0
/// can carry): #x9, #xA, #xD, #x20–#xD7FF, #xE000–#xFFFD, #x10000–#x10FFFF.
pub fn allowed_in_text(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{a}' | '\u{d}' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}')
        || c >= '\u{10000}'
}

/// A new request's id: in its reply's header (`x-amzn-RequestId`, both protocols) and, on
/// the query protocol, in its body, as SQS gives them (a version 4 UUID); SDKs log it and
/// keep it with errors. Unique without a system call each (a new random UUID, or a v7 one,
/// asked the kernel for random bytes twice a request): random bits drawn once, with a count
/// of the process's requests laid over the last 62 of them.
pub fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static RANDOM: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let random = *RANDOM.get_or_init(|| u128::from_be_bytes(crate::random::bytes()));
    let count = COUNT.fetch_add(1, Ordering::Relaxed) & (u64::MAX >> 2);
    let bits = random ^ u128::from(count);
    uuid::Builder::from_random_bytes(bits.to_be_bytes())
        .into_uuid()
        .to_string()
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
            // Whom a queue takes dead letters from: the control plane keeps and checks it.
            "RedriveAllowPolicy" => {
                read_allow_policy(text).map_err(|_| invalid_value(name))?;
                continue;
            }
            "RedrivePolicy" => {
                let policy: Value = serde_json::from_str(text).map_err(|_| invalid_value(name))?;
                let target = &policy["deadLetterTargetArn"];
                if !target.is_null() && target.as_str().and_then(queue_of_arn).is_none() {
                    return Err(invalid_value(name));
                }
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

/// The queue an SQS ARN names: `arn:aws:sqs:REGION:ACCOUNT:QUEUE` gives `QUEUE` (a name or
/// an id; the region and account are not checked: every queue here is of the caller's).
pub fn queue_of_arn(arn: &str) -> Option<&str> {
    let parts: Vec<&str> = arn.split(':').collect();
    match parts[..] {
        ["arn", _, "sqs", _, _, queue] if !queue.is_empty() => Some(queue),
        _ => None,
    }
}

/// `RedrivePolicy`'s `deadLetterTargetArn`, if it reads and names one.
pub fn dead_letter_target_arn(redrive_policy: &str) -> Option<String> {
    let policy: Value = serde_json::from_str(redrive_policy).ok()?;
    let arn = policy["deadLetterTargetArn"].as_str()?;
    queue_of_arn(arn).map(|_| arn.to_string())
}

/// Which queues may send their dead letters to a queue (its `RedriveAllowPolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowPolicy {
    AllowAll,
    DenyAll,
    /// The queues (names or ids, as their ARNs end) named in `sourceQueueArns`.
    ByQueue(Vec<String>),
}

/// The most queues a `byQueue` policy names, as on AWS.
const MAX_ALLOWED_SOURCES: usize = 10;

/// A `RedriveAllowPolicy`, read as AWS reads it: `redrivePermission` `allowAll`, `denyAll`
/// or `byQueue`, the last with 1 to 10 `sourceQueueArns` (and only it with any).
pub fn read_allow_policy(text: &str) -> Result<AllowPolicy, String> {
    let policy: Value =
        serde_json::from_str(text).map_err(|_| "RedriveAllowPolicy is not JSON".to_string())?;
    let sources = &policy["sourceQueueArns"];
    let permission = policy["redrivePermission"].as_str();
    match (permission, sources) {
        (Some("allowAll"), Value::Null) => Ok(AllowPolicy::AllowAll),
        (Some("denyAll"), Value::Null) => Ok(AllowPolicy::DenyAll),
        (Some("byQueue"), Value::Array(arns))
            if (1..=MAX_ALLOWED_SOURCES).contains(&arns.len()) =>
        {
            let queues = arns.iter().map(|arn| arn.as_str().and_then(queue_of_arn));
            let queues: Option<Vec<String>> = queues.map(|q| q.map(str::to_string)).collect();
            queues
                .map(AllowPolicy::ByQueue)
                .ok_or_else(|| "a sourceQueueArns entry is not an SQS queue's ARN".to_string())
        }
        (Some("byQueue"), _) => Err("byQueue names 1 to 10 sourceQueueArns".to_string()),
        (Some("allowAll" | "denyAll"), _) => Err("sourceQueueArns is only for byQueue".to_string()),
        _ => Err("redrivePermission is allowAll, denyAll or byQueue".to_string()),
    }
}

impl AllowPolicy {
    /// Whether the queue known as `names` (its name and its id) may send its dead letters here.
    pub fn allows(&self, names: &[&str]) -> bool {
        match self {
            AllowPolicy::AllowAll => true,
            AllowPolicy::DenyAll => false,
            AllowPolicy::ByQueue(queues) => queues.iter().any(|q| names.contains(&q.as_str())),
        }
    }
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
    fn request_ids_are_distinct_version_4_uuids() {
        let ids: Vec<String> = (0..1000).map(|_| request_id()).collect();
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        for id in &ids {
            let uuid = uuid::Uuid::parse_str(id).expect("a UUID");
            assert_eq!(uuid.get_version_num(), 4, "{id}");
            assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{id}");
        }
    }

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

    #[test]
    fn an_allow_policy_reads_as_aws_reads_it_and_allows_whom_it_names() {
        let by_queue = r#"{"redrivePermission":"byQueue","sourceQueueArns":["arn:aws:sqs:eu-west-1:000000000000:orders"]}"#;
        let policy = read_allow_policy(by_queue).unwrap();
        assert!(policy.allows(&["orders", "q1"]));
        assert!(!policy.allows(&["payments", "q2"]));
        assert!(read_allow_policy(r#"{"redrivePermission":"denyAll"}"#)
            .unwrap()
            .allows(&[])
            .eq(&false));
        assert_eq!(
            read_allow_policy(r#"{"redrivePermission":"allowAll"}"#),
            Ok(AllowPolicy::AllowAll)
        );
        for refused in [
            "not json",
            r#"{"redrivePermission":"byQueue"}"#,
            r#"{"redrivePermission":"byQueue","sourceQueueArns":[]}"#,
            r#"{"redrivePermission":"byQueue","sourceQueueArns":["orders"]}"#,
            r#"{"redrivePermission":"allowAll","sourceQueueArns":["arn:aws:sqs:r:1:orders"]}"#,
            r#"{"redrivePermission":"some"}"#,
        ] {
            assert!(read_allow_policy(refused).is_err(), "{refused}");
        }
        let eleven: Vec<String> = (0..11).map(|i| format!("arn:aws:sqs:r:1:q{i}")).collect();
        let text = serde_json::json!({"redrivePermission": "byQueue", "sourceQueueArns": eleven});
        assert!(read_allow_policy(&text.to_string()).is_err());
    }

    #[test]
    fn a_redrive_policy_names_its_target_by_arn() {
        let policy = r#"{"deadLetterTargetArn":"arn:aws:sqs:eu-west-1:000000000000:dead","maxReceiveCount":"3"}"#;
        assert_eq!(
            dead_letter_target_arn(policy).as_deref(),
            Some("arn:aws:sqs:eu-west-1:000000000000:dead")
        );
        assert_eq!(dead_letter_target_arn(r#"{"maxReceiveCount":3}"#), None);
        assert_eq!(queue_of_arn("arn:aws:sqs:r:1:"), None);
        assert_eq!(queue_of_arn("arn:aws:sns:r:1:topic"), None);
        let mut given = serde_json::Map::new();
        given.insert(
            "RedrivePolicy".into(),
            r#"{"deadLetterTargetArn":"dead","maxReceiveCount":3}"#.into(),
        );
        assert!(
            settings_of(&given, false).is_err(),
            "an ARN that does not read"
        );
        given.insert("RedrivePolicy".into(), policy.into());
        given.insert(
            "RedriveAllowPolicy".into(),
            r#"{"redrivePermission":"denyAll"}"#.into(),
        );
        assert_eq!(
            settings_of(&given, false).unwrap(),
            [(Setting::MaxReceiveCount, 3)]
        );
    }
}
