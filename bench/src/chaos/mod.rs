//! `bench chaos`: faults on purpose under load (issue 28). A three-member etcd, three
//! control-plane replicas on the documented config with the control plane's default timings,
//! local nodes, and on every queue a publisher (durability 2) and a subscriber throughout,
//! with an API prober beside them. Then, in order, each followed by a settle: the
//! control-plane leader SIGKILLed (and started again), the etcd leader SIGKILLed (and started
//! again), one queue's node SIGSTOPped for longer than the silence limit, and a replica that
//! does not lead restarted. The table gives, per fault: connections cut, how long each queue
//! could not publish, the API's 503s, and acknowledged messages lost or delivered twice;
//! then each target of the issue, met or missed.
//!
//! - `etcd`: the etcd cluster.
//! - `replicas`: the control plane's replicas, their configs and logs, and who leads.
//! - `api`: the run's own calls to the API (create a queue, read it).
//! - `clients`: the publishers, subscribers and the API prober, and what each counted.
//! - `faults`: each fault in turn, what it waits for, and its window.
//! - `report`: the windows, the table and the targets.
//! - `reaper`: every process the run started ends with it.
//!
//! docs/resilience.md describes the run and holds its measurements.

mod api;
mod clients;
mod etcd;
mod faults;
mod reaper;
mod replicas;
mod report;

use api::Operator;
use clients::{Board, Clients, Pace, Target};
use etcd::EtcdCluster;
use faults::Chaos;
use replicas::{Replicas, Tuning};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The control plane's defaults the silence limit is made of (controlplane/src/config.rs,
/// `live_stats_secs` and `replace_silent_after_intervals`).
const DEFAULT_LIVE_STATS_SECS: u64 = 10;
const DEFAULT_SILENT_AFTER_INTERVALS: u64 = 6;

#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// The control plane binary (a release build).
    #[arg(long, default_value = "target/release/controlplane")]
    controlplane: String,
    /// The etcd binary (Debian's etcd-server, 3.4).
    #[arg(long, default_value = "etcd")]
    etcd: String,
    /// Queues, each with a publisher and a subscriber.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=16))]
    queues: u64,
    /// Publishes a second per queue (one in flight at a time).
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Each subscriber's capacity.
    #[arg(long, default_value_t = 8)]
    capacity: u32,
    /// Seconds of load before the first fault.
    #[arg(long, default_value_t = 10)]
    baseline_secs: u64,
    /// Seconds a killed leader (replica or etcd member) stays down before it is started again.
    #[arg(long, default_value_t = 15)]
    down_secs: u64,
    /// Seconds after each fault's recovery before the next fault.
    #[arg(long, default_value_t = 15)]
    settle_secs: u64,
    /// Seconds to wait before the node's SIGSTOP. How soon a stopped node is replaced
    /// depends on where the SIGSTOP falls between the leader's looks at every queue (every
    /// `reconcile_every_secs`) and the node's reports (every `live_stats_secs`); the run's
    /// fixed schedule fixes that phase, and this moves it.
    #[arg(long, default_value_t = 0)]
    stop_delay_secs: u64,
    /// Leave the run's directory (configs, every log, the nodes' data) under --data-root.
    #[arg(long)]
    keep: bool,
    /// `[store] lease_secs` (default: the control plane's, 5).
    #[arg(long)]
    lease_secs: Option<u64>,
    /// `[store] timeout_secs` (default: the control plane's, 5).
    #[arg(long)]
    timeout_secs: Option<u64>,
    /// `live_stats_secs` (default: the control plane's, 10).
    #[arg(long)]
    live_stats_secs: Option<u64>,
    /// `replace_silent_after_intervals` (default: the control plane's, 6).
    #[arg(long)]
    replace_silent_after_intervals: Option<u64>,
    /// `reconcile_every_secs` (default: the control plane's, 30).
    #[arg(long)]
    reconcile_every_secs: Option<u64>,
}

impl Settings {
    fn tuning(&self) -> Tuning {
        Tuning {
            lease_secs: self.lease_secs,
            timeout_secs: self.timeout_secs,
            live_stats_secs: self.live_stats_secs,
            replace_silent_after_intervals: self.replace_silent_after_intervals,
            reconcile_every_secs: self.reconcile_every_secs,
        }
    }

    /// How long a node may go unheard before it is replaced.
    fn silence_limit(&self) -> Duration {
        let every = self.live_stats_secs.unwrap_or(DEFAULT_LIVE_STATS_SECS);
        let intervals = self
            .replace_silent_after_intervals
            .unwrap_or(DEFAULT_SILENT_AFTER_INTERVALS);
        Duration::from_secs(every * intervals)
    }
}

