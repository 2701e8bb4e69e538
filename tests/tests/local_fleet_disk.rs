//! Files written on a disk that stalls, from a runtime's worker. While the disk holds every
//! write the writer waits, but the runtime's other tasks go on.
//!
//! - The local fleet: starting a node writes its files (its port, its bootstrap, its pid, its
//!   log) on the control plane's data disk. Before, those writes ran on the runtime's
//!   workers: two nodes started while the disk was held left a two-worker control plane
//!   answering nothing, not even `/healthz`
//!   (`api_conventions::a_stalled_disk_delays_the_writes_only_never_the_api`, now and then).
//! - A file written whole (`qe_shared::files::write_whole`): a node keeps each config and
//!   rotated credential its control plane sends, and its renewed certificate, so. Before, a
//!   node doing that on a stalled disk stopped serving every connection its worker ran, at
//!   durability 0 too.
//!
//! Needs root for FUSE, as CI has.

use controlplane::fleet::local::LocalProvider;
use controlplane::fleet::{FleetError, Provider};
use controlplane::model::queue::{self, NewQueue};
use qe_shared::node_channel::Bootstrap;
use qe_tests::disks::FailingSyncs;
use qe_tests::PROMPT;
use std::sync::mpsc;
use std::sync::Arc;

/// Runs `work` on a runtime of one worker while `disk` holds every write, and checks that
/// another task runs meanwhile (one worker: work that blocked it would leave no thread for
/// any other task) and that `work` waits for the disk; then lets the disk go and returns what
/// `work` gave. `what` names the work in the failures.
fn while_held<T: Send + 'static>(
    disk: &FailingSyncs,
    what: &str,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let held = disk.hold();
    let (done, work_ended) = mpsc::channel();
    runtime.spawn(async move {
        let _ = done.send(work.await);
    });
    disk.wait_for_held();
    let (ran, probe_ran) = mpsc::channel();
    runtime.spawn(async move { ran.send(()) });
    probe_ran
        .recv_timeout(PROMPT)
        .unwrap_or_else(|_| panic!("another task runs while {what} waits on the disk"));
    assert!(work_ended.try_recv().is_err(), "{what} waits for the disk");

    drop(held);
    work_ended
        .recv_timeout(PROMPT)
        .unwrap_or_else(|_| panic!("{what} goes on once the disk is back"))
}

#[test]
fn a_node_start_waiting_on_a_held_disk_leaves_the_runtime_free() {
    let disk = FailingSyncs::mount();
    let dir = tempfile::tempdir_in(disk.dir()).unwrap();
    // A "node" that exits at once: the start ends in an error of its own once the disk
    // is back, and leaves no process behind.
    let provider = Arc::new(LocalProvider::new(
        "/bin/true".into(),
        dir.path().to_path_buf(),
        None,
    ));
    let new: NewQueue =
        serde_json::from_str(r#"{"tier":"devtest","region":"local","instance_type":"local"}"#)
            .unwrap();
    let (queue, _) = queue::create(new);
    let bootstrap = Bootstrap {
        control_plane: "http://127.0.0.1:9".into(),
        control_planes: Vec::new(),
        queue_id: queue.id.clone(),
        node_token: "token".into(),
        bootstrap_token: None,
        control_plane_ca_pem: None,
    };

    let ended = while_held(&disk, "a node's start", async move {
        provider.ensure(&queue, &bootstrap).await.map(|_| ())
    });
    assert!(
        matches!(&ended, Err(FleetError::Start(why)) if why.contains("exited")),
        "{ended:?}"
    );
}

#[test]
fn a_whole_file_written_on_a_held_disk_leaves_the_runtime_free() {
    let disk = FailingSyncs::mount();
    let dir = tempfile::tempdir_in(disk.dir()).unwrap();
    let path = dir.path().join("desired-config.json");
    let kept = path.clone();
    let written = while_held(&disk, "a file written whole", async move {
        qe_shared::files::write_private(&kept, b"{\"version\":7}")
    });
    written.expect("written once the disk is back");
    assert_eq!(std::fs::read(&path).unwrap(), b"{\"version\":7}");
}
