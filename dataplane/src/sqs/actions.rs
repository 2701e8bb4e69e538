//! The SQS actions, each on the node's own queue: what it reads from the request, what it
//! does to the engine, what it answers. docs/sqs.md has the table of what matches AWS.

use super::attributes::{self, Attributes};
use super::replies::{Batch, Done, Receipts, Received, Sent, SystemAttributes};
use super::{Context, SqsError};
use crate::engine::{BodyType, Durability, MessageId, NewMessage, Pulled, Refused, Scope};
use crate::store::log::HoldGate;
use crate::store::Receipt;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use qe_shared::node_channel::RedriveChange;
use qe_shared::protocol::Role;
use qe_shared::settings::Setting;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::time::Duration;

/// The most entries a batch takes, and a receive returns.
const MAX_BATCH: usize = 10;
/// SQS's longest delay, wait and visibility timeout.
const MAX_DELAY_SECS: u64 = 900;
const MAX_WAIT_SECS: u64 = 20;
const MAX_VISIBILITY_SECS: u64 = 43_200;

/// The actions served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    SendMessage,
    SendMessageBatch,
    ReceiveMessage,
    DeleteMessage,
    DeleteMessageBatch,
    ChangeMessageVisibility,
    ChangeMessageVisibilityBatch,
    GetQueueUrl,
    GetQueueAttributes,
    SetQueueAttributes,
    PurgeQueue,
    ListQueues,
    StartMessageMoveTask,
    ListMessageMoveTasks,
    CancelMessageMoveTask,
}

impl Action {
    const ALL: [Action; 15] = [
        Action::SendMessage,
        Action::SendMessageBatch,
        Action::ReceiveMessage,
        Action::DeleteMessage,
        Action::DeleteMessageBatch,
        Action::ChangeMessageVisibility,
        Action::ChangeMessageVisibilityBatch,
        Action::GetQueueUrl,
        Action::GetQueueAttributes,
        Action::SetQueueAttributes,
        Action::PurgeQueue,
        Action::ListQueues,
        Action::StartMessageMoveTask,
        Action::ListMessageMoveTasks,
        Action::CancelMessageMoveTask,
    ];

    pub fn parse(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|action| action.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Action::SendMessage => "SendMessage",
            Action::SendMessageBatch => "SendMessageBatch",
            Action::ReceiveMessage => "ReceiveMessage",
            Action::DeleteMessage => "DeleteMessage",
            Action::DeleteMessageBatch => "DeleteMessageBatch",
            Action::ChangeMessageVisibility => "ChangeMessageVisibility",
            Action::ChangeMessageVisibilityBatch => "ChangeMessageVisibilityBatch",
            Action::GetQueueUrl => "GetQueueUrl",
            Action::GetQueueAttributes => "GetQueueAttributes",
            Action::SetQueueAttributes => "SetQueueAttributes",
            Action::PurgeQueue => "PurgeQueue",
            Action::ListQueues => "ListQueues",
            Action::StartMessageMoveTask => "StartMessageMoveTask",
            Action::ListMessageMoveTasks => "ListMessageMoveTasks",
            Action::CancelMessageMoveTask => "CancelMessageMoveTask",
        }
    }

    /// What each role's keys may do, as the WebSocket roles: a publisher sends, a subscriber
    /// receives and deletes, an administrator does everything. Finding and describing the
    /// queue is every role's.
    pub fn allowed_for(self, role: Role) -> bool {
        match self {
            Action::GetQueueUrl | Action::GetQueueAttributes | Action::ListQueues => true,
            Action::SendMessage | Action::SendMessageBatch => {
                matches!(role, Role::Publisher | Role::Admin)
            }
            Action::ReceiveMessage
            | Action::DeleteMessage
            | Action::DeleteMessageBatch
            | Action::ChangeMessageVisibility
            | Action::ChangeMessageVisibilityBatch => {
                matches!(role, Role::Subscriber | Role::Admin)
            }
            Action::SetQueueAttributes
            | Action::PurgeQueue
            | Action::StartMessageMoveTask
            | Action::ListMessageMoveTasks
            | Action::CancelMessageMoveTask => role == Role::Admin,
        }
    }
}

/// How long after a purge another is refused (`PurgeQueueInProgress`), as on AWS.
pub const PURGE_EVERY: Duration = Duration::from_secs(60);

/// Runs `action` on `input` (a JSON object): its answer, rendered as the JSON protocol's
/// body. The actions every message passes through answer in `replies`' shapes, the others
/// with `json!` values.
pub async fn run(
    action: Action,
    context: &Context<'_>,
    input: &Value,
) -> Result<Vec<u8>, SqsError> {
    match action {
        Action::GetQueueUrl => get_queue_url(context, input).map(rendered),
        Action::ListQueues => Ok(rendered(list_queues(context, input))),
        // Named by their dead letter queue's ARN or their handle, not by the queue's URL.
        Action::StartMessageMoveTask => {
            super::move_tasks::start(context, input).await.map(rendered)
        }
        Action::ListMessageMoveTasks => super::move_tasks::list(context, input).map(rendered),
        Action::CancelMessageMoveTask => super::move_tasks::cancel(context, input).map(rendered),
        _ => {
            check_queue_url(context, input)?;
            match action {
                Action::SendMessage => send_message(context, input).await,
                Action::SendMessageBatch => send_message_batch(context, input).await,
                Action::ReceiveMessage => receive_message(context, input).await,
                Action::DeleteMessage => delete_message(context, input).await.map(rendered),
                Action::DeleteMessageBatch => delete_message_batch(context, input).await,
                Action::ChangeMessageVisibility => {
                    change_visibility(context, input).await.map(rendered)
                }
                Action::ChangeMessageVisibilityBatch => {
                    change_visibility_batch(context, input).await
                }
                Action::GetQueueAttributes => get_queue_attributes(context, input).map(rendered),
                Action::SetQueueAttributes => {
                    set_queue_attributes(context, input).await.map(rendered)
                }
                Action::PurgeQueue => purge_queue(context).await.map(rendered),
                Action::GetQueueUrl
                | Action::ListQueues
                | Action::StartMessageMoveTask
                | Action::ListMessageMoveTasks
                | Action::CancelMessageMoveTask => unreachable!("answered above"),
            }
        }
    }
}

