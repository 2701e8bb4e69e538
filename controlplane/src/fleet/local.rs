//! The local provider: one `dataplane` process per queue on this machine, each with its own
//! port and data directory under `DATA_DIR/nodes/QUEUE-ID/`, started from a bootstrap file
//! (the node pulls everything else over the node channel, as a cloud node does). A node that
//! dies is started again on the same port and data, so its durable messages are there again.
//! Nodes outlive the control plane: the next one adopts them (their pid file names them)
//! instead of starting twins. Their files are on the control plane's data disk, so what writes
//! them runs through [`on_disk`]: a stalled disk delays a node's start, never the API
//! (tests/tests/local_fleet_disk.rs).

use super::local_ports::{free_on_both_loopbacks, PortClaims};
use super::local_standby::{LocalStandbys, Primary, StandbyLauncher};
use super::process::{Launch, NodeProcess, Supervised};
use super::{FleetError, Provider};
use crate::model::queue::{Addresses, Placement, Queue};
use crate::write_private;
use futures::future::BoxFuture;
use futures::FutureExt;
use qe_shared::files::on_disk;
use qe_shared::node_channel::Bootstrap;
use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::process::Command;

/// How long a stopping node has to make and report its last record before it is killed.
const STOP_WITHIN: Duration = Duration::from_secs(10);
/// Why a serving node is restarted: it was started for replicas that are not the control
/// plane's now (a node reads its bootstrap once).
const MOVED: &str = "the control plane's replicas or root changed";
/// Why an adopted node is restarted: it runs another binary than the one configured (a
/// control plane started after an upgrade brings the nodes it finds to it).
const UPGRADED: &str = "its binary is not the configured one";

pub struct LocalProvider {
    dataplane: PathBuf,
    /// Each queue's node lives in `nodes/QUEUE-ID/` here.
    dir: PathBuf,
    /// With certificates (ACME or a local CA): the zone, `q.CLUSTER.DOMAIN`. Nodes are then
    /// reached by name over TLS.
    tls_zone: Option<String>,
    /// With certificates from a CA of its own (the local CA): its root, which standbys check
    /// their node's certificate against; None: the public web's roots.
    ca_root: Option<PathBuf>,
    running: Mutex<HashMap<String, RunningNode>>,
    standbys: Arc<LocalStandbys>,
    /// The ports its nodes have, claimed against other control planes on this machine.
    ports: PortClaims,
}

/// A node this provider keeps running.
struct RunningNode {
    /// What it was started from: one that reaches the control plane otherwise (it moved)
    /// means a restart.
    bootstrap: Bootstrap,
    process: Supervised,
}

impl LocalProvider {
    pub fn new(dataplane: PathBuf, dir: PathBuf, tls_zone: Option<String>) -> LocalProvider {
        LocalProvider {
            dataplane,
            dir,
            tls_zone,
            ca_root: None,
            running: Mutex::default(),
            standbys: Arc::default(),
            ports: PortClaims::new(),
        }
    }

    /// Its nodes' certificates chain to the root in `ca_root` (a CA of the control plane's
    /// own): their standbys check them against it.
    pub fn with_ca_root(self, ca_root: Option<PathBuf>) -> LocalProvider {
        LocalProvider { ca_root, ..self }
    }

