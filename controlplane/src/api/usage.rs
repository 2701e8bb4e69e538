//! What nodes report (`POST /v1/nodes/{id}/reports`, with the node's token) and what the
//! operator reads from it: `GET /v1/usage`, `GET /v1/stats` and `GET /v1/bills`, as JSON or
//! CSV.

use super::{ApiError, AppState};
use crate::queues::Queue;
use crate::store::Report;
use crate::usage::{
    self, UsageRecord, BILL_CSV_HEADER, STATS_COLUMNS, STATS_CSV_HEADER, USAGE_CSV_HEADER,
};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A node's report: new lines of its history, in the manual's `getusage`/`getstats` form.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeReport {
    #[serde(default)]
    usage: Vec<String>,
    #[serde(default)]
    stats: Vec<String>,
    /// The node is stopping and this is its last report.
    #[serde(default, rename = "final")]
    last: bool,
}

pub async fn receive(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<NodeReport>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    super::nodes::check_node(&state, &id, &headers).await?;
    let Json(report) = body.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let bad = |line: &str| ApiError::BadRequest(format!("not a record: {line:?}"));
    let usage = report
        .usage
        .iter()
        .map(|line| {
            Ok((
                UsageRecord::parse(line).ok_or_else(|| bad(line))?.time,
                line.clone(),
            ))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let stats = report
        .stats
        .iter()
        .map(|line| {
            Ok((
                usage::is_stats_line(line).ok_or_else(|| bad(line))?,
                line.clone(),
            ))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    state.store.put_reports(&id, Report::Usage, &usage)?;
    state.store.put_reports(&id, Report::Stats, &stats)?;
    if report.last {
        state.store.update(&id, |queue| {
            queue.last_report = Some(crate::unix_now());
            Ok::<_, crate::store::StoreError>(())
        })?;
    }
    state.metrics.node_reports.fetch_add(1, Ordering::Relaxed);
    tracing::info!(queue = %id, usage = usage.len(), stats = stats.len(), "a node report was kept");
    Ok(Json(json!({"usage": usage.len(), "stats": stats.len()})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    from: String,
    to: String,
    queue: Option<String>,
    format: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BillQuery {
    month: String,
    queue: Option<String>,
    format: Option<String>,
}

impl UsageQuery {
    /// The days asked for, as seconds since 1970 from the first day's start to the last's end.
    fn period(&self) -> Result<std::ops::Range<u64>, ApiError> {
        let date = |text: &str| {
            usage::parse_date(text)
                .ok_or_else(|| ApiError::BadRequest(format!("{text:?} is not a YYYY-MM-DD date")))
        };
        Ok(date(&self.from)?..date(&self.to)? + usage::DAY)
    }
}

/// The usage records of the days `from` to `to` (both included, UTC).
pub async fn usage(
    State(state): State<Arc<AppState>>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let (rows, csv) = records_asked(&state, query, Report::Usage)?;
    let rows = rows
        .into_iter()
        .filter_map(|(queue, line)| Some((queue, UsageRecord::parse(&line)?)));
    Ok(table(
        csv,
        "usage",
        USAGE_CSV_HEADER,
        rows,
        |queue, record| record.csv(queue),
        |queue, record| {
            let mut row = serde_json::to_value(record).expect("plain fields");
            row["queue"] = json!(queue);
            row
        },
    ))
}

/// The stats records (the manual's `getstats` lines) of the days `from` to `to` (both
/// included, UTC).
pub async fn stats(
    State(state): State<Arc<AppState>>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let (rows, csv) = records_asked(&state, query, Report::Stats)?;
    Ok(table(
        csv,
        "stats",
        STATS_CSV_HEADER,
        rows,
        |queue, line| format!("{queue},{}\n", line.trim_end()),
        |queue, line| {
            let mut numbers = line
                .trim_end()
                .split(',')
                .map(|n| json!(n.parse::<u64>().ok()));
            let mut row = json!({"queue": queue, "time": numbers.next()});
            for (name, number) in STATS_COLUMNS.iter().zip(numbers) {
                row[*name] = number;
            }
            row
        },
    ))
}

/// The asked queues' lines of `kind` in the asked days, by queue; and whether CSV is wanted.
fn records_asked(
    state: &AppState,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
    kind: Report,
) -> Result<(Vec<(String, String)>, bool), ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let period = query.period()?;
    let csv = wants_csv(query.format.as_deref())?;
    let mut rows = Vec::new();
    for queue in queues_asked(state, query.queue)? {
        for line in state.store.reports_in(&queue.id, kind, period.clone())? {
            rows.push((queue.id.clone(), line));
        }
    }
    Ok((rows, csv))
}

/// Rows as CSV under `header`, or as JSON `{key: [row]}`.
fn table<T>(
    csv: bool,
    key: &str,
    header: &str,
    rows: impl IntoIterator<Item = (String, T)>,
    csv_row: impl Fn(&str, &T) -> String,
    json_row: impl Fn(&str, &T) -> serde_json::Value,
) -> Response {
    match csv {
        true => {
            let mut text = header.to_string();
            for (queue, row) in rows {
                text.push_str(&csv_row(&queue, &row));
            }
            csv_response(text)
        }
        false => {
            let rows: Vec<_> = rows
                .into_iter()
                .map(|(queue, row)| json_row(&queue, &row))
                .collect();
            Json(json!({ key: rows })).into_response()
        }
    }
}

/// A month's bill: per queue, instance-hours by type and region, IPv4-hours, network GB out
/// and in, storage GB-months, each priced from the config's table.
pub async fn bills(
    State(state): State<Arc<AppState>>,
    query: Result<Query<BillQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let (from, to) = usage::parse_month(&query.month)
        .ok_or_else(|| ApiError::BadRequest(format!("{:?} is not a YYYY-MM month", query.month)))?;
    let csv = wants_csv(query.format.as_deref())?;
    let mut lines = Vec::new();
    for queue in queues_asked(&state, query.queue)? {
        let records: Vec<UsageRecord> = state
            .store
            .reports_of(&queue.id, Report::Usage)?
            .iter()
            .filter_map(|line| UsageRecord::parse(line))
            .collect();
        lines.extend(usage::bill(
            &queue.id,
            queue.created,
            &records,
            from,
            to,
            &state.config.prices,
        ));
    }
    let total = (lines.iter().map(|line| line.amount).sum::<f64>() * 1e6).round() / 1e6;
    Ok(match csv {
        true => {
            let mut text = BILL_CSV_HEADER.to_string();
            lines.iter().for_each(|line| text.push_str(&line.csv()));
            csv_response(text)
        }
        false => {
            Json(json!({"month": query.month, "lines": lines, "total": total})).into_response()
        }
    })
}

fn wants_csv(format: Option<&str>) -> Result<bool, ApiError> {
    match format {
        None | Some("json") => Ok(false),
        Some("csv") => Ok(true),
        Some(other) => Err(ApiError::BadRequest(format!(
            "format {other:?}: json or csv"
        ))),
    }
}

/// The one queue asked for (404 if there is none), or all of them.
fn queues_asked(state: &AppState, queue: Option<String>) -> Result<Vec<Queue>, ApiError> {
    match queue {
        Some(id) => match state.store.get(&id)? {
            Some(queue) => Ok(vec![queue]),
            None => Err(ApiError::NotFound(id)),
        },
        None => Ok(state.store.list()?),
    }
}

fn csv_response(text: String) -> Response {
    ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], text).into_response()
}
