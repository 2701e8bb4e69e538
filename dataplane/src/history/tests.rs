//! The history's rules with the clock in hand.

use super::*;
use serde_json::json;

/// 2026-11-09 00:00:00 UTC, the manual's example day.
const NOV_9: u64 = 1_794_182_400;

fn open(dir: &std::path::Path, now: u64) -> (crate::store::meta::Meta, History) {
    let meta = crate::store::meta::Meta::open(dir).unwrap();
    let history = History::open(meta.disk(), now).unwrap();
    (meta, history)
}

fn day(year: u64, month: u64, day: u64) -> Day {
    parse_day(Some(&json!(year)), Some(&json!(month)), Some(&json!(day))).unwrap()
}

fn usage_labels() -> UsageLabels {
    UsageLabels {
        instance_type: "m4.xlarge".into(),
        region: "us-east-1".into(),
        ipv4: true,
    }
}

#[test]
fn days_are_utc_dates() {
    assert_eq!(day(2026, 11, 9).start, NOV_9);
    assert_eq!(day(1970, 1, 1).start, 0);
    assert_eq!(day(2024, 2, 29).start + DAY_SECS, day(2024, 3, 1).start);
    assert_eq!(civil_from_days(NOV_9 / DAY_SECS), (2026, 11, 9));
    let code = |y: serde_json::Value, m: serde_json::Value, d: serde_json::Value| {
        parse_day(Some(&y), Some(&m), Some(&d))
            .unwrap_err()
            .number()
    };
    assert_eq!(code(json!(1969), json!(1), json!(1)), 404);
    assert_eq!(code(json!("2026"), json!(1), json!(1)), 404);
    assert_eq!(code(json!(2026.0), json!(1), json!(1)), 404);
    assert_eq!(code(json!(2026), json!(13), json!(1)), 405);
    assert_eq!(code(json!(2026), json!(0), json!(1)), 405);
    assert_eq!(code(json!(2025), json!(2), json!(29)), 406);
    assert_eq!(code(json!(2026), json!(4), json!(31)), 406);
    assert_eq!(
        parse_day(None, Some(&json!(1)), Some(&json!(1)))
            .unwrap_err()
            .number(),
        404
    );
}

#[test]
fn records_are_read_a_utc_day_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, history) = open(dir.path(), NOV_9);
    history
        .record_stats(NOV_9 - 300, "9,0,0,0,0,0,0,0,0", Flow::default())
        .unwrap();
    history
        .record_stats(NOV_9, "1,1,1,0,1,0,0,0,1", Flow::default())
        .unwrap();
    let flow = Flow {
        published: 40,
        delivered: 38,
    };
    history
        .record_stats(NOV_9 + 300, "2,1,1,0,1,1,0,0,2", flow)
        .unwrap();
    history
        .record_stats(NOV_9 + DAY_SECS - 1, "4,1,1,0,1,1,0,0,3", Flow::default())
        .unwrap();
    history
        .record_stats(NOV_9 + DAY_SECS, "8,0,0,0,0,0,0,0,0", Flow::default())
        .unwrap();
    let csv = history.stats_of(day(2026, 11, 9), false).unwrap();
    assert_eq!(
        csv,
        format!(
            "{NOV_9},1,1,1,0,1,0,0,0,1\n{},2,1,1,0,1,1,0,0,2\n{},4,1,1,0,1,1,0,0,3\n",
            NOV_9 + 300,
            NOV_9 + DAY_SECS - 1
        )
    );
    // Averages, rounded to whole numbers: messages (1+2+4)/3 = 2.33 → 2; durable 6/3 = 2.
    let average = history.stats_of(day(2026, 11, 9), true).unwrap();
    assert_eq!(average, format!("{NOV_9},2,1,1,0,1,1,0,0,2\n"));
    assert_eq!(history.stats_of(day(2026, 11, 11), true).unwrap(), "");
    // The interval's flow is not in getstats (the manual's nine columns), but it is in the
    // lines reported to the control plane.
    let reported = history.unreported(Kind::Stats, 10).unwrap();
    assert_eq!(
        reported[2],
        (
            NOV_9 + 300,
            format!("{},2,1,1,0,1,1,0,0,2,40,38", NOV_9 + 300)
        )
    );
    let read = StatsRecord::from_line(&reported[2].1).unwrap();
    assert_eq!((read.published, read.delivered), (Some(40), Some(38)));
}

#[test]
fn each_stats_interval_counts_what_went_through_it() {
    let totals = |published, delivered| EngineTotals {
        published,
        delivered,
        ..EngineTotals::default()
    };
    let mut meter = FlowMeter::new(totals(5, 3));
    assert_eq!(
        meter.take(totals(15, 10)),
        Flow {
            published: 10,
            delivered: 7
        }
    );
    assert_eq!(meter.take(totals(15, 10)), Flow::default());
    assert_eq!(
        meter.take(totals(16, 12)),
        Flow {
            published: 1,
            delivered: 2
        }
    );
}

/// A record kept before nodes counted the flow (nine columns) still reads, both ways.
#[test]
fn a_record_without_the_flow_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, history) = open(dir.path(), NOV_9);
    history
        .stats
        .insert((NOV_9 + 300).to_be_bytes(), "3,0,0,0,0,0,0,0,1".as_bytes())
        .unwrap();
    assert_eq!(
        history.stats_of(day(2026, 11, 9), false).unwrap(),
        format!("{},3,0,0,0,0,0,0,0,1\n", NOV_9 + 300)
    );
    let reported = history.unreported(Kind::Stats, 10).unwrap();
    let read = StatsRecord::from_line(&reported[0].1).unwrap();
    assert_eq!((read.messages, read.published), (3, None));
}

