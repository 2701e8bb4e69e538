//! The web console at `/console/`: a page of plain HTML, CSS and JavaScript
//! (`controlplane/console/`, built into the binary: no CDN, no build step) that calls the
//! same `/v1` API as everyone else, with a session cookie instead of a bearer token.
//!
//! - The sessions are the API's ([`crate::api::sessions`], kept in memory): `POST
//!   /console/session` exchanges a token for one, `GET` says who is signed in (and the CSRF
//!   token), `DELETE` signs out.
//! - `api/auth.rs` takes the session cookie as a second way in, demanding the session's
//!   `X-CSRF-Token` header on every change, and then acts as the key would: the console
//!   can do nothing its key could not.
//! - Every console response carries a strict Content-Security-Policy (no inline script or
//!   style, nothing from elsewhere, never in a frame) and `nosniff`.

use crate::api::sessions::{self, Grant, Sessions, CSRF_HEADER};
use crate::api::{limits, ApiError, AppState, Caller};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Extension, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// Where everything the page needs comes from: here, and nowhere else; but for the
/// WebSockets to nodes (Messages, DLQ, Settings), which listen on hosts and ports of their
/// own. Over TLS only `wss:` (a secure page may not open `ws:` anyway); a plaintext control
/// plane (local nodes, `controlplane dev`) also `ws:`. Naming each node's origin would need
/// the policy per queue, while the page is one for every queue; the node still takes only a
/// token the control plane signed, so a wider connect-src lets nothing more in.
const CONTENT_SECURITY_POLICY_TLS: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self' wss:; font-src 'self'; \
    object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";
const CONTENT_SECURITY_POLICY_PLAIN: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self' ws: wss:; font-src 'self'; \
    object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The page and what it loads: (path under `/console/`, media type, contents).
const ASSETS: [(&str, &str, &str); 4] = [
    (
        "",
        "text/html; charset=utf-8",
        include_str!("../../console/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../console/style.css"),
    ),
    (
        "icon.svg",
        "image/svg+xml",
        include_str!("../../console/icon.svg"),
    ),
];

/// The console's routes (they need no bearer token: sign-in is one of them).
pub fn router(sessions: Arc<Sessions>) -> Router<Arc<AppState>> {
    let mut router = Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/session", get(who).post(sign_in).delete(sign_out));
    for (path, media_type, contents) in ASSETS {
        let serve = move || async move {
            let headers = [
                (header::CONTENT_TYPE, media_type),
                (header::CACHE_CONTROL, "no-cache"),
            ];
            (headers, contents)
        };
        router = router.route(&format!("/console/{path}"), get(serve));
    }
    let policy = match sessions.secure() {
        true => CONTENT_SECURITY_POLICY_TLS,
        false => CONTENT_SECURITY_POLICY_PLAIN,
    };
    router
        .layer(Extension(sessions))
        .layer(middleware::from_fn(move |request, next| {
            secure_headers(policy, request, next)
        }))
}

/// What every console response carries.
async fn secure_headers(policy: &'static str, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let fixed = [
        (header::CONTENT_SECURITY_POLICY, policy),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    /// An account's API key (`qek_…`) or the operator's token.
    token: String,
}

/// Refuses a sign-in past [`limits::SIGN_INS_PER_MINUTE`] from its source (an IPv4 address or
/// an IPv6 /64), or for its key id when the token names one (`429` with `Retry-After`).
fn within_sign_in_limits(
    state: &AppState,
    peer: Option<std::net::SocketAddr>,
    token: &str,
) -> Result<(), ApiError> {
    let per_sec = limits::SIGN_INS_PER_MINUTE / 60.0;
    let burst = limits::SIGN_INS_PER_MINUTE;
    if let Some(peer) = peer {
        let source = qe_serve::source_of(peer.ip()).to_string();
        let by_source = &state.limits.sign_ins_by_source;
        by_source
            .take(&source, per_sec, burst)
            .map_err(ApiError::TooManyRequests)?;
    }
    if let Some((key_id, _)) = crate::model::account::parse_token(token) {
        let by_key = &state.limits.sign_ins_by_key;
        by_key
            .take(key_id, per_sec, burst)
            .map_err(ApiError::TooManyRequests)?;
    }
    Ok(())
}

/// Console sessions of the operator open at once: past it, its session idle longest ends.
const OPERATOR_SESSIONS_AT_MOST: usize = 100;