    /// The launcher of `queue`'s standby, following its node at `node` (its placement's URL).
    fn standby_launcher(
        &self,
        queue: &Queue,
        node: &str,
        key: &str,
    ) -> Result<StandbyLauncher, FleetError> {
        let port = self
            .port(&queue.id)
            .map_err(|e| FleetError::Start(e.to_string()))?;
        // A node's name resolves only through the control plane's DNS: connect by address.
        let connect = self
            .tls_zone
            .as_ref()
            .map(|_| SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        Ok(StandbyLauncher {
            dataplane: self.dataplane.clone(),
            dir: self.standby_dir(&queue.id),
            primary: Primary {
                url: node.to_string(),
                connect,
                roots: self.ca_root.clone(),
                epoch: queue.epoch,
            },
            key: key.to_string(),
        })
    }

    fn standby_dir(&self, queue_id: &str) -> PathBuf {
        self.node_dir(queue_id).join("standby")
    }

    /// Queue `queue_id`'s standby, as its node's launcher knows it.
    fn standby_of(&self, queue_id: &str) -> StandbyOf {
        StandbyOf {
            queue_id: queue_id.to_string(),
            dir: self.standby_dir(queue_id),
            standbys: self.standbys.clone(),
        }
    }

    fn node_dir(&self, queue_id: &str) -> PathBuf {
        self.dir.join("nodes").join(queue_id)
    }

    /// The queue's port: chosen once, free on both loopback addresses, kept in its directory
    /// (a restart keeps its address).
    fn port(&self, queue_id: &str) -> std::io::Result<u16> {
        self.port_in(queue_id, "port")
    }

    /// A free loopback port for queue `queue_id`'s node, kept in its directory's `file` so
    /// that a restarted node gets the same one, and claimed against other control planes on
    /// this machine for as long as this one keeps the node ([`local_ports`]).
    ///
    /// [`local_ports`]: super::local_ports
    fn port_in(&self, queue_id: &str, file: &str) -> std::io::Result<u16> {
        let dir = self.node_dir(queue_id);
        let path = dir.join(file);
        on_disk(|| {
            if let Some(port) = read_port(&path) {
                // The node's port stays its own even where another control plane claims it:
                // a replica that led before this one (the nodes' directory is theirs
                // together) holds the claim until it lets go, and the claim is tried again
                // on each call.
                if !self.ports.claim(port) {
                    tracing::debug!(queue = %queue_id, file, port, "another control plane still claims the node's port");
                }
                return Ok(port);
            }
            std::fs::create_dir_all(&dir)?;
            let port = self.ports.pick()?;
            write_private(&path, port.to_string().as_bytes())?;
            Ok(port)
        })
    }

    /// Lets the ports of queue `queue_id`'s node go: it is stopped (a later start claims
    /// them again, or picks new ones if another control plane took them meanwhile).
    fn release_ports(&self, queue_id: &str) {
        for file in PORT_FILES {
            if let Some(port) = read_port(&self.node_dir(queue_id).join(file)) {
                self.ports.release(port);
            }
        }
    }

    /// Where a local node is: by name over TLS with certificates, else plain ws://; the name
    /// resolves to loopback (::1, and 127.0.0.1 with IPv4), where it listens.
    fn placement(&self, queue: &Queue, port: u16, pid: u32) -> Placement {
        let node = match &self.tls_zone {
            Some(zone) => format!("wss://{}.{zone}:{port}/", queue.id),
            None => format!("ws://127.0.0.1:{port}/"),
        };
        let addresses = Addresses {
            v6: Ipv6Addr::LOCALHOST,
            v4: queue.ipv4.then_some(Ipv4Addr::LOCALHOST),
        };
        let resources = BTreeMap::from([
            (
                "directory".to_string(),
                self.node_dir(&queue.id).display().to_string(),
            ),
            ("process".to_string(), pid.to_string()),
        ]);
        Placement {
            node,
            addresses,
            resources,
            restarted_because: None,
        }
    }

    async fn ensure_node(
        &self,
        queue: &Queue,
        bootstrap: &Bootstrap,
    ) -> Result<Placement, FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let port = self.port(&queue.id).map_err(|e| fail(e.to_string()))?;
        let running = {
            let running = self.running.lock().expect("never poisoned");
            running.get(&queue.id).map(|node| {
                (
                    reaches_alike(&node.bootstrap, bootstrap),
                    node.process.pid(),
                )
            })
        };
        let mut restarted_because = None;
        match running {
            Some((true, pid)) => {
                return Ok(self.placement(queue, port, pid));
            }
            // Started for a control plane elsewhere: again, from the new bootstrap.
            Some((false, _)) => {
                tracing::info!(queue = %queue.id, reason = MOVED, "restarting a node");
                restarted_because = Some(MOVED);
                self.stop_node(&queue.id, STOP_WITHIN).await;
            }
            None => {}
        }
        let (launcher, changed) = self
            .launcher(&queue.id, bootstrap)
            .map_err(|e| fail(e.to_string()))?;
        let adopted = launcher.adopt();
        // A node reads its bootstrap once: one left by a control plane that was elsewhere
        // starts again from the new one (what it could not report, it keeps and reports
        // from there). One of another binary starts again from the configured one.
        let must_restart = match &adopted {
            Some(_) if changed => Some(MOVED),
            Some(child)
                if !runs(child.id(), &self.dataplane)
                    && !runs_a_fetched_build(child.id(), &launcher.dir) =>
            {
                Some(UPGRADED)
            }
            _ => None,
        };
        let child = match (adopted, must_restart) {
            (Some(child), None) => {
                tracing::info!(queue = %queue.id, pid = child.id(), "adopted a running node");
                child
            }
            (Some(mut child), Some(reason)) => {
                tracing::info!(queue = %queue.id, reason, "restarting a node");
                restarted_because = Some(reason);
                child.stop(STOP_WITHIN).await;
                self.launch_on_its_ports(&queue.id, &launcher).await?
            }
            (None, _) => self.launch_on_its_ports(&queue.id, &launcher).await?,
        };
        // Perhaps another one now (`launch_on_its_ports`).
        let port = self.port(&queue.id).map_err(|e| fail(e.to_string()))?;
        let pid = child.id();
        if !matches!(child, NodeProcess::Adopted { .. }) {
            tracing::info!(queue = %queue.id, pid, "started a node");
        }
        self.keep_running(&queue.id, bootstrap.clone(), child, launcher);
        Ok(Placement {
            restarted_because,
            ..self.placement(queue, port, pid)
        })
    }

