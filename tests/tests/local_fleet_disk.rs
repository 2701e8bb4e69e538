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

/// One worker: work that blocked it would leave no thread for any other task.
fn one_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Whether a task spawned now runs, while another waits on the held disk.
fn another_task_runs(runtime: &tokio::runtime::Runtime) -> bool {
    let (ran, probe_ran) = mpsc::channel();
    runtime.spawn(async move { ran.send(()) });
    probe_ran.recv_timeout(PROMPT).is_ok()
}

#[test]
fn a_node_start_waiting_on_a_held_disk_leaves_the_runtime_free() {
    let disk = FailingSyncs::mount();
    let dir = tempfile::tempdir_in(disk.dir()).unwrap();
    let runtime = one_worker_runtime();
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

    let held = disk.hold();
    let (started, start_ended) = mpsc::channel();
    runtime.spawn(async move {
        let placed = provider.ensure(&queue, &bootstrap).await;
        let _ = started.send(placed.map(|_| ()));
    });
    disk.wait_for_held();
    assert!(
        another_task_runs(&runtime),
        "another task runs while a node's start waits on the disk"
    );
    assert!(
        start_ended.try_recv().is_err(),
        "the start waits for its write"
    );

    drop(held);
    let ended = start_ended
        .recv_timeout(PROMPT)
        .expect("the start goes on once the disk is back");
    assert!(
        matches!(&ended, Err(FleetError::Start(why)) if why.contains("exited")),
        "{ended:?}"
    );
}

#[test]
fn a_whole_file_written_on_a_held_disk_leaves_the_runtime_free() {
    let disk = FailingSyncs::mount();
    let dir = tempfile::tempdir_in(disk.dir()).unwrap();
    let runtime = one_worker_runtime();
    let path = dir.path().join("desired-config.json");

    let held = disk.hold();
    let (written, write_ended) = mpsc::channel();
    let kept = path.clone();
    runtime.spawn(async move {
        let _ = written.send(qe_shared::files::write_private(&kept, b"{\"version\":7}"));
    });
    disk.wait_for_held();
    assert!(
        another_task_runs(&runtime),
        "another task runs while a file is written whole on the held disk"
    );
    assert!(
        write_ended.try_recv().is_err(),
        "the write waits for the disk"
    );

    drop(held);
    write_ended
        .recv_timeout(PROMPT)
        .expect("the write goes on once the disk is back")
        .expect("and is written");
    assert_eq!(std::fs::read(&path).unwrap(), b"{\"version\":7}");
}