/// An answer as the JSON protocol's body.
fn rendered(answer: impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(&answer).expect("an answer serializes")
}

// ---- the queue ---------------------------------------------------------------------------

fn get_queue_url(context: &Context<'_>, input: &Value) -> Result<Value, SqsError> {
    let name =
        string(input, "QueueName")?.ok_or_else(|| SqsError::missing_parameter("QueueName"))?;
    if name != context.queue_name {
        return Err(SqsError::queue_does_not_exist());
    }
    Ok(json!({ "QueueUrl": context.queue_url() }))
}

fn list_queues(context: &Context<'_>, input: &Value) -> Value {
    let prefix = input["QueueNamePrefix"].as_str().unwrap_or("");
    let urls: Vec<String> = match context.queue_name.starts_with(prefix) {
        true => vec![context.queue_url()],
        false => vec![],
    };
    json!({ "QueueUrls": urls })
}

/// The request's `QueueUrl` names this queue: its last path segment is the queue's name
/// (the host may be any of the queue's names or addresses).
fn check_queue_url(context: &Context<'_>, input: &Value) -> Result<(), SqsError> {
    let url = string(input, "QueueUrl")?.ok_or_else(|| SqsError::missing_parameter("QueueUrl"))?;
    let path = url.split_once("://").map_or(url, |(_, rest)| rest);
    let name = path
        .split_once('/')
        .map(|(_, path)| path.trim_end_matches('/'));
    match name {
        Some(name) if name == context.queue_name => Ok(()),
        _ => Err(SqsError::queue_does_not_exist()),
    }
}

const ATTRIBUTE_NAMES: [&str; 15] = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "VisibilityTimeout",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "DelaySeconds",
    "ReceiveMessageWaitTimeSeconds",
    "RedrivePolicy",
    "RedriveAllowPolicy",
    "QueueArn",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    // A FIFO queue's only.
    "FifoQueue",
    "ContentBasedDeduplication",
];

fn get_queue_attributes(context: &Context<'_>, input: &Value) -> Result<Value, SqsError> {
    let asked = string_list(input, "AttributeNames")?;
    let all = asked.iter().any(|name| name == "All");
    for name in &asked {
        if name != "All" && !ATTRIBUTE_NAMES.contains(&name.as_str()) {
            return Err(SqsError::batch(
                "InvalidAttributeName",
                "InvalidAttributeName",
                &format!("Unknown Attribute {name}."),
            ));
        }
    }
    let node = context.node;
    let counts = node.queue.counts();
    let setting = |setting: Setting| node.setting(setting).to_string();
    let redrive = node.redrive_now();
    let mut attributes = Map::new();
    for name in ATTRIBUTE_NAMES {
        if !all && !asked.iter().any(|asked| asked == name) {
            continue;
        }
        let value = match name {
            "ApproximateNumberOfMessages" => counts.waiting.to_string(),
            "ApproximateNumberOfMessagesNotVisible" => counts.unacknowledged.to_string(),
            "ApproximateNumberOfMessagesDelayed" => counts.delayed.to_string(),
            "VisibilityTimeout" => setting(Setting::VisibilityTimeoutSecs),
            "MaximumMessageSize" => setting(Setting::MaxWsMsgLen),
            "MessageRetentionPeriod" => setting(Setting::MessageRetentionSecs),
            "DelaySeconds" => setting(Setting::DelaySecs),
            "ReceiveMessageWaitTimeSeconds" => setting(Setting::ReceiveWaitSecs),
            "RedrivePolicy" => {
                let count = node.setting(Setting::MaxReceiveCount);
                let target = redrive.target.as_ref().map(|target| target.arn.clone());
                if count == 0 && target.is_none() {
                    continue;
                }
                let own = || format!("{}-dlq", queue_arn(context));
                json!({
                    "deadLetterTargetArn": target.unwrap_or_else(own),
                    "maxReceiveCount": count,
                })
                .to_string()
            }
            "RedriveAllowPolicy" => match &redrive.allow_policy {
                Some(policy) => policy.clone(),
                None => continue,
            },
            "QueueArn" => queue_arn(context),
            "FifoQueue" | "ContentBasedDeduplication" if !is_fifo(context) => continue,
            "FifoQueue" => "true".to_string(),
            "ContentBasedDeduplication" => {
                let on = node.setting(Setting::ContentBasedDeduplication) == 1;
                on.to_string()
            }
            "CreatedTimestamp" => node.history.created().to_string(),
            "LastModifiedTimestamp" => node
                .meta
                .settings_changed_at()
                .unwrap_or(node.history.created())
                .to_string(),
            _ => unreachable!("every name is above"),
        };
        attributes.insert(name.to_string(), Value::String(value));
    }
    Ok(json!({ "Attributes": attributes }))
}