    /// Starts queue `queue_id`'s node. A node that cannot listen because another process has
    /// taken one of its ports is given a new one and started again, once: a port is chosen
    /// once and kept (a restart keeps its address), and is not held between its choice and
    /// the node's first bind, nor while the node is down, so another node on this machine
    /// (another control plane's) may have picked it meanwhile. Its config gives the node the
    /// new port, and its placement records the new address.
    async fn launch_on_its_ports(
        &self,
        queue_id: &str,
        launcher: &Launcher,
    ) -> Result<NodeProcess, FleetError> {
        let error = match launcher.launch().await {
            Ok(child) => return Ok(child),
            Err(error) => error,
        };
        let mut moved = false;
        for file in PORT_FILES {
            let path = self.node_dir(queue_id).join(file);
            let taken = read_port(&path).filter(|port| !free_on_both_loopbacks(*port));
            if let Some(taken) = taken {
                self.ports.release(taken);
                let _ = on_disk(|| std::fs::remove_file(&path));
                let port = self
                    .port_in(queue_id, file)
                    .map_err(|e| FleetError::Start(e.to_string()))?;
                tracing::warn!(queue = %queue_id, file, port, "another process has taken the node's port: it gets a new one");
                moved = true;
            }
        }
        match moved {
            true => launcher.launch().await,
            false => Err(error),
        }
    }

    /// A launcher for queue `queue_id`'s node, its bootstrap written; and whether the control
    /// plane is to be reached otherwise than the bootstrap it had said.
    fn launcher(&self, queue_id: &str, bootstrap: &Bootstrap) -> std::io::Result<(Launcher, bool)> {
        let launcher = Launcher {
            dataplane: self.dataplane.clone(),
            dir: self.node_dir(queue_id),
            standby: self.standby_of(queue_id),
        };
        // Its node token, which it reads from this file on this machine: no bootstrap token
        // (that is for user data, which others can read), so the file changes only when the
        // node's credential or the control plane's address does.
        let local = Bootstrap {
            bootstrap_token: None,
            ..bootstrap.clone()
        };
        let text = toml::to_string(&local).expect("plain fields");
        on_disk(|| {
            std::fs::create_dir_all(&launcher.dir)?;
            let old = std::fs::read_to_string(launcher.bootstrap()).ok();
            let moved = !old
                .as_deref()
                .and_then(|old| toml::from_str::<Bootstrap>(old).ok())
                .is_some_and(|old| reaches_alike(&old, bootstrap));
            if old.as_deref() != Some(text.as_str()) {
                write_private(&launcher.bootstrap(), text.as_bytes())?;
            }
            Ok((launcher, moved))
        })
    }

    /// Supervises `child` from now on.
    fn keep_running(
        &self,
        queue_id: &str,
        bootstrap: Bootstrap,
        child: NodeProcess,
        launcher: Launcher,
    ) {
        let node = RunningNode {
            bootstrap,
            process: Supervised::start(child, launcher),
        };
        self.running
            .lock()
            .expect("never poisoned")
            .insert(queue_id.to_string(), node);
    }

