//! Loopback ports for the local fleet's nodes, claimed against every other control plane on
//! the machine.
//!
//! A local node keeps its ports for good (a restart keeps its address: its name's records
//! point at them), so they are picked once and written in its directory (`local`). Between
//! a node's death and its restart nobody binds them, and another control plane on the same
//! machine (the tests run many at once) could pick one for a node of its own. The restarted
//! node then finds its port taken, and until it is moved the control plane forwards to the
//! other one's node, which answers as a stranger would (a 400 from a WebSocket port to an SQS
//! call).
//!
//! So every port a control plane gives a node is also claimed, for as long as it keeps that
//! node: an exclusive `flock` on `$TMPDIR/qe-local-ports/PORT`, which the kernel lets go when
//! the file is closed or the process ends, however it ends. A control plane picks only ports
//! nobody claims. A claim only keeps others from picking a port: the replicas of one control
//! plane share the nodes' directory, and a node's port read back from it stays the node's
//! whoever claims it. The files stay, empty, one for each port ever claimed (at most one for
//! each port of the range): removing a lock file while another process may be opening it
//! would let two claim the same port.

use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Where the ports [`PortClaims::pick`] picks from start.
const FIXED_PORTS_FROM: u16 = 10_000;

/// How many random ports a pick tries before it gives up.
const PICK_TRIES: usize = 50;

/// Who claimed a port before [`PortClaims::try_claim`] looked.
#[derive(Debug, PartialEq, Eq)]
enum Claim {
    /// Nobody: it is this control plane's now.
    New,
    /// This control plane, for one of its nodes.
    Ours,
    /// Another control plane.
    Elsewhere,
}

/// The ports one control plane claims.
pub(super) struct PortClaims {
    /// Where the claims of every control plane on this machine are.
    dir: PathBuf,
    /// The claims it holds: the lock of each lasts as long as its file is open.
    held: Mutex<HashMap<u16, File>>,
    /// Whether it said that claims cannot be kept here.
    said_unclaimable: AtomicBool,
}

impl PortClaims {
    pub fn new() -> PortClaims {
        PortClaims::in_dir(std::env::temp_dir().join("qe-local-ports"))
    }

    fn in_dir(dir: PathBuf) -> PortClaims {
        PortClaims {
            dir,
            held: Mutex::default(),
            said_unclaimable: AtomicBool::new(false),
        }
    }

    /// A port free on both loopback addresses now and claimed by nobody (this control plane
    /// included), claimed for this one.
    ///
    /// Picked at random below the kernel's range of ephemeral ports: a port the kernel hands
    /// out for a bind to port 0 (every test's listener, every outgoing connection) could be
    /// taken by another process between this choice and the node's start, and again at each
    /// restart.
    pub fn pick(&self) -> std::io::Result<u16> {
        let below = ephemeral_ports_start().filter(|start| *start > FIXED_PORTS_FROM + 1000);
        let random = std::iter::repeat_with(|| match below {
            Some(start) => {
                let span = u32::from(start - FIXED_PORTS_FROM);
                let pick = u32::from_le_bytes(qe_shared::random::bytes()) % span;
                FIXED_PORTS_FROM + pick as u16
            }
            // No range to keep below: the kernel's choice, checked like any other.
            None => 0,
        });
        self.pick_from(random.take(PICK_TRIES))
    }

    /// The first of `candidates` (0: any the kernel gives) that is free on both loopback
    /// addresses and that nobody claims, claimed.
    fn pick_from(&self, candidates: impl Iterator<Item = u16>) -> std::io::Result<u16> {
        let mut last_error = None;
        for wanted in candidates {
            let v4 = match std::net::TcpListener::bind(("127.0.0.1", wanted)) {
                Ok(v4) => v4,
                Err(error) => {
                    last_error = Some(error);
                    continue;
                }
            };
            let port = v4.local_addr()?.port();
            if let Err(error) = std::net::TcpListener::bind(("::1", port)) {
                last_error = Some(error);
                continue;
            }
            // Claimed and checked in one hold of its claims: two picks at once never get the
            // same port.
            if self.try_claim(port) != Claim::New {
                let why = format!("port {port} is claimed already");
                last_error = Some(std::io::Error::new(std::io::ErrorKind::AddrInUse, why));
                continue;
            }
            return Ok(port);
        }
        Err(last_error.unwrap_or_else(|| std::io::ErrorKind::AddrNotAvailable.into()))
    }

    /// Claims `port` (a node's, read back from its directory): false if another control
    /// plane claims it (one that gave it to a node of its own, or a replica that kept the
    /// same nodes before this one and has not let go yet).
    pub fn claim(&self, port: u16) -> bool {
        self.try_claim(port) != Claim::Elsewhere
    }

