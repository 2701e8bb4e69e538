//! `bench stalls`: many short runs of publishers with one durable publish in flight each,
//! against one long-lived node, each run on new connections. A lost wake-up between the
//! message log's threads and a connection shows here as a run whose rate collapses while the
//! node sleeps, and as a publish reply that takes seconds (issue 27). Each run prints its rate,
//! its worst publish reply, and the log's writer and syncer latencies in that run (the node's
//! `getlogrounds`, README "Beyond the manual"); the end gives the histograms.

use crate::client::{login, next_text};
use crate::node::{admin_login, Node, NodeConfig, PUBLISHER};
use crate::workload::{check_contains_once, subscriber, Received};
use futures::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, Semaphore};
use yawc::frame::Frame;

#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// Runs, each on new connections to the same node.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Seconds of publishing per run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Publishers (one publish in flight each) and as many subscribers (capacity 1).
    #[arg(long, default_value_t = 16)]
    publishers: usize,
    /// Durabilities, each its own series of runs on its own node.
    #[arg(long, value_delimiter = ',', default_value = "2,1")]
    durabilities: Vec<u8>,
    /// Body size in bytes (at least 16: the send time).
    #[arg(long, default_value_t = 100)]
    size: usize,
}

/// A publish still unanswered this long after its run's end is given up on (counted as a
/// stall; the connection is dropped).
const GIVE_UP_AFTER: Duration = Duration::from_secs(10);

/// What one run measured.
struct Run {
    rate: f64,
    /// The slowest publish → reply.
    worst_reply: Duration,
    /// Publishes never answered (given up on).
    unanswered: usize,
    /// `None` from a node without `getlogrounds` (a build from before it).
    rounds: Option<LogRounds>,
}

pub async fn stalls(config: &NodeConfig, settings: &Settings) {
    println!(
        "{} runs of {} s per durability: {} publishers x 1 in flight, {} subscribers of \
         capacity 1, {} B bodies, one node per durability",
        settings.runs, settings.seconds, settings.publishers, settings.publishers, settings.size
    );
    for &durability in &settings.durabilities {
        let dir = tempfile::tempdir_in(&config.data_root).unwrap();
        let node = Node::start(config, dir.path());
        println!("\ndurability {durability}");
        println!(
            "{:>4} {:>8} {:>10} {:>10}  {}",
            "run",
            "msg/s",
            "worstReply",
            "unanswered",
            LogRounds::header()
        );
        let mut runs = Vec::with_capacity(settings.runs);
        for n in 0..settings.runs {
            let run = run(config, &node.url(), settings, durability).await;
            println!(
                "{:>4} {:>8.0} {:>8.1}ms {:>10}  {}",
                n + 1,
                run.rate,
                run.worst_reply.as_secs_f64() * 1e3,
                run.unanswered,
                run.rounds.as_ref().map_or("-".into(), LogRounds::line)
            );
            runs.push(run);
        }
        node.kill();
        summary(&runs);
    }
}

