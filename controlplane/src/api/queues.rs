//! `/v1/queues`: create, list, get, delete.

use super::{ApiError, AppState};
use crate::fleet::Provider;
use crate::queues::{self, IssuedLogins, NewQueue, Queue, Status};
use crate::store::{Store, StoreError};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use qe_shared::protocol::Role;
use serde_json::{json, Value};
use std::sync::Arc;

/// A queue as the API shows it (never a password).
fn view(state: &AppState, queue: &Queue) -> Value {
    let host = state.zone.host_of(&queue.id);
    json!({
        "id": queue.id,
        "host": host,
        "url": format!("wss://{host}/"),
        "status": queue.status,
        "tier": queue.tier,
        "region": queue.region,
        "instance_type": queue.instance_type,
        "ipv4": queue.ipv4,
        "node": queue.node,
        "addresses": queue.addresses,
    })
}

/// Creates a queue and starts its node; the logins are shown here, once.
pub async fn create(
    State(state): State<Arc<AppState>>,
    body: Result<Json<NewQueue>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Json(new) = body.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let (queue, logins) = provision(&state, new).await?;
    let mut shown = view(&state, &queue);
    shown["logins"] = serde_json::to_value(&logins).expect("strings serialize");
    Ok((StatusCode::CREATED, Json(shown)))
}

/// Records a new queue and starts its node (also used by `controlplane dev`).
pub async fn provision(state: &AppState, new: NewQueue) -> Result<(Queue, IssuedLogins), ApiError> {
    let (mut queue, logins) = queues::create(new);
    state.store.put(&queue)?;
    match state.fleet.start(&queue).await {
        Ok(placement) => {
            queue.status = Status::Running;
            queue.node = Some(placement.node);
            queue.addresses = Some(placement.addresses);
        }
        Err(error) => {
            tracing::error!(queue = %queue.id, %error, "a node did not start");
            queue.status = Status::Failed;
        }
    }
    state.store.put(&queue)?;
    // The name resolves from now on, to where the provider placed the node.
    refresh_zone(state)?;
    Ok((queue, logins))
}

/// Rebuilds the DNS zone from the queues' records.
pub fn refresh_zone(state: &AppState) -> Result<(), StoreError> {
    state.zone.update(&state.store.list()?);
    Ok(())
}

/// At start-up: takes on the node of every queue that was running (adopted, or started again).
pub async fn resume_all(store: &Store, fleet: &dyn Provider) -> Result<(), StoreError> {
    for mut queue in store.list()? {
        if queue.status != Status::Running {
            continue;
        }
        match fleet.resume(&queue).await {
            Ok(placement) => {
                queue.node = Some(placement.node);
                queue.addresses = Some(placement.addresses);
            }
            Err(error) => {
                tracing::error!(queue = %queue.id, %error, "a node could not be resumed");
                queue.status = Status::Failed;
            }
        }
        store.put(&queue)?;
    }
    Ok(())
}

pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let queues: Vec<Value> = state
        .store
        .list()?
        .iter()
        .map(|q| view(&state, q))
        .collect();
    Ok(Json(json!({ "queues": queues })))
}

pub async fn get(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let queue = state.store.get(&id)?.ok_or(ApiError::NotFound(id))?;
    Ok(Json(view(&state, &queue)))
}

/// A new password for one of the queue's logins; the running node takes it without a restart,
/// and open connections go on.
pub async fn rotate(
    State(state): State<Arc<AppState>>,
    Path((id, role)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let role =
        Role::parse(&role).ok_or_else(|| ApiError::NotFound(format!("{id} login {role}")))?;
    let mut queue = state
        .store
        .get(&id)?
        .ok_or_else(|| ApiError::NotFound(id.clone()))?;
    if queue.status != Status::Running {
        return Err(ApiError::Conflict(format!("queue {id} is not running")));
    }
    let credentials = queues::rotate(&mut queue, role);
    state.store.put(&queue)?;
    state
        .fleet
        .reload_logins(&queue)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(
        serde_json::to_value(credentials).expect("strings serialize"),
    ))
}

/// Stops the queue's node; the record stays (its usage is billed from it).
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let mut queue = state
        .store
        .get(&id)?
        .ok_or_else(|| ApiError::NotFound(id.clone()))?;
    queue.status = Status::Deleting;
    state.store.put(&queue)?;
    refresh_zone(&state)?;
    state.fleet.stop(&queue.id).await;
    queue.status = Status::Deleted;
    queue.node = None;
    state.store.put(&queue)?;
    Ok(Json(view(&state, &queue)))
}
