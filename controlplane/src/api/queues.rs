//! `/v1/queues`: create, list, get, rotate a login, delete. Handlers record what the operator
//! wants and read state; the reconciler (`reconciler.rs`) makes it so, and nodes confirm
//! over the channel (`nodes.rs`).

use super::auth::Caller;
use super::extract::{Json, Path, Query};
use super::{ApiError, AppState};
use crate::model::account;
use crate::model::audit::Target;
use crate::model::queue::{self, IssuedLogins, NewQueue, Queue, Status};
use crate::store::StoreError;
use axum::extract::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use qe_shared::protocol::Role;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// How long a rotation waits for the node to confirm it serves the new password.
const CONFIRM_WITHIN: Duration = Duration::from_secs(10);
/// How long a delete waits for the node to be gone (its last usage record reported).
const DELETE_WITHIN: Duration = Duration::from_secs(20);
/// The longest `?until=` wait a request may ask for.
const WAIT_AT_MOST: Duration = Duration::from_secs(120);

/// A queue as the API shows it (never a password).
pub(super) fn view(state: &AppState, queue: &Queue) -> Value {
    let host = state.zone.host_of(&queue.id);
    // The address to connect to: where its node serves (a local node listens on a port of
    // its own, not 443), or, until it runs, the one it will have.
    let url = queue
        .node
        .clone()
        .unwrap_or_else(|| format!("wss://{host}/"));
    json!({
        "id": queue.id,
        "host": host,
        "url": url,
        "status": queue.status,
        "tier": queue.tier,
        "region": queue.region,
        "instance_type": queue.instance_type,
        "ipv4": queue.ipv4,
        "account": queue.account,
        "node": queue.node,
        "addresses": queue.addresses,
        "resources": queue.resources,
        "failure": queue.failure.as_ref().map(|failure| json!({
            "reason": failure.reason,
            "since": failure.since,
        })),
        "config": {
            "version": queue.config_version,
            "applied": queue.applied_version,
            "pending": queue.change_pending(),
        },
        "live": live_numbers(state, queue),
        "node_build": queue.node_build,
        "desired_build": queue.desired_build,
        "refused_build": queue.refused_build,
        "name": queue.name,
        "tags": queue.tags,
    })
}

/// The queue's numbers as its node last reported them to this replica ([`crate::live`]),
/// with how old they are; `null` when there are none fresh (not known, which is not zero).
fn live_numbers(state: &AppState, queue: &Queue) -> Value {
    let fresh_for = crate::live::fresh_for(state.config.live_stats_secs());
    match state.metrics.live.fresh(&queue.id, fresh_for) {
        Some(latest) if queue.status.is_live() => {
            let mut numbers = serde_json::to_value(latest.stats).expect("numbers serialize");
            let age_ms = crate::live::now_ms().saturating_sub(latest.at_ms);
            numbers["age_secs"] = json!(age_ms as f64 / 1000.0);
            numbers
        }
        _ => Value::Null,
    }
}

/// Records a new queue, to be provisioned; returns at once (`provisioning`), with the
/// logins, shown here once.
pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Json(new): Json<NewQueue>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let account = owner(&caller, new.account.clone())?;
    let (queue, logins) = provision(&state, NewQueue { account, ..new }).await?;
    let mut shown = view(&state, &queue);
    shown["logins"] = serde_json::to_value(&logins).expect("strings serialize");
    Ok((StatusCode::CREATED, target(&queue), Json(shown)))
}

/// The account a new queue is for: a key's own (another named is as absent as one that is
/// not there), or the operator's choice.
fn owner(caller: &Caller, asked: Option<String>) -> Result<Option<String>, ApiError> {
    match (caller.account(), asked) {
        (Some(own), None) => Ok(Some(own.to_string())),
        (Some(own), Some(asked)) if asked == own => Ok(Some(asked)),
        (Some(_), Some(asked)) => Err(ApiError::NoSuch(format!("no account {asked}"))),
        (None, asked) => Ok(asked),
    }
}

/// What the audit names as a change's target: the queue, and the account it is of.
fn target(queue: &Queue) -> Extension<Target> {
    Extension(Target {
        id: queue.id.clone(),
        account: queue.account.clone(),
    })
}

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

/// The queues the caller sees: an account's own, or every one for the operator.
pub async fn list(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    let queues: Vec<Value> = state
        .store
        .list()
        .await?
        .iter()
        .filter(|queue| caller.sees(queue))
        .map(|q| view(&state, q))
        .collect();
    Ok(Json(json!({ "queues": queues })))
}

