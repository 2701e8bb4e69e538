//! Starting the node under test, and reading its costs from /proc.

use crate::client::{login, Socket, Wire};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const PUBLISHER: (&str, &str) = ("bench-publisher", "bench-publisher-password");
pub const SUBSCRIBER: (&str, &str) = ("bench-subscriber", "bench-subscriber-password");
pub const ADMIN: (&str, &str) = ("bench-admin", "bench-admin-password");

/// A connection to the node at `url`, logged in as its administrator.
pub async fn admin_login(wire: &Wire, url: &str) -> Socket {
    let request = serde_json::json!({
        "username": ADMIN.0, "password": ADMIN.1, "role": "admin", "queuetype": "distribute",
    });
    login(wire, url, request).await
}

#[derive(Clone)]
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
    /// The node binary counts its allocations (built with `--features count-allocations`).
    pub count_allocations: bool,
    /// Count the node's system calls with `perf stat` during each run.
    pub count_syscalls: bool,
    /// Serve the SQS face too (on a port of its own), with the key [`SQS_KEY`].
    pub sqs_face: bool,
    /// Give the node a standby pinned to this core (issue 35).
    pub standby_cpu: Option<usize>,
}

impl NodeConfig {
    /// The same node with its clients over `wss://`: a certificate for `localhost` from a CA
    /// made now (under the data root), which the clients trust.
    pub fn over_tls(&self) -> NodeConfig {
        let (cert, key, connector) = crate::client::test_pki(&self.data_root.join("tls"));
        NodeConfig {
            wire: Wire {
                tls: Some(connector),
                ..self.wire.clone()
            },
            tls_files: Some((cert, key)),
            ..self.clone()
        }
    }
}

/// The replication key of a node started with a standby.
const REPLICATION_KEY: &str = "bench-replication-key";

/// The SQS key of a node started with `sqs_face`: an administrator's.
pub const SQS_KEY: (&str, &str) = ("AKIABENCH", "bench-secret");

pub struct Node {
    child: Child,
    addr: std::net::SocketAddr,
    /// Its standby, when it has one.
    standby: Option<Child>,
    url: String,
    /// The SQS face's address, when it serves one.
    pub sqs: Option<std::net::SocketAddr>,
    /// Time from spawn to the `listening on` line.
    pub startup: Duration,
    /// The counts the node prints at SIGUSR1 (`allocations N`), when it counts them.
    allocation_counts: Option<std::sync::mpsc::Receiver<u64>>,
}

impl Node {
    /// Starts the node on `data_dir`, pinned to its core, with its standby if it has one
    /// (in sync when this returns).
    pub fn start(config: &NodeConfig, data_dir: &Path) -> Node {
        let mut node = Node::start_alone(config, data_dir);
        if let Some(cpu) = config.standby_cpu {
            node.attach_standby(config, cpu, data_dir);
            // A moment for the node to hear that it is in sync.
            std::thread::sleep(Duration::from_millis(200));
        }
        node
    }

    /// Starts its standby (on `cpu`, its data beside the node's in `data_dir`) and returns once
    /// the standby has caught up.
    pub fn attach_standby(&mut self, config: &NodeConfig, cpu: usize, data_dir: &Path) {
        let standby = start_standby(config, cpu, self.addr, &data_dir.join("standby"));
        self.standby = Some(standby);
    }

    /// Kills its standby (SIGKILL), if it has one; its data stays.
    pub fn kill_standby(&mut self) {
        if let Some(mut standby) = self.standby.take() {
            let _ = standby.kill();
            let _ = standby.wait();
        }
    }

    /// The standby's process id, when the node has one.
    pub fn standby_pid(&self) -> Option<u32> {
        self.standby.as_ref().map(Child::id)
    }

