//! The control plane: three replicas of the real `controlplane` binary on the shared etcd,
//! each on the documented per-replica config (docs/deploy.md §13,
//! infra/controlplane-replica.example.toml): the same file on every replica but for its own
//! API address, data directory, and `node_urls`, which lists its own URL first. They share
//! one `local_nodes_dir`, so a new leader adopts the nodes the last one started. Each has a
//! DNS server on loopback, as a replica does.
//!
//! A replica's stderr (`RUST_LOG=info`) goes to `rI-N.log` in the run's directory, one file
//! per start, so the leader is the running replica whose current log says `: leading` more
//! often than `no longer leading`.

use super::etcd::free_ports;
use super::reaper;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The operator's token, the same on every replica.
pub const TOKEN: &str = "operator-token-for-the-chaos-run";

/// How long a replica may take to print `listening on`.
const START_WITHIN: Duration = Duration::from_secs(30);

/// How long a replica has to exit after SIGTERM before SIGKILL.
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// The control plane's settings a run may change; `None` leaves the control plane's default.
#[derive(Clone, Default)]
pub struct Tuning {
    pub lease_secs: Option<u64>,
    pub timeout_secs: Option<u64>,
    pub live_stats_secs: Option<u64>,
    pub replace_silent_after_intervals: Option<u64>,
    pub reconcile_every_secs: Option<u64>,
}

pub struct Replicas {
    binary: PathBuf,
    /// The run's directory: configs, logs, each replica's `data_dir`.
    dir: PathBuf,
    /// The shared `local_nodes_dir`: `nodes/ID/` of every queue.
    nodes_dir: PathBuf,
    /// Each replica's API address, fixed for the run (the nodes' bootstraps name them).
    pub apis: Vec<SocketAddr>,
    replicas: Vec<Replica>,
}

struct Replica {
    config: PathBuf,
    /// The process; `None` while it is down.
    child: Option<Child>,
    /// What the current process logged about leading.
    log: Option<Leading>,
    /// How many times it was started.
    starts: usize,
}

