//! Bounded records: the usage and stats records nodes report are kept at full detail while
//! they are recent, and rolled up as they age, so the store grows by a few kilobytes per queue
//! and month instead of some 160 KB per queue and day (docs/deploy.md §12 has the figures):
//!
//! - stats records older than [`STATS_RAW_FOR`] (a day) become one per hour, and older than
//!   [`STATS_HOURLY_FOR`] (31 days) one per day: the period's last counters (what the queue
//!   held as it ended) with the messages published and delivered in it summed;
//! - usage records become one per day and placement once their month's bill is closed
//!   ([`USAGE_RAW_AFTER_MONTH`], 7 days after the month ends, time for the last records of
//!   deleted queues to be handed over): bytes summed, storage held averaged over the time,
//!   the day's last record's time. A bill made from them is the bill made before
//!   (`usage::bill` bills each record for the time since the one before it).
//!
//! The leading replica rolls records up (`run`), a few days' window of each queue an hour:
//! rolling up what is rolled up already changes nothing, so a pass missed is made up by the
//! next, and each day is replaced in one write (`Store::replace_reports`).

use crate::model::queue::Queue;
use crate::store::{Report, Store, StoreError};
use qe_shared::node_channel::{StatsRecord, UsageRecord};
use std::collections::BTreeMap;
use std::time::Duration;

const HOUR: u64 = 3600;
const DAY: u64 = 86_400;
/// How long stats records are kept as nodes made them.
pub const STATS_RAW_FOR: u64 = DAY;
/// How long stats records are kept one per hour, before one per day.
pub const STATS_HOURLY_FOR: u64 = 31 * DAY;
/// How long after its month's end a month's usage records are kept as nodes made them.
pub const USAGE_RAW_AFTER_MONTH: u64 = 7 * DAY;
/// How far back past each threshold a pass looks: a leader down for this long leaves records
/// at full detail until an operator's pass (`rollup::pass` over all time) catches up.
const WINDOW: u64 = 7 * DAY;
/// How often the leader makes a pass.
pub const EVERY: Duration = Duration::from_secs(3600);

/// `records` (oldest first) one per `bucket` seconds (aligned to 1970): each the bucket's
/// last record with the published and delivered counts of all of them summed.
pub fn stats_per(records: &[StatsRecord], bucket: u64) -> Vec<StatsRecord> {
    let mut rolled: Vec<StatsRecord> = Vec::new();
    for record in records {
        match rolled.last_mut() {
            Some(last) if last.time / bucket == record.time / bucket => {
                let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
                };
                *last = StatsRecord {
                    published: sum(last.published, record.published),
                    delivered: sum(last.delivered, record.delivered),
                    ..*record
                };
            }
            _ => rolled.push(*record),
        }
    }
    rolled
}

/// `records` (oldest first) one per UTC day and placement: each run of records of one day
/// with the same instance type, region and IPv4 becomes one, at the run's last time, its bytes
/// summed and its storage held averaged over the run's time. `before` is the time of the
/// record before the first one (for the first one's period), as `usage::bill` counts it.
pub fn usage_per_day(records: &[UsageRecord], before: u64) -> Vec<UsageRecord> {
    let mut rolled: Vec<(UsageRecord, f64, u64)> = Vec::new();
    let mut previous = before;
    for record in records {
        let period = record.time.saturating_sub(previous).min(DAY);
        previous = record.time;
        let held = record.storage_held as f64 * period as f64;
        match rolled.last_mut() {
            Some((last, held_secs, secs))
                if last.time / DAY == record.time / DAY
                    && last.instance_type == record.instance_type
                    && last.region == record.region
                    && last.ipv4 == record.ipv4 =>
            {
                last.time = record.time;
                last.network_sent += record.network_sent;
                last.network_received += record.network_received;
                last.storage_written += record.storage_written;
                last.storage_read += record.storage_read;
                *held_secs += held;
                *secs += period;
            }
            _ => rolled.push((record.clone(), held, period)),
        }
    }
    rolled
        .into_iter()
        .map(|(mut record, held_secs, secs)| {
            if secs > 0 {
                record.storage_held = (held_secs / secs as f64).round() as u64;
            }
            record
        })
        .collect()
}

/// The time the usage records before `now`'s last closed month end: the first of this month
/// once it is [`USAGE_RAW_AFTER_MONTH`] old, else the first of last month.
fn usage_closed_before(now: u64) -> u64 {
    let this_month = month_start(now);
    match now >= this_month + USAGE_RAW_AFTER_MONTH {
        true => this_month,
        false => month_start(this_month - 1),
    }
}

