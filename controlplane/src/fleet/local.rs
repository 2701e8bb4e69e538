//! The local provider: one `dataplane` process per queue on this machine, each with its own
//! port and data directory, started from a config file the control plane writes (logins as
//! hashes only). A node that dies is started again, on the same port and data, so its durable
//! messages are there again.

use super::{FleetError, Provider};
use crate::queues::{Queue, StoredLogin, Tier};
use futures::future::BoxFuture;
use futures::FutureExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinHandle;

/// How long a node may take to confirm new logins.
const RELOAD_WITHIN: Duration = Duration::from_secs(5);
/// The wait before starting a node that exited; it doubles while starts keep failing.
const RESTART_AFTER: Duration = Duration::from_millis(200);
const RESTART_AFTER_AT_MOST: Duration = Duration::from_secs(30);

pub struct LocalProvider {
    dataplane: PathBuf,
    /// Each queue's node lives in `nodes/QUEUE-ID/` here.
    dir: PathBuf,
    running: Mutex<HashMap<String, RunningNode>>,
}

/// A node this provider keeps running.
struct RunningNode {
    /// The port it was given for good.
    port: u16,
    /// Its process id now (a restart changes it).
    pid: Arc<AtomicU32>,
    /// What the node prints on stdout: `listening on`, `logins reloaded`.
    lines: broadcast::Sender<String>,
    /// Ends the supervision and the node.
    stop: Arc<Notify>,
    supervisor: JoinHandle<()>,
}

/// Starts one queue's node from its directory.
#[derive(Clone)]
struct Launcher {
    dataplane: PathBuf,
    dir: PathBuf,
    lines: broadcast::Sender<String>,
}

impl Launcher {
    /// Starts the node and waits for its `listening on` line; returns it and its address.
    async fn launch(&self) -> Result<(Child, String), FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("node.log"))
            .map_err(|e| fail(e.to_string()))?;
        let mut child = Command::new(&self.dataplane)
            .arg("--config")
            .arg(self.dir.join("node.toml"))
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("{}: {e}", self.dataplane.display())))?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let addr = loop {
            match lines.next_line().await {
                Ok(Some(line)) => {
                    if let Some(addr) = line.trim().strip_prefix("listening on ") {
                        break addr.to_string();
                    }
                }
                _ => {
                    let log = self.dir.join("node.log");
                    return Err(fail(format!("the node exited; see {}", log.display())));
                }
            }
        };
        // Keep reading, so the node never blocks on a full pipe, and pass the lines on.
        let forward = self.lines.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = forward.send(line);
            }
        });
        Ok((child, addr))
    }
}