impl Replicas {
    /// Writes the configs of `count` replicas on `etcd` into `dir` and starts them: the first
    /// alone until it leads, then the others.
    pub fn start(
        binary: &Path,
        dataplane: &Path,
        dir: &Path,
        etcd: &[String],
        count: usize,
        tuning: &Tuning,
    ) -> Replicas {
        let nodes_dir = dir.join("nodes");
        std::fs::create_dir_all(&nodes_dir).expect("the nodes' directory");
        reaper::nodes_under(&nodes_dir);
        let apis: Vec<SocketAddr> = free_ports(count)
            .into_iter()
            .map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
            .collect();
        let urls: Vec<String> = apis
            .iter()
            .map(|addr| format!("\"http://{addr}\""))
            .collect();
        let endpoints: Vec<String> = etcd.iter().map(|e| format!("{e:?}")).collect();
        let optional = |name: &str, value: Option<u64>| match value {
            Some(value) => format!("{name} = {value}\n"),
            None => String::new(),
        };
        let replicas = (0..count)
            .map(|i| {
                let own_first = [&urls[i..], &urls[..i]].concat();
                let config = format!(
                    "listen = \"{}\"\ndata_dir = {:?}\ntoken = \"{TOKEN}\"\ncluster = \"chaos\"\n\
                     dataplane = {:?}\ndns_listen = \"127.0.0.1:0\"\nlocal_nodes_dir = {:?}\n\
                     node_urls = [{}]\n{}{}{}\n[store]\nkind = \"etcd\"\nendpoints = [{}]\n{}{}",
                    apis[i],
                    dir.join(format!("r{i}")),
                    dataplane,
                    nodes_dir,
                    own_first.join(", "),
                    optional("live_stats_secs", tuning.live_stats_secs),
                    optional(
                        "replace_silent_after_intervals",
                        tuning.replace_silent_after_intervals
                    ),
                    optional("reconcile_every_secs", tuning.reconcile_every_secs),
                    endpoints.join(", "),
                    optional("timeout_secs", tuning.timeout_secs),
                    optional("lease_secs", tuning.lease_secs),
                );
                let path = dir.join(format!("r{i}.toml"));
                std::fs::write(&path, config).expect("a replica's config");
                Replica {
                    config: path,
                    child: None,
                    log: None,
                    starts: 0,
                }
            })
            .collect();
        let mut replicas = Replicas {
            binary: binary.to_path_buf(),
            dir: dir.to_path_buf(),
            nodes_dir,
            apis,
            replicas,
        };
        replicas.start_one(0);
        let deadline = Instant::now() + START_WITHIN;
        while replicas.leader() != Some(0) {
            if Instant::now() > deadline {
                panic!("the first replica does not lead: see {}", dir.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for i in 1..count {
            replicas.start_one(i);
        }
        replicas
    }

    pub fn count(&self) -> usize {
        self.replicas.len()
    }

    /// The running replica that says it leads, if one does.
    pub fn leader(&mut self) -> Option<usize> {
        let mut leader = None;
        for (i, replica) in self.replicas.iter_mut().enumerate() {
            if replica.child.is_none() {
                continue;
            }
            if replica.log.as_mut().is_some_and(Leading::leads) {
                leader = Some(i);
            }
        }
        leader
    }

    /// The APIs of the replicas running now.
    pub fn running(&self) -> Vec<SocketAddr> {
        (0..self.count())
            .filter(|&i| self.replicas[i].child.is_some())
            .map(|i| self.apis[i])
            .collect()
    }

    /// Starts replica `i` (again) on its config; returns once it serves.
    pub fn start_one(&mut self, i: usize) {
        let replica = &mut self.replicas[i];
        assert!(replica.child.is_none(), "r{i} runs");
        let log_path = self.dir.join(format!("r{i}-{}.log", replica.starts));
        replica.starts += 1;
        let log = std::fs::File::create(&log_path).expect("a replica's log");
        let mut child = Command::new(&self.binary)
            .args(["serve", "--config"])
            .arg(&replica.config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e} (build it first)", self.binary.display()));
        reaper::started(child.id());
        let lines = forward_lines(child.stdout.take().expect("piped"));
        let deadline = Instant::now() + START_WITHIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.starts_with("listening on ") => break,
                Ok(_) => {}
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "replica r{i} printed no `listening on`; its log ends:\n{}",
                        tail(&log_path, 30)
                    );
                }
            }
        }
        replica.child = Some(child);
        replica.log = Some(Leading::new(log_path));
    }

    /// Kills replica `i` with SIGKILL; returns its pid.
    pub fn kill(&mut self, i: usize) -> u32 {
        let mut child = self.replicas[i].child.take().expect("a running replica");
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        reaper::ended(pid);
        pid
    }

    /// SIGTERM to replica `i`, then SIGKILL if it is still there after [`STOP_WITHIN`]; says
    /// how it ended.
    pub fn terminate(&mut self, i: usize) -> String {
        let mut child = self.replicas[i].child.take().expect("a running replica");
        let pid = child.id();
        crate::controlplane_load::process::signal(pid, libc::SIGTERM);
        let sent = Instant::now();
        let how = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break format!(
                    "exited {:.1} s after SIGTERM ({status})",
                    sent.elapsed().as_secs_f64()
                );
            }
            if sent.elapsed() > STOP_WITHIN {
                let _ = child.kill();
                let _ = child.wait();
                break format!("still running {STOP_WITHIN:?} after SIGTERM: killed");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        reaper::ended(pid);
        how
    }

    /// The lines of every log of every replica (all its starts) that contain `needle`, each
    /// with the log's name.
    pub fn grep(&self, needle: &str) -> Vec<String> {
        let mut found = Vec::new();
        for (i, replica) in self.replicas.iter().enumerate() {
            for start in 0..replica.starts {
                let name = format!("r{i}-{start}.log");
                let text = std::fs::read_to_string(self.dir.join(&name)).unwrap_or_default();
                found.extend(
                    text.lines()
                        .filter(|line| line.contains(needle))
                        .map(|line| format!("{name}: {line}")),
                );
            }
        }
        found
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for replica in &mut self.replicas {
            if let Some(mut child) = replica.child.take() {
                let _ = child.kill();
                let _ = child.wait();
                reaper::ended(child.id());
            }
        }
        reaper::kill_nodes(&self.nodes_dir);
    }
}

/// What one replica's process logged about leading, read as the log grows.
struct Leading {
    path: PathBuf,
    /// How far the log was read.
    offset: u64,
    /// The end of the last read that was not a whole line yet.
    partial: Vec<u8>,
    /// `: leading` lines so far, and `no longer leading` ones.
    took: usize,
    lost: usize,
}

impl Leading {
    fn new(path: PathBuf) -> Leading {
        Leading {
            path,
            offset: 0,
            partial: Vec::new(),
            took: 0,
            lost: 0,
        }
    }

    /// Whether the log says it leads now.
    fn leads(&mut self) -> bool {
        if let Ok(mut file) = std::fs::File::open(&self.path) {
            let mut fresh = Vec::new();
            if file.seek(SeekFrom::Start(self.offset)).is_ok() {
                let _ = file.read_to_end(&mut fresh);
            }
            self.offset += fresh.len() as u64;
            self.partial.extend_from_slice(&fresh);
            let whole: Vec<u8> = match self.partial.iter().rposition(|byte| *byte == b'\n') {
                Some(end) => self.partial.drain(..=end).collect(),
                None => Vec::new(),
            };
            for line in String::from_utf8_lossy(&whole).lines() {
                if line.contains("no longer leading") {
                    self.lost += 1;
                } else if line.contains(": leading") {
                    self.took += 1;
                }
            }
        }
        self.took > self.lost
    }
}

/// Every line of `stdout`, from a thread that reads it to its end (a pipe nobody reads would
/// stop the replica once full).
fn forward_lines(stdout: std::process::ChildStdout) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = send.send(line);
        }
    });
    receive
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
