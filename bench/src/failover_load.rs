//! The load both failover benches run, and what it saw (`bench failover`, with the local
//! provider or with machines of their own): publishers at durability 2, one publish in flight
//! each, and subscribers that hold what they receive for a moment before they ack it, all
//! reconnecting as the queue's node is lost and served again elsewhere. How a client reaches
//! the queue is the bench's own ([`Way`]); the rest is the same for both: when the queue was
//! answered again after a loss, what was acknowledged at durability 2, every delivery, and at
//! the end whether each acknowledged message was delivered and none held by two subscribers
//! at once.

use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How the load's clients reach the queue, again and again as its node is lost.
pub trait Way: Clone + Send + Sync + 'static {
    type Connection: Connection;
    /// How long a client waits after a connection could not be opened.
    const RECONNECT_PAUSE: Duration;
    /// A connection to the queue's node, upgraded; None while nothing serves there.
    fn open(&self) -> impl Future<Output = Option<Self::Connection>> + Send;
}

/// One connection to the queue's node, as the load uses it: text frames.
pub trait Connection: Send + 'static {
    /// Sends `text`; false once the connection is lost.
    fn send_text(&mut self, text: String) -> impl Future<Output = bool> + Send;
    /// The next text frame; None once the connection is lost.
    fn next_text(&mut self) -> impl Future<Output = Option<String>> + Send;
}

/// Each subscriber's capacity.
const HOLDER_CAPACITY: u64 = 8;

/// Published after the rounds: everything before it is delivered before it.
const MARKER: &str = "end of the run";

/// What the load saw, shared with the rounds.
#[derive(Default)]
pub struct Seen {
    /// Bodies answered Success at durability 2, and when.
    acknowledged: Vec<(String, Instant)>,
    /// When the node was lost last.
    lost: Option<Instant>,
    /// Since then: when a publisher was first answered (any status), and first answered
    /// Success, on a connection opened after the loss (a reply the lost node sent before it
    /// died is no sign of the queue's return).
    answered: Option<Instant>,
    succeeded: Option<Instant>,
    /// Every delivery to a subscriber all along: the body, who, when, and when it sent its
    /// ack (None: it never did, its connection ended first).
    deliveries: Vec<Delivery>,
    /// Subscribers' logins after a cut: sessions resumed, and new ones (a resume refused).
    resumed: usize,
    new_sessions: usize,
}

struct Delivery {
    body: String,
    subscriber: usize,
    at: Instant,
    acked: Option<Instant>,
}

/// The load itself: what it saw, and its clients' tasks.
pub struct Load {
    pub seen: Arc<Mutex<Seen>>,
    clients: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts `publishers` publishers and `subscribers` subscribers holding each message for
    /// `hold`, with the queue's `logins`.
    pub fn start<W: Way>(
        way: &W,
        logins: &Value,
        publishers: usize,
        subscribers: usize,
        hold: Duration,
    ) -> Load {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut clients = Vec::new();
        for publisher in 0..publishers {
            let (way, login, seen) = (way.clone(), logins["publisher"].clone(), seen.clone());
            clients.push(tokio::spawn(publish(publisher, way, login, seen)));
        }
        for subscriber in 0..subscribers {
            let (way, login, seen) = (way.clone(), logins["subscriber"].clone(), seen.clone());
            let holder = hold_and_ack(subscriber, way, login, hold, seen);
            clients.push(tokio::spawn(holder));
        }
        Load { seen, clients }
    }

    /// Stops every client (their connections end without a logout); what they saw.
    pub async fn stop(self) -> Seen {
        for client in &self.clients {
            client.abort();
        }
        // On a runtime of several threads a client may be running as it is aborted: once it
        // has ended, nothing it saw is left to count.
        for client in self.clients {
            let _ = client.await;
        }
        std::mem::take(&mut *lock(&self.seen))
    }
}

/// The queue's node is lost now: from here the next answers are waited for. When.
pub fn lost_now(seen: &Mutex<Seen>) -> Instant {
    let lost = Instant::now();
    let mut seen = lock(seen);
    seen.lost = Some(lost);
    seen.answered = None;
    seen.succeeded = None;
    lost
}

/// Each round's times from the loss: until the queue served again (a publisher answered on a
/// new connection), and until durability 2 was Success again (on two disks).
#[derive(Default)]
pub struct Rounds {
    pub serving: Vec<Duration>,
    pub on_two_disks: Vec<Duration>,
}