/// What `SetQueueAttributes`'s `given` attributes change in the queue's redrive: a
/// `RedrivePolicy` naming another queue's ARN sends the dead letters there, one naming the
/// queue's own dead letter queue (or none) brings them back; `RedriveAllowPolicy` is set as
/// given ("" removes it).
fn redrive_change(context: &Context<'_>, given: &Map<String, Value>) -> RedriveChange {
    let own_dead_letters = format!("{}-dlq", queue_arn(context));
    let now_elsewhere = context.node.redrive_now().target.is_some();
    let target = given
        .get("RedrivePolicy")
        .and_then(Value::as_str)
        .map(|policy| qe_shared::sqs::dead_letter_target_arn(policy).unwrap_or_default());
    let dead_letter_target_arn = match target {
        Some(arn) if arn.is_empty() || arn == own_dead_letters => now_elsewhere.then(String::new),
        other => other,
    };
    RedriveChange {
        dead_letter_target_arn,
        allow_policy: given
            .get("RedriveAllowPolicy")
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}

/// Has the control plane make `change`, and takes the redrive it answers at once (its next
/// config says the same), so that a `GetQueueAttributes` right after shows it.
async fn change_redrive(context: &Context<'_>, change: &RedriveChange) -> Result<(), SqsError> {
    let channel = context.channel.ok_or_else(|| {
        SqsError::invalid_parameter(
            "This node has no control plane: its dead letters stay in its own dead letter queue, and RedriveAllowPolicy is not kept.",
        )
    })?;
    let unreachable =
        |_| SqsError::unavailable("The control plane cannot be reached now. Try again.");
    match channel.change_redrive(change).await.map_err(unreachable)? {
        Ok(redrive) => {
            context.node.set_redrive(Some(redrive));
            Ok(())
        }
        Err(refused) => Err(match refused.code.as_str() {
            "InvalidAttributeValue" => SqsError::batch(
                "InvalidAttributeValue",
                "InvalidAttributeValue",
                &refused.message,
            ),
            "AWS.SimpleQueueService.NonExistentQueue" => SqsError::queue_does_not_exist(),
            _ => SqsError::invalid_parameter(refused.message),
        }),
    }
}

fn queue_arn(context: &Context<'_>) -> String {
    let region = &context.node.usage_labels.region;
    format!("arn:aws:sqs:{region}:000000000000:{}", context.queue_name)
}

/// The attributes that are our settings, all or nothing, as `setcfg`; where its dead letters
/// go and who may send it theirs, through the control plane (which keeps them), first.
async fn set_queue_attributes(context: &Context<'_>, input: &Value) -> Result<Value, SqsError> {
    let Some(given) = input["Attributes"].as_object() else {
        return Err(SqsError::missing_parameter("Attributes"));
    };
    let changes = qe_shared::sqs::settings_of(given, false)?;
    let redrive = redrive_change(context, given);
    if redrive != RedriveChange::default() {
        change_redrive(context, &redrive).await?;
    }
    match context.node.change_settings(&changes) {
        Err(crate::store::meta::SaveError::NotSaved) => {
            Err(SqsError::unavailable("The settings could not be saved."))
        }
        _ => Ok(json!({})),
    }
}

/// What a purge takes here, as on AWS: the queue's waiting and delayed messages, and those
/// in flight to SQS receivers; one a minute (another within [`PURGE_EVERY`] is refused). Not the dead letter queue, which SQS keeps as a queue of its
/// own, nor what WebSocket subscribers hold (their sessions hold it until they answer).
async fn purge_queue(context: &Context<'_>) -> Result<Value, SqsError> {
    {
        let mut last = context.last_purge.lock().expect("never poisoned");
        let now = std::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < PURGE_EVERY) {
            return Err(SqsError::purge_in_progress());
        }
        *last = Some(now);
    }
    let scopes = [Scope::Waiting, Scope::Delayed, Scope::Received];
    let (_, receipt) = context.node.queue.purge_each(&scopes);
    match receipt.wait().await {
        Ok(()) => Ok(json!({})),
        Err(_) => Err(SqsError::not_stored(
            "The purge could not be stored durably: messages may come back after a restart.",
        )),
    }
}

// ---- sending -----------------------------------------------------------------------------

/// A message to send, checked: its text borrowed from the request.
struct Outgoing<'a> {
    new: NewMessage<'a>,
    body_md5: String,
    attributes_md5: Option<String>,
    /// Sent to a FIFO queue: its reply has a `SequenceNumber`.
    fifo: bool,
}

/// Whether the queue is an SQS FIFO queue (the `fifo-queue` setting CreateQueue sets).
fn is_fifo(context: &Context<'_>) -> bool {
    context.node.setting(Setting::FifoQueue) == 1
}

