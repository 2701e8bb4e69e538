//! `bench failover`: one control plane (the release binary, its own store, the local
//! provider) and one queue made with `replicas: 2`, publishers at durability 2 all along.
//! Each round, at a random moment, the node's disk is lost (its data directory removed) and
//! its process killed; the provider starts it again on its standby's copy (a promotion) and
//! a new standby follows. Measured per round: until a publisher is answered again (the queue
//! serves) and until durability 2 is Success again (on two disks). Subscribers hold what they
//! receive for a moment before they ack it, and after each loss resume their sessions on the
//! promoted copy. At the end every publish answered Success at durability 2 must have been
//! delivered, and none to a second subscriber while another held it. Exits 1 if one is lost
//! or was held by two at once. docs/resilience.md, *Failover to the standby*. With
//! `--instances`, machines of their own instead (`failover_instances.rs`); the load and its
//! tally are both's (`failover_load.rs`).

use crate::client::{next_text, Socket, Wire};
use crate::failover_load::{self, Connection, Load, Way};
use futures::SinkExt;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use yawc::frame::Frame;

#[derive(clap::Args)]
pub struct Settings {
    /// The control plane binary (a release build).
    #[arg(long, default_value = "target/release/controlplane")]
    controlplane: String,
    /// Rounds: each loses the node's disk (with `--instances`, its machine) once.
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
    /// Publishers, each with one durability-2 publish in flight.
    #[arg(long, default_value_t = 4)]
    pub publishers: usize,
    /// Subscribers all along, each holding up to 8 messages for `--hold-ms` before it acks.
    #[arg(long, default_value_t = 2)]
    pub subscribers: usize,
    /// How long a subscriber holds a message before it acks it.
    #[arg(long, default_value_t = 20)]
    pub hold_ms: u64,
    /// Machines of their own instead of the local provider: the EC2 provider against moto,
    /// the node and its standby each in a network namespace, the node's machine killed
    /// (processes and network) and the standby's promoted by the control plane; clients
    /// reach the queue by its name. Needs root, moto in .venv and `cargo build --workspace
    /// --bins` (the debug binaries the test harness starts). See docs/resilience.md.
    #[arg(long)]
    pub instances: bool,
}

const TOKEN: &str = "operator-token-for-the-failover-run";
const REPLICATED: &str =
    r#"{"tier":"standard","region":"local","instance_type":"local","replicas":2}"#;
/// The longest a round may take to recover before the run gives up.
const RECOVER_WITHIN: Duration = Duration::from_secs(60);

/// The local node at its URL, plain ws:// on loopback.
#[derive(Clone)]
struct Local {
    url: String,
}

impl Way for Local {
    type Connection = Socket;
    const RECONNECT_PAUSE: Duration = Duration::from_millis(20);

    async fn open(&self) -> Option<Socket> {
        let wire = Wire {
            tls: None,
            compress: false,
        };
        wire.try_connect(&self.url).await.ok()
    }
}

impl Connection for Socket {
    async fn send_text(&mut self, text: String) -> bool {
        self.send(Frame::text(text)).await.is_ok()
    }

    async fn next_text(&mut self) -> Option<String> {
        next_text(self).await
    }
}