/// One run: subscribers first, then the publishers for `seconds`, on new connections.
async fn run(config: &NodeConfig, url: &str, settings: &Settings, durability: u8) -> Run {
    let mut admin = admin_login(&config.wire, url).await;
    let rounds_before = LogRounds::read(&mut admin).await;
    let epoch = Instant::now();
    let delivered = Arc::new((AtomicUsize::new(0), Notify::new()));
    let (stop, stopped) = watch::channel(false);
    // The publishers are closed-loop already (one in flight each): the subscribers' budget
    // is never taken from, only given back to, so it starts at half the most it may hold.
    let budget = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS >> 1));
    let subscribers: Vec<_> = (0..settings.publishers)
        .map(|_| {
            let subscriber = subscriber(
                config.wire.clone(),
                url.to_string(),
                epoch,
                1,
                delivered.clone(),
                budget.clone(),
                stopped.clone(),
            );
            tokio::spawn(subscriber)
        })
        .collect();
    let started = Instant::now();
    let until = started + Duration::from_secs(settings.seconds);
    let publishers: Vec<_> = (0..settings.publishers)
        .map(|_| {
            let publish = publisher(
                config.wire.clone(),
                url.to_string(),
                epoch,
                settings.size,
                durability,
                until,
            );
            tokio::spawn(publish)
        })
        .collect();
    let mut answered = Answered::default();
    for handle in publishers {
        let part = handle.await.unwrap();
        answered.ids.extend(part.ids);
        answered.worst = answered.worst.max(part.worst);
        answered.unanswered += part.unanswered;
    }
    let elapsed = started.elapsed();
    // Every answered publish reaches a subscriber; an unanswered one may have too.
    let deadline = tokio::time::Instant::now() + GIVE_UP_AFTER;
    while delivered.0.load(Ordering::Relaxed) < answered.ids.len() {
        let wait = tokio::time::timeout_at(deadline, delivered.1.notified()).await;
        assert!(wait.is_ok(), "answered publishes were not delivered");
    }
    stop.send(true).unwrap();
    let mut received = Received::default();
    for handle in subscribers {
        received.ids.extend(handle.await.unwrap().ids);
    }
    check_contains_once(&mut answered.ids, &mut received.ids, answered.unanswered);
    let rounds_after = LogRounds::read(&mut admin).await;
    let rounds = rounds_after
        .zip(rounds_before)
        .map(|(after, before)| after.since(&before));
    Run {
        rate: answered.ids.len() as f64 / elapsed.as_secs_f64(),
        worst_reply: answered.worst,
        unanswered: answered.unanswered,
        rounds,
    }
}

#[derive(Default)]
struct Answered {
    ids: Vec<String>,
    worst: Duration,
    unanswered: usize,
}

