//! The clients that run throughout the faults, and what each saw, with when it saw it:
//!
//! - per queue, one **publisher**: one durability-2 publish in flight, paced, each body unique
//!   (`qN-SEQ`); a publish answered `Success.` is *acknowledged*, one whose reply never came
//!   is *unanswered* (its outcome unknown);
//! - per queue, one **subscriber** of some capacity, which acks every delivery at once and,
//!   after a cut, resumes its session (`replay`) or, if that is refused, logs in anew;
//! - one **API prober**: every [`PROBE_EVERY`] a write (a rotation of one queue's admin login,
//!   which no client uses) and a read (`GET /v1/queues`), both to one running replica, the
//!   next one each time.
//!
//! A connection that ends without the client asking (a close frame from the node, a reset, a
//! read or write error, or no reply to a publish within [`REPLY_WITHIN`]) is *cut*; the client
//! then connects again, with a short backoff, until the node serves again.
//!
//! They run on a thread and runtime of their own, so the run's own work (starting and killing
//! processes) never stands between a reply and its clock.

use crate::client::{Socket, Wire};
use futures::SinkExt;
use qe_shared::backoff::Backoff;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::timeout;
use yawc::frame::{Frame, OpCode};

/// The longest a connect and upgrade, and then a login's reply, may take: a node that is
/// stopped accepts connections (the kernel does) but never answers.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// A publish not answered within this gives its connection up (counted as cut).
pub const REPLY_WITHIN: Duration = Duration::from_secs(15);

/// The longest a frame may take to send.
const SEND_WITHIN: Duration = Duration::from_secs(5);

/// The reconnect backoff: from the first to the most, doubling.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MOST: Duration = Duration::from_secs(1);

/// The prober's pace, and how long one of its calls may take (a rotation waits up to 10 s for
/// the node to confirm, a store call up to `timeout_secs`).
pub const PROBE_EVERY: Duration = Duration::from_millis(200);
const API_WITHIN: Duration = Duration::from_secs(20);

/// A queue as its clients reach it.
pub struct Target {
    /// Its place in the run: its bodies are `qINDEX-SEQ`.
    pub index: usize,
    /// Where its node serves (`ws://127.0.0.1:PORT/`: the same after a replacement).
    pub url: String,
    /// The `username` and `password` of its publisher and subscriber logins.
    pub publisher: Value,
    pub subscriber: Value,
}

/// How the clients load each queue.
#[derive(Clone, Copy)]
pub struct Pace {
    /// Publishes a second per queue (at most: one is in flight at a time).
    pub rate: f64,
    /// Each subscriber's capacity.
    pub capacity: u32,
}

/// What every client saw; shared with the run, which reads it while the clients go on.
pub struct Board {
    pub queues: Vec<QueueLog>,
    /// The replicas running now, which the prober takes turns at.
    apis: Mutex<Vec<SocketAddr>>,
    pub calls: Mutex<Vec<ApiCall>>,
}

/// What one queue's publisher and subscriber saw.
#[derive(Default)]
pub struct QueueLog {
    pub published: Mutex<Published>,
    pub received: Mutex<Received>,
}

#[derive(Default)]
pub struct Published {
    /// Publishes answered `Success.`, in order.
    pub acks: Vec<Ack>,
    /// Publishes whose reply never came (their connection was cut first): when, and which.
    pub unanswered: Vec<(Instant, u64)>,
    /// Publishes answered `Failure.`: when, and the reply.
    pub refused: Vec<(Instant, String)>,
    pub cuts: Vec<Cut>,
    /// Connects or logins that failed (the node down, or not serving yet).
    pub failed_logins: usize,
    /// When it stopped publishing.
    pub stopped: Option<Instant>,
}

/// An acknowledged publish.
pub struct Ack {
    pub at: Instant,
    pub seq: u64,
    /// When the connection it was made on logged in.
    pub connection: Instant,
}

