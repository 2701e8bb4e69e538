//! The end-to-end harness: starts the real `dataplane` binary and talks to it over real
//! sockets.
//!
//! - [`Node`] starts a node on `127.0.0.1:0` with a fresh data directory, reads its address
//!   from the `listening on ADDR` line, and kills it when dropped (printing its log if the test
//!   failed).
//! - [`Client`] is a WebSocket client (tokio-tungstenite) that tells a close frame's code from
//!   a connection that ended with none.
//! - [`python`] finds the Python that has the `websockets` package, for the interop tests.
//! - [`raw`] is a WebSocket client written out byte by byte, for what [`Client`] will not do.
//! - [`disks`] makes file systems that fail on purpose: syncs that fail, a full disk, one that
//!   goes read-only.
//! - [`ControlPlane`] starts the `controlplane` binary likewise; [`http`] and its kin speak
//!   HTTP/1.1 to it by hand (`control_plane.rs`).
//! - [`moto`] runs EC2's emulator and builds the network a region needs; [`instance`] boots
//!   what a queue's instance was given, in a network namespace.
//! - [`knot`] runs Knot DNS as a secondary of the control plane's zone.

pub mod cloud;
mod control_plane;
pub mod disks;
pub mod etcd;
pub mod gate;
pub mod instance;
pub mod knot;
pub mod moto;
pub mod raw;
pub mod sqs;
pub mod standby;

pub use control_plane::*;

/// A throwaway CA with a name of its own (with rcgen's default name on both, OpenSSL takes a
/// leaf whose subject equals its issuer for a self-signed certificate).
pub fn test_ca(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
}

/// The certificates in a PEM text, as roots to trust; there must be some.
pub fn roots_from_pem(pem: &str) -> rustls::RootCertStore {
    let roots = qe_tls::roots_from_pem(pem);
    assert!(!roots.is_empty(), "a PEM certificate");
    roots
}

/// What `dig` (BIND's resolver client, Debian's `dnsutils`) was told.
#[derive(Debug, PartialEq)]
pub struct Dig {
    /// The response code: `NOERROR`, `NXDOMAIN`, ...
    pub status: String,
    /// Whether the answer came with the authoritative flag.
    pub authoritative: bool,
    /// The answers' data, as dig prints them (`::1`, `127.0.0.1`, a SOA's fields ...).
    pub answers: Vec<String>,
    /// Each answer's TTL, in seconds.
    pub ttls: Vec<u32>,
}

impl Dig {
    /// The serial of an SOA answer (its third field), if this is one.
    pub fn soa_serial(&self) -> Option<u32> {
        let soa = self.answers.first().filter(|_| self.status == "NOERROR")?;
        soa.split_whitespace().nth(2)?.parse().ok()
    }
}

/// Asks the DNS server at `server` for `name`'s `kind` records with `dig`, over UDP or TCP.
pub fn dig(server: SocketAddr, name: &str, kind: &str, tcp: bool) -> Dig {
    let output = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), name, kind])
        .args([
            "+noall",
            "+comments",
            "+answer",
            "+time=5",
            "+tries=1",
            "+norecurse",
        ])
        .arg(if tcp { "+tcp" } else { "+notcp" })
        .output()
        .expect("dig (apt-get install dnsutils; ./scripts/test does)");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "dig failed:\n{text}");
    let status = text
        .split("status: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no status from dig:\n{text}"))
        .to_string();
    let flags = text.split(";; flags: ").nth(1).unwrap_or("");
    let flags = flags.split(';').next().unwrap_or("");
    // NAME TTL CLASS TYPE DATA...
    let records: Vec<Vec<&str>> = text
        .lines()
        .filter(|line| !line.starts_with(';') && !line.trim().is_empty())
        .map(|line| line.split_whitespace().collect())
        .collect();
    Dig {
        status,
        authoritative: flags.split_whitespace().any(|flag| flag == "aa"),
        answers: records.iter().map(|fields| fields[4..].join(" ")).collect(),
        ttls: records
            .iter()
            .map(|fields| fields[1].parse().expect("a TTL"))
            .collect(),
    }
}

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The logins every test node gets.
pub const PUBLISHER: (&str, &str) = ("PUBLISHER-NAME", "PUBLISHER-PASSWORD");
pub const SUBSCRIBER: (&str, &str) = ("SUBSCRIBER-NAME", "SUBSCRIBER-PASSWORD");
pub const ADMIN: (&str, &str) = ("ADMIN-NAME", "ADMIN-PASSWORD");