/// Runs the faults and prints the table; whether every target was met. Ctrl-C ends the run
/// and everything it started.
pub async fn chaos(settings: &Settings, dataplane: &Path, data_root: &Path) -> bool {
    let passed = tokio::select! {
        passed = run(settings, dataplane, data_root) => Some(passed),
        _ = tokio::signal::ctrl_c() => None,
    };
    // The run's future is gone by now, and every process and directory it owned with it.
    passed.unwrap_or_else(|| {
        println!("interrupted: everything the run started was stopped");
        std::process::exit(130)
    })
}

async fn run(settings: &Settings, dataplane: &Path, data_root: &Path) -> bool {
    let began = Instant::now();
    let controlplane = std::fs::canonicalize(&settings.controlplane)
        .unwrap_or_else(|e| panic!("{}: {e} (build it first)", settings.controlplane));
    // Absolute: the nodes' command lines name their bootstraps by it, and are found by it.
    let root = std::fs::canonicalize(data_root).expect("the data root");
    let dir = tempfile::Builder::new()
        .prefix("chaos.")
        .disable_cleanup(settings.keep)
        .tempdir_in(root)
        .expect("a directory for the run");
    let etcd = EtcdCluster::start(&settings.etcd, &dir.path().join("etcd"), 3);
    let replicas = Replicas::start(
        &controlplane,
        dataplane,
        dir.path(),
        &etcd.endpoints(),
        3,
        &settings.tuning(),
    );
    let named = |prefix: &str, urls: Vec<String>| {
        let named: Vec<String> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| format!("{prefix}{i} {url}"))
            .collect();
        named.join(", ")
    };
    let apis = replicas.apis.iter().map(|api| format!("http://{api}"));
    println!(
        "etcd: {}\nreplicas: {}\nsilence limit {} s",
        named("m", etcd.endpoints()),
        named("r", apis.collect()),
        settings.silence_limit().as_secs()
    );
    let operator = Operator::new();
    let (targets, ids) = create_queues(&operator, &replicas, settings.queues as usize).await;
    let board = Arc::new(Board::new(ids.len(), replicas.running()));
    let pace = Pace {
        rate: settings.rate,
        capacity: settings.capacity,
    };
    println!(
        "{} queues, each with a publisher (durability 2, one in flight, {} a second at most) and \
         a subscriber (capacity {}); an API prober every {:?}; set up in {:.1} s",
        ids.len(),
        settings.rate,
        settings.capacity,
        clients::PROBE_EVERY,
        began.elapsed().as_secs_f64()
    );
    let clients = Clients::start(board.clone(), targets, pace, ids[0].clone());
    let mut chaos = Chaos {
        settings,
        loaded: Instant::now(),
        etcd,
        replicas,
        operator,
        board,
        ids,
        windows: Vec::new(),
    };
    chaos.baseline().await;
    chaos.kill_leader().await;
    chaos.kill_etcd_leader().await;
    chaos.stop_node().await;
    chaos.restart_replica().await;
    chaos.drain(clients).await;
    let passed = report::report(&chaos.board, &chaos.windows);
    print_log_counts(&chaos.replicas);
    println!(
        "\nthe run took {:.0} s{}",
        began.elapsed().as_secs_f64(),
        match settings.keep {
            true => format!("; kept {}", dir.path().display()),
            false => String::new(),
        }
    );
    passed
}

/// Creates `count` queues through the leader and waits until each runs; their clients'
/// targets, and their ids.
async fn create_queues(
    operator: &Operator,
    replicas: &Replicas,
    count: usize,
) -> (Vec<Target>, Vec<String>) {
    let api = replicas.apis[0];
    let mut created = Vec::new();
    for _ in 0..count {
        let queue = operator.create_queue(api).await;
        created.push(queue.unwrap_or_else(|e| panic!("POST /v1/queues: {e}")));
    }
    let mut targets = Vec::new();
    let mut ids = Vec::new();
    for (index, queue) in created.into_iter().enumerate() {
        let id = queue["id"].as_str().expect("an id").to_string();
        let running = operator.wait_running(api, &id).await;
        let running = running.unwrap_or_else(|e| panic!("{e}"));
        let url = running["node"].as_str().expect("its node").to_string();
        targets.push(Target {
            index,
            url,
            publisher: queue["logins"]["publisher"].clone(),
            subscriber: queue["logins"]["subscriber"].clone(),
        });
        ids.push(id);
    }
    (targets, ids)
}

/// How many times the replicas' logs (every start of each) say what matters here.
fn print_log_counts(replicas: &Replicas) {
    println!();
    for needle in [
        ": leading",
        "no longer leading",
        "adopted a running node",
        "started a node",
        "restarting a node",
        "its node was restarted",
        "its node is not heard from",
        "a silent node was replaced",
        "an adopted node exited",
        "a node exited",
    ] {
        println!(
            "replicas' logs: {:>3} x {needle:?}",
            replicas.grep(needle).len()
        );
    }
}
