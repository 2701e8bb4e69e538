//! The HTTP API of operators and accounts. Every request carries `Authorization: Bearer
//! TOKEN` (the operator's or an account's API key, `auth.rs`; on `/v1/nodes/{id}/…` the
//! node's) except `/healthz` and `/openapi.json`, and the token is checked before a body is
//! read; every change asked for is audited (`auth.rs`, `audit.rs`). Every error is JSON
//! (`error.rs`), also the router's own and the extractors' (`extract.rs`); the queue routes
//! are in `queues.rs`, accounts and keys in `accounts.rs`, `/metrics` in `metrics.rs`.
//! The web console (`/console/`, [`crate::console`], put beside these routes by
//! [`crate::app`]) signs in with the same tokens and then calls these routes with a session
//! cookie instead (`auth.rs`, [`sessions`]).
//!
//! The SQS wire is a face of this API too: [`sqs`] answers `POST /` (an account's actions,
//! a queue's handed on to its node) and [`redrive`] routes dead letters between an account's
//! queues.

mod accounts;
mod audit;
mod auth;
mod bootstrap;
mod builds;
pub mod csv;
mod error;
mod extract;
pub mod limits;
mod metrics;
pub mod nodes;
pub mod queue_operations;
pub mod queues;
pub mod redrive;
pub mod server;
pub mod sessions;
pub mod sqs;
mod strays;
pub mod tls;
mod usage;

pub use auth::Caller;
pub(crate) use auth::{caller_of, caller_of_grant};
pub use error::{ApiError, CODES};
pub use metrics::Metrics;

use crate::config::Config;
use crate::fleet::Provider;
use crate::model::queue::Queue;
use crate::store::Store;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::Router;
pub(crate) use extract::Json;
use serde_json::json;
use std::sync::Arc;

/// What every request shares.
pub struct AppState {
    pub config: Config,
    pub store: Store,
    pub fleet: Arc<dyn Provider>,
    pub metrics: Metrics,
    /// Checks the tokens nodes report with.
    pub node_tokens: Arc<crate::nodes::NodeTokens>,
    /// The queues' names, as the DNS server answers them.
    pub zone: Arc<crate::dns::Zone>,
    /// How nodes get their certificates.
    pub node_certificates: crate::certificates::NodeCertificates,
    /// Asks for a new cluster wildcard now (`POST /v1/certificate/renew`, wildcard mode).
    pub renew_certificate: Arc<tokio::sync::Notify>,
    /// Wakes the reconciler: a queue was created or deleted.
    pub reconcile: Arc<tokio::sync::Notify>,
    /// Whether this replica leads: only the leader orders certificates.
    pub leadership: crate::leadership::Leadership,
    /// The node builds this replica serves.
    pub builds: Arc<crate::builds::Builds>,
    /// Per-caller limits: request rates, sign-ins, unknown keys (`limits.rs`).
    pub limits: limits::CallerLimits,
    /// The day's SigV4 signing key of each account SQS key that signed lately (`sqs.rs`).
    pub sqs_signing_keys: qe_shared::sqs::sigv4::SigningKeys,
}

impl AppState {
    /// Where `queue`'s SQS face answers: its node's address with the SQS port (https where the
    /// node serves wss); None where its provider runs no SQS face, or before it has a node.
    pub(crate) fn sqs_endpoint(&self, queue: &Queue) -> Result<Option<String>, ApiError> {
        let Some(listen) = self
            .fleet
            .sqs_listen(queue)
            .map_err(|e| ApiError::Internal(e.to_string()))?
        else {
            return Ok(None);
        };
        let Some(node) = &queue.node else {
            return Ok(None);
        };
        let (scheme, rest) = match node.split_once("://") {
            Some(("wss", rest)) => ("https", rest),
            Some((_, rest)) => ("http", rest),
            None => return Ok(None),
        };
        let host_port = rest.trim_end_matches('/');
        let host = host_port
            .rsplit_once(':')
            .map_or(host_port, |(host, _)| host);
        Ok(Some(format!("{scheme}://{host}:{}", listen.port())))
    }
}

