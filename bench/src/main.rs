//! `bench`: measures a real `dataplane` node over real WebSocket connections.
//!
//! It starts the release node itself, pinned to one core (`taskset -c SERVER_CPU`); run the
//! bench pinned to the other (`taskset -c 1 target/release/bench ...`). See docs/performance.md.
//!
//! - `bench run`: workloads W1 (1 publisher, 1 subscriber, one message in flight), W4 (16
//!   publishers, one in flight each, 4 subscribers), W5 (16 publishers pipelining 64 each with
//!   `context`, 16 subscribers of capacity 64), W6 (the same with 16 in flight and capacity
//!   16), for each body size and durability. Every id a
//!   publisher was given must reach a subscriber exactly once.
//!   With `--preload N`, N live messages (delayed) are stored first, so that the run's churn
//!   makes the node compact segments full of them while it is measured (latency under
//!   compaction).
//! - `bench recovery`: stores N messages, kills the node with SIGKILL, restarts it, and times
//!   how long it takes to serve again.
//! - `bench bulk`: purge and redrive (the node's commands beyond the manual) of N stored
//!   messages, a purge of a few beside many, and the restarts after them.
//! - `bench connections`: the node's memory per idle connection, before and after the login,
//!   and publish-to-delivery latency with many subscribers in the line.
//! - `bench peers`: the same workloads on our node, NATS JetStream, Redis Streams and
//!   RabbitMQ, each server started here pinned like the node, in one table, under the two
//!   limits (serial fdatasync, WebSocket echo). `scripts/bench-peers` installs and runs it.
//! - `bench controlplane-load`: the real control plane on loopback under many unauthenticated
//!   clients (HTTP and DNS) while an operator creates and deletes queues: the operator's and a
//!   resolver's latency, the control plane's memory and CPU. See docs/controlplane-load.md.
//! - `bench live-metrics`: a control plane holding 1,000 queues (restored from a generated
//!   backup) and the live reports of their nodes: its CPU per report and the `/metrics`
//!   scrape's size and cost.
//! - `bench stalls`: many 5-second runs of 16 publishers with one durability-2 (then 1)
//!   publish in flight each, on one long-lived node, new connections each run: rates against
//!   their median, the worst publish reply, the log's writer and syncer latencies.
//! - `bench sqs-sdk`: SQS throughput through Amazon's Rust SDK against a node's SQS face
//!   (scripts/bench-sqs runs it beside boto3's). See docs/sqs.md.
//! - `bench ec2-pass`: the EC2 calls and time of the reconciler's look at every queue with N
//!   queues in moto, each queue looked at on its own and after a survey of the fleet.
//! - `bench store-bytes`: one queue's usage and stats records in the control plane's store
//!   over months, with and without the leader's roll-ups: bytes per queue-month.
//! - `bench dedup`: what deduplication ids cost: the node's memory per id held (against the
//!   claimed `ENTRY_BYTES`), and publish throughput and CPU with distinct ids, without, and
//!   for repeats, at durability 0 and 2.
//! - `bench chaos`: a three-member etcd, three control-plane replicas and their local nodes,
//!   with clients publishing (durability 2) and consuming on every queue, while it kills the
//!   control-plane leader, kills the etcd leader, SIGSTOPs a node past the silence limit and
//!   restarts a replica: connections cut, publish gaps, API 503s, and acknowledged messages
//!   lost or delivered twice, per fault, against the targets. See docs/resilience.md.
//! - `bench failover`: a queue with a standby under durability-2 publishers whose node loses
//!   its disk at a random moment, round after round: until it serves again, until
//!   durability 2 is on two disks again, and every acknowledged message delivered once. With
//!   `--instances`, the node's machine is lost instead (a network namespace killed, moto as
//!   EC2) and the control plane promotes the standby's machine: until the queue serves again
//!   by name.

mod abuse;
mod bulk;
mod catchup;
mod chaos;
mod client;
mod connections;
mod controlplane_load;
mod dedup;
mod descendants;
mod ec2_pass;
mod failover;
mod failover_instances;
mod failover_load;
mod live_metrics;
mod node;
mod peers;
mod sqs_sdk;
mod stalls;
mod store_bytes;
mod workload;