/// The first second of the UTC month `time` is in.
fn month_start(time: u64) -> u64 {
    let (year, month, _) = qe_shared::calendar::civil_from_days(time / DAY);
    crate::usage::parse_month(&format!("{year:04}-{month:02}"))
        .expect("a date's month")
        .0
}

/// What one pass changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rolled {
    /// Records read.
    pub read: usize,
    /// Records left in their place.
    pub kept: usize,
}

/// Rolls up queue `queue_id`'s records older than the thresholds at `now`, looking back
/// `window` seconds past each (`u64::MAX`: all of them).
pub async fn pass_queue(
    store: &Store,
    queue_id: &str,
    now: u64,
    window: u64,
) -> Result<Rolled, StoreError> {
    let mut rolled = Rolled::default();
    let hourly_until = now.saturating_sub(STATS_RAW_FOR) / HOUR * HOUR;
    let daily_until = now.saturating_sub(STATS_HOURLY_FOR) / DAY * DAY;
    let stats_from = |until: u64| until.saturating_sub(window) / DAY * DAY;
    for (from, until, bucket) in [
        (stats_from(hourly_until), hourly_until, HOUR),
        (stats_from(daily_until), daily_until, DAY),
    ] {
        for (day, records) in days(store, queue_id, Report::Stats, from..until).await? {
            let read: Vec<StatsRecord> = records.iter().filter_map(|r| read(r)).collect();
            let stats = stats_per(&read, bucket);
            rolled.read += records.len();
            rolled.kept += stats.len();
            if replaces(read.len(), records.len(), stats.len()) {
                let entries = stats.iter().map(|r| (r.time, json(r))).collect();
                store
                    .replace_reports(queue_id, Report::Stats, day, entries)
                    .await?;
            }
        }
    }
    // The whole of the last closed month (and a window before it): its records are rolled up
    // together, once it is closed.
    let until = usage_closed_before(now);
    let from = month_start(until.saturating_sub(1)).saturating_sub(window) / DAY * DAY;
    // The time of the record before each day's first: read once, then the day before's last
    // (a day rolled up ends at the same time as before).
    let mut before = store
        .report_before(queue_id, Report::Usage, from)
        .await?
        .and_then(|r| read::<UsageRecord>(&r))
        .map_or(0, |record| record.time);
    for (day, records) in days(store, queue_id, Report::Usage, from..until).await? {
        let read: Vec<UsageRecord> = records.iter().filter_map(|r| read(r)).collect();
        let usage = usage_per_day(&read, before);
        before = read.last().map_or(before, |record| record.time);
        rolled.read += records.len();
        rolled.kept += usage.len();
        if replaces(read.len(), records.len(), usage.len()) {
            let entries = usage.iter().map(|r| (r.time, json(r))).collect();
            store
                .replace_reports(queue_id, Report::Usage, day, entries)
                .await?;
        }
    }
    Ok(rolled)
}

/// Queue `queue_id`'s records of `kind` in `times`, by UTC day; none if one of them does not
/// read (it is left where it is, and every record around it: a replaced day would lose it).
async fn days(
    store: &Store,
    queue_id: &str,
    kind: Report,
    times: std::ops::Range<u64>,
) -> Result<Vec<(std::ops::Range<u64>, Vec<Vec<u8>>)>, StoreError> {
    let mut by_day: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for (time, record) in store.reports_timed(queue_id, kind, times).await? {
        let Some(time) = time else {
            tracing::warn!(queue = %queue_id, "a stored record does not read: its records are not rolled up");
            return Ok(Vec::new());
        };
        by_day.entry(time / DAY).or_default().push(record);
    }
    Ok(by_day
        .into_iter()
        .map(|(day, records)| (day * DAY..(day + 1) * DAY, records))
        .collect())
}

/// Whether a day of `stored` records, `read` of which read as JSON, is to be replaced by
/// `rolled` ones: fewer, all read (a line kept from before reports were structured is left),
/// and few enough for one write (a day of hourly stats is 24).
fn replaces(read: usize, stored: usize, rolled: usize) -> bool {
    read == stored && rolled < stored && rolled <= 24
}

fn read<T: serde::de::DeserializeOwned>(stored: &[u8]) -> Option<T> {
    serde_json::from_slice(stored).ok()
}

fn json<T: serde::Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(record).expect("plain fields serialize")
}

/// Rolls up every queue's records, once: what the leader does every [`EVERY`].
pub async fn pass(store: &Store, queues: &[Queue], now: u64) -> Result<Rolled, StoreError> {
    let mut total = Rolled::default();
    for queue in queues {
        let rolled = pass_queue(store, &queue.id, now, WINDOW).await?;
        total.read += rolled.read;
        total.kept += rolled.kept;
    }
    Ok(total)
}

