//! The workloads' closed loop for any peer, as `workload::run` drives our node: publishers
//! keep a window of publishes waiting for the server's confirmation, every publish takes a
//! unit of a shared in-flight budget (publishers × window) that the delivery gives back, and
//! every message carries its send time and an id, so that delivery latency is measured and
//! every confirmed message is checked to arrive exactly once.

use super::server::Server;
use crate::workload::{check_exactly_once, Percentiles, Workload};
use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, Semaphore};

/// The hex digits of a body's send time and of its id.
const STAMP_DIGITS: usize = 16;

/// A message's id: its publisher in the top bits, its number within that publisher below.
type Id = u64;
const PUBLISHER_SHIFT: u32 = 40;

/// What one run measured.
pub struct Measured {
    pub messages: usize,
    /// End-to-end messages per second (published, confirmed and delivered).
    pub rate: f64,
    /// Publish → the server's confirmation.
    pub reply: Percentiles,
    /// Publish → delivery to a subscriber.
    pub delivery: Percentiles,
    pub cpu_us_per_message: f64,
    pub peak_rss: u64,
}

/// What every client of one run shares.
#[derive(Clone)]
struct Shared {
    /// Bodies carry nanoseconds since this.
    epoch: Instant,
    /// Body size in bytes (at least the stamp and id).
    size: usize,
    /// Messages between publish and delivery, at most publishers × window.
    in_flight_budget: Arc<Semaphore>,
    /// Messages delivered so far, and a wake-up for each.
    delivered: Arc<(AtomicUsize, Notify)>,
    /// Set once every confirmed message was delivered: subscribers end.
    stop: watch::Receiver<bool>,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// One publisher's part of the run.
pub struct Lane {
    shared: Shared,
    publisher: u64,
    window: usize,
    deadline: Instant,
}

/// What a publisher got confirmed.
#[derive(Default)]
pub struct Published {
    ids: Vec<Id>,
    /// Publish → confirmation, in ns.
    reply_ns: Vec<u64>,
}

/// Publishes until the deadline with `lane.window` publishes unconfirmed at most: `send`
/// hands one body to the server and its future resolves once the server confirmed it (it
/// must panic on a refusal).
pub async fn publish<SendBody, Confirmed>(lane: Lane, mut send: SendBody) -> Published
where
    SendBody: FnMut(Bytes) -> Confirmed,
    Confirmed: Future<Output = ()>,
{
    let mut unconfirmed = FuturesUnordered::new();
    let mut published = Published::default();
    let mut next: u64 = 0;
    let padding = "x".repeat(lane.shared.size.saturating_sub(2 * STAMP_DIGITS));
    loop {
        let more = Instant::now() < lane.deadline;
        if !more && unconfirmed.is_empty() {
            return published;
        }
        let may_send = more && unconfirmed.len() < lane.window;
        tokio::select! {
            permit = lane.shared.in_flight_budget.acquire(), if may_send => {
                permit.unwrap().forget();
                let id = lane.publisher << PUBLISHER_SHIFT | next;
                next += 1;
                let sent = lane.shared.now_ns();
                let body = format!("{sent:016x}{id:016x}{padding}");
                let confirmed = send(Bytes::from(body));
                unconfirmed.push(async move {
                    confirmed.await;
                    (id, sent)
                });
            }
            Some((id, sent)) = unconfirmed.next() => {
                published.ids.push(id);
                published.reply_ns.push(lane.shared.now_ns() - sent);
            }
        }
    }
}

/// One subscriber's part of the run: what it received, and the signal to end.
pub struct Inbox {
    shared: Shared,
    /// Which subscriber of the run this is (from 0), for names the server needs.
    pub subscriber: usize,
    ids: Vec<Id>,
    /// Publish → delivery, in ns.
    delivery_ns: Vec<u64>,
}

impl Inbox {
    /// Counts a delivered body, and gives its unit of the in-flight budget back.
    pub fn deliver(&mut self, body: &[u8]) {
        let now = self.shared.now_ns();
        let hex = |digits: &[u8]| {
            let text = std::str::from_utf8(digits).expect("a body the bench wrote");
            u64::from_str_radix(text, 16).expect("a body the bench wrote")
        };
        let sent = hex(&body[..STAMP_DIGITS]);
        let id = hex(&body[STAMP_DIGITS..2 * STAMP_DIGITS]);
        self.delivery_ns.push(now - sent);
        self.ids.push(id);
        self.shared.delivered.0.fetch_add(1, Ordering::Relaxed);
        self.shared.delivered.1.notify_one();
        self.shared.in_flight_budget.add_permits(1);
    }