/// Marks where a restarted node's log begins.
const RESTARTED: &str = "--- restarted ---\n";

/// How long a test waits for any one thing the node should do at once.
pub const PROMPT: Duration = Duration::from_secs(10);

/// Lets this process, and the nodes it starts, open as many descriptors as its hard limit
/// allows; returns that many.
pub fn raise_descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    limit.rlim_cur
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The `dataplane` binary that `cargo build --workspace --bins` built beside this test binary
/// (the README's test command does that first), or `QE_DATAPLANE_BIN`.
pub fn dataplane_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("QE_DATAPLANE_BIN") {
        return path.into();
    }
    built_binary("dataplane")
}

/// The `controlplane` binary built beside this test binary.
pub fn controlplane_binary() -> PathBuf {
    built_binary("controlplane")
}

/// The `qe` command line built beside this test binary.
pub fn qe_binary() -> PathBuf {
    built_binary("qe")
}

/// The `bench` load generator built beside this test binary.
pub fn bench_binary() -> PathBuf {
    built_binary("bench")
}

/// `qe ARGS` with the config file at `config` and `stdin`: its exit code, stdout and stderr.
pub fn run_qe(config: &Path, args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(qe_binary())
        .args(args)
        .env("QE_CONFIG", config)
        .env_remove("QE_PROFILE")
        .env_remove("QE_TOKEN")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start qe");
    let mut input = child.stdin.take().expect("piped");
    input.write_all(stdin.as_bytes()).expect("qe reads stdin");
    drop(input);
    let output = child.wait_with_output().expect("qe exits");
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("qe prints UTF-8");
    (
        output.status.code().expect("qe exited"),
        text(output.stdout),
        text(output.stderr),
    )
}

/// `qe rollouts start BUILD --canary CANARY --wait`, a second between waves, each queue given
/// `wave_timeout_secs` to come back on the build.
pub fn rollout_start<'a>(
    build: &'a str,
    canary: &'a str,
    wave_timeout_secs: &'a str,
) -> [&'a str; 10] {
    [
        "rollouts",
        "start",
        build,
        "--canary",
        canary,
        "--pause-secs",
        "1",
        "--wave-timeout-secs",
        wave_timeout_secs,
        "--wait",
    ]
}

/// `qe --json ARGS` (config file `config`), which must exit with `code`: what it printed.
#[track_caller]
pub fn qe_json(config: &Path, code: i32, args: &[&str]) -> serde_json::Value {
    let mut with_json = vec!["--json"];
    with_json.extend_from_slice(args);
    let (exit, stdout, stderr) = run_qe(config, &with_json, "");
    assert_eq!(exit, code, "qe {}: {stdout}{stderr}", args.join(" "));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}{stderr}"))
}

/// A workspace binary, refused if it is older than any source it was built from (cargo lists
/// them in `NAME.d` beside it): `cargo test` does not build another package's binaries, so a
/// stale one would test old code.
fn built_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let binary = exe.parent().unwrap().parent().unwrap().join(name);
    let build = "run ./scripts/test, or `cargo build --workspace --bins`";
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified());
    let built =
        modified(&binary).unwrap_or_else(|_| panic!("{} is missing: {build}", binary.display()));
    let dep_info = std::fs::read_to_string(binary.with_extension("d"))
        .unwrap_or_else(|_| panic!("{}.d is missing: {build}", binary.display()));
    let (_, sources) = dep_info.split_once(": ").expect("TARGET: SOURCES");
    for source in sources.split_whitespace().map(Path::new) {
        // A source that is gone counts as changed.
        let changed = modified(source).unwrap_or(std::time::SystemTime::now());
        assert!(
            changed <= built,
            "{} is older than {}: {build}",
            binary.display(),
            source.display()
        );
    }
    binary
}

