//! `/v1/queues`: create, list, get, rotate a login, delete. Handlers record what the operator
//! wants and read state; the reconciler (`reconciler.rs`) makes it so, and nodes confirm
//! over the channel (`nodes.rs`). What is done to a queue apart from answering HTTP (made,
//! deleted, its node waited for) is in [`super::queue_operations`].

use super::auth::Caller;
use super::extract::{Json, Path, Query};
use super::{ApiError, AppState};
use crate::model::account;
use crate::model::audit::Target;
use crate::model::queue::{NewQueue, Queue, Status};
use axum::extract::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use qe_shared::protocol::Role;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

use super::queue_operations::{self, mark_deleting, provision};
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
        "replicas": queue.replicas,
        "node_standby": queue.node_standby,
        "epoch": queue.epoch,
        "serving": queue.serving,
        "standby_in_sync": queue.standby_in_sync,
        "standby_absent_since": queue.standby_absent_since_ms.map(|ms| ms / 1000),
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
/// [`queue_operations::CONSOLE_TOKEN_SECS`] and opens one login. A queue that does not run yet
/// is a `409`.
pub async fn console_token(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<(Extension<Target>, Json<Value>), ApiError> {
    use qe_shared::console_token::Rights;
    let queue = seen(&state, &caller, &id).await?;
    let rights = match &caller {
        Caller::Account {
            scope: account::Scope::ReadOnly,
            ..
        } => Rights::Read,
        _ => Rights::Write,
    };
    let (token, expires) = queue_operations::console_token(&state, &queue, rights)?;
    let reply = json!({
        "url": view(&state, &queue)["url"],
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
    let made = queue_operations::add_sqs_key(&state, &id, role).await?;
    let endpoint = state.sqs_endpoint(&made.queue)?;
    let reply = json!({
        "access_key_id": made.access_key_id,
        "secret": made.secret,
        "role": role.name(),
        "queue_url": endpoint.as_ref().map(|e| format!("{e}/{}", made.queue.id)),
        "endpoint": endpoint,
        "applied": made.applied,
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
    let applied = queue_operations::revoke_sqs_key(&state, &id, &key).await?;
    Ok((target, Json(json!({ "revoked": key, "applied": applied }))))
}

/// A new password for one of the queue's logins. The reply comes once the node serves it
/// (open connections go on); if it does not say so within
/// [`queue_operations::CONFIRM_WITHIN`], the reply is `202` with `"applied":false`, and the
/// queue shows the change pending.
pub async fn rotate(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path((id, role)): Path<(String, String)>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let target = target(&seen(&state, &caller, &id).await?);
    let role =
        Role::parse(&role).ok_or_else(|| ApiError::NotFound(format!("{id} login {role}")))?;
    let (credentials, applied) = queue_operations::rotate_login(&state, &id, role).await?;
    let mut reply = serde_json::to_value(credentials).expect("strings serialize");
    reply["applied"] = json!(applied);
    Ok((applied_or_accepted(applied), target, Json(reply)))
}

/// A new credential for the queue's node (operator only). `200` with `"applied":true` once
/// the node took it, else `202` after [`queue_operations::CONFIRM_WITHIN`] (the old one still
/// works until the node takes the new one).
pub async fn rotate_node_credential(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let target = target(&seen(&state, &Caller::Operator, &id).await?);
    let applied = queue_operations::rotate_node_credential(&state, &id).await?;
    Ok((
        applied_or_accepted(applied),
        target,
        Json(json!({ "applied": applied })),
    ))
}

/// `200` for a change the node serves, `202` for one it does not yet.
fn applied_or_accepted(applied: bool) -> StatusCode {
    match applied {
        true => StatusCode::OK,
        false => StatusCode::ACCEPTED,
    }
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