    /// Resolves once every confirmed message was delivered (cancel-safe: select on it).
    pub async fn stopped(&mut self) {
        let _ = self.shared.stop.wait_for(|stop| *stop).await;
    }
}

/// Runs `workload` on `server` for `time`: `start_subscriber(inbox, capacity)` connects a
/// subscriber that consumes into its inbox until `inbox.stopped()` and returns it;
/// `start_publisher(lane)` connects a publisher that calls `publish`. Panics unless every confirmed message was delivered exactly once.
pub async fn run<Subscriber, Subscribing, Publisher, Publishing>(
    server: &Server,
    workload: Workload,
    size: usize,
    time: Duration,
    start_subscriber: Subscriber,
    start_publisher: Publisher,
) -> Measured
where
    Subscriber: Fn(Inbox, usize) -> Subscribing,
    Subscribing: Future<Output = Inbox> + Send + 'static,
    Publisher: Fn(Lane) -> Publishing,
    Publishing: Future<Output = Published> + Send + 'static,
{
    let (stop, stopped) = watch::channel(false);
    let shared = Shared {
        epoch: Instant::now(),
        size: size.max(2 * STAMP_DIGITS),
        in_flight_budget: Arc::new(Semaphore::new(workload.publishers * workload.window)),
        delivered: Arc::new((AtomicUsize::new(0), Notify::new())),
        stop: stopped,
    };
    let subscribers: Vec<_> = (0..workload.subscribers)
        .map(|subscriber| {
            let inbox = Inbox {
                shared: shared.clone(),
                subscriber,
                ids: Vec::new(),
                delivery_ns: Vec::new(),
            };
            tokio::spawn(start_subscriber(inbox, workload.capacity))
        })
        .collect();
    let cpu_before = server.cpu_time();
    let started = Instant::now();
    let publishers: Vec<_> = (0..workload.publishers)
        .map(|publisher| {
            let lane = Lane {
                shared: shared.clone(),
                publisher: publisher as u64,
                window: workload.window,
                deadline: started + time,
            };
            tokio::spawn(start_publisher(lane))
        })
        .collect();
    let mut published = Published::default();
    for handle in publishers {
        let part = handle.await.expect("a publisher");
        published.ids.extend(part.ids);
        published.reply_ns.extend(part.reply_ns);
    }
    let delivered = &shared.delivered;
    while delivered.0.load(Ordering::Relaxed) < published.ids.len() {
        let wait = tokio::time::timeout(Duration::from_secs(30), delivered.1.notified());
        assert!(
            wait.await.is_ok(),
            "no delivery for 30 s: {} of {} confirmed messages delivered",
            delivered.0.load(Ordering::Relaxed),
            published.ids.len()
        );
    }
    let elapsed = started.elapsed();
    let cpu = server.cpu_time() - cpu_before;
    stop.send(true).unwrap();
    let (mut ids, mut delivery_ns) = (Vec::new(), Vec::new());
    for handle in subscribers {
        let inbox = handle.await.expect("a subscriber");
        ids.extend(inbox.ids);
        delivery_ns.extend(inbox.delivery_ns);
    }
    check_exactly_once(&mut published.ids, &mut ids);
    let messages = published.ids.len();
    Measured {
        messages,
        rate: messages as f64 / elapsed.as_secs_f64(),
        reply: Percentiles::of(published.reply_ns),
        delivery: Percentiles::of(delivery_ns),
        cpu_us_per_message: cpu.as_secs_f64() * 1e6 / messages as f64,
        peak_rss: server.peak_rss(),
    }
}