/// A running node; killed on drop.
pub struct Node {
    child: Child,
    pub addr: SocketAddr,
    /// Its data directory, removed on drop.
    pub data_dir: tempfile::TempDir,
    /// Everything it wrote to stderr.
    log: Arc<Log>,
    /// Its standby, in a run with `QE_TEST_STANDBY=1` ([`with_standbys`]).
    standby: Option<standby::Standby>,
}

/// Whether this run gives every plain node a standby (`QE_TEST_STANDBY=1`; `scripts/test` runs
/// the crash and conformance suites once more so): the node is started with
/// `--replication-key`, its standby beside it, and is handed to the test once the standby is
/// in sync, so that durability 2 is synced on both nodes in every test of the run.
pub fn with_standbys() -> bool {
    std::env::var("QE_TEST_STANDBY").is_ok_and(|v| v == "1")
}

/// The `RUST_LOG` the processes a test starts log at: `QE_TEST_RUST_LOG`, or `info`. (A
/// test binary that sets it sets it for all its tests.)
pub fn log_level() -> String {
    std::env::var("QE_TEST_RUST_LOG").unwrap_or_else(|_| "info".to_string())
}

/// A process's stderr, as it arrives.
#[derive(Default)]
pub struct Log {
    text: Mutex<String>,
    /// Signalled on every append, and once the process's stderr is closed.
    grew: Condvar,
    /// The process's stderr is closed: everything it said is in `text`.
    closed: std::sync::atomic::AtomicBool,
    /// While true, stderr is not read: its pipe fills, as when journald stalls.
    stalled: Mutex<bool>,
    /// Signalled when `stalled` turns false.
    resumed: Condvar,
}

impl Log {
    /// Stops reading the process's stderr until [`Log::resume`].
    pub fn stall(&self) {
        *self.stalled.lock().unwrap() = true;
    }

    pub fn resume(&self) {
        *self.stalled.lock().unwrap() = false;
        self.resumed.notify_all();
    }

    /// Collects everything `stderr` says, on a thread of its own.
    fn follow(mut stderr: impl Read + Send + 'static) -> Arc<Log> {
        let log = Arc::new(Log::default());
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            loop {
                let stalled = sink.stalled.lock().unwrap();
                drop(
                    sink.resumed
                        .wait_while(stalled, |stalled| *stalled)
                        .unwrap(),
                );
                let Ok(n @ 1..) = stderr.read(&mut buffer) else {
                    let _text = sink.lock();
                    sink.closed.store(true, std::sync::atomic::Ordering::SeqCst);
                    sink.grew.notify_all();
                    break;
                };
                let text = String::from_utf8_lossy(&buffer[..n]);
                sink.lock().push_str(&text);
                sink.grew.notify_all();
            }
        });
        log
    }

    /// Waits until `done` holds for the log, failing after `PROMPT`; returns the log.
    fn wait_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + PROMPT;
        let mut text = self.lock();
        loop {
            if done(&text) {
                return text.clone();
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                // Not while the lock is held: the node's Drop prints the log.
                let log = text.clone();
                drop(text);
                panic!("never logged {what}:\n{log}");
            }
            text = self.grew.wait_timeout(text, left).unwrap().0;
        }
    }

    /// The text; a test that failed while holding it leaves it readable.
    fn lock(&self) -> std::sync::MutexGuard<'_, String> {
        self.text
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The flags that give a node the test logins.
fn login_flags() -> [String; 6] {
    let login = |(name, password): (&str, &str)| format!("{name}:{password}");
    [
        "--publisher".into(),
        login(PUBLISHER),
        "--subscriber".into(),
        login(SUBSCRIBER),
        "--admin".into(),
        login(ADMIN),
    ]
}

