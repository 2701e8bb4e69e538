//! A peer's server process: started pinned to the server core on loopback, with its own
//! directory, polled until it answers, measured from /proc, and killed with everything it
//! started when dropped, or when the bench panics (a panic aborts: no destructor runs, and a
//! failed check must not leave a server busy on the core others measure on).

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a server may take to answer after its start (RabbitMQ boots in seconds).
const START_TIME: Duration = Duration::from_secs(60);

/// How often a starting server's port is tried.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The processes spawned for servers that are running: what the panic hook kills, with their
/// descendants.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

pub struct Server {
    /// What was spawned: `taskset`, which execs the server (or its start script).
    child: Child,
    /// The process whose CPU time and memory are the server's (for RabbitMQ the Erlang VM,
    /// a grandchild of the start script).
    measured: u32,
    /// Processes the server needs beside it (RabbitMQ's epmd), killed with it.
    helpers: Vec<Child>,
    /// Where the server keeps its data, config and log.
    dir: TempDir,
    /// The loopback port clients connect to.
    pub port: u16,
}

/// How to ask a server on its port whether it serves yet: bytes to send, and what the
/// first bytes of its answer must be.
pub struct Probe {
    pub send: &'static [u8],
    pub expect: &'static [u8],
}

impl Server {
    /// Spawns `command` (already pinned: see `pinned`), then polls `port` with `probe` until
    /// the server answers.
    pub async fn start(
        mut command: Command,
        dir: TempDir,
        port: u16,
        probe: Probe,
        helpers: Vec<Child>,
    ) -> Server {
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        kill_running_servers_on_panic();
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the server (is it installed? scripts/bench-peers installs it)");
        let spawned = std::iter::once(&child).chain(&helpers);
        RUNNING.lock().unwrap().extend(spawned.map(Child::id));
        let mut server = Server {
            measured: child.id(),
            child,
            helpers,
            dir,
            port,
        };
        server.wait_until_serving(&probe).await;
        server
    }

    async fn wait_until_serving(&mut self, probe: &Probe) {
        let started = Instant::now();
        while !answers(self.port, probe).await {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the server exited ({status}):\n{}", self.log());
            }
            assert!(
                started.elapsed() < START_TIME,
                "the server did not answer on port {} within {START_TIME:?}:\n{}",
                self.port,
                self.log()
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Measures the spawned process' first descendant named `name` instead.
    pub fn measure_descendant(&mut self, name: &str) {
        let descendant = descendants(self.child.id())
            .into_iter()
            .find(|(_, command)| command == name);
        self.measured = match descendant {
            Some((pid, _)) => pid,
            None => panic!("no process {name} under the server:\n{}", self.log()),
        };
    }

    /// User plus system CPU time the server has used.
    pub fn cpu_time(&self) -> Duration {
        crate::node::cpu_time(self.measured)
    }

    /// The server's peak resident memory, in bytes.
    pub fn peak_rss(&self) -> u64 {
        crate::node::memory(self.measured).0
    }

    /// The server's own output, for a failure's message.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let mut spawned = vec![&mut self.child];
        spawned.extend(&mut self.helpers);
        for child in spawned {
            kill_with_descendants(child.id());
            let _ = child.wait();
            RUNNING.lock().unwrap().retain(|&pid| pid != child.id());
        }
    }
}

/// Installs (once) a panic hook that kills every running server after the panic's message.
fn kill_running_servers_on_panic() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |panic| {
            report(panic);
            // A panic while the list is held leaves it poisoned: its pids are still there.
            let running = RUNNING
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            running.iter().for_each(|&pid| kill_with_descendants(pid));
        }));
    });
}

/// SIGKILL to `root` and all its descendants (a start script's VM does not die with it).
fn kill_with_descendants(root: u32) {
    let family = descendants(root).into_iter().map(|(pid, _)| pid);
    for pid in family.chain([root]) {
        // SAFETY: a plain kill(2) of a process this bench started or one of its children.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

/// `program` under `taskset -c cpu`, so the server and all its threads stay on that core.
pub fn pinned(cpu: usize, program: &str) -> Command {
    let mut command = Command::new("taskset");
    command.args(["-c", &cpu.to_string(), program]);
    command
}

/// A loopback port nothing listens on now (the kernel's pick; free until someone takes it).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    listener.local_addr().unwrap().port()
}

/// Whether something on `port` answers `probe` as expected, within a second.
async fn answers(port: u16, probe: &Probe) -> bool {
    let exchange = async {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await.ok()?;
        stream.write_all(probe.send).await.ok()?;
        let mut answer = vec![0u8; probe.expect.len()];
        stream.read_exact(&mut answer).await.ok()?;
        Some(answer == probe.expect)
    };
    let answer = tokio::time::timeout(Duration::from_secs(1), exchange).await;
    matches!(answer, Ok(Some(true)))
}

/// Polls until something listens on `port` (for helpers that speak no greeting).
pub async fn wait_for_listener(port: u16) {
    let started = Instant::now();
    while TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .is_err()
    {
        assert!(started.elapsed() < START_TIME, "nothing listens on {port}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The descendants of `root` (pid and command name), parents before their children.
fn descendants(root: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let processes: Vec<(u32, u32, String)> = entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (name) state ppid ...": the name may hold spaces, so split at the parentheses.
            let (head, rest) = stat.rsplit_once(") ")?;
            let command = head.split_once(" (")?.1.to_string();
            let parent = rest.split(' ').nth(1)?.parse().ok()?;
            Some((pid, parent, command))
        })
        .collect();
    let mut family: Vec<(u32, String)> = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for (pid, _, command) in processes.iter().filter(|(_, p, _)| *p == parent) {
            family.push((*pid, command.clone()));
            parents.push(*pid);
        }
    }
    family
}