    /// Stops every node and standby (`controlplane dev` on exit; `serve` leaves them to the
    /// next one).
    pub async fn stop_all(&self) {
        let ids: Vec<String> = self
            .running
            .lock()
            .expect("never poisoned")
            .keys()
            .cloned()
            .collect();
        for id in ids {
            self.stop_node(&id, STOP_WITHIN).await;
        }
        // Every standby, also one whose node is not running now.
        for id in self.standbys.supervised() {
            self.standbys.stop(&id, &self.standby_dir(&id)).await;
        }
    }

    /// Stops queue `queue_id`'s node, giving it `grace` to stop by itself (none: killed).
    async fn stop_node(&self, queue_id: &str, grace: Duration) {
        let node = self
            .running
            .lock()
            .expect("never poisoned")
            .remove(queue_id);
        match node {
            Some(node) => node.process.stop(grace).await,
            // One a previous control plane left running, not taken on since.
            None => {
                let launcher = Launcher {
                    dataplane: self.dataplane.clone(),
                    dir: self.node_dir(queue_id),
                    standby: self.standby_of(queue_id),
                };
                if let Some(mut child) = launcher.adopt() {
                    child.stop(grace).await;
                }
            }
        }
    }

    /// The queues whose node directory holds a node or standby process that runs now.
    fn live_directories(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("nodes")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|id| {
                self.running
                    .lock()
                    .expect("never poisoned")
                    .contains_key(id)
                    || Launcher::running_in(&self.node_dir(id)).is_some()
                    || super::local_standby::runs_in(&self.standby_dir(id))
            })
            .collect()
    }
}

impl Provider for LocalProvider {
    fn listen(&self, queue: &Queue) -> Result<Vec<SocketAddr>, FleetError> {
        let port = self
            .port(&queue.id)
            .map_err(|e| FleetError::Start(e.to_string()))?;
        Ok(vec![
            SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
        ])
    }