/// Waits up to `within` for `child` to exit: its exit code (None: ended by a signal). Kills it
/// and fails if it has not.
fn exit_within(child: &mut Child, within: Duration) -> Option<i32> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code();
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the process did not exit within {within:?}");
        }
        // A child's exit has no event a test can await short of blocking in wait(2).
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Node {
    /// A standard-tier node with the test logins.
    pub fn start() -> Node {
        Node::start_with(&[])
    }

    /// A node with extra flags.
    pub fn start_with(extra: &[&str]) -> Node {
        Node::start_in(tempfile::tempdir().unwrap(), extra)
    }

    /// Kills the node with SIGKILL (no chance to flush anything), and waits for it to go.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Waits for the node to exit on its own (within `PROMPT`); its exit code (None: ended
    /// by a signal).
    pub fn wait_for_exit(&mut self) -> Option<i32> {
        exit_within(&mut self.child, PROMPT)
    }

    /// Starts a node on `data_dir` with `extra` flags that is to refuse to start: its exit
    /// code (None: ended by a signal) and its stderr. Fails if it listens instead.
    pub fn refused_start(data_dir: &Path, extra: &[&str]) -> (Option<i32>, String) {
        let mut child = Command::new(dataplane_binary())
            .args(["--listen", "127.0.0.1:0", "--plaintext"])
            .arg("--data-dir")
            .arg(data_dir)
            .args(login_flags())
            .args(extra)
            .env("RUST_LOG", log_level())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dataplane");
        let log = Log::follow(child.stderr.take().unwrap());
        let code = exit_within(&mut child, PROMPT);
        // Everything it said before it exited, not what the reading thread had by then.
        let closed = |_: &str| log.closed.load(std::sync::atomic::Ordering::SeqCst);
        let text = match code {
            Some(_) => log.wait_until("its stderr to close", closed),
            None => log.lock().clone(),
        };
        (code, text)
    }

    /// Kills the node and starts a new one on the same data directory with `extra` flags.
    /// (With a standby: on the same address, which the standby follows, and handed over once
    /// the standby is in sync with it again.)
    pub fn restart(mut self, extra: &[&str]) -> Node {
        self.kill();
        let log = self.log();
        // Move the directory out; the old node's Drop then only reaps a dead child.
        let data_dir = std::mem::replace(&mut self.data_dir, tempfile::tempdir().unwrap());
        let standby = self.standby.take();
        let addr = self.addr.to_string();
        drop(self);
        let node = match standby {
            Some(standby) => {
                let mut same_address = extra.to_vec();
                if !extra.contains(&"--listen") {
                    same_address.extend(["--listen", &addr]);
                }
                Node::launch_with(data_dir, &same_address, None, Some(standby))
            }
            None => Node::start_in(data_dir, extra),
        };
        let mut text = node.log.lock();
        text.insert_str(0, &format!("{log}{RESTARTED}"));
        drop(text);
        node
    }

    /// Its stderr as the test reads it (and may stop reading it).
    pub fn stderr(&self) -> &Log {
        &self.log
    }

    /// What the node has written to its log so far.
    pub fn log(&self) -> String {
        self.log.lock().clone()
    }

    /// Waits until the log since the last restart contains `needle`; returns that part of it.
    pub fn wait_for_log(&self, needle: &str) -> String {
        let since_restart = |text: &str| {
            text.rsplit(RESTARTED)
                .next()
                .unwrap_or_default()
                .to_string()
        };
        let text = self.log.wait_until(&format!("{needle:?}"), |text| {
            since_restart(text).contains(needle)
        });
        since_restart(&text)
    }

    /// A node on an existing data directory.
    pub fn start_in(data_dir: tempfile::TempDir, extra: &[&str]) -> Node {
        Node::launch(data_dir, extra, None)
    }

    /// A node whose every thread runs on CPU `cpu` (`taskset`), as on a one-core machine:
    /// its runtime has one worker, and the log's threads take turns with it, so the kernel
    /// switches between them at every lock they share.
    pub fn start_on_cpu(cpu: usize) -> Node {
        Node::launch(tempfile::tempdir().unwrap(), &[], Some(cpu))
    }

    fn launch(data_dir: tempfile::TempDir, extra: &[&str], cpu: Option<usize>) -> Node {
        Node::launch_with(data_dir, extra, cpu, None)
    }

    /// [`Node::launch`], with the standby it keeps (a restart), if it has one.
    fn launch_with(
        data_dir: tempfile::TempDir,
        extra: &[&str],
        cpu: Option<usize>,
        standby: Option<standby::Standby>,
    ) -> Node {
        // A plain node, in a run with standbys, gets one (not a TLS one, nor one a test
        // gives its own replication or config).
        let replicated = with_standbys()
            && !["--tls-cert", "--replication-key", "--config", "--bootstrap"]
                .iter()
                .any(|flag| extra.contains(flag));
        let mut extra = extra.to_vec();
        if replicated {
            extra.extend(["--replication-key", standby::KEY]);
        }
        let mut node = Node::spawn(data_dir, &extra, cpu);
        if replicated {
            node.standby =
                Some(standby.unwrap_or_else(|| standby::Standby::start(&node, standby::KEY)));
            node.wait_for_log(standby::IN_SYNC);
        }
        node
    }

    fn spawn(data_dir: tempfile::TempDir, extra: &[&str], cpu: Option<usize>) -> Node {
        // Plain ws:// unless the test gives a certificate.
        let transport = match extra.contains(&"--tls-cert") {
            true => None,
            false => Some("--plaintext"),
        };
        let listen = match extra.contains(&"--listen") {
            true => None,
            false => Some(["--listen", "127.0.0.1:0"]),
        };
        let mut command = match cpu {
            Some(cpu) => {
                let mut taskset = Command::new("taskset");
                taskset
                    .args(["-c", &cpu.to_string()])
                    .arg(dataplane_binary());
                taskset
            }
            None => Command::new(dataplane_binary()),
        };
        let mut child = command
            .args(listen.into_iter().flatten())
            .arg("--data-dir")
            .arg(data_dir.path())
            .args(login_flags())
            .args(transport)
            .args(extra)
            .env("RUST_LOG", log_level())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dataplane");
        let log = Log::follow(child.stderr.take().unwrap());
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let addr = loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).unwrap() == 0 {
                let _ = child.wait();
                panic!("dataplane exited before listening:\n{}", log.lock());
            }
            if let Some(addr) = line.trim().strip_prefix("listening on ") {
                break addr.parse().expect("an address after `listening on`");
            }
        };
        // Keep reading stdout so the node never blocks on a full pipe.
        std::thread::spawn(move || for _ in stdout.lines() {});
        Node {
            child,
            addr,
            data_dir,
            log,
            standby: None,
        }
    }

    /// Its resident memory now, in bytes.
    pub fn resident_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    }

    pub fn url(&self) -> String {
        format!("ws://{}/", self.addr)
    }

    /// The address by name, for a node serving TLS with a certificate for `localhost`.
    pub fn tls_url(&self) -> String {
        format!("wss://localhost:{}/", self.addr.port())
    }

    /// Sends the node SIGHUP (it reloads its TLS certificate).
    pub fn hang_up(&self) {
        signal(self.child.id(), libc::SIGHUP);
    }

    /// Connects and logs in; panics unless the login succeeds.
    /// An administrator logged in with the test login.
    pub async fn admin(&self) -> Client {
        self.login("admin", "distribute", serde_json::json!({}))
            .await
            .0
    }

    pub async fn login(&self, role: &str, queue_type: &str, extra: Value) -> (Client, Value) {
        let mut client = Client::connect(self).await;
        let reply = client.request(login_request(role, queue_type, extra)).await;
        assert_eq!(reply["status"], "Success.", "login failed: {reply}");
        (client, reply)
    }

    /// Waits until the node has seen `session`'s connection drop; returns whether the session
    /// was saved.
    pub fn dropped(&self, session: &str) -> bool {
        let needle = format!("session={session}");
        let log = self.wait_for_log(&needle);
        let line = log.lines().find(|l| l.contains(&needle)).unwrap();
        line.contains("saved=true")
    }

    pub async fn publisher(&self) -> Client {
        self.login("publisher", "distribute", json!({})).await.0
    }

    /// A distribute subscriber with `capacity`, and its session id.
    /// The address its SQS face (`--sqs-listen`) serves on, from its log.
    pub fn sqs_addr(&self) -> SocketAddr {
        let line = self.wait_for_log("sqs: serving on ");
        let rest = line.split("sqs: serving on ").nth(1).unwrap();
        let addr = rest.split_whitespace().next().unwrap().trim_matches('"');
        addr.parse().unwrap()
    }

    pub async fn subscriber(&self, capacity: u64) -> (Client, String) {
        let (client, reply) = self
            .login("subscriber", "distribute", json!({ "capacity": capacity }))
            .await;
        (client, reply["sessionid"].as_str().unwrap().to_string())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- dataplane log ---\n{}", self.log());
        }
    }
}

