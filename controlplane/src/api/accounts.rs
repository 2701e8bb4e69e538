//! `/v1/accounts`: the operator makes accounts and sets their limits; an account (or the
//! operator for it) makes, lists and revokes its API keys. `/v1/account` is the caller's own.

use super::auth::Caller;
use super::extract::{Json, Path};
use super::queue_operations;
use super::{ApiError, AppState};
use crate::model::account::{self, Account, AccountChange, ApiKey, NewAccount, NewKey};
use crate::model::audit::Target;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;

fn view(account: &Account) -> Value {
    json!({
        "id": account.id,
        "name": account.name,
        "created": account.created,
        "limits": account.limits,
    })
}

fn key_view(key: &ApiKey) -> Value {
    json!({
        "id": key.id,
        "account": key.account,
        "name": key.name,
        "scope": key.scope,
        "created": key.created,
        "expires": key.expires,
        "revoked": key.revoked,
    })
}

fn target(id: &str, account: &str) -> Extension<Target> {
    Extension(Target {
        id: id.to_string(),
        account: Some(account.to_string()),
    })
}

/// `POST /v1/accounts` (operator).
pub async fn create(
    State(state): State<Arc<AppState>>,
    Json(new): Json<NewAccount>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    account::check_name(&new.name).map_err(ApiError::BadRequest)?;
    if let Some(limits) = &new.limits {
        account::check_limits(limits).map_err(ApiError::BadRequest)?;
    }
    let account = account::create(new);
    if !state.store.put_account(&account).await? {
        return Err(ApiError::Conflict(
            "that account id is taken: try again".into(),
        ));
    }
    let target = target(&account.id, &account.id);
    Ok((StatusCode::CREATED, target, Json(view(&account))))
}

/// `GET /v1/accounts` (operator).
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let accounts: Vec<Value> = state.store.accounts().await?.iter().map(view).collect();
    Ok(Json(json!({ "accounts": accounts })))
}

/// The account `id`, if the caller may see it (another's is as absent as one that is not).
async fn seen(state: &AppState, caller: &Caller, id: &str) -> Result<Account, ApiError> {
    let missing = || ApiError::NoSuch(format!("no account {id}"));
    if !caller.sees_account(id) {
        return Err(missing());
    }
    state.store.account(id).await?.ok_or_else(missing)
}

/// `GET /v1/accounts/{id}`.
pub async fn get(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(view(&seen(&state, &caller, &id).await?)))
}

/// `GET /v1/account`: the caller's own account.
pub async fn own(
    state: State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    match caller.account() {
        Some(id) => get(state, Extension(caller.clone()), Path(id.to_string())).await,
        None => Err(ApiError::NoSuch(
            "the operator's token belongs to no account".into(),
        )),
    }
}

/// `PATCH /v1/accounts/{id}` (operator): a new name or new limits. Lowered limits refuse new
/// queues; the queues there are stay.
pub async fn change(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Json(change): Json<AccountChange>,
) -> Result<(Extension<Target>, Json<Value>), ApiError> {
    if let Some(name) = &change.name {
        account::check_name(name).map_err(ApiError::BadRequest)?;
    }
    if let Some(limits) = &change.limits {
        account::check_limits(limits).map_err(ApiError::BadRequest)?;
    }
    let changed = state.store.update_account(&id, |account| {
        if let Some(name) = &change.name {
            account.name = name.clone();
        }
        if let Some(limits) = &change.limits {
            account.limits = limits.clone();
        }
        Ok::<_, ApiError>(())
    });
    let (account, ()) = changed
        .await?
        .ok_or_else(|| ApiError::NoSuch(format!("no account {id}")))?;
    Ok((target(&id, &id), Json(view(&account))))
}

/// `POST /v1/accounts/{id}/keys`: a new key; its token is in this reply only.
pub async fn create_key(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Json(new): Json<NewKey>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let account = seen(&state, &caller, &id).await?;
    let (key, token) = account::issue_key(&account.id, new).map_err(ApiError::BadRequest)?;
    within_key_limit(&state, &account).await?;
    state.store.put_key(&key).await?;
    let mut shown = key_view(&key);
    shown["token"] = json!(token);
    Ok((StatusCode::CREATED, target(&key.id, &id), Json(shown)))
}

