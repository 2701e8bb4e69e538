//! The local provider's standbys (`replicas: 2`): one `dataplane --standby-of` process per
//! replicated queue, beside its node, with its own copy of the log in
//! `nodes/QUEUE-ID/standby/data/` (README, *A standby node*). Kept running like the nodes:
//! one that exits is started again on its copy, and one a previous control plane left
//! running is adopted (its pid file names it), or started again if it follows another
//! address. It outlives its node's restarts and fencing (it is the copy that must survive
//! them); it stops, and its copy goes, with its queue.

use super::process::{Launch, NodeProcess, Supervised};
use super::FleetError;
use qe_shared::files::on_disk;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use tokio::process::Command;

/// How long a stopping standby has before it is killed (it stops at once on SIGTERM).
const STOP_WITHIN: Duration = Duration::from_secs(5);
/// The environment variable the key goes in: never an argument, which every user of the
/// machine can read in `/proc`.
pub const KEY_VARIABLE: &str = "QE_REPLICATION_KEY";

/// Where a standby finds its primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Primary {
    /// The node's URL (`ws://` or `wss://NAME:PORT/`).
    pub url: String,
    /// Where to connect instead of resolving the URL's name (a name only the control plane's
    /// DNS knows); the name is still the one TLS checks.
    pub connect: Option<SocketAddr>,
    /// The CA (PEM) a `wss://` node's certificate chains to; None: the public web's roots.
    pub roots: Option<PathBuf>,
    /// The queue's epoch: the standby follows no node at a lower one (one promoted a moment
    /// ago may not have taken it yet: the standby tries again).
    pub epoch: u64,
}

impl Primary {
    /// The argument that gives the standby the epoch, as one word (an adopted standby's is
    /// looked for in its command line). None at epoch 0 (never promoted): nothing to give, and
    /// a `dataplane` from before epochs, which would refuse the flag, still runs as a standby.
    fn epoch_argument(&self) -> Option<String> {
        (self.epoch > 0).then(|| format!("--epoch={}", self.epoch))
    }
}

#[derive(Default)]
pub struct LocalStandbys {
    running: Mutex<HashMap<String, RunningStandby>>,
    /// Held while a standby is started or a copy promoted: a standby started by the
    /// reconciler while its copy is being moved into the node's place would hold it.
    changing: tokio::sync::Mutex<()>,
}

struct RunningStandby {
    /// What it follows: another primary means a restart.
    primary: Primary,
    process: Supervised,
}

impl LocalStandbys {
    /// Makes sure the standby in `dir` (a queue's `standby/` directory) runs, following
    /// `primary` with `key`; returns what it runs on, by kind.
    pub async fn ensure(
        &self,
        queue_id: &str,
        launcher: StandbyLauncher,
    ) -> Result<BTreeMap<String, String>, FleetError> {
        let _changing = self.changing.lock().await;
        let running = {
            let running = self.running.lock().expect("never poisoned");
            running
                .get(queue_id)
                .map(|standby| (standby.primary == launcher.primary, standby.process.pid()))
        };
        let pid = match running {
            Some((true, pid)) => pid,
            moved => {
                if moved.is_some() {
                    self.stop(queue_id, &launcher.dir).await;
                }
                let child = match launcher.adopt().await {
                    Some(child) => {
                        tracing::info!(queue = %queue_id, pid = child.id(), "adopted a running standby");
                        child
                    }
                    None => launcher.launch().await?,
                };
                let pid = child.id();
                let standby = RunningStandby {
                    primary: launcher.primary.clone(),
                    process: Supervised::start(child, launcher.clone()),
                };
                let mut running = self.running.lock().expect("never poisoned");
                running.insert(queue_id.to_string(), standby);
                pid
            }
        };
        Ok(BTreeMap::from([
            (
                "standby_directory".to_string(),
                launcher.dir.display().to_string(),
            ),
            ("standby_process".to_string(), pid.to_string()),
        ]))
    }

    /// Stops queue `queue_id`'s standby (in `dir`), supervised here or left by a previous
    /// control plane. Safe to call for a queue that has none.
    pub async fn stop(&self, queue_id: &str, dir: &Path) {
        self.stop_within(queue_id, dir, STOP_WITHIN).await
    }

