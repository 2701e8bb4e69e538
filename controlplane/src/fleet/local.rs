//! The local provider: one `dataplane` process per queue on this machine, each with its own
//! port and data directory, started from a config file the control plane writes (logins as
//! hashes only). A node that dies is started again, on the same port and data, so its durable
//! messages are there again. Nodes outlive the control plane: the next one adopts them (their
//! pid file names them, their stdout is a FIFO it can open again) instead of starting twins.

use super::process::{make_fifo, NodeProcess};
use super::{FleetError, Provider};
use crate::nodes::NodeTokens;
use crate::queues::{Addresses, Placement, Queue, StoredLogin, Tier};
use crate::write_private;
use futures::future::BoxFuture;
use futures::FutureExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::unix::pipe;
use tokio::process::Command;
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinHandle;

/// How long a node may take to confirm new logins.
const RELOAD_WITHIN: Duration = Duration::from_secs(5);
/// The wait before starting a node that exited; it doubles while starts keep failing.
const RESTART_AFTER: Duration = Duration::from_millis(200);
const RESTART_AFTER_AT_MOST: Duration = Duration::from_secs(30);
/// How long a stopping node has to make and report its last record before it is killed.
const STOP_WITHIN: Duration = Duration::from_secs(10);

pub struct LocalProvider {
    dataplane: PathBuf,
    /// Each queue's node lives in `nodes/QUEUE-ID/` here.
    dir: PathBuf,
    /// Where nodes report, and their tokens.
    reports: ReportTarget,
    running: Mutex<HashMap<String, RunningNode>>,
}

/// The control plane's node API, as nodes are told it.
pub struct ReportTarget {
    /// Its base URL (`http://127.0.0.1:PORT` for local nodes, `https://` with `[api_tls]`).
    pub url: String,
    /// The root nodes trust for its HTTPS certificate, when it is a private one.
    pub ca: Option<PathBuf>,
    pub tokens: Arc<NodeTokens>,
    /// With a cluster certificate (ACME configured): the zone its wildcard covers,
    /// `q.CLUSTER.DOMAIN`. Nodes then serve TLS with it, fetched from the control plane.
    pub tls_zone: Option<String>,
}

impl ReportTarget {
    /// Where a local node is: by name over TLS with the cluster certificate, else plain
    /// ws://; the name resolves to loopback (::1, and 127.0.0.1 with IPv4), where it listens.
    fn placement(&self, queue: &Queue, port: u16) -> Placement {
        let node = match &self.tls_zone {
            Some(zone) => format!("wss://{}.{zone}:{port}/", queue.id),
            None => format!("ws://127.0.0.1:{port}/"),
        };
        let addresses = Addresses {
            v6: std::net::Ipv6Addr::LOCALHOST,
            v4: queue.ipv4.then_some(std::net::Ipv4Addr::LOCALHOST),
        };
        Placement { node, addresses }
    }
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
    /// Starts the node and waits for its `listening on` line (its address is the configured
    /// port, so only the readiness matters).
    async fn launch(&self) -> Result<NodeProcess, FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("node.log"))
            .map_err(|e| fail(e.to_string()))?;
        // Subscribed before the node starts, so its first line is not missed.
        let mut lines = self.lines.subscribe();
        let stdout = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("node.out"))
            .map_err(|e| fail(e.to_string()))?;
        let mut child = Command::new(&self.dataplane)
            .arg("--config")
            .arg(self.dir.join("node.toml"))
            .stdout(stdout)
            .stderr(log)
            // Its own process group: a Ctrl-C meant for the control plane does not reach it.
            .process_group(0)
            .spawn()
            .map_err(|e| fail(format!("{}: {e}", self.dataplane.display())))?;
        let listening = async {
            loop {
                match lines.recv().await {
                    Ok(line) => {
                        if line.starts_with("listening on ") {
                            return true;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return false,
                }
            }
        };
        tokio::select! {
            true = listening => {}
            _ = child.wait() => {
                let log = self.dir.join("node.log");
                return Err(fail(format!("the node exited; see {}", log.display())));
            }
        }
        let pid = child.id().unwrap_or(0);
        std::fs::write(self.dir.join("node.pid"), pid.to_string())
            .map_err(|e| fail(e.to_string()))?;
        Ok(NodeProcess::Child(child))
    }

    /// Opens the node's stdout FIFO (once for all its runs) and passes its lines on to
    /// `lines`, until the returned task is aborted.
    fn listen(&self) -> std::io::Result<JoinHandle<()>> {
        let fifo = self.dir.join("node.out");
        make_fifo(&fifo)?;
        // Read-write, so the reader never sees an end while no node holds the other side.
        let receiver = pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(&fifo)?;
        let forward = self.lines.clone();
        Ok(tokio::spawn(async move {
            let mut lines = BufReader::new(receiver).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = forward.send(line);
            }
        }))
    }

    /// Adopts the node a previous control plane left running here, if there is one.
    fn adopt(&self) -> Option<NodeProcess> {
        let pid = std::fs::read_to_string(self.dir.join("node.pid")).ok()?;
        NodeProcess::adopt(pid.trim().parse().ok()?, &self.dir.join("node.toml"))
    }
}

