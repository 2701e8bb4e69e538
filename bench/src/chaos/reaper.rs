//! Every process the run starts ends with it. The etcd members and the replicas are killed
//! by their owners' `Drop`; the nodes, which the replicas start in process groups of their
//! own and which outlive a replica by design, by their command lines (a bootstrap under the
//! run's nodes directory). A panic aborts (no destructor runs), so a panic hook kills
//! everything registered here too.

pub(crate) use crate::controlplane_load::process::kill_nodes;
use crate::controlplane_load::process::signal;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

/// The etcd members and replicas running now.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The directory whose `nodes/ID/bootstrap.toml` name the nodes to kill.
static NODES: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Registers a process the run started.
pub fn started(pid: u32) {
    kill_on_panic();
    lock(&RUNNING).push(pid);
}

/// Forgets a process that has ended (its pid may be another's from now on).
pub fn ended(pid: u32) {
    lock(&RUNNING).retain(|running| *running != pid);
}

/// Registers the local provider's directory: its nodes are killed on a panic.
pub fn nodes_under(dir: &Path) {
    kill_on_panic();
    *lock(&NODES) = Some(dir.to_path_buf());
}

fn kill_on_panic() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |panic| {
            report(panic);
            for pid in lock(&RUNNING).iter() {
                signal(*pid, libc::SIGKILL);
            }
            if let Some(dir) = lock(&NODES).as_ref() {
                kill_nodes(dir);
            }
        }));
    });
}

/// A lock that a panic elsewhere does not keep from the panic hook.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