fn outgoing<'a>(context: &Context<'a>, entry: &'a Value) -> Result<Outgoing<'a>, SqsError> {
    let body =
        string(entry, "MessageBody")?.ok_or_else(|| SqsError::missing_parameter("MessageBody"))?;
    if body.is_empty() {
        return Err(SqsError::invalid_parameter(
            "The request must contain a non-empty message body.",
        ));
    }
    if !body.chars().all(attributes::allowed_in_text) {
        return Err(SqsError::batch(
            "InvalidMessageContents",
            "InvalidMessageContents",
            "Invalid binary character in the message body: only #x9 | #xA | #xD | #x20 to \
             #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF are allowed.",
        ));
    }
    // Ours on a standard queue, as the WebSocket face's `group` (README, "Message
    // groups"): the group's messages are received in order, one at a time.
    let group = match string(entry, "MessageGroupId")? {
        None => None,
        Some(group) if qe_shared::protocol::is_valid_publisher_key(group) => Some(group),
        Some(_) => {
            return Err(SqsError::invalid_parameter(
                "MessageGroupId is 1 to 128 of A-Z a-z 0-9 and - _ . : / + =.",
            ))
        }
    };
    // Ours on a standard queue, where AWS takes it only on FIFO queues (README,
    // "Exactly-once publish"): a send again with the same id within five minutes makes no
    // second message.
    let dedup_id = match string(entry, "MessageDeduplicationId")? {
        None => None,
        Some(id) if qe_shared::protocol::is_valid_dedup_id(id) => Some(Cow::Borrowed(id)),
        Some(_) => {
            return Err(SqsError::invalid_parameter(
                "MessageDeduplicationId is 1 to 128 of A-Z a-z 0-9 and !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~.",
            ))
        }
    };
    // A FIFO queue's rules, as AWS's: a group always; a deduplication id, given or the
    // body's SHA-256 (ContentBasedDeduplication); no delay of a message's own.
    let fifo = is_fifo(context);
    if fifo && group.is_none() {
        return Err(SqsError::missing_parameter("MessageGroupId"));
    }
    if fifo && !entry["DelaySeconds"].is_null() {
        return Err(SqsError::invalid_parameter(
            "The request include parameter that is not valid for this queue type: DelaySeconds.",
        ));
    }
    let dedup_id = match (fifo, dedup_id) {
        (true, None) if context.node.setting(Setting::ContentBasedDeduplication) == 1 => {
            let digest = <sha2::Sha256 as sha2::Digest>::digest(body.as_bytes());
            Some(Cow::Owned(qe_shared::hex(&digest)))
        }
        (true, None) => {
            return Err(SqsError::invalid_parameter(
                "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly.",
            ))
        }
        (_, dedup_id) => dedup_id,
    };
    // A message without a delay of its own takes the queue's (`DelaySeconds`).
    let queue_delay = context.node.setting(Setting::DelaySecs);
    let delay = number(entry, "DelaySeconds", 0..=MAX_DELAY_SECS)?.unwrap_or(queue_delay);
    let attributes: Attributes = match &entry["MessageAttributes"] {
        Value::Null => Attributes::new(),
        given => serde_json::from_value(given.clone()).map_err(|_| {
            SqsError::invalid_parameter("The message attributes do not read as SQS's.")
        })?,
    };
    attributes::check(&attributes).map_err(SqsError::invalid_parameter)?;
    let size = body.len() + attributes_size(&attributes);
    let largest = context.node.setting(Setting::MaxWsMsgLen) as usize;
    if size > largest {
        return Err(SqsError::invalid_parameter(format!(
            "One or more parameters are invalid. Reason: Message must be shorter than \
             {largest} bytes."
        )));
    }
    let attributes_md5 = (!attributes.is_empty()).then(|| attributes::digest(&attributes));
    let attributes_json = (!attributes.is_empty())
        .then(|| serde_json::to_string(&attributes).expect("attributes serialize"));
    Ok(Outgoing {
        body_md5: attributes::body_digest(body),
        attributes_md5,
        fifo,
        new: NewMessage {
            body_type: BodyType::Text,
            body: Cow::Borrowed(body),
            publisher_key: None,
            delay_secs: delay,
            // SQS keeps what it accepted: the node's default, which a process kill does not
            // lose.
            durability: Durability::Eventual,
            expires_secs: 0,
            attributes: attributes_json.map(Cow::Owned),
            dedup_id,
            sender: Some(Cow::Borrowed(context.sender)),
            group: group.map(Cow::Borrowed),
        },
    })
}

/// What counts against the size limit as AWS counts it: names, types and values.
fn attributes_size(attributes: &Attributes) -> usize {
    attributes
        .iter()
        .map(|(name, attribute)| {
            let value = attribute.string_value.as_ref().map_or_else(
                || {
                    let binary = attribute.binary_value.as_deref().unwrap_or("");
                    base64::engine::general_purpose::STANDARD
                        .decode(binary)
                        .map_or(0, |bytes| bytes.len())
                },
                String::len,
            );
            name.len() + attribute.data_type.len() + value
        })
        .sum()
}

/// Publishes a checked message; its id, once it is stored as its durability promises.
async fn publish(context: &Context<'_>, outgoing: &Outgoing<'_>) -> Result<MessageId, SqsError> {
    let published = context.node.queue.publish(&outgoing.new);
    let (id, receipt) = published.map_err(publish_refused)?;
    stored(id, receipt).await
}

/// A published message's id, once its receipt says it is stored.
async fn stored(id: MessageId, receipt: Receipt) -> Result<MessageId, SqsError> {
    match receipt.wait().await {
        Ok(()) => Ok(id),
        // A send whose write or sync failed is not answered as stored, as the WebSocket face
        // answers 507: the message is in the queue now, but may not survive a restart (after
        // a failed sync the pages may never reach the disk). The SDK's retry may then make a
        // second copy, which at-least-once delivery allows; a false "stored" it does not.
        Err(error) => {
            tracing::warn!(%id, %error, "an SQS send could not be stored durably: answered as failed");
            Err(SqsError::not_stored(
                "The message could not be stored durably. Try again.",
            ))
        }
    }
}

fn publish_refused(refused: Refused) -> SqsError {
    match refused {
        Refused::QueueFull => SqsError::over_limit("The queue holds max-messages messages."),
        Refused::MemoryFull => SqsError::over_limit("The queue's messages use all its memory."),
        _ => SqsError::unavailable("The queue cannot take messages now."),
    }
}

