//! The measured clients: the operator (the real token) creating, waiting for, listing and
//! deleting queues in a loop, and a resolver asking for the zone's SOA 20 times a second.
//! They run on a thread and runtime of their own, so the attackers' tasks never stand
//! between a reply's arrival and its clock.

use super::process::{TOKEN, ZONE};
use super::wire;
use serde_json::Value;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use tokio::sync::oneshot;
use tokio::time::{interval, sleep, timeout, MissedTickBehavior};

/// The queue the operator creates: what the local fleet runs (the tests' body).
const NEW_QUEUE: &str =
    r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":false}"#;

/// The longest an operator call may take: the API holds `?until=running&within=60` up to a
/// minute.
const CALL_WITHIN: Duration = Duration::from_secs(70);

/// The pause after a create failed, so a failing API is not spun against.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The resolver's source address and pace, and how long it waits for an answer.
const RESOLVER_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 1);
const QUERY_EVERY: Duration = Duration::from_millis(50);
pub const DNS_ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// How many failures of each call are kept to show.
const EXAMPLES: usize = 3;

/// The operator's calls, in the order of its loop.
#[derive(Clone, Copy)]
pub enum Call {
    Create,
    WaitRunning,
    List,
    Delete,
}

impl Call {
    const ALL: [Call; 4] = [Call::Create, Call::WaitRunning, Call::List, Call::Delete];

    fn name(self) -> &'static str {
        match self {
            Call::Create => "POST /v1/queues",
            Call::WaitRunning => "GET /v1/queues/ID?until=running",
            Call::List => "GET /v1/queues",
            Call::Delete => "DELETE /v1/queues/ID",
        }
    }
}

/// What one kind of measured call gave.
pub struct Calls {
    pub name: String,
    /// The latency of each call that got the answer it wanted.
    pub latencies: Vec<Duration>,
    /// Calls answered otherwise (a wrong status, a refused connection, a DNS error).
    pub failures: u64,
    /// Calls with no answer in time.
    pub timeouts: u64,
    /// The first failures, as the server answered them.
    pub examples: Vec<String>,
}

impl Calls {
    fn new(name: &str) -> Calls {
        Calls {
            name: name.to_string(),
            latencies: Vec::new(),
            failures: 0,
            timeouts: 0,
            examples: Vec::new(),
        }
    }

    fn failed(&mut self, what: String) {
        self.failures += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(what);
        }
    }

    pub fn count(&self) -> u64 {
        self.latencies.len() as u64 + self.failures + self.timeouts
    }
}

/// Everything the measured clients saw.
pub struct Measured {
    /// The operator's calls, by [`Call`].
    pub operator: Vec<Calls>,
    pub resolver: Calls,
    /// Operator loops that ran from create to delete.
    pub queues: u64,
}

/// Runs both clients on a thread of their own until `until` (the operator finishes the loop
/// it is in, so every queue it made is deleted); the answer comes when they are done.
pub fn start(api: SocketAddr, dns: SocketAddr, until: Instant) -> oneshot::Receiver<Measured> {
    let (send, receive) = oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the measured clients");
        let measured = runtime.block_on(async {
            let ((operator, queues), resolver) =
                tokio::join!(operator(api, until), resolver(dns, until));
            Measured {
                operator,
                resolver,
                queues,
            }
        });
        let _ = send.send(measured);
    });
    receive
}

/// Create, wait until running, list, delete, until `until`.
async fn operator(api: SocketAddr, until: Instant) -> (Vec<Calls>, u64) {
    let mut calls: Vec<Calls> = Call::ALL
        .iter()
        .map(|call| Calls::new(call.name()))
        .collect();
    let mut queues = 0;
    while Instant::now() < until {
        let call = |method, path, body| operator_call(api, method, path, body);
        let created = call("POST", "/v1/queues".into(), Some(NEW_QUEUE));
        let created = timed(&mut calls[Call::Create as usize], created, 201, |_| true).await;
        let Some(id) = created.and_then(|queue| queue["id"].as_str().map(str::to_string)) else {
            sleep(RETRY_AFTER).await;
            continue;
        };
        let wait = call(
            "GET",
            format!("/v1/queues/{id}?until=running&within=60"),
            None,
        );
        let running = |queue: &Value| queue["status"] == "running";
        timed(&mut calls[Call::WaitRunning as usize], wait, 200, running).await;
        let list = call("GET", "/v1/queues".into(), None);
        timed(&mut calls[Call::List as usize], list, 200, |_| true).await;
        // `200` once the node is gone; `202` means it was not within the API's 20 s.
        let delete = call("DELETE", format!("/v1/queues/{id}"), None);
        let deleted = |queue: &Value| queue["status"] == "deleted";
        timed(&mut calls[Call::Delete as usize], delete, 200, deleted).await;
        queues += 1;
    }
    (calls, queues)
}

