//! The queue's history: a stats record every `stats-frequency-secs` and a usage record every
//! `usage-frequency-secs`, kept in sled for their retention periods, read back a UTC day at a
//! time by `getstats` and `getusage`. What must last is synced with [`MetaDisk::sync`]: sled's
//! own flush is not a sync (`store/meta.rs`).
//!
//! Everything here takes the time as an argument; [`run`] is the only part that reads the
//! clock, so the recording, aggregation and pruning rules are tested with a clock in hand.

use crate::engine::Totals as EngineTotals;
use crate::store::meta::{MetaDisk, NotSynced};
use qe_shared::calendar::{civil_from_days, days_from_civil, days_in_month};
use qe_shared::node_channel::StatsRecord;
use qe_shared::Code;
use std::fmt::Write;

const DAY_SECS: u64 = 86_400;
/// Retention is counted in years of 365 days.
const YEAR_SECS: u64 = 365 * DAY_SECS;

/// One usage record's figures (time aside).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub network_sent: u64,
    pub network_received: u64,
    pub storage_written: u64,
    pub storage_read: u64,
    /// The average on-disk size over the record's period.
    pub storage_held: u64,
}

/// What the node's usage records carry, to bill it under: from the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageLabels {
    pub instance_type: String,
    pub region: String,
    pub ipv4: bool,
}

/// Reads a requested UTC day: year (404), month (405), day (406), as JSON integers.
pub fn parse_day(
    year: Option<&serde_json::Value>,
    month: Option<&serde_json::Value>,
    day: Option<&serde_json::Value>,
) -> Result<Day, Code> {
    let number = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_u64());
    let year = number(year)
        .filter(|y| (1970..=9999).contains(y))
        .ok_or(Code::InvalidYear)?;
    let month = number(month)
        .filter(|m| (1..=12).contains(m))
        .ok_or(Code::InvalidMonth)?;
    let day = number(day)
        .filter(|d| (1..=days_in_month(year, month)).contains(d))
        .ok_or(Code::InvalidDay)?;
    Ok(Day {
        start: days_from_civil(year, month, day) * DAY_SECS,
    })
}

/// A day the administrator asked about, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Day {
    /// Its first second, since 1970 (UTC).
    pub start: u64,
}

/// Why a day cannot be read: the code, and the reason text when it names a particular.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayRefused {
    pub code: Code,
    pub reason: Option<String>,
}

/// Why the history could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("the history store: {0}")]
    Store(#[from] sled::Error),
    #[error(transparent)]
    NotSynced(#[from] NotSynced),
}

pub struct History {
    /// time (u64 BE) → the nine `getlivestats` columns, as CSV text.
    stats: sled::Tree,
    /// time (u64 BE) → the usage columns, as CSV text.
    usage: sled::Tree,
    /// `created`, and how far the records have been reported (`report.rs`).
    meta: sled::Tree,
    /// The store's sync.
    disk: MetaDisk,
    /// When the queue first started: days that end before it have no data (407).
    created: u64,
    /// Signalled after every record, for the reporter.
    pub recorded: tokio::sync::Notify,
}

/// Which records: the two kinds the history keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Stats,
    Usage,
}

impl Kind {
    fn cursor_key(self) -> &'static str {
        match self {
            Kind::Stats => "reported-stats",
            Kind::Usage => "reported-usage",
        }
    }
}

impl History {
    /// When the queue's history began (seconds since 1970): its node's first start.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// Opens the history on `disk`; `now` becomes the queue's first day if it has none yet.
    pub fn open(disk: &MetaDisk, now: u64) -> Result<History, HistoryError> {
        let db = disk.db();
        let meta = db.open_tree("history")?;
        let created = match meta.get("created")? {
            Some(bytes) => u64::from_be_bytes(bytes.as_ref().try_into().unwrap_or_default()),
            None => {
                meta.insert("created", &now.to_be_bytes())?;
                disk.sync()?;
                now
            }
        };
        Ok(History {
            stats: db.open_tree("stats")?,
            usage: db.open_tree("usage")?,
            meta,
            disk: disk.clone(),
            created,
            recorded: tokio::sync::Notify::new(),
        })
    }

    /// Keeps a stats record: the nine `getlivestats` counters, and then the interval's flow
    /// (two columns `getstats` leaves out; the reports to the control plane carry them).
    pub fn record_stats(
        &self,
        time: u64,
        live_stats_csv: &str,
        flow: Flow,
    ) -> Result<(), HistoryError> {
        let record = format!("{live_stats_csv},{},{}", flow.published, flow.delivered);
        self.stats.insert(time.to_be_bytes(), record.as_bytes())?;
        self.keep()
    }

