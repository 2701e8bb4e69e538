//! Who is calling: the operator (its token) or an account (one of its API keys), checked
//! before a body is read; and the audit of every change a caller asks for.
//!
//! - An account's key sees only its account's queues: another account's queue is a `404`,
//!   as if there were none, so a key cannot learn which ids exist.
//! - A read-only key is refused (`403`) any method but `GET` and `HEAD`, before the handler;
//!   but for a console token, which then has read rights only.
//! - Routes only the operator may use ([`operator_only`]) refuse an account's key with
//!   `403` before they read anything, so that answer says nothing of what exists.
//! - Without a bearer token, the web console's session cookie is taken instead
//!   ([`crate::console`]): the caller is the one its sign-in found, checked again now (a key
//!   revoked since is refused), and a change must carry the session's `X-CSRF-Token`.

use super::sessions::{self, Grant, Sessions};
use super::{bearer, unauthorized, ApiError, AppState};
use crate::model::account::{self, Scope};
use crate::model::audit::{self, Actor, Entry, Target};
use crate::model::queue::Queue;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The caller of a request, for its handler (a request extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Operator,
    Account {
        account: String,
        key: String,
        scope: Scope,
    },
}

impl Caller {
    /// The account whose things alone it sees; `None` for the operator, who sees all.
    pub fn account(&self) -> Option<&str> {
        match self {
            Caller::Operator => None,
            Caller::Account { account, .. } => Some(account),
        }
    }

    /// Whether it may see `queue`.
    pub fn sees(&self, queue: &Queue) -> bool {
        match self.account() {
            None => true,
            Some(account) => queue.account.as_deref() == Some(account),
        }
    }

    /// Whether it may see account `id`'s things.
    pub fn sees_account(&self, id: &str) -> bool {
        self.account().is_none_or(|account| account == id)
    }

    fn actor(&self) -> Actor {
        match self {
            Caller::Operator => Actor::Operator,
            Caller::Account { account, key, .. } => Actor::Account {
                account: account.clone(),
                key: key.clone(),
            },
        }
    }
}

/// What the authentication of a request needs: the state, and the console's sessions.
#[derive(Clone)]
pub struct Gate {
    pub state: Arc<AppState>,
    pub sessions: Arc<Sessions>,
}

/// Finds the caller (by its bearer token, else by a console session), refuses what its key
/// may not do, runs the request, and audits it if it asked for a change.
pub async fn authenticate(
    State(Gate { state, sessions }): State<Gate>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let presented = bearer(request.headers());
    let session = match presented.is_empty() {
        true => sessions.id_in(request.headers()),
        false => None,
    };
    let caller = match session {
        // A forged cross-site change is refused before anything is read or audited: it
        // carries the cookie but not the token only the console's own page can read.
        Some(id) => {
            let found = sessions
                .find(id)
                .ok_or(ApiError::Unauthorized { token_given: true })?;
            let csrf = request
                .headers()
                .get(sessions::CSRF_HEADER)
                .and_then(|value| value.to_str().ok());
            if sessions::is_change(request.method()) && !found.csrf_matches(csrf) {
                return Err(sessions::csrf_refused());
            }
            caller_of_grant(&state, &found.grant)
                .await?
                .ok_or(ApiError::Unauthorized { token_given: true })?
        }
        None => caller_of(&state, presented)
            .await?
            .ok_or_else(|| unauthorized(presented))?,
    };
    within_rate(&state, &caller).await?;
    let method = request.method().as_str().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_string())
        .unwrap_or_default();
    let action = audit::action_of(&method, &route);
    let path_target = path_target(request.uri().path());
    let read_only = matches!(
        caller,
        Caller::Account {
            scope: Scope::ReadOnly,
            ..
        }
    );
    let response = match (read_only, action) {
        (true, Some(action)) if action != audit::CONSOLE_TOKEN => {
            Err(ApiError::Forbidden("this key is read-only".into()))
        }
        _ => {
            request.extensions_mut().insert(caller.clone());
            Ok(next.run(request).await)
        }
    };
    if let Some(action) = action {
        let (status, target) = match &response {
            Ok(response) => (
                response.status().as_u16(),
                response.extensions().get::<Target>().cloned(),
            ),
            Err(error) => (error.status().as_u16(), None),
        };
        let target = target.unwrap_or(Target {
            id: path_target,
            account: None,
        });
        // A refusal is counted, not kept: a caller that is refused in a loop cannot grow
        // the store (the audit log keeps what was done, and what failed on our side).
        if (400..500).contains(&status) {
            state
                .metrics
                .refused_changes
                .fetch_add(1, Ordering::Relaxed);
        } else {
            let entry = Entry::new(caller.actor(), action, target, status);
            state.store.record_audit(entry).await;
        }
    }
    response
}