/// What a send answers for `outgoing`, stored as message `id` (`entry`: its batch entry's id).
fn sent<'a>(entry: Option<&'a str>, id: MessageId, outgoing: &'a Outgoing<'_>) -> Sent<'a> {
    Sent {
        id: entry,
        message_id: id,
        md5_of_message_body: &outgoing.body_md5,
        md5_of_message_attributes: outgoing.attributes_md5.as_deref(),
        sequence_number: outgoing
            .fifo
            .then(|| qe_shared::sqs::sequence_number(id.0.as_u128())),
    }
}

async fn send_message(context: &Context<'_>, input: &Value) -> Result<Vec<u8>, SqsError> {
    let outgoing = outgoing(context, input)?;
    let id = publish(context, &outgoing).await?;
    Ok(rendered(sent(None, id, &outgoing)))
}

async fn send_message_batch(context: &Context<'_>, input: &Value) -> Result<Vec<u8>, SqsError> {
    let entries = batch_entries(input)?;
    let total: usize = entries
        .iter()
        .map(|entry| entry["MessageBody"].as_str().map_or(0, str::len))
        .sum();
    let largest = context.node.setting(Setting::MaxWsMsgLen) as usize;
    if total > largest {
        return Err(SqsError::batch(
            "BatchRequestTooLong",
            "AWS.SimpleQueueService.BatchRequestTooLong",
            &format!("Batch requests cannot be longer than {largest} bytes."),
        ));
    }
    // Every entry is published, in the batch's order, before any is waited for: their
    // records go to the disk in one write (and one sync), where waiting for each in turn
    // cost a write and a turn of the runtime an entry.
    let published: Vec<_> = entries
        .iter()
        .map(|entry| {
            let outgoing = outgoing(context, entry)?;
            let published = context.node.queue.publish(&outgoing.new);
            let (id, receipt) = published.map_err(publish_refused)?;
            Ok((outgoing, id, receipt))
        })
        .collect();
    let mut stored_ones = Vec::with_capacity(entries.len());
    for published in published {
        stored_ones.push(match published {
            Ok((outgoing, id, receipt)) => stored(id, receipt).await.map(|id| (outgoing, id)),
            Err(error) => Err(error),
        });
    }
    let mut results = Batch::with_room_for(entries.len());
    for (entry, stored_one) in entries.iter().zip(&stored_ones) {
        let entry = entry_id(entry);
        match stored_one {
            Ok((outgoing, id)) => results.successful.push(sent(Some(entry), *id, outgoing)),
            Err(error) => results.fail(entry, error),
        }
    }
    Ok(rendered(results))
}

// ---- receiving ---------------------------------------------------------------------------

async fn receive_message(context: &Context<'_>, input: &Value) -> Result<Vec<u8>, SqsError> {
    let max = number(input, "MaxNumberOfMessages", 1..=MAX_BATCH as u64)?.unwrap_or(1);
    // A receive that names no wait takes the queue's (`ReceiveMessageWaitTimeSeconds`).
    let queue_wait = context.node.setting(Setting::ReceiveWaitSecs);
    let wait = number(input, "WaitTimeSeconds", 0..=MAX_WAIT_SECS)?.unwrap_or(queue_wait);
    let default_visibility = context.node.setting(Setting::VisibilityTimeoutSecs);
    let visibility =
        number(input, "VisibilityTimeout", 0..=MAX_VISIBILITY_SECS)?.unwrap_or(default_visibility);
    let mut system = string_list(input, "AttributeNames")?;
    system.extend(string_list(input, "MessageSystemAttributeNames")?);
    let wanted = string_list(input, "MessageAttributeNames")?;
    let queue = &context.node.queue;
    let visibility = Duration::from_secs(visibility);
    let mut pulled = match wait {
        0 => queue.receive(max as usize, visibility),
        wait => {
            let wait = Duration::from_secs(wait);
            queue.receive_within(max as usize, visibility, wait).await
        }
    };
    // Answered once the standby, if any, has heard of every receive: a receipt handle names
    // a receive that a promoted copy keeps.
    let heard = pulled.iter_mut().filter_map(|p| p.heard.take());
    if let Some(gate) = heard.reduce(HoldGate::later) {
        gate.open().await;
    }
    let messages = pulled
        .iter()
        .map(|pulled| received(context, pulled, &system, &wanted))
        .collect();
    Ok(rendered(Receipts { messages }))
}

/// A message's body and SQS attributes as a receive gives them, from its frame (one that does
/// not read as a frame, as its text). The body is borrowed from the frame when it has no
/// escapes.
pub(super) fn sqs_body(frame: &[u8]) -> (Cow<'_, str>, Attributes) {
    #[derive(serde::Deserialize)]
    struct Frame<'a> {
        #[serde(borrow)]
        body: Cow<'a, str>,
        #[serde(default)]
        attributes: Attributes,
    }
    match serde_json::from_slice::<Frame>(frame) {
        Ok(frame) => (frame.body, frame.attributes),
        Err(_) => (String::from_utf8_lossy(frame), Attributes::new()),
    }
}

