//! `bench live-metrics`: what the nodes' live reports and `/metrics` cost the control plane
//! with many queues (issue 17, part 3), without a node process per queue.
//!
//! It writes a backup holding `--queues` running queue records (spread over accounts) and a
//! node secret, restores it into a fresh directory (`controlplane restore`), and starts the
//! real control plane on it with `dataplane = "/bin/false"`: the reconciler's first pass writes
//! each queue's bootstrap, with the node token the control plane itself made, and fails to
//! start its node (and looks again only a day later). The bench then plays every node: it
//! sends each queue's live report every `--interval` seconds, as nodes do (keep-alive
//! connections, the node's token), measuring the control plane's CPU time against an idle
//! stretch of the same length; then the same reports each carrying a stats record (what a
//! report kept in the store costs, for comparison); then it scrapes `/metrics` and gives its
//! size and the CPU per scrape.

use crate::node::{cpu_time, memory};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The operator's token in the config.
const TOKEN: &str = "operator-token-for-the-live-metrics-bench";

#[derive(clap::Args)]
pub struct Settings {
    /// The control plane binary (a release build).
    #[arg(long, default_value = "target/release/controlplane")]
    controlplane: PathBuf,
    /// Queues (each a node's reports).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=20_000))]
    queues: u64,
    /// Accounts the queues are spread over.
    #[arg(long, default_value_t = 100)]
    accounts: u64,
    /// Seconds between one queue's live reports (the nodes' default is 10).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    interval: u64,
    /// Seconds of live reports measured (and of the idle stretch before them).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,
    /// Seconds of reports that carry a stats record each (0: none).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=600))]
    stored_seconds: u64,
    /// Connections the reports share (each node has one of its own; the cost per request is
    /// the same).
    #[arg(long, default_value_t = 100)]
    connections: u64,
    /// Scrapes of `/metrics` measured.
    #[arg(long, default_value_t = 20)]
    scrapes: u64,
    /// Leave the control plane's directory under --data-root.
    #[arg(long)]
    keep: bool,
}

pub async fn live_metrics(settings: &Settings, data_root: &Path) {
    let binary = std::fs::canonicalize(&settings.controlplane)
        .unwrap_or_else(|e| panic!("{}: {e} (build it first)", settings.controlplane.display()));
    let root = std::fs::canonicalize(data_root).expect("the data root");
    let dir = tempfile::Builder::new()
        .prefix("live-metrics.")
        .disable_cleanup(settings.keep)
        .tempdir_in(root)
        .expect("a directory for the control plane");
    let ids: Vec<String> = (0..settings.queues).map(|n| format!("q{n:011}")).collect();
    let control_plane = ControlPlane::restore_and_start(&binary, dir.path(), settings, &ids);
    let tokens = control_plane.tokens(&ids);
    println!(
        "control plane {} (pid {}) on {}: {} queues over {} accounts, all reporting every {} s \
         ({:.0} reports/s) on {} connections",
        binary.display(),
        control_plane.pid(),
        control_plane.api,
        ids.len(),
        settings.accounts,
        settings.interval,
        ids.len() as f64 / settings.interval as f64,
        settings.connections
    );
    let time = Duration::from_secs(settings.seconds);
    let idle = control_plane.cpu_over(time).await;
    println!(
        "idle: {:.3} s of CPU in {} s ({:.2}% of a core)",
        idle.as_secs_f64(),
        settings.seconds,
        share(idle, time)
    );
    let live = send_reports(&control_plane, settings, &ids, &tokens, time, false).await;
    live.print("live reports (kept in memory)", idle, time);
    if settings.stored_seconds > 0 {
        let time = Duration::from_secs(settings.stored_seconds);
        let stored = send_reports(&control_plane, settings, &ids, &tokens, time, true).await;
        let idle = idle.mul_f64(time.as_secs_f64() / settings.seconds as f64);
        stored.print(
            "reports with one stats record each (kept in the store)",
            idle,
            time,
        );
    }
    scrape(&control_plane, settings.scrapes, &ids).await;
    let (rss, peak) = memory(control_plane.pid());
    println!(
        "control plane memory (VmRSS) {:.1} MiB, peak {:.1} MiB",
        rss as f64 / (1 << 20) as f64,
        peak as f64 / (1 << 20) as f64
    );
    drop(control_plane);
    if settings.keep {
        println!("kept {}", dir.path().display());
    }
}