use clap::{Parser, Subcommand};
use std::time::Duration;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// The node binary (a release build).
    #[arg(long, default_value = "target/release/dataplane", global = true)]
    dataplane: String,
    /// The core the node is pinned to.
    #[arg(long, default_value_t = 0, global = true)]
    server_cpu: usize,
    /// Where the node's data directory goes (the disk under test).
    #[arg(long, default_value = "target/bench-data", global = true)]
    data_root: String,
    /// Connect over TLS (wss://, with a CA made for the run).
    #[arg(long, global = true)]
    tls: bool,
    /// Offer permessage-deflate (the node always accepts it).
    #[arg(long, global = true)]
    compress: bool,
    /// The node's message log segment size in bytes (default: the node's, 16 MiB).
    #[arg(long, global = true)]
    segment_bytes: Option<u64>,
    /// Start the node with compaction off: the baseline for what compaction costs.
    #[arg(long, global = true)]
    no_compaction: bool,
    /// Read the node's allocations per message: the node binary must be built with
    /// `--features count-allocations` (e.g. into its own target directory).
    #[arg(long, global = true)]
    count_allocations: bool,
    /// Count the node's system calls per message with `perf stat` (linux-perf, root).
    #[arg(long, global = true)]
    count_syscalls: bool,
    /// Give the node a standby (`dataplane --standby-of`, its own data directory beside the
    /// node's) pinned to this core, and wait until it is in sync: durability 2 is then
    /// synced on both. On a 2-core machine it shares the load's core.
    #[arg(long, global = true)]
    standby_cpu: Option<usize>,
}

#[derive(Subcommand)]
enum Command {
    /// Throughput and latency of the workloads.
    Run {
        /// Workloads to run: w1, w4, w5, w6.
        #[arg(long, value_delimiter = ',', default_value = "w1,w4,w6,w5")]
        workloads: Vec<String>,
        /// Body sizes in bytes, up to 1 MiB less the JSON around the body (for a body near or
        /// over 64 KiB the node's max-ws-msg-len is raised to its most, 1 MiB).
        #[arg(long, value_delimiter = ',', default_value = "100,4096")]
        sizes: Vec<usize>,
        /// Durabilities.
        #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
        durabilities: Vec<u8>,
        /// Seconds of publishing per run.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Live messages (delayed two days) stored before each run: the run's churn then makes
        /// the node compact segments full of them while it is measured.
        #[arg(long, default_value_t = 0)]
        preload: usize,
        /// SQS long-polling receivers (aws-sdk-sqs, 20 s waits) held beside the WebSocket load
        /// all along: what idle pull receivers cost the push path. A message one of them gets
        /// is deleted and counted as delivered.
        #[arg(long, default_value_t = 0)]
        sqs_pollers: usize,
    },
    /// Restart time and memory with many stored messages.
    Recovery {
        #[arg(long, default_value_t = 1_000_000)]
        messages: usize,
    },
    /// A standby attaching to a queue with many stored messages: time to catch up, and the
    /// CPU it costs (needs --standby-cpu).
    StandbyCatchup {
        #[arg(long, default_value_t = 1_000_000)]
        messages: usize,
    },
    /// Purge and redrive of many stored messages, and the restarts after them.
    Bulk {
        #[arg(long, default_value_t = 1_000_000)]
        messages: usize,
    },
    /// Memory per idle connection, and a publish's way to the first of many subscribers.
    Connections {
        /// Logged-in subscribers.
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        /// Connections upgraded but not logged in (within the login timeout).
        #[arg(long, default_value_t = 2_000)]
        pre_login: usize,
        /// Publishes timed with all the subscribers in the line.
        #[arg(long, default_value_t = 2_000)]
        publishes: usize,
    },
    /// The workloads on our node and on NATS JetStream, Redis Streams and RabbitMQ.
    Peers {
        /// Systems to run: dataplane, dataplane-wss (the node over `wss://`), nats, redis,
        /// rabbitmq. Each row runs them one after another, in this order.
        #[arg(
            long,
            alias = "peers",
            value_delimiter = ',',
            default_value = "dataplane,nats,redis,rabbitmq"
        )]
        systems: Vec<String>,
        /// Workloads to run: w1, w4, w5, w6.
        #[arg(long, value_delimiter = ',', default_value = "w1,w4,w6,w5")]
        workloads: Vec<String>,
        /// Body sizes in bytes (at least 32: the send time and the id; at most 1 MiB less the
        /// JSON around the body, as in `run`).
        #[arg(long, value_delimiter = ',', default_value = "100")]
        sizes: Vec<usize>,
        /// Durabilities.
        #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
        durabilities: Vec<u8>,
        /// Seconds of publishing per run.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// The control plane under unauthenticated load (HTTP and DNS) while an operator creates
    /// and deletes queues: latency percentiles, memory and CPU (`--dataplane` is what its
    /// nodes run).
    ControlplaneLoad {
        /// The control plane binary (a release build).
        #[arg(long, default_value = "target/release/controlplane")]
        controlplane: String,
        /// Seconds the operator goes on starting create-to-delete loops.
        #[arg(long, default_value_t = 20,
              value_parser = clap::value_parser!(u64).range(1..=controlplane_load::MAX_SECONDS))]
        seconds: u64,
        /// Concurrent attacker tasks, in the fixed mix of docs/controlplane-load.md.
        #[arg(long, default_value_t = 200,
              value_parser = clap::value_parser!(u64).range(0..=controlplane_load::MAX_ATTACKERS))]
        attackers: u64,
        /// Idle API connections held beside the mix (each opened again when closed).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
        idle: u64,
        /// Slow-header API connections beside the mix's own.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
        slow: u64,
        /// Leave the control plane's directory (its log, its nodes' logs) under --data-root.
        #[arg(long)]
        keep: bool,
    },
    /// What nodes' live reports and `/metrics` cost a control plane with many queues
    /// (a restored backup of queue records; the bench plays the nodes).
    LiveMetrics(live_metrics::Settings),
    /// SQS throughput through Amazon's Rust SDK against a node's SQS face (QE_SQS names it;
    /// scripts/bench-sqs starts the node).
    SqsSdk(sqs_sdk::Settings),
    /// A node's SQS or WebSocket port under abuse without credentials (idle connections,
    /// slow heads, a flood of made-up keys or wrong passwords) while a client sends messages:
    /// its latency and errors, and the node's memory (`--dataplane` is the node).
    Abuse(abuse::Settings),
    /// Many short runs of publishers with one durable publish in flight each against one
    /// long-lived node: each run's rate, worst publish reply and the log's writer and syncer
    /// latencies (a lost wake-up shows as a collapsed run).
    Stalls(stalls::Settings),
    /// Faults on purpose under load (the control-plane leader, the etcd leader, a node, a
    /// replica), against the resilience targets; exits 1 if one is missed (`--dataplane` is
    /// what the nodes run). See docs/resilience.md.
    Chaos(chaos::Settings),
    /// A queue with a standby (`replicas: 2`) whose node loses its disk and its process (with
    /// `--instances`, its machine) at a random moment, round after round, under durability-2
    /// publishers: until it serves again, until durability 2 is on two disks again; exits 1
    /// if an acknowledged publish is lost or held by two subscribers at once. See
    /// docs/resilience.md.
    Failover(failover::Settings),
    /// Deduplication ids: the node's memory per id held, and publish throughput and CPU with
    /// distinct ids, without, and for repeats.
    Dedup(dedup::Settings),
    /// EC2 calls and time of the reconciler's look at every queue, with and without a survey
    /// of the fleet, against moto (docs/deploy.md §12).
    Ec2Pass(ec2_pass::Settings),
    /// Store bytes per queue-month of usage and stats records, with and without roll-ups
    /// (docs/deploy.md §12).
    StoreBytes(store_bytes::Settings),
    /// The WebSocket echo server of `bench peers`' echo limit (started by it).
    #[command(hide = true)]
    EchoServer {
        #[arg(long)]
        port: u16,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    descendants::killed_on_panic();
    let args = Args::parse();
    if let Command::EchoServer { port } = args.command {
        return peers::echo::serve(port).await;
    }
    let data_root: std::path::PathBuf = args.data_root.clone().into();
    std::fs::create_dir_all(&data_root).expect("the data root");
    if run_alone(&args, &data_root).await {
        return;
    }
    let config = node_config(&args, data_root);
    run_on_node(args.command, &config).await
}

