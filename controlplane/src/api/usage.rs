//! What nodes report (`POST /v1/nodes/{id}/reports`, with the node's token) and what the
//! operator reads from it: `GET /v1/usage`, `GET /v1/stats` and `GET /v1/bills`, as JSON or
//! CSV (RFC 4180, `csv.rs`).

use super::csv;
use super::extract::{Json, Query};
use super::nodes::NodeCaller;
use super::{ApiError, AppState};
use crate::queues::Queue;
use crate::store::Report;
use crate::usage::{self, StatsRecord, UsageRecord};
use axum::extract::{Extension, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use qe_shared::node_channel::ReportReceipt;
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A report as it arrives: records, or, from nodes of the release before, `getusage` and
/// `getstats` lines (read strictly; a node upgraded sends records).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrivingReport {
    #[serde(default)]
    usage: Vec<Arriving<UsageRecord>>,
    #[serde(default)]
    stats: Vec<Arriving<StatsRecord>>,
    /// The node is stopping and this is its last report.
    #[serde(default, rename = "final")]
    last: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Arriving<T> {
    Record(T),
    Line(String),
}

impl<T> Arriving<T> {
    fn read(self, from_line: impl Fn(&str) -> Option<T>) -> Result<T, ApiError> {
        match self {
            Arriving::Record(record) => Ok(record),
            Arriving::Line(line) => from_line(&line)
                .ok_or_else(|| ApiError::BadRequest(format!("not a record: {line:?}"))),
        }
    }
}

/// Keeps a node's records (one sent again is kept once) and says how many were new. A
/// usage record must carry its queue's own labels: they price it, and a node may not bill
/// itself under others.
pub async fn receive(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<NodeCaller>,
    Json(report): Json<ArrivingReport>,
) -> Result<Json<ReportReceipt>, ApiError> {
    let queue = &caller.queue;
    let usage = report
        .usage
        .into_iter()
        .map(|arriving| arriving.read(UsageRecord::from_line))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(record) = usage.iter().find(|record| !labelled_as(record, queue)) {
        return Err(ApiError::BadRequest(format!(
            "a usage record at {} is labelled {:?} in {:?}, its queue {:?} in {:?}",
            record.time, record.instance_type, record.region, queue.instance_type, queue.region
        )));
    }
    let stats = report
        .stats
        .into_iter()
        .map(|arriving| arriving.read(StatsRecord::from_line))
        .collect::<Result<Vec<_>, _>>()?;
    let (usage, stats) = state
        .store
        .keep_reports(
            &queue.id,
            to_stored(&usage, |record| record.time),
            to_stored(&stats, |record| record.time),
        )
        .await?;
    let receipt = ReportReceipt { usage, stats };
    if report.last {
        state
            .store
            .update(&queue.id, |queue| {
                queue.last_report = Some(crate::unix_now());
                Ok::<_, crate::store::StoreError>(())
            })
            .await?;
    }
    state.metrics.node_reports.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        queue = %queue.id,
        usage = receipt.usage.new,
        stats = receipt.stats.new,
        already_kept = receipt.usage.already_kept + receipt.stats.already_kept,
        "a node report was kept"
    );
    Ok(Json(receipt))
}

/// Whether `record` carries `queue`'s own labels.
fn labelled_as(record: &UsageRecord, queue: &Queue) -> bool {
    record.region == queue.region
        && record.instance_type == queue.instance_type
        && record.ipv4 == queue.ipv4
}

/// Records as the store keeps them: by time, as JSON.
fn to_stored<T: serde::Serialize>(records: &[T], time: impl Fn(&T) -> u64) -> Vec<(u64, Vec<u8>)> {
    records
        .iter()
        .map(|record| {
            let json = serde_json::to_vec(record).expect("plain fields serialize");
            (time(record), json)
        })
        .collect()
}

/// A stored record: JSON, or a line as kept before reports were structured.
fn read_stored<T: serde::de::DeserializeOwned>(
    stored: &[u8],
    from_line: impl Fn(&str) -> Option<T>,
) -> Option<T> {
    serde_json::from_slice(stored)
        .ok()
        .or_else(|| from_line(std::str::from_utf8(stored).ok()?))
}

fn read_usage(stored: &[u8]) -> Option<UsageRecord> {
    read_stored(stored, UsageRecord::from_line)
}