/// A received message as ReceiveMessage gives it, with the system attributes named in
/// `system` and the message attributes `wanted` names.
fn received<'a>(
    context: &Context<'_>,
    pulled: &'a Pulled,
    system: &[String],
    wanted: &[String],
) -> Received<'a> {
    let (receipt_key, fifo) = (context.receipt_key, is_fifo(context));
    let (body, attributes) = sqs_body(&pulled.message.frame);
    let wants = |name: &str| system.iter().any(|n| n == "All" || n == name);
    let mut shown = SystemAttributes::default();
    if wants("ApproximateReceiveCount") {
        shown.add("ApproximateReceiveCount", pulled.receives.to_string());
    }
    if wants("SentTimestamp") {
        let sent_ms = pulled
            .id
            .0
            .get_timestamp()
            .map(|t| {
                let (secs, nanos) = t.to_unix();
                secs * 1000 + u64::from(nanos) / 1_000_000
            })
            .unwrap_or(u64::from(pulled.message.recdat) * 1000);
        shown.add("SentTimestamp", sent_ms.to_string());
    }
    if wants("ApproximateFirstReceiveTimestamp") {
        let first = pulled.first_delivered_ms.to_string();
        shown.add("ApproximateFirstReceiveTimestamp", first);
    }
    if let (true, Some(sender)) = (wants("SenderId"), &pulled.sender) {
        shown.add("SenderId", sender.to_string());
    }
    let group = crate::message::frame_group(&pulled.message.frame);
    if let (true, Some(group)) = (wants("MessageGroupId"), group) {
        shown.add("MessageGroupId", group.to_string());
    }
    if fifo && wants("SequenceNumber") {
        let number = qe_shared::sqs::sequence_number(pulled.id.0.as_u128());
        shown.add("SequenceNumber", number);
    }
    let chosen: Attributes = attributes
        .into_iter()
        .filter(|(name, _)| wanted.iter().any(|w| attribute_matches(w, name)))
        .collect();
    Received {
        message_id: pulled.id,
        receipt_handle: receipt_handle(receipt_key, pulled.id, pulled.receipt),
        md5_of_body: attributes::body_digest(&body),
        attributes: shown,
        md5_of_message_attributes: (!chosen.is_empty()).then(|| attributes::digest(&chosen)),
        message_attributes: chosen,
        body,
    }
}

/// `All`, `.*`, a name, or a prefix ending in `.*`.
fn attribute_matches(wanted: &str, name: &str) -> bool {
    match wanted {
        "All" | ".*" => true,
        _ => match wanted.strip_suffix(".*") {
            Some(prefix) => name.starts_with(prefix) && name[prefix.len()..].starts_with('.'),
            None => wanted == name,
        },
    }
}

/// A receipt handle names the message and its receive's number (one from an earlier receive
/// of the same message no longer acts on it), signed with the node's receipt key: a handle
/// made up or changed is refused before anything is looked up.
fn receipt_handle(key: &ReceiptKey, id: MessageId, receipt: u64) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(96);
    write!(text, "qe2:{id}:{receipt}").expect("a String takes any text");
    let mac = key.sign(&text[4..]);
    text.push(':');
    qe_shared::push_hex(&mut text, &mac);
    URL_SAFE_NO_PAD.encode(text)
}

/// What a receipt handle names.
#[derive(Debug, PartialEq, Eq)]
enum Handle {
    /// A receive of this node's: the message and the receive's number.
    Signed(MessageId, u64),
    /// A handle of a build before signed handles (`qe1`), so of an earlier run: it acts on
    /// nothing, as any handle from before a restart.
    Earlier,
}

fn read_receipt_handle(key: &ReceiptKey, handle: &str) -> Option<Handle> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(handle).ok()?).ok()?;
    let parts: Vec<&str> = text.split(':').collect();
    match parts[..] {
        ["qe1", id, number] => {
            MessageId::parse(id)?;
            number.parse::<u64>().ok()?;
            Some(Handle::Earlier)
        }
        ["qe2", id, number, mac] => {
            // `ID:NUMBER`, as signed: the text between `qe2:` and `:MAC`.
            let named = &text[4..4 + id.len() + 1 + number.len()];
            let expected = qe_shared::hex(&key.sign(named));
            if !bool::from(subtle::ConstantTimeEq::ct_eq(
                expected.as_bytes(),
                mac.as_bytes(),
            )) {
                return None;
            }
            Some(Handle::Signed(MessageId::parse(id)?, number.parse().ok()?))
        }
        _ => None,
    }
}

/// The key receipt handles are signed with: made once per data directory and kept in it, so
/// a handle from before a restart reads (and acts on nothing: its receive's number is of the
/// earlier run).
pub struct ReceiptKey([u8; 32]);

impl ReceiptKey {
    /// The key kept in `data_dir` (`sqs-receipt-key`, 0600), made the first time.
    pub fn kept_in(data_dir: &std::path::Path) -> std::io::Result<ReceiptKey> {
        let path = data_dir.join(crate::store::data_dir::SQS_RECEIPT_KEY);
        match std::fs::read(&path) {
            Ok(bytes) if bytes.len() == 32 => Ok(ReceiptKey(bytes.try_into().expect("32 bytes"))),
            Ok(_) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is not 32 bytes", path.display()),
            )),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let key = qe_shared::random::bytes::<32>();
                qe_shared::files::write_private(&path, &key)?;
                Ok(ReceiptKey(key))
            }
            Err(error) => Err(error),
        }
    }

    /// The first 16 bytes of the HMAC-SHA256 of `text`.
    fn sign(&self, text: &str) -> [u8; 16] {
        let mac = qe_shared::hmac::hmac_sha256(&self.0, text.as_bytes());
        mac[..16].try_into().expect("16 of 32 bytes")
    }
}

fn handle_of(context: &Context<'_>, entry: &Value) -> Result<Handle, SqsError> {
    let handle = string(entry, "ReceiptHandle")?
        .ok_or_else(|| SqsError::missing_parameter("ReceiptHandle"))?;
    read_receipt_handle(context.receipt_key, handle)
        .ok_or_else(|| SqsError::receipt_handle_invalid(handle))
}

