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
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub struct LocalProvider {
    dataplane: PathBuf,
    /// Each queue's node lives in `nodes/QUEUE-ID/` here.
    dir: PathBuf,
    running: Mutex<HashMap<String, Child>>,
}

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
        // Keep reading, so the node never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.running
            .lock()
            .expect("never poisoned")
            .insert(queue.id.clone(), child);
        Ok(format!("ws://{addr}/"))
    }
}

impl Provider for LocalProvider {
    fn start<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<String, FleetError>> {
        self.start_node(queue).boxed()
    }

    fn stop<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, ()> {
        async move {
            let child = self
                .running
                .lock()
                .expect("never poisoned")
                .remove(queue_id);
            if let Some(mut child) = child {
                let _ = child.kill().await;
            }
        }
        .boxed()
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