/// One call with the operator's token over a fresh connection (its connect is part of its
/// latency, as for any client); the status and the body.
async fn operator_call(
    api: SocketAddr,
    method: &str,
    path: String,
    body: Option<&str>,
) -> std::io::Result<(u16, Value)> {
    let body = body.unwrap_or("").as_bytes();
    let head = wire::request_head(method, &path, Some(TOKEN), body.len(), true);
    let mut stream = wire::connect_from(Ipv4Addr::LOCALHOST, api).await?;
    let response = wire::exchange(&mut stream, &head, body).await?;
    let json = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    Ok((response.status, json))
}

/// Times `call` into `calls`: a success is `status` with a body that `wanted` takes; returns
/// the body of a success.
async fn timed(
    calls: &mut Calls,
    call: impl std::future::Future<Output = std::io::Result<(u16, Value)>>,
    status: u16,
    wanted: impl Fn(&Value) -> bool,
) -> Option<Value> {
    let started = Instant::now();
    let answer = timeout(CALL_WITHIN, call).await;
    let elapsed = started.elapsed();
    match answer {
        Ok(Ok((got, body))) if got == status && wanted(&body) => {
            calls.latencies.push(elapsed);
            return Some(body);
        }
        Ok(Ok((got, body))) => calls.failed(format!("{got} after {elapsed:.1?}: {}", short(&body))),
        Ok(Err(error)) => calls.failed(format!("{error} after {elapsed:.1?}")),
        Err(_) => calls.timeouts += 1,
    }
    None
}

/// What a failed call's body says: the queue's status, or the API's error, or the body cut
/// to what a report line can show.
fn short(body: &Value) -> String {
    if let Some(status) = body["status"].as_str() {
        return format!("the queue is {status}");
    }
    if let Some(message) = body["error"]["message"].as_str() {
        return format!("error {message:?}");
    }
    let text = body.to_string();
    match text.char_indices().nth(160) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

/// The zone's SOA over UDP every [`QUERY_EVERY`], until `until`.
async fn resolver(dns: SocketAddr, until: Instant) -> Calls {
    let mut calls = Calls::new(&format!("DNS SOA {ZONE} (UDP)"));
    let socket = UdpSocket::bind((RESOLVER_SOURCE, 0))
        .await
        .expect("a UDP socket on 127.0.4.1");
    socket.connect(dns).await.expect("the DNS server's address");
    let mut tick = interval(QUERY_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut id: u16 = 0;
    while Instant::now() < until {
        tick.tick().await;
        id = id.wrapping_add(1);
        let started = Instant::now();
        if let Err(error) = socket
            .send(&wire::dns_query(id, ZONE, wire::TYPE_SOA))
            .await
        {
            calls.failed(format!("send: {error}"));
            continue;
        }
        match timeout(DNS_ANSWER_WITHIN, answer_to(&socket, id)).await {
            Ok(Ok(answer)) if answer.rcode == 0 && answer.answers > 0 => {
                calls.latencies.push(started.elapsed())
            }
            Ok(Ok(answer)) => calls.failed(format!(
                "{} with {} answers",
                wire::rcode_name(answer.rcode),
                answer.answers
            )),
            Ok(Err(error)) => calls.failed(format!("receive: {error}")),
            Err(_) => calls.timeouts += 1,
        }
    }
    calls
}

/// The answer to query `id` (a late answer to an earlier one is skipped).
async fn answer_to(socket: &UdpSocket, id: u16) -> std::io::Result<wire::DnsAnswer> {
    let mut reply = [0u8; 512];
    loop {
        let n = socket.recv(&mut reply).await?;
        if let Some(answer) = wire::dns_answer(&reply[..n]).filter(|answer| answer.id == id) {
            return Ok(answer);
        }
    }
}