/// What one phase of reports did.
struct Sent {
    reports: u64,
    failures: u64,
    cpu: Duration,
    latencies: Vec<Duration>,
}

impl Sent {
    /// Its line: reports, failures, latency, and the CPU per report above `idle` (the CPU an
    /// idle stretch of the same `time` took).
    fn print(&self, what: &str, idle: Duration, time: Duration) {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let at = |q: f64| match sorted.len() {
            0 => Duration::ZERO,
            n => sorted[((n - 1) as f64 * q) as usize],
        };
        let above_idle = self.cpu.saturating_sub(idle);
        let per_report = above_idle.as_secs_f64() / self.reports.max(1) as f64;
        println!(
            "{what}: {} sent, {} failed in {:.0} s; latency p50 {:.2} ms, p99 {:.2} ms; control \
             plane CPU {:.3} s ({:.2}% of a core), {:.1} µs per report above idle",
            self.reports,
            self.failures,
            time.as_secs_f64(),
            at(0.5).as_secs_f64() * 1e3,
            at(0.99).as_secs_f64() * 1e3,
            self.cpu.as_secs_f64(),
            share(self.cpu, time),
            per_report * 1e6,
        );
    }
}

/// Sends every queue's report every interval for `time`, spread evenly; with `stored`, each
/// carries a stats record the control plane has not seen.
async fn send_reports(
    control_plane: &ControlPlane,
    settings: &Settings,
    ids: &[String],
    tokens: &[String],
    time: Duration,
    stored: bool,
) -> Sent {
    let connections = settings.connections.clamp(1, ids.len() as u64) as usize;
    let interval = Duration::from_secs(settings.interval);
    let cpu_before = cpu_time(control_plane.pid());
    let started = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..connections {
        let mine: Vec<(String, String)> = (c..ids.len())
            .step_by(connections)
            .map(|i| (ids[i].clone(), tokens[i].clone()))
            .collect();
        // The connection's reports go evenly through the interval, and the connections'
        // are staggered: the control plane sees a steady stream, as from many nodes.
        let every = interval / mine.len() as u32;
        let first = started + interval * c as u32 / ids.len() as u32;
        let api = control_plane.api;
        tasks.spawn(async move {
            let mut connection = Connection::open(api).await;
            let mut ticks = tokio::time::interval_at(first, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sent = Sent {
                reports: 0,
                failures: 0,
                cpu: Duration::ZERO,
                latencies: Vec::new(),
            };
            let mut round = 0u64;
            while ticks.tick().await < started + time {
                let (id, token) = &mine[(round % mine.len() as u64) as usize];
                let body = report_body(id, round / mine.len() as u64, stored);
                let path = format!("/v1/nodes/{id}/reports");
                let asked = Instant::now();
                let (status, _) = connection.request("POST", &path, token, &body).await;
                sent.latencies.push(asked.elapsed());
                sent.reports += 1;
                sent.failures += (status != 200) as u64;
                round += 1;
            }
            sent
        });
    }
    let mut all = Sent {
        reports: 0,
        failures: 0,
        cpu: Duration::ZERO,
        latencies: Vec::new(),
    };
    while let Some(sent) = tasks.join_next().await {
        let sent = sent.expect("a reporting connection");
        all.reports += sent.reports;
        all.failures += sent.failures;
        all.latencies.extend(sent.latencies);
    }
    all.cpu = cpu_time(control_plane.pid()).saturating_sub(cpu_before);
    all
}

/// A node's report: its live numbers (plausible sizes, so the scrape's numbers are as wide
/// as a busy cluster's), and with `stored` a stats record of a time never sent before.
fn report_body(id: &str, round: u64, stored: bool) -> String {
    let n: u64 = id[1..].parse().expect("generated ids");
    let live = serde_json::json!({
        "waiting": 1000 + n % 9000, "delayed": n % 50, "held": 64 + n % 512,
        "dead_letter": n % 300, "durable": 2000 + n, "publishers": 1 + n % 16,
        "subscribers": 1 + n % 32, "admins": n % 2, "saved_sessions": n % 3,
        "published": 123_456_789 + round * 1000, "delivered": 123_450_000 + round * 1000,
        "acked": 123_400_000 + round * 990, "nacked": 12_345 + round,
        "network_received": 98_765_432_100 + round * 100_000,
        "network_sent": 87_654_321_000 + round * 100_000,
        "messages_memory_used": 12_345_678 + n * 1000, "max_messages": 1_000_000,
        "max_messages_memory": 8_589_934_592u64, "certificate_expires": 1_800_000_000u64 + n,
    });
    let mut report = serde_json::json!({ "live": live });
    if stored {
        let time = 1_700_000_000 + round * 300;
        report["stats"] = serde_json::json!([{"time": time, "messages": 5, "publishers": 1,
            "subscribers": 1, "saved_subscribers": 0, "administrators": 0, "unacknowledged": 1,
            "dead_letter": 0, "delayed": 0, "durable": 5}]);
    }
    report.to_string()
}

/// Scrapes `/metrics` `count` times on one connection: its size, series and the CPU each
/// takes; checks every queue has its numbers there.
async fn scrape(control_plane: &ControlPlane, count: u64, ids: &[String]) {
    let mut connection = Connection::open(control_plane.api).await;
    let cpu_before = cpu_time(control_plane.pid());
    let mut latencies = Vec::new();
    let mut body = Vec::new();
    for _ in 0..count.max(1) {
        let asked = Instant::now();
        let (status, got) = connection.request("GET", "/metrics", TOKEN, "").await;
        latencies.push(asked.elapsed());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&got));
        body = got;
    }
    let cpu = cpu_time(control_plane.pid()).saturating_sub(cpu_before);
    let text = String::from_utf8(body).expect("text");
    let samples = text.lines().filter(|l| !l.starts_with('#')).count();
    let per_queue = text
        .lines()
        .filter(|l| l.contains(&format!("queue=\"{}\"", ids[0])))
        .count();
    let reporting = ids
        .iter()
        .filter(|id| text.contains(&format!("qe_queue_acked_messages_total{{queue=\"{id}\"")))
        .count();
    latencies.sort_unstable();
    println!(
        "/metrics: {} bytes, {} lines, {samples} samples ({per_queue} per queue; {reporting} of \
         {} queues with fresh numbers); {} scrapes: latency p50 {:.1} ms, max {:.1} ms; \
         control plane CPU {:.1} ms per scrape",
        text.len(),
        text.lines().count(),
        ids.len(),
        latencies.len(),
        latencies[latencies.len() / 2].as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3,
        cpu.as_secs_f64() * 1e3 / latencies.len() as f64,
    );
}