/// Publishes one message at a time until `until`; gives up on a reply `GIVE_UP_AFTER` past it.
async fn publisher(
    wire: crate::client::Wire,
    url: String,
    epoch: Instant,
    size: usize,
    durability: u8,
    until: Instant,
) -> Answered {
    let socket = login(&wire, &url, serde_json::json!({
        "username": PUBLISHER.0, "password": PUBLISHER.1, "role": "publisher", "queuetype": "distribute",
    }))
    .await;
    let (mut sink, mut stream) = socket.split();
    let padding = "x".repeat(size.saturating_sub(16));
    let give_up = tokio::time::Instant::from_std(until + GIVE_UP_AFTER);
    let mut answered = Answered::default();
    while Instant::now() < until {
        let sent = Instant::now();
        let stamp = (sent - epoch).as_nanos() as u64;
        let request = format!(r#"{{"body":"{stamp:016x}{padding}","durability":{durability}}}"#);
        sink.send(Frame::text(request)).await.unwrap();
        let Ok(reply) = tokio::time::timeout_at(give_up, next_text(&mut stream)).await else {
            answered.unanswered += 1;
            break;
        };
        let reply = reply.expect("a reply");
        answered.worst = answered.worst.max(sent.elapsed());
        assert!(reply.contains(r#""status":"Success.""#), "publish: {reply}");
        let id = reply
            .split(r#""id":""#)
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        answered.ids.push(id.expect("an id").to_string());
    }
    answered
}

/// The message log's writer and syncer latencies, as the node's `getlogrounds` counts them:
/// for each, how many rounds took under 2^k microseconds, k = 0..BUCKETS.
#[derive(Clone, Default)]
struct LogRounds {
    /// A batch of records: from its first record's append to its write's end.
    write: Vec<u64>,
    /// A sync: from its request to the end of the `fdatasync` that answers it.
    sync: Vec<u64>,
}

impl LogRounds {
    async fn read(admin: &mut crate::client::Socket) -> Option<LogRounds> {
        admin
            .send(Frame::text(r#"{"cmd":"getlogrounds"}"#))
            .await
            .unwrap();
        let reply = next_text(admin).await.expect("a reply");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        if reply["code"] == 400 {
            return None; // an older node
        }
        assert_eq!(reply["status"], "Success.", "getlogrounds: {reply}");
        let buckets = |name: &str| -> Vec<u64> {
            let list = reply[name].as_array().expect("bucket counts");
            list.iter().map(|n| n.as_u64().unwrap()).collect()
        };
        Some(LogRounds {
            write: buckets("write"),
            sync: buckets("sync"),
        })
    }

    fn since(&self, before: &LogRounds) -> LogRounds {
        let minus = |a: &[u64], b: &[u64]| a.iter().zip(b).map(|(a, b)| a - b).collect();
        LogRounds {
            write: minus(&self.write, &before.write),
            sync: minus(&self.sync, &before.sync),
        }
    }

    fn header() -> String {
        format!(
            "{:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "writes", "write50", "writeMax", "syncs", "sync50", "syncMax"
        )
    }

    fn line(&self) -> String {
        let (writes, write50, write_max) = quantiles(&self.write);
        let (syncs, sync50, sync_max) = quantiles(&self.sync);
        format!("{writes:>8} {write50:>8} {write_max:>8} {syncs:>8} {sync50:>8} {sync_max:>8}")
    }
}

/// The count, and the median's and the slowest's bucket as "<N µs" / "<N ms".
fn quantiles(buckets: &[u64]) -> (u64, String, String) {
    let count: u64 = buckets.iter().sum();
    if count == 0 {
        return (0, "-".into(), "-".into());
    }
    let bound = |k: usize| {
        let us = 1u64 << k;
        match us {
            0..1_000 => format!("<{us}us"),
            _ => format!("<{}ms", us.div_ceil(1_000)),
        }
    };
    let mut seen = 0;
    let median = buckets
        .iter()
        .position(|&n| {
            seen += n;
            seen * 2 >= count
        })
        .unwrap_or(0);
    let slowest = buckets.iter().rposition(|&n| n > 0).unwrap_or(0);
    (count, bound(median), bound(slowest))
}

/// The rates against their median, and the worst replies, as histograms.
fn summary(runs: &[Run]) {
    let mut rates: Vec<f64> = runs.iter().map(|r| r.rate).collect();
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    let below = rates.iter().filter(|&&r| r < 0.8 * median).count();
    let worst = runs.iter().map(|r| r.worst_reply).max().unwrap_or_default();
    let unanswered: usize = runs.iter().map(|r| r.unanswered).sum();
    println!(
        "runs {}: median {median:.0} msg/s, min {:.0} ({:.2}x median), max {:.0}; runs below \
         0.8x median: {below}; worst publish reply {:.1} ms; publishes never answered: {unanswered}",
        runs.len(),
        rates[0],
        rates[0] / median,
        rates[rates.len() - 1],
        worst.as_secs_f64() * 1e3
    );
    println!("rate / median  runs");
    let edges = [0.0, 0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, f64::INFINITY];
    for pair in edges.windows(2) {
        let n = rates
            .iter()
            .filter(|&&r| r / median >= pair[0] && r / median < pair[1])
            .count();
        println!(
            "  [{:.2}, {:.2})  {n:>4} {}",
            pair[0],
            pair[1],
            "#".repeat(n)
        );
    }
    println!("worst reply    runs");
    let edges_ms = [
        0.0,
        1.0,
        2.0,
        5.0,
        10.0,
        20.0,
        50.0,
        100.0,
        1000.0,
        f64::INFINITY,
    ];
    for pair in edges_ms.windows(2) {
        let n = runs
            .iter()
            .filter(|r| {
                let ms = r.worst_reply.as_secs_f64() * 1e3;
                ms >= pair[0] && ms < pair[1]
            })
            .count();
        println!(
            "  [{:>4}, {:>4}) ms  {n:>4} {}",
            pair[0],
            pair[1],
            "#".repeat(n)
        );
    }
}