/// The API's description, kept beside the code and checked against the router by tests.
const OPENAPI: &str = include_str!("../../openapi.json");

/// The largest request body most routes take: a new queue or a CSR is well under this.
const BODY_AT_MOST: usize = 64 * 1024;
/// A node's report: up to 500 records of each kind (the data plane's batch) at a few hundred
/// bytes each, with room to spare.
const REPORT_AT_MOST: usize = 1024 * 1024;

/// `GET /v1/backup`: every key and value of the state ([`crate::backup`]).
async fn backup(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let node_secret = state.config.node_secret_file();
    let backup = crate::backup::make(&state.store, &node_secret, state.zone.serial())
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], backup).into_response())
}

pub fn router(
    state: Arc<AppState>,
    sessions: Arc<sessions::Sessions>,
    pages: Router<Arc<AppState>>,
) -> Router {
    // The operator's alone: an account's key is refused (403) before anything is read.
    let operator = Router::new()
        .route("/v1/accounts", post(accounts::create).get(accounts::list))
        .route("/v1/accounts/{id}", patch(accounts::change))
        .route(
            "/v1/queues/{id}/node-credential/rotate",
            post(queues::rotate_node_credential),
        )
        .route("/v1/certificate/renew", post(renew_certificates))
        .route("/v1/backup", get(backup))
        .route("/v1/strays", get(strays::list))
        .route("/v1/strays/{id}/adopt", post(strays::adopt))
        // A build's body is streamed to a file, counted against `BUILD_AT_MOST` as it comes
        // (a raw body is not held to the default limit).
        .route("/v1/builds", post(builds::publish).get(builds::list))
        .route(
            "/v1/rollouts",
            post(builds::start).get(builds::list_rollouts),
        )
        .route("/v1/rollouts/{id}", get(builds::get))
        .route("/v1/rollouts/{id}/{action}", post(builds::act))
        .route_layer(middleware::from_fn(auth::operator_only));
    // The operator's, or a scraper's read-only token.
    let metrics = Router::new()
        .route("/metrics", get(metrics::render))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::metrics_reader,
        ));
    // The operator's and the accounts': each account sees its own.
    let callers = Router::new()
        .route("/v1/queues", post(queues::create).get(queues::list))
        .route("/v1/queues/{id}", get(queues::get).delete(queues::delete))
        .route("/v1/queues/{id}/logins/{role}/rotate", post(queues::rotate))
        .route("/v1/queues/{id}/console-token", post(queues::console_token))
        .route(
            "/v1/queues/{id}/sqs-keys",
            post(queues::create_sqs_key).get(queues::list_sqs_keys),
        )
        .route(
            "/v1/queues/{id}/sqs-keys/{key}",
            axum::routing::delete(queues::revoke_sqs_key),
        )
        .route("/v1/usage", get(usage::usage))
        .route("/v1/stats", get(usage::stats))
        .route("/v1/bills", get(usage::bills))
        .route("/v1/invoices", get(usage::invoices))
        .route("/v1/audit", get(audit::list))
        .route("/v1/account", get(accounts::own))
        .route("/v1/accounts/{id}", get(accounts::get))
        .route(
            "/v1/accounts/{id}/keys",
            post(accounts::create_key).get(accounts::list_keys),
        )
        .route(
            "/v1/accounts/{id}/keys/{key}",
            axum::routing::delete(accounts::revoke_key),
        )
        .route(
            "/v1/accounts/{id}/sqs-keys",
            post(accounts::create_sqs_key).get(accounts::list_sqs_keys),
        )
        .route(
            "/v1/accounts/{id}/sqs-keys/{key}",
            axum::routing::delete(accounts::revoke_sqs_key),
        );
    let gate = auth::Gate {
        state: state.clone(),
        sessions: sessions.clone(),
    };
    let authenticated = operator
        .merge(callers)
        .route_layer(middleware::from_fn_with_state(gate, auth::authenticate));
    authenticated
        .merge(metrics)
        .merge(node_routes(&state))
        .merge(open_routes())
        .merge(pages)
        .fallback(|| async { ApiError::NoSuchRoute })
        // Last, so it reaches every route; axum adds the `Allow` header.
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_AT_MOST))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::record,
        ))
        // Outermost: whatever refused a request before its body was read closes the connection.
        .layer(middleware::from_fn(close_unless_body_read))
        .with_state(state)
}

