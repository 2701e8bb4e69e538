//! `bench abuse`: one of a node's ports (`--port sqs`, the SQS face, or `--port ws`, the
//! WebSocket port) under abuse without credentials (issue 31). It starts a release `dataplane`
//! with its SQS face on loopback, then for `--seconds`:
//!
//! - **idle** connections (`--idle`, default 2,000) that send nothing, spread over 16 loopback
//!   sources (127.0.1.1–16, 125 each), each opened again when the node closes it;
//! - **slow heads** (`--slow`, default 200) that send a request head one byte a second, from
//!   127.0.2.1–16, opened again when closed;
//! - a **flood** (`--flood` tasks, default 50, from 127.0.3.1–16): on the SQS port requests
//!   with a made-up access key, each task on a keep-alive connection sending as fast as it is
//!   answered; on the WebSocket port logins with a wrong password, each on a new connection;
//!
//! while a **client** from 127.0.0.1 sends a message every 20 ms, each on a new connection (a
//! signed `SendMessage`, or a login and a publish at durability 1), and counts what took longer
//! than 5 s or was not answered with success as an error. It prints the client's latency
//! percentiles and errors, what the attackers got, and the node's memory (resident now and at
//! its peak). 0 errors is the target.

use crate::client::{next_text, Wire};
use futures::SinkExt;
use qe_shared::sqs::sigv4;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use yawc::frame::Frame;

#[derive(clap::Args, Debug)]
pub struct Settings {
    /// The port under attack.
    #[arg(long, value_enum, default_value_t = Port::Sqs)]
    port: Port,
    /// Seconds the client sends while the attackers run.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=300))]
    seconds: u64,
    /// Idle connections held open.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    idle: u64,
    /// Connections sending their head one byte a second.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(0..=2_000))]
    slow: u64,
    /// Tasks sending requests with a made-up key as fast as they are answered.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=500))]
    flood: u64,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    Sqs,
    Ws,
}

const KEY_ID: &str = "AKIABENCHABUSE";
const SECRET: &str = "bench-abuse-secret";
const SOURCES: u8 = 16;

/// What the attackers got, all kinds together.
#[derive(Default)]
struct Tally {
    opened: AtomicU64,
    closed_by_node: AtomicU64,
    refused_connects: AtomicU64,
    flood_answers: AtomicU64,
}

pub async fn abuse(dataplane: &std::path::Path, data_root: &std::path::Path, settings: &Settings) {
    crate::connections::raise_fd_limit();
    let dir = tempfile::tempdir_in(data_root).expect("a data directory");
    let (mut node, ports) = start(dataplane, dir.path().to_path_buf());
    let pid = node.id();
    let port = settings.port;
    let target = match port {
        Port::Sqs => ports.sqs,
        Port::Ws => ports.ws,
    };
    println!(
        "abuse: node {pid}, its {port:?} port {target} under {} idle, {} slow heads, {} flood tasks, {} s",
        settings.idle, settings.slow, settings.flood, settings.seconds
    );
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + Duration::from_secs(settings.seconds);
    let mut attackers = tokio::task::JoinSet::new();
    for n in 0..settings.idle {
        attackers.spawn(idle(target, source(1, n), tally.clone(), until));
    }
    for n in 0..settings.slow {
        attackers.spawn(slow_head(target, source(2, n), tally.clone(), until));
    }
    for n in 0..settings.flood {
        let from = source(3, n);
        match port {
            Port::Sqs => attackers.spawn(flood(target, from, tally.clone(), until)),
            Port::Ws => attackers.spawn(wrong_logins(target, from, tally.clone(), until)),
        };
    }
    // The attackers settle in first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The client on a thread and runtime of its own, so the attackers' tasks never sit
    // between a reply's arrival and its clock (they still share the machine's cores).
    let measured = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(client(port, target, until))
    });
    let (latencies, errors) = tokio::task::spawn_blocking(move || measured.join())
        .await
        .expect("joined")
        .expect("the client's thread");
    attackers.shutdown().await;
    let memory = memory_of(pid);
    let _ = node.kill();
    let _ = node.wait();
    report(&latencies, errors, &tally, memory);
}