/// Publishes what `next` gives for the n-th publish (its body and durability), one at a time,
/// until the connection breaks (the node killed); each answered one must be Success, and
/// counts in `acked`. Returns what was acknowledged.
pub async fn publish_until_cut(
    mut client: Client,
    acked: Arc<std::sync::atomic::AtomicUsize>,
    mut next: impl FnMut(usize) -> (String, u64),
) -> Vec<(String, u64)> {
    let mut acknowledged = Vec::new();
    for n in 0.. {
        let (body, durability) = next(n);
        let request = json!({"body": body, "durability": durability}).to_string();
        if client.socket().send(Message::text(request)).await.is_err() {
            break;
        }
        match client.socket().next().await {
            Some(Ok(Message::Text(reply))) => {
                let reply: Value = serde_json::from_str(&reply).unwrap();
                assert_eq!(reply["status"], "Success.", "{reply}");
                acknowledged.push((body, durability));
                acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            _ => break,
        }
    }
    acknowledged
}

/// The login for `role` with the test credentials, plus `extra` fields.
pub fn login_request(role: &str, queue_type: &str, extra: Value) -> Value {
    let (username, password) = match role {
        "publisher" => PUBLISHER,
        "subscriber" => SUBSCRIBER,
        _ => ADMIN,
    };
    let mut login = json!({
        "username": username, "password": password, "role": role, "queuetype": queue_type,
    });
    for (key, value) in extra.as_object().unwrap() {
        login[key] = value.clone();
    }
    login
}

/// How a connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// A close frame with this code.
    Closed(u16),
    /// The TCP connection ended with no close frame (clients report 1006).
    NoCloseFrame,
}