#[derive(Default)]
pub struct Received {
    /// Every delivery: when, and the body's sequence number.
    pub deliveries: Vec<(Instant, u64)>,
    pub cuts: Vec<Cut>,
    /// Logins that resumed the session the last connection had.
    pub resumed: usize,
    pub failed_logins: usize,
    /// Acks answered `Failure.` (a message no longer held).
    pub acks_refused: usize,
}

/// A connection that ended without the client asking.
pub struct Cut {
    pub at: Instant,
    pub how: String,
}

/// One call of the prober.
pub struct ApiCall {
    /// When it was sent.
    pub at: Instant,
    /// A rotation, or a list.
    pub write: bool,
    pub api: SocketAddr,
    pub answer: Answer,
    /// How long it took to answer (or to fail).
    pub took: Duration,
}

pub enum Answer {
    Status(u16),
    /// No connection, or it was refused, reset or closed before the answer.
    Unreachable(String),
    /// No answer within [`API_WITHIN`].
    TimedOut,
}

impl Board {
    pub fn new(queues: usize, apis: Vec<SocketAddr>) -> Board {
        Board {
            queues: (0..queues).map(|_| QueueLog::default()).collect(),
            apis: Mutex::new(apis),
            calls: Mutex::default(),
        }
    }

    /// Which replicas run now: the prober's turns go round these.
    pub fn set_apis(&self, apis: Vec<SocketAddr>) {
        *lock(&self.apis) = apis;
    }

    fn api(&self, turn: usize) -> Option<SocketAddr> {
        let apis = lock(&self.apis);
        (!apis.is_empty()).then(|| apis[turn % apis.len()])
    }
}

/// The clients' thread, and how to stop them.
pub struct Clients {
    stop_publishing: watch::Sender<bool>,
    stop_subscribing: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl Clients {
    /// Starts the publishers, subscribers and prober (rotating `probed`'s admin login).
    pub fn start(board: Arc<Board>, targets: Vec<Target>, pace: Pace, probed: String) -> Clients {
        let (stop_publishing, publishing) = watch::channel(false);
        let (stop_subscribing, subscribing) = watch::channel(false);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the clients");
            runtime.block_on(async {
                let mut clients = JoinSet::new();
                for target in targets {
                    let target = Arc::new(target);
                    clients.spawn(publisher(
                        board.clone(),
                        target.clone(),
                        pace.rate,
                        publishing.clone(),
                    ));
                    clients.spawn(subscriber(
                        board.clone(),
                        target,
                        pace.capacity,
                        subscribing.clone(),
                    ));
                }
                clients.spawn(prober(board, probed, publishing));
                while let Some(ended) = clients.join_next().await {
                    ended.expect("a client");
                }
            });
        });
        Clients {
            stop_publishing,
            stop_subscribing,
            thread,
        }
    }

    /// Stops the publishers (each after its publish in flight) and the prober.
    pub fn stop_publishing(&self) {
        let _ = self.stop_publishing.send(true);
    }

    /// Stops the subscribers too, and waits for every client to end.
    pub fn stop(self) {
        let _ = self.stop_publishing.send(true);
        let _ = self.stop_subscribing.send(true);
        self.thread.join().expect("the clients' thread");
    }
}

/// Publishes one durable message at a time, at most `rate` a second, until stopped.
async fn publisher(board: Arc<Board>, target: Arc<Target>, rate: f64, mut stop: Stop) {
    let log = &board.queues[target.index];
    let every = Duration::from_secs_f64(1.0 / rate);
    let login = login(&target.publisher, "publisher");
    let mut seq = 0;
    let mut backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MOST);
    while !stop.now() {
        let mut socket = match log_in(&target.url, &login).await {
            Ok((socket, _)) => socket,
            Err(_) => {
                lock(&log.published).failed_logins += 1;
                tokio::time::sleep(backoff.next_wait()).await;
                continue;
            }
        };
        backoff.reset();
        let connection = Instant::now();
        let mut next = tokio::time::Instant::now();
        let cut = loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = stop.changed() => {}
            }
            if stop.now() {
                break None;
            }
            next = (next + every).max(tokio::time::Instant::now());
            seq += 1;
            let body = format!("q{}-{seq}", target.index);
            let request = json!({"body": body, "durability": 2}).to_string();
            let answer = match send(&mut socket, request).await {
                Ok(()) => reply(&mut socket).await,
                Err(how) => Err(how),
            };
            match answer {
                Ok(reply) if reply["status"] == "Success." => {
                    let at = Instant::now();
                    let ack = Ack {
                        at,
                        seq,
                        connection,
                    };
                    lock(&log.published).acks.push(ack);
                }
                Ok(reply) => {
                    let refused = (Instant::now(), reply.to_string());
                    lock(&log.published).refused.push(refused);
                }
                Err(how) => {
                    lock(&log.published).unanswered.push((Instant::now(), seq));
                    break Some(how);
                }
            }
        };
        match cut {
            Some(how) => lock(&log.published).cuts.push(Cut {
                at: Instant::now(),
                how,
            }),
            None => break,
        }
    }
    lock(&log.published).stopped = Some(Instant::now());
}

