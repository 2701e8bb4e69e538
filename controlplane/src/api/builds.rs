//! `/v1/builds` and `/v1/rollouts` (the operator's): node builds published, and rolled across
//! the fleet (`builds.rs`, `rollout.rs`); and `GET /v1/nodes/{id}/builds/SHA256`, where a
//! node fetches the build its desired config names.

use super::extract::{Json, Path, Query};
use super::{ApiError, AppState};
use crate::builds::BuildError;
use crate::model::audit::Target;
use crate::rollout::{Plan, RolloutError};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// The largest build taken: a release `dataplane` is some tens of megabytes.
pub const BUILD_AT_MOST: usize = 512 * 1024 * 1024;

impl From<BuildError> for ApiError {
    fn from(error: BuildError) -> ApiError {
        match error {
            BuildError::NotABuild(reason) => ApiError::BadRequest(reason),
            BuildError::TooLarge(_) => ApiError::PayloadTooLarge,
            BuildError::Cut(_) => ApiError::BadRequest(error.to_string()),
            // The node asks the next replica.
            BuildError::Elsewhere(_) => ApiError::Unavailable(error.to_string()),
            BuildError::Store(error) => error.into(),
            BuildError::Io(reason) => ApiError::Internal(reason),
        }
    }
}

impl From<RolloutError> for ApiError {
    fn from(error: RolloutError) -> ApiError {
        match error {
            RolloutError::Refused(reason) => ApiError::Conflict(reason),
            RolloutError::Busy(..) => ApiError::Conflict(error.to_string()),
            RolloutError::Store(error) => error.into(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Publish {
    /// The operator's name for the build (a version, a commit).
    label: Option<String>,
}

/// `POST /v1/builds[?label=NAME]` with the `dataplane` binary as the body: published (201),
/// by its SHA-256.
pub async fn publish(
    State(state): State<Arc<AppState>>,
    Query(publish): Query<Publish>,
    body: axum::body::Body,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    if let Some(label) = &publish.label {
        if label.is_empty() || label.len() > 100 || label.chars().any(char::is_control) {
            return Err(ApiError::BadRequest(
                "label: 1 to 100 printable characters".into(),
            ));
        }
    }
    let build = state
        .builds
        .publish(&state.store, body, publish.label, BUILD_AT_MOST as u64)
        .await?;
    tracing::info!(build = %build.sha256, size = build.size, "a node build was published");
    let target = Extension(Target {
        id: build.sha256.clone(),
        account: None,
    });
    Ok((StatusCode::CREATED, target, Json(json!(build))))
}

/// `GET /v1/builds`: the installed build and the published ones.
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let installed = state.builds.installed().await;
    let published = state.store.builds().await?;
    Ok(Json(json!({"installed": installed, "builds": published})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRollout {
    binary_sha256: String,
    /// The queue to upgrade first, alone (default: the first by id).
    canary: Option<String>,
    pause_secs: Option<u64>,
    wave_timeout_secs: Option<u64>,
}

/// `POST /v1/rollouts`: rolls a build (published, or the installed one) across every
/// running queue on another build, in waves (201).
pub async fn start(
    State(state): State<Arc<AppState>>,
    Json(start): Json<StartRollout>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let Some(build) = state
        .builds
        .desired(&state.store, &start.binary_sha256)
        .await?
    else {
        return Err(ApiError::NoSuch(format!(
            "no build {:?}: publish it first (POST /v1/builds)",
            start.binary_sha256
        )));
    };
    let pause_secs = start.pause_secs.unwrap_or(crate::rollout::PAUSE_SECS);
    let wave_timeout_secs = start
        .wave_timeout_secs
        .unwrap_or(crate::rollout::WAVE_TIMEOUT_SECS);
    if pause_secs > 86_400 || !(10..=86_400).contains(&wave_timeout_secs) {
        return Err(ApiError::BadRequest(
            "pause_secs: 0 to 86400; wave_timeout_secs: 10 to 86400".into(),
        ));
    }
    let plan = Plan {
        build,
        canary: start.canary,
        pause_secs,
        wave_timeout_secs,
    };
    let rollout = crate::rollout::start(&state.store, &state.builds, plan).await?;
    tracing::info!(rollout = %rollout.id, build = %rollout.build.binary_sha256, queues = rollout.queues.len(), "a rollout started");
    let target = Extension(Target {
        id: rollout.id.clone(),
        account: None,
    });
    Ok((StatusCode::CREATED, target, Json(json!(rollout))))
}

/// `GET /v1/rollouts`: every rollout, newest first.
pub async fn list_rollouts(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let mut rollouts = state.store.rollouts().await?;
    rollouts.reverse();
    Ok(Json(json!({ "rollouts": rollouts })))
}

fn no_rollout(id: &str) -> ApiError {
    ApiError::NoSuch(format!("no rollout {id:?}"))
}

/// `GET /v1/rollouts/{id}`.
pub async fn get(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let rollout = state
        .store
        .rollout(&id)
        .await?
        .ok_or_else(|| no_rollout(&id))?;
    Ok(Json(json!(rollout)))
}

/// `POST /v1/rollouts/{id}/halt`, `/resume` and `/rollback`.
pub async fn act(
    State(state): State<Arc<AppState>>,
    Path((id, action)): Path<(String, String)>,
) -> Result<(Extension<Target>, Json<Value>), ApiError> {
    let target = Extension(Target {
        id: id.clone(),
        account: None,
    });
    let answer = match action.as_str() {
        "halt" => crate::rollout::halt(&state.store, &id)
            .await?
            .map(|rollout| json!(rollout)),
        "resume" => crate::rollout::resume(&state.store, &id)
            .await?
            .map(|rollout| json!(rollout)),
        "rollback" => {
            crate::rollout::roll_back(&state.store, &id)
                .await?
                .map(|(rollout, unknown)| {
                    let mut answer = json!(rollout);
                    answer["left_as_they_run"] = json!(unknown);
                    answer
                })
        }
        _ => return Err(ApiError::NoSuchRoute),
    };
    let answer = answer.ok_or_else(|| no_rollout(&id))?;
    tracing::info!(rollout = %id, %action, "a rollout was acted on");
    Ok((target, Json(answer)))
}

/// `GET /v1/nodes/{id}/builds/{sha256}`: the file of a build, for a node told to run it: the
/// build its desired config names, or the installed one (404 for any other).
pub async fn node_fetch(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<super::nodes::NodeCaller>,
    Path((_id, sha256)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let told = caller
        .queue
        .desired_build
        .as_ref()
        .map(|b| &b.binary_sha256);
    let installed = state.builds.installed().await.map(|b| b.binary_sha256);
    if told != Some(&sha256) && installed.as_ref() != Some(&sha256) {
        return Err(ApiError::NoSuch(format!(
            "no build {sha256:?} for this node"
        )));
    }
    let path = state
        .builds
        .file(&state.store, &sha256)
        .await?
        .ok_or_else(|| ApiError::NoSuch(format!("no build {sha256:?}")))?;
    super::nodes::send_file(&path)
        .await
        .map(IntoResponse::into_response)
}
