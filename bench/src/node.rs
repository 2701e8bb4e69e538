//! Starting the node under test, and reading its costs from /proc.

use crate::client::Wire;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const PUBLISHER: (&str, &str) = ("bench-publisher", "bench-publisher-password");
pub const SUBSCRIBER: (&str, &str) = ("bench-subscriber", "bench-subscriber-password");

pub struct NodeConfig {
    pub binary: String,
    pub cpu: usize,
    pub data_root: PathBuf,
    /// How clients connect.
    pub wire: Wire,
    /// The node's certificate and key, when the wire is TLS.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    /// The size of the message log's segments, when not the node's default.
    pub segment_bytes: Option<u64>,
    /// Start the node with compaction off (to measure what compaction costs).
    pub no_compaction: bool,
}

pub struct Node {
    child: Child,
    url: String,
    /// Time from spawn to the `listening on` line.
    pub startup: Duration,
}

impl Node {
    /// Starts the node on `data_dir`, pinned to its core.
    pub fn start(config: &NodeConfig, data_dir: &Path) -> Node {
        let login = |(name, password): (&str, &str)| format!("{name}:{password}");
        let started = Instant::now();
        let transport: Vec<&std::ffi::OsStr> = match &config.tls_files {
            Some((cert, key)) => vec![
                "--tls-cert".as_ref(),
                cert.as_os_str(),
                "--tls-key".as_ref(),
                key.as_os_str(),
            ],
            None => vec!["--plaintext".as_ref()],
        };
        let mut child = Command::new("taskset")
            .args(["-c", &config.cpu.to_string(), &config.binary])
            .args(transport)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(["--publisher", &login(PUBLISHER)])
            .args(["--subscriber", &login(SUBSCRIBER)])
            .args(["--admin", "bench-admin:bench-admin-password"])
            .args(
                config
                    .segment_bytes
                    .map(|bytes| ["--log-segment-bytes".to_string(), bytes.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .args(config.no_compaction.then_some("--no-compaction"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the node (is taskset installed and the release binary built?)");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let addr = loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "the node exited");
            if let Some(addr) = line.trim().strip_prefix("listening on ") {
                break addr.parse::<std::net::SocketAddr>().unwrap();
            }
        };
        let startup = started.elapsed();
        std::thread::spawn(move || for _ in stdout.lines() {});
        Node {
            child,
            url: config.wire.url(addr),
            startup,
        }
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// User plus system CPU time the node has used.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        Duration::from_micros(ticks * 1_000_000 / clock_ticks_per_second())
    }

    /// Peak and current resident memory, in bytes.
    pub fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib = |key: &str| {
            let line = status.lines().find(|l| l.starts_with(key)).unwrap();
            line.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap()
                * 1024
        };
        (kib("VmHWM:"), kib("VmRSS:"))
    }

    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn clock_ticks_per_second() -> u64 {
    let output = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Serial 4 KiB appends, each followed by fdatasync, for `time`: syncs per second.
pub fn fdatasync_probe(dir: &Path, time: Duration) -> f64 {
    let path = dir.join("fdatasync-probe");
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let block = [7u8; 4096];
    let started = Instant::now();
    let mut syncs = 0u64;
    while started.elapsed() < time {
        file.write_all(&block).unwrap();
        file.sync_data().unwrap();
        syncs += 1;
    }
    let rate = syncs as f64 / started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(path);
    rate
}