/// How long and how much of the audit log is kept.
#[derive(Debug, Clone, Copy)]
pub struct AuditRetention {
    /// Days an entry is kept (`audit_keep_days`); 0 keeps it for ever.
    pub days: u64,
    /// Entries of the whole log kept at most (`audit_keep_entries`), the newest; 0: all.
    /// Each account's own are also kept to its `max_audit_entries`.
    pub entries: u64,
}

/// Rolls records up, and lets audit entries past their retention go, an hour apart, while
/// this replica leads (its writes fenced by its leadership).
pub async fn run(store: Store, leadership: crate::leadership::Leadership, audit: AuditRetention) {
    let pass = move |store| roll_up_while_leading(store, audit);
    leadership.while_leading(store, pass).await
}

/// Removes the audit entries (and each account's pointers to them) made more than
/// `keep.days` days before `now` (seconds), then the oldest past each account's
/// `max_audit_entries` and past `keep.entries` in all.
pub async fn prune_audit(store: &Store, now: u64, keep: AuditRetention) -> Result<(), StoreError> {
    let accounts = store.accounts().await?;
    if keep.days > 0 {
        let ids: Vec<String> = accounts.iter().map(|a| a.id.clone()).collect();
        let before_ms = now.saturating_sub(keep.days * DAY) * 1000;
        store.prune_audit(before_ms, &ids).await?;
    }
    for account in accounts.iter().filter(|a| a.limits.max_audit_entries > 0) {
        // One account's trouble (an entry that does not read) leaves the others' trims be.
        match store
            .trim_audit(Some(&account.id), account.limits.max_audit_entries)
            .await
        {
            Ok(0) => {}
            Ok(removed) => {
                tracing::info!(account = %account.id, removed, "audit entries past the account's max_audit_entries let go")
            }
            Err(error) => {
                tracing::warn!(account = %account.id, %error, "trimming the account's audit entries: tried again later")
            }
        }
    }
    if keep.entries > 0 {
        let removed = store.trim_audit(None, keep.entries).await?;
        if removed > 0 {
            tracing::info!(removed, "audit entries past audit_keep_entries let go");
        }
    }
    Ok(())
}