    pub fn record_usage(
        &self,
        time: u64,
        usage: &Usage,
        usage_labels: &UsageLabels,
    ) -> Result<(), HistoryError> {
        let line = format!(
            "{},{},{},{},{},{},{},{}",
            usage.network_sent,
            usage.network_received,
            usage.storage_written,
            usage.storage_read,
            usage.storage_held,
            usage_labels.instance_type,
            usage_labels.region,
            usage_labels.ipv4 as u8
        );
        self.usage.insert(time.to_be_bytes(), line.as_bytes())?;
        self.keep()
    }

    /// Syncs a record just made, and only then counts it as made (the reporter wakes for
    /// it): the settings store syncs only when asked (`flush_every_ms(None)`), and a record
    /// that was never synced is lost with the process (a kill -9, an OOM kill, a lost
    /// instance) and never billed. A record whose sync failed is not counted as on the disk,
    /// and neither is any after it until a restart ([`MetaDisk::sync`]): it stays in the
    /// store, and may still be reported from there when the reporter wakes for another reason.
    fn keep(&self) -> Result<(), HistoryError> {
        self.disk.sync()?;
        self.recorded.notify_waiters();
        Ok(())
    }

    /// Up to `limit` records of `kind` not reported yet, oldest first, as `TIME,COLUMNS…` lines.
    pub fn unreported(&self, kind: Kind, limit: usize) -> Result<Vec<(u64, String)>, HistoryError> {
        let after = self.reported(kind)?;
        let tree = self.tree(kind);
        let from = match after {
            Some(time) => std::ops::Bound::Excluded(time.to_be_bytes()),
            None => std::ops::Bound::Unbounded,
        };
        tree.range((from, std::ops::Bound::Unbounded))
            .take(limit)
            .map(|entry| {
                let (key, value) = entry?;
                let time = u64::from_be_bytes(key.as_ref().try_into().unwrap_or_default());
                Ok((time, format!("{time},{}", String::from_utf8_lossy(&value))))
            })
            .collect()
    }

    /// Syncs every record made so far to the disk.
    pub fn flush(&self) -> Result<(), HistoryError> {
        Ok(self.disk.sync()?)
    }

    /// Notes that the records of `kind` up to `time` have been received.
    pub fn mark_reported(&self, kind: Kind, time: u64) -> Result<(), HistoryError> {
        self.meta.insert(kind.cursor_key(), &time.to_be_bytes())?;
        Ok(self.disk.sync()?)
    }

    fn reported(&self, kind: Kind) -> Result<Option<u64>, HistoryError> {
        let value = self.meta.get(kind.cursor_key())?;
        Ok(value.map(|bytes| u64::from_be_bytes(bytes.as_ref().try_into().unwrap_or_default())))
    }

    fn tree(&self, kind: Kind) -> &sled::Tree {
        match kind {
            Kind::Stats => &self.stats,
            Kind::Usage => &self.usage,
        }
    }

    /// Drops records older than their retention periods.
    pub fn prune(&self, now: u64, stats_years: u64, usage_years: u64) -> Result<(), HistoryError> {
        for (tree, years) in [(&self.stats, stats_years), (&self.usage, usage_years)] {
            let oldest_kept = now.saturating_sub(years * YEAR_SECS);
            for key in tree.range(..oldest_kept.to_be_bytes()).keys() {
                tree.remove(key?)?;
            }
        }
        Ok(())
    }

    /// Refuses a day that ends before the queue existed (407; the reason names its first day).
    pub fn check_has_data(&self, day: Day) -> Result<(), DayRefused> {
        if day.start + DAY_SECS > self.created {
            return Ok(());
        }
        let (year, month, first) = civil_from_days(self.created / DAY_SECS);
        let reason =
            format!("Invalid date, don't have data before {year:04}-{month:02}-{first:02}.");
        Err(DayRefused {
            code: Code::DateBeforeData,
            reason: Some(reason),
        })
    }

    /// `getstats`: every record of the day, or one line of averages (rounded to whole numbers).
    pub fn stats_of(&self, day: Day, average: bool) -> Result<String, HistoryError> {
        let mut records = records(&self.stats, day)?;
        for (_, fields) in &mut records {
            fields.truncate(StatsRecord::COLUMNS.len());
        }
        if !average {
            return Ok(lines(&records));
        }
        let Some(columns) = records.first().map(|(_, c)| c.len()) else {
            return Ok(String::new());
        };
        let mut sums = vec![0u64; columns];
        for (_, fields) in &records {
            for (sum, field) in sums.iter_mut().zip(fields) {
                *sum += field.parse::<u64>().unwrap_or(0);
            }
        }
        let count = records.len() as u64;
        let averages: Vec<String> = sums
            .iter()
            .map(|s| ((s + count / 2) / count).to_string())
            .collect();
        Ok(format!("{},{}\n", day.start, averages.join(",")))
    }