/// `POST /console/session {"token"}`: a session for a valid token (its cookie, and who it
/// is with the CSRF token), else 401. A JSON body only (a cross-site form cannot send one
/// without the browser asking first), and from this origin when the browser says where from.
async fn sign_in(
    State(state): State<Arc<AppState>>,
    Extension(sessions): Extension<Arc<Sessions>>,
    peer: Option<Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    crate::api::Json(asked): crate::api::Json<SignIn>,
) -> Result<Response, ApiError> {
    if !same_origin(&headers) {
        return Err(ApiError::Forbidden(
            "sign in from the console's own page".into(),
        ));
    }
    within_sign_in_limits(&state, peer.map(|Extension(peer)| peer.0), &asked.token)?;
    let caller = crate::api::caller_of(&state, &asked.token)
        .await?
        .ok_or(ApiError::Unauthorized { token_given: true })?;
    let (grant, account) = match &caller {
        Caller::Operator => (Grant::Operator, None),
        Caller::Account { key, account, .. } => (Grant::Key(key.clone()), Some(account.clone())),
    };
    // The operator's own sessions count as one account's.
    let at_most = match &account {
        Some(id) => state
            .store
            .account(id)
            .await?
            .map_or(1, |account| account.limits.max_console_sessions as usize),
        None => OPERATOR_SESSIONS_AT_MOST,
    };
    let (id, csrf) = sessions
        .open(grant, account.as_deref(), at_most)
        .ok_or_else(|| ApiError::Unavailable("too many console sessions are open now".into()))?;
    tracing::info!(caller = ?caller_json(&caller), "a console session was opened");
    let mut response = Json(signed_in(&caller, &csrf)).into_response();
    set_cookie(&mut response, &sessions.cookie(&id));
    Ok(response)
}

/// `GET /console/session`: who is signed in, with the session's CSRF token;
/// `{"caller":null}` without a session (so the page's first look is not an error).
async fn who(
    State(state): State<Arc<AppState>>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let found = sessions.id_in(&headers).and_then(|id| sessions.find(id));
    let caller = match &found {
        Some(found) => crate::api::caller_of_grant(&state, &found.grant).await?,
        None => None,
    };
    let mut response = match (caller, found) {
        (Some(caller), Some(found)) => Json(signed_in(&caller, &found.csrf)).into_response(),
        _ => Json(json!({ "caller": null })).into_response(),
    };
    no_store(&mut response);
    Ok(response)
}

/// `DELETE /console/session` (with its CSRF token): ends the session; the cookie is then
/// refused everywhere.
async fn sign_out(
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = sessions
        .id_in(&headers)
        .ok_or(ApiError::Unauthorized { token_given: false })?;
    let found = sessions
        .find(id)
        .ok_or(ApiError::Unauthorized { token_given: true })?;
    let presented = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    if !found.csrf_matches(presented) {
        return Err(sessions::csrf_refused());
    }
    sessions.close(id);
    let mut response = StatusCode::NO_CONTENT.into_response();
    set_cookie(&mut response, &sessions.expired_cookie());
    Ok(response)
}

/// Whether the request came from this origin, when the browser names one (`Origin`'s host
/// and port against `Host`); a request that names none (not a browser's) passes.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest.trim_end_matches('/'));
    matches!((origin_host, host), (Some(a), Some(b)) if a.eq_ignore_ascii_case(b))
}

fn signed_in(caller: &Caller, csrf: &str) -> Value {
    json!({ "caller": caller_json(caller), "csrf": csrf })
}

fn caller_json(caller: &Caller) -> Value {
    match caller {
        Caller::Operator => json!({"kind": "operator"}),
        Caller::Account {
            account,
            key,
            scope,
        } => json!({"kind": "account", "account": account, "key": key, "scope": scope}),
    }
}

fn set_cookie(response: &mut Response, cookie: &str) {
    let value = HeaderValue::from_str(cookie).expect("a cookie of base64url and ASCII");
    response.headers_mut().insert(header::SET_COOKIE, value);
    no_store(response);
}

fn no_store(response: &mut Response) {
    let value = HeaderValue::from_static("no-store");
    response.headers_mut().insert(header::CACHE_CONTROL, value);
}

use axum::Json;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_browser_named_origin_must_be_this_host() {
        let mut headers = HeaderMap::new();
        assert!(same_origin(&headers), "not a browser's request");
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8443"));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8443"),
        );
        assert!(same_origin(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&headers));
        headers.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&headers));
    }
}