pub struct Client {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Client {
    pub async fn connect(node: &Node) -> Client {
        Client::try_connect(node).await.unwrap()
    }

    /// Connects to any node by its address.
    pub async fn connect_url(url: &str) -> Client {
        let (socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        Client { socket }
    }

    /// Over TLS to `url` (its name checked against `roots`), on a TCP connection to `addr`:
    /// the address a resolver gave for the name.
    pub async fn connect_tls_at(
        url: &str,
        addr: SocketAddr,
        roots: rustls::RootCertStore,
    ) -> Client {
        Client::try_connect_tls_at(url, addr, roots).await.unwrap()
    }

    /// As [`Client::connect_tls_at`], or why not (a node not listening yet).
    pub async fn try_connect_tls_at(
        url: &str,
        addr: SocketAddr,
        roots: rustls::RootCertStore,
    ) -> Result<Client, tungstenite::Error> {
        let tcp = TcpStream::connect(addr).await?;
        let connector = tokio_tungstenite::Connector::Rustls(qe_tls::client_config(roots));
        let (socket, _) =
            tokio_tungstenite::client_async_tls_with_config(url, tcp, None, Some(connector))
                .await?;
        Ok(Client { socket })
    }

    /// Connects from the loopback address `source` (the node counts connections that wait for
    /// their login by source).
    pub async fn connect_from(node: &Node, source: std::net::Ipv4Addr) -> Client {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        let tcp = socket.connect(node.addr).await.unwrap();
        let (socket, _) = tokio_tungstenite::client_async(node.url(), MaybeTlsStream::Plain(tcp))
            .await
            .unwrap();
        Client { socket }
    }

    pub async fn try_connect(node: &Node) -> Result<Client, tungstenite::Error> {
        let (socket, _) = tokio_tungstenite::connect_async(node.url()).await?;
        Ok(Client { socket })
    }

    pub async fn send_text(&mut self, text: &str) {
        self.socket.send(Message::text(text)).await.unwrap();
    }

    pub async fn send_binary(&mut self, bytes: &[u8]) {
        self.socket
            .send(Message::binary(bytes.to_vec()))
            .await
            .unwrap();
    }

    pub async fn send_json(&mut self, value: &Value) {
        self.send_text(&value.to_string()).await;
    }

    /// Sends a request and returns the next frame.
    pub async fn request(&mut self, value: Value) -> Value {
        self.send_json(&value).await;
        self.recv().await
    }

    /// The next frame, as JSON; panics if none comes promptly.
    pub async fn recv(&mut self) -> Value {
        match self.next_message(PROMPT).await {
            Some(Ok(Message::Text(text))) => serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("a frame that is not JSON: {text}: {e}")),
            other => panic!("expected a text frame, got {other:?}"),
        }
    }