/// Keeps a node running until `stop`: a node that exits is started again, backing off while
/// starts fail.
async fn supervise(
    mut child: NodeProcess,
    launcher: Launcher,
    listener: JoinHandle<()>,
    pid: Arc<AtomicU32>,
    stop: Arc<Notify>,
) {
    // However this ends, the node's stdout is no longer read.
    let _listener = AbortOnDrop(listener);
    loop {
        tokio::select! {
            _ = stop.notified() => {
                child.stop(STOP_WITHIN).await;
                return;
            }
            _ = child.exited() => {}
        }
        let mut wait = RESTART_AFTER;
        child = loop {
            tokio::select! {
                _ = stop.notified() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match launcher.launch().await {
                Ok(child) => break child,
                Err(error) => {
                    tracing::error!(%error, "a node could not be restarted");
                    wait = (wait * 2).min(RESTART_AFTER_AT_MOST);
                }
            }
        };
        pid.store(child.id(), Ordering::Relaxed);
        tracing::info!(node = %launcher.dir.display(), "a node was restarted");
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl LocalProvider {
    pub fn new(dataplane: PathBuf, dir: PathBuf, reports: ReportTarget) -> LocalProvider {
        LocalProvider {
            dataplane,
            dir,
            reports,
            running: Mutex::default(),
        }
    }

    fn node_dir(&self, queue_id: &str) -> PathBuf {
        self.dir.join("nodes").join(queue_id)
    }

    async fn start_node(&self, queue: &Queue) -> Result<Placement, FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let dir = self.node_dir(&queue.id);
        std::fs::create_dir_all(&dir).map_err(|e| fail(e.to_string()))?;
        let port = free_port().map_err(|e| fail(e.to_string()))?;
        let config = node_config(queue, &dir, port, &self.reports);
        write_private(&dir.join("node.toml"), config.as_bytes())
            .map_err(|e| fail(e.to_string()))?;
        let (launcher, listener) = self.launcher(dir).map_err(|e| fail(e.to_string()))?;
        let child = launcher.launch().await?;
        self.keep_running(&queue.id, port, child, launcher, listener);
        Ok(self.reports.placement(queue, port))
    }

    /// Adopts `queue`'s node if a previous control plane left it running, or starts it again
    /// on its port and data; returns where it listens.
    async fn resume_node(&self, queue: &Queue) -> Result<Placement, FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let dir = self.node_dir(&queue.id);
        let old =
            std::fs::read_to_string(dir.join("node.toml")).map_err(|e| fail(e.to_string()))?;
        let port = configured_port(&old).map_err(fail)?;
        // Written again for this control plane, whose address may have changed.
        let config = node_config(queue, &dir, port, &self.reports);
        write_private(&dir.join("node.toml"), config.as_bytes())
            .map_err(|e| fail(e.to_string()))?;
        let (launcher, listener) = self.launcher(dir).map_err(|e| fail(e.to_string()))?;
        let (child, adopted) = match launcher.adopt() {
            Some(child) => {
                tracing::info!(queue = %queue.id, pid = child.id(), "adopted a running node");
                (child, true)
            }
            None => (launcher.launch().await?, false),
        };
        self.keep_running(&queue.id, port, child, launcher, listener);
        // A running node rereads its config on SIGHUP: it reports here from now on.
        if adopted && old != config {
            if let Err(error) = self.hang_up(&queue.id).await {
                tracing::warn!(queue = %queue.id, %error, "an adopted node did not reread its config");
            }
        }
        Ok(self.reports.placement(queue, port))
    }

    /// A launcher for the node in `dir`, and the task that reads its stdout.
    fn launcher(&self, dir: PathBuf) -> std::io::Result<(Launcher, JoinHandle<()>)> {
        let (lines, _) = broadcast::channel(16);
        let launcher = Launcher {
            dataplane: self.dataplane.clone(),
            dir,
            lines,
        };
        let listener = launcher.listen()?;
        Ok((launcher, listener))
    }

    /// Supervises `child` from now on.
    fn keep_running(
        &self,
        queue_id: &str,
        port: u16,
        child: NodeProcess,
        launcher: Launcher,
        listener: JoinHandle<()>,
    ) {
        let pid = Arc::new(AtomicU32::new(child.id()));
        let stop = Arc::new(Notify::new());
        let lines = launcher.lines.clone();
        let supervisor = tokio::spawn(supervise(
            child,
            launcher,
            listener,
            pid.clone(),
            stop.clone(),
        ));
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
            .insert(queue_id.to_string(), node);
    }

    /// Stops every node (`controlplane dev` on exit; `serve` leaves them to the next one).
    pub async fn stop_all(&self) {
        let ids: Vec<String> = self
            .running
            .lock()
            .expect("never poisoned")
            .keys()
            .cloned()
            .collect();
        for id in ids {
            self.stop_node(&id).await;
        }
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
        let port = {
            let running = self.running.lock().expect("never poisoned");
            let node = running
                .get(&queue.id)
                .ok_or_else(|| fail("it is not running".into()))?;
            node.port
        };
        let config = node_config(queue, &dir, port, &self.reports);
        write_private(&dir.join("node.toml"), config.as_bytes())
            .map_err(|e| fail(e.to_string()))?;
        self.hang_up(&queue.id).await
    }

    /// Sends the node SIGHUP (it rereads its logins and refetches the cluster certificate) and
    /// waits for it to confirm.
    async fn hang_up(&self, queue_id: &str) -> Result<(), FleetError> {
        let fail = |what: String| FleetError::Reload(what);
        let (pid, mut lines) = {
            let running = self.running.lock().expect("never poisoned");
            let node = running
                .get(queue_id)
                .ok_or_else(|| fail("it is not running".into()))?;
            (node.pid.load(Ordering::Relaxed), node.lines.subscribe())
        };
        // SAFETY: kill takes a pid and a signal.
        if unsafe { libc::kill(pid as libc::pid_t, libc::SIGHUP) } != 0 {
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
    fn start<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<Placement, FleetError>> {
        self.start_node(queue).boxed()
    }

    fn resume<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<Placement, FleetError>> {
        self.resume_node(queue).boxed()
    }

    fn stop<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, ()> {
        self.stop_node(queue_id).boxed()
    }

    fn renew_certificates(&self) -> BoxFuture<'_, ()> {
        async move {
            let ids: Vec<String> = {
                let running = self.running.lock().expect("never poisoned");
                running.keys().cloned().collect()
            };
            for id in ids {
                if let Err(error) = self.hang_up(&id).await {
                    tracing::warn!(queue = %id, %error, "a node did not take the new certificate");
                }
            }
        }
        .boxed()
    }

    fn reload_logins<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        self.reload(queue).boxed()
    }
}

/// A port free on both loopback addresses now, to give a node for good (a restart keeps its
/// address): its name's A record is 127.0.0.1 and its AAAA record ::1.
fn free_port() -> std::io::Result<u16> {
    let mut last_error = None;
    for _ in 0..20 {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = v4.local_addr()?.port();
        match std::net::TcpListener::bind(("::1", port)) {
            Ok(_) => return Ok(port),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.expect("tried"))
}

/// The port a node's config (its text) gives it (`listen` is one address or a list on one
/// port).
fn configured_port(text: &str) -> Result<u16, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let listen = match table.get("listen") {
        Some(toml::Value::Array(addrs)) => addrs.first(),
        other => other,
    };
    let listen = listen.and_then(|v| v.as_str()).unwrap_or("");
    let addr: std::net::SocketAddr = listen.parse().map_err(|_| format!("listen = {listen:?}"))?;
    Ok(addr.port())
}

/// The node's config file: what the control plane decides for it.
fn node_config(queue: &Queue, dir: &Path, port: u16, reports: &ReportTarget) -> String {
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
    let transport = match reports.tls_zone {
        Some(_) => "tls_from_control_plane = true",
        None => "plaintext = true",
    };
    let ca = match &reports.ca {
        Some(ca) => format!("control_plane_ca = {ca:?}\n"),
        None => String::new(),
    };
    format!(
        "listen = [\"127.0.0.1:{port}\", \"[::1]:{port}\"]\ndata_dir = {:?}\n{transport}\ntier = \"{tier}\"\n\
         instance_type = {:?}\nregion = {:?}\nipv4 = {}\ncontrol_plane = {:?}\n{ca}queue_id = {:?}\n\
         node_token = {:?}\n{}{}{}",
        dir.join("data"),
        queue.instance_type,
        queue.region,
        queue.ipv4,
        reports.url,
        queue.id,
        reports.tokens.token_for(&queue.id),
        login("publisher", &queue.publisher),
        login("subscriber", &queue.subscriber),
        login("admin", &queue.admin),
    )
}
