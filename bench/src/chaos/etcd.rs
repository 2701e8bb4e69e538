//! The shared state: a three-member etcd cluster on loopback (Debian's `etcd-server`, 3.4),
//! one process per member with its own data directory, ports and log. Adapted from the
//! end-to-end tests' cluster (tests/src/etcd.rs), with etcd's default timings (a heartbeat
//! every 100 ms, an election after 1 s without one), as docs/deploy.md §13.2 runs it.
//!
//! Members start one after another: a new member first asks each peer whether it was
//! bootstrapped already, and a peer whose port is bound but not serving yet holds that
//! question for a second, where a port nobody has bound refuses it at once.

use super::reaper;
pub use qe_tests::etcd::free_ports;
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The longest the cluster (or a restarted member) gets to come up.
const START_WITHIN: Duration = Duration::from_secs(30);

/// How long one request to a member may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// How many lines of a member's log a failure prints.
const LOG_TAIL: usize = 40;

pub struct EtcdCluster {
    /// The `etcd` binary.
    binary: String,
    /// Each member's data directory (`m0/`, …) and log (`m0.log`, …).
    dir: PathBuf,
    /// `--initial-cluster-token`, unique per run, so members of two clusters that reach each
    /// other (a port reused) refuse each other.
    token: String,
    members: Vec<Member>,
}

/// One member: its name and ports stay across restarts, as its data directory does.
struct Member {
    /// `m0`, `m1`, …: its `--name`, the name of its data directory and of its log.
    name: String,
    /// Where it serves clients: gRPC, the HTTP gateway (`/v3/…`) and `/health`.
    client_port: u16,
    /// Where it serves its peers (raft).
    peer_port: u16,
    /// The process; `None` once killed.
    child: Option<Child>,
}

impl EtcdCluster {
    /// Starts `members` members in `dir` and returns once every one reports healthy.
    pub fn start(binary: &str, dir: &Path, members: usize) -> EtcdCluster {
        let ports = free_ports(2 * members);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let mut cluster = EtcdCluster {
            binary: binary.to_string(),
            dir: dir.to_path_buf(),
            token: format!("qe-chaos-{}-{nanos}", std::process::id()),
            members: (0..members)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: ports[2 * i],
                    peer_port: ports[2 * i + 1],
                    child: None,
                })
                .collect(),
        };
        let deadline = Instant::now() + START_WITHIN;
        for i in 0..members {
            cluster.spawn(i, "new");
            cluster.wait_serving_peers(i, deadline);
        }
        for i in 0..members {
            cluster.wait_healthy(i, deadline);
        }
        cluster
    }

    /// Each member's client URL (`http://127.0.0.1:PORT`), in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|member| format!("http://127.0.0.1:{}", member.client_port))
            .collect()
    }

    pub fn name(&self, i: usize) -> &str {
        &self.members[i].name
    }

    /// Kills member `i` with SIGKILL and waits for it to be gone.
    pub fn kill(&mut self, i: usize) {
        let mut child = self.members[i].child.take().expect("a running member");
        let _ = child.kill();
        let _ = child.wait();
        reaper::ended(child.id());
    }

    /// Starts member `i` again on its data directory and ports; returns once it reports
    /// healthy (it has a leader and answers reads).
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "m{i} is running");
        let mut log = self.open_log(i);
        writeln!(log, "--- started again ---").expect("etcd's log");
        self.spawn(i, "existing");
        let deadline = Instant::now() + START_WITHIN;
        self.wait_serving_peers(i, deadline);
        self.wait_healthy(i, deadline);
    }

    /// The member that says it leads (of two that say so, the one of the later term);
    /// `None` when no running member does.
    pub fn leader(&self) -> Option<usize> {
        let mut leader: Option<(u64, usize)> = None;
        for (i, member) in self.members.iter().enumerate() {
            if member.child.is_none() {
                continue;
            }
            let Ok((200, status)) =
                call(member.client_port, "POST", "/v3/maintenance/status", "{}")
            else {
                continue;
            };
            // Ids are uint64s, which the gateway writes as strings; a member that knows no
            // leader leaves `leader` out.
            let own = status["header"]["member_id"].as_str();
            if own.is_none() || status["leader"].as_str() != own {
                continue;
            }
            let term = status["raftTerm"]
                .as_str()
                .and_then(|term| term.parse().ok())
                .unwrap_or(0);
            if leader.is_none_or(|(newest, _)| term > newest) {
                leader = Some((term, i));
            }
        }
        leader.map(|(_, i)| i)
    }

    /// Starts member `i`'s process, with `--initial-cluster-state` `state` (etcd reads it only
    /// while its data directory is empty).
    fn spawn(&mut self, i: usize, state: &str) {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let log = self.open_log(i);
        let member = &self.members[i];
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(self.dir.join(&member.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            // 3.4's default logger (capnslog) ignores --log-level.
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd's log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot start {} ({err}): install etcd-server (scripts/test does)",
                    self.binary
                )
            });
        reaper::started(child.id());
        self.members[i].child = Some(child);
    }

    /// Waits until member `i` serves its peers.
    fn wait_serving_peers(&mut self, i: usize, deadline: Instant) {
        let port = self.members[i].peer_port;
        loop {
            self.check_running(i);
            if let Ok((200, _)) = call(port, "GET", "/version", "") {
                return;
            }
            self.check_deadline(i, deadline, "serve its peers");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until member `i` says `{"health":"true"}`.
    fn wait_healthy(&mut self, i: usize, deadline: Instant) {
        let port = self.members[i].client_port;
        loop {
            self.check_running(i);
            if let Ok((200, health)) = call(port, "GET", "/health", "") {
                if health["health"] == "true" {
                    return;
                }
            }
            self.check_deadline(i, deadline, "report healthy");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn check_running(&mut self, i: usize) {
        let child = self.members[i].child.as_mut().expect("a started member");
        if let Some(status) = child.try_wait().expect("etcd's status") {
            panic!(
                "etcd's m{i} exited ({status}); its log ends:\n{}",
                self.log_tail(i)
            );
        }
    }

    fn check_deadline(&self, i: usize, deadline: Instant, what: &str) {
        if Instant::now() > deadline {
            panic!(
                "etcd's m{i} did not {what} within {START_WITHIN:?}; its log ends:\n{}",
                self.log_tail(i)
            );
        }
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.log", self.members[i].name))
    }

    /// Member `i`'s log, to append to: a restart keeps what was logged before it.
    fn open_log(&self, i: usize) -> File {
        std::fs::create_dir_all(&self.dir).expect("etcd's directory");
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("etcd's log")
    }

    fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
                reaper::ended(child.id());
            }
        }
    }
}

/// One HTTP/1.0 request to an etcd member on `127.0.0.1:port`, all of it within
/// [`REQUEST_TIMEOUT`] (the tests' client, `qe_tests::etcd::call`).
fn call(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, Value), String> {
    qe_tests::etcd::call(port, method, path, body, REQUEST_TIMEOUT)
}