    /// A port of its own on 127.0.0.1 (where the node's name resolves first).
    fn sqs_listen(&self, queue: &Queue) -> Result<Option<SocketAddr>, FleetError> {
        let port = self
            .port_in(&queue.id, "sqs-port")
            .map_err(|e| FleetError::Start(e.to_string()))?;
        Ok(Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port))))
    }

    fn ensure<'a>(
        &'a self,
        queue: &'a Queue,
        bootstrap: &'a Bootstrap,
    ) -> BoxFuture<'a, Result<Placement, FleetError>> {
        self.ensure_node(queue, bootstrap).boxed()
    }

    /// Before its node starts: its standby's copy made its data if its own is lost (now, or
    /// by its supervisor since the last look, which a file in its directory remembers).
    fn promote_if_data_lost<'a>(
        &'a self,
        queue: &'a Queue,
    ) -> BoxFuture<'a, Result<bool, FleetError>> {
        async move {
            let node_dir = self.node_dir(&queue.id);
            let data = node_dir.join("data");
            let standby = self.standby_dir(&queue.id);
            let fail = |e: std::io::Error| FleetError::Start(format!("promoting the standby: {e}"));
            // A node whose directory went while it still runs writes through what it holds
            // open, and would go on beside the copy put in its place: it is killed first. Its
            // supervision stays: the supervisor starts it again, on the copy.
            let fence = async {
                if let Some(mut node) = Launcher::running_in(&node_dir) {
                    tracing::warn!(queue = %queue.id, pid = node.id(), "the node's data is gone while it runs: killed before its standby's copy takes its place");
                    node.stop(Duration::ZERO).await;
                }
            };
            let promoted = self
                .standbys
                .promote_if_data_lost(&queue.id, &data, &standby, fence);
            promoted.await.map_err(fail)?;
            super::local_standby::was_promoted(&node_dir).map_err(fail)
        }
        .boxed()
    }

    fn promotion_recorded<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        async move {
            let node_dir = self.node_dir(&queue.id);
            let recorded = super::local_standby::promotion_recorded(&node_dir);
            recorded.map_err(|e| FleetError::Start(format!("recording the promotion: {e}")))
        }
        .boxed()
    }

    fn ensure_standby<'a>(
        &'a self,
        queue: &'a Queue,
        node: &'a Placement,
        standby: &'a super::StandbyBoot,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, FleetError>> {
        async move {
            let launcher = self.standby_launcher(queue, &node.node, &standby.key)?;
            self.standbys.ensure(&queue.id, launcher).await
        }
        .boxed()
    }

    /// Its process killed; the next `ensure_standby` starts another on its copy.
    fn fence_standby<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        async move {
            let dir = self.standby_dir(&queue.id);
            self.standbys.kill(&queue.id, &dir).await;
            Ok(())
        }
        .boxed()
    }

    /// The node first (its last records), then its standby, if it has one.
    fn stop<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, Result<(), FleetError>> {
        async move {
            self.stop_node(queue_id, STOP_WITHIN).await;
            self.standbys
                .stop(queue_id, &self.standby_dir(queue_id))
                .await;
            self.release_ports(queue_id);
            Ok(())
        }
        .boxed()
    }

    /// Kills its process at once (a stopped or hung one answers no SIGTERM) and waits until
    /// it is gone: only then may another take its port and data.
    fn fence<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        async move {
            self.stop_node(&queue.id, Duration::ZERO).await;
            Ok(())
        }
        .boxed()
    }

    /// `dataplane --report-last` on the node's directory (no node of it runs: `stop` came
    /// first), its output in `node.log`; killed if it takes longer than `within`.
    fn report_last<'a>(
        &'a self,
        queue: &'a Queue,
        bootstrap: &'a Bootstrap,
        within: Duration,
    ) -> BoxFuture<'a, Result<bool, FleetError>> {
        async move {
            if !self.node_dir(&queue.id).join("data").exists() {
                return Ok(false);
            }
            let (launcher, _) = self
                .launcher(&queue.id, bootstrap)
                .map_err(|e| FleetError::Start(e.to_string()))?;
            launcher.report_last(within).await?;
            Ok(true)
        }
        .boxed()
    }

    /// The node's `data/` (its messages), its standby's copy and what was left of a lost
    /// `data/` when the copy replaced it; its directory stays, with its logs.
    fn remove_data<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, Result<(), FleetError>> {
        async move {
            let standby = super::local_standby::data_dir(&self.standby_dir(queue_id));
            let lost = lost_data(&self.node_dir(queue_id));
            let every = [self.node_dir(queue_id).join("data"), standby];
            on_disk(|| {
                for data in every.into_iter().chain(lost) {
                    match std::fs::remove_dir_all(data) {
                        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                            return Err(FleetError::Remove(error.to_string()))
                        }
                        _ => {}
                    }
                }
                Ok(())
            })
        }
        .boxed()
    }

    /// From its directory: the bootstrap it started from, the credential it took since
    /// (`data/node-token`), and the config it kept (`data/desired-config.json`).
    fn stray(&self, queue_id: &str) -> Option<super::Stray> {
        let dir = self.node_dir(queue_id);
        let bootstrap = std::fs::read_to_string(dir.join("bootstrap.toml")).ok()?;
        let bootstrap: Bootstrap = toml::from_str(&bootstrap).ok()?;
        let kept = std::fs::read(dir.join("data/desired-config.json")).ok()?;
        let desired = serde_json::from_slice(&kept).ok()?;
        let rotated = std::fs::read_to_string(dir.join("data/node-token")).ok();
        let node_tokens = rotated.into_iter().chain([bootstrap.node_token]).collect();
        Some(super::Stray {
            node_tokens,
            desired,
        })
    }

    /// Ends every supervision, leaving the nodes running: a former leader that went on
    /// restarting nodes would start one its successor stopped.
    fn let_go(&self) {
        for (_, node) in self.running.lock().expect("never poisoned").drain() {
            node.process.let_go();
        }
        self.standbys.let_go();
        // The next leader keeps the nodes now, and claims their ports.
        self.ports.release_all();
    }

    fn holdings(&self) -> BoxFuture<'_, Result<Vec<String>, FleetError>> {
        async move { Ok(self.live_directories()) }.boxed()
    }
}