async fn roll_up_while_leading(store: Store, audit: AuditRetention) {
    let store = &store;
    loop {
        let pruned = prune_audit(store, crate::unix_now(), audit).await;
        if let Err(error) = pruned {
            tracing::warn!(%error, "letting old audit entries go: tried again later");
        }
        let rolled = match store.list().await {
            Ok(queues) => pass(store, &queues, crate::unix_now()).await,
            Err(error) => Err(error),
        };
        match rolled {
            Ok(rolled) if rolled.kept < rolled.read => {
                tracing::info!(
                    read = rolled.read,
                    kept = rolled.kept,
                    "rolled up aged usage and stats records"
                )
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "rolling up records: tried again later"),
        }
        tokio::time::sleep(EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn audit_entries_past_their_keeping_go_with_their_accounts_pointers() {
        use crate::model::audit::{Actor, Entry, Target};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&crate::store::StoreConfig::Sled, dir.path(), "c")
            .await
            .unwrap();
        let account = Actor::Account {
            account: "acc1".into(),
            key: "k".into(),
        };
        let now = crate::unix_now();
        let mut kept = Vec::new();
        for age_days in [100, 91, 89, 0] {
            let mut entry = Entry::new(account.clone(), "queue.create", Target::default(), 201);
            entry.time_ms = (now - age_days * DAY) * 1000;
            entry.cursor = format!("{:020}-{age_days}", entry.time_ms);
            store.append_audit(&entry).await.unwrap();
            if age_days < 90 {
                kept.push(entry.cursor.clone());
            }
        }
        let keep = AuditRetention {
            days: 90,
            entries: 0,
        };
        prune_audit(&store, now, keep).await.unwrap();
        let cursors = |entries: Vec<Entry>| -> Vec<String> {
            entries.into_iter().map(|entry| entry.cursor).collect()
        };
        let all = store.audit(None, "", "~", 100).await.unwrap();
        assert_eq!(cursors(all), kept);
        let of_account = store.audit(Some("acc1"), "", "~", 100).await.unwrap();
        assert_eq!(cursors(of_account), kept, "read through its pointers");
    }

    #[tokio::test]
    async fn trimming_by_count_goes_a_page_at_a_time_and_takes_an_accounts_entries_from_the_log() {
        use crate::model::audit::{Actor, Entry, Target};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&crate::store::StoreConfig::Sled, dir.path(), "c")
            .await
            .unwrap();
        let account = Actor::Account {
            account: "busy".into(),
            key: "k".into(),
        };
        let mut cursors = Vec::new();
        // More than two pages of the trim's.
        for n in 0..2100u64 {
            let mut entry = Entry::new(account.clone(), "queue.create", Target::default(), 201);
            entry.cursor = format!("{:020}-{n:08}", entry.time_ms);
            store.append_audit(&entry).await.unwrap();
            cursors.push(entry.cursor);
        }
        let operator = Entry::new(Actor::Operator, "account.create", Target::default(), 201);
        store.append_audit(&operator).await.unwrap();
        let cursors_of = |entries: Vec<Entry>| -> Vec<String> {
            entries.into_iter().map(|entry| entry.cursor).collect()
        };

        assert_eq!(store.trim_audit(Some("busy"), 10).await.unwrap(), 2090);
        let newest = cursors[2090..].to_vec();
        let of_busy = store.audit(Some("busy"), "", "~", 5000).await.unwrap();
        assert_eq!(cursors_of(of_busy), newest);
        let all = store.audit(None, "", "~", 5000).await.unwrap();
        let mut expected = newest.clone();
        expected.push(operator.cursor.clone());
        assert_eq!(cursors_of(all), expected, "gone from the log too");

        assert_eq!(store.trim_audit(None, 4).await.unwrap(), 7);
        let all = store.audit(None, "", "~", 5000).await.unwrap();
        assert_eq!(cursors_of(all), [&newest[7..], &[operator.cursor]].concat());
        // The account's pointers to what went went too: its first page is full.
        let first_page = store.audit(Some("busy"), "", "~", 2).await.unwrap();
        assert_eq!(cursors_of(first_page), newest[7..9]);
        assert_eq!(
            store.trim_audit(None, 4).await.unwrap(),
            0,
            "nothing past it"
        );
    }

    fn usage(time: u64, sent: u64, held: u64, instance_type: &str) -> UsageRecord {
        UsageRecord {
            time,
            network_sent: sent,
            network_received: 1,
            storage_written: 2,
            storage_read: 3,
            storage_held: held,
            instance_type: instance_type.into(),
            region: "r".into(),
            ipv4: false,
        }
    }

    #[test]
    fn a_day_of_usage_bills_the_same_rolled_up() {
        let start = 1_700_006_400; // midnight UTC
        let created = start - 600;
        let mut records: Vec<UsageRecord> = (0..96u64)
            .map(|i| usage(start + i * 1800, i, 1000 + i * 7, "t3.small"))
            .collect();
        // The type changed for two hours in the middle of the second day.
        for record in &mut records[60..64] {
            record.instance_type = "t3.large".into();
        }
        let rolled = usage_per_day(&records, created);
        assert_eq!(rolled.len(), 4, "{rolled:?}");
        let prices = crate::config::Prices::default();
        let bill = |records: &[UsageRecord]| {
            crate::usage::bill("q", created, records, start - DAY, start + 3 * DAY, &prices)
        };
        let (raw, rolled_bill) = (bill(&records), bill(&rolled));
        assert_eq!(raw.len(), rolled_bill.len());
        for (a, b) in raw.iter().zip(&rolled_bill) {
            assert_eq!(a.item, b.item);
            assert!((a.quantity - b.quantity).abs() < 1e-6, "{a:?} {b:?}");
        }
        assert_eq!(usage_per_day(&rolled, created), rolled, "rolled up once");
    }

    #[test]
    fn stats_keep_each_periods_last_counters_and_sum_what_moved() {
        let record = |time, messages, published| StatsRecord {
            time,
            messages,
            publishers: 1,
            subscribers: 2,
            saved_subscribers: 0,
            administrators: 0,
            unacknowledged: 0,
            dead_letter: 0,
            delayed: 0,
            durable: messages,
            published,
            delivered: published,
        };
        let records: Vec<StatsRecord> = (0..24u64)
            .map(|i| record(7200 + i * 300, i, Some(i)))
            .collect();
        let hourly = stats_per(&records, HOUR);
        assert_eq!(hourly.len(), 2);
        assert_eq!(hourly[0].time, 7200 + 11 * 300);
        assert_eq!(hourly[0].messages, 11);
        assert_eq!(hourly[0].published, Some((0..12).sum()));
        assert_eq!(hourly[1].delivered, Some((12..24).sum()));
        assert_eq!(stats_per(&hourly, HOUR), hourly, "rolled up once");
        let old = [record(0, 1, None), record(300, 2, None)];
        assert_eq!(stats_per(&old, HOUR)[0].published, None);
    }

    #[test]
    fn a_months_usage_is_closed_a_week_after_it_ends() {
        let december = crate::usage::parse_month("2026-12").unwrap().0;
        let november = crate::usage::parse_month("2026-11").unwrap().0;
        assert_eq!(usage_closed_before(december + 6 * DAY), november);
        assert_eq!(usage_closed_before(december + 7 * DAY), december);
    }
}
