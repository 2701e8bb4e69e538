//! A standby node (`dataplane --standby-of`) beside a test's primary: it serves nothing, so it
//! is started here rather than as a [`Node`]; killed on drop.

use crate::{dataplane_binary, log_level, Log, Node};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

/// The replication key the tests give both sides.
pub const KEY: &str = "test-replication-key";

pub struct Standby {
    child: Child,
    /// Its data directory (the copy of the primary's log is `messages/` in it).
    pub data_dir: tempfile::TempDir,
    log: Arc<Log>,
}

impl Standby {
    /// The standby of `primary` (started with `--replication-key KEY`), giving `key`.
    pub fn start(primary: &Node, key: &str) -> Standby {
        Standby::start_in(primary, key, tempfile::tempdir().unwrap())
    }

    /// The same, on an existing data directory (a standby that comes back).
    pub fn start_in(primary: &Node, key: &str, data_dir: tempfile::TempDir) -> Standby {
        Standby::launch(&primary.url(), key, data_dir, &[])
    }

    /// The standby of the primary at `url`, with `extra` flags.
    pub fn launch(url: &str, key: &str, data_dir: tempfile::TempDir, extra: &[&str]) -> Standby {
        let mut child = Command::new(dataplane_binary())
            .args(["--standby-of", url])
            .args(["--replication-key", key])
            .args(extra)
            .arg("--data-dir")
            .arg(data_dir.path())
            .env("RUST_LOG", log_level())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the standby");
        let log = Log::follow(child.stderr.take().unwrap());
        Standby {
            child,
            data_dir,
            log,
        }
    }

    /// Kills it with SIGKILL and waits for it to go; its data directory stays.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops it (SIGSTOP), as a standby whose machine stalls: it takes nothing and answers
    /// nothing until [`Standby::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Sends it SIGTERM and waits for it to exit: its exit status, or None if it had not
    /// exited within `within`.
    pub fn terminate(&mut self, within: std::time::Duration) -> Option<std::process::ExitStatus> {
        self.signal("-TERM");
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            // A child's exit has no event a test can await short of blocking in wait(2).
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success(), "kill {signal}");
    }

    /// Kills it and hands over its data directory (to start a node on: the promotion).
    pub fn into_data_dir(mut self) -> tempfile::TempDir {
        self.kill();
        std::mem::replace(&mut self.data_dir, tempfile::tempdir().unwrap())
    }

    /// Waits until its log contains `needle`.
    pub fn wait_for_log(&self, needle: &str) -> String {
        self.log
            .wait_until(&format!("{needle:?}"), |text| text.contains(needle))
    }

    /// Waits until its log contains `needle` `times` times in all.
    pub fn wait_for_log_count(&self, needle: &str, times: usize) {
        self.log
            .wait_until(&format!("{needle:?} × {times}"), |text| {
                text.matches(needle).count() >= times
            });
    }

    pub fn log(&self) -> String {
        self.log.lock().clone()
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- standby log ---\n{}", self.log());
        }
    }
}

/// What the primary logs when a standby has caught up (durability 2 counts on it from then).
pub const IN_SYNC: &str = "the standby is in sync";

/// Waits until `primary` has logged a standby in sync `times` times in all.
pub fn wait_in_sync(primary: &Node, times: usize) {
    primary
        .stderr()
        .wait_until(&format!("{IN_SYNC:?} × {times}"), |text| {
            text.matches(IN_SYNC).count() >= times
        });
}