/// The control plane under test, killed on drop.
struct ControlPlane {
    child: Child,
    api: SocketAddr,
    data: PathBuf,
}

impl ControlPlane {
    /// Restores a backup of `ids` into `dir` and starts the control plane on it; returns once
    /// it serves and its reconciler has written every queue's bootstrap.
    fn restore_and_start(
        binary: &Path,
        dir: &Path,
        settings: &Settings,
        ids: &[String],
    ) -> ControlPlane {
        let data = dir.join("data");
        let config = dir.join("controlplane.toml");
        // No node is ever started: `/bin/false` exits at once, and the reconciler looks again
        // a day later.
        let text = format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = {data:?}\ntoken = \"{TOKEN}\"\n\
             cluster = \"bench\"\ndataplane = \"/bin/false\"\nreconcile_every_secs = 86400\n\
             live_stats_secs = {}\n",
            settings.interval
        );
        std::fs::write(&config, text).unwrap();
        let backup = dir.join("backup.ndjson");
        std::fs::write(&backup, backup_of(ids, settings.accounts)).unwrap();
        let restored = Command::new(binary)
            .args(["restore", "--config"])
            .arg(&config)
            .arg("--from")
            .arg(&backup)
            .output()
            .expect("controlplane restore");
        assert!(
            restored.status.success(),
            "restore: {}",
            String::from_utf8_lossy(&restored.stderr)
        );
        let log = std::fs::File::create(dir.join("controlplane.log")).unwrap();
        let mut child = Command::new(binary)
            .args(["serve", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("controlplane serve");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut lines = stdout.lines();
        let api = loop {
            let line = lines
                .next()
                .expect("`listening on` before it exits")
                .unwrap();
            if let Some(addr) = line.trim().strip_prefix("listening on ") {
                break addr.parse().expect("an address");
            }
        };
        std::thread::spawn(move || for _ in lines {});
        let control_plane = ControlPlane { child, api, data };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !ids.iter().all(|id| control_plane.bootstrap(id).exists()) {
            assert!(
                Instant::now() < deadline,
                "the bootstraps were not all written"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        control_plane
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn bootstrap(&self, id: &str) -> PathBuf {
        self.data.join("nodes").join(id).join("bootstrap.toml")
    }

    /// Each queue's node token, as the control plane wrote it in the queue's bootstrap.
    fn tokens(&self, ids: &[String]) -> Vec<String> {
        ids.iter()
            .map(|id| {
                let text = std::fs::read_to_string(self.bootstrap(id)).unwrap();
                let line = text.lines().find(|l| l.starts_with("node_token = "));
                let token = line
                    .expect("a node token")
                    .trim_start_matches("node_token = ");
                token.trim_matches('"').to_string()
            })
            .collect()
    }

    /// The CPU time it takes over the next `time`, left alone.
    async fn cpu_over(&self, time: Duration) -> Duration {
        // Past the reconciler's first pass (the bootstraps' writes, the failed starts).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = cpu_time(self.pid());
        tokio::time::sleep(time).await;
        cpu_time(self.pid()).saturating_sub(before)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A backup (backup.rs' format) of one running queue per id, spread over `accounts`
/// accounts, and a node secret.
fn backup_of(ids: &[String], accounts: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let login = |role: &str| {
        serde_json::json!({"username": format!("{role}-bench"),
        "password_hash": "sha256:00:00"})
    };
    let mut entries: Vec<(String, Vec<u8>)> = vec![("node-secret".into(), vec![7u8; 32])];
    for (n, id) in ids.iter().enumerate() {
        let queue = serde_json::json!({
            "id": id, "tier": "standard", "region": "local", "instance_type": "local",
            "ipv4": false, "status": "running", "node": "ws://127.0.0.1:9/", "created": now,
            "publisher": login("publisher"), "subscriber": login("subscriber"),
            "admin": login("admin"), "account": format!("a{:011}", n as u64 % accounts.max(1)),
        });
        entries.push((format!("queues/{id}"), queue.to_string().into_bytes()));
    }
    let header = serde_json::json!({"backup": "the-queue-expert-control-plane/1",
        "created": now, "entries": entries.len(), "zone_serial": 0});
    let mut text = header.to_string() + "\n";
    for (key, value) in entries {
        text += &(serde_json::json!({"key": key, "value": base64(&value)}).to_string() + "\n");
    }
    text
}

/// Standard base64 with padding (a backup's values).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, b| n << 8 | *b as u32) << (8 * (3 - chunk.len()));
        for i in 0..4 {
            match i <= chunk.len() {
                true => out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char),
                false => out.push('='),
            }
        }
    }
    out
}

/// One kept-alive HTTP/1.1 connection, requests written by hand.
struct Connection {
    stream: TcpStream,
    /// What was read past the last response.
    buffer: Vec<u8>,
}

impl Connection {
    async fn open(api: SocketAddr) -> Connection {
        let stream = TcpStream::connect(api).await.expect("the API");
        stream.set_nodelay(true).unwrap();
        Connection {
            stream,
            buffer: Vec::new(),
        }
    }

    /// One request; its status and body (the response must give its Content-Length).
    async fn request(
        &mut self,
        method: &str,
        path: &str,
        token: &str,
        body: &str,
    ) -> (u16, Vec<u8>) {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: cp\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream
            .write_all(request.as_bytes())
            .await
            .expect("sent");
        let head_end = loop {
            if let Some(at) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            self.read_more().await;
        };
        let head = String::from_utf8_lossy(&self.buffer[..head_end]).to_string();
        let status: u16 = head[9..12].parse().expect("a status");
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .expect("a Content-Length");
        while self.buffer.len() < head_end + length {
            self.read_more().await;
        }
        let body = self.buffer[head_end..head_end + length].to_vec();
        self.buffer.drain(..head_end + length);
        (status, body)
    }

    async fn read_more(&mut self) {
        let mut chunk = [0u8; 64 * 1024];
        let read = self.stream.read(&mut chunk).await.expect("a response");
        assert!(read > 0, "the control plane closed the connection");
        self.buffer.extend_from_slice(&chunk[..read]);
    }
}

fn share(cpu: Duration, time: Duration) -> f64 {
    100.0 * cpu.as_secs_f64() / time.as_secs_f64()
}
