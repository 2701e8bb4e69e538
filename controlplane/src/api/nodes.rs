//! The node channel's control-plane side (`qe_shared::node_channel`): a node, with its own
//! credential, pulls and watches its desired config, says which version it serves, and sends
//! CSRs for its own certificate; with the cluster wildcard (opt-in), it fetches that.

use super::extract::{Json, Path, Query};
use super::{ApiError, AppState};
use crate::certificates::{Issuer, NodeCertificates};
use crate::model::audit::{self, Actor, Entry, Target};
use crate::model::queue::Slot;
use crate::model::queue::{Queue, Status};
use crate::store::StoreError;
use axum::extract::{Extension, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use qe_shared::node_channel::{
    Applied, CertificateRequest, DesiredConfig, DesiredReplication, FollowPrimary,
    IssuedCertificate, NodeTls, TAKES_EPOCH, TAKES_HEADER, TAKES_REPLICATION, TAKES_STEP_DOWN,
    WATCH_HOLD_SECS,
};
use qe_shared::password::PasswordHash;
use serde::Deserialize;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How soon a node may have its certificate issued again, unless asked for a new one.
const REISSUE_AFTER: Duration = Duration::from_secs(3600);

/// Who is calling on a node route: the queue whose node credential the request carries
/// (its record as it was then), and which credential.
#[derive(Clone)]
pub struct NodeCaller {
    pub queue: Queue,
    pub credential: u64,
    /// Which of the queue's machines: the one that serves ([`Queue::serving`]), or its
    /// standby's (which may only read its config and fetch builds).
    pub slot: Slot,
}

/// Lets a request to `/v1/nodes/{id}/…` through only with a credential of queue `id`'s
/// node, before its body is read; the handler gets the [`NodeCaller`].
pub async fn require_node_token(
    State(state): State<Arc<AppState>>,
    Path(params): Path<std::collections::HashMap<String, String>>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // Routes below `/v1/nodes/{id}/` may have more parameters (a build's hash).
    let id = params.get("id").cloned().unwrap_or_default();
    let presented = super::bearer(request.headers());
    let queue = state
        .store
        .get(&id)
        .await?
        .ok_or(super::unauthorized(presented))?;
    let (slot, credential) = match state.node_tokens.check_slot(&queue, presented) {
        Some(found) => found,
        None => rotated_after_the_backup(&state, &queue, presented)
            .await?
            .ok_or(super::unauthorized(presented))?,
    };
    // The machine that does not serve is its standby's (after a promotion, the first).
    if slot != queue.serving && !a_standby_may(&request) {
        return Err(ApiError::Forbidden(
            "a standby's credential only reads its config and fetches builds".into(),
        ));
    }
    // The standby's machine confirms no config: its first use of a rotated credential
    // retires its old one.
    let rotated_in = queue.credential_of(slot).1 == Some(credential);
    let queue = match slot != queue.serving && rotated_in {
        true => {
            let used = state.store.update(&queue.id, |queue| {
                queue.credential_used(slot, credential);
                Ok::<_, StoreError>(())
            });
            used.await?.map(|(queue, ())| queue).unwrap_or(queue)
        }
        false => queue,
    };
    let caller = NodeCaller {
        queue,
        credential,
        slot,
    };
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

/// What the credential of the machine that does not serve may do: read its config and fetch the node's
/// builds. It reports nothing (its node counts the queue's usage, once), confirms no config
/// (the queue's state is its node's) and is issued no certificate (it serves nothing).
fn a_standby_may(request: &Request) -> bool {
    let path = request.uri().path();
    let read = request.method() == axum::http::Method::GET;
    read && (path.ends_with("/config") || path.ends_with("/dataplane") || path.contains("/builds/"))
}

/// On a store restored from a backup, a node may present a credential its queue took after
/// the backup: a later one than its record knows for its machine's slot (an earlier one stays
/// retired). It is that slot's credential from then on. Only someone holding the node secret
/// can make one.
async fn rotated_after_the_backup(
    state: &AppState,
    queue: &Queue,
    presented: &str,
) -> Result<Option<(Slot, u64)>, ApiError> {
    if presented.is_empty() || state.store.restored().await?.is_none() {
        return Ok(None);
    }
    let slots = match queue.replicas == 2 {
        true => &[Slot::First, Slot::Second][..],
        false => &[Slot::First][..],
    };
    let later = |slot: Slot| {
        let known = queue.credential_of(slot).0;
        known + 1..known + 1 + crate::nodes::ROTATIONS_AFTER_A_BACKUP
    };
    let tokens = &state.node_tokens;
    let Some((slot, credential)) = slots.iter().find_map(|&slot| {
        let found = tokens.credential_among(&queue.id, presented, slot, later(slot));
        found.map(|credential| (slot, credential))
    }) else {
        return Ok(None);
    };
    let taken = state.store.update(&queue.id, |queue| {
        queue.credential_taken_after_a_backup(slot, credential);
        Ok::<_, StoreError>(())
    });
    taken.await?;
    tracing::warn!(queue = %queue.id, ?slot, credential, "a node presented a credential rotated after the backup the store was restored from: it is its machine's now");
    Ok(Some((slot, credential)))
}

/// `queue`'s SQS face, where its provider runs one: the listener and the keys not revoked
/// (the queue's own, and its account's), with their secrets (derived here, never stored).
async fn sqs_of(
    state: &AppState,
    queue: &Queue,
) -> Result<Option<qe_shared::node_channel::DesiredSqs>, ApiError> {
    let listen = state
        .fleet
        .sqs_listen(queue)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let Some(listen) = listen else {
        return Ok(None);
    };
    let secret = |key: &crate::model::queue::SqsKeyRecord, secret: String| {
        qe_shared::node_channel::SqsKeySecret {
            access_key_id: key.access_key_id.clone(),
            role: key.role.clone(),
            secret,
        }
    };
    let mut keys: Vec<_> = queue
        .sqs_keys
        .iter()
        .filter(|key| !key.revoked)
        .map(|key| {
            secret(
                key,
                state.node_tokens.sqs_secret(&queue.id, &key.access_key_id),
            )
        })
        .collect();
    let account = match &queue.account {
        Some(id) => state.store.account(id).await?,
        None => None,
    };
    for key in account.iter().flat_map(|account| &account.sqs_keys) {
        if !key.revoked {
            let account = queue.account.as_deref().unwrap_or_default();
            let derived = state
                .node_tokens
                .account_sqs_secret(account, &key.access_key_id);
            keys.push(secret(key, derived));
        }
    }
    // The queues that send their dead letters here, each with its own publisher key.
    keys.extend(crate::api::redrive::source_keys(state, queue));
    Ok(Some(qe_shared::node_channel::DesiredSqs {
        listen: vec![listen],
        keys,
    }))
}

/// What `queue`'s node should be now; `takes`: what its request said it takes.
pub async fn desired_config(
    state: &AppState,
    queue: &Queue,
    takes: NodeTakes,
) -> Result<DesiredConfig, ApiError> {
    desired_config_of(state, queue, takes, queue.serving).await
}

/// What `queue`'s machine in `slot` should be now: its node's config if it serves, else the
/// same with what it follows as the standby ([`DesiredReplication::follow`]).
pub async fn desired_config_of(
    state: &AppState,
    queue: &Queue,
    takes: NodeTakes,
    slot: Slot,
) -> Result<DesiredConfig, ApiError> {
    let listen = state
        .fleet
        .listen(queue)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let tls = match &state.node_certificates {
        NodeCertificates::None => NodeTls::None,
        NodeCertificates::PerQueue(_) => NodeTls::Queue {
            host: state.zone.host_of(&queue.id),
            generation: queue.certificate_generation,
        },
        NodeCertificates::Wildcard { .. } => NodeTls::Cluster {
            generation: queue.certificate_generation,
        },
    };
    let mut desired = queue.desired_config(listen, tls);
    desired.live_stats_secs = state.config.live_stats_secs;
    desired.usage_record_secs = state.config.usage_record_secs;
    desired.stats_record_secs = state.config.stats_record_secs;
    desired.sqs = sqs_of(state, queue).await?;
    desired.redrive = crate::api::redrive::desired(state, queue).await?;
    // A rotation's new credential, of the caller's own slot.
    let next = queue.credential_of(slot).1;
    desired.node_token = next.map(|next| state.node_tokens.token_of(&queue.id, slot, next));
    if queue.replicas == 2 && takes.replication {
        let key = state.node_tokens.replication_key(&queue.id);
        desired.replication = Some(DesiredReplication {
            key_hash: PasswordHash::new(&key).to_string(),
            epoch: takes.epoch.then_some(queue.epoch),
            step_down_after_ms: match takes.step_down {
                true => state
                    .config
                    .step_down_after()
                    .map(|after| after.as_millis() as u64),
                false => None,
            },
            follow: match slot == queue.serving {
                true => None,
                false => Some(follow(state, queue, key)?),
            },
        });
    }
    Ok(desired)
}

/// What `queue`'s standby's machine follows: its node, where the queue's record places it
/// (its name for TLS, its address to connect to), with the key it gives.
fn follow(state: &AppState, queue: &Queue, key: String) -> Result<FollowPrimary, ApiError> {
    let url = queue.node.clone().ok_or_else(|| {
        ApiError::Unavailable("the queue's node is not placed yet: ask again".into())
    })?;
    let port = reqwest::Url::parse(&url)
        .ok()
        .and_then(|url| url.port_or_known_default())
        .unwrap_or(443);
    let connect = queue
        .addresses
        .as_ref()
        .map(|addresses| SocketAddr::new(addresses.v6.into(), port));
    let ca_pem = match &state.node_certificates {
        NodeCertificates::PerQueue(issuer) => match issuer.as_ref() {
            Issuer::LocalCa(ca) => Some(
                std::fs::read_to_string(&ca.root_pem)
                    .map_err(|e| ApiError::Internal(format!("the local CA's root: {e}")))?,
            ),
            Issuer::Acme(_) => None,
        },
        _ => None,
    };
    Ok(FollowPrimary {
        url,
        connect,
        key,
        ca_pem,
    })
}

/// The fields a node's config request says it takes ([`TAKES_HEADER`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeTakes {
    /// [`DesiredConfig::replication`].
    pub replication: bool,
    /// [`DesiredReplication::epoch`].
    pub epoch: bool,
    /// [`DesiredReplication::step_down_after_ms`].
    pub step_down: bool,
}

impl NodeTakes {
    fn of(headers: &HeaderMap) -> NodeTakes {
        let takes = headers
            .get(TAKES_HEADER)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        let said = |field: &str| takes.split(',').any(|what| what.trim() == field);
        NodeTakes {
            replication: said(TAKES_REPLICATION),
            epoch: said(TAKES_EPOCH),
            step_down: said(TAKES_STEP_DOWN),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Watch {
    /// The version the node serves: answer once there is a newer one.
    after: Option<u64>,
}

/// `GET /v1/nodes/{id}/config[?after=V]`: the desired config, at once without `after`;
/// otherwise once its version passes `after`, or `204` after [`WATCH_HOLD_SECS`].
pub async fn config(
    State(state): State<Arc<AppState>>,
    Extension(NodeCaller { queue, slot, .. }): Extension<NodeCaller>,
    Query(watch): Query<Watch>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = queue.id.clone();
    let after = watch.after.unwrap_or(0);
    let queue = match queue.config_version > after || watch.after.is_none() {
        true => queue,
        false => {
            let hold = Duration::from_secs(WATCH_HOLD_SECS);
            let newer =
                |queue: &Queue| queue.config_version > after || queue.status == Status::Deleted;
            match state.store.wait_for(&id, hold, newer).await? {
                Some(queue) if queue.status != Status::Deleted && queue.config_version > after => {
                    queue
                }
                // Its credential went with its queue.
                Some(queue) if queue.status == Status::Deleted => {
                    return Err(ApiError::Unauthorized { token_given: true });
                }
                _ => return Ok(StatusCode::NO_CONTENT.into_response()),
            }
        }
    };
    let takes = NodeTakes::of(&headers);
    Ok(Json(desired_config_of(&state, &queue, takes, slot).await?).into_response())
}

/// `POST /v1/nodes/{id}/applied`: the node serves this version now. A queue whose node
/// reports in for the first time is running; a node that used a credential being rotated in
/// retires the old one.
pub async fn applied(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<NodeCaller>,
    Json(applied): Json<Applied>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let credential = caller.credential;
    let updated = state.store.update(&caller.queue.id, |queue| {
        // Never past what was asked for: a node cannot claim a config it was not given.
        let version = applied.version.min(queue.config_version);
        queue.applied_version = queue.applied_version.max(version);
        // Running once placed too (the reconciler records where; whichever comes second
        // makes it running).
        if queue.status == Status::Provisioning && queue.node.is_some() {
            queue.status = Status::Running;
        }
        // Its first use of a rotated credential retires the old one.
        queue.credential_used(caller.slot, credential);
        if applied.build.is_some() {
            queue.node_build = applied.build.clone();
        }
        queue.refused_build = applied.refused_build.clone();
        // A node now known to take a build is sent the one it is to run (its configs so far
        // left it out).
        if applied.accepts_builds && !queue.node_accepts_builds && queue.desired_build.is_some() {
            queue.config_version += 1;
        }
        queue.node_accepts_builds = applied.accepts_builds;
        // The same for the settings a queue made through SQS starts with.
        let takes = applied.takes_initial_settings;
        if takes && !queue.node_takes_initial_settings && !queue.initial_settings.is_empty() {
            queue.config_version += 1;
        }
        queue.node_takes_initial_settings = takes;
        // And for where its dead letters go.
        if applied.takes_redrive && !queue.node_takes_redrive && queue.has_redrive() {
            queue.config_version += 1;
        }
        queue.node_takes_redrive = applied.takes_redrive;
        // A node that knows standbys and runs without one for a queue that has one got its
        // first config from a replica that did not send the key (one from before standbys,
        // in an upgrade): a new version has it, and the node starts again to take it. Once
        // per start of such a node, not at every confirmation.
        let without = applied.standby == Some(false);
        if queue.replicas == 2 && without && queue.node_standby != Some(false) {
            queue.config_version += 1;
        }
        queue.node_standby = applied.standby;
        Ok::<_, StoreError>(())
    });
    let (queue, ()) = updated
        .await?
        .ok_or(ApiError::Unauthorized { token_given: true })?;
    Ok(Json(json!({"applied": queue.applied_version})))
}

/// `POST /v1/nodes/{id}/redrive`: SQS's `SetQueueAttributes` at the node names another queue
/// of the account as the dead letter target, or sets the `RedriveAllowPolicy`
/// ([`crate::redrive`]): answered with the queue's redrive as it is now, or `400` with SQS's
/// error code (the node answers the SDK with it).
pub async fn redrive(
    State(state): State<Arc<AppState>>,
    Extension(NodeCaller { queue, .. }): Extension<NodeCaller>,
    Json(change): Json<qe_shared::node_channel::RedriveChange>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    match crate::api::redrive::change(&state, &queue, &change).await {
        Ok(changed) => {
            let redrive = crate::api::redrive::redrive_of(&state, &changed).await?;
            Ok(Json(redrive).into_response())
        }
        Err(refused) if refused.status == 400 => {
            let refused = qe_shared::node_channel::RedriveRefused {
                code: refused.code.to_string(),
                message: refused.message,
            };
            Ok((axum::http::StatusCode::BAD_REQUEST, Json(refused)).into_response())
        }
        Err(error) => Err(ApiError::Unavailable(error.message)),
    }
}

/// `POST /v1/nodes/{id}/certificate`: a CSR for the queue's own name, answered with the
/// chain. The name is the node's queue's and no other: one node's credential can never get
/// a certificate for another queue.
pub async fn certificate_for_csr(
    State(state): State<Arc<AppState>>,
    Extension(NodeCaller { queue, .. }): Extension<NodeCaller>,
    Json(request): Json<CertificateRequest>,
) -> Result<Json<IssuedCertificate>, ApiError> {
    let NodeCertificates::PerQueue(issuer) = &state.node_certificates else {
        return Err(ApiError::Conflict(
            "this cluster does not issue certificates per queue".into(),
        ));
    };
    // One replica orders at a time, so the CA sees one order per certificate: the node
    // asks another replica (its channel moves on after a 503). The order's writes are fenced
    // by this leadership, and the order is dropped if it ends meanwhile.
    let not_leading = || {
        ApiError::Unavailable(
            "certificates are ordered by the leading control plane: ask another replica".into(),
        )
    };
    let fence = state.leadership.fence().ok_or_else(not_leading)?;
    let store = state.store.fenced(fence.clone());
    let mut leadership = state.leadership.clone();
    let host = state.zone.host_of(&queue.id);
    let refused = |error| match error {
        crate::certificates::CertificateError::Request(reason) => ApiError::BadRequest(reason),
        other => ApiError::Unavailable(other.to_string()),
    };
    let csr = crate::certificates::checked_request(&host, &request.csr_pem).map_err(refused)?;
    // A CA's rate limits are shared by every queue of the cluster: one node (a compromised
    // one, a loop) may not spend them. Once an hour, unless a new certificate was asked for
    // (a forced renewal; a node that lost its certificate with its disk and was started on
    // its standby's copy, `reconciler.rs`).
    if let Some((generation, at)) = queue.certificate_issued {
        let wait = (at + REISSUE_AFTER.as_secs()).saturating_sub(crate::unix_now());
        if generation == queue.certificate_generation && wait > 0 {
            return Err(ApiError::TooManyRequests(wait));
        }
    }
    tracing::info!(queue = %queue.id, "ordering a node's certificate");
    let order = crate::certificates::issue_for_node(
        issuer,
        &state.zone,
        &store,
        &host,
        &request.csr_pem,
        csr,
    );
    let chain_pem = tokio::select! {
        issued = order => issued.map_err(|error| {
            state.metrics.certificate_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            refused(error)
        })?,
        _ = leadership.lost(&fence) => return Err(not_leading()),
    };
    let issued = (queue.certificate_generation, crate::unix_now());
    let recorded = store.update(&queue.id, |queue| {
        queue.certificate_issuer = Some(issuer.name());
        queue.certificate_issued = Some(issued);
        Ok::<_, StoreError>(())
    });
    recorded.await?;
    tracing::info!(queue = %queue.id, "a node's certificate was issued");
    let target = Target {
        id: queue.id.clone(),
        account: queue.account.clone(),
    };
    let by_node = Actor::Node {
        queue: queue.id.clone(),
    };
    let entry = Entry::new(by_node, audit::CERTIFICATE_ISSUE, target, 200);
    state.store.record_audit(entry).await;
    Ok(Json(IssuedCertificate { chain_pem }))
}

/// `GET /v1/nodes/{id}/certificate`: the cluster's wildcard certificate and key, in the
/// opt-in wildcard mode only (404 until one is issued).
pub async fn cluster_certificate(
    State(state): State<Arc<AppState>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let NodeCertificates::Wildcard { issuer } = &state.node_certificates else {
        return Err(ApiError::NoCertificate);
    };
    match state.store.certificate().await? {
        // One from another CA (before a change of CA) is not handed out: it is being replaced.
        Some(issued) if &issued.issuer == issuer => Ok(Json(
            json!({"chain_pem": issued.chain_pem, "key_pem": issued.key_pem}),
        )),
        _ => Err(ApiError::NoCertificate),
    }
}

/// `GET /v1/nodes/{id}/dataplane`: the `dataplane` binary this control plane runs with, for a
/// cloud node's first boot (which checks it against the SHA-256 its user data carries), so a
/// node needs no other download source: the copy taken when it started, whose hash that is
/// (the configured file when it keeps none: a provider that boots no cloud nodes).
pub async fn dataplane(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let served = state.config.served_dataplane();
    let path = match served.exists() {
        true => served,
        false => state.config.dataplane_binary(),
    };
    send_file(&path).await
}

/// The file at `path` as a response body, streamed.
pub async fn send_file(path: &std::path::Path) -> Result<Response, ApiError> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| ApiError::Internal(format!("{}: {e}", path.display())))?;
    let length = file
        .metadata()
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .len();
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(file));
    let headers = [
        (
            axum::http::header::CONTENT_TYPE,
            "application/octet-stream".to_string(),
        ),
        (axum::http::header::CONTENT_LENGTH, length.to_string()),
    ];
    Ok((headers, body).into_response())
}