    /// Starts the node on `data_dir`, pinned to its core; with `--replication-key` if it is to
    /// have a standby, which is not started.
    pub fn start_alone(config: &NodeConfig, data_dir: &Path) -> Node {
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
            .args(["--admin", &login(ADMIN)])
            .args(
                config
                    .segment_bytes
                    .map(|bytes| ["--log-segment-bytes".to_string(), bytes.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .args(config.no_compaction.then_some("--no-compaction"))
            .args(match config.standby_cpu {
                Some(_) => vec!["--replication-key", REPLICATION_KEY],
                None => Vec::new(),
            })
            .args(match config.sqs_face {
                true => vec![
                    "--sqs-listen".to_string(),
                    "127.0.0.1:0".to_string(),
                    "--sqs-key".to_string(),
                    format!("admin:{}:{}", SQS_KEY.0, SQS_KEY.1),
                ],
                false => Vec::new(),
            })
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the node (is taskset installed and the release binary built?)");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (mut addr, mut sqs) = (None, None);
        while addr.is_none() || (config.sqs_face && sqs.is_none()) {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "the node exited");
            if let Some(listening) = line.trim().strip_prefix("listening on ") {
                addr = Some(listening.parse::<std::net::SocketAddr>().unwrap());
            }
            if let Some(serving) = line.trim().strip_prefix("sqs: serving on ") {
                sqs = Some(serving.parse::<std::net::SocketAddr>().unwrap());
            }
        }
        let addr = addr.expect("read");
        let startup = started.elapsed();
        let (counts, allocation_counts) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let line = line.unwrap_or_default();
                if let Some(count) = line.strip_prefix("allocations ") {
                    let _ = counts.send(count.trim().parse().unwrap_or(0));
                }
            }
        });
        Node {
            child,
            addr,
            standby: None,
            url: config.wire.url(addr),
            sqs,
            startup,
            allocation_counts: config.count_allocations.then_some(allocation_counts),
        }
    }

    /// The allocations the node has made so far, when it counts them.
    pub fn allocations(&self) -> Option<u64> {
        let counts = self.allocation_counts.as_ref()?;
        // SAFETY: a plain kill(2) of our own child; a node built with the feature prints
        // its count on SIGUSR1.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGUSR1) };
        let count = counts.recv_timeout(Duration::from_secs(5));
        Some(count.expect("the node prints its allocations (built with count-allocations?)"))
    }

    /// Starts counting the node's system calls, when asked to.
    pub fn count_syscalls(&self, config: &NodeConfig) -> Option<SyscallCount> {
        config
            .count_syscalls
            .then(|| SyscallCount::start(self.child.id()))
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// User plus system CPU time the node has used.
    pub fn cpu_time(&self) -> Duration {
        cpu_time(self.child.id())
    }

    /// The user and the system CPU time the node has used.
    pub fn cpu_times(&self) -> CpuTimes {
        cpu_times(self.child.id())
    }

    /// Peak and current resident memory, in bytes.
    pub fn memory(&self) -> (u64, u64) {
        memory(self.child.id())
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
        if let Some(standby) = &mut self.standby {
            let _ = standby.kill();
            let _ = standby.wait();
        }
    }
}

/// Starts the standby of the node at `addr` on `cpu`, with its data in `dir`, and waits until
/// it has caught up.
fn start_standby(config: &NodeConfig, cpu: usize, addr: std::net::SocketAddr, dir: &Path) -> Child {
    let primary = match &config.tls_files {
        Some(_) => format!("wss://localhost:{}/", addr.port()),
        None => format!("ws://{addr}/"),
    };
    let ca = config.data_root.join("tls").join("ca.pem");
    let mut child = Command::new("taskset")
        .args(["-c", &cpu.to_string(), &config.binary])
        .args([
            "--standby-of",
            &primary,
            "--replication-key",
            REPLICATION_KEY,
        ])
        .arg("--data-dir")
        .arg(dir)
        .args(match config.tls_files {
            Some(_) => vec!["--standby-ca".as_ref(), ca.as_os_str()],
            None => Vec::new(),
        })
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the standby");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "the standby exited"
        );
        if line.contains("caught up with the primary") {
            break;
        }
    }
    std::thread::spawn(move || {
        for line in stderr.lines() {
            let line = line.unwrap_or_default();
            if line.contains("WARN") || line.contains("ERROR") {
                eprintln!("standby: {line}");
            }
        }
    });
    child
}

