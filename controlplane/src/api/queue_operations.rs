//! What is done to a queue apart from answering HTTP: made within its account's places
//! ([`provision`]), a login or the node's credential rotated, SQS keys added and revoked, a
//! console token signed, deleted ([`mark_deleting`]), its node (or every node of an account,
//! when the account's SQS keys change) moved to a new config version and waited for
//! ([`wait_applied`]), and the zone rebuilt. The queue and account routes, the SQS wire and
//! `controlplane dev` call these; none of them reads a request or makes a response.

use super::{ApiError, AppState};
use crate::model::account;
use crate::model::queue::{self, Credentials, IssuedLogins, NewQueue, Queue, Status};
use crate::store::StoreError;
use qe_shared::console_token;
use qe_shared::protocol::Role;
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
    new.check_replicas().map_err(ApiError::BadRequest)?;
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

/// Adds an SQS access key of `role` to account `id` (revoked keys are let go first at the
/// account's `max_sqs_keys`); every queue's node gets it with its next config.
pub async fn add_account_sqs_key(
    state: &AppState,
    id: &str,
    role: Role,
) -> Result<NewAccountSqsKey, ApiError> {
    let access_key_id = account::new_sqs_key_id(id);
    let made = state.store.update_account(id, |account| {
        let most = account.limits.max_sqs_keys as usize;
        if account.sqs_keys.len() >= most {
            account.sqs_keys.retain(|key| !key.revoked);
        }
        if account.sqs_keys.len() >= most {
            return Err(ApiError::LimitReached(format!(
                "account {id} has {most} SQS keys, its max_sqs_keys"
            )));
        }
        account.sqs_keys.push(queue::SqsKeyRecord {
            access_key_id: access_key_id.clone(),
            role: role.name().to_string(),
            created: crate::unix_now(),
            revoked: false,
        });
        Ok(())
    });
    let (account, ()) = made
        .await?
        .ok_or_else(|| ApiError::NoSuch(format!("no account {id}")))?;
    // The key is made: the reply must carry its secret whatever telling the nodes met.
    let applied = tell_nodes(state, &account).await;
    Ok(NewAccountSqsKey {
        secret: state.node_tokens.account_sqs_secret(id, &access_key_id),
        access_key_id,
        applied,
    })
}

/// An account's new SQS key: its secret (shown once) and whether every queue's node serves it.
pub struct NewAccountSqsKey {
    pub access_key_id: String,
    pub secret: String,
    pub applied: bool,
}

/// Revokes account `id`'s SQS key `key`: refused by the control plane at once, and by each node
/// once it serves its next config (whether all do yet).
pub async fn revoke_account_sqs_key(
    state: &AppState,
    id: &str,
    key: &str,
) -> Result<bool, ApiError> {
    let revoked =
        state
            .store
            .update_account(id, |account| match revoke_in(&mut account.sqs_keys, key) {
                true => Ok(()),
                false => Err(ApiError::NoSuch(format!(
                    "no SQS key {key} in account {id}"
                ))),
            });
    let (account, ()) = revoked
        .await?
        .ok_or_else(|| ApiError::NoSuch(format!("no account {id}")))?;
    Ok(tell_nodes(state, &account).await)
}

/// Tells every queue of `account` its keys changed; whether all their nodes served it soon.
/// A store error here is logged, not answered: the key change itself is already made.
async fn tell_nodes(state: &AppState, account: &account::Account) -> bool {
    match tell_account_queues(state, account).await {
        Ok(applied) => applied,
        Err(error) => {
            tracing::warn!(%error, account = %account.id, "the account's queues were not all told of an SQS key change");
            false
        }
    }
}

/// Moves every live queue of `account` to a new config version (its SQS keys changed), and
/// says whether all their nodes served it within [`CONFIRM_WITHIN`].
async fn tell_account_queues(
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

/// Runs `change` on live queue `id`'s record, retried as the store's compare-and-swap needs
/// (a queue being deleted takes no change: `409`).
async fn change_live<T>(
    state: &AppState,
    id: &str,
    mut change: impl FnMut(&mut Queue) -> Result<T, ApiError>,
) -> Result<(Queue, T), ApiError> {
    let changed = state.store.update(id, |queue| {
        if !queue.status.is_live() {
            return Err(ApiError::Conflict(format!(
                "queue {id} is {:?}",
                queue.status
            )));
        }
        change(queue)
    });
    changed
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))
}

/// A new password for `role`'s login of queue `id`, and whether its node serves it within
/// [`CONFIRM_WITHIN`] (open connections go on; until then the queue shows the change
/// pending).
pub async fn rotate_login(
    state: &AppState,
    id: &str,
    role: Role,
) -> Result<(Credentials, bool), ApiError> {
    let (queue, credentials) =
        change_live(state, id, |queue| Ok(queue::rotate(queue, role))).await?;
    let applied = wait_applied(state, &queue).await?;
    Ok((credentials, applied))
}