    /// Claims `port` if nobody does; says who held it before. Where claims cannot be kept at
    /// all (no writable temporary directory) every port reads as newly claimed, as before
    /// there were claims, and that is said once.
    fn try_claim(&self, port: u16) -> Claim {
        let mut held = self.held.lock().expect("never poisoned");
        if held.contains_key(&port) {
            return Claim::Ours;
        }
        let file = match self.open_claim(port) {
            Ok(file) => file,
            Err(error) => {
                if !self.said_unclaimable.swap(true, Ordering::Relaxed) {
                    let dir = self.dir.display();
                    tracing::warn!(%error, %dir, "the local fleet's ports cannot be claimed: another control plane on this machine could pick them");
                }
                return Claim::New;
            }
        };
        match file.try_lock() {
            Ok(()) => {
                held.insert(port, file);
                Claim::New
            }
            Err(TryLockError::WouldBlock) => Claim::Elsewhere,
            Err(TryLockError::Error(error)) => {
                tracing::warn!(%error, port, "a local node's port cannot be claimed");
                Claim::New
            }
        }
    }

    /// The lock file of `port`. The directory is everyone's, like `/tmp` (sticky: each
    /// removes only its own), since control planes of several users may share a machine; a
    /// file another user made is locked through a read-only descriptor (`flock` needs no
    /// more).
    fn open_claim(&self, port: u16) -> std::io::Result<File> {
        if !self.dir.is_dir() {
            std::fs::create_dir_all(&self.dir)?;
            // Best effort: only its maker can change it, and it works for them as it is.
            let everyone = std::fs::Permissions::from_mode(0o1777);
            let _ = std::fs::set_permissions(&self.dir, everyone);
        }
        let path = self.dir.join(port.to_string());
        let writable = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path);
        match writable {
            Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => File::open(&path),
            opened => opened,
        }
    }

    /// Lets the claim on `port` go, if it holds one.
    pub fn release(&self, port: u16) {
        self.held.lock().expect("never poisoned").remove(&port);
    }

    /// Lets every claim go: it keeps no node any more.
    pub fn release_all(&self) {
        self.held.lock().expect("never poisoned").clear();
    }
}

/// Whether `port` can be bound on 127.0.0.1 and ::1 now.
pub(super) fn free_on_both_loopbacks(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        && std::net::TcpListener::bind(("::1", port)).is_ok()
}

/// The first port the kernel gives out for a bind to port 0
/// (`/proc/sys/net/ipv4/ip_local_port_range`).
fn ephemeral_ports_start() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_port_is_free_on_both_loopbacks_and_never_an_ephemeral_one() {
        let dir = tempfile::tempdir().unwrap();
        let claims = PortClaims::in_dir(dir.path().to_path_buf());
        let start = ephemeral_ports_start().expect("Linux says its range");
        for _ in 0..20 {
            let port = claims.pick().unwrap();
            // Another process's bind to port 0 cannot be given it before the node binds it.
            assert!((FIXED_PORTS_FROM..start).contains(&port), "{port}");
            std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
            std::net::TcpListener::bind(("::1", port)).unwrap();
        }
    }

    /// Two control planes on one machine: what one gave a node, the other never picks, while
    /// nothing is bound on it (the node's restart); once the first lets it go (its node
    /// stopped, or the process ended: the file is closed either way), it is free to claim.
    #[test]
    fn a_port_one_control_plane_claims_is_never_picked_by_another() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("claims");
        let first = PortClaims::in_dir(dir.clone());
        let second = PortClaims::in_dir(dir.clone());
        let given = first.pick().unwrap();
        // Made for every user of the machine, like /tmp.
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o1777);
        let other = second.pick().unwrap();
        assert_ne!(given, other);

        // The first's port is free on both loopbacks, yet the second passes over it.
        assert!(free_on_both_loopbacks(given));
        assert_ne!(second.pick_from([given, 0].into_iter()).unwrap(), given);
        assert!(!second.claim(given));
        // The first reads its own port back from the node's directory.
        assert!(first.claim(given));

        first.release(given);
        assert!(second.claim(given));
        drop(second);
        assert!(first.claim(given), "a claim ends with its holder");
    }

    /// Where no claim can be kept, ports are still picked and read back, as before claims.
    #[test]
    fn without_a_usable_directory_every_claim_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("a-file");
        std::fs::write(&not_a_dir, "").unwrap();
        let claims = PortClaims::in_dir(not_a_dir);
        let port = claims.pick().unwrap();
        assert!(claims.claim(port));
        assert!(PortClaims::in_dir(dir.path().join("a-file")).claim(port));
    }

    /// Its own nodes' ports are not given out twice either.
    #[test]
    fn a_port_it_gave_one_node_is_not_picked_for_another() {
        let dir = tempfile::tempdir().unwrap();
        let claims = PortClaims::in_dir(dir.path().to_path_buf());
        let given = claims.pick().unwrap();
        let error = claims.pick_from([given].into_iter()).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
    }
}
