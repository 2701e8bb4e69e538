//! Dead letters sent to another queue of the account (docs/sqs.md, *Dead letters to another
//! queue*): SQS's `RedrivePolicy` whose `deadLetterTargetArn` names another queue, and
//! `RedriveAllowPolicy`, which says which queues may name this one.
//!
//! A queue's node keeps its own dead letter queue as the manual has it; when the queue's
//! record names a target, its node sends each dead letter on to the target's SQS face
//! (`SendMessageBatch`, signed with a publisher key of the target derived for this source
//! alone, with a deduplication id of the source and the message, so that a send repeated
//! after a lost reply makes no second message), and drops it once the target took it. Only
//! the control plane knows the account's other queues, so it alone sets the route: at
//! `CreateQueue`, and when `SetQueueAttributes` at the node asks (`POST
//! /v1/nodes/{id}/redrive`). Each route is kept on both records: the source's
//! `dead_letter_target`, the target's `dead_letter_sources` (its keys and
//! `ListDeadLetterSourceQueues`).

use crate::api::{ApiError, AppState};
use crate::model::account::Account;
use crate::model::queue::Queue;
use qe_shared::node_channel::{DeadLetterTarget, DesiredRedrive, RedriveChange};
use qe_shared::sqs::{self, AllowPolicy, SqsError};
use sha2::Digest;

/// The id of the access key queue `source_id`'s node signs its dead letters with at its
/// target: a publisher key of the target, one per source, derived as the queues' keys are
/// (its secret never rests anywhere).
pub fn dead_letter_key_id(source_id: &str) -> String {
    let digest = sha2::Sha256::digest(format!("dead-letters/{source_id}").as_bytes());
    format!("QEDL{}", qe_shared::hex(&digest[..8]).to_uppercase())
}

/// `queue`'s ARN, as its node's `QueueArn` gives it.
pub fn arn(queue: &Queue) -> String {
    format!("arn:aws:sqs:{}:000000000000:{}", queue.region, queue.id)
}

/// Whether `queue` is a FIFO queue (SQS's rule: its name ends with `.fifo`).
fn is_fifo(queue: &Queue) -> bool {
    queue.sqs_name().ends_with(".fifo")
}

/// The account's queue that `arn` names, checked as the target of the dead letters of a queue
/// known as `source_names` (its name, and its id once it has one) in account `account_id`
/// that is (`fifo`) or is not a FIFO queue: another live queue of the account, of the same
/// kind, whose `RedriveAllowPolicy` lets the source name it.
pub async fn resolve_target(
    state: &AppState,
    account_id: Option<&str>,
    source_names: &[&str],
    fifo: bool,
    arn: &str,
) -> Result<Queue, SqsError> {
    let invalid = |reason: &str| {
        SqsError::invalid_parameter(format!(
            "Value {arn} for parameter RedrivePolicy is invalid. Reason: {reason}"
        ))
    };
    let named = sqs::queue_of_arn(arn).ok_or_else(|| invalid("it is not an SQS queue's ARN."))?;
    let account_id = account_id.ok_or_else(|| {
        invalid("the queue belongs to no account, so it has no other queue to send to.")
    })?;
    let account = state
        .store
        .account(account_id)
        .await
        .map_err(|e| SqsError::unavailable(&e.to_string()))?
        .ok_or_else(|| invalid("the account is gone."))?;
    let target = live_queue_named(state, &account, named)
        .await?
        .ok_or_else(|| invalid("Dead letter target does not exist."))?;
    if source_names.contains(&target.id.as_str()) {
        return Err(invalid("a queue cannot be its own dead letter target."));
    }
    if is_fifo(&target) != fifo {
        return Err(invalid(
            "the dead letter target of a FIFO queue is a FIFO queue, and of a standard queue a standard queue.",
        ));
    }
    let policy = match &target.redrive_allow_policy {
        Some(text) => sqs::read_allow_policy(text).unwrap_or(AllowPolicy::DenyAll),
        None => AllowPolicy::AllowAll,
    };
    if !policy.allows(source_names) {
        return Err(invalid(
            "the dead letter target's RedriveAllowPolicy does not allow this queue.",
        ));
    }
    Ok(target)
}

/// Applies `change` to queue `source` (asked by SetQueueAttributes at its node, or by
/// CreateQueue): its dead letter target, then its allow policy. Answers the record as it
/// is after.
pub async fn change(
    state: &AppState,
    source: &Queue,
    change: &RedriveChange,
) -> Result<Queue, SqsError> {
    if let Some(policy) = &change.allow_policy {
        if !policy.is_empty() {
            sqs::read_allow_policy(policy).map_err(|reason| {
                SqsError::invalid_parameter(format!(
                    "Value {policy} for parameter RedriveAllowPolicy is invalid. Reason: {reason}."
                ))
            })?;
        }
    }
    let target = match change.dead_letter_target_arn.as_deref() {
        None => source.dead_letter_target.clone(),
        Some("") => None,
        Some(arn) => {
            let names = [source.sqs_name(), source.id.as_str()];
            let target = resolve_target(
                state,
                source.account.as_deref(),
                &names,
                is_fifo(source),
                arn,
            );
            Some(target.await?.id)
        }
    };
    let allow_policy = match change.allow_policy.as_deref() {
        None => source.redrive_allow_policy.clone(),
        Some("") => None,
        Some(policy) => Some(policy.to_string()),
    };
    let updated = state.store.update(&source.id, |held| {
        let before = held.dead_letter_target.clone();
        if held.dead_letter_target != target || held.redrive_allow_policy != allow_policy {
            held.dead_letter_target = target.clone();
            held.redrive_allow_policy = allow_policy.clone();
            held.config_version += 1;
        }
        Ok::<_, crate::store::StoreError>(before)
    });
    let (updated, before) = updated
        .await
        .map_err(|e| SqsError::unavailable(&e.to_string()))?
        .ok_or_else(SqsError::queue_does_not_exist)?;
    if before != target {
        if let Some(old) = &before {
            link(state, old, &source.id, false).await?;
        }
        if let Some(new) = &target {
            link(state, new, &source.id, true).await?;
        }
    }
    Ok(updated)
}

