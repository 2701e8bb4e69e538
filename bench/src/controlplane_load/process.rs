//! The control plane under test: the real binary in a fresh directory with the config the
//! end-to-end harness writes (`start_at` in tests/src/lib.rs) plus a DNS server, its
//! addresses read from the `dns on ADDR` and `listening on ADDR` lines of its stdout. Its
//! local nodes outlive it by design (fleet/local.rs: the next control plane adopts them), so
//! stopping it also kills the nodes its pid files name; so does a panic of the bench (a panic
//! aborts: no destructor runs).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{mpsc, Mutex, Once};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// The operator's token in the config.
pub const TOKEN: &str = "operator-token-for-the-load-test";

/// The zone the DNS server answers: `q.CLUSTER.DOMAIN` with the cluster of the config below
/// and the default domain (config.rs).
pub const ZONE: &str = "q.test.thequeueexpert.com";

/// Its stderr, in its directory.
const LOG: &str = "controlplane.log";

/// How long the control plane may take to print its addresses.
const START_WITHIN: Duration = Duration::from_secs(30);

/// How long it has to exit after SIGTERM (it finishes the requests under way) before SIGKILL.
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// The control plane that runs now (its pid and data directory), for the panic hook.
static RUNNING: Mutex<Option<(u32, PathBuf)>> = Mutex::new(None);

pub struct ControlPlane {
    child: Child,
    /// The operator API.
    pub api: SocketAddr,
    /// Its DNS server (UDP and TCP).
    pub dns: SocketAddr,
    /// Its config, log, state and its nodes' data; removed on drop unless kept.
    dir: TempDir,
}

/// How the control plane ended.
pub struct Stopped {
    /// What happened to it: exited on SIGTERM (how soon), killed, or already gone.
    pub how: String,
    /// Nodes still running after it ended, which were killed.
    pub nodes_left: usize,
}

/// The control plane's resident memory and CPU time at one moment.
#[derive(Clone, Copy)]
pub struct Usage {
    /// VmRSS, in bytes.
    pub rss: u64,
    /// VmHWM (the peak of VmRSS so far), in bytes.
    pub peak_rss: u64,
    /// utime + stime.
    pub cpu: Duration,
}

impl ControlPlane {
    /// Starts `binary` in a new directory under `root`, its nodes running `dataplane`; `keep`
    /// leaves the directory (the logs) after the run.
    pub fn start(binary: &Path, dataplane: &Path, root: &Path, keep: bool) -> ControlPlane {
        // Absolute: the nodes' command lines name their bootstraps by absolute paths, and
        // their end is found by them.
        let root = std::fs::canonicalize(root).expect("the data root");
        let dir = tempfile::Builder::new()
            .prefix("controlplane-load.")
            .disable_cleanup(keep)
            .tempdir_in(root)
            .expect("a directory for the control plane");
        let config_path = dir.path().join("controlplane.toml");
        std::fs::write(&config_path, config(&dir.path().join("data"), dataplane)).unwrap();
        let log = std::fs::File::create(dir.path().join(LOG)).unwrap();
        kill_on_panic();
        let mut child = Command::new(binary)
            .args(["serve", "--config"])
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        *RUNNING.lock().unwrap() = Some((child.id(), dir.path().join("data")));
        let lines = forward_lines(child.stdout.take().expect("piped"));
        let (dns, api) = addresses(&lines, &dir);
        ControlPlane {
            child,
            api,
            dns,
            dir,
        }
    }

    /// Its directory: config, `controlplane.log`, state, and `data/nodes/ID/node.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its memory and CPU time now; None once it has exited.
    pub fn usage(&mut self) -> Option<Usage> {
        if self.exited().is_some() {
            return None;
        }
        usage_of(self.child.id())
    }

    /// How it exited, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The end of its log (stderr), for a report of what went wrong.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join(LOG));
        let log = log.unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERM, then SIGKILL if it is still there after [`STOP_WITHIN`]; then kills the nodes
    /// it left running.
    pub fn stop(&mut self) -> Stopped {
        let how = match self.exited() {
            Some(status) => format!("had already exited ({status})"),
            None => self.terminate(),
        };
        *RUNNING.lock().unwrap() = None;
        let nodes_left = kill_nodes(&self.dir.path().join("data"));
        Stopped { how, nodes_left }
    }