    /// The next delivery's body and id, skipping the frames that are not deliveries (replies,
    /// notices).
    pub async fn next_delivery(&mut self) -> (String, Value) {
        loop {
            let frame = self.recv().await;
            if let Some(body) = frame["body"].as_str() {
                return (body.to_string(), frame["id"].clone());
            }
        }
    }

    /// Whether a frame arrives within `wait`; for checking that nothing was sent, use a wait
    /// after an event that would have come before it (see the tests).
    pub async fn recv_within(&mut self, wait: Duration) -> Option<Value> {
        match self.next_message(wait).await {
            None => None,
            Some(Ok(Message::Text(text))) => Some(serde_json::from_str(&text).unwrap()),
            other => panic!("expected a text frame or nothing, got {other:?}"),
        }
    }

    /// Waits for the connection to end, with no other frame before that.
    pub async fn ending(&mut self) -> Ending {
        self.ending_within(PROMPT).await
    }

    pub async fn ending_within(&mut self, wait: Duration) -> Ending {
        loop {
            match self.next_message(wait).await {
                None => panic!("the connection did not end"),
                Some(Ok(Message::Close(Some(frame)))) => return Ending::Closed(frame.code.into()),
                Some(Ok(Message::Close(None))) => return Ending::Closed(CloseCode::Status.into()),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(other)) => panic!("expected the end, got {other:?}"),
                Some(Err(
                    tungstenite::Error::ConnectionClosed
                    | tungstenite::Error::AlreadyClosed
                    | tungstenite::Error::Io(_)
                    | tungstenite::Error::Protocol(
                        tungstenite::error::ProtocolError::ResetWithoutClosingHandshake,
                    ),
                )) => return Ending::NoCloseFrame,
                Some(Err(other)) => panic!("unexpected error: {other}"),
            }
        }
    }

    /// The next frame that is not a ping or pong (the client library answers pings as it
    /// reads); `None` when `wait` passes; `Some(Err)` when the stream ended with no close frame.
    async fn next_message(
        &mut self,
        wait: Duration,
    ) -> Option<Result<Message, tungstenite::Error>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.socket.next()).await {
                Err(_) => return None,
                Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
                Ok(Some(result)) => return Some(result),
                Ok(None) => return Some(Err(tungstenite::Error::ConnectionClosed)),
            }
        }
    }

    /// The raw stream, for tests that need frames this client does not offer.
    pub fn socket(&mut self) -> &mut WebSocketStream<MaybeTlsStream<TcpStream>> {
        &mut self.socket
    }

    /// Sends `request` and asserts its reply is a success; the reply.
    pub async fn success(&mut self, request: Value) -> Value {
        let reply = self.request(request).await;
        assert_eq!(reply["status"], "Success.", "{reply}");
        reply
    }
}

/// The times (first column) of a history reply's CSV lines (`getstats`, `getusage`).
pub fn record_times(reply: &Value) -> Vec<u64> {
    reply["csv"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(',').next()?.parse().ok())
        .collect()
}

/// Asserts `reply` is a failure with `code` and the manual's reason.
pub fn assert_failure(reply: &Value, code: u16) {
    assert_eq!(reply["status"], "Failure.", "{reply}");
    assert_eq!(reply["code"], code, "{reply}");
    assert!(
        reply["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{reply}"
    );
}

/// The Python with the `websockets` package: `QE_PYTHON`, else the repo's `.venv`.
pub fn python() -> PathBuf {
    let python = std::env::var_os("QE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"));
    assert!(
        python.exists(),
        "{} is missing: the README's test command installs it",
        python.display()
    );
    python
}

/// The address in the manual's programs.
pub const MANUAL_ADDRESS: &str = "wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/";

