//! `bench dedup`: what deduplication ids (`"dedupid"` on a publish, README "Exactly-once
//! publish") cost the node.
//!
//! - Memory per held id: N messages of 100 B at durability 0, each with its own id, published
//!   by 16 publishers (64 in flight each) while 16 subscribers ack them all, so that the
//!   messages are gone and only the ids are held; then the node's resident memory (VmRSS) and
//!   `getcfg`'s `messages-memory-used`, against the same run without ids on a node of its own.
//!   The node claims `engine::dedup::ENTRY_BYTES` (128) per id held.
//! - Cost: publish throughput and node CPU per message with distinct ids and without, and for
//!   the same N ids sent again (all within the five-minute window: each must be answered with
//!   the first's message id, and nothing new may be delivered).
//! - Durable: the same three at durability 2, with fewer messages.

use crate::client::{login, next_text, Wire};
use crate::node::{admin_login, Node, NodeConfig, PUBLISHER};
use crate::workload::subscriber;
use futures::{SinkExt, StreamExt};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, Semaphore};
use yawc::frame::Frame;

#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// Messages of the durability-0 runs (each with its own id in the runs with ids).
    #[arg(long, default_value_t = 1_000_000)]
    messages: usize,
    /// Messages of the durability-2 runs.
    #[arg(long, default_value_t = 50_000)]
    durable_messages: usize,
    /// Publishers, each with `window` publishes in flight (told apart by `context`).
    #[arg(long, default_value_t = 16)]
    publishers: usize,
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Subscribers, each of capacity `window`, acking everything.
    #[arg(long, default_value_t = 16)]
    subscribers: usize,
}

/// What the node claims one held id costs (`dataplane::engine::dedup::ENTRY_BYTES`).
const CLAIMED_ENTRY_BYTES: f64 = 128.0;

/// Body size, as the other subcommands' default.
const BODY_BYTES: usize = 100;

/// What a publish phase measured.
struct Phase {
    what: &'static str,
    durability: u8,
    messages: usize,
    rate: f64,
    cpu_us_per_message: f64,
    /// Resident memory once the phase is over (its messages all acked).
    rss: u64,
    /// The node's peak resident memory so far (VmHWM: a hash table's growth holds the old
    /// table and the new one at once).
    peak_rss: u64,
    /// `getcfg`'s `messages-memory-used` then.
    memory_used: u64,
    /// Refusals by code (none expected).
    refused: BTreeMap<String, usize>,
    /// Repeats: replies that named another message than the first publish's.
    other_ids: usize,
    /// Repeats: messages delivered during the phase (none expected).
    new_deliveries: usize,
}

/// A node with its subscribers acking everything, and an administrator.
struct Setup {
    node: Node,
    _dir: tempfile::TempDir,
    url: String,
    wire: Wire,
    epoch: Instant,
    delivered: Arc<(AtomicUsize, Notify)>,
    /// The closed loop: a publish takes a permit, the subscriber that gets it gives it back.
    budget: Arc<Semaphore>,
    stop: watch::Sender<bool>,
    subscribers: Vec<tokio::task::JoinHandle<crate::workload::Received>>,
    admin: crate::client::Socket,
    /// Resident memory of the node once everyone logged in, before any publish.
    idle_rss: u64,
}

