//! `bench connections`: what one more connection costs the node, and whether a publish still
//! reaches the first subscriber with room when thousands stand in the line.
//!
//! Each figure comes from a fresh node: its resident memory before and after the connections
//! are opened, divided by their number (user-space memory; the kernel's socket buffers are
//! not in it). Connections come from many loopback addresses, as the node lets only a few
//! of one source wait for their login at once.
//!
//! Last, a reconnect storm: every subscriber cut at once and then all reconnecting at once,
//! timed until the last is logged in, with the node's peak memory meanwhile.

use crate::client::{next_text, Socket, Wire};
use crate::node::{Node, NodeConfig, PUBLISHER, SUBSCRIBER};
use futures::{SinkExt, StreamExt};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use yawc::frame::Frame;

/// Connections being opened at one moment.
const OPENING_AT_ONCE: usize = 64;

/// The loopback address the `n`th connection comes from: 127.1.0.1, 127.1.0.2, ...
fn source(n: usize) -> Ipv4Addr {
    let n = n as u32;
    Ipv4Addr::new(127, 1, (n / 250) as u8, (n % 250 + 1) as u8)
}

pub async fn connections(config: &NodeConfig, count: usize, pre_login: usize, publishes: usize) {
    raise_fd_limit();
    let (bytes, _) = measure(config, pre_login, |wire, url, n| async move {
        wire.connect_from(&url, source(n)).await
    })
    .await;
    println!(
        "pre-login: {pre_login} connections upgraded, no login: {:.1} KiB each",
        bytes / 1024.0
    );
    let (bytes, node) = measure(config, count, subscriber).await;
    println!(
        "logged in: {count} idle subscribers (capacity 1): {:.1} KiB each",
        bytes / 1024.0
    );
    let (node, mut subscribers) = node;
    let latencies = first_in_line(config, &node, &mut subscribers[0], publishes).await;
    println!(
        "with {count} in the line, {publishes} publishes one at a time to the first: \
         publish to delivery p50 {:.3} ms, p99 {:.3} ms",
        latencies.0.as_secs_f64() * 1000.0,
        latencies.1.as_secs_f64() * 1000.0
    );
    let storm = reconnect_storm(config, &node, subscribers).await;
    println!(
        "reconnect storm over {}: {count} subscribers cut at once, then all reconnecting at \
         once: all logged in again {:.2} s after the first connect (median login {:.3} s, \
         slowest {:.3} s; {} clients retried, {} tries again in all, backing off as the \
         library does); node peak RSS during the storm {:.1} MB (before it {:.1} MB); node CPU \
         {:.0} µs a client logged in (accept, handshake, upgrade, login, the refused tries too)",
        config.wire.describe(),
        storm.all_in.as_secs_f64(),
        storm.median.as_secs_f64(),
        storm.slowest.as_secs_f64(),
        storm.retried,
        storm.retries,
        storm.peak_rss as f64 / (1 << 20) as f64,
        storm.rss_before as f64 / (1 << 20) as f64,
        storm.cpu_per_client.as_secs_f64() * 1e6,
    );
}

/// A subscriber's login: capacity 1.
fn subscriber_login() -> String {
    serde_json::json!({
        "username": SUBSCRIBER.0, "password": SUBSCRIBER.1, "role": "subscriber",
        "queuetype": "distribute", "capacity": 1,
    })
    .to_string()
}

/// A subscriber from the `n`th source address, logged in.
async fn subscriber(wire: Wire, url: String, n: usize) -> Socket {
    let mut socket = wire.connect_from(&url, source(n)).await;
    socket.send(Frame::text(subscriber_login())).await.unwrap();
    let reply = next_text(&mut socket).await.expect("a reply");
    assert!(reply.contains("Success."), "login: {reply}");
    socket
}