impl Rounds {
    /// Waits until the queue has recovered from the loss at `lost` (giving up, a panic, after
    /// `within`); prints the round's line.
    pub async fn recovered(
        &mut self,
        round: usize,
        seen: &Mutex<Seen>,
        lost: Instant,
        within: Duration,
    ) {
        let deadline = lost + within;
        let (answered, succeeded) = loop {
            if let (Some(answered), Some(succeeded)) = {
                let seen = lock(seen);
                (seen.answered, seen.succeeded)
            } {
                break (answered - lost, succeeded - lost);
            }
            assert!(Instant::now() < deadline, "not recovered within {within:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        self.serving.push(answered);
        self.on_two_disks.push(succeeded);
        println!(
            "round {round:2}: serving again after {:6.0} ms, durability 2 on two disks after {:6.0} ms",
            ms(answered),
            ms(succeeded)
        );
    }
}

/// A login request of `role` with `login` (the queue's username and password), `extra` added.
fn login_request(login: &Value, role: &str, extra: Value) -> Value {
    let mut request = json!({"username": login["username"], "password": login["password"],
        "role": role, "queuetype": "distribute"});
    for (key, value) in extra.as_object().expect("an object") {
        request[key] = value.clone();
    }
    request
}

/// Receives for ever, holding each message for `hold` before it acks it; after a cut,
/// resumes its session (with `replay`) or, if that is refused, logs in anew.
async fn hold_and_ack<W: Way>(
    subscriber: usize,
    way: W,
    login: Value,
    hold: Duration,
    seen: Arc<Mutex<Seen>>,
) {
    let mut session: Option<String> = None;
    loop {
        let Some(mut connection) = way.open().await else {
            tokio::time::sleep(W::RECONNECT_PAUSE).await;
            continue;
        };
        let mut request = login_request(&login, "subscriber", json!({"capacity": HOLDER_CAPACITY}));
        if let Some(session) = &session {
            request["sessionid"] = json!(session);
            request["replay"] = json!(true);
        }
        if !connection.send_text(request.to_string()).await {
            continue;
        }
        let Some(reply) = connection.next_text().await else {
            continue;
        };
        let reply: Value = serde_json::from_str(&reply).unwrap_or_default();
        match (reply["status"] == "Success.", session.is_some()) {
            (true, true) => lock(&seen).resumed += 1,
            (false, true) => {
                // Refused (its time ran out, or it held nothing): a new session next.
                lock(&seen).new_sessions += 1;
                session = None;
                continue;
            }
            (true, false) => {}
            (false, false) => continue,
        }
        session = reply["sessionid"].as_str().map(str::to_string);
        hold_until_lost(&mut connection, subscriber, hold, &seen).await;
    }
}

/// Takes deliveries on `connection` and acks each `hold` after it came, until the connection
/// is lost.
async fn hold_until_lost(
    connection: &mut impl Connection,
    subscriber: usize,
    hold: Duration,
    seen: &Mutex<Seen>,
) {
    // Held: (id, index in `deliveries`, when to ack).
    let mut held: VecDeque<(Value, usize, Instant)> = VecDeque::new();
    loop {
        let next_ack = held.front().map(|&(_, _, due)| due);
        let frame = match next_ack {
            Some(due) => tokio::time::timeout_at(due.into(), connection.next_text()).await,
            None => Ok(connection.next_text().await),
        };
        match frame {
            Err(_) => {
                let (id, index, _) = held.pop_front().expect("one is due");
                let ack = json!({"id": id, "ack": 1});
                if !connection.send_text(ack.to_string()).await {
                    return;
                }
                lock(seen).deliveries[index].acked = Some(Instant::now());
            }
            Ok(None) => return,
            Ok(Some(text)) => {
                let frame: Value = serde_json::from_str(&text).unwrap_or_default();
                let Some(body) = frame["body"].as_str() else {
                    continue; // an ack's reply
                };
                let mut seen = lock(seen);
                seen.deliveries.push(Delivery {
                    body: body.to_string(),
                    subscriber,
                    at: Instant::now(),
                    acked: None,
                });
                let index = seen.deliveries.len() - 1;
                held.push_back((frame["id"].clone(), index, Instant::now() + hold));
            }
        }
    }
}

/// Publishes at durability 2 for ever, reconnecting as the node comes and goes.
async fn publish<W: Way>(publisher: usize, way: W, login: Value, seen: Arc<Mutex<Seen>>) {
    let mut sequence = 0u64;
    loop {
        let connected = Instant::now();
        let Some(mut connection) = way.open().await else {
            tokio::time::sleep(W::RECONNECT_PAUSE).await;
            continue;
        };
        let login = login_request(&login, "publisher", json!({}));
        if !connection.send_text(login.to_string()).await {
            continue;
        }
        match connection.next_text().await {
            Some(reply) if reply.contains("Success.") => {}
            _ => continue,
        }
        loop {
            sequence += 1;
            let body = format!("p{publisher}-{sequence}");
            let request = json!({"body": body, "durability": 2});
            if !connection.send_text(request.to_string()).await {
                break;
            }
            let Some(reply) = connection.next_text().await else {
                break;
            };
            answered(&seen, connected, body, reply.contains("Success."));
        }
    }
}

/// A publish of `body` on a connection opened at `connected` was answered now.
fn answered(seen: &Mutex<Seen>, connected: Instant, body: String, success: bool) {
    let now = Instant::now();
    let mut seen = lock(seen);
    if seen.lost.is_some_and(|lost| connected > lost) {
        seen.answered.get_or_insert(now);
        if success {
            seen.succeeded.get_or_insert(now);
        }
    }
    if success {
        seen.acknowledged.push((body, now));
    }
}

/// A connection logged in with `request`, which must succeed.
async fn logged_in<W: Way>(way: &W, request: Value) -> W::Connection {
    let mut connection = way.open().await.expect("the queue serves");
    assert!(
        connection.send_text(request.to_string()).await,
        "a login sent"
    );
    let reply = connection.next_text().await.expect("a reply");
    assert!(reply.contains("Success."), "login: {reply}");
    connection
}

/// Every message waiting, received and acked, up to a marker published now, and for 12 s
/// after it what saved sessions give back; their bodies. (Until 2026-12-05 the drain stopped
/// at the marker, so a message a stopped subscriber's session held unread, which comes after
/// it, was counted lost.)
pub async fn drain<W: Way>(way: &W, logins: &Value) -> Drained {
    let publisher = login_request(&logins["publisher"], "publisher", json!({}));
    let mut marker = logged_in(way, publisher).await;
    let end = json!({"body": MARKER, "durability": 2});
    assert!(marker.send_text(end.to_string()).await, "the marker sent");
    let reply = marker.next_text().await.expect("the marker answered");
    assert!(reply.contains("Success."), "the marker: {reply}");
    let capacity = json!({"capacity": 256});
    let subscriber = login_request(&logins["subscriber"], "subscriber", capacity);
    let mut subscriber = logged_in(way, subscriber).await;
    let mut drained = Drained::default();
    let mut after_the_marker = None;
    loop {
        // After the marker, what the stopped subscribers' saved sessions held and the load
        // never read (frames still in their sockets) comes once those sessions' time runs out
        // (10 s on the standard tier), behind the marker: waited for, 12 s.
        let text = match after_the_marker {
            None => subscriber.next_text().await.expect("the queue delivers"),
            Some(until) => match tokio::time::timeout_at(until, subscriber.next_text()).await {
                Ok(text) => text.expect("the queue delivers"),
                Err(_) => break,
            },
        };
        let frame: Value = serde_json::from_str(&text).expect("JSON");
        let Some(body) = frame["body"].as_str() else {
            continue;
        };
        let ack = json!({"id": frame["id"], "ack": 1});
        assert!(subscriber.send_text(ack.to_string()).await, "an ack sent");
        if body == MARKER {
            after_the_marker = Some(tokio::time::Instant::now() + Duration::from_secs(12));
            continue;
        }
        match after_the_marker {
            Some(_) => drained.after_the_marker.push(body.to_string()),
            None => drained.before_the_marker.push(body.to_string()),
        }
    }
    drained
}

/// What [`drain`] received: before its marker, and after it.
#[derive(Default)]
pub struct Drained {
    before_the_marker: Vec<String>,
    after_the_marker: Vec<String>,
}

/// Deliveries of one message to a subscriber while another held it: received by the other
/// before, and not acked by it until after. Each with the other's.
fn held_by_two_at_once(deliveries: &[Delivery]) -> Vec<(&Delivery, &Delivery)> {
    let mut by_body: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for delivery in deliveries {
        by_body.entry(&delivery.body).or_default().push(delivery);
    }
    let mut twice = Vec::new();
    for list in by_body.values() {
        for later in list {
            let held_then = |earlier: &&&Delivery| {
                earlier.subscriber != later.subscriber
                    && earlier.at <= later.at
                    && earlier.acked.is_none_or(|acked| acked > later.at)
            };
            if let Some(earlier) = list.iter().find(held_then) {
                twice.push((*earlier, *later));
            }
        }
    }
    twice
}

/// Each message held by two at once (the first few): who held it from when (and until when
/// it acked), and when the second got it, in unix time (the logs' clock).
fn print_held_by_two(twice: &[(&Delivery, &Delivery)]) {
    let unix = |at: Instant| {
        let now = std::time::UNIX_EPOCH.elapsed().expect("after 1970");
        (now - at.elapsed()).as_secs_f64()
    };
    for (earlier, later) in twice.iter().take(10) {
        let acked = match earlier.acked {
            Some(acked) => format!("acked at {:.3}", unix(acked)),
            None => "never acked".to_string(),
        };
        println!(
            "held by two at once: {} to subscriber {} at {:.3} s ({acked}), to subscriber {} \
             at {:.3} s",
            earlier.body,
            earlier.subscriber,
            unix(earlier.at),
            later.subscriber,
            unix(later.at)
        );
    }
}

/// The median and the worst of `durations`, if there are any.
pub fn median_and_worst(durations: &[Duration]) -> Option<(Duration, Duration)> {
    let mut sorted = durations.to_vec();
    sorted.sort();
    Some((*sorted.get(sorted.len() / 2)?, *sorted.last()?))
}

/// Prints the rounds' times and what was lost, delivered again or held by two at once;
/// whether nothing was lost and none held by two at once.
pub fn report(rounds: &Rounds, seen: &Seen, drained: &Drained) -> bool {
    let mut times: HashMap<&str, usize> = HashMap::new();
    let to_holders = seen.deliveries.iter().map(|d| d.body.as_str());
    let unread = drained
        .after_the_marker
        .iter()
        .filter(|body| !seen.deliveries.iter().any(|d| &d.body == *body))
        .count();
    let delivered = [
        &drained.before_the_marker[..],
        &drained.after_the_marker[..],
    ]
    .concat();
    for body in delivered.iter().map(String::as_str).chain(to_holders) {
        *times.entry(body).or_default() += 1;
    }
    let acknowledged = &seen.acknowledged;
    let lost: Vec<&(String, Instant)> = acknowledged
        .iter()
        .filter(|(body, _)| !times.contains_key(body.as_str()))
        .collect();
    print_lost(&lost, acknowledged, &seen.deliveries);
    let lost = lost.len();
    let again = times.values().filter(|&&n| n > 1).count();
    let twice = held_by_two_at_once(&seen.deliveries);
    print_held_by_two(&twice);
    let two_at_once = twice.len();
    let summary = |what: &str, durations: &[Duration]| {
        if let Some((median, worst)) = median_and_worst(durations) {
            println!(
                "{what}: median {:.0} ms, worst {:.0} ms",
                ms(median),
                ms(worst)
            );
        }
    };
    summary("serving again", &rounds.serving);
    summary("durability 2 on two disks again", &rounds.on_two_disks);
    println!(
        "acknowledged at durability 2: {}, delivered: {} to the subscribers and {} after the \
         rounds ({} distinct), lost: {lost}",
        acknowledged.len(),
        seen.deliveries.len(),
        delivered.len(),
        times.len()
    );
    println!(
        "subscribers: {} sessions resumed, {} new after a refused resume; messages delivered \
         more than once: {again}; held by two subscribers at once: {two_at_once}",
        seen.resumed, seen.new_sessions
    );
    println!(
        "after the drain's marker: {} given back by the stopped subscribers' saved sessions, \
         {unread} of them never read by the load (counted lost before 2026-12-05)",
        drained.after_the_marker.len()
    );
    lost == 0 && two_at_once == 0
}

/// Each acknowledged message never delivered: when it was acknowledged, against the last
/// acknowledgement and the last delivery (one acknowledged as the load stopped may have been
/// on its way to a subscriber then).
fn print_lost(
    lost: &[&(String, Instant)],
    acknowledged: &[(String, Instant)],
    deliveries: &[Delivery],
) {
    let last_ack = acknowledged.iter().map(|&(_, at)| at).max();
    let last_delivery = deliveries.iter().map(|d| d.at).max();
    for (body, at) in lost {
        let before = |last: Option<Instant>| {
            last.map_or(0.0, |last| ms(last.saturating_duration_since(*at)))
        };
        println!(
            "lost: {body}, acknowledged {:.0} ms before the last acknowledgement, {:.0} ms before the last delivery",
            before(last_ack),
            before(last_delivery)
        );
    }
}

pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().expect("never poisoned")
}