/// The commands that start what they need themselves (or nothing); false for the others.
async fn run_alone(args: &Args, data_root: &std::path::Path) -> bool {
    match &args.command {
        Command::LiveMetrics(settings) => live_metrics::live_metrics(settings, data_root).await,
        Command::SqsSdk(settings) => sqs_sdk::sqs_sdk(settings).await,
        Command::Ec2Pass(settings) => ec2_pass::ec2_pass(settings).await,
        Command::Abuse(settings) => {
            abuse::abuse(&existing(&args.dataplane), data_root, settings).await
        }
        Command::StoreBytes(settings) => store_bytes::store_bytes(settings).await,
        Command::Chaos(settings) => {
            let passed = chaos::chaos(settings, &existing(&args.dataplane), data_root).await;
            // Everything the run started has ended by now (its owners were dropped).
            std::process::exit(if passed { 0 } else { 1 });
        }
        Command::Failover(settings) if settings.instances => {
            let passed = failover_instances::failover(settings, data_root);
            std::process::exit(if passed { 0 } else { 1 });
        }
        Command::Failover(settings) => {
            let passed = failover::failover(settings, &existing(&args.dataplane), data_root).await;
            std::process::exit(if passed { 0 } else { 1 });
        }
        Command::ControlplaneLoad {
            controlplane,
            seconds,
            attackers,
            idle,
            slow,
            keep,
        } => {
            let settings = controlplane_load::Settings {
                controlplane: existing(controlplane),
                dataplane: existing(&args.dataplane),
                data_root: data_root.to_path_buf(),
                time: Duration::from_secs(*seconds),
                attackers: *attackers as usize,
                idle: *idle as usize,
                slow: *slow as usize,
                keep: *keep,
            };
            controlplane_load::controlplane_load(&settings).await
        }
        _ => return false,
    }
    true
}