/// Refuses a request of an account's key past its account's `api_requests_per_second` at this
/// replica (`429` with `Retry-After`); the operator has no limit.
async fn within_rate(state: &AppState, caller: &Caller) -> Result<(), ApiError> {
    let Caller::Account { account, key, .. } = caller else {
        return Ok(());
    };
    let limits = &state.limits;
    let rate = match limits.rates.known(account) {
        Some(rate) => rate,
        None => {
            let read = state.store.account(account).await?;
            let rate = read.map_or(1, |account| account.limits.api_requests_per_second);
            limits.rates.keep(account, rate);
            rate
        }
    };
    let rate = f64::from(rate.max(1));
    limits
        .requests
        .take(key, rate, 2.0 * rate)
        .map_err(ApiError::TooManyRequests)
}

/// The last id in a path (`/v1/queues/ID/logins/publisher/rotate` → `ID`): what most routes
/// act on, when the handler names nothing more precise.
fn path_target(path: &str) -> String {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["v1", "queues", id, ..] => id.to_string(),
        ["v1", "accounts", _, "keys", key] => key.to_string(),
        ["v1", "accounts", id, ..] => id.to_string(),
        _ => String::new(),
    }
}

/// The operator for its token (compared in constant time), an account for one of its valid
/// keys, else `None`.
pub(crate) async fn caller_of(
    state: &AppState,
    presented: &str,
) -> Result<Option<Caller>, ApiError> {
    let expected = state.config.token.as_bytes();
    let is_operator: bool = presented.as_bytes().ct_eq(expected).into();
    if is_operator && !expected.is_empty() {
        return Ok(Some(Caller::Operator));
    }
    let Some((id, secret)) = account::parse_token(presented) else {
        return Ok(None);
    };
    // A made-up key id costs one store read a minute, however often it is presented.
    if state.limits.unknown_keys.knows_unknown(id) {
        return Ok(None);
    }
    let Some(key) = state.store.key(id).await? else {
        state.limits.unknown_keys.remember(id);
        return Ok(None);
    };
    let valid = account::secret_matches(&key, secret) && key.is_valid_at(crate::unix_now());
    Ok(valid.then_some(Caller::Account {
        account: key.account,
        key: key.id,
        scope: key.scope,
    }))
}

/// The caller a console session's grant stands for now: `None` once its key is revoked or
/// expired (or the operator's token is unset).
pub(crate) async fn caller_of_grant(
    state: &AppState,
    grant: &Grant,
) -> Result<Option<Caller>, ApiError> {
    match grant {
        Grant::Operator => Ok((!state.config.token.is_empty()).then_some(Caller::Operator)),
        Grant::Key(id) => {
            let Some(key) = state.store.key(id).await? else {
                return Ok(None);
            };
            Ok(key
                .is_valid_at(crate::unix_now())
                .then_some(Caller::Account {
                    account: key.account,
                    key: key.id,
                    scope: key.scope,
                }))
        }
    }
}

/// Lets only the operator through.
/// Lets `/metrics` through with the operator's token or the read-only `metrics_token` (what
/// Prometheus holds: it reads the metrics and nothing else). An account's key is refused as on
/// every operator route (403); anything else is not a token (401).
pub async fn metrics_reader(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let presented = bearer(request.headers());
    let matches = |expected: &str| -> bool {
        let same: bool = presented.as_bytes().ct_eq(expected.as_bytes()).into();
        same && !expected.is_empty()
    };
    let scraper = state.config.metrics_token.as_deref().is_some_and(matches);
    if matches(&state.config.token) || scraper {
        return Ok(next.run(request).await);
    }
    match caller_of(&state, presented).await? {
        Some(_) => Err(ApiError::Forbidden(
            "only the operator's token or the metrics token reads the metrics".into(),
        )),
        None => Err(unauthorized(presented)),
    }
}

pub async fn operator_only(request: Request, next: Next) -> Result<Response, ApiError> {
    match request.extensions().get::<Caller>() {
        Some(Caller::Operator) => Ok(next.run(request).await),
        _ => Err(ApiError::Forbidden(
            "only the operator may use this route".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changes_target_is_the_id_its_path_names() {
        assert_eq!(path_target("/v1/queues/abc/logins/admin/rotate"), "abc");
        assert_eq!(path_target("/v1/accounts/aone/keys/kkk"), "kkk");
        assert_eq!(path_target("/v1/accounts/aone"), "aone");
        assert_eq!(path_target("/v1/certificate/renew"), "");
    }
}
