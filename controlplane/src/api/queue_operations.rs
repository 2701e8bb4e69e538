//! What is done to a queue apart from answering HTTP: made within its account's places
//! ([`provision`]), deleted ([`mark_deleting`]), its node (or every node of an account) moved
//! to a new config version and waited for ([`wait_applied`], [`tell_account_queues`]), and the
//! zone rebuilt. The queue and account routes, the SQS wire and `controlplane dev` call these;
//! none of them reads a request or makes a response.

use super::{ApiError, AppState};
use crate::model::account;
use crate::model::queue::{self, IssuedLogins, NewQueue, Queue, Status};
use crate::store::StoreError;
use std::time::Duration;

/// How long a change waits for the node to confirm it serves the new config (a rotated
/// password, a new or revoked key).
pub const CONFIRM_WITHIN: Duration = Duration::from_secs(10);

/// Records a new queue and wakes the reconciler (also used by `controlplane dev`). Its
/// labels go into every usage record and bill line: they must be labels
/// ([`qe_shared::labels`]), and ones its provider offers. A queue of an account takes one of
/// the account's places first ([`reserve`]).
pub async fn provision(state: &AppState, new: NewQueue) -> Result<(Queue, IssuedLogins), ApiError> {
    qe_shared::labels::check("region", &new.region).map_err(ApiError::BadRequest)?;
    qe_shared::labels::check("instance_type", &new.instance_type).map_err(ApiError::BadRequest)?;
    state.fleet.can_run(&new).map_err(ApiError::BadRequest)?;
    crate::policy::check(&state.config.allow, &new).map_err(ApiError::BadRequest)?;
    if let Some(name) = &new.name {
        queue::check_name(name).map_err(ApiError::BadRequest)?;
        if new.account.is_none() {
            return Err(ApiError::BadRequest(
                "a name is unique within an account: a queue of no account has none".into(),
            ));
        }
    }
    queue::check_tags(&new.tags).map_err(ApiError::BadRequest)?;
    let (mut queue, logins) = queue::create(new);
    // It starts from the installed build: told the rolled-out one, if there is one.
    queue.desired_build = crate::rollout::fleet_build(&state.store).await?;
    if let Some(account) = &queue.account {
        reserve(state, account, &queue).await?;
    }
    state.store.put(&queue).await?;
    state.reconcile.notify_one();
    Ok((queue, logins))
}

/// Takes a place for `queue` in its account within the account's limits, as one
/// compare-and-swap of the account's record: two creates at once (on two replicas too)
/// cannot both take the last place. Places of queues since deleted, and of creates that
/// never made their queue, are given back first.
async fn reserve(state: &AppState, account_id: &str, queue: &Queue) -> Result<(), ApiError> {
    let missing = || ApiError::NoSuch(format!("no account {account_id}"));
    let account = state.store.account(account_id).await?.ok_or_else(missing)?;
    let now = crate::unix_now();
    let mut gone = Vec::new();
    let mut unnamed = Vec::new();
    for (id, reserved) in &account.queues {
        let held = state.store.get(id).await?;
        let over = match &held {
            Some(held) => held.status == Status::Deleted,
            None => now >= reserved + account::RESERVATION_EXPIRES_SECS,
        };
        if over {
            gone.push(id.clone());
        }
        // A deleted queue's name is free at once (its place, once its node is gone).
        if over || held.is_some_and(|held| held.status == Status::Deleting) {
            unnamed.push(id.clone());
        }
    }
    let reserved = state.store.update_account(account_id, |account| {
        for id in &gone {
            account.queues.remove(id);
        }
        account
            .names
            .retain(|_, id| !unnamed.contains(id) && account.queues.contains_key(id));
        if let Some(name) = &queue.name {
            if account.names.contains_key(name) {
                return Err(ApiError::Conflict(format!(
                    "account {account_id} has a queue named {name}"
                )));
            }
        }
        let limits = &account.limits;
        if !limits.tiers.contains(&queue.tier) {
            return Err(ApiError::LimitReached(format!(
                "account {account_id} may not have {:?} queues (its tiers: {:?})",
                queue.tier, limits.tiers
            )));
        }
        if account.queues.len() >= limits.max_queues as usize {
            return Err(ApiError::LimitReached(format!(
                "account {account_id} has {} queues, its limit",
                limits.max_queues
            )));
        }
        account.queues.insert(queue.id.clone(), now);
        if let Some(name) = &queue.name {
            account.names.insert(name.clone(), queue.id.clone());
        }
        Ok(())
    });
    reserved.await?.ok_or_else(missing)?;
    Ok(())
}

/// Rebuilds the DNS zone from the queues' records.
pub async fn refresh_zone(state: &AppState) -> Result<(), StoreError> {
    state.zone.refresh(&state.store).await
}

/// Moves every live queue of `account` to a new config version (its SQS keys changed), and
/// says whether all their nodes served it within [`CONFIRM_WITHIN`].
pub async fn tell_account_queues(
    state: &AppState,
    account: &account::Account,
) -> Result<bool, ApiError> {
    let mut told = Vec::new();
    for id in account.queues.keys() {
        let bumped = state.store.update(id, |queue| {
            if queue.status.is_live() {
                queue.config_version += 1;
            }
            Ok::<_, ApiError>(queue.status.is_live())
        });
        if let Some((queue, true)) = bumped.await? {
            told.push(queue);
        }
    }
    // All at once: an account with queues still being made waits CONFIRM_WITHIN once.
    let waits = told.iter().map(|queue| wait_applied(state, queue));
    let served = futures::future::join_all(waits).await;
    Ok(served.into_iter().all(|served| matches!(served, Ok(true))))
}

/// Whether `queue`'s node serves its config version (or a later one) within
/// [`CONFIRM_WITHIN`].
pub async fn wait_applied(state: &AppState, queue: &Queue) -> Result<bool, ApiError> {
    let version = queue.config_version;
    let served =
        |queue: &Queue| queue.applied_version >= version || queue.status == Status::Deleted;
    Ok(state
        .store
        .wait_for(&queue.id, CONFIRM_WITHIN, served)
        .await?
        .is_some_and(|queue| queue.applied_version >= version))
}

/// Marks queue `id` to be deleted (its name stops resolving now) and wakes the reconciler,
/// which removes its node.
pub async fn mark_deleting(state: &AppState, id: &str) -> Result<(), ApiError> {
    let marked = state.store.update(id, |queue| {
        if !matches!(queue.status, Status::Deleting | Status::Deleted) {
            queue.status = Status::Deleting;
            queue.deleting_since = Some(crate::unix_now());
            // Only a last report made from now on counts (a node restarted earlier made one).
            queue.last_report = None;
        }
        Ok::<_, ApiError>(())
    });
    let (queue, ()) = marked
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    // A queue that sent its dead letters to another no longer does: the target's node lets
    // its key go, and its ListDeadLetterSourceQueues stops naming it.
    super::redrive::forget_source(state, &queue).await?;
    refresh_zone(state).await?;
    state.reconcile.notify_one();
    Ok(())
}