    /// `getusage`: every record of the day, or one line with the bytes added up and the
    /// storage held averaged.
    pub fn usage_of(&self, day: Day, totals: bool) -> Result<String, HistoryError> {
        let records = records(&self.usage, day)?;
        if !totals {
            return Ok(lines(&records));
        }
        let Some((_, last)) = records.last() else {
            return Ok(String::new());
        };
        let sum = |column: usize| -> u64 {
            records
                .iter()
                .map(|(_, f)| f[column].parse::<u64>().unwrap_or(0))
                .sum()
        };
        let held = sum(4) / records.len() as u64;
        Ok(format!(
            "{},{},{},{},{},{},{},{},{}\n",
            day.start,
            sum(0),
            sum(1),
            sum(2),
            sum(3),
            held,
            last[5],
            last[6],
            last[7]
        ))
    }
}

/// The day's records: (time, fields).
fn records(tree: &sled::Tree, day: Day) -> Result<Vec<(u64, Vec<String>)>, sled::Error> {
    let range = day.start.to_be_bytes()..(day.start + DAY_SECS).to_be_bytes();
    tree.range(range)
        .map(|entry| {
            let (key, value) = entry?;
            let time = u64::from_be_bytes(key.as_ref().try_into().unwrap_or_default());
            let fields = String::from_utf8_lossy(&value)
                .split(',')
                .map(str::to_string)
                .collect();
            Ok((time, fields))
        })
        .collect()
}

fn lines(records: &[(u64, Vec<String>)]) -> String {
    let mut csv = String::new();
    for (time, fields) in records {
        let _ = writeln!(csv, "{time},{}", fields.join(","));
    }
    csv
}

/// Totals that only grow, read at each usage record to take the period's share.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub network_sent: u64,
    pub network_received: u64,
    pub storage_written: u64,
    pub storage_read: u64,
}

/// Builds usage records from growing totals and samples of the storage held.
#[derive(Debug, Default)]
pub struct UsageMeter {
    last: Totals,
    held_samples: u64,
    held_sum: u64,
}

impl UsageMeter {
    pub fn new(start: Totals) -> UsageMeter {
        UsageMeter {
            last: start,
            ..UsageMeter::default()
        }
    }

    /// Notes the storage held now (sampled between records, for the average).
    pub fn sample_held(&mut self, held: u64) {
        self.held_samples += 1;
        self.held_sum += held;
    }

    /// The record for the period that ends now.
    pub fn take(&mut self, now: Totals, held_now: u64) -> Usage {
        self.sample_held(held_now);
        let usage = Usage {
            network_sent: now.network_sent - self.last.network_sent,
            network_received: now.network_received - self.last.network_received,
            storage_written: now.storage_written - self.last.storage_written,
            storage_read: now.storage_read - self.last.storage_read,
            storage_held: self.held_sum / self.held_samples,
        };
        *self = UsageMeter::new(now);
        usage
    }
}

/// The messages that went through the queue in a stats record's interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flow {
    pub published: u64,
    pub delivered: u64,
}

/// Takes each stats interval's [`Flow`] from the engine's totals, which only grow while the
/// node runs (the first interval after a start counts from the start).
#[derive(Debug, Default)]
pub struct FlowMeter {
    last: EngineTotals,
}

impl FlowMeter {
    pub fn new(start: EngineTotals) -> FlowMeter {
        FlowMeter { last: start }
    }

    /// The flow of the interval that ends now.
    pub fn take(&mut self, now: EngineTotals) -> Flow {
        let flow = Flow {
            published: now.published - self.last.published,
            delivered: now.delivered - self.last.delivered,
        };
        self.last = now;
        flow
    }
}

/// The next multiple of `every` seconds after `now`.
pub fn next_multiple(now: u64, every: u64) -> u64 {
    (now / every + 1) * every
}

/// For `controlplane dev` and tests only: records this often (seconds) instead of at the
/// `stats-frequency-secs` and `usage-frequency-secs` settings, whose ranges start at 300 and
/// 1800 seconds. None: the setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordEvery {
    pub stats_secs: Option<u64>,
    pub usage_secs: Option<u64>,
}

#[cfg(test)]
mod tests;