/// Attacker `n` of kind `kind`'s source: 127.0.KIND.1–16.
fn source(kind: u8, n: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        127,
        0,
        kind,
        1 + (n % u64::from(SOURCES)) as u8,
    ))
}

/// Where the node serves.
struct Ports {
    ws: SocketAddr,
    sqs: SocketAddr,
}

/// Starts the node; its process and where it serves.
fn start(dataplane: &std::path::Path, data_dir: PathBuf) -> (Child, Ports) {
    let mut child = Command::new(dataplane)
        .args(["--plaintext", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data_dir)
        .args([
            "--publisher",
            "p:p",
            "--subscriber",
            "s:s",
            "--admin",
            "a:a",
        ])
        .args(["--sqs-listen", "127.0.0.1:0", "--sqs-key"])
        .arg(format!("publisher:{KEY_ID}:{SECRET}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the dataplane binary starts");
    let stdout = child.stdout.take().expect("piped");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let (mut ws, mut sqs) = (None, None);
    while ws.is_none() || sqs.is_none() {
        let line = lines
            .next()
            .expect("the node says where it serves")
            .expect("text");
        let address = |text: &str| text.trim().parse::<SocketAddr>().expect("an address");
        if let Some(addr) = line.strip_prefix("sqs: serving on ") {
            sqs = Some(address(addr));
        } else if let Some(addr) = line.strip_prefix("listening on ") {
            ws = Some(address(addr));
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let ports = Ports {
        ws: ws.expect("read"),
        sqs: sqs.expect("read"),
    };
    (child, ports)
}

async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// A new connection from `from`, counted; None (after a pause) when it is refused.
async fn opened(from: IpAddr, sqs: SocketAddr, tally: &Tally) -> Option<TcpStream> {
    match connect_from(from, sqs).await {
        Ok(stream) => {
            tally.opened.fetch_add(1, Ordering::Relaxed);
            Some(stream)
        }
        Err(_) => {
            tally.refused_connects.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            None
        }
    }
}

/// Holds a connection that sends nothing, and opens another when the node closes it.
async fn idle(sqs: SocketAddr, from: IpAddr, tally: Arc<Tally>, until: Instant) {
    while Instant::now() < until {
        let Some(mut stream) = opened(from, sqs, &tally).await else {
            continue;
        };
        let mut byte = [0u8; 1];
        let left = until.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, stream.read(&mut byte))
            .await
            .is_ok()
        {
            tally.closed_by_node.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sends a request head a byte a second, never finished; again when the node closes it.
async fn slow_head(sqs: SocketAddr, from: IpAddr, tally: Arc<Tally>, until: Instant) {
    let head = b"POST / HTTP/1.1\r\nHost: q\r\nX-Long-Header: ";
    while Instant::now() < until {
        let Some(mut stream) = opened(from, sqs, &tally).await else {
            continue;
        };
        let mut sent = 0;
        while Instant::now() < until {
            let byte = head.get(sent).copied().unwrap_or(b'x');
            if stream.write_all(&[byte]).await.is_err() {
                tally.closed_by_node.fetch_add(1, Ordering::Relaxed);
                break;
            }
            sent += 1;
            let mut answer = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut answer));
            if let Ok(Ok(0) | Err(_)) = read.await {
                tally.closed_by_node.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
}

/// Sends requests with a made-up key on one kept-alive connection, as fast as answered.
async fn flood(sqs: SocketAddr, from: IpAddr, tally: Arc<Tally>, until: Instant) {
    let request = "POST / HTTP/1.1\r\nHost: q\r\nContent-Type: application/x-amz-json-1.0\r\n\
        X-Amz-Target: AmazonSQS.SendMessage\r\nX-Amz-Date: 20260101T000000Z\r\n\
        Authorization: AWS4-HMAC-SHA256 Credential=AKIAMADEUP/20260101/r/sqs/aws4_request, \
        SignedHeaders=host;x-amz-date, Signature=00\r\nContent-Length: 2\r\n\r\n{}";
    while Instant::now() < until {
        let Some(mut stream) = opened(from, sqs, &tally).await else {
            continue;
        };
        let mut buffer = vec![0u8; 4096];
        while Instant::now() < until {
            if stream.write_all(request.as_bytes()).await.is_err() {
                break;
            }
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => tally.flood_answers.fetch_add(1, Ordering::Relaxed),
            };
        }
    }
}

/// Logs in with a wrong password on a new WebSocket connection, as fast as refused.
async fn wrong_logins(ws: SocketAddr, from: IpAddr, tally: Arc<Tally>, until: Instant) {
    let IpAddr::V4(from) = from else {
        unreachable!("loopback IPv4 sources")
    };
    let wire = Wire {
        tls: None,
        compress: false,
    };
    let url = wire.url(ws);
    let login =
        r#"{"username":"p","password":"wrong","role":"publisher","queuetype":"distribute"}"#;
    while Instant::now() < until {
        let Ok(mut socket) = wire.try_connect_from(&url, from).await else {
            tally.refused_connects.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        tally.opened.fetch_add(1, Ordering::Relaxed);
        if socket.send(Frame::text(login)).await.is_ok() && next_text(&mut socket).await.is_some() {
            tally.flood_answers.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The well-behaved client: a message every 20 ms on a new connection from 127.0.0.1 until
/// `until`; each one's latency, and how many failed.
async fn client(port: Port, target: SocketAddr, until: Instant) -> (Vec<Duration>, u64) {
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut n = 0u64;
    while Instant::now() < until {
        tick.tick().await;
        n += 1;
        let started = Instant::now();
        let sent = async {
            match port {
                Port::Sqs => send_one(target, n).await,
                Port::Ws => publish_one(target, n).await,
            }
        };
        match tokio::time::timeout(Duration::from_secs(5), sent).await {
            Ok(Ok(())) => latencies.push(started.elapsed()),
            _ => errors += 1,
        }
    }
    (latencies, errors)
}

/// One signed SendMessage, answered 200.
async fn send_one(sqs: SocketAddr, n: u64) -> std::io::Result<()> {
    let body = format!(r#"{{"QueueUrl":"http://{sqs}/queue","MessageBody":"message {n}"}}"#);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let key = (KEY_ID, SECRET, "bench");
    let headers =
        sigv4::signed_json_headers(&sqs.to_string(), "SendMessage", body.as_bytes(), key, now)
            .expect("signable");
    let mut request = String::from("POST / HTTP/1.1\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    let mut stream = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), sqs).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await?;
    match reply.starts_with(b"HTTP/1.1 200") {
        true => Ok(()),
        false => Err(std::io::Error::other(
            String::from_utf8_lossy(&reply).into_owned(),
        )),
    }
}

/// A login as the publisher, one publish at durability 1 answered with success, and a close.
async fn publish_one(ws: SocketAddr, n: u64) -> std::io::Result<()> {
    let wire = Wire {
        tls: None,
        compress: false,
    };
    let url = wire.url(ws);
    let mut socket = wire
        .try_connect_from(&url, Ipv4Addr::LOCALHOST)
        .await
        .map_err(std::io::Error::other)?;
    let login = r#"{"username":"p","password":"p","role":"publisher","queuetype":"distribute"}"#;
    let publish = format!(r#"{{"body":"message {n}","durability":1}}"#);
    for frame in [login.to_string(), publish] {
        socket
            .send(Frame::text(frame))
            .await
            .map_err(std::io::Error::other)?;
        let reply = next_text(&mut socket).await.unwrap_or_default();
        if !reply.contains("Success.") {
            return Err(std::io::Error::other(reply));
        }
    }
    let _ = socket.close().await;
    Ok(())
}

/// The node's resident memory now and at its peak, in KiB (`/proc/PID/status`).
fn memory_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn report(latencies: &[Duration], errors: u64, tally: &Tally, (rss, peak): (u64, u64)) {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    let at = |q: f64| {
        let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
        sorted.get(index).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "client: {} sends answered, {errors} errors; latency ms p50 {:.2}, p99 {:.2}, max {:.2}",
        latencies.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
    println!(
        "attackers: {} connections opened, {} closed by the node, {} connects refused, {} flood requests answered",
        tally.opened.load(Ordering::Relaxed),
        tally.closed_by_node.load(Ordering::Relaxed),
        tally.refused_connects.load(Ordering::Relaxed),
        tally.flood_answers.load(Ordering::Relaxed),
    );
    println!(
        "node memory: {} KiB resident at the end, {} KiB at its peak",
        rss, peak
    );
}