    /// Kills queue `queue_id`'s standby (in `dir`) at once, keeping its copy: a hung one
    /// answers no SIGTERM. [`LocalStandbys::ensure`] starts another on the copy. Under
    /// `changing`: never while a start or a promotion moves things.
    pub async fn kill(&self, queue_id: &str, dir: &Path) {
        let _changing = self.changing.lock().await;
        self.stop_within(queue_id, dir, Duration::ZERO).await
    }

    /// Stops it, giving it `grace` to stop by itself (none: killed).
    async fn stop_within(&self, queue_id: &str, dir: &Path, grace: Duration) {
        let standby = self
            .running
            .lock()
            .expect("never poisoned")
            .remove(queue_id);
        match standby {
            Some(standby) => standby.process.stop(grace).await,
            None => {
                if let Some(mut child) = running_in(dir) {
                    child.stop(grace).await;
                }
            }
        }
    }

    /// The queues whose standby is supervised here.
    pub fn supervised(&self) -> Vec<String> {
        let running = self.running.lock().expect("never poisoned");
        running.keys().cloned().collect()
    }

    /// Ends every supervision, leaving the standbys running (the next leader adopts them).
    pub fn let_go(&self) {
        for (_, standby) in self.running.lock().expect("never poisoned").drain() {
            standby.process.let_go();
        }
    }
}

