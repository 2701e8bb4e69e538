//! Usage records as nodes report them, and the bills made from them.
//!
//! A record is the manual's `getusage` line: time, network bytes sent and received, storage
//! bytes written and read, storage bytes held (the period's average), instance type, region,
//! and 1 if the queue has IPv4. Its period is the time since the queue's previous record
//! (at most a day; the first one counts from the queue's creation).

use crate::config::Prices;
use qe_shared::calendar::{days_from_civil, days_in_month};
use serde::Serialize;
use std::collections::BTreeMap;

const DAY_SECS: u64 = 86_400;
const GB: f64 = 1e9;
/// A month of storage, as clouds bill it: 730 hours.
const MONTH_SECS: f64 = 730.0 * 3600.0;

pub use qe_shared::node_channel::{StatsRecord, UsageRecord};

/// One line of a bill.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BillLine {
    pub queue: String,
    pub item: String,
    pub quantity: f64,
    pub unit: &'static str,
    pub unit_price: f64,
    pub amount: f64,
}

/// What one queue used in the month, summed over its records.
#[derive(Default)]
struct Sums {
    /// Seconds by (region, instance type).
    instance_secs: BTreeMap<(String, String), u64>,
    ipv4_secs: u64,
    sent: u64,
    received: u64,
    /// Bytes held × seconds.
    held_byte_secs: f64,
}

/// The bill lines of `records` (one queue's, oldest first, all of them) for the records whose
/// time is in `[from, to)`; `created` is when the queue was made.
pub fn bill(
    queue: &str,
    created: u64,
    records: &[UsageRecord],
    from: u64,
    to: u64,
    prices: &Prices,
) -> Vec<BillLine> {
    let mut sums = Sums::default();
    let mut previous = created;
    for record in records {
        let period = record.time.saturating_sub(previous).min(DAY_SECS);
        previous = record.time;
        if !(from..to).contains(&record.time) {
            continue;
        }
        let placement = (record.region.clone(), record.instance_type.clone());
        *sums.instance_secs.entry(placement).or_default() += period;
        if record.ipv4 {
            sums.ipv4_secs += period;
        }
        sums.sent += record.network_sent;
        sums.received += record.network_received;
        sums.held_byte_secs += record.storage_held as f64 * period as f64;
    }
    // The amount is the quantity as shown times the price, so every line multiplies out as
    // printed (to the millionth both are shown at).
    let line = |item: String, quantity: f64, unit, unit_price: f64| {
        let quantity = round(quantity);
        BillLine {
            queue: queue.to_string(),
            item,
            quantity,
            unit,
            unit_price,
            amount: round(quantity * unit_price),
        }
    };
    let mut lines: Vec<BillLine> = sums
        .instance_secs
        .iter()
        .map(|((region, instance_type), secs)| {
            let price = prices.instance_hour(region, instance_type);
            let item = format!("instance {instance_type} in {region}");
            line(item, *secs as f64 / 3600.0, "hours", price)
        })
        .collect();
    lines.extend([
        line(
            "ipv4".into(),
            sums.ipv4_secs as f64 / 3600.0,
            "hours",
            prices.ipv4_hour,
        ),
        line(
            "network out".into(),
            sums.sent as f64 / GB,
            "GB",
            prices.network_out_gb,
        ),
        line(
            "network in".into(),
            sums.received as f64 / GB,
            "GB",
            prices.network_in_gb,
        ),
        line(
            "storage".into(),
            sums.held_byte_secs / GB / MONTH_SECS,
            "GB-months",
            prices.storage_gb_month,
        ),
    ]);
    lines
}

/// To a millionth: amounts are dollars, and a bill's lines are added up to cents by whoever
/// invoices.
fn round(value: f64) -> f64 {
    (value * 1e6).round() / 1e6
}

/// `YYYY-MM-DD` → its first second since 1970.
pub fn parse_date(text: &str) -> Option<u64> {
    let mut parts = text.split('-');
    let (year, month, day) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || year.len() != 4 || month.len() != 2 || day.len() != 2 {
        return None;
    }
    let (year, month, day): (u64, u64, u64) =
        (year.parse().ok()?, month.parse().ok()?, day.parse().ok()?);
    let valid = year >= 1970 && (1..=12).contains(&month);
    if !valid || !(1..=days_in_month(year, month)).contains(&day) {
        return None;
    }
    Some(days_from_civil(year, month, day) * DAY_SECS)
}

/// `YYYY-MM` → its first second and the next month's.
pub fn parse_month(text: &str) -> Option<(u64, u64)> {
    let (year, month) = text.split_once('-')?;
    if year.len() != 4 || month.len() != 2 {
        return None;
    }
    let (year, month): (u64, u64) = (year.parse().ok()?, month.parse().ok()?);
    let start = parse_date(&format!("{year:04}-{month:02}-01"))?;
    let (next_year, next_month) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    let end = days_from_civil(next_year, next_month, 1) * DAY_SECS;
    Some((start, end))
}

pub const DAY: u64 = DAY_SECS;