/// Deletes a received message: what its answer waits for. A handle of a message that is
/// gone, or that was received again since, succeeds without deleting (as AWS's standard
/// queues do), once every change recorded before it is written: the message may be gone
/// by a delete whose record the disk has not taken yet (that delete was answered as failed,
/// and a retry must not be told it is done while the message could come back).
fn delete_one(context: &Context<'_>, entry: &Value) -> Result<Receipt, SqsError> {
    let Handle::Signed(id, number) = handle_of(context, entry)? else {
        return Ok(Receipt::Done);
    };
    let deleting = context.node.queue.delete_received(id, number);
    Ok(deleting.unwrap_or_else(|_| context.node.queue.everything_recorded()))
}

/// Waits until a delete is stored.
async fn deleted(receipt: Receipt) -> Result<(), SqsError> {
    // Gone from the queue now, but a restart may bring it back: said, not hidden.
    receipt.wait().await.map_err(|_| {
        SqsError::not_stored("The delete could not be stored durably: the message may come again.")
    })
}

async fn delete_message(context: &Context<'_>, input: &Value) -> Result<Value, SqsError> {
    deleted(delete_one(context, input)?).await?;
    Ok(json!({}))
}

async fn delete_message_batch(context: &Context<'_>, input: &Value) -> Result<Vec<u8>, SqsError> {
    let entries = batch_entries(input)?;
    // Every delete is made before any is waited for: one write a batch, as for sends.
    let deletes: Vec<_> = entries
        .iter()
        .map(|entry| delete_one(context, entry))
        .collect();
    let mut results = Batch::with_room_for(entries.len());
    for (entry, delete) in entries.iter().zip(deletes) {
        let id = entry_id(entry);
        let done = match delete {
            Ok(receipt) => deleted(receipt).await,
            Err(error) => Err(error),
        };
        match done {
            Ok(()) => results.successful.push(Done { id }),
            Err(error) => results.fail(id, &error),
        }
    }
    Ok(rendered(results))
}

/// Changes one received message's visibility; what the answer waits for (the standby
/// hearing it, so a promoted copy keeps the new visibility).
fn change_one(context: &Context<'_>, entry: &Value) -> Result<Option<HoldGate>, SqsError> {
    let Handle::Signed(id, receipt) = handle_of(context, entry)? else {
        return Err(SqsError::message_not_inflight());
    };
    let timeout = number(entry, "VisibilityTimeout", 0..=MAX_VISIBILITY_SECS)?
        .ok_or_else(|| SqsError::missing_parameter("VisibilityTimeout"))?;
    context
        .node
        .queue
        .change_visibility(id, receipt, Duration::from_secs(timeout))
        .map_err(|_| SqsError::message_not_inflight())
}

async fn change_visibility(context: &Context<'_>, input: &Value) -> Result<Value, SqsError> {
    if let Some(gate) = change_one(context, input)? {
        gate.open().await;
    }
    Ok(json!({}))
}

async fn change_visibility_batch(
    context: &Context<'_>,
    input: &Value,
) -> Result<Vec<u8>, SqsError> {
    let entries = batch_entries(input)?;
    let mut results = Batch::with_room_for(entries.len());
    let mut heard: Option<HoldGate> = None;
    for entry in entries {
        let id = entry_id(entry);
        match change_one(context, entry) {
            Ok(gate) => {
                heard = match (heard, gate) {
                    (Some(a), Some(b)) => Some(a.later(b)),
                    (a, b) => a.or(b),
                };
                results.successful.push(Done { id });
            }
            Err(error) => results.fail(id, &error),
        }
    }
    if let Some(gate) = heard {
        gate.open().await;
    }
    Ok(rendered(results))
}

// ---- reading requests --------------------------------------------------------------------

/// A batch's entries: 1 to 10, each with a distinct, well-formed `Id`.
/// For the fuzz targets (`fuzz/fuzz_targets/sqs_*.rs`): what every action reads of `input`
/// before it touches the queue: its queue attributes, its entries, each one's message
/// attributes and receipt handle, a redrive policy and an allow policy. Nothing may panic.
pub(super) fn read_input_for_fuzzing(input: &Value) {
    if let Some(given) = input["Attributes"].as_object() {
        let _ = qe_shared::sqs::settings_of(given, true);
        if let Some(policy) = given.get("RedrivePolicy").and_then(Value::as_str) {
            let _ = qe_shared::sqs::dead_letter_target_arn(policy);
        }
        if let Some(policy) = given.get("RedriveAllowPolicy").and_then(Value::as_str) {
            let _ = qe_shared::sqs::read_allow_policy(policy);
        }
    }
    let key = ReceiptKey([7; 32]);
    let single = std::slice::from_ref(input);
    let entries = batch_entries(input).map_or(single, Vec::as_slice);
    for entry in entries {
        if let Ok(attributes) =
            serde_json::from_value::<Attributes>(entry["MessageAttributes"].clone())
        {
            let _ = attributes::check(&attributes);
            let _ = attributes::digest(&attributes);
        }
        if let Some(handle) = entry["ReceiptHandle"].as_str() {
            let _ = read_receipt_handle(&key, handle);
        }
    }
}