/// Starts one queue's node from its directory.
struct Launcher {
    dataplane: PathBuf,
    dir: PathBuf,
    /// Its standby, whose copy becomes its data if its own is lost.
    standby: StandbyOf,
}

/// A queue's standby (if it has one), where its node's launcher finds it.
struct StandbyOf {
    queue_id: String,
    dir: PathBuf,
    standbys: Arc<LocalStandbys>,
}

impl Launcher {
    fn bootstrap(&self) -> PathBuf {
        self.dir.join("bootstrap.toml")
    }

    /// The node's command on its directory, its stderr appended to `node.log`; and the log,
    /// for what it prints.
    fn command(&self) -> Result<(Command, std::fs::File), FleetError> {
        let fail = |error: std::io::Error| FleetError::Start(error.to_string());
        let log = on_disk(|| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join("node.log"))
        })
        .map_err(fail)?;
        let mut command = Command::new(&self.dataplane);
        command
            .arg("--bootstrap")
            .arg(self.bootstrap())
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .stderr(log.try_clone().map_err(fail)?)
            // Its own process group: a Ctrl-C meant for the control plane does not reach it.
            .process_group(0);
        Ok((command, log))
    }

    /// Starts the node and waits until it listens (it pulls its config first, and says so
    /// to the control plane, which is how the queue comes to run). Its stdout and stderr go
    /// to `node.log`.
    async fn launch(&self) -> Result<NodeProcess, FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let StandbyOf {
            queue_id,
            dir,
            standbys,
        } = &self.standby;
        let data = self.dir.join("data");
        // Its process has exited: nothing to fence.
        let promoted = standbys.promote_if_data_lost(queue_id, &data, dir, async {});
        if promoted
            .await
            .map_err(|e| fail(format!("promoting the standby: {e}")))?
        {
            tracing::warn!(queue = %queue_id, "the node's data was lost: its standby's copy is its data now (promoted), and a new standby follows it");
        }
        let (mut command, log) = self.command()?;
        // Named by itself before it runs, so before it listens (it may wait long for its
        // config or certificate): a control plane that dies meanwhile leaves a node the next
        // one adopts, not one it knows nothing of and starts a twin beside.
        let mut child = super::process::spawn_naming_itself(
            command.stdout(std::process::Stdio::piped()),
            &self.dir.join("node.pid"),
        )
        .map_err(|e| fail(format!("{}: {e}", self.dataplane.display())))?;
        let stdout = child.stdout.take().expect("piped");
        let (listening, heard) = tokio::sync::oneshot::channel();
        tokio::spawn(copy_lines(stdout, log, listening));
        tokio::select! {
            Ok(()) = heard => {}
            _ = child.wait() => {
                let log = self.dir.join("node.log");
                return Err(fail(format!("the node exited; see {}", log.display())));
            }
        }
        Ok(NodeProcess::Child(child))
    }

    /// Runs the node only to hand over its unreported records with its last report, and
    /// waits for it to exit (at most `within`, then it is killed).
    async fn report_last(&self, within: Duration) -> Result<(), FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let (mut command, log) = self.command()?;
        let mut child = command
            .arg("--report-last")
            .stdout(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("{}: {e}", self.dataplane.display())))?;
        match tokio::time::timeout(within, child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(status) => Err(fail(format!("reporting the last records: {status:?}"))),
            Err(_) => Err(fail(format!(
                "reporting the last records took over {within:?}"
            ))),
        }
    }

    /// The node a previous control plane left running here, if there is one.
    fn adopt(&self) -> Option<NodeProcess> {
        Launcher::running_in(&self.dir)
    }

    /// The node `dir`'s pid file names, if it runs now from that directory's bootstrap.
    fn running_in(dir: &Path) -> Option<NodeProcess> {
        super::process::adopt_from(&dir.join("node.pid"), &dir.join("bootstrap.toml"))
    }
}

impl Launch for Launcher {
    fn launch(&self) -> impl std::future::Future<Output = Result<NodeProcess, FleetError>> + Send {
        Launcher::launch(self)
    }

