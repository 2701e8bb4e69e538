//! The attackers: tasks without the operator's token, each doing one kind of abuse again and
//! again until told to stop, each counting what it sent and what came back. HTTP attackers
//! come from 127.0.2.1 and keep their connection alive between requests (a new one when the
//! server closes it); the DNS flood comes from 127.0.3.1 and the idle DNS connections from
//! 127.0.5.1. docs/controlplane-load.md describes each kind.

use super::process::ZONE;
use super::wire::{self, Rng};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::time::{interval, sleep, timeout, MissedTickBehavior};

/// Where each kind of attacker connects from.
const HTTP_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 1);
const DNS_FLOOD_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 3, 1);
const IDLE_DNS_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 5, 1);
const IDLE_HTTP_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 6, 1);

/// The body of a report sent with a wrong token: about 1 MiB of valid JSON (one long usage
/// line), so a server that reads and parses a body before it checks the token does all of it.
pub const REPORT_BYTES: usize = 1 << 20;

/// How long an HTTP attacker waits for an answer before it counts an error and reconnects.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// The pause after a connection failed, so a refusing server is not spun against.
const RETRY_AFTER: Duration = Duration::from_millis(10);

/// A slow client sends one byte of its request head this often, and never ends it.
const SLOW_BYTE_EVERY: Duration = Duration::from_millis(500);

/// Each flood task sends this many queries every [`FLOOD_BURST_EVERY`]: 1,000 per second.
const FLOOD_BURST: usize = 10;
const FLOOD_BURST_EVERY: Duration = Duration::from_millis(10);

/// The kinds of attacker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `GET /v1/queues` with no `Authorization`.
    NoToken,
    /// `GET /v1/queues` with a wrong bearer token, a new one each time.
    WrongToken,
    /// `POST /v1/nodes/RANDOM/reports`, a 1 MiB body and a wrong token.
    BigReport,
    /// `FOOXXXXXX /v1/queues`: a method no route has, a new one each time.
    BogusMethod,
    /// `GET /v1/queues/RANDOM` with no token.
    RandomQueue,
    /// `GET /x/RANDOM` with no token: a path no route matches.
    RandomPath,
    /// A request head sent one byte at a time, never finished.
    SlowHeaders,
    /// UDP queries for random names in the zone, 1,000 per second per task, answers or not.
    DnsFlood,
    /// A DNS TCP connection that sends nothing, opened again when the server closes it.
    IdleDnsTcp,
    /// An API connection that sends nothing, opened again when the server closes it (not in
    /// the mix: `--idle` adds them).
    IdleHttp,
}

/// Out of every 20 attackers, how many of each kind (fixed, so runs compare). Idle DNS
/// connections cost a task almost nothing, so there are more of them.
const MIX: [(Kind, usize); 9] = [
    (Kind::NoToken, 2),
    (Kind::WrongToken, 2),
    (Kind::BigReport, 2),
    (Kind::BogusMethod, 2),
    (Kind::RandomQueue, 2),
    (Kind::RandomPath, 2),
    (Kind::SlowHeaders, 2),
    (Kind::DnsFlood, 1),
    (Kind::IdleDnsTcp, 5),
];

impl Kind {
    /// The kind of attacker number `index`: the mix, repeated.
    pub fn of(index: usize) -> Kind {
        let slots: usize = MIX.iter().map(|(_, count)| count).sum();
        let mut slot = index % slots;
        for (kind, count) in MIX {
            if slot < count {
                return kind;
            }
            slot -= count;
        }
        unreachable!("the slot is within the mix")
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::NoToken => "GET /v1/queues, no token",
            Kind::WrongToken => "GET /v1/queues, wrong token",
            Kind::BigReport => "POST 1 MiB report, wrong token",
            Kind::BogusMethod => "FOOxxxxxx /v1/queues",
            Kind::RandomQueue => "GET /v1/queues/RANDOM",
            Kind::RandomPath => "GET /x/RANDOM",
            Kind::SlowHeaders => "slow headers (1 B/500 ms)",
            Kind::DnsFlood => "DNS UDP flood, random names",
            Kind::IdleDnsTcp => "idle DNS TCP connection",
            Kind::IdleHttp => "idle API connection",
        }
    }

    /// What the tally's `sent` counts for this kind.
    pub fn unit(self) -> &'static str {
        match self {
            Kind::SlowHeaders => "bytes",
            Kind::DnsFlood => "queries",
            Kind::IdleDnsTcp | Kind::IdleHttp => "-",
            _ => "requests",
        }
    }
}

/// What attackers of one kind did.
#[derive(Default)]
pub struct Tally {
    pub tasks: u64,
    /// TCP connections opened.
    pub connections: u64,
    /// Requests, queries or bytes sent (see [`Kind::unit`]).
    pub sent: u64,
    /// Answers by HTTP status or DNS response code.
    pub answers: BTreeMap<String, u64>,
    /// Connections the server closed (the slow and idle kinds, which wait for that).
    pub closed: u64,
    /// Connections that failed, and requests with no answer within [`ANSWER_WITHIN`].
    pub errors: u64,
}

