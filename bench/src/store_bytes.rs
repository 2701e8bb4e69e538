//! `bench store-bytes`: what one queue's usage and stats records cost the control plane's
//! store over months, with and without the leader's roll-ups (`controlplane::rollup`). One
//! queue's node reports as the manual's defaults make it (a stats record every 300 s, a usage
//! record every 1800 s) into a sled store, a day at a time; with roll-ups, the leader's pass
//! runs after each day, as its hourly passes would. Bytes are the keys' and values' lengths
//! as stored (what a backup holds and etcd's database keeps, before its own overhead per
//! key). See docs/deploy.md §12.

use controlplane::model::queue::{self, NewQueue, Tier};
use controlplane::store::{Store, StoreConfig};
use qe_shared::node_channel::{StatsRecord, UsageRecord};

const DAY: u64 = 86_400;

#[derive(clap::Args)]
pub struct Settings {
    /// Months of records (30 days each).
    #[arg(long, default_value_t = 12)]
    months: u64,
    /// Seconds between stats records (the manual's `stats-frequency-secs`, 300 to 3600).
    #[arg(long, default_value_t = 300)]
    stats_every_secs: u64,
    /// Seconds between usage records (the manual's `usage-frequency-secs`, 1800 to 86400).
    #[arg(long, default_value_t = 1800)]
    usage_every_secs: u64,
}

/// What the store holds of one queue's records.
#[derive(Default, Clone, Copy)]
struct Held {
    records: usize,
    bytes: usize,
}

pub async fn store_bytes(settings: &Settings) {
    println!(
        "one queue, {} months, a stats record every {} s and a usage record every {} s",
        settings.months, settings.stats_every_secs, settings.usage_every_secs
    );
    println!("roll-ups  records_kept  bytes_kept  bytes_per_queue_month  last_month_added");
    for rollups in [false, true] {
        let (after, last_month) = simulate(settings, rollups).await;
        println!(
            "{:8}  {:12}  {:10}  {:21}  {:16}",
            if rollups { "yes" } else { "no" },
            after.records,
            after.bytes,
            after.bytes as u64 / settings.months,
            last_month,
        );
    }
}

/// The records held at the end, and the bytes the last month added.
async fn simulate(settings: &Settings, rollups: bool) -> (Held, usize) {
    let dir = tempfile::tempdir().expect("a directory");
    let store = Store::open(&StoreConfig::Sled, dir.path(), "bench")
        .await
        .expect("a sled store");
    let new = NewQueue {
        tier: Tier::Standard,
        region: "local".into(),
        instance_type: "local".into(),
        ipv4: false,
        account: None,
        ..Default::default()
    };
    let (queue, _) = queue::create(new);
    store.put(&queue).await.expect("the queue's record");
    let start = controlplane::usage::parse_date("2026-01-01").expect("a date");
    let days = settings.months * 30;
    let mut before_last_month = 0;
    for day in 0..days {
        if day == days - 30 {
            before_last_month = held(&store).await.bytes;
        }
        let from = start + day * DAY;
        let stats = (from..from + DAY)
            .step_by(settings.stats_every_secs as usize)
            .map(|time| {
                (
                    time,
                    serde_json::to_vec(&stats_record(time)).expect("plain fields"),
                )
            })
            .collect();
        let usage = (from + settings.usage_every_secs..=from + DAY)
            .step_by(settings.usage_every_secs as usize)
            .map(|time| {
                (
                    time,
                    serde_json::to_vec(&usage_record(time)).expect("plain fields"),
                )
            })
            .collect();
        store
            .keep_reports(&queue.id, usage, stats)
            .await
            .expect("kept");
        if rollups {
            let now = from + DAY;
            controlplane::rollup::pass(&store, std::slice::from_ref(&queue), now)
                .await
                .expect("a pass");
        }
    }
    let after = held(&store).await;
    (after, after.bytes - before_last_month)
}

async fn held(store: &Store) -> Held {
    let all = store.dump().await.expect("the store's contents");
    let records = all
        .iter()
        .filter(|(key, _)| key.starts_with("usage/") || key.starts_with("stats/"));
    records.fold(Held::default(), |held, (key, value)| Held {
        records: held.records + 1,
        bytes: held.bytes + key.len() + value.len(),
    })
}

/// A queue holding a few thousand messages, with some traffic.
fn stats_record(time: u64) -> StatsRecord {
    StatsRecord {
        time,
        messages: 3_000 + time % 1_000,
        publishers: 4,
        subscribers: 8,
        saved_subscribers: 1,
        administrators: 0,
        unacknowledged: 12,
        dead_letter: 3,
        delayed: 40,
        durable: 2_900 + time % 1_000,
        published: Some(12_000 + time % 5_000),
        delivered: Some(11_900 + time % 5_000),
    }
}

fn usage_record(time: u64) -> UsageRecord {
    UsageRecord {
        time,
        network_sent: 52_000_000 + time % 1_000_000,
        network_received: 48_000_000 + time % 1_000_000,
        storage_written: 40_000_000 + time % 1_000_000,
        storage_read: 39_000_000 + time % 1_000_000,
        storage_held: 3_000_000_000 + time % 10_000_000,
        instance_type: "t4g.small".into(),
        region: "eu-west-1".into(),
        ipv4: true,
    }
}