/// Adds (`linked`) or removes `source` among `target`'s dead letter sources: the target's
/// node then takes, or no longer takes, the source's key.
async fn link(state: &AppState, target: &str, source: &str, linked: bool) -> Result<(), SqsError> {
    let updated = state.store.update(target, |held| {
        let changed = match linked {
            true => held.dead_letter_sources.insert(source.to_string()),
            false => held.dead_letter_sources.remove(source),
        };
        if changed {
            held.config_version += 1;
        }
        Ok::<_, crate::store::StoreError>(())
    });
    updated
        .await
        .map_err(|e| SqsError::unavailable(&e.to_string()))?;
    Ok(())
}

/// What `queue`'s node is told of its redrive (None: nothing to tell, or a node that does
/// not take it). A target that is gone, or not serving SQS yet, is left out: the dead
/// letters then stay in the queue's own dead letter queue.
pub async fn desired(state: &AppState, queue: &Queue) -> Result<Option<DesiredRedrive>, ApiError> {
    if !queue.node_takes_redrive || !queue.has_redrive() {
        return Ok(None);
    }
    Ok(Some(redrive_of(state, queue).await?))
}

/// `queue`'s redrive as its node is told it.
pub async fn redrive_of(state: &AppState, queue: &Queue) -> Result<DesiredRedrive, ApiError> {
    let target = match &queue.dead_letter_target {
        Some(id) => state.store.get(id).await?,
        None => None,
    };
    let target = match target.filter(|target| target.status.is_live()) {
        Some(target) => dead_letter_target(state, queue, &target)?,
        None => None,
    };
    Ok(DesiredRedrive {
        target,
        allow_policy: queue.redrive_allow_policy.clone(),
    })
}

/// Takes deleted queue `source` off its dead letter target's sources (its key there goes).
pub async fn forget_source(state: &AppState, source: &Queue) -> Result<(), ApiError> {
    if let Some(target) = &source.dead_letter_target {
        link(state, target, &source.id, false)
            .await
            .map_err(|error| ApiError::Unavailable(error.message))?;
    }
    Ok(())
}

/// How `source`'s node sends its dead letters to `target`, once the target serves SQS.
fn dead_letter_target(
    state: &AppState,
    source: &Queue,
    target: &Queue,
) -> Result<Option<DeadLetterTarget>, ApiError> {
    let Some(endpoint) = state.sqs_endpoint(target)? else {
        return Ok(None);
    };
    let access_key_id = dead_letter_key_id(&source.id);
    // What the control plane itself trusts for nodes, read once.
    let roots_pem = state.config.sqs.node_roots_pem().map(str::to_string);
    Ok(Some(DeadLetterTarget {
        arn: arn(target),
        queue_url: format!("{endpoint}/{}", target.id),
        region: target.region.clone(),
        fifo: is_fifo(target),
        secret: state.node_tokens.sqs_secret(&target.id, &access_key_id),
        access_key_id,
        roots_pem,
    }))
}

/// The keys of the queues that send `target` their dead letters, as its node checks them.
pub fn source_keys(state: &AppState, target: &Queue) -> Vec<qe_shared::node_channel::SqsKeySecret> {
    target
        .dead_letter_sources
        .iter()
        .map(|source| {
            let access_key_id = dead_letter_key_id(source);
            qe_shared::node_channel::SqsKeySecret {
                secret: state.node_tokens.sqs_secret(&target.id, &access_key_id),
                access_key_id,
                role: "publisher".to_string(),
            }
        })
        .collect()
}

/// The live queues whose dead letters go to `target` (`ListDeadLetterSourceQueues`).
pub async fn sources(state: &AppState, target: &Queue) -> Result<Vec<Queue>, SqsError> {
    let mut found = Vec::new();
    for id in &target.dead_letter_sources {
        let source = state
            .store
            .get(id)
            .await
            .map_err(|e| SqsError::unavailable(&e.to_string()))?;
        if let Some(source) = source.filter(|source| {
            source.status.is_live() && source.dead_letter_target.as_deref() == Some(&target.id)
        }) {
            found.push(source);
        }
    }
    Ok(found)
}

/// The account's live queue named `name` (a queue made without a name goes by its id).
pub(crate) async fn live_queue_named(
    state: &AppState,
    account: &Account,
    name: &str,
) -> Result<Option<Queue>, SqsError> {
    let id = account.names.get(name).map_or(name, String::as_str);
    if !account.queues.contains_key(id) {
        return Ok(None);
    }
    let queue = state
        .store
        .get(id)
        .await
        .map_err(|e| SqsError::unavailable(&e.to_string()))?;
    Ok(queue.filter(|queue| queue.status.is_live() && queue.account == Some(account.id.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_has_its_own_key_that_reads_as_an_access_key_id() {
        let one = dead_letter_key_id("q1");
        assert_eq!(one, dead_letter_key_id("q1"));
        assert_ne!(one, dead_letter_key_id("q2"));
        assert_eq!(one.len(), 20);
        assert!(one
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()));
    }
}