impl Setup {
    async fn start(config: &NodeConfig, settings: &Settings) -> Setup {
        let dir = tempfile::tempdir_in(&config.data_root).unwrap();
        let node = Node::start(config, dir.path());
        let url = node.url();
        let epoch = Instant::now();
        let delivered = Arc::new((AtomicUsize::new(0), Notify::new()));
        let budget = Arc::new(Semaphore::new(settings.publishers * settings.window));
        let (stop, stopped) = watch::channel(false);
        let subscribers = (0..settings.subscribers)
            .map(|_| {
                tokio::spawn(subscriber(
                    config.wire.clone(),
                    url.clone(),
                    epoch,
                    settings.window,
                    delivered.clone(),
                    budget.clone(),
                    stopped.clone(),
                ))
            })
            .collect();
        let admin = admin_login(&config.wire, &url).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, idle_rss) = node.memory();
        Setup {
            node,
            _dir: dir,
            url,
            wire: config.wire.clone(),
            epoch,
            delivered,
            budget,
            stop,
            subscribers,
            admin,
            idle_rss,
        }
    }

    /// `getcfg`'s `messages-memory-used`.
    async fn memory_used(&mut self) -> u64 {
        self.admin
            .send(Frame::text(r#"{"cmd":"getcfg"}"#.to_string()))
            .await
            .unwrap();
        let reply = next_text(&mut self.admin).await.expect("a reply");
        let reply: serde_json::Value = serde_json::from_str(&reply).expect("JSON");
        let csv = reply["csv"].as_str().expect("getcfg's csv");
        csv.lines()
            .find_map(|line| line.strip_prefix("messages-memory-used,r,"))
            .expect("messages-memory-used")
            .trim()
            .parse()
            .unwrap()
    }

    /// Publishes `messages` messages (ids `tag-0` … when `tag` is given) and waits until the
    /// subscribers acked every one made. `first` are the message ids of a run before with the
    /// same ids: every reply must name the same message, and nothing is delivered.
    async fn phase(
        &mut self,
        settings: &Settings,
        what: &'static str,
        durability: u8,
        messages: usize,
        tag: Option<&str>,
        first: Option<&[String]>,
    ) -> (Phase, Vec<String>) {
        let delivered_before = self.delivered.0.load(Ordering::Relaxed);
        // Repeats make nothing, so no subscriber gives a permit back: the window alone
        // bounds them.
        let budget = match first {
            None => self.budget.clone(),
            Some(_) => Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
        };
        let cpu_before = self.node.cpu_time();
        let started = Instant::now();
        let per_publisher = messages.div_ceil(settings.publishers);
        let handles: Vec<_> = (0..settings.publishers)
            .map(|n| {
                let range =
                    (n * per_publisher).min(messages)..((n + 1) * per_publisher).min(messages);
                let plan = Plan {
                    wire: self.wire.clone(),
                    url: self.url.clone(),
                    epoch: self.epoch,
                    durability,
                    window: settings.window,
                    tag: tag.map(str::to_string),
                };
                tokio::spawn(publisher(plan, range, budget.clone()))
            })
            .collect();
        let mut ids = vec![String::new(); messages];
        let mut refused = BTreeMap::new();
        for handle in handles {
            let part = handle.await.unwrap();
            for (n, id) in part.ids {
                ids[n] = id;
            }
            for (code, count) in part.refused {
                *refused.entry(code).or_insert(0) += count;
            }
        }
        let made = ids.iter().filter(|id| !id.is_empty()).count();
        let (other_ids, new_deliveries) = match first {
            None => {
                while self.delivered.0.load(Ordering::Relaxed) < delivered_before + made {
                    self.delivered.1.notified().await;
                }
                (0, 0)
            }
            Some(first) => {
                let other = ids
                    .iter()
                    .zip(first)
                    .filter(|(id, first)| !id.is_empty() && id != first)
                    .count();
                (other, 0)
            }
        };
        let elapsed = started.elapsed();
        let cpu = self.node.cpu_time() - cpu_before;
        // What is still on its way settles (a repeat that made a message would be delivered
        // by now), and the node's freed memory with it.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let new_deliveries = match first {
            None => new_deliveries,
            Some(_) => self.delivered.0.load(Ordering::Relaxed) - delivered_before,
        };
        let (peak_rss, rss) = self.node.memory();
        let memory_used = self.memory_used().await;
        let phase = Phase {
            what,
            durability,
            messages,
            rate: made as f64 / elapsed.as_secs_f64(),
            cpu_us_per_message: cpu.as_secs_f64() * 1e6 / messages as f64,
            rss,
            peak_rss,
            memory_used,
            refused,
            other_ids,
            new_deliveries,
        };
        (phase, ids)
    }

    async fn finish(self) {
        self.stop.send(true).unwrap();
        for handle in self.subscribers {
            handle.await.unwrap();
        }
        self.node.kill();
    }
}

