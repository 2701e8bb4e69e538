//! Dead letters sent on to another queue of the account (docs/sqs.md, *Dead letters to
//! another queue*), when the queue's redrive names one (the control plane sets it:
//! `redrive.rs` there).
//!
//! A message is dead-lettered here first, as the manual has it (a max receive count, a
//! `nack` to the dead letter queue, an administrator's move); the forwarder then sends the
//! oldest ten at a time to the target's SQS face (`SendMessageBatch`, signed with the key the
//! control plane derived for this queue there), each with its body, its SQS attributes, its
//! group, and a deduplication id of this queue and the message; and drops each one the target
//! took, once that drop is as durable as the queue's records. A send repeated after a reply
//! that was lost (a kill between the two) makes no second message at the target for five
//! minutes, its deduplication window. What the target refuses stays here, in the queue's
//! own dead letter queue, where an administrator sees it; what cannot be sent now is tried
//! again with a growing pause.

use super::actions::sqs_body;
use crate::engine::{Anchor, MessageId};
use crate::state::Node;
use qe_shared::backoff::Backoff;
use qe_shared::node_channel::DeadLetterTarget;
use qe_shared::sqs::sigv4;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// The most messages one `SendMessageBatch` takes.
const BATCH: usize = 10;
/// How often the dead letter queue is looked at while it has nothing to send.
const LOOK_EVERY: Duration = Duration::from_millis(500);
/// The pause after a send that failed, doubled after each that fails again up to
/// [`RETRY_AT_MOST`].
const RETRY_AFTER: Duration = Duration::from_secs(1);
const RETRY_AT_MOST: Duration = Duration::from_secs(60);
/// How long the target has to answer a batch.
const SEND_WITHIN: Duration = Duration::from_secs(30);

/// Sends the dead letters of queue `queue_id` (the node's) to its redrive's target for as
/// long as the node runs.
pub async fn forward(node: Arc<Node>, queue_id: String) {
    let mut redrive = node.redrive();
    // The messages the target refused (too large for it, a body it does not take): they
    // stay here until the node restarts, and the others go past them.
    let mut refused: HashSet<MessageId> = HashSet::new();
    loop {
        let target = redrive.borrow_and_update().target.clone();
        let Some(target) = target else {
            if redrive.changed().await.is_err() {
                return;
            }
            continue;
        };
        let sender = Sender::new(&queue_id, target);
        let mut backoff = Backoff::new(RETRY_AFTER, RETRY_AT_MOST);
        // Halved while the target refuses a whole batch (too long together for it).
        let mut batch_size = BATCH;
        // How many dead letters there were when a look found none to send (all damaged or
        // refused): while that stays so, the dead letter queue is not read again (a look reads
        // all of it). One that comes as another goes waits for the count's next change.
        let mut none_to_send_at = None;
        // Until the route changes.
        while !redrive.has_changed().unwrap_or(true) {
            let dead = node.queue.counts().dead_letter;
            if none_to_send_at == Some(dead) {
                tokio::time::sleep(LOOK_EVERY).await;
                continue;
            }
            let batch = oldest(&node, &refused, batch_size);
            if batch.is_empty() {
                none_to_send_at = Some(dead);
                tokio::time::sleep(LOOK_EVERY).await;
                continue;
            }
            none_to_send_at = None;
            match sender.send(&batch).await {
                Ok(answer) => {
                    backoff.reset();
                    batch_size = BATCH;
                    for (id, reason) in answer.refused {
                        refuse(&sender, &mut refused, id, &reason);
                    }
                    drop_taken(&node, &answer.taken).await;
                }
                Err(Failure::Refused(reason)) if batch.len() > 1 => {
                    tracing::debug!(%reason, "a batch of dead letters was refused whole: sending fewer");
                    batch_size = batch.len() / 2;
                }
                Err(Failure::Refused(reason)) => refuse(&sender, &mut refused, batch[0].0, &reason),
                Err(Failure::Unreached(error)) => {
                    let pause = backoff.next_wait();
                    tracing::warn!(%error, target = %sender.target.arn, retry_in = ?pause, "dead letters could not be sent to their target");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = redrive.changed() => {}
                    }
                }
            }
        }
    }
}

/// A message the target will not take: it stays here, and is not sent again until the node
/// restarts.
fn refuse(sender: &Sender, refused: &mut HashSet<MessageId>, id: MessageId, reason: &str) {
    tracing::warn!(%id, %reason, target = %sender.target.arn, "the dead letter target refused a message: it stays in this queue's dead letter queue");
    refused.insert(id);
}

/// Up to `size` of the oldest dead letters to send: not damaged records (their bytes are not
/// a message), not one the target refused.
fn oldest(
    node: &Node,
    refused: &HashSet<MessageId>,
    size: usize,
) -> Vec<(MessageId, crate::engine::Message)> {
    let mut batch = Vec::new();
    let mut after = None;
    loop {
        let page = node.queue.page(true, Anchor::After(after), 100);
        let Some((last, _)) = page.last() else {
            return batch;
        };
        after = Some(*last);
        for (id, message) in page {
            if !message.is_damaged() && !refused.contains(&id) {
                batch.push((id, message));
                if batch.len() == size {
                    return batch;
                }
            }
        }
    }
}