/// Receives and acks every message until stopped; after a cut, resumes its session (the
/// messages it held come again) or, refused, logs in anew.
async fn subscriber(board: Arc<Board>, target: Arc<Target>, capacity: u32, mut stop: Stop) {
    let log = &board.queues[target.index];
    let mut session: Option<String> = None;
    let mut backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MOST);
    while !stop.now() {
        let mut login = login(&target.subscriber, "subscriber");
        match &session {
            Some(id) => {
                login["sessionid"] = json!(id);
                login["replay"] = json!(true);
            }
            None => login["capacity"] = json!(capacity),
        }
        let (mut socket, reply) = match log_in(&target.url, &login).await {
            Ok(logged_in) => logged_in,
            // The session is gone (a new node) or still held: a new one.
            Err(LoginError::Refused) if session.is_some() => {
                session = None;
                continue;
            }
            Err(_) => {
                lock(&log.received).failed_logins += 1;
                tokio::time::sleep(backoff.next_wait()).await;
                continue;
            }
        };
        backoff.reset();
        if session.is_some() {
            lock(&log.received).resumed += 1;
        }
        session = reply["sessionid"].as_str().map(str::to_string);
        let how = loop {
            let frame = tokio::select! {
                frame = socket.next_frame() => frame,
                _ = stop.changed() => break String::new(),
            };
            let frame = match frame {
                Ok(frame) => frame,
                Err(error) => break error.to_string(),
            };
            match frame.opcode() {
                OpCode::Close => break closed(&frame),
                OpCode::Text => {}
                _ => continue,
            }
            let Ok(message) = serde_json::from_slice::<Value>(frame.payload()) else {
                continue;
            };
            if let (Some(body), Some(id)) = (message["body"].as_str(), message["id"].as_str()) {
                if let Some(seq) = seq_of(body) {
                    let delivery = (Instant::now(), seq);
                    lock(&log.received).deliveries.push(delivery);
                }
                let ack = json!({"id": id, "ack": 1}).to_string();
                if let Err(how) = send(&mut socket, ack).await {
                    break how;
                }
            } else if message["status"] == "Failure." {
                lock(&log.received).acks_refused += 1;
            }
        };
        if stop.now() {
            break;
        }
        let cut = Cut {
            at: Instant::now(),
            how,
        };
        lock(&log.received).cuts.push(cut);
    }
}

/// Every [`PROBE_EVERY`], a rotation of `probed`'s admin login and a list of the queues, both
/// to the next running replica, until stopped; each call is timed from when it was sent.
async fn prober(board: Arc<Board>, probed: String, mut stop: Stop) {
    let client = reqwest::Client::builder()
        .timeout(API_WITHIN)
        .connect_timeout(CONNECT_WITHIN)
        .build()
        .expect("an HTTP client");
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut calls = JoinSet::new();
    let mut turn = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => {}
        }
        if stop.now() {
            break;
        }
        let Some(api) = board.api(turn) else {
            continue;
        };
        turn += 1;
        let rotate = client
            .post(format!(
                "http://{api}/v1/queues/{probed}/logins/admin/rotate"
            ))
            .bearer_auth(super::replicas::TOKEN);
        let list = client
            .get(format!("http://{api}/v1/queues"))
            .bearer_auth(super::replicas::TOKEN);
        for (write, request) in [(true, rotate), (false, list)] {
            let board = board.clone();
            calls.spawn(async move {
                let at = Instant::now();
                let answer = match request.send().await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let _ = response.bytes().await;
                        Answer::Status(status)
                    }
                    Err(error) if error.is_timeout() => Answer::TimedOut,
                    Err(error) => Answer::Unreachable(error_chain(&error)),
                };
                let call = ApiCall {
                    at,
                    write,
                    api,
                    answer,
                    took: at.elapsed(),
                };
                lock(&board.calls).push(call);
            });
        }
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
}