pub async fn failover(settings: &Settings, dataplane: &Path, data_root: &Path) -> bool {
    let dir = data_root.join("failover");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the run's directory");
    let controlplane = std::fs::canonicalize(&settings.controlplane)
        .unwrap_or_else(|e| panic!("{}: {e} (build it first)", settings.controlplane));
    let (mut child, api) = start_controlplane(&controlplane, dataplane, &dir);
    // reqwest is built without a crypto provider of its own (the workspace's choice).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let created = call(&http, api, "POST", "/v1/queues", Some(REPLICATED)).await;
    let id = created["id"].as_str().expect("an id").to_string();
    let queue = wait_for(&http, api, &id, |q| q["live"]["standby"]["in_sync"] == true).await;
    let url = queue["node"].as_str().expect("placed").to_string();
    let local = Local { url };
    let logins = &created["logins"];
    let hold = Duration::from_millis(settings.hold_ms);
    let load = Load::start(
        &local,
        logins,
        settings.publishers,
        settings.subscribers,
        hold,
    );
    let node_dir = dir.join("data/nodes").join(&id);
    let mut rounds = failover_load::Rounds::default();
    for round in 1..=settings.rounds {
        // A random moment in the next 0.5 to 2 s of publishing.
        let wait = 500 + u32::from_le_bytes(qe_shared::random::bytes()) % 1500;
        tokio::time::sleep(Duration::from_millis(wait.into())).await;
        let lost = lose_the_disk(&node_dir, &load.seen);
        let seen = &load.seen;
        rounds.recovered(round, seen, lost, RECOVER_WITHIN).await;
    }
    let seen = load.stop().await;
    // What the subscribers held when they stopped waits for their sessions' time to run out.
    let drained = failover_load::drain(&local, logins).await;
    let _ = child.kill();
    let _ = child.wait();
    stop_nodes(&node_dir);
    failover_load::report(&rounds, &seen, &drained)
}

/// Removes the node's data directory, then kills its process; when.
fn lose_the_disk(node_dir: &Path, seen: &Mutex<failover_load::Seen>) -> Instant {
    let pid: i32 = std::fs::read_to_string(node_dir.join("node.pid"))
        .expect("the node's pid file")
        .trim()
        .parse()
        .expect("a pid");
    std::fs::remove_dir_all(node_dir.join("data")).expect("the node's data directory");
    let lost = failover_load::lost_now(seen);
    // SAFETY: kill takes a pid and a signal.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    lost
}

/// The control plane on `dir`, its API on a free loopback port; and where it listens.
fn start_controlplane(binary: &Path, dataplane: &Path, dir: &Path) -> (Child, SocketAddr) {
    let config = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\ntoken = \"{TOKEN}\"\ncluster = \"bench\"\n\
         dataplane = {:?}\nlive_stats_secs = 1\nreconcile_every_secs = 1\n",
        dir.join("data"),
        dataplane,
    );
    let path = dir.join("controlplane.toml");
    std::fs::write(&path, config).expect("the config");
    let log = std::fs::File::create(dir.join("controlplane.log")).expect("its log");
    let mut child = Command::new(binary)
        .args(["serve", "--config"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start the control plane");
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines.next().expect("it listens").expect("a line");
        if let Some(addr) = line.strip_prefix("listening on ") {
            break addr.trim().parse().expect("an address");
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

/// The node and its standby, which outlive the control plane (as in production).
fn stop_nodes(node_dir: &Path) {
    let pid_files: [PathBuf; 2] = [
        node_dir.join("node.pid"),
        node_dir.join("standby/standby.pid"),
    ];
    for file in pid_files {
        if let Some(pid) = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            // SAFETY: kill takes a pid and a signal.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// One API call with the operator's token; its JSON body.
async fn call(
    http: &reqwest::Client,
    api: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Value {
    let url = format!("http://{api}{path}");
    let request = match method {
        "POST" => http.post(url).body(body.unwrap_or_default().to_string()),
        _ => http.get(url),
    };
    let response = request
        .bearer_auth(TOKEN)
        .header("Content-Type", "application/json")
        .send()
        .await
        .expect("the API answers");
    response.json().await.expect("JSON")
}

/// Queue `id` once `wanted` holds of it.
async fn wait_for(
    http: &reqwest::Client,
    api: SocketAddr,
    id: &str,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + RECOVER_WITHIN;
    loop {
        let queue = call(http, api, "GET", &format!("/v1/queues/{id}"), None).await;
        if wanted(&queue) {
            return queue;
        }
        assert!(
            Instant::now() < deadline,
            "the queue never got there: {queue}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