fn batch_entries(input: &Value) -> Result<&Vec<Value>, SqsError> {
    let entries = match &input["Entries"] {
        Value::Array(entries) => entries,
        Value::Null => return Err(SqsError::missing_parameter("Entries")),
        _ => return Err(SqsError::invalid_parameter("Entries is not a list.")),
    };
    if entries.is_empty() {
        return Err(SqsError::batch(
            "EmptyBatchRequest",
            "AWS.SimpleQueueService.EmptyBatchRequest",
            "There should be at least one SendMessageBatchRequestEntry in the request.",
        ));
    }
    if entries.len() > MAX_BATCH {
        return Err(SqsError::batch(
            "TooManyEntriesInBatchRequest",
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            &format!(
                "Maximum number of entries per request are {MAX_BATCH}. You have sent {}.",
                entries.len()
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    for entry in entries {
        let id = entry["Id"].as_str().unwrap_or("");
        let well_formed = (1..=80).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !well_formed {
            return Err(SqsError::batch(
                "InvalidBatchEntryId",
                "AWS.SimpleQueueService.InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and \
                 underscores. It can be at most 80 letters long.",
            ));
        }
        if !seen.insert(id) {
            return Err(SqsError::batch(
                "BatchEntryIdsNotDistinct",
                "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                &format!("Id {id} repeated."),
            ));
        }
    }
    Ok(entries)
}

/// A batch entry's `Id` (checked by `batch_entries`).
fn entry_id(entry: &Value) -> &str {
    entry["Id"].as_str().unwrap_or_default()
}

/// A string parameter: None if absent, InvalidParameterValue if not a string.
fn string<'a>(input: &'a Value, name: &str) -> Result<Option<&'a str>, SqsError> {
    match &input[name] {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text)),
        _ => Err(SqsError::invalid_parameter(format!(
            "Value for parameter {name} is invalid. Reason: it must be a string."
        ))),
    }
}

/// A list of strings: empty if absent.
fn string_list(input: &Value, name: &str) -> Result<Vec<String>, SqsError> {
    match &input[name] {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str().map(str::to_string).ok_or_else(|| {
                    SqsError::invalid_parameter(format!("{name} must be a list of strings."))
                })
            })
            .collect(),
        _ => Err(SqsError::invalid_parameter(format!(
            "{name} must be a list of strings."
        ))),
    }
}

/// A whole number in `range`: None if absent.
fn number(
    input: &Value,
    name: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Option<u64>, SqsError> {
    let value = &input[name];
    if value.is_null() {
        return Ok(None);
    }
    let number = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    match number.filter(|n| range.contains(n)) {
        Some(number) => Ok(Some(number)),
        None => Err(SqsError::invalid_parameter(format!(
            "Value {value} for parameter {name} is invalid. Reason: Must be between {} and {}.",
            range.start(),
            range.end()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_handle_reads_back_signed_and_nothing_made_up_or_changed_does() {
        let dir = tempfile::tempdir().unwrap();
        let key = ReceiptKey::kept_in(dir.path()).unwrap();
        let id = MessageId::parse("01a1c09f-62da-7000-a30b-0817c9a42e3f").unwrap();
        let handle = receipt_handle(&key, id, u64::MAX);
        let read = |handle: &str| read_receipt_handle(&key, handle);
        assert_eq!(read(&handle), Some(Handle::Signed(id, u64::MAX)));
        // Kept: the same key after a restart, and only the node may read it.
        let again = ReceiptKey::kept_in(dir.path()).unwrap();
        assert_eq!(
            read_receipt_handle(&again, &handle),
            Some(Handle::Signed(id, u64::MAX))
        );
        let mode = std::fs::metadata(dir.path().join("sqs-receipt-key")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        // Another node's key, a changed number, a made-up one: refused.
        let other = ReceiptKey::kept_in(tempfile::tempdir().unwrap().path()).unwrap();
        assert_eq!(read_receipt_handle(&other, &handle), None);
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(&handle).unwrap()).unwrap();
        let changed = text.replace(&format!(":{}:", u64::MAX), ":7:");
        assert_eq!(read(&URL_SAFE_NO_PAD.encode(changed)), None);
        // An earlier build's handle reads, and acts on nothing.
        assert_eq!(
            read(&URL_SAFE_NO_PAD.encode(format!("qe1:{id}:1"))),
            Some(Handle::Earlier)
        );
        for bad in [
            "",
            "x",
            &URL_SAFE_NO_PAD.encode("qe1:nope:1"),
            &URL_SAFE_NO_PAD.encode(format!("qe2:{id}:1")),
            &URL_SAFE_NO_PAD.encode(format!("qe2:{id}:1:00")),
        ] {
            assert_eq!(read(bad), None, "{bad}");
        }
    }

    #[test]
    fn message_attribute_names_select_as_sqs_selects() {
        assert!(attribute_matches("All", "a"));
        assert!(attribute_matches(".*", "a"));
        assert!(attribute_matches("trace.*", "trace.id"));
        assert!(!attribute_matches("trace.*", "tracer"));
        assert!(attribute_matches("a", "a"));
        assert!(!attribute_matches("a", "b"));
    }

    #[test]
    fn each_role_does_what_its_websocket_role_does() {
        use Action::*;
        assert!(SendMessage.allowed_for(Role::Publisher));
        assert!(!ReceiveMessage.allowed_for(Role::Publisher));
        assert!(ReceiveMessage.allowed_for(Role::Subscriber));
        assert!(!SendMessage.allowed_for(Role::Subscriber));
        assert!(!PurgeQueue.allowed_for(Role::Subscriber));
        assert!(Action::ALL.iter().all(|a| a.allowed_for(Role::Admin)));
        assert!(Action::ALL
            .iter()
            .all(|a| Action::parse(a.name()) == Some(*a)));
    }
}
