//! The workloads: publishers and subscribers on real connections, and what they measured.

use crate::client::{login, next_text, Wire};
use crate::node::{admin_login, Node, NodeConfig, Syscalls, PUBLISHER, SUBSCRIBER};
use futures::{FutureExt, SinkExt, StreamExt};
use memchr::memmem;
use qe_shared::settings::{Setting, Tier};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, Semaphore};
use yawc::frame::{Frame, OpCode};

#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub name: &'static str,
    pub publishers: usize,
    /// Publishes each publisher keeps in flight (told apart by `context`).
    pub window: usize,
    pub subscribers: usize,
    pub capacity: usize,
}

impl Workload {
    pub fn named(name: &str) -> Option<Workload> {
        let (publishers, window, subscribers, capacity) = match name {
            "w1" => (1, 1, 1, 1),
            "w4" => (16, 1, 4, 64),
            "w5" => (16, 64, 16, 64),
            "w6" => (16, 16, 16, 16),
            _ => return None,
        };
        let name = match name {
            "w1" => "W1",
            "w4" => "W4",
            "w5" => "W5",
            _ => "W6",
        };
        Some(Workload {
            name,
            publishers,
            window,
            subscribers,
            capacity,
        })
    }
}

pub struct Report {
    workload: &'static str,
    size: usize,
    durability: u8,
    pub(crate) messages: usize,
    /// End-to-end messages per second (published and delivered).
    pub rate: f64,
    pub(crate) reply: Percentiles,
    pub(crate) delivery: Percentiles,
    pub(crate) cpu_us_per_message: f64,
    /// The part of it in the node's own code (the rest is the kernel's, mostly its sockets).
    pub(crate) user_cpu_us_per_message: f64,
    pub(crate) peak_rss: u64,
    /// Segment files removed during the run (compaction at work).
    compacted: usize,
    /// The node's system calls during the run, when counted.
    syscalls: Option<Syscalls>,
    /// The node's allocations during the run, when counted.
    allocations: Option<u64>,
}

pub(crate) struct Percentiles {
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
}