impl Tally {
    fn answer(&mut self, answer: impl ToString) {
        *self.answers.entry(answer.to_string()).or_default() += 1;
    }

    /// Adds another task's tally to this one.
    pub fn add(&mut self, other: Tally) {
        self.tasks += other.tasks;
        self.connections += other.connections;
        self.sent += other.sent;
        self.closed += other.closed;
        self.errors += other.errors;
        for (answer, count) in other.answers {
            *self.answers.entry(answer).or_default() += count;
        }
    }

    /// The answers, most frequent first: `401 x123, 404 x4`; `-` for none.
    pub fn answers_line(&self) -> String {
        if self.answers.is_empty() {
            return "-".into();
        }
        let mut answers: Vec<(&String, &u64)> = self.answers.iter().collect();
        answers.sort_by(|a, b| b.1.cmp(a.1));
        let shown: Vec<String> = answers
            .iter()
            .map(|(answer, count)| format!("{answer} x{count}"))
            .collect();
        shown.join(", ")
    }
}

/// Where attackers aim.
#[derive(Clone)]
pub struct Target {
    pub api: SocketAddr,
    pub dns: SocketAddr,
    /// The big report's body, made once for all.
    pub report_body: Arc<[u8]>,
}

impl Target {
    pub fn new(api: SocketAddr, dns: SocketAddr) -> Target {
        let prefix = b"{\"usage\":[\"";
        let suffix = b"\"]}";
        let mut body = prefix.to_vec();
        body.resize(REPORT_BYTES - suffix.len(), b'a');
        body.extend_from_slice(suffix);
        Target {
            api,
            dns,
            report_body: body.into(),
        }
    }
}

/// Attacker number `index` until `stop` turns true (what it is doing then is dropped).
pub async fn run(index: usize, target: Target, stop: watch::Receiver<bool>) -> (Kind, Tally) {
    run_as(Kind::of(index), index, target, stop).await
}

/// Attacker number `index`, of `kind` whatever the mix says.
pub async fn run_as(
    kind: Kind,
    index: usize,
    target: Target,
    mut stop: watch::Receiver<bool>,
) -> (Kind, Tally) {
    let mut tally = Tally {
        tasks: 1,
        ..Tally::default()
    };
    let mut rng = Rng::seeded(index as u64);
    tokio::select! {
        _ = stop.wait_for(|stopped| *stopped) => {}
        _ = attack(kind, &target, &mut rng, &mut tally) => {}
    }
    (kind, tally)
}

async fn attack(kind: Kind, target: &Target, rng: &mut Rng, tally: &mut Tally) {
    match kind {
        Kind::SlowHeaders => slow_headers(target.api, tally).await,
        Kind::DnsFlood => dns_flood(target.dns, rng, tally).await,
        Kind::IdleDnsTcp => idle_dns_tcp(target.dns, tally).await,
        Kind::IdleHttp => idle_http(target.api, tally).await,
        _ => http_requests(kind, target, rng, tally).await,
    }
}

/// One request of `kind` after another on a kept-alive connection.
async fn http_requests(kind: Kind, target: &Target, rng: &mut Rng, tally: &mut Tally) {
    let mut connection: Option<TcpStream> = None;
    loop {
        let stream = match connection.as_mut() {
            Some(stream) => stream,
            None => match connect(HTTP_SOURCE, target.api, tally).await {
                Some(stream) => connection.insert(stream),
                None => continue,
            },
        };
        let (head, body) = request(kind, target, rng);
        tally.sent += 1;
        match timeout(ANSWER_WITHIN, wire::exchange(stream, &head, body)).await {
            Ok(Ok(response)) => {
                tally.answer(response.status);
                if !response.reusable {
                    connection = None;
                }
            }
            Ok(Err(_)) | Err(_) => {
                tally.errors += 1;
                connection = None;
            }
        }
    }
}