/// How the commands that measure a node start it: the flags' binary, CPU, wire and store.
fn node_config(args: &Args, data_root: std::path::PathBuf) -> node::NodeConfig {
    let wire = client::Wire {
        tls: None,
        compress: args.compress,
    };
    let plain = node::NodeConfig {
        binary: args.dataplane.clone(),
        cpu: args.server_cpu,
        data_root,
        wire,
        tls_files: None,
        segment_bytes: args.segment_bytes,
        no_compaction: args.no_compaction,
        count_allocations: args.count_allocations,
        count_syscalls: args.count_syscalls,
        standby_cpu: args.standby_cpu,
        sqs_face: matches!(args.command, Command::Run { sqs_pollers, .. } if sqs_pollers > 0),
    };
    let config = match args.tls {
        true => plain.over_tls(),
        false => plain,
    };
    println!("clients connect over {}", config.wire.describe());
    config
}

/// The commands that measure one node (or the peers beside it).
async fn run_on_node(command: Command, config: &node::NodeConfig) {
    if let Command::Run { sizes, .. } | Command::Peers { sizes, .. } = &command {
        if let Err(error) = workload::check_sizes(sizes) {
            eprintln!("bench: {error}");
            std::process::exit(2);
        }
    }
    match command {
        Command::Run {
            workloads,
            sizes,
            durabilities,
            seconds,
            preload,
            sqs_pollers,
        } => {
            let time = Duration::from_secs(seconds);
            let preload = workload::Preload { messages: preload };
            let plan = RunPlan {
                workloads,
                sizes,
                durabilities,
                time,
                preload,
                sqs_pollers,
            };
            run_workloads(config, plan).await
        }
        Command::Peers {
            systems,
            workloads,
            sizes,
            durabilities,
            seconds,
        } => {
            let choice = peers::Choice {
                systems: systems
                    .iter()
                    .map(|name| {
                        peers::System::named(name)
                            .expect("dataplane, dataplane-wss, nats, redis or rabbitmq")
                    })
                    .collect(),
                workloads: workloads
                    .iter()
                    .map(|name| workload::Workload::named(name).expect("w1, w4, w5 or w6"))
                    .collect(),
                sizes,
                durabilities,
                time: Duration::from_secs(seconds),
            };
            peers::peers(config, &choice).await
        }
        Command::Stalls(settings) => stalls::stalls(config, &settings).await,
        Command::Dedup(settings) => dedup::dedup(config, &settings).await,
        Command::Recovery { messages } => workload::recovery(config, messages).await,
        Command::Bulk { messages } => bulk::bulk(config, messages).await,
        Command::StandbyCatchup { messages } => catchup::catchup(config, messages).await,
        Command::Connections {
            count,
            pre_login,
            publishes,
        } => connections::connections(config, count, pre_login, publishes).await,
        _ => unreachable!("run alone (run_alone)"),
    }
}

/// What `bench run` measures: every workload, at every size and durability.
struct RunPlan {
    workloads: Vec<String>,
    sizes: Vec<usize>,
    durabilities: Vec<u8>,
    time: Duration,
    preload: workload::Preload,
    sqs_pollers: usize,
}

async fn run_workloads(config: &node::NodeConfig, plan: RunPlan) {
    let probe = node::fdatasync_probe(&config.data_root, Duration::from_secs(2));
    println!("fdatasync probe (4 KiB append + fdatasync, serial): {probe:.0}/s");
    println!("{}", workload::Report::header());
    for name in &plan.workloads {
        let workload = workload::Workload::named(name).expect("w1, w4, w5 or w6");
        for &size in &plan.sizes {
            for &durability in &plan.durabilities {
                let report = workload::run(
                    config,
                    workload,
                    size,
                    durability,
                    plan.time,
                    plan.preload,
                    plan.sqs_pollers,
                )
                .await;
                let mut line = report.line();
                if durability == 2 {
                    line.push_str(&format!("  ({:.1}x fdatasync)", report.rate / probe));
                }
                println!("{line}");
            }
        }
    }
}

/// The absolute path of a binary given on the command line (the control plane's config names
/// it, and runs it from elsewhere).
fn existing(path: &str) -> std::path::PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|e| panic!("{path}: {e} (build it first)"))
}