    fn what(&self) -> &'static str {
        "a node"
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Copies what a node prints to its log, and says when it prints `listening on`.
async fn copy_lines(
    stdout: tokio::process::ChildStdout,
    log: std::fs::File,
    listening: tokio::sync::oneshot::Sender<()>,
) {
    use std::io::Write;
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut listening = Some(listening);
    let mut log = log;
    while let Ok(Some(line)) = lines.next_line().await {
        let _ = on_disk(|| writeln!(log, "{line}"));
        if line.starts_with("listening on ") {
            if let Some(listening) = listening.take() {
                let _ = listening.send(());
            }
        }
    }
}

/// What is left of lost data directories in `node_dir` (`data.lost-MS`).
fn lost_data(node_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(node_dir) else {
        return Vec::new();
    };
    let lost = entries.flatten().filter(|entry| {
        let name = entry.file_name();
        name.to_string_lossy()
            .starts_with(super::local_standby::LOST_DATA)
    });
    lost.map(|entry| entry.path()).collect()
}

/// Whether two bootstraps reach the control plane alike: the same replicas, in whatever order,
/// and the same root. Each replica lists itself first (docs/deploy.md, "Three replicas"), and
/// a node fails over between all of them whichever it prefers, so a new leader's own order
/// is no reason to restart a node that serves (issue 28: it cut every connection at every
/// failover). The token does not count either: a node whose credential was rotated took the
/// new one over the channel and keeps it.
fn reaches_alike(a: &Bootstrap, b: &Bootstrap) -> bool {
    replicas(a) == replicas(b) && a.control_plane_ca_pem == b.control_plane_ca_pem
}

/// Every control-plane URL a bootstrap names.
fn replicas(bootstrap: &Bootstrap) -> std::collections::BTreeSet<&str> {
    let listed = bootstrap.control_planes.iter().map(String::as_str);
    std::iter::once(bootstrap.control_plane.as_str())
        .chain(listed)
        .collect()
}

/// Whether process `pid` runs the file `binary` is now: the same file (device and inode)
/// as its executable. A binary replaced on disk (installed anew, renamed over) is another
/// file, while the old one runs on, deleted. Unknown (the process is gone) counts as yes:
/// there is nothing to restart.
fn runs(pid: u32, binary: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let running = std::fs::metadata(format!("/proc/{pid}/exe"));
    let configured = std::fs::metadata(binary);
    match (running, configured) {
        (Ok(running), Ok(configured)) => {
            (running.dev(), running.ino()) == (configured.dev(), configured.ino())
        }
        _ => true,
    }
}

/// Whether process `pid` runs a build its node fetched for a rollout (`rollout.rs`), kept in
/// its data directory's `builds/`: that is the build it is to run, not a stale one.
fn runs_a_fetched_build(pid: u32, node_dir: &Path) -> bool {
    let running = std::fs::read_link(format!("/proc/{pid}/exe"));
    // The link is absolute with every link resolved; the directory may be relative.
    let builds = std::fs::canonicalize(node_dir.join("data").join("builds"));
    match (running, builds) {
        (Ok(exe), Ok(builds)) => exe.starts_with(builds),
        _ => false,
    }
}

/// The files in a node's directory that keep its ports: WebSocket, then SQS.
const PORT_FILES: [&str; 2] = ["port", "sqs-port"];

/// The port kept in `path`, if there is one.
fn read_port(path: &Path) -> Option<u16> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two replicas of one control plane keep the same nodes' directory: the one that leads
    /// next reads each node's ports back, even while the one before still claims them.
    #[test]
    fn a_replica_keeps_a_nodes_ports_while_the_one_before_still_claims_them() {
        let dir = tempfile::tempdir().unwrap();
        let provider = || LocalProvider::new("dataplane".into(), dir.path().to_path_buf(), None);
        let (before, next) = (provider(), provider());
        let port = before.port("q1").unwrap();
        let sqs_port = before.port_in("q1", "sqs-port").unwrap();
        assert_ne!(port, sqs_port);
        assert_eq!(next.port("q1").unwrap(), port);
        assert_eq!(next.port_in("q1", "sqs-port").unwrap(), sqs_port);
        // A port for another queue is neither of them, whoever picks it.
        let other = next.port("q2").unwrap();
        assert!(![port, sqs_port].contains(&other));
        // Once the one before lets go, the claims pass to the one that leads.
        assert!(!next.ports.claim(port));
        before.let_go();
        assert!(next.ports.claim(port) && next.ports.claim(sqs_port));
    }
}