/// The head and body of one request of `kind`.
fn request<'a>(kind: Kind, target: &'a Target, rng: &mut Rng) -> (Vec<u8>, &'a [u8]) {
    // Attackers keep their connection open (no `Connection: close`).
    let head = |method: &str, path: &str, token: Option<&str>, body_len| {
        wire::request_head(method, path, token, body_len, false)
    };
    match kind {
        Kind::NoToken => (head("GET", "/v1/queues", None, 0), &[]),
        Kind::WrongToken => {
            let token = format!("wrong-{}", rng.label());
            (head("GET", "/v1/queues", Some(&token), 0), &[])
        }
        Kind::BigReport => {
            let path = format!("/v1/nodes/{}/reports", rng.label());
            let body = &target.report_body;
            (head("POST", &path, Some("wrong"), body.len()), body)
        }
        Kind::BogusMethod => {
            let method = format!("FOO{}", rng.text(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", 6));
            (head(&method, "/v1/queues", None, 0), &[])
        }
        Kind::RandomQueue => {
            let path = format!("/v1/queues/{}", rng.label());
            (head("GET", &path, None, 0), &[])
        }
        Kind::RandomPath => (head("GET", &format!("/x/{}", rng.label()), None, 0), &[]),
        Kind::SlowHeaders | Kind::DnsFlood | Kind::IdleDnsTcp | Kind::IdleHttp => {
            unreachable!("{kind:?} sends no whole requests")
        }
    }
}

/// A connection from `source`, counted; None (after a pause) if it failed.
async fn connect(source: Ipv4Addr, to: SocketAddr, tally: &mut Tally) -> Option<TcpStream> {
    match wire::connect_from(source, to).await {
        Ok(stream) => {
            tally.connections += 1;
            Some(stream)
        }
        Err(_) => {
            tally.errors += 1;
            sleep(RETRY_AFTER).await;
            None
        }
    }
}

/// The head a slow client sends: a request line and a host, then headers without end.
const SLOW_HEAD: &[u8] = b"GET /v1/queues HTTP/1.1\r\nHost: cp\r\n";
const SLOW_HEADER: &[u8] = b"X-Slow: a\r\n";

/// Holds a connection whose request head arrives a byte at a time; when the server closes
/// it, opens another.
async fn slow_headers(api: SocketAddr, tally: &mut Tally) {
    loop {
        let Some(stream) = connect(HTTP_SOURCE, api, tally).await else {
            continue;
        };
        if let Some(status) = trickle(stream, tally).await {
            tally.answer(status);
        }
        tally.closed += 1;
    }
}

/// Sends the slow head until the server closes the connection; returns the status it
/// answered with before that, if it did.
async fn trickle(mut stream: TcpStream, tally: &mut Tally) -> Option<u16> {
    let mut bytes = SLOW_HEAD.iter().chain(SLOW_HEADER.iter().cycle());
    let mut tick = interval(SLOW_BYTE_EVERY);
    let mut answer = Vec::new();
    loop {
        tokio::select! {
            read = stream.read_buf(&mut answer) => match read {
                Ok(0) | Err(_) => return wire::status_of(&answer),
                Ok(_) => {}
            },
            _ = tick.tick() => {
                let byte = *bytes.next().expect("the header repeats without end");
                if stream.write_all(&[byte]).await.is_err() {
                    return wire::status_of(&answer);
                }
                tally.sent += 1;
            }
        }
    }
}

/// Holds an API connection that sends nothing; when the server closes it, opens another.
async fn idle_http(api: SocketAddr, tally: &mut Tally) {
    loop {
        let Some(mut stream) = connect(IDLE_HTTP_SOURCE, api, tally).await else {
            continue;
        };
        let mut answer = Vec::new();
        while let Ok(read) = stream.read_buf(&mut answer).await {
            if read == 0 {
                break;
            }
        }
        tally.closed += 1;
    }
}

/// Queries for random names in the zone at a fixed rate, whether answered or not; counts the
/// answers by response code.
async fn dns_flood(dns: SocketAddr, rng: &mut Rng, tally: &mut Tally) {
    let socket = UdpSocket::bind((DNS_FLOOD_SOURCE, 0))
        .await
        .expect("a UDP socket on 127.0.3.1");
    socket.connect(dns).await.expect("the DNS server's address");
    let mut tick = interval(FLOOD_BURST_EVERY);
    // A bench that fell behind sends less, not a burst to catch up: the rate stays bounded.
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut reply = [0u8; 512];
    loop {
        tokio::select! {
            _ = tick.tick() => {
                for _ in 0..FLOOD_BURST {
                    let name = format!("{}.{ZONE}", rng.label());
                    let query = wire::dns_query(rng.next() as u16, &name, wire::TYPE_A);
                    match socket.send(&query).await {
                        Ok(_) => tally.sent += 1,
                        Err(_) => tally.errors += 1,
                    }
                }
            }
            received = socket.recv(&mut reply) => match received {
                Ok(n) => match wire::dns_answer(&reply[..n]) {
                    Some(answer) => tally.answer(wire::rcode_name(answer.rcode)),
                    None => tally.answer("not DNS"),
                },
                // An ICMP "port unreachable" for an earlier query.
                Err(_) => tally.errors += 1,
            },
        }
    }
}

/// Holds a DNS TCP connection that asks nothing; when the server closes it, opens another.
async fn idle_dns_tcp(dns: SocketAddr, tally: &mut Tally) {
    loop {
        let Some(mut stream) = connect(IDLE_DNS_SOURCE, dns, tally).await else {
            continue;
        };
        let mut buffer = [0u8; 512];
        // Nothing comes on a connection that asked nothing, until the server ends it.
        while let Ok(1..) = stream.read(&mut buffer).await {}
        tally.closed += 1;
    }
}