/// The routes nodes call: with their own tokens (checked before the body is read), as a stray
/// its restored store does not know, or with a cloud node's one-time bootstrap token.
fn node_routes(state: &Arc<AppState>) -> Router<Arc<AppState>> {
    // Nodes call with their own tokens, checked before the body is read.
    let node = Router::new()
        .route(
            "/v1/nodes/{id}/reports",
            post(usage::receive).layer(DefaultBodyLimit::max(REPORT_AT_MOST)),
        )
        .route("/v1/nodes/{id}/config", get(nodes::config))
        .route("/v1/nodes/{id}/applied", post(nodes::applied))
        .route("/v1/nodes/{id}/redrive", post(nodes::redrive))
        .route("/v1/nodes/{id}/dataplane", get(nodes::dataplane))
        .route("/v1/nodes/{id}/builds/{sha256}", get(builds::node_fetch))
        .route(
            "/v1/nodes/{id}/certificate",
            get(nodes::cluster_certificate).post(nodes::certificate_for_csr),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            nodes::require_node_token,
        ));
    // A node its restored store does not know: checked against the node secret instead.
    let stray = Router::new()
        .route("/v1/nodes/{id}/stray", post(strays::reported))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            strays::require_stray_credential,
        ));
    // A cloud node's first boot: its one-time bootstrap token is its credential here.
    let bootstrap = Router::new().route("/v1/nodes/{id}/bootstrap", post(bootstrap::exchange));
    node.merge(stray).merge(bootstrap)
}

/// The routes anyone may call: the health check, the SQS wire (signed, checked there) and
/// the API's description.
fn open_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        // SQS's wire: signed with an account's SQS key (checked there before the body is
        // read), and as large as ten of the largest messages.
        .route("/", post(sqs::serve).layer(DefaultBodyLimit::disable()))
        .route(
            "/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
}

/// A reply given before the request's body was read (a missing or wrong token, a role that
/// may not) says `Connection: close` (`qe_serve`): hyper would otherwise reset the
/// connection with the body's bytes unread, and a keep-alive client's next request on it
/// (a POST, which it does not retry) would fail.
async fn close_unless_body_read(
    request: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    let (request, body_read) = qe_serve::track_body(request);
    let mut response = next.run(request.map(axum::body::Body::new)).await;
    qe_serve::close_unless_read(&mut response, &body_read);
    response
}

/// `POST /v1/certificate/renew`: every node gets a new certificate now: of its own (each
/// node sends a new CSR), or, in wildcard mode, the new wildcard once it is issued.
async fn renew_certificates(
    State(state): State<Arc<AppState>>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    match state.node_certificates {
        crate::certificates::NodeCertificates::Wildcard { .. } => {
            state.renew_certificate.notify_one()
        }
        _ => crate::certificates::renew_certificates(&state.store).await?,
    }
    Ok((StatusCode::ACCEPTED, Json(json!({"status": "renewing"}))))
}

/// The token a request presents (`Authorization: Bearer TOKEN`), or "". The scheme's name is
/// case-insensitive (RFC 7235 §2.1), and one or more spaces end it (RFC 6750 §2.1).
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> &str {
    let Some(credentials) = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
    else {
        return "";
    };
    match credentials.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim_start(),
        _ => "",
    }
}

/// The 401 for a request that presented `token` ("" for none).
pub(crate) fn unauthorized(token: &str) -> ApiError {
    ApiError::Unauthorized {
        token_given: !token.is_empty(),
    }
}