/// Queue `id`, if the caller may see it: another account's is a 404, as one that is not.
pub async fn seen(state: &AppState, caller: &Caller, id: &str) -> Result<Queue, ApiError> {
    match state.store.get(id).await? {
        Some(queue) if caller.sees(&queue) => Ok(queue),
        _ => Err(ApiError::NotFound(id.to_string())),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Until {
    /// Answer once the queue has this status ...
    until: Option<Status>,
    /// ... or after this many seconds (default 30, at most 120).
    within: Option<u64>,
}

/// `GET /v1/queues/{id}[?until=STATUS[&within=SECS]]`: the queue; with `until`, once it has
/// that status (or the time is up: the reply shows where it is).
pub async fn get(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(until): Query<Until>,
) -> Result<Json<Value>, ApiError> {
    let queue = seen(&state, &caller, &id).await?;
    let queue = match until.until {
        None => Some(queue),
        Some(status) => {
            let within = Duration::from_secs(until.within.unwrap_or(30)).min(WAIT_AT_MOST);
            state
                .store
                .wait_for(&id, within, |queue| queue.status == status)
                .await?
        }
    };
    let queue = queue.ok_or(ApiError::NotFound(id))?;
    Ok(Json(view(&state, &queue)))
}

/// `POST /v1/queues/{id}/console-token`: a console token for the queue's node
/// ([`qe_shared::console_token`]), so the web console's page can open a WebSocket to the node
/// and log in as its administrator: `"read"` rights for a read-only key (the node then takes
/// read commands only), `"write"` for a full key or the operator. It lives
/// [`CONSOLE_TOKEN_SECS`] and opens one login. A queue that does not run yet is a `409`.
pub async fn console_token(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<(Extension<Target>, Json<Value>), ApiError> {
    use qe_shared::console_token::{new_jti, sign_for_either, Claims, Rights};
    let queue = seen(&state, &caller, &id).await?;
    if !queue.status.is_live() || queue.node.is_none() {
        return Err(ApiError::Conflict(format!(
            "queue {id} is {:?}: its node does not serve",
            queue.status
        )));
    }
    let rights = match &caller {
        Caller::Account {
            scope: account::Scope::ReadOnly,
            ..
        } => Rights::Read,
        _ => Rights::Write,
    };
    let expires = crate::unix_now() + CONSOLE_TOKEN_SECS;
    let claims = Claims {
        q: queue.id.clone(),
        r: rights,
        exp: expires,
        jti: new_jti(),
    };
    // Signed with the credential the node holds; during a rotation the node may hold either
    // one, so with both. A finished rotation voids tokens of the old one.
    let credentials = [Some(queue.node_credential), queue.next_node_credential];
    let node_tokens: Vec<String> = credentials
        .into_iter()
        .flatten()
        .map(|credential| state.node_tokens.token_for(&queue.id, credential))
        .collect();
    let node_tokens: Vec<&str> = node_tokens.iter().map(String::as_str).collect();
    let token = sign_for_either(&node_tokens, &claims);
    let shown = view(&state, &queue);
    let reply = json!({
        "url": shown["url"],
        "token": token,
        "rights": rights,
        "expires": expires,
    });
    Ok((target(&queue), Json(reply)))
}

/// `POST /v1/queues/{id}/sqs-keys {"role"}`: a new SQS access key of that role (docs/sqs.md),
/// its secret shown only now; sent to the node with the next config (`applied` says whether
/// the node serves it already, as for a login rotation).
pub async fn create_sqs_key(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Json(asked): Json<NewSqsKey>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let target = target(&seen(&state, &caller, &id).await?);
    let role = asked.role()?;
    let access_key_id = new_access_key_id();
    let made = state.store.update(&id, |queue| {
        if !queue.status.is_live() {
            return Err(ApiError::Conflict(format!(
                "queue {id} is {:?}",
                queue.status
            )));
        }
        // Revoked keys are let go first: only the keys in use count.
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
        Ok::<(), ApiError>(())
    });
    let (queue, ()) = made.await?.ok_or_else(|| ApiError::NotFound(id.clone()))?;
    let applied = wait_applied(&state, &queue).await?;
    let endpoint = state.sqs_endpoint(&queue)?;
    let reply = json!({
        "access_key_id": access_key_id,
        "secret": state.node_tokens.sqs_secret(&queue.id, &access_key_id),
        "role": role.name(),
        "queue_url": endpoint.as_ref().map(|e| format!("{e}/{}", queue.id)),
        "endpoint": endpoint,
        "applied": applied,
    });
    Ok((StatusCode::CREATED, target, Json(reply)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSqsKey {
    role: String,
}

impl NewSqsKey {
    pub fn role(&self) -> Result<Role, ApiError> {
        Role::parse(&self.role)
            .ok_or_else(|| ApiError::BadRequest("role is publisher, subscriber or admin".into()))
    }
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

/// `GET /v1/queues/{id}/sqs-keys`: the queue's SQS keys (never their secrets) and its SQS
/// endpoint.
pub async fn list_sqs_keys(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let queue = seen(&state, &caller, &id).await?;
    let keys: Vec<Value> = queue
        .sqs_keys
        .iter()
        .map(|key| {
            json!({
                "access_key_id": key.access_key_id,
                "role": key.role,
                "created": key.created,
                "revoked": key.revoked,
            })
        })
        .collect();
    Ok(Json(json!({
        "endpoint": state.sqs_endpoint(&queue)?,
        "keys": keys,
    })))
}

/// `DELETE /v1/queues/{id}/sqs-keys/{key}`: revokes a key; the node refuses it once it
/// serves the next config (`applied`).
pub async fn revoke_sqs_key(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path((id, key)): Path<(String, String)>,
) -> Result<(Extension<Target>, Json<Value>), ApiError> {
    let target = target(&seen(&state, &caller, &id).await?);
    let revoked = state.store.update(&id, |queue| {
        let found = queue
            .sqs_keys
            .iter_mut()
            .find(|record| record.access_key_id == key && !record.revoked)
            .ok_or_else(|| ApiError::NoSuch(format!("no SQS key {key} on queue {id}")))?;
        found.revoked = true;
        queue.config_version += 1;
        Ok::<(), ApiError>(())
    });
    let (queue, ()) = revoked
        .await?
        .ok_or_else(|| ApiError::NotFound(id.clone()))?;
    let applied = wait_applied(&state, &queue).await?;
    Ok((target, Json(json!({ "revoked": key, "applied": applied }))))
}

/// Whether `queue`'s node serves its config version (or a later one) within
/// [`CONFIRM_WITHIN`].
async fn wait_applied(state: &AppState, queue: &Queue) -> Result<bool, ApiError> {
    let version = queue.config_version;
    let served =
        |queue: &Queue| queue.applied_version >= version || queue.status == Status::Deleted;
    Ok(state
        .store
        .wait_for(&queue.id, CONFIRM_WITHIN, served)
        .await?
        .is_some_and(|queue| queue.applied_version >= version))
}

/// An access key id as AWS's look: 20 capitals and digits, here starting `QE`.
fn new_access_key_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    format!("QE{}", qe_shared::random::drawn_from(ALPHABET, 18))
}

/// How long a console token lives: long enough to open a WebSocket, short enough that one
/// seen by someone else is soon worth nothing.
const CONSOLE_TOKEN_SECS: u64 = 120;

/// A new password for one of the queue's logins. The reply comes once the node serves it
/// (open connections go on); if it does not say so within [`CONFIRM_WITHIN`], the reply is
/// `202` with `"applied":false`, and the queue shows the change pending.
pub async fn rotate(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path((id, role)): Path<(String, String)>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let target = target(&seen(&state, &caller, &id).await?);
    let role =
        Role::parse(&role).ok_or_else(|| ApiError::NotFound(format!("{id} login {role}")))?;
    let rotated = state.store.update(&id, |queue| {
        if !queue.status.is_live() {
            return Err(ApiError::Conflict(format!(
                "queue {id} is {:?}",
                queue.status
            )));
        }
        Ok(queue::rotate(queue, role))
    });
    let rotated = rotated.await?;
    let (queue, credentials) = rotated.ok_or_else(|| ApiError::NotFound(id.clone()))?;
    let confirmed = wait_applied(&state, &queue).await?;
    let mut reply = serde_json::to_value(credentials).expect("strings serialize");
    reply["applied"] = json!(confirmed);
    let status = match confirmed {
        true => StatusCode::OK,
        false => StatusCode::ACCEPTED,
    };
    Ok((status, target, Json(reply)))
}

/// A new credential for the queue's node: sent to it over the channel (authenticated with
/// the old one), which it keeps; its first use retires the old one. `200` with
/// `"applied":true` once that happened, else `202` after [`CONFIRM_WITHIN`] (the old one
/// still works until the node takes the new one).
pub async fn rotate_node_credential(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let target = target(&seen(&state, &Caller::Operator, &id).await?);
    let rotated = state.store.update(&id, |queue| {
        if !queue.status.is_live() {
            return Err(ApiError::Conflict(format!(
                "queue {id} is {:?}",
                queue.status
            )));
        }
        let next = queue
            .next_node_credential
            .unwrap_or(queue.node_credential + 1);
        queue.next_node_credential = Some(next);
        queue.config_version += 1;
        Ok(next)
    });
    let rotated = rotated.await?;
    let (_, next) = rotated.ok_or_else(|| ApiError::NotFound(id.clone()))?;
    let taken = |queue: &Queue| queue.node_credential >= next || queue.status == Status::Deleted;
    let confirmed = state
        .store
        .wait_for(&id, CONFIRM_WITHIN, taken)
        .await?
        .is_some_and(|queue| queue.node_credential >= next);
    let status = match confirmed {
        true => StatusCode::OK,
        false => StatusCode::ACCEPTED,
    };
    Ok((status, target, Json(json!({ "applied": confirmed }))))
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

/// Marks the queue to be deleted; the reconciler removes its node, which reports its last
/// usage record. The reply comes once it is `deleted`, or after [`DELETE_WITHIN`] with
/// `202` and `deleting`. The record stays (its usage is billed from it).
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let target = target(&seen(&state, &caller, &id).await?);
    mark_deleting(&state, &id).await?;
    let deleted = |queue: &Queue| queue.status == Status::Deleted;
    let queue = state
        .store
        .wait_for(&id, DELETE_WITHIN, deleted)
        .await?
        .ok_or_else(|| ApiError::NotFound(id.clone()))?;
    let status = match queue.status {
        Status::Deleted => StatusCode::OK,
        _ => StatusCode::ACCEPTED,
    };
    Ok((status, target, Json(view(&state, &queue))))
}
