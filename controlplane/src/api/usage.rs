//! What nodes report (`POST /v1/nodes/{id}/reports`, with the node's token) and what the
//! operator reads from it: `GET /v1/usage`, `GET /v1/stats` and `GET /v1/bills`, as JSON or
//! CSV (RFC 4180, `csv.rs`).

use super::auth::Caller;
use super::csv;
use super::extract::{Json, Query};
use super::nodes::NodeCaller;
use super::{ApiError, AppState};
use crate::model::queue::Queue;
use crate::store::Report;
use crate::usage::{self, StatsRecord, UsageRecord};
use axum::extract::{Extension, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use qe_shared::node_channel::ReportReceipt;
use serde::Deserialize;
use serde_json::{json, Value};
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
    /// The node's numbers now, for `/metrics` ([`crate::live`]): kept in memory, never stored.
    #[serde(default)]
    live: Option<qe_shared::node_channel::LiveStats>,
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
    // Live numbers come alone, from every node every few seconds: answered at once, with no
    // store write and no log line (but when its standby comes into or falls out of sync).
    if let Some(live) = report.live {
        state.metrics.live.keep(&queue.id, live);
        keep_standby_standing(&state, queue, &live).await?;
        if report.usage.is_empty() && report.stats.is_empty() && !report.last {
            return Ok(Json(ReportReceipt::default()));
        }
    }
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
    /// The first day (default: the first of this month).
    from: Option<String>,
    /// The last day (default: today).
    to: Option<String>,
    queue: Option<String>,
    account: Option<String>,
    format: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BillQuery {
    /// Default: this month.
    month: Option<String>,
    queue: Option<String>,
    account: Option<String>,
    format: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvoiceQuery {
    /// Default: this month.
    month: Option<String>,
    format: Option<String>,
}

/// Which queues a read is of: one, one account's, or every one the caller sees.
struct Asked {
    queue: Option<String>,
    account: Option<String>,
}

impl UsageQuery {
    /// The days asked for, as seconds since 1970 from the first day's start to the last's end.
    fn period(&self) -> Result<std::ops::Range<u64>, ApiError> {
        let date = |text: &str| {
            usage::parse_date(text)
                .ok_or_else(|| ApiError::BadRequest(format!("{text:?} is not a YYYY-MM-DD date")))
        };
        let today = usage::today();
        let first_of_month = format!("{}-01", &today[..7]);
        let from = self.from.as_deref().unwrap_or(&first_of_month);
        let to = self.to.as_deref().unwrap_or(&today);
        Ok(date(from)?..date(to)? + usage::DAY)
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
    Extension(caller): Extension<Caller>,
    Query(query): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let (rows, csv) = records_asked(&state, &caller, query, Report::Usage, read_usage).await?;
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
    Extension(caller): Extension<Caller>,
    Query(query): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let (rows, csv) = records_asked(&state, &caller, query, Report::Stats, read_stats).await?;
    Ok(match csv {
        true => {
            let columns = ["queue", "time"]
                .into_iter()
                .chain(StatsRecord::COLUMNS)
                .chain(["published", "delivered"]);
            let rows = rows.iter().map(|(queue, record)| {
                let numbers = [record.time].into_iter().chain(record.counters());
                // Empty where the record does not know (made before nodes counted them).
                let interval = [record.published, record.delivered]
                    .map(|count| count.map(|n| n.to_string()).unwrap_or_default());
                [queue.clone()]
                    .into_iter()
                    .chain(numbers.map(|n| n.to_string()))
                    .chain(interval)
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
    caller: &Caller,
    query: UsageQuery,
    kind: Report,
    read: impl Fn(&[u8]) -> Option<T>,
) -> Result<(Vec<(String, T)>, bool), ApiError> {
    let period = query.period()?;
    let csv = wants_csv(query.format.as_deref())?;
    let asked = Asked {
        queue: query.queue,
        account: query.account,
    };
    let mut rows = Vec::new();
    for queue in queues_asked(state, caller, asked).await? {
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
/// and in, storage GB-months, each priced from the config's table; with each queue's total
/// and the sum. For an account (its key, or the operator's `account=`) that is its invoice.
pub async fn bills(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<BillQuery>,
) -> Result<Response, ApiError> {
    let month_asked = query.month.unwrap_or_else(this_month);
    let (from, to) = month(&month_asked)?;
    let csv = wants_csv(query.format.as_deref())?;
    let account = query.account.clone().or(caller.account().map(String::from));
    let asked = Asked {
        queue: query.queue,
        account: query.account,
    };
    let queues = queues_asked(&state, &caller, asked).await?;
    let lines = bill_lines(&state, &queues, from, to).await?;
    Ok(match csv {
        true => csv_table(BILL_COLUMNS, lines.iter().map(bill_row)),
        false => {
            let mut bill = invoice(&lines);
            bill["month"] = json!(month_asked);
            if let Some(account) = account {
                bill["account"] = json!(account);
            }
            Json(bill).into_response()
        }
    })
}

/// `GET /v1/invoices?month=`: every account's invoice for the month (an account's key gets
/// its own only); queues of no account come last, under `"account":null`.
pub async fn invoices(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<InvoiceQuery>,
) -> Result<Response, ApiError> {
    let month_asked = query.month.unwrap_or_else(this_month);
    let (from, to) = month(&month_asked)?;
    let csv = wants_csv(query.format.as_deref())?;
    let mut by_account: std::collections::BTreeMap<Option<String>, Vec<Queue>> = Default::default();
    for account in state.store.accounts().await? {
        if caller.sees_account(&account.id) {
            by_account.entry(Some(account.id)).or_default();
        }
    }
    for queue in state.store.list().await? {
        if caller.sees(&queue) {
            by_account
                .entry(queue.account.clone())
                .or_default()
                .push(queue);
        }
    }
    // Queues of no account after the accounts' (`None` sorts first).
    let mut ordered: Vec<_> = by_account.into_iter().collect();
    let of_no_account = ordered
        .iter()
        .take_while(|(account, _)| account.is_none())
        .count();
    ordered.rotate_left(of_no_account);
    let mut invoices = Vec::new();
    for (account, queues) in ordered {
        invoices.push((account, bill_lines(&state, &queues, from, to).await?));
    }
    Ok(match csv {
        true => {
            let columns = ["account"].into_iter().chain(BILL_COLUMNS);
            let rows = invoices.iter().flat_map(|(account, lines)| {
                lines.iter().map(move |line| {
                    let mut row = vec![account.clone().unwrap_or_default()];
                    row.extend(bill_row(line));
                    row
                })
            });
            csv_table(columns, rows)
        }
        false => {
            let invoices: Vec<Value> = invoices
                .iter()
                .map(|(account, lines)| {
                    let mut invoice = invoice(lines);
                    invoice["account"] = json!(account);
                    invoice
                })
                .collect();
            Json(json!({"month": month_asked, "invoices": invoices})).into_response()
        }
    })
}

const BILL_COLUMNS: [&str; 6] = ["queue", "item", "quantity", "unit", "unit_price", "amount"];

fn bill_row(line: &usage::BillLine) -> Vec<String> {
    vec![
        line.queue.clone(),
        line.item.clone(),
        line.quantity.to_string(),
        line.unit.to_string(),
        line.unit_price.to_string(),
        line.amount.to_string(),
    ]
}

/// `{"lines", "queues": [{"queue", "total"}], "total"}`: the lines, each queue's sum, and
/// the sum of all (rounded to millionths; the lines keep their exact amounts).
fn invoice(lines: &[usage::BillLine]) -> Value {
    let mut per_queue: Vec<(String, f64)> = Vec::new();
    for line in lines {
        match per_queue.last_mut() {
            Some((queue, sum)) if *queue == line.queue => *sum += line.amount,
            _ => per_queue.push((line.queue.clone(), line.amount)),
        }
    }
    let total: f64 = lines.iter().map(|line| line.amount).sum();
    let queues: Vec<Value> = per_queue
        .iter()
        .map(|(queue, sum)| json!({"queue": queue, "total": round6(*sum)}))
        .collect();
    json!({"lines": lines, "queues": queues, "total": round6(total)})
}

fn round6(amount: f64) -> f64 {
    (amount * 1e6).round() / 1e6
}

/// `YYYY-MM` of today (UTC).
fn this_month() -> String {
    usage::today()[..7].to_string()
}

fn month(text: &str) -> Result<(u64, u64), ApiError> {
    usage::parse_month(text)
        .ok_or_else(|| ApiError::BadRequest(format!("{text:?} is not a YYYY-MM month")))
}

/// The bill lines of `queues` for the month `[from, to)`, queue by queue.
async fn bill_lines(
    state: &AppState,
    queues: &[Queue],
    from: u64,
    to: u64,
) -> Result<Vec<usage::BillLine>, ApiError> {
    let mut lines = Vec::new();
    for queue in queues {
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

/// The queue asked for (404 if there is none the caller sees), or the account's asked for
/// (404 likewise), or every one the caller sees.
async fn queues_asked(
    state: &AppState,
    caller: &Caller,
    asked: Asked,
) -> Result<Vec<Queue>, ApiError> {
    if let Some(account) = &asked.account {
        if !caller.sees_account(account) || state.store.account(account).await?.is_none() {
            return Err(ApiError::NoSuch(format!("no account {account}")));
        }
    }
    let in_account = |queue: &Queue| asked.account.is_none() || queue.account == asked.account;
    match asked.queue {
        Some(id) => match super::queues::seen(state, caller, &id).await {
            Ok(queue) if in_account(&queue) => Ok(vec![queue]),
            _ => Err(ApiError::NotFound(id)),
        },
        None => Ok(state
            .store
            .list()
            .await?
            .into_iter()
            .filter(|queue| caller.sees(queue) && in_account(queue))
            .collect()),
    }
}

fn csv_response(text: String) -> Response {
    ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], text).into_response()
}

/// Keeps in the queue's record how its node's standby stands, when that changes: whether it
/// is in sync (the leader promotes a silent node's standby only if it was), and since when
/// none has been attached (the leader replaces a standby absent that long: `reconciler.rs`).
/// The leader may not be the replica that hears the node. One store write per change.
async fn keep_standby_standing(
    state: &AppState,
    queue: &crate::model::queue::Queue,
    live: &qe_shared::node_channel::LiveStats,
) -> Result<(), ApiError> {
    if queue.replicas != 2 {
        return Ok(());
    }
    let in_sync = live.standby.is_some_and(|standby| standby.in_sync);
    let absent_ms = live.standby.map_or(0, |standby| standby.absent_ms);
    let absent_since = (absent_ms > 0).then(|| crate::live::now_ms().saturating_sub(absent_ms));
    // Only a change is written: a standby still absent keeps the time it went.
    let absence_changed = absent_since.is_some() != queue.standby_absent_since_ms.is_some();
    if queue.standby_in_sync == in_sync && !absence_changed {
        return Ok(());
    }
    let kept = state.store.update(&queue.id, |queue| {
        queue.standby_in_sync = in_sync;
        if absent_since.is_some() != queue.standby_absent_since_ms.is_some() {
            queue.standby_absent_since_ms = absent_since;
        }
        Ok::<_, crate::store::StoreError>(())
    });
    kept.await?;
    Ok(())
}