    fn terminate(&mut self) -> String {
        signal(self.child.id(), libc::SIGTERM);
        let sent = Instant::now();
        while sent.elapsed() < STOP_WITHIN {
            if let Some(status) = self.exited() {
                return format!("exited {:.1} s after SIGTERM ({status})", seconds(sent));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        format!("still running {STOP_WITHIN:?} after SIGTERM: killed")
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        *RUNNING.lock().unwrap() = None;
        kill_nodes(&self.dir.path().join("data"));
    }
}

/// The harness's config (a loopback API on a port of the kernel's choice, cluster `test`,
/// local nodes running `dataplane`) with a DNS server on loopback.
fn config(data_dir: &Path, dataplane: &Path) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = {data_dir:?}\ntoken = \"{TOKEN}\"\n\
         cluster = \"test\"\ndataplane = {dataplane:?}\ndns_listen = \"127.0.0.1:0\"\n"
    )
}

/// Every line of `stdout`, from a thread that reads it to its end (a pipe nobody reads would
/// stop the control plane once full).
fn forward_lines(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = send.send(line);
        }
    });
    receive
}

/// The DNS server's and the API's addresses, from the lines the control plane prints (DNS
/// first, then `listening on`, once it serves).
fn addresses(lines: &mpsc::Receiver<String>, dir: &TempDir) -> (SocketAddr, SocketAddr) {
    let log = || std::fs::read_to_string(dir.path().join(LOG)).unwrap_or_default();
    let started = Instant::now();
    let mut dns = None;
    loop {
        let left = START_WITHIN.saturating_sub(started.elapsed());
        let line = match lines.recv_timeout(left) {
            Ok(line) => line,
            Err(_) => panic!("the control plane printed no `listening on`:\n{}", log()),
        };
        if let Some(addr) = line.trim().strip_prefix("dns on ") {
            dns = Some(addr.parse().expect("an address after `dns on`"));
        }
        if let Some(addr) = line.trim().strip_prefix("listening on ") {
            let api = addr.parse().expect("an address after `listening on`");
            let dns = dns.unwrap_or_else(|| panic!("no `dns on` before it serves:\n{}", log()));
            return (dns, api);
        }
    }
}

/// Memory and CPU time of process `pid` from /proc, or None if it is gone.
fn usage_of(pid: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|line| line.starts_with(key))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a system setting.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Usage {
        rss: kib("VmRSS:")?,
        peak_rss: kib("VmHWM:")?,
        cpu: Duration::from_micros(ticks * 1_000_000 / per_second),
    })
}

/// Kills every process started from a bootstrap under `data_dir/nodes/` (found by its
/// command line: a node the control plane spawned but had not yet written a pid file for
/// counts too); returns how many there were.
pub(crate) fn kill_nodes(data_dir: &Path) -> usize {
    let nodes = data_dir.join("nodes");
    let running = nodes_running_under(&nodes);
    for &pid in &running {
        signal(pid, libc::SIGKILL);
    }
    running.len()
}

/// The processes with an argument `NODES/ID/bootstrap.toml`.
fn nodes_running_under(nodes: &Path) -> Vec<u32> {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let names_a_bootstrap = |arg: &[u8]| {
        let arg = Path::new(std::ffi::OsStr::from_bytes(arg));
        arg.starts_with(nodes) && arg.ends_with("bootstrap.toml")
    };
    processes
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.split(|byte| *byte == 0).any(names_a_bootstrap)
        })
        .collect()
}

/// Installs (once) a panic hook that kills the running control plane and its nodes after the
/// panic's message.
fn kill_on_panic() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |panic| {
            report(panic);
            let running = RUNNING
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some((pid, data_dir)) = running.as_ref() {
                signal(*pid, libc::SIGKILL);
                kill_nodes(data_dir);
            }
        }));
    });
}

pub(crate) fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: a plain kill(2) of a process this bench started, or a node of it.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

fn seconds(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}