/// What every publisher of a phase shares.
#[derive(Clone)]
struct Plan {
    wire: Wire,
    url: String,
    /// Bodies start with nanoseconds since this (the subscribers read them).
    epoch: Instant,
    durability: u8,
    window: usize,
    /// Message `n` carries the id `TAG-n`; none without.
    tag: Option<String>,
}

/// What a publisher got back.
#[derive(Default)]
struct Published {
    /// (message number, message id) of each publish taken.
    ids: Vec<(usize, String)>,
    refused: BTreeMap<String, usize>,
}

/// Publishes messages `range`, `window` in flight, each taking a permit of `budget` (given
/// back by the subscriber that gets it; at once when refused).
async fn publisher(plan: Plan, range: Range<usize>, budget: Arc<Semaphore>) -> Published {
    let socket = login(
        &plan.wire,
        &plan.url,
        serde_json::json!({
            "username": PUBLISHER.0, "password": PUBLISHER.1, "role": "publisher",
            "queuetype": "distribute",
        }),
    )
    .await;
    let (mut sink, mut stream) = socket.split();
    let padding = "x".repeat(BODY_BYTES - 16);
    let mut published = Published::default();
    let mut next = range.start;
    let mut unanswered = 0;
    loop {
        if next == range.end && unanswered == 0 {
            return published;
        }
        let may_send = next < range.end && unanswered < plan.window;
        let reply = tokio::select! {
            permit = budget.acquire(), if may_send => {
                permit.unwrap().forget();
                // This publish and every other the window and the budget allow now go out
                // with one flush.
                loop {
                    let now = plan.epoch.elapsed().as_nanos() as u64;
                    let dedup = match &plan.tag {
                        Some(tag) => format!(r#","dedupid":"{tag}-{next}""#),
                        None => String::new(),
                    };
                    let request = format!(
                        r#"{{"body":"{now:016x}{padding}","durability":{}{dedup},"context":{next}}}"#,
                        plan.durability
                    );
                    sink.feed(Frame::text(request)).await.unwrap();
                    next += 1;
                    unanswered += 1;
                    let room = next < range.end && unanswered < plan.window;
                    match room.then(|| budget.try_acquire().ok()).flatten() {
                        Some(permit) => permit.forget(),
                        None => break,
                    }
                }
                sink.flush().await.unwrap();
                continue;
            }
            reply = next_text(&mut stream), if unanswered > 0 => reply,
        };
        let reply = reply.expect("a reply");
        unanswered -= 1;
        let reply: serde_json::Value = serde_json::from_str(&reply).expect("JSON");
        if reply["status"] != "Success." {
            let code = format!("{} {}", reply["code"], reply["reason"]);
            *published.refused.entry(code).or_insert(0) += 1;
            budget.add_permits(1);
            continue;
        }
        let context = reply["context"].as_u64().expect("the context") as usize;
        let id = reply["id"].as_str().expect("the message id").to_string();
        published.ids.push((context, id));
    }
}

pub async fn dedup(config: &NodeConfig, settings: &Settings) {
    println!(
        "{} publishers x {} in flight, {} subscribers of capacity {} acking all, {} B bodies; \
         each run on a node of its own",
        settings.publishers, settings.window, settings.subscribers, settings.window, BODY_BYTES
    );
    let mut phases = Vec::new();
    let mut idle = Vec::new();
    for (durability, messages) in [(0u8, settings.messages), (2, settings.durable_messages)] {
        let mut plain = Setup::start(config, settings).await;
        idle.push(plain.idle_rss);
        let (phase, _) = plain
            .phase(settings, "no ids", durability, messages, None, None)
            .await;
        phases.push(phase);
        plain.finish().await;

        let mut with_ids = Setup::start(config, settings).await;
        idle.push(with_ids.idle_rss);
        let tag = format!("bench-d{durability}");
        let (phase, first) = with_ids
            .phase(
                settings,
                "distinct ids",
                durability,
                messages,
                Some(&tag),
                None,
            )
            .await;
        phases.push(phase);
        let (phase, _) = with_ids
            .phase(
                settings,
                "the same ids again",
                durability,
                messages,
                Some(&tag),
                Some(&first),
            )
            .await;
        phases.push(phase);
        with_ids.finish().await;
    }

    print_phases(&phases, &idle);
    // Durability 0: [no ids, distinct ids, repeats].
    let (plain, ids, repeats) = (&phases[0], &phases[1], &phases[2]);
    let n = ids.messages as f64;
    let per_id = |with: u64, without: u64| (with as f64 - without as f64) / n;
    let by_rss = per_id(ids.rss, plain.rss);
    let by_growth = ((ids.rss as f64 - idle[1] as f64) - (plain.rss as f64 - idle[0] as f64)) / n;
    println!(
        "held ids: RSS {:.1} MB with {} ids vs {:.1} MB without: {:.0} B/id ({:.0} B/id from \
         each node's own idle RSS); claimed {} B/id: measured/claimed {:.2}",
        ids.rss as f64 / (1 << 20) as f64,
        ids.messages,
        plain.rss as f64 / (1 << 20) as f64,
        by_rss,
        by_growth,
        CLAIMED_ENTRY_BYTES,
        by_rss / CLAIMED_ENTRY_BYTES
    );
    println!(
        "messages-memory-used with ids held: {} ({:.1} B/id; without ids: {}); after the \
         repeats: {}",
        ids.memory_used,
        per_id(ids.memory_used, plain.memory_used),
        plain.memory_used,
        repeats.memory_used
    );
    println!(
        "cost of ids at d0: throughput {:+.1}%, CPU {:+.2} us/msg; repeats: {:.0} msg/s, \
         {:.2} us/msg; repeats' RSS change {:+.1} MB",
        (ids.rate / plain.rate - 1.0) * 100.0,
        ids.cpu_us_per_message - plain.cpu_us_per_message,
        repeats.rate,
        repeats.cpu_us_per_message,
        (repeats.rss as f64 - ids.rss as f64) / (1 << 20) as f64
    );
    let (plain, ids) = (&phases[3], &phases[4]);
    println!(
        "cost of ids at d2: throughput {:+.1}%, CPU {:+.2} us/msg",
        (ids.rate / plain.rate - 1.0) * 100.0,
        ids.cpu_us_per_message - plain.cpu_us_per_message,
    );
}

/// Each phase's line, the idle RSS before each run, and what looked odd.
fn print_phases(phases: &[Phase], idle: &[u64]) {
    println!(
        "{:<20} {:>2} {:>8} {:>9} {:>8} {:>9} {:>9} {:>14}",
        "run", "d", "messages", "msg/s", "cpu/msg", "RSS", "peakRSS", "memory-used"
    );
    for phase in phases {
        println!(
            "{:<20} {:>2} {:>8} {:>9.0} {:>6.2}us {:>7.1}MB {:>7.1}MB {:>14}",
            phase.what,
            phase.durability,
            phase.messages,
            phase.rate,
            phase.cpu_us_per_message,
            phase.rss as f64 / (1 << 20) as f64,
            phase.peak_rss as f64 / (1 << 20) as f64,
            phase.memory_used,
        );
    }
    println!(
        "idle node RSS before each run (MB): {}",
        idle.iter()
            .map(|rss| format!("{:.1}", *rss as f64 / (1 << 20) as f64))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for phase in phases {
        if !phase.refused.is_empty() {
            println!(
                "ODD: {} (d{}): refused {:?}",
                phase.what, phase.durability, phase.refused
            );
        }
        if phase.other_ids > 0 || phase.new_deliveries > 0 {
            println!(
                "ODD: {} (d{}): {} replies named another message than the first, {} new \
                 deliveries",
                phase.what, phase.durability, phase.other_ids, phase.new_deliveries
            );
        }
    }
}
