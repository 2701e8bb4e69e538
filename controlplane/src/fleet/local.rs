//! The local provider: one `dataplane` process per queue on this machine, each with its own
//! port and data directory, started from a config file the control plane writes (logins as
//! hashes only).

use super::{FleetError, Provider};
use crate::queues::{Queue, StoredLogin, Tier};
use futures::future::BoxFuture;
use futures::FutureExt;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::broadcast;

pub struct LocalProvider {
    dataplane: PathBuf,
    /// Each queue's node lives in `nodes/QUEUE-ID/` here.
    dir: PathBuf,
    running: Mutex<HashMap<String, RunningNode>>,
}

/// A node this provider started.
struct RunningNode {
    child: Child,
    /// What the node prints on stdout, line by line (it says `logins reloaded` there).
    lines: broadcast::Sender<String>,
}

/// How long a node may take to confirm new logins.
const RELOAD_WITHIN: Duration = Duration::from_secs(5);

impl LocalProvider {
    pub fn new(dataplane: PathBuf, dir: PathBuf) -> LocalProvider {
        LocalProvider {
            dataplane,
            dir,
            running: Mutex::default(),
        }
    }

    async fn start_node(&self, queue: &Queue) -> Result<String, FleetError> {
        let fail = |what: String| FleetError::Start(what);
        let dir = self.dir.join("nodes").join(&queue.id);
        std::fs::create_dir_all(&dir).map_err(|e| fail(e.to_string()))?;
        let config = dir.join("node.toml");
        std::fs::write(&config, node_config(queue, &dir)).map_err(|e| fail(e.to_string()))?;
        let log = std::fs::File::create(dir.join("node.log")).map_err(|e| fail(e.to_string()))?;
        let mut child = Command::new(&self.dataplane)
            .arg("--config")
            .arg(&config)
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
                    return Err(fail(format!(
                        "the node exited; see {}",
                        dir.join("node.log").display()
                    )))
                }
            }
        };
        // Keep reading, so the node never blocks on a full pipe, and pass the lines on.
        let (sender, _) = broadcast::channel(16);
        let forward = sender.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = forward.send(line);
            }
        });
        let node = RunningNode {
            child,
            lines: sender,
        };
        self.running
            .lock()
            .expect("never poisoned")
            .insert(queue.id.clone(), node);
        Ok(format!("ws://{addr}/"))
    }

    async fn reload(&self, queue: &Queue) -> Result<(), FleetError> {
        let fail = |what: String| FleetError::Reload(what);
        let dir = self.dir.join("nodes").join(&queue.id);
        let (pid, mut lines) = {
            let running = self.running.lock().expect("never poisoned");
            let node = running
                .get(&queue.id)
                .ok_or_else(|| fail("it is not running".into()))?;
            (
                node.child.id().ok_or_else(|| fail("it exited".into()))?,
                node.lines.subscribe(),
            )
        };
        let config = node_config(queue, &dir);
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
        async move {
            let node = self
                .running
                .lock()
                .expect("never poisoned")
                .remove(queue_id);
            if let Some(mut node) = node {
                let _ = node.child.kill().await;
            }
        }
        .boxed()
    }

    fn reload_logins<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        self.reload(queue).boxed()
    }
}

/// The node's config file: what the control plane decides for it.
fn node_config(queue: &Queue, dir: &std::path::Path) -> String {
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
        "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\nplaintext = true\ntier = \"{tier}\"\n\
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
