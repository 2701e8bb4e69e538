//! A real Knot DNS (Debian's `knot`, `knotd`) as a secondary of our zone: its own temporary
//! directory and config, run in the foreground, killed on drop (its log printed if the test
//! failed). It transfers the zone from the primary it is given and takes NOTIFY from
//! 127.0.0.1 (with a TSIG key, signed with it both ways); it logs each transfer and NOTIFY,
//! which [`Knot::wait_for_log`] waits on.

use crate::{Log, PROMPT};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

/// What Knot logs once it serves (its zones load after).
const STARTED: &str = "server started in the foreground";

/// A running `knotd`; killed on drop.
pub struct Knot {
    child: Child,
    /// Where it answers, UDP and TCP.
    pub addr: SocketAddr,
    /// Its config, control socket and zone data; removed on drop.
    _dir: tempfile::TempDir,
    /// Everything it wrote to stderr.
    log: Arc<Log>,
}

impl Knot {
    /// A secondary for `zone` at `addr` (UDP and TCP there must be free), transferring it from
    /// `primary`. It holds the zone in memory only: no zone file written, no journal.
    pub fn secondary(zone: &str, primary: SocketAddr, addr: SocketAddr) -> Knot {
        Knot::start(zone, primary, addr, None)
    }

    /// As [`Knot::secondary`], signing its requests to `primary` with the TSIG key `key`
    /// (`(name, base64 secret)`, HMAC-SHA256), requiring its answers and the NOTIFYs it takes
    /// to be signed with it too.
    pub fn signed_secondary(
        zone: &str,
        primary: SocketAddr,
        addr: SocketAddr,
        key: (&str, &str),
    ) -> Knot {
        Knot::start(zone, primary, addr, Some(key))
    }

    fn start(zone: &str, primary: SocketAddr, addr: SocketAddr, key: Option<(&str, &str)>) -> Knot {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().display();
        // Knot writes an address's port after `@`.
        let at = |addr: SocketAddr| format!("{}@{}", addr.ip(), addr.port());
        let (keys, use_key) = match key {
            Some((name, secret)) => (
                format!("key:\n  - id: {name}\n    algorithm: hmac-sha256\n    secret: {secret}\n"),
                format!("    key: {name}\n"),
            ),
            None => (String::new(), String::new()),
        };
        let config = format!(
            "server:\n  listen: {listen}\n  rundir: {path}\n\
             database:\n  storage: {path}\n\
             log:\n  - target: stderr\n    any: info\n\
             {keys}\
             remote:\n  - id: primary\n    address: {primary}\n{use_key}\
             acl:\n  - id: notify_from_primary\n    address: 127.0.0.1\n    action: notify\n{use_key}\
             zone:\n  - domain: {zone}\n    master: primary\n    acl: notify_from_primary\n\
             \x20   zonefile-sync: -1\n    zonefile-load: none\n    journal-content: none\n",
            listen = at(addr),
            primary = at(primary),
        );
        let config_file = dir.path().join("knot.conf");
        std::fs::write(&config_file, config).unwrap();
        let mut child = Command::new(knotd())
            .arg("--config")
            .arg(&config_file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("knotd (apt-get install knot; ./scripts/test does)");
        let log = Log::follow(child.stderr.take().unwrap());
        let knot = Knot {
            child,
            addr,
            _dir: dir,
            log,
        };
        knot.wait_for_log(STARTED, 1);
        knot
    }

    /// Waits until its log contains `needle` `times` times in all; returns the log.
    pub fn wait_for_log(&self, needle: &str, times: usize) -> String {
        let what = format!("{needle:?} {times} times (knotd, within {PROMPT:?})");
        self.log
            .wait_until(&what, |text| text.matches(needle).count() >= times)
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().clone()
    }
}

impl Drop for Knot {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- knotd log ---\n{}", self.log());
        }
    }
}

/// `knotd`, in /usr/sbin where Debian puts it, which a user's PATH may lack.
fn knotd() -> PathBuf {
    let sbin = PathBuf::from("/usr/sbin/knotd");
    if sbin.exists() {
        sbin
    } else {
        PathBuf::from("knotd")
    }
}