fn read_stats(stored: &[u8]) -> Option<StatsRecord> {
    read_stored(stored, StatsRecord::from_line)
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

const USAGE_COLUMNS: [&str; 10] = [
    "queue",
    "time",
    "network_sent",
    "network_received",
    "storage_written",
    "storage_read",
    "storage_held",
    "instance_type",
    "region",
    "ipv4",
];

/// The usage records of the days `from` to `to` (both included, UTC).
pub async fn usage(
    State(state): State<Arc<AppState>>,
    Query(query): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let (rows, csv) = records_asked(&state, query, Report::Usage, read_usage).await?;
    Ok(match csv {
        true => csv_table(
            USAGE_COLUMNS,
            rows.iter().map(|(queue, record)| usage_row(queue, record)),
        ),
        false => json_table("usage", &rows),
    })
}

fn usage_row(queue: &str, record: &UsageRecord) -> Vec<String> {
    let numbers = [
        record.time,
        record.network_sent,
        record.network_received,
        record.storage_written,
        record.storage_read,
        record.storage_held,
    ];
    let mut row = vec![queue.to_string()];
    row.extend(numbers.iter().map(u64::to_string));
    row.extend([
        record.instance_type.clone(),
        record.region.clone(),
        (record.ipv4 as u8).to_string(),
    ]);
    row
}

/// The stats records (the manual's `getstats` lines) of the days `from` to `to` (both
/// included, UTC).
pub async fn stats(
    State(state): State<Arc<AppState>>,
    Query(query): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let (rows, csv) = records_asked(&state, query, Report::Stats, read_stats).await?;
    Ok(match csv {
        true => {
            let columns = ["queue", "time"].into_iter().chain(StatsRecord::COLUMNS);
            let rows = rows.iter().map(|(queue, record)| {
                let numbers = [record.time].into_iter().chain(record.counters());
                [queue.clone()]
                    .into_iter()
                    .chain(numbers.map(|n| n.to_string()))
                    .collect::<Vec<_>>()
            });
            csv_table(columns, rows)
        }
        false => json_table("stats", &rows),
    })
}

/// The asked queues' records of `kind` in the asked days, by queue; and whether CSV is
/// wanted. A stored record that does not read is left out.
async fn records_asked<T>(
    state: &AppState,
    query: UsageQuery,
    kind: Report,
    read: impl Fn(&[u8]) -> Option<T>,
) -> Result<(Vec<(String, T)>, bool), ApiError> {
    let period = query.period()?;
    let csv = wants_csv(query.format.as_deref())?;
    let mut rows = Vec::new();
    for queue in queues_asked(state, query.queue).await? {
        let stored = state.store.reports_in(&queue.id, kind, period.clone());
        for stored in stored.await? {
            rows.extend(read(&stored).map(|record| (queue.id.clone(), record)));
        }
    }
    Ok((rows, csv))
}

/// `{key: [record with its "queue"]}`.
fn json_table<T: serde::Serialize>(key: &str, rows: &[(String, T)]) -> Response {
    let rows: Vec<_> = rows
        .iter()
        .map(|(queue, record)| {
            let mut row = serde_json::to_value(record).expect("plain fields serialize");
            row["queue"] = json!(queue);
            row
        })
        .collect();
    Json(json!({ key: rows })).into_response()
}

/// A CSV table: a header of `columns`, then `rows`.
fn csv_table<'a>(
    columns: impl IntoIterator<Item = &'a str>,
    rows: impl Iterator<Item = Vec<String>>,
) -> Response {
    let mut text = csv::row(columns);
    for row in rows {
        text.push_str(&csv::row(row.iter().map(String::as_str)));
    }
    csv_response(text)
}

/// A month's bill: per queue, instance-hours by type and region, IPv4-hours, network GB out
/// and in, storage GB-months, each priced from the config's table.
pub async fn bills(
    State(state): State<Arc<AppState>>,
    Query(query): Query<BillQuery>,
) -> Result<Response, ApiError> {
    let (from, to) = usage::parse_month(&query.month)
        .ok_or_else(|| ApiError::BadRequest(format!("{:?} is not a YYYY-MM month", query.month)))?;
    let csv = wants_csv(query.format.as_deref())?;
    let lines = bill_lines(&state, query.queue.clone(), from, to).await?;
    let total = (lines.iter().map(|line| line.amount).sum::<f64>() * 1e6).round() / 1e6;
    Ok(match csv {
        true => {
            let columns = ["queue", "item", "quantity", "unit", "unit_price", "amount"];
            let rows = lines.iter().map(|line| {
                vec![
                    line.queue.clone(),
                    line.item.clone(),
                    line.quantity.to_string(),
                    line.unit.to_string(),
                    line.unit_price.to_string(),
                    line.amount.to_string(),
                ]
            });
            csv_table(columns, rows)
        }
        false => {
            Json(json!({"month": query.month, "lines": lines, "total": total})).into_response()
        }
    })
}

/// The bill lines of the asked queues (or all) for the month `[from, to)`.
async fn bill_lines(
    state: &AppState,
    asked: Option<String>,
    from: u64,
    to: u64,
) -> Result<Vec<usage::BillLine>, ApiError> {
    let mut lines = Vec::new();
    for queue in queues_asked(state, asked).await? {
        let records: Vec<UsageRecord> = state
            .store
            .reports_of(&queue.id, Report::Usage)
            .await?
            .iter()
            .filter_map(|stored| read_usage(stored))
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
    Ok(lines)
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
async fn queues_asked(state: &AppState, queue: Option<String>) -> Result<Vec<Queue>, ApiError> {
    match queue {
        Some(id) => match state.store.get(&id).await? {
            Some(queue) => Ok(vec![queue]),
            None => Err(ApiError::NotFound(id)),
        },
        None => Ok(state.store.list().await?),
    }
}

fn csv_response(text: String) -> Response {
    ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], text).into_response()
}
