//! `/v1/strays`: what the fleet holds that the store does not know, and its adoption. After a
//! restore from a backup, queues made since are missing from the store while their nodes run
//! on (the reconciler leaves them be: `reconciler.rs`, `remove_orphans`). The operator lists
//! them, and adopts each the provider can tell enough of: its record comes back from the
//! config its node last took, and its node credential is rotated at once. Nothing is deleted.

use super::extract::{Json, Path};
use super::{ApiError, AppState};
use crate::audit::Target;
use crate::queues::Queue;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;

/// `GET /v1/strays`: the ids of the queues the provider holds something for (a node, a
/// volume, a directory) that the store does not know, each with whether it can be adopted.
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let held = state
        .fleet
        .holdings()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    let mut strays = Vec::new();
    for id in held {
        if state.store.get(&id).await?.is_none() {
            let adoptable = state.fleet.stray(&id).is_some();
            strays.push(json!({"id": id, "adoptable": adoptable}));
        }
    }
    Ok(Json(json!({ "strays": strays })))
}

/// `POST /v1/strays/{id}/adopt`: queue `id`'s record rebuilt from what its node kept
/// ([`Queue::adopted`]), `201` with the queue; its node is handed a fresh credential over the
/// channel. `404` for a queue the provider cannot tell of, `409` for one the store knows.
pub async fn adopt(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let target = Extension(Target {
        id: id.clone(),
        account: None,
    });
    let not_a_stray = || ApiError::NotFound(format!("no node of a queue {id:?} to adopt"));
    if state.store.get(&id).await?.is_some() {
        return Err(ApiError::Conflict(format!("queue {id:?} is known")));
    }
    let stray = state.fleet.stray(&id).ok_or_else(not_a_stray)?;
    let credential = stray
        .node_tokens
        .iter()
        .find_map(|token| state.node_tokens.credential_of(&id, token))
        .ok_or_else(|| {
            ApiError::Conflict(format!(
                "queue {id:?}'s node holds no credential of this cluster's node secret"
            ))
        })?;
    let queue = Queue::adopted(&id, &stray.desired, credential);
    if !state.store.put(&queue).await? {
        return Err(ApiError::Conflict(format!("queue {id:?} is known")));
    }
    tracing::warn!(queue = %id, "adopted a queue the store did not know; its node credential is rotated");
    state.reconcile.notify_one();
    let queue = super::queues::view(&state, &queue);
    Ok((StatusCode::CREATED, target, Json(queue)))
}