/// Drops the dead letters the target took, each once its drop is as safe as the queue's
/// records make it.
async fn drop_taken(node: &Node, taken: &[MessageId]) {
    for id in taken {
        // Gone already (an administrator deleted or redrove it meanwhile): nothing to drop.
        if let Ok(receipt) = node.queue.delete_dead_letter(*id) {
            if let Err(error) = receipt.wait().await {
                tracing::warn!(%error, %id, "a dead letter sent on could not be dropped durably: it may be sent again");
            }
        }
    }
}

/// What the target answered a batch.
struct Answer {
    taken: Vec<MessageId>,
    refused: Vec<(MessageId, String)>,
}

/// Why a batch was not sent.
enum Failure {
    /// The target refused it whole as too long: fewer, or its one message not at all.
    Refused(String),
    /// No answer, or one that says to try again (a key not known there yet, a node busy).
    Unreached(String),
}

/// Sends batches to one target.
struct Sender {
    target: DeadLetterTarget,
    client: reqwest::Client,
    /// The deduplication ids' prefix: this queue.
    queue_id: String,
}

impl Sender {
    fn new(queue_id: &str, target: DeadLetterTarget) -> Sender {
        let builder = reqwest::Client::builder().timeout(SEND_WITHIN);
        let certificates = target
            .roots_pem
            .as_deref()
            .map(|pem| reqwest::Certificate::from_pem_bundle(pem.as_bytes()));
        let builder = match certificates {
            Some(Ok(roots)) => builder.tls_certs_only(roots),
            // Roots that do not read trust nothing: every send fails, and says why.
            Some(Err(error)) => {
                tracing::error!(%error, "the dead letter target's roots do not read");
                builder.tls_certs_only(Vec::new())
            }
            None => builder,
        };
        Sender {
            target,
            client: builder.build().expect("an HTTP client"),
            queue_id: queue_id.to_string(),
        }
    }

    /// Sends `batch` as one `SendMessageBatch`.
    async fn send(&self, batch: &[(MessageId, crate::engine::Message)]) -> Result<Answer, Failure> {
        let entries: Vec<Value> = batch
            .iter()
            .enumerate()
            .map(|(index, (id, message))| self.entry(index, *id, message))
            .collect();
        let body = json!({ "QueueUrl": self.target.queue_url, "Entries": entries }).to_string();
        let url = reqwest::Url::parse(&self.target.queue_url)
            .map_err(|e| Failure::Unreached(e.to_string()))?;
        let host = match url.port() {
            Some(port) => format!("{}:{port}", url.host_str().unwrap_or_default()),
            None => url.host_str().unwrap_or_default().to_string(),
        };
        let target = &self.target;
        let key = (
            target.access_key_id.as_str(),
            target.secret.as_str(),
            target.region.as_str(),
        );
        let now = crate::engine::now_ms() / 1000;
        let headers =
            sigv4::signed_json_headers(&host, "SendMessageBatch", body.as_bytes(), key, now)
                .map_err(|e| Failure::Unreached(e.to_string()))?;
        let mut request = self.client.post(format!("{}://{host}/", url.scheme()));
        for (name, value) in headers.iter().filter(|(name, _)| name != "host") {
            request = request.header(name, value);
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|e| Failure::Unreached(e.to_string()))?;
        let status = response.status();
        let reply: Value = response
            .json()
            .await
            .map_err(|e| Failure::Unreached(e.to_string()))?;
        match status.as_u16() {
            200..=299 => {}
            // Too long for the target: fewer, or this one not at all.
            400 if reply["__type"]
                .as_str()
                .unwrap_or("")
                .ends_with("BatchRequestTooLong") =>
            {
                return Err(Failure::Refused(reply.to_string()))
            }
            _ => return Err(Failure::Unreached(format!("{status}: {reply}"))),
        }
        let id_of = |entry: &Value| {
            let index: usize = entry["Id"].as_str()?.parse().ok()?;
            batch.get(index).map(|(id, _)| *id)
        };
        let taken = reply["Successful"].as_array().into_iter().flatten();
        let failed = reply["Failed"].as_array().into_iter().flatten();
        Ok(Answer {
            taken: taken.filter_map(id_of).collect(),
            refused: failed
                .filter_map(|entry| {
                    let reason = format!("{}: {}", entry["Code"], entry["Message"]);
                    Some((id_of(entry)?, reason))
                })
                .collect(),
        })
    }

    /// The batch entry of message `id`: its body and attributes as SQS gives them, its group
    /// (a FIFO target needs one: the message's, or `dead-letters`), and its deduplication id.
    fn entry(&self, index: usize, id: MessageId, message: &crate::engine::Message) -> Value {
        let (body, attributes) = sqs_body(&message.frame);
        let mut entry = json!({
            "Id": index.to_string(),
            "MessageBody": body,
            "MessageDeduplicationId": format!("{}-{id}", self.queue_id),
        });
        if !attributes.is_empty() {
            entry["MessageAttributes"] = json!(attributes);
        }
        if self.target.fifo {
            let group = crate::message::frame_group(&message.frame).unwrap_or("dead-letters");
            entry["MessageGroupId"] = json!(group);
        }
        entry
    }
}