/// The manual's Node.js program `name` (tests/interop/manual), pointed at `address`, with
/// `replace` applied, written to a folder of `node`'s from which Node finds the `ws` package.
pub fn node_program(node: &Node, name: &str, address: &str, replace: &[(&str, &str)]) -> PathBuf {
    let dir = node.data_dir.path().join("node");
    std::fs::create_dir_all(&dir).unwrap();
    let modules = workspace().join("tests/interop/node/node_modules");
    assert!(
        modules.join("ws").exists(),
        "the README's test command installs the ws package"
    );
    let _ = std::os::unix::fs::symlink(&modules, dir.join("node_modules"));
    let program = workspace().join("tests/interop/manual").join(name);
    let mut text = std::fs::read_to_string(program).unwrap();
    assert!(text.contains(MANUAL_ADDRESS));
    text = text.replace(MANUAL_ADDRESS, address);
    for (from, to) in replace {
        text = text.replace(from, to);
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs a Node.js program that ends by itself, with `args` and `env` added; returns its stdout.
pub async fn run_node(script: &Path, args: &[String], env: &[(&str, &Path)]) -> String {
    run_to_end(Path::new("node"), script, args, env).await
}

/// Runs a Python program (with the `websockets` package) that ends by itself; returns its
/// stdout.
pub async fn run_python(script: &Path, args: &[String]) -> String {
    run_to_end(&python(), script, args, &[]).await
}

/// Runs `interpreter SCRIPT ARGS` with `env` (a client of another language against a real
/// server, say) for at most `within`; its stdout, also printed, or a panic with its stdout,
/// stderr and `log` (the server's).
pub async fn run_checked(
    interpreter: &Path,
    script: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    within: Duration,
    log: &str,
) -> String {
    let mut command = tokio::process::Command::new(interpreter);
    command.arg(script).args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(within, command.output())
        .await
        .expect("the script finishes")
        .expect("the interpreter runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    print!("{stdout}");
    assert!(
        output.status.success(),
        "{} {args:?} failed:\n{stdout}\n{stderr}\n--- log ---\n{log}",
        script.display(),
    );
    stdout
}

async fn run_to_end(
    interpreter: &Path,
    script: &Path,
    args: &[String],
    env: &[(&str, &Path)],
) -> String {
    let mut command = tokio::process::Command::new(interpreter);
    command.arg(script).args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(PROMPT * 6, command.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// A program that runs until dropped (then it is killed), read a line at a time.
pub struct Running {
    _child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Running {
    pub fn start(interpreter: &Path, script: &Path) -> Running {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(interpreter)
            .arg(script)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Running {
            _child: child,
            lines,
        }
    }

    /// The next line it prints; panics if none comes promptly.
    pub async fn next_line(&mut self) -> Option<String> {
        tokio::time::timeout(PROMPT, self.lines.next_line())
            .await
            .unwrap()
            .unwrap()
    }
}

/// The cases an interop script printed, one JSON object a line with a `case` name; the
/// returned function finds one by name.
pub fn cases(output: &str) -> impl Fn(&str) -> Value {
    let cases: Vec<Value> = output
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    move |name| {
        let found = cases.iter().find(|c| c["case"] == name);
        found
            .unwrap_or_else(|| panic!("no case {name} in {cases:?}"))
            .clone()
    }
}

/// A running control plane (`controlplane serve`) with local nodes; killed on drop (its nodes
/// with it).
/// Sends `pid` the signal `signal`; panics if it cannot.
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill takes a pid and a signal.
    let sent = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(sent, 0, "signal {signal} to {pid}");
}

/// The process whose command line has `path` as an argument, found through /proc.
pub fn process_naming(path: &Path) -> Option<u32> {
    let wanted = path.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.split(|b| *b == 0).any(|arg| arg == wanted)
        })
}

/// A tmpfs mounted at `dir`, unmounted on drop.
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    pub fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "this test mounts a tmpfs: it needs root");
        Tmpfs(dir.to_path_buf())
    }

    /// Fills it up: one file takes every byte left.
    pub fn fill(&self) {
        use std::io::Write;
        let mut file = std::fs::File::create(self.0.join("filler")).unwrap();
        let block = vec![0xa5u8; 4096];
        while file.write_all(&block).is_ok() {}
        let _ = file.sync_all();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