/// Refuses a key past the account's `max_api_keys`, once its revoked keys are let go.
/// (Two keys made at once may pass it by one: the limit bounds a loop, not a race.)
async fn within_key_limit(state: &AppState, account: &account::Account) -> Result<(), ApiError> {
    let most = account.limits.max_api_keys as usize;
    let mut keys = state.store.keys_of(&account.id).await?;
    if keys.len() >= most {
        for revoked in keys.iter().filter(|key| key.revoked.is_some()) {
            state.store.drop_revoked_key(revoked).await?;
        }
        keys.retain(|key| key.revoked.is_none());
    }
    match keys.len() >= most {
        true => Err(ApiError::LimitReached(format!(
            "account {} has {} API keys, its max_api_keys",
            account.id,
            keys.len()
        ))),
        false => Ok(()),
    }
}

/// `GET /v1/accounts/{id}/keys`: never a secret.
pub async fn list_keys(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let account = seen(&state, &caller, &id).await?;
    let keys: Vec<Value> = state
        .store
        .keys_of(&account.id)
        .await?
        .iter()
        .map(key_view)
        .collect();
    Ok(Json(json!({ "keys": keys })))
}

/// `DELETE /v1/accounts/{id}/keys/{key}`: refused from now on; the record stays, revoked.
pub async fn revoke_key(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<(Extension<Target>, Json<Value>), ApiError> {
    let account = seen(&state, &caller, &id).await?;
    let missing = || ApiError::NoSuch(format!("no key {key_id} in account {id}"));
    let revoked = state.store.update_key(&key_id, |key| {
        if key.account != account.id {
            return Err(missing());
        }
        key.revoked.get_or_insert(crate::unix_now());
        Ok(())
    });
    let (key, ()) = revoked.await?.ok_or_else(missing)?;
    Ok((target(&key.id, &id), Json(key_view(&key))))
}

/// `POST /v1/accounts/{id}/sqs-keys {"role"}`: a new SQS access key of the account
/// (docs/sqs.md, *The account's endpoint*): it signs requests to the control plane's SQS
/// endpoint and to every queue of the account, in that role (an admin key may also make,
/// tag and delete queues). Its secret is shown only now. Every queue's node gets it with its
/// next config; `applied` says whether all of them served it within a few seconds.
pub async fn create_sqs_key(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Json(asked): Json<super::queues::NewSqsKey>,
) -> Result<(StatusCode, Extension<Target>, Json<Value>), ApiError> {
    let account = seen(&state, &caller, &id).await?;
    let role = asked.role()?;
    let made = queue_operations::add_account_sqs_key(&state, &account.id, role).await?;
    let reply = json!({
        "access_key_id": made.access_key_id,
        "secret": made.secret,
        "role": role.name(),
        "endpoint": crate::api::sqs::endpoint(&state.config),
        "applied": made.applied,
    });
    Ok((
        StatusCode::CREATED,
        target(&made.access_key_id, &id),
        Json(reply),
    ))
}

/// `GET /v1/accounts/{id}/sqs-keys`: never a secret.
pub async fn list_sqs_keys(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let account = seen(&state, &caller, &id).await?;
    Ok(Json(json!({
        "endpoint": crate::api::sqs::endpoint(&state.config),
        "keys": account.sqs_keys,
    })))
}

/// `DELETE /v1/accounts/{id}/sqs-keys/{key}`: refused by the control plane at once, and by
/// each node once it serves its next config (`applied`).
pub async fn revoke_sqs_key(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path((id, key)): Path<(String, String)>,
) -> Result<(Extension<Target>, Json<Value>), ApiError> {
    let account = seen(&state, &caller, &id).await?;
    let applied = queue_operations::revoke_account_sqs_key(&state, &account.id, &key).await?;
    Ok((
        target(&key, &id),
        Json(json!({ "revoked": key, "applied": applied })),
    ))
}