/// A subscriber from the `n`th source address, logged in as a client of the library
/// reconnects: a connection the node closes (its pre-login budget is full: it closes those
/// past it right after accept) or a login it refuses is tried again after the library's
/// default backoff (100 ms, doubling to 5 s). Returns the socket and how many tries failed.
async fn subscriber_retrying(wire: Wire, url: String, n: usize) -> (Socket, u32) {
    let login = subscriber_login();
    let mut backoff =
        qe_shared::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut failed = 0;
    loop {
        if let Ok(mut socket) = wire.try_connect_from(&url, source(n)).await {
            let sent = socket.send(Frame::text(login.clone())).await;
            if sent.is_ok() {
                if let Some(reply) = next_text(&mut socket).await {
                    if reply.contains("Success.") {
                        return (socket, failed);
                    }
                }
            }
        }
        failed += 1;
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

/// What a reconnect storm took.
struct Storm {
    /// From the first connect to the last login's reply.
    all_in: Duration,
    /// Each client's connect to its login's reply: the median and the slowest.
    median: Duration,
    slowest: Duration,
    /// The node's resident memory just before, and its peak from then to the last login.
    rss_before: u64,
    peak_rss: u64,
    /// Tries that failed and were made again (over all clients), and by how many clients.
    retries: u64,
    retried: usize,
    /// The node's CPU time from the first connect to the last login, over the clients: what
    /// one reconnect costs it (accept, TLS handshake, upgrade, login; the refused tries too).
    cpu_per_client: Duration,
}

/// Every connection in `connected` cut at once (a node restarted, a load balancer gone),
/// then as many clients reconnecting and logging in all at once, as after a deploy: each
/// over the bench's wire (TLS handshakes included with `--tls`), from its own source
/// address as before.
async fn reconnect_storm(config: &NodeConfig, node: &Node, connected: Vec<Socket>) -> Storm {
    let count = connected.len();
    drop(connected);
    // The node notices them gone (each closes its session) before the storm.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, rss_before) = node.memory();
    // Writing 5 to clear_refs starts the peak (VmHWM) again from the current RSS.
    std::fs::write(format!("/proc/{}/clear_refs", node.pid()), "5").expect("clear_refs");
    let url = node.url();
    let cpu_before = node.cpu_time();
    let started = Instant::now();
    let logins = futures::stream::iter(0..count)
        .map(|n| {
            let (wire, url) = (config.wire.clone(), url.clone());
            async move {
                let began = Instant::now();
                let (socket, failed) = subscriber_retrying(wire, url, n).await;
                (socket, (began.elapsed(), failed))
            }
        })
        .buffer_unordered(count);
    let (sockets, outcomes): (Vec<Socket>, Vec<(Duration, u32)>) = logins.unzip().await;
    let mut took: Vec<Duration> = outcomes.iter().map(|(took, _)| *took).collect();
    let retries = outcomes.iter().map(|(_, failed)| u64::from(*failed)).sum();
    let retried = outcomes.iter().filter(|(_, failed)| *failed > 0).count();
    let all_in = started.elapsed();
    let cpu_per_client = node.cpu_time().saturating_sub(cpu_before) / count as u32;
    let (peak_rss, _) = node.memory();
    drop(sockets);
    took.sort_unstable();
    Storm {
        all_in,
        median: took[took.len() / 2],
        slowest: took[took.len() - 1],
        rss_before,
        peak_rss,
        retries,
        retried,
        cpu_per_client,
    }
}

/// Starts a node, opens `count` connections with `open`, and returns the resident memory
/// they added per connection, with the node and the connections.
async fn measure<F, Fut>(config: &NodeConfig, count: usize, open: F) -> (f64, (Node, Vec<Socket>))
where
    F: Fn(Wire, String, usize) -> Fut,
    Fut: std::future::Future<Output = Socket>,
{
    let dir = tempfile::tempdir_in(&config.data_root).unwrap();
    let node = Node::start(config, dir.path());
    // One connection first, so what every connection shares is already there.
    let url = node.url();
    let mut sockets = vec![open(config.wire.clone(), url.clone(), 0).await];
    let (_, before) = node.memory();
    let mut opening = futures::stream::iter(1..count)
        .map(|n| open(config.wire.clone(), url.clone(), n))
        .buffer_unordered(OPENING_AT_ONCE);
    while let Some(socket) = opening.next().await {
        sockets.push(socket);
    }
    drop(opening);
    let (_, after) = node.memory();
    let per_connection = after.saturating_sub(before) as f64 / (count - 1).max(1) as f64;
    std::mem::forget(dir); // removed with the bench's data root
    (per_connection, (node, sockets))
}

/// Publishes `count` messages one at a time; the first subscriber in the line receives and
/// acks each. Returns the p50 and p99 of publish to delivery.
async fn first_in_line(
    config: &NodeConfig,
    node: &Node,
    first: &mut Socket,
    count: usize,
) -> (Duration, Duration) {
    let login = serde_json::json!({
        "username": PUBLISHER.0, "password": PUBLISHER.1, "role": "publisher",
        "queuetype": "distribute",
    });
    let mut publisher = config.wire.connect_from(&node.url(), source(60_000)).await;
    publisher
        .send(Frame::text(login.to_string()))
        .await
        .unwrap();
    next_text(&mut publisher).await.expect("the login's reply");
    let mut samples = Vec::with_capacity(count);
    for n in 0..count {
        let sent = Instant::now();
        let publish = serde_json::json!({"body": format!("m{n}"), "durability": 0});
        publisher
            .send(Frame::text(publish.to_string()))
            .await
            .unwrap();
        let delivery = next_text(first).await.expect("a delivery");
        samples.push(sent.elapsed());
        let delivery: serde_json::Value = serde_json::from_str(&delivery).unwrap();
        let ack = serde_json::json!({"id": delivery["id"], "ack": 1});
        first.send(Frame::text(ack.to_string())).await.unwrap();
        next_text(&mut publisher)
            .await
            .expect("the publish's reply");
        next_text(first).await.expect("the ack's reply");
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}

/// Lets this process, and the node it starts, open as many descriptors as the system allows.
pub(crate) fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        // Root may raise the hard limit too.
        let wanted = libc::rlimit {
            rlim_cur: 1 << 20,
            rlim_max: 1 << 20,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