#[test]
fn usage_totals_add_up_bytes_and_average_storage() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, history) = open(dir.path(), NOV_9);
    let record = |sent, held| Usage {
        network_sent: sent,
        network_received: 10,
        storage_written: 100,
        storage_read: 1,
        storage_held: held,
    };
    history
        .record_usage(NOV_9 + 1800, &record(1000, 4096), &usage_labels())
        .unwrap();
    history
        .record_usage(NOV_9 + 3600, &record(500, 8192), &usage_labels())
        .unwrap();
    let all = history.usage_of(day(2026, 11, 9), false).unwrap();
    assert_eq!(
        all,
        format!(
            "{},1000,10,100,1,4096,m4.xlarge,us-east-1,1\n{},500,10,100,1,8192,m4.xlarge,us-east-1,1\n",
            NOV_9 + 1800,
            NOV_9 + 3600
        )
    );
    let totals = history.usage_of(day(2026, 11, 9), true).unwrap();
    assert_eq!(
        totals,
        format!("{NOV_9},1500,20,200,2,6144,m4.xlarge,us-east-1,1\n")
    );
}

#[test]
fn a_day_before_the_queue_existed_is_407_naming_the_first_day() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, history) = open(dir.path(), NOV_9 + 3600);
    let refused = history.check_has_data(day(2026, 11, 8)).unwrap_err();
    assert_eq!(refused.code.number(), 407);
    assert_eq!(
        refused.reason.unwrap(),
        "Invalid date, don't have data before 2026-11-09."
    );
    assert!(
        history.check_has_data(day(2026, 11, 9)).is_ok(),
        "the first day itself"
    );
    assert!(
        history.check_has_data(day(2030, 1, 1)).is_ok(),
        "a later day: records so far"
    );
}

#[test]
fn records_older_than_their_retention_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, history) = open(dir.path(), 0);
    let now = NOV_9;
    let two_years_ago = now - 2 * YEAR_SECS;
    history
        .record_stats(two_years_ago - 1, "1,0,0,0,0,0,0,0,0", Flow::default())
        .unwrap();
    history
        .record_stats(two_years_ago + 1, "2,0,0,0,0,0,0,0,0", Flow::default())
        .unwrap();
    history
        .record_usage(two_years_ago - 1, &Usage::default(), &usage_labels())
        .unwrap();
    history.prune(now, 2, 5).unwrap();
    let kept: Vec<u64> = history
        .stats
        .iter()
        .keys()
        .map(|k| u64::from_be_bytes(k.unwrap().as_ref().try_into().unwrap()))
        .collect();
    assert_eq!(kept, [two_years_ago + 1]);
    assert_eq!(history.usage.len(), 1, "usage keeps 5 years");
    history.prune(now, 2, 1).unwrap();
    assert_eq!(history.usage.len(), 0);
}

#[test]
fn history_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_meta, history) = open(dir.path(), NOV_9);
        // A record is synced before it counts: nothing more is needed to keep it.
        history
            .record_stats(NOV_9 + 300, "1,0,0,0,0,0,0,0,0", Flow::default())
            .unwrap();
    }
    let (_db, history) = reopen(dir.path(), NOV_9 + DAY_SECS * 3);
    assert_eq!(history.created, NOV_9, "the first day is kept");
    assert_eq!(
        history.stats_of(day(2026, 11, 9), false).unwrap(),
        format!("{},1,0,0,0,0,0,0,0,0\n", NOV_9 + 300)
    );
}

/// sled lets go of its lock a moment after the last handle drops.
fn reopen(dir: &std::path::Path, now: u64) -> (crate::store::meta::Meta, History) {
    for _ in 0..100 {
        if let Ok(meta) = crate::store::meta::Meta::open(dir) {
            let history = History::open(meta.disk(), now).unwrap();
            return (meta, history);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    open(dir, now)
}

#[test]
fn a_usage_record_is_its_periods_share_of_the_totals() {
    let start = Totals {
        network_sent: 100,
        network_received: 50,
        storage_written: 0,
        storage_read: 7,
    };
    let mut meter = UsageMeter::new(start);
    meter.sample_held(1000);
    meter.sample_held(2000);
    let now = Totals {
        network_sent: 350,
        network_received: 60,
        storage_written: 4096,
        storage_read: 7,
    };
    let usage = meter.take(now, 3000);
    assert_eq!(
        usage,
        Usage {
            network_sent: 250,
            network_received: 10,
            storage_written: 4096,
            storage_read: 0,
            storage_held: 2000,
        }
    );
    let next = meter.take(now, 500);
    assert_eq!(
        (next.network_sent, next.storage_held),
        (0, 500),
        "the next period starts fresh"
    );
}

#[test]
fn records_fall_on_multiples_of_their_frequency() {
    assert_eq!(next_multiple(NOV_9 + 1, 300), NOV_9 + 300);
    assert_eq!(next_multiple(NOV_9, 300), NOV_9 + 300);
    assert_eq!(next_multiple(NOV_9 + 299, 1800), NOV_9 + 1800);
    // A day holds 288 five-minute records and 48 half-hour ones, none on a day's boundary twice.
    assert_eq!(DAY_SECS % 300, 0);
}