/// Keeps a node running until `stop`: a node that exits is started again, backing off while
/// starts fail.
async fn supervise(mut child: Child, launcher: Launcher, pid: Arc<AtomicU32>, stop: Arc<Notify>) {
    loop {
        tokio::select! {
            _ = stop.notified() => {
                let _ = child.kill().await;
                return;
            }
            status = child.wait() => {
                tracing::warn!(?status, node = %launcher.dir.display(), "a node exited");
            }
        }
        let mut wait = RESTART_AFTER;
        child = loop {
            tokio::select! {
                _ = stop.notified() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match launcher.launch().await {
                Ok((child, _)) => break child,
                Err(error) => {
                    tracing::error!(%error, "a node could not be restarted");
                    wait = (wait * 2).min(RESTART_AFTER_AT_MOST);
                }
            }
        };
        pid.store(child.id().unwrap_or(0), Ordering::Relaxed);
        tracing::info!(node = %launcher.dir.display(), "a node was restarted");
    }
}

impl LocalProvider {
    pub fn new(dataplane: PathBuf, dir: PathBuf) -> LocalProvider {
        LocalProvider {
            dataplane,
            dir,
            running: Mutex::default(),
        }
    }

    fn node_dir(&self, queue_id: &str) -> PathBuf {
        self.dir.join("nodes").join(queue_id)
    }

    async fn start_node(&self, queue: &Queue) -> Result<String, FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let dir = self.node_dir(&queue.id);
        std::fs::create_dir_all(&dir).map_err(|e| fail(e.to_string()))?;
        let port = free_port().map_err(|e| fail(e.to_string()))?;
        let config = node_config(queue, &dir, port);
        std::fs::write(dir.join("node.toml"), config).map_err(|e| fail(e.to_string()))?;
        let (lines, _) = broadcast::channel(16);
        let launcher = Launcher {
            dataplane: self.dataplane.clone(),
            dir,
            lines: lines.clone(),
        };
        let (child, addr) = launcher.launch().await?;
        let pid = Arc::new(AtomicU32::new(child.id().unwrap_or(0)));
        let stop = Arc::new(Notify::new());
        let supervisor = tokio::spawn(supervise(child, launcher, pid.clone(), stop.clone()));
        let node = RunningNode {
            port,
            pid,
            lines,
            stop,
            supervisor,
        };
        self.running
            .lock()
            .expect("never poisoned")
            .insert(queue.id.clone(), node);
        Ok(format!("ws://{addr}/"))
    }

    async fn stop_node(&self, queue_id: &str) {
        let node = self
            .running
            .lock()
            .expect("never poisoned")
            .remove(queue_id);
        if let Some(node) = node {
            node.stop.notify_one();
            let _ = node.supervisor.await;
        }
    }

    async fn reload(&self, queue: &Queue) -> Result<(), FleetError> {
        let fail = |what: String| FleetError::Reload(what);
        let dir = self.node_dir(&queue.id);
        let (port, pid, mut lines) = {
            let running = self.running.lock().expect("never poisoned");
            let node = running
                .get(&queue.id)
                .ok_or_else(|| fail("it is not running".into()))?;
            (
                node.port,
                node.pid.load(Ordering::Relaxed),
                node.lines.subscribe(),
            )
        };
        let config = node_config(queue, &dir, port);
        std::fs::write(dir.join("node.toml"), config).map_err(|e| fail(e.to_string()))?;
        let status = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .await;
        if !status.is_ok_and(|s| s.success()) {
            return Err(fail("SIGHUP could not be sent".into()));
        }
        let confirmed = async {
            while let Ok(line) = lines.recv().await {
                if line.trim() == "logins reloaded" {
                    return true;
                }
            }
            false
        };
        match tokio::time::timeout(RELOAD_WITHIN, confirmed).await {
            Ok(true) => Ok(()),
            _ => Err(fail("no confirmation".into())),
        }
    }
}

impl Provider for LocalProvider {
    fn start<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<String, FleetError>> {
        self.start_node(queue).boxed()
    }

    fn stop<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, ()> {
        self.stop_node(queue_id).boxed()
    }

    fn reload_logins<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        self.reload(queue).boxed()
    }
}

/// A port free on loopback now, to give a node for good (a restart keeps its address).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The node's config file: what the control plane decides for it.
fn node_config(queue: &Queue, dir: &Path, port: u16) -> String {
    let login = |role: &str, login: &StoredLogin| {
        format!(
            "[{role}]\nusername = {:?}\npassword_hash = {:?}\n",
            login.username, login.password_hash
        )
    };
    let tier = match queue.tier {
        Tier::Devtest => "devtest",
        Tier::Standard => "standard",
    };
    format!(
        "listen = \"127.0.0.1:{port}\"\ndata_dir = {:?}\nplaintext = true\ntier = \"{tier}\"\n\
         instance_type = {:?}\nregion = {:?}\nipv4 = {}\n{}{}{}",
        dir.join("data"),
        queue.instance_type,
        queue.region,
        queue.ipv4,
        login("publisher", &queue.publisher),
        login("subscriber", &queue.subscriber),
        login("admin", &queue.admin),
    )
}