/// User plus system CPU time process `pid` has used (all its threads).
pub fn cpu_time(pid: u32) -> Duration {
    let times = cpu_times(pid);
    times.user + times.system
}

/// CPU time in the process's own code and in the kernel on its behalf.
#[derive(Debug, Clone, Copy)]
pub struct CpuTimes {
    pub user: Duration,
    pub system: Duration,
}

/// The user and the system CPU time process `pid` has used (all its threads).
pub fn cpu_times(pid: u32) -> CpuTimes {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let time = |field: &str| {
        let ticks: u64 = field.parse().unwrap();
        Duration::from_micros(ticks * 1_000_000 / clock_ticks_per_second())
    };
    CpuTimes {
        user: time(fields[11]),
        system: time(fields[12]),
    }
}

/// Peak and current resident memory of process `pid`, in bytes.
pub fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
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

/// The system calls of a process, counted by `perf stat` on the kernel's syscall tracepoints
/// (cheap: a counter per call, no tracing).
pub struct SyscallCount {
    perf: Child,
}

/// What the node called while it was counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Syscalls {
    pub all: u64,
    /// Writes to sockets (send, sendto, sendmsg, write, writev).
    pub writes: u64,
    /// Reads from sockets (recv, recvfrom, recvmsg, read, readv).
    pub reads: u64,
    /// Waits for readiness (epoll_wait, epoll_pwait): how often the runtime asked the kernel
    /// what is ready.
    pub polls: u64,
    /// futex calls: a thread woken or put to sleep (the log's threads, blocking tasks).
    pub futexes: u64,
}

const WRITE_CALLS: [&str; 4] = ["sendto", "sendmsg", "write", "writev"];
const READ_CALLS: [&str; 4] = ["recvfrom", "recvmsg", "read", "readv"];
const POLL_CALLS: [&str; 2] = ["epoll_wait", "epoll_pwait"];

impl SyscallCount {
    fn start(pid: u32) -> SyscallCount {
        // perf reads the tracepoints from tracefs; mount it if it is not there (root).
        if !Path::new("/sys/kernel/tracing/events/raw_syscalls").exists() {
            let _ = Command::new("mount")
                .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
                .status();
        }
        let mut events = vec!["raw_syscalls:sys_enter".to_string()];
        for call in WRITE_CALLS
            .iter()
            .chain(&READ_CALLS)
            .chain(&POLL_CALLS)
            .chain(&["futex"])
        {
            events.push(format!("syscalls:sys_enter_{call}"));
        }
        let perf = Command::new("perf")
            .args([
                "stat",
                "-x",
                ",",
                "-e",
                &events.join(","),
                "-p",
                &pid.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("perf (linux-perf) to count system calls");
        // perf attaches within milliseconds; a count that starts a little late only
        // undercounts the first moments of the run.
        std::thread::sleep(Duration::from_millis(200));
        SyscallCount { perf }
    }

    pub fn finish(self) -> Syscalls {
        // SAFETY: a plain kill(2) of our own child: SIGINT makes perf print its counts.
        unsafe { libc::kill(self.perf.id() as libc::pid_t, libc::SIGINT) };
        let output = self.perf.wait_with_output().expect("perf's counts");
        let mut counts = Syscalls::default();
        for line in String::from_utf8_lossy(&output.stderr).lines() {
            let fields: Vec<&str> = line.split(',').collect();
            let (Some(count), Some(event)) = (fields.first(), fields.get(2)) else {
                continue;
            };
            let Ok(count) = count.parse::<u64>() else {
                continue;
            };
            let call = event.rsplit("sys_enter_").next().unwrap_or("");
            match *event {
                "raw_syscalls:sys_enter" => counts.all = count,
                _ if WRITE_CALLS.contains(&call) => counts.writes += count,
                _ if READ_CALLS.contains(&call) => counts.reads += count,
                _ if POLL_CALLS.contains(&call) => counts.polls += count,
                "syscalls:sys_enter_futex" => counts.futexes += count,
                _ => {}
            }
        }
        counts
    }
}