/// Whether a node's data directory holds a log: its lineage, or a segment
/// (`dataplane/src/store/log/`). Only a directory that is not there holds none: one that
/// cannot be read may hold one.
fn holds_a_log(data: &Path) -> std::io::Result<bool> {
    let entries = match std::fs::read_dir(data.join("messages")) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name == "lineage" || name.ends_with(".log") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The prefix of what is left of a node's data directory after its copy replaced it, kept
/// beside it (`data.lost-MS`) until the queue's data is removed.
pub const LOST_DATA: &str = "data.lost-";

/// The file in a node's directory that says its standby's copy became its data and the
/// reconciler has not yet been told.
const PROMOTED_FILE: &str = "promoted";

/// Whether the standby of the node in `node_dir` was promoted and the promotion is not yet
/// recorded ([`promotion_recorded`]).
pub fn was_promoted(node_dir: &Path) -> std::io::Result<bool> {
    node_dir.join(PROMOTED_FILE).try_exists()
}

/// The promotion of the node in `node_dir`'s standby is recorded (audited, its epoch and
/// certificate generation moved on): the file that said so goes. Only after the record, so a
/// control plane stopped between the two records it again (the epoch moves on twice: no harm)
/// rather than never.
pub fn promotion_recorded(node_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(node_dir.join(PROMOTED_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Whether a node on `node_data` would start on the standby's copy (in `dir`): its own holds
/// no log and the copy does.
fn data_lost(node_data: &Path, dir: &Path) -> std::io::Result<bool> {
    Ok(!holds_a_log(node_data)? && holds_a_log(&data_dir(dir))?)
}

/// What a node keeps in its data directory that is not the queue's data but its own: its
/// rotated credential and its last config (`dataplane/src/control_plane/channel.rs`).
const NODE_OWN: [&str; 2] = ["node-token", "desired-config.json"];

impl LocalStandbys {
    /// Before queue `queue_id`'s node starts on `node_data`: if that holds no log (lost with
    /// its disk) while its standby's copy (in `dir`) does, the copy becomes the node's data.
    /// The standby is stopped first; it starts again on an empty directory (the reconciler's
    /// next pass) and catches up from the node. The node's own files that survived (its
    /// credential, its config) go with the copy; whatever else is left of its directory is
    /// kept aside (`data.lost-MS`), never removed here. Returns whether it did. A crash half
    /// way is finished by the next start: the copy holds its log until it is in place.
    ///
    /// `fence` runs first, under the same lock: it kills a node process still running on the
    /// lost directory (the lock keeps a node started on the copy from being taken for one).
    pub async fn promote_if_data_lost(
        &self,
        queue_id: &str,
        node_data: &Path,
        dir: &Path,
        fence: impl std::future::Future<Output = ()>,
    ) -> std::io::Result<bool> {
        let _changing = self.changing.lock().await;
        let copy = data_dir(dir);
        if !data_lost(node_data, dir)? {
            return Ok(false);
        }
        fence.await;
        self.stop(queue_id, dir).await;
        on_disk(|| put_in_place(&copy, node_data))?;
        Ok(true)
    }
}

/// Makes the standby's `copy` the node's data, keeping the node's own files and what is left
/// of `node_data` aside ([`LocalStandbys::promote_if_data_lost`]).
fn put_in_place(copy: &Path, node_data: &Path) -> std::io::Result<()> {
    // Said first, and kept on disk until the reconciler has audited it and replaced the
    // node's lost certificate ([`promotion_recorded`]): a control plane that stops meanwhile
    // leaves it for the next.
    if let Some(node_dir) = node_data.parent() {
        qe_shared::files::write_whole(&node_dir.join(PROMOTED_FILE), b"", 0o644)?;
    }
    for name in NODE_OWN {
        match std::fs::rename(node_data.join(name), copy.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    let aside = format!("{LOST_DATA}{}", qe_shared::clock::now_ms());
    match std::fs::rename(node_data, node_data.with_file_name(aside)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::rename(copy, node_data)?;
    qe_shared::files::sync_dir(node_data)?;
    qe_shared::files::sync_dir(copy)
}

/// Starts one queue's standby from its directory.
#[derive(Clone)]
pub struct StandbyLauncher {
    pub dataplane: PathBuf,
    /// `nodes/QUEUE-ID/standby/`: its pid file and log; its copy in `data/`.
    pub dir: PathBuf,
    pub primary: Primary,
    pub key: String,
}

impl StandbyLauncher {
    /// The one a previous control plane left running, if it follows this primary at this
    /// epoch; one that follows another is stopped.
    async fn adopt(&self) -> Option<NodeProcess> {
        let mut child = running_in(&self.dir)?;
        let follows = |argument: &[u8]| super::process::has_argument(child.id(), argument);
        let at_epoch = match self.primary.epoch_argument() {
            Some(argument) => follows(argument.as_bytes()),
            None => true,
        };
        if follows(self.primary.url.as_bytes()) && at_epoch {
            return Some(child);
        }
        child.stop(STOP_WITHIN).await;
        None
    }

    async fn start(&self) -> Result<NodeProcess, FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let log = on_disk(|| {
            std::fs::create_dir_all(&self.dir)?;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join("standby.log"))
        })
        .map_err(|e| fail(e.to_string()))?;
        let mut command = Command::new(&self.dataplane);
        command
            .arg("--standby-of")
            .arg(&self.primary.url)
            .arg("--data-dir")
            .arg(data_dir(&self.dir))
            .args(self.primary.epoch_argument())
            .env(KEY_VARIABLE, &self.key)
            .stdout(log.try_clone().map_err(|e| fail(e.to_string()))?)
            .stderr(log)
            // Its own process group: a Ctrl-C meant for the control plane does not reach it.
            .process_group(0);
        if let Some(connect) = self.primary.connect {
            command.arg("--standby-connect").arg(connect.to_string());
        }
        if let Some(roots) = &self.primary.roots {
            command.arg("--standby-ca").arg(roots);
        }
        // Named by itself before it runs (see `spawn_naming_itself`).
        let child =
            super::process::spawn_naming_itself(&mut command, &self.dir.join("standby.pid"))
                .map_err(|e| fail(format!("{}: {e}", self.dataplane.display())))?;
        let pid = child.id().unwrap_or(0);
        tracing::info!(pid, standby = %self.dir.display(), "started a standby");
        Ok(NodeProcess::Child(child))
    }
}

impl Launch for StandbyLauncher {
    fn launch(&self) -> impl std::future::Future<Output = Result<NodeProcess, FleetError>> + Send {
        self.start()
    }

    fn what(&self) -> &'static str {
        "a standby"
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Where a standby in `dir` keeps its copy of the log.
pub fn data_dir(dir: &Path) -> PathBuf {
    dir.join("data")
}

/// Whether a standby process runs now on `dir`'s copy.
pub fn runs_in(dir: &Path) -> bool {
    running_in(dir).is_some()
}

/// The standby process `dir`'s pid file names, if it runs now on that directory's copy.
fn running_in(dir: &Path) -> Option<NodeProcess> {
    super::process::adopt_from(&dir.join("standby.pid"), &data_dir(dir))
}