impl Percentiles {
    pub(crate) fn of(mut samples: Vec<u64>) -> Percentiles {
        samples.sort_unstable();
        let at = |q: f64| Duration::from_nanos(samples[((samples.len() - 1) as f64 * q) as usize]);
        Percentiles {
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

impl Report {
    pub fn header() -> String {
        format!(
            "{:<4} {:>5} {:>2} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8}",
            "load",
            "body",
            "d",
            "messages",
            "msg/s",
            "reply50",
            "reply99",
            "deliv50",
            "deliv99",
            "cpu/msg",
            "peakRSS"
        )
    }

    pub fn line(&self) -> String {
        let ms = |d: Duration| format!("{:.3}ms", d.as_secs_f64() * 1000.0);
        format!(
            "{:<4} {:>5} {:>2} {:>8} {:>9.0} {:>9} {:>9} {:>9} {:>9} {:>5.1}us {:>6}MB",
            self.workload,
            self.size,
            self.durability,
            self.messages,
            self.rate,
            ms(self.reply.p50),
            ms(self.reply.p99),
            ms(self.delivery.p50),
            ms(self.delivery.p99),
            self.cpu_us_per_message,
            self.peak_rss >> 20,
        ) + &self.counts()
            + &match self.compacted {
                0 => String::new(),
                n => format!("  ({n} segments compacted)"),
            }
    }

    /// Per message: the node's CPU in its own code, system calls (all, socket writes, socket
    /// reads, readiness polls, futexes) and allocations.
    fn counts(&self) -> String {
        let per_message = |n: u64| n as f64 / self.messages as f64;
        let mut counts = format!("  user/msg {:.1}us", self.user_cpu_us_per_message);
        if let Some(calls) = self.syscalls {
            counts += &format!(
                "  syscalls/msg {:.2} (writes {:.2}, reads {:.2}, polls {:.2}, futexes {:.2})",
                per_message(calls.all),
                per_message(calls.writes),
                per_message(calls.reads),
                per_message(calls.polls),
                per_message(calls.futexes)
            );
        }
        if let Some(allocations) = self.allocations {
            counts += &format!("  allocations/msg {:.1}", per_message(allocations));
        }
        counts
    }
}

/// When a publisher stops.
#[derive(Clone, Copy)]
enum Until {
    Time(Instant),
    Count(usize),
}

/// What a publisher got back.
#[derive(Default)]
struct Published {
    ids: Vec<String>,
    /// Publish → reply, in ns.
    reply_ns: Vec<u64>,
}

/// A text looked for in every frame of a run: each is read here, on the load generator's one
/// core, which is what limits the 16 × 16 workloads, so the searcher is built once (as
/// `str::find` and memchr's one-shot `find` would for every call).
struct Key(LazyLock<memmem::Finder<'static>>);

macro_rules! key {
    ($text:expr) => {
        Key(LazyLock::new(|| memmem::Finder::new($text)))
    };
}

static CONTEXT: Key = key!(r#""context":"#);
static ID: Key = key!(r#""id":""#);
static BODY: Key = key!(r#""body":""#);
static PUBLISHED: Key = key!(r#""status":"Success.""#);
static SUCCESS: Key = key!("Success.");

impl Key {
    /// Whether `frame` holds the key.
    fn in_frame(&self, frame: &str) -> bool {
        self.0.find(frame.as_bytes()).is_some()
    }
}

/// Text between `key` and the next `"` (or `,`/`}` for numbers).
fn field<'a>(frame: &'a str, key: &Key) -> Option<&'a str> {
    let start = key.0.find(frame.as_bytes())? + key.0.needle().len();
    let rest = &frame.as_bytes()[start..];
    let end = memchr::memchr3(b'"', b',', b'}', rest).unwrap_or(rest.len());
    // The key and the stop are ASCII: both ends fall on characters' boundaries.
    Some(&frame[start..start + end])
}

/// Publishes until `until`; each publish takes one unit of `in_flight_budget`, which the
/// subscriber that receives it gives back, so at most `publishers × window` messages are
/// between publish and delivery: a closed loop that measures the node, not a backlog.
/// What every publisher of a run shares.
#[derive(Clone)]
struct PublishPlan {
    wire: Wire,
    url: String,
    /// Bodies carry nanoseconds since this, for the delivery latency.
    epoch: Instant,
    size: usize,
    durability: u8,
    /// Seconds each message waits before delivery (0: none).
    delay: u64,
    /// Publishes in flight per publisher.
    window: usize,
}

async fn publisher(plan: PublishPlan, until: Until, in_flight_budget: Arc<Semaphore>) -> Published {
    let PublishPlan {
        wire,
        url,
        epoch,
        size,
        durability,
        delay,
        window,
    } = plan;
    let delay = match delay {
        0 => String::new(),
        secs => format!(r#","delay":{secs}"#),
    };
    let socket = login(&wire, &url, serde_json::json!({
        "username": PUBLISHER.0, "password": PUBLISHER.1, "role": "publisher", "queuetype": "distribute",
    }))
    .await;
    let (mut sink, mut stream) = socket.split();
    let mut sent_at: Vec<u64> = Vec::new();
    let mut published = Published::default();
    let mut unanswered = 0;
    let padding = "x".repeat(size.saturating_sub(16));
    let more = |sent: usize| match until {
        Until::Time(deadline) => Instant::now() < deadline,
        Until::Count(n) => sent < n,
    };
    loop {
        if !more(sent_at.len()) && unanswered == 0 {
            return published;
        }
        let may_send = more(sent_at.len()) && unanswered < window;
        let reply = tokio::select! {
            permit = in_flight_budget.acquire(), if may_send => {
                permit.unwrap().forget();
                // This publish and every other the window and the budget allow now go out
                // with one flush, as the node sends its replies.
                loop {
                    let now = epoch.elapsed().as_nanos() as u64;
                    let context = sent_at.len();
                    let request = format!(
                        r#"{{"body":"{now:016x}{padding}","durability":{durability}{delay},"context":{context}}}"#
                    );
                    sink.feed(Frame::text(request)).await.unwrap();
                    sent_at.push(now);
                    unanswered += 1;
                    let room = more(sent_at.len()) && unanswered < window;
                    match room.then(|| in_flight_budget.try_acquire().ok()).flatten() {
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
        let reply = reply.as_str();
        assert!(PUBLISHED.in_frame(reply), "publish: {reply}");
        let context: usize = field(reply, &CONTEXT).unwrap().parse().unwrap();
        published
            .reply_ns
            .push(epoch.elapsed().as_nanos() as u64 - sent_at[context]);
        published.ids.push(field(reply, &ID).unwrap().to_string());
        unanswered -= 1;
    }
}

/// What a subscriber received.
#[derive(Default)]
pub(crate) struct Received {
    pub(crate) ids: Vec<String>,
    /// Publish → delivery, in ns.
    delivery_ns: Vec<u64>,
}

pub(crate) async fn subscriber(
    wire: Wire,
    url: String,
    epoch: Instant,
    capacity: usize,
    delivered: Arc<(AtomicUsize, Notify)>,
    in_flight_budget: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) -> Received {
    let socket = login(
        &wire,
        &url,
        serde_json::json!({
            "username": SUBSCRIBER.0, "password": SUBSCRIBER.1, "role": "subscriber",
            "queuetype": "distribute", "capacity": capacity,
        }),
    )
    .await;
    let (mut sink, mut stream) = socket.split();
    let mut received = Received::default();
    loop {
        let first = tokio::select! {
            frame = stream.next() => frame,
            _ = stop.changed() => return received,
        };
        let mut frame = first;
        // Take every frame already here, then send all their acks with one flush.
        loop {
            let current = frame.expect("the node is there");
            // Pings and other control frames carry nothing for the bench.
            if current.opcode() == OpCode::Text {
                let text = current.as_str();
                if let Some(body) = field(text, &BODY) {
                    let sent = u64::from_str_radix(&body[..16], 16).unwrap();
                    let now = epoch.elapsed().as_nanos() as u64;
                    received.delivery_ns.push(now - sent);
                    let id = field(text, &ID).unwrap();
                    let ack = Frame::text([r#"{"id":""#, id, r#"","ack":1}"#].concat());
                    sink.feed(ack).await.unwrap();
                    received.ids.push(id.to_string());
                    delivered.0.fetch_add(1, Ordering::Relaxed);
                    delivered.1.notify_one();
                    in_flight_budget.add_permits(1);
                } else {
                    assert!(SUCCESS.in_frame(text), "ack: {text}");
                }
            }
            match stream.next().now_or_never() {
                Some(next) => frame = next,
                None => break,
            }
        }
        sink.flush().await.unwrap();
    }
}

/// SQS long-polling receivers beside a run's WebSocket load (`bench run --sqs-pollers`).
struct PullReceivers {
    sqs: std::net::SocketAddr,
    delivered: Arc<(AtomicUsize, Notify)>,
    budget: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
}

impl PullReceivers {
    /// `count` receivers, each waiting 20 s at a time until the run stops, all of them waiting
    /// before this returns. What one gets it deletes and counts as delivered; returns the ids.
    async fn start(self, count: usize) -> Vec<tokio::task::JoinHandle<Vec<String>>> {
        let setup = serde_json::json!({
            "endpoint": format!("http://{}", self.sqs),
            "key": [crate::node::SQS_KEY.0, crate::node::SQS_KEY.1],
        });
        let client = crate::sqs_sdk::client(&setup);
        let url = client.get_queue_url().queue_name("queue").send().await;
        let url = url.expect("the queue").queue_url.expect("its URL");
        let handles = (0..count)
            .map(|_| {
                let (client, url) = (client.clone(), url.clone());
                let (delivered, budget) = (self.delivered.clone(), self.budget.clone());
                let mut stop = self.stop.clone();
                tokio::spawn(async move {
                    let mut ids = Vec::new();
                    loop {
                        let receive = client
                            .receive_message()
                            .queue_url(&url)
                            .max_number_of_messages(10)
                            .wait_time_seconds(20)
                            .send();
                        let answer = tokio::select! {
                            answer = receive => answer.expect("a receive"),
                            _ = stop.changed() => return ids,
                        };
                        for message in answer.messages() {
                            let handle = message.receipt_handle().expect("a handle");
                            let delete = client.delete_message().queue_url(&url);
                            delete
                                .receipt_handle(handle)
                                .send()
                                .await
                                .expect("a delete");
                            ids.push(message.message_id().expect("an id").to_string());
                            delivered.0.fetch_add(1, Ordering::Relaxed);
                            delivered.1.notify_one();
                            budget.add_permits(1);
                        }
                    }
                })
            })
            .collect();
        // Let every receive reach the node and start to wait.
        tokio::time::sleep(Duration::from_secs(1)).await;
        handles
    }
}

/// The most a publish's JSON adds to its body here:
/// `{"body":"…","durability":2,"delay":172800,"context":18446744073709551615}` is 72.
const PUBLISH_JSON_BYTES: usize = 96;

/// The node's `max-ws-msg-len`: its default, and the most it can be set to.
const MESSAGE_LIMIT_DEFAULT: usize = Setting::MaxWsMsgLen.default_for(Tier::Standard) as usize;
const MESSAGE_LIMIT_MOST: usize = Setting::MaxWsMsgLen.range().1 as usize;

/// `Err` names a body size no node takes a publish of.
pub fn check_sizes(sizes: &[usize]) -> Result<(), String> {
    match sizes
        .iter()
        .find(|&&size| size + PUBLISH_JSON_BYTES > MESSAGE_LIMIT_MOST)
    {
        Some(size) => Err(format!(
            "a body of {size} B: a node takes publishes up to {MESSAGE_LIMIT_MOST} B \
             (max-ws-msg-len), the JSON around the body included"
        )),
        None => Ok(()),
    }
}

/// Raises the node's `max-ws-msg-len` to its most when a publish of `size` would be bigger
/// than the default (the node would close the publisher's connection with 1009).
async fn fit_messages_of(size: usize, config: &NodeConfig, url: &str) {
    if size + PUBLISH_JSON_BYTES <= MESSAGE_LIMIT_DEFAULT {
        return;
    }
    let mut admin = admin_login(&config.wire, url).await;
    let setcfg = serde_json::json!({"cmd": "setcfg", "max-ws-msg-len": MESSAGE_LIMIT_MOST});
    admin.send(Frame::text(setcfg.to_string())).await.unwrap();
    let reply = next_text(&mut admin).await.expect("a reply to setcfg");
    assert!(reply.contains("Success."), "setcfg: {reply}");
}

/// Readies a new node for a run: publishes of `size` fit, and the preload is stored.
async fn prepare(config: &NodeConfig, url: &str, size: usize, preload: Preload) {
    fit_messages_of(size, config, url).await;
    if preload.messages > 0 {
        preload_messages(config, url, preload, size).await;
    }
}

/// Live messages stored before a run, and where, so that the run's churn makes the node
/// compact: its old segments are full of them, and every compaction copies them on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Preload {
    pub messages: usize,
}

/// Delayed for two days (the longest delay), so no subscriber gets them during the run.
const PRELOAD_DELAY_SECS: u64 = 172_800;

/// Stores `preload.messages` delayed messages of `size` bytes at durability 1.
async fn preload_messages(config: &NodeConfig, url: &str, preload: Preload, size: usize) {
    const PUBLISHERS: usize = 8;
    let budget = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
    let handles: Vec<_> = (0..PUBLISHERS)
        .map(|_| {
            let plan = PublishPlan {
                wire: config.wire.clone(),
                url: url.to_string(),
                epoch: Instant::now(),
                size,
                durability: 1,
                delay: PRELOAD_DELAY_SECS,
                window: 64,
            };
            let count = Until::Count(preload.messages / PUBLISHERS);
            tokio::spawn(publisher(plan, count, budget.clone()))
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
}

/// The message log's segment files in `data_dir`, by number.
fn segments(data_dir: &std::path::Path) -> Vec<u32> {
    let mut numbers: Vec<u32> = std::fs::read_dir(data_dir.join("messages"))
        .map(|entries| {
            entries
                .filter_map(|e| {
                    e.ok()?
                        .file_name()
                        .to_str()?
                        .strip_suffix(".log")?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    numbers.sort_unstable();
    numbers
}

/// Segments gone between the two listings: old ones removed, and new ones made and removed
/// in between (segment numbers only grow, one by one).
fn removed_segments(before: &[u32], after: &[u32]) -> usize {
    let old_gone = before.iter().filter(|s| !after.contains(s)).count();
    let first_new = before.last().map_or(1, |last| last + 1);
    let last = after.last().copied().unwrap_or(0);
    let new_gone = (first_new..=last).filter(|s| !after.contains(s)).count();
    old_gone + new_gone
}

pub async fn run(
    config: &NodeConfig,
    workload: Workload,
    size: usize,
    durability: u8,
    time: Duration,
    preload: Preload,
    sqs_pollers: usize,
) -> Report {
    let dir = tempfile::tempdir_in(&config.data_root).unwrap();
    let node = Node::start(config, dir.path());
    let url = node.url();
    prepare(config, &url, size, preload).await;
    let segments_before = segments(dir.path());
    let epoch = Instant::now();
    let delivered = Arc::new((AtomicUsize::new(0), Notify::new()));
    let (stop, stopped) = watch::channel(false);
    let budget = Arc::new(Semaphore::new(workload.publishers * workload.window));
    let subscribers: Vec<_> = (0..workload.subscribers)
        .map(|_| {
            let subscriber = subscriber(
                config.wire.clone(),
                url.clone(),
                epoch,
                workload.capacity,
                delivered.clone(),
                budget.clone(),
                stopped.clone(),
            );
            tokio::spawn(subscriber)
        })
        .collect();
    let pollers = match node.sqs {
        Some(sqs) if sqs_pollers > 0 => {
            let pollers = PullReceivers {
                sqs,
                delivered: delivered.clone(),
                budget: budget.clone(),
                stop: stopped.clone(),
            };
            pollers.start(sqs_pollers).await
        }
        _ => Vec::new(),
    };
    let cpu_before = node.cpu_times();
    let allocations_before = node.allocations();
    let syscall_count = node.count_syscalls(config);
    let started = Instant::now();
    let until = Until::Time(started + time);
    let publishers: Vec<_> = (0..workload.publishers)
        .map(|_| {
            let plan = PublishPlan {
                wire: config.wire.clone(),
                url: url.clone(),
                epoch,
                size,
                durability,
                delay: 0,
                window: workload.window,
            };
            tokio::spawn(publisher(plan, until, budget.clone()))
        })
        .collect();
    let mut published = Published::default();
    for handle in publishers {
        let part = handle.await.unwrap();
        published.ids.extend(part.ids);
        published.reply_ns.extend(part.reply_ns);
    }
    while delivered.0.load(Ordering::Relaxed) < published.ids.len() {
        delivered.1.notified().await;
    }
    let elapsed = started.elapsed();
    let cpu_after = node.cpu_times();
    let user_cpu = cpu_after.user - cpu_before.user;
    let cpu = user_cpu + (cpu_after.system - cpu_before.system);
    let syscalls = syscall_count.map(|count| count.finish());
    let allocations = node
        .allocations()
        .zip(allocations_before)
        .map(|(after, before)| after - before);
    stop.send(true).unwrap();
    let mut received = Received::default();
    for handle in subscribers {
        let part = handle.await.unwrap();
        received.ids.extend(part.ids);
        received.delivery_ns.extend(part.delivery_ns);
    }
    let mut pulled = 0;
    for handle in pollers {
        let ids = handle.await.unwrap();
        pulled += ids.len();
        received.ids.extend(ids);
    }
    if sqs_pollers > 0 {
        println!("(SQS long-pollers: {sqs_pollers}, and they received {pulled} of the messages)");
    }
    check_exactly_once(&mut published.ids, &mut received.ids);
    let messages = published.ids.len();
    let (peak_rss, _) = node.memory();
    node.kill();
    let compacted = removed_segments(&segments_before, &segments(dir.path()));
    Report {
        workload: workload.name,
        size,
        durability,
        messages,
        rate: messages as f64 / elapsed.as_secs_f64(),
        reply: Percentiles::of(published.reply_ns),
        delivery: Percentiles::of(received.delivery_ns),
        cpu_us_per_message: cpu.as_secs_f64() * 1e6 / messages as f64,
        user_cpu_us_per_message: user_cpu.as_secs_f64() * 1e6 / messages as f64,
        peak_rss,
        compacted,
        syscalls,
        allocations,
    }
}

/// Every id a publisher was given reached a subscriber exactly once.
pub(crate) fn check_exactly_once<Id: Ord>(published: &mut [Id], received: &mut [Id]) {
    check_contains_once(published, received, 0);
}

/// Every id a publisher was given reached a subscriber exactly once, and at most `unanswered`
/// more ids (publishes whose reply never came) reached one.
pub(crate) fn check_contains_once<Id: Ord>(
    published: &mut [Id],
    received: &mut [Id],
    unanswered: usize,
) {
    published.sort_unstable();
    received.sort_unstable();
    assert!(
        received.windows(2).all(|w| w[0] != w[1]),
        "a message was delivered twice"
    );
    let missing = published
        .iter()
        .filter(|id| received.binary_search(id).is_err())
        .count();
    assert_eq!(
        missing,
        0,
        "published {} ids, {missing} of them never delivered",
        published.len()
    );
    let extra = received.len() - published.len();
    assert!(
        extra <= unanswered,
        "{extra} deliveries of messages nobody was told were published"
    );
}

/// Publishes `messages` messages of 100 B at durability 1 from 16 publishers, 64 in flight
/// each, with nobody subscribed: they are all stored. Returns their ids.
pub(crate) async fn store(config: &NodeConfig, url: &str, messages: usize) -> Vec<String> {
    const PUBLISHERS: usize = 16;
    let epoch = Instant::now();
    let handles: Vec<_> = (0..PUBLISHERS)
        .map(|n| {
            // No subscribers: the messages are stored, so the budget is unbounded.
            let budget = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
            let plan = PublishPlan {
                wire: config.wire.clone(),
                url: url.to_string(),
                epoch,
                size: 100,
                durability: 1,
                delay: 0,
                window: 64,
            };
            let share = messages / PUBLISHERS + usize::from(n < messages % PUBLISHERS);
            tokio::spawn(publisher(plan, Until::Count(share), budget))
        })
        .collect();
    let mut ids = Vec::with_capacity(messages);
    for handle in handles {
        ids.extend(handle.await.unwrap().ids);
    }
    ids
}

pub async fn recovery(config: &NodeConfig, messages: usize) {
    let dir = tempfile::tempdir_in(&config.data_root).unwrap();
    let node = Node::start(config, dir.path());
    let (_, empty_rss) = node.memory();
    let started = Instant::now();
    let stored = store(config, &node.url(), messages).await.len();
    let publish_time = started.elapsed();
    let (_, full_rss) = node.memory();
    node.kill();
    let disk: u64 = std::fs::read_dir(dir.path().join("messages"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let restarted = Node::start(config, dir.path());
    let (_, restored_rss) = restarted.memory();
    let per_message = |rss: u64| (rss.saturating_sub(empty_rss)) as f64 / stored as f64;
    println!(
        "stored {stored} messages of 100 B at durability 1 in {:.1}s ({:.0}/s)",
        publish_time.as_secs_f64(),
        stored as f64 / publish_time.as_secs_f64()
    );
    println!(
        "log on disk: {} MB ({:.0} B/message)",
        disk >> 20,
        disk as f64 / stored as f64
    );
    println!(
        "resident memory: empty {} MB, full {} MB ({:.0} B/message beyond the empty node)",
        empty_rss >> 20,
        full_rss >> 20,
        per_message(full_rss)
    );
    println!(
        "after SIGKILL, restart to serving: {:.2}s; resident {} MB ({:.0} B/message)",
        restarted.startup.as_secs_f64(),
        restored_rss >> 20,
        per_message(restored_rss)
    );
    let mut probe = login(
        &config.wire,
        &restarted.url(),
        serde_json::json!({
            "username": SUBSCRIBER.0, "password": SUBSCRIBER.1, "role": "subscriber",
            "queuetype": "distribute", "capacity": 1,
        }),
    )
    .await;
    let first = next_text(&mut probe).await.expect("a delivery");
    assert!(
        first.contains("\"body\""),
        "a stored message is served: {first}"
    );
    restarted.kill();
}
