//! `GET /v1/audit`: the audit log ([`crate::model::audit`]), oldest first, a page at a time; an
//! account sees only the entries of its own account.

use super::auth::Caller;
use super::extract::{Json, Query};
use super::{ApiError, AppState};
use axum::extract::{Extension, State};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// Entries per page unless `limit` says fewer.
const PAGE_AT_MOST: usize = 1000;
const PAGE_DEFAULT: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// One account's entries (an account's key sees its own whatever this says).
    account: Option<String>,
    /// From this time on (seconds since 1970, included).
    since: Option<u64>,
    /// Before this time (seconds since 1970, excluded).
    until: Option<u64>,
    /// The `next` of the page before.
    after: Option<String>,
    limit: Option<usize>,
}

pub async fn list(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<Value>, ApiError> {
    let account = match (caller.account(), query.account) {
        (Some(own), Some(asked)) if asked != own => {
            return Err(ApiError::NoSuch(format!("no account {asked}")))
        }
        (Some(own), _) => Some(own.to_string()),
        (None, asked) => asked,
    };
    let limit = query.limit.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_AT_MOST).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit {limit}: 1 to {PAGE_AT_MOST}"
        )));
    }
    // Cursors start with the time in milliseconds, 20 digits: times are cursors' prefixes.
    let since = format!("{:020}", query.since.unwrap_or(0).saturating_mul(1000));
    let after = match query.after {
        Some(after) if after > since => after,
        _ => since,
    };
    let until = match query.until {
        Some(until) => format!("{:020}", until.saturating_mul(1000)),
        None => "~".into(), // after every digit
    };
    let entries = state
        .store
        .audit(account.as_deref(), &after, &until, limit)
        .await?;
    let next = match entries.len() == limit {
        true => entries.last().map(|entry| entry.cursor.clone()),
        false => None,
    };
    Ok(Json(json!({ "entries": entries, "next": next })))
}