/// Today (UTC) as `YYYY-MM-DD`.
pub fn today() -> String {
    let (year, month, day) = qe_shared::calendar::civil_from_days(crate::unix_now() / DAY_SECS);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(time: u64, sent: u64, held: u64, ipv4: bool) -> UsageRecord {
        UsageRecord::from_line(&format!(
            "{time},{sent},5,0,0,{held},m5.large,eu-west-1,{}",
            ipv4 as u8
        ))
        .unwrap()
    }

    #[test]
    fn lines_parse_and_bad_ones_do_not() {
        let line = "1794182400,10,20,30,40,4096,m4.xlarge,us-east-1,1";
        let parsed = UsageRecord::from_line(line).unwrap();
        assert_eq!((parsed.network_received, parsed.ipv4), (20, true));
        assert_eq!(
            (parsed.instance_type.as_str(), parsed.region.as_str()),
            ("m4.xlarge", "us-east-1")
        );
        for bad in [
            "",
            "1,2,3",
            "x,0,0,0,0,0,a,b,1",
            "1,0,0,0,0,0,a,b,2",
            "1,0,0,0,0,0,a,b,c,1",
        ] {
            assert_eq!(UsageRecord::from_line(bad), None, "{bad}");
        }
        let stats = StatsRecord::from_line("5,1,2,3,4,5,6,7,8,9").unwrap();
        assert_eq!(
            (stats.time, stats.counters()),
            (5, [1, 2, 3, 4, 5, 6, 7, 8, 9])
        );
        assert_eq!((stats.published, stats.delivered), (None, None));
        let counted = StatsRecord::from_line("5,1,2,3,4,5,6,7,8,9,40,38").unwrap();
        assert_eq!(
            (counted.counters(), counted.published, counted.delivered),
            ([1, 2, 3, 4, 5, 6, 7, 8, 9], Some(40), Some(38))
        );
        assert_eq!(StatsRecord::from_line("5,1,2"), None);
        assert_eq!(StatsRecord::from_line("5,1,2,3,4,5,6,7,8,x"), None);
        assert_eq!(StatsRecord::from_line("5,1,2,3,4,5,6,7,8,9,40"), None);
    }

    #[test]
    fn every_bill_line_multiplies_out_as_shown() {
        // 400 bytes out is 0.0000004 GB, shown as 0.0: priced from the exact figure the line
        // would say 0.0 GB for 0.000003 dollars.
        let prices = Prices {
            instance_hour: [("r/t".to_string(), 10.0)].into(),
            ipv4_hour: 0.0,
            network_out_gb: 7.0,
            network_in_gb: 0.0,
            storage_gb_month: 0.0,
        };
        let (from, to) = parse_month("2026-11").unwrap();
        let records = [UsageRecord {
            time: from + 1,
            // 0.0000004 GB: shown as 0.0 GB; priced exactly it would be 0.0000028.
            network_sent: 400,
            network_received: 0,
            storage_written: 0,
            storage_read: 0,
            storage_held: 0,
            instance_type: "t".into(),
            region: "r".into(),
            ipv4: false,
        }];
        let lines = bill("q", from - 3599, &records, from, to, &prices);
        for line in &lines {
            let shown = round(line.quantity * line.unit_price);
            assert_eq!(shown, line.amount, "{line:?}");
        }
        let out = lines.iter().find(|l| l.item == "network out").unwrap();
        assert_eq!((out.quantity, out.amount), (0.0, 0.0));
        let instance = lines
            .iter()
            .find(|l| l.item.starts_with("instance"))
            .unwrap();
        // 3600 s = 1 h exactly.
        assert_eq!((instance.quantity, instance.amount), (1.0, 10.0));
    }

    #[test]
    fn dates_and_months() {
        assert_eq!(parse_date("1970-01-02"), Some(DAY_SECS));
        assert_eq!(parse_date("2026-11-09"), Some(1_794_182_400));
        assert_eq!(parse_date("2026-02-29"), None);
        assert_eq!(parse_date("2026-1-09"), None);
        let (start, end) = parse_month("2026-12").unwrap();
        assert_eq!(end - start, 31 * DAY_SECS);
        assert_eq!(parse_month("2026-13"), None);
    }

    #[test]
    fn a_bill_prices_hours_bytes_and_storage_for_the_month_only() {
        let prices = Prices {
            instance_hour: [("eu-west-1/m5.large".to_string(), 0.1)].into(),
            ipv4_hour: 0.005,
            network_out_gb: 0.09,
            network_in_gb: 0.0,
            storage_gb_month: 0.1,
        };
        let (from, to) = parse_month("2026-11").unwrap();
        let records = [
            record(from - 1800, 999, 0, true), // October's: not billed
            // An hour since the October one (a record's period is billed in its month).
            record(from + 1800, 2_000_000_000, 730_000_000, true),
            record(from + 3600, 1_000_000_000, 730_000_000, false), // half an hour
        ];
        let lines = bill("q", from - 3600, &records, from, to, &prices);
        let find = |item: &str| lines.iter().find(|l| l.item == item).unwrap().clone();
        let instance = find("instance m5.large in eu-west-1");
        assert_eq!((instance.quantity, instance.amount), (1.5, 0.15));
        assert_eq!(find("ipv4").quantity, 1.0);
        let out = find("network out");
        assert_eq!((out.quantity, out.amount), (3.0, 0.27));
        // 0.73 GB for an hour and a half is 0.73 × 1.5 / 730 GB-months.
        assert_eq!(find("storage").quantity, 0.0015);
    }
}