/// A new credential for queue `id`'s node: sent to it over the channel (authenticated with
/// the old one), which it keeps; its first use retires the old one. Whether that happened
/// within [`CONFIRM_WITHIN`] (the old one still works until the node takes the new one).
pub async fn rotate_node_credential(state: &AppState, id: &str) -> Result<bool, ApiError> {
    let (_, next) = change_live(state, id, |queue| Ok(queue.rotate_credentials())).await?;
    // Confirmed once the machine that serves uses it.
    let serves_it = |queue: &Queue| queue.credential_of(queue.serving).0 >= next;
    let taken = |queue: &Queue| serves_it(queue) || queue.status == Status::Deleted;
    Ok(state
        .store
        .wait_for(id, CONFIRM_WITHIN, taken)
        .await?
        .is_some_and(|queue| serves_it(&queue)))
}

/// A queue's new SQS key: its secret (shown once) and whether the node serves it yet.
pub struct NewSqsKey {
    pub queue: Queue,
    pub access_key_id: String,
    pub secret: String,
    pub applied: bool,
}

/// Adds an SQS access key of `role` to queue `id` (revoked keys are let go first when it has
/// [`queue::MAX_SQS_KEYS`]: only the keys in use count), sent to the node with its next
/// config.
pub async fn add_sqs_key(state: &AppState, id: &str, role: Role) -> Result<NewSqsKey, ApiError> {
    let access_key_id = new_access_key_id();
    let (queue, ()) = change_live(state, id, |queue| {
        if queue.sqs_keys.len() >= queue::MAX_SQS_KEYS {
            queue.sqs_keys.retain(|key| !key.revoked);
        }
        if queue.sqs_keys.len() >= queue::MAX_SQS_KEYS {
            return Err(ApiError::Conflict(format!(
                "queue {id} has {} SQS keys, the most it may",
                queue::MAX_SQS_KEYS
            )));
        }
        queue.sqs_keys.push(queue::SqsKeyRecord {
            access_key_id: access_key_id.clone(),
            role: role.name().to_string(),
            created: crate::unix_now(),
            revoked: false,
        });
        queue.config_version += 1;
        Ok(())
    })
    .await?;
    let applied = wait_applied(state, &queue).await?;
    Ok(NewSqsKey {
        secret: state.node_tokens.sqs_secret(&queue.id, &access_key_id),
        queue,
        access_key_id,
        applied,
    })
}

/// Revokes queue `id`'s SQS key `key`; whether the node refuses it yet (it does once it serves
/// the next config). A queue being deleted may still have its keys revoked.
pub async fn revoke_sqs_key(state: &AppState, id: &str, key: &str) -> Result<bool, ApiError> {
    let revoked = state.store.update(id, |queue| {
        if !revoke_in(&mut queue.sqs_keys, key) {
            return Err(ApiError::NoSuch(format!("no SQS key {key} on queue {id}")));
        }
        queue.config_version += 1;
        Ok(())
    });
    let (queue, ()) = revoked
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    wait_applied(state, &queue).await
}

/// Marks key `key` of `keys` revoked; false when none of that id is in use.
fn revoke_in(keys: &mut [queue::SqsKeyRecord], key: &str) -> bool {
    let in_use = keys
        .iter_mut()
        .find(|record| record.access_key_id == key && !record.revoked);
    in_use.map(|record| record.revoked = true).is_some()
}

/// An access key id as AWS's look: 20 capitals and digits, here starting `QE`.
fn new_access_key_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    format!("QE{}", qe_shared::random::drawn_from(ALPHABET, 18))
}

/// How long a console token lives: long enough to open a WebSocket, short enough that one
/// seen by someone else is soon worth nothing.
pub const CONSOLE_TOKEN_SECS: u64 = 120;

/// A console token for `queue`'s node ([`qe_shared::console_token`]) with `rights`, and when it
/// expires: it lives [`CONSOLE_TOKEN_SECS`] and opens one login. A queue whose node does not
/// serve is a `409`.
pub fn console_token(
    state: &AppState,
    queue: &Queue,
    rights: console_token::Rights,
) -> Result<(String, u64), ApiError> {
    if !queue.status.is_live() || queue.node.is_none() {
        return Err(ApiError::Conflict(format!(
            "queue {} is {:?}: its node does not serve",
            queue.id, queue.status
        )));
    }
    let expires = crate::unix_now() + CONSOLE_TOKEN_SECS;
    let claims = console_token::Claims {
        q: queue.id.clone(),
        r: rights,
        exp: expires,
        jti: console_token::new_jti(),
    };
    // Signed with the credential the node holds; during a rotation the node may hold either
    // one, so with both. A finished rotation voids tokens of the old one.
    // The machine that serves checks them, with its own slot's credential.
    let (current, next) = queue.credential_of(queue.serving);
    let node_tokens: Vec<String> = [Some(current), next]
        .into_iter()
        .flatten()
        .map(|credential| {
            state
                .node_tokens
                .token_of(&queue.id, queue.serving, credential)
        })
        .collect();
    let node_tokens: Vec<&str> = node_tokens.iter().map(String::as_str).collect();
    Ok((
        console_token::sign_for_either(&node_tokens, &claims),
        expires,
    ))
}