/// Why a login did not succeed.
enum LoginError {
    /// No connection, no upgrade, or no reply in time.
    Unreachable,
    /// The node answered the login with a failure.
    Refused,
}

/// Connects to `url` and sends `login`; the socket and the login's reply.
async fn log_in(url: &str, login: &Value) -> Result<(Socket, Value), LoginError> {
    let wire = Wire {
        tls: None,
        compress: false,
    };
    let connected = timeout(CONNECT_WITHIN, wire.try_connect(url)).await;
    let mut socket = match connected {
        Ok(Ok(socket)) => socket,
        _ => return Err(LoginError::Unreachable),
    };
    send(&mut socket, login.to_string())
        .await
        .map_err(|_| LoginError::Unreachable)?;
    let reply = match timeout(CONNECT_WITHIN, next_text(&mut socket)).await {
        Ok(Ok(reply)) => reply,
        _ => return Err(LoginError::Unreachable),
    };
    match reply["status"] == "Success." {
        true => Ok((socket, reply)),
        false => Err(LoginError::Refused),
    }
}

/// A login of `role` with a queue's `credentials`.
fn login(credentials: &Value, role: &str) -> Value {
    json!({
        "username": credentials["username"],
        "password": credentials["password"],
        "role": role,
        "queuetype": "distribute",
    })
}

/// A publish's reply, within [`REPLY_WITHIN`]; `Err` says how the connection ended first.
async fn reply(socket: &mut Socket) -> Result<Value, String> {
    match timeout(REPLY_WITHIN, next_text(socket)).await {
        Ok(reply) => reply,
        Err(_) => Err(format!("no reply within {REPLY_WITHIN:?}: given up")),
    }
}

/// The next text frame as JSON; `Err` says how the connection ended.
async fn next_text(socket: &mut Socket) -> Result<Value, String> {
    loop {
        let frame = socket.next_frame().await.map_err(|e| e.to_string())?;
        match frame.opcode() {
            OpCode::Text => {
                return serde_json::from_slice(frame.payload())
                    .map_err(|e| format!("a reply that is not JSON ({e})"))
            }
            OpCode::Close => return Err(closed(&frame)),
            _ => {}
        }
    }
}

async fn send(socket: &mut Socket, text: String) -> Result<(), String> {
    match timeout(SEND_WITHIN, socket.send(Frame::text(text))).await {
        Ok(sent) => sent.map_err(|e| e.to_string()),
        Err(_) => Err(format!("not sent within {SEND_WITHIN:?}")),
    }
}

fn closed(frame: &Frame) -> String {
    match frame.close_code() {
        Some(code) => format!("closed by the node ({})", u16::from(code)),
        None => "closed by the node".to_string(),
    }
}

/// The sequence number in a body `qN-SEQ`.
fn seq_of(body: &str) -> Option<u64> {
    body.rsplit_once('-')?.1.parse().ok()
}

/// reqwest's error with its sources (its own message names only the request).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A stop signal: `now` once sent (or once its sender is gone).
type Stop = watch::Receiver<bool>;

trait Stopped {
    fn now(&self) -> bool;
}

impl Stopped for Stop {
    fn now(&self) -> bool {
        *self.borrow() || self.has_changed().is_err()
    }
}

/// A lock whose holder never panics while holding it (so a poisoned one is no news).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
