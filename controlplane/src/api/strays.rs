//! `/v1/strays`: what the fleet holds that the store does not know, and its adoption. After a
//! restore from a backup, queues made since are missing from the store while their nodes run
//! on (the reconciler leaves them be: `reconciler.rs`, `remove_orphans`). The operator lists
//! them, and adopts each that can be told enough of: its record comes back from the config
//! its node last took, and its node credential is rotated at once. Nothing is deleted.
//!
//! That config comes from the provider where it can read it (a local node's directory), else
//! from the node itself: a node refused by a restored store reports its kept config to
//! `POST /v1/nodes/{id}/stray` with its credential, which is checked against the node secret
//! (an instance's config is on its volume, out of the control plane's reach).

use super::extract::{Json, Path};
use super::{ApiError, AppState};
use crate::model::audit::Target;
use crate::model::queue::{Queue, Slot};
use axum::extract::{Extension, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use qe_shared::node_channel::DesiredConfig;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a stray node reported of itself, as kept in the store.
#[derive(Serialize, Deserialize)]
pub struct Reported {
    pub queue_id: String,
    /// Which of its queue's credentials it presented (checked against the node secret).
    pub credential: u64,
    /// Which of its queue's machines that credential is for (the second once its standby's
    /// was promoted); the first in a report kept before slots were.
    #[serde(default)]
    pub slot: Slot,
    /// The config it kept: its tier, logins, labels and SQS keys.
    pub desired: DesiredConfig,
    /// When, in milliseconds since 1970.
    pub reported_ms: u64,
}

/// The least time between two checks of a stray's credential, on this replica: a check tries
/// every credential the queue's two machines may have had (twice
/// [`crate::nodes::CREDENTIALS_TRIED`] HMACs), and
/// the route is open to anyone, so they are spaced out: a request waits
/// for its turn, and one that would wait longer than [`WAIT_AT_MOST`] is refused (429). A
/// stray node reports every half minute at most; a refused one tries again later.
const CHECK_EVERY: Duration = Duration::from_millis(20);
const WAIT_AT_MOST: Duration = Duration::from_secs(1);
static NEXT_CHECK: Mutex<Option<Instant>> = Mutex::new(None);

/// Waits for this request's turn to check a credential; `false` when it would wait too long.
async fn turn_to_check() -> bool {
    let turn = {
        let mut next_check = NEXT_CHECK.lock().expect("never poisoned");
        let now = Instant::now();
        let turn = next_check.map_or(now, |next| next.max(now));
        if turn > now + WAIT_AT_MOST {
            return false;
        }
        *next_check = Some(turn + CHECK_EVERY);
        turn
    };
    tokio::time::sleep_until(turn.into()).await;
    true
}

/// Lets a stray node's report through, before its body is read: only to a store restored
/// from a backup, for a queue it does not know, with one of that queue's credentials (the
/// one found goes to the handler).
pub async fn require_stray_credential(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let presented = super::bearer(request.headers()).to_string();
    if state.store.restored().await?.is_none() || presented.is_empty() {
        return Err(super::unauthorized(&presented));
    }
    if state.store.get(&id).await?.is_some() {
        return Err(ApiError::Conflict(format!("queue {id:?} is known")));
    }
    if !turn_to_check().await {
        return Err(ApiError::TooManyRequests(1));
    }
    // Thousands of HMACs (milliseconds): off the runtime's threads.
    let (tokens, queue_id, token) = (state.node_tokens.clone(), id.clone(), presented.clone());
    let found = tokio::task::spawn_blocking(move || tokens.credential_of(&queue_id, &token));
    let credential = found
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?
        .ok_or(super::unauthorized(&presented))?;
    request.extensions_mut().insert(StrayCredential(credential));
    Ok(next.run(request).await)
}

/// The credential [`require_stray_credential`] found: its machine's slot, and its number.
#[derive(Clone, Copy)]
pub struct StrayCredential((Slot, u64));

/// `POST /v1/nodes/{id}/stray` (a node's route): keeps the config a stray node reports,
/// which makes its queue adoptable; `202`.
pub async fn reported(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Extension(StrayCredential((slot, credential))): Extension<StrayCredential>,
    Json(mut desired): Json<DesiredConfig>,
) -> Result<StatusCode, ApiError> {
    // A standby's config names the node it follows: kept, it would make the queue's record
    // say the standby serves. Its queue is adopted from its node's report.
    if desired
        .replication
        .as_ref()
        .is_some_and(|r| r.follow.is_some())
    {
        return Err(ApiError::Conflict(format!(
            "queue {id:?}'s standby reports no stray: its queue is adopted from its node's report"
        )));
    }
    // No secret rests in the store: a credential being rotated in is the node's own, and
    // SQS keys' secrets are derived again from their ids (`nodes.rs`).
    desired.node_token = None;
    for key in desired.sqs.iter_mut().flat_map(|sqs| &mut sqs.keys) {
        key.secret.clear();
    }
    let reported = Reported {
        queue_id: id.clone(),
        credential,
        slot,
        desired,
        reported_ms: crate::live::now_ms(),
    };
    state.store.put_stray(&id, &reported).await?;
    tracing::warn!(queue = %id, ?slot, credential, "the node of a queue this store does not know reported itself: it may be adopted (GET /v1/strays)");
    Ok(StatusCode::ACCEPTED)
}

/// `GET /v1/strays`: the ids of the queues the store does not know that the provider holds
/// something for (a node, a volume, a directory) or whose node reported itself, each with
/// whether it can be adopted.
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let mut ids = state
        .fleet
        .holdings()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    let reported: Vec<Reported> = state.store.strays().await?;
    ids.extend(reported.iter().map(|stray| stray.queue_id.clone()));
    ids.sort();
    ids.dedup();
    let mut strays = Vec::new();
    for id in ids {
        if state.store.get(&id).await?.is_none() {
            let told = reported.iter().any(|stray| stray.queue_id == id);
            let adoptable = told || state.fleet.stray(&id).is_some();
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
    let queue = match state.fleet.stray(&id) {
        Some(stray) => {
            let (slot, credential) = stray
                .node_tokens
                .iter()
                .find_map(|token| state.node_tokens.credential_of(&id, token))
                .ok_or_else(|| {
                    ApiError::Conflict(format!(
                        "queue {id:?}'s node holds no credential of this cluster's node secret"
                    ))
                })?;
            Queue::adopted(&id, &stray.desired, slot, credential)
        }
        None => {
            let reported: Reported = state.store.stray(&id).await?.ok_or_else(not_a_stray)?;
            Queue::adopted(&id, &reported.desired, reported.slot, reported.credential)
        }
    };
    if !state.store.put(&queue).await? {
        return Err(ApiError::Conflict(format!("queue {id:?} is known")));
    }
    tracing::warn!(queue = %id, "adopted a queue the store did not know; its node credential is rotated");
    state.reconcile.notify_one();
    let queue = super::queues::view(&state, &queue);
    Ok((StatusCode::CREATED, target, Json(queue)))
}
