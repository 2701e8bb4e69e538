//! The local fleet on a disk that stalls: starting a node writes its files (its port, its
//! bootstrap, its pid, its log) on the control plane's data disk, and while that disk holds
//! every write the start waits, but the runtime's other tasks (the API, health checks, DNS)
//! go on. Before, those writes ran on the runtime's workers: two nodes started while the disk
//! was held left a two-worker control plane answering nothing, not even `/healthz`
//! (`api_conventions::a_stalled_disk_delays_the_writes_only_never_the_api`, now and then).
//! Needs root for FUSE, as CI has.

use controlplane::fleet::local::LocalProvider;
use controlplane::fleet::{FleetError, Provider};
use controlplane::model::queue::{self, NewQueue};
use qe_shared::node_channel::Bootstrap;
use qe_tests::disks::FailingSyncs;
use qe_tests::PROMPT;
use std::sync::mpsc;
use std::sync::Arc;

#[test]
fn a_node_start_waiting_on_a_held_disk_leaves_the_runtime_free() {
    let disk = FailingSyncs::mount();
    let dir = tempfile::tempdir_in(disk.dir()).unwrap();
    // One worker: a start that blocked it would leave no thread for any other task.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
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
    let (ran, probe_ran) = mpsc::channel();
    runtime.spawn(async move { ran.send(()) });
    probe_ran
        .recv_timeout(PROMPT)
        .expect("another task runs while a node's start waits on the disk");
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
