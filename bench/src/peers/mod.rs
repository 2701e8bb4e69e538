//! `bench peers`: our node next to NATS JetStream, Redis Streams and RabbitMQ, under the same
//! workloads, in one table.
//!
//! - `closed_loop`: the workloads for any peer, as `workload::run` drives our node (one
//!   in-flight budget, send times and ids in the bodies, the exactly-once check).
//! - `server`: a peer's process, pinned to the server core on loopback, polled until it
//!   serves, measured from /proc, killed after its run.
//! - `nats`, `redis`, `rabbitmq`: each peer's durability levels, publishers and subscribers.
//! - `echo`: the WebSocket echo limit (`bench echo-server`), one of the two limits printed
//!   above the table; the other is the serial fdatasync probe.
//!
//! docs/performance.md ("The peers") says what each peer's durability levels promise.

mod closed_loop;
pub mod echo;
mod nats;
mod rabbitmq;
mod redis;
mod server;

use crate::node::{fdatasync_probe, NodeConfig};
use crate::workload::{self, Percentiles, Preload, Report, Workload};
use closed_loop::Measured;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The systems `bench peers` compares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum System {
    /// Our node (`target/release/dataplane`), over the wire the flags choose.
    Dataplane,
    /// Our node with its clients over `wss://` (the node's rustls path, a CA made for the run;
    /// with `--tls`, the same as `dataplane`): the row next to `dataplane`'s, so that what TLS
    /// costs is read from runs a minute apart.
    DataplaneWss,
    Nats,
    Redis,
    RabbitMq,
}

impl System {
    pub fn named(name: &str) -> Option<System> {
        match name {
            "dataplane" => Some(System::Dataplane),
            "dataplane-wss" => Some(System::DataplaneWss),
            "nats" => Some(System::Nats),
            "redis" => Some(System::Redis),
            "rabbitmq" => Some(System::RabbitMq),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            System::Dataplane => "dataplane",
            System::DataplaneWss => "dataplane-wss",
            System::Nats => "nats",
            System::Redis => "redis",
            System::RabbitMq => "rabbitmq",
        }
    }
}

/// What a `bench peers` run covers.
pub struct Choice {
    pub systems: Vec<System>,
    pub workloads: Vec<Workload>,
    pub sizes: Vec<usize>,
    pub durabilities: Vec<u8>,
    /// Publishing time per run.
    pub time: Duration,
}

/// What every peer's run needs to know of the machine.
pub struct Settings {
    /// The core the servers are pinned to.
    pub server_cpu: usize,
    /// Where servers keep their data (the disk under test, as for our node).
    pub data_root: PathBuf,
    /// Publishing time per run.
    pub time: Duration,
}

pub async fn peers(config: &NodeConfig, choice: &Choice) {
    let settings = Settings {
        server_cpu: config.cpu,
        data_root: config.data_root.clone(),
        time: choice.time,
    };
    let probe = fdatasync_probe(&config.data_root, PROBE_TIME);
    let probe_on_server_core = fdatasync_probe_on(settings.server_cpu, &config.data_root);
    println!(
        "fdatasync probe (4 KiB append + fdatasync, serial): {probe:.0}/s from the bench's \
         core, {probe_on_server_core:.0}/s from the server core"
    );
    let echo = echo::limit(&settings).await;
    println!(
        "WebSocket echo (yawc, 16 connections x 16 in flight, 100 B): {:.0} msg/s, \
         server CPU {:.1}us per echo",
        echo.rate, echo.cpu_us_per_frame
    );
    // With `--tls` the node's clients are over `wss://` already (and a second CA made now
    // would replace the certificate files the first one's node reads).
    let wss_asked = choice.systems.contains(&System::DataplaneWss);
    let over_tls = (wss_asked && config.wire.tls.is_none()).then(|| config.over_tls());
    println!("{}", header());
    // The systems run one after another for each row, so that a ratio of two of them (ours
    // to Redis, wss to ws) compares runs minutes apart, not a whole table apart: this VM's
    // speed drifts by a third within an hour.
    for &durability in &choice.durabilities {
        for &workload in &choice.workloads {
            for &size in &choice.sizes {
                for &system in &choice.systems {
                    let config = match system {
                        System::DataplaneWss => over_tls.as_ref().unwrap_or(config),
                        _ => config,
                    };
                    let measured = measure(system, config, &settings, workload, size, durability);
                    let row = Row {
                        system,
                        durability,
                        workload: workload.name,
                        size,
                        measured: measured.await,
                    };
                    println!("{}", row.line(probe));
                }
            }
        }
    }
}

/// How long each fdatasync probe runs.
const PROBE_TIME: Duration = Duration::from_secs(2);

/// The probe from a thread pinned to `cpu`: on a VM a sync's completion may reach an idle
/// core late (its interrupt lands on the other core), and the servers run on that core.
fn fdatasync_probe_on(cpu: usize, dir: &Path) -> f64 {
    let dir = dir.to_path_buf();
    let probe = std::thread::spawn(move || {
        pin_this_thread(cpu);
        fdatasync_probe(&dir, PROBE_TIME)
    });
    probe.join().expect("the probe")
}

fn pin_this_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET and sched_setaffinity get the
    // set and its true size, and pid 0 is the calling thread.
    let pinned = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(pinned, 0, "pin the probe to core {cpu}");
}

/// One run of `system`, or why it has no such durability.
async fn measure(
    system: System,
    config: &NodeConfig,
    settings: &Settings,
    workload: Workload,
    size: usize,
    durability: u8,
) -> Result<Measured, &'static str> {
    match system {
        System::Dataplane | System::DataplaneWss => {
            let time = settings.time;
            let preload = Preload::default();
            let report = workload::run(config, workload, size, durability, time, preload, 0).await;
            Ok(Measured::from(report))
        }
        System::Nats => nats::run(settings, workload, size, durability).await,
        System::Redis => redis::run(settings, workload, size, durability).await,
        System::RabbitMq => rabbitmq::run(settings, workload, size, durability).await,
    }
}

impl From<Report> for Measured {
    fn from(report: Report) -> Measured {
        Measured {
            messages: report.messages,
            rate: report.rate,
            reply: report.reply,
            delivery: report.delivery,
            cpu_us_per_message: report.cpu_us_per_message,
            peak_rss: report.peak_rss,
        }
    }
}

/// A line of the table.
struct Row {
    system: System,
    durability: u8,
    workload: &'static str,
    size: usize,
    measured: Result<Measured, &'static str>,
}

fn header() -> String {
    format!(
        "{:<13} {:>2} {:<4} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8}",
        "system",
        "d",
        "load",
        "body",
        "messages",
        "msg/s",
        "reply50",
        "reply99",
        "deliv50",
        "deliv99",
        "cpu/msg",
        "peakRSS"
    )
}

impl Row {
    /// The row; at durability 2, the rate as a multiple of the serial `fdatasync` rate.
    fn line(&self, fdatasync_rate: f64) -> String {
        let start = format!(
            "{:<13} {:>2} {:<4} {:>5}",
            self.system.name(),
            self.durability,
            self.workload,
            self.size
        );
        let measured = match &self.measured {
            Ok(measured) => measured,
            Err(why) => {
                let dash = "—";
                return format!(
                    "{start} {dash:>8} {dash:>9} {dash:>9} {dash:>9} {dash:>9} {dash:>9} \
                     {dash:>7} {dash:>8}  ({why})"
                );
            }
        };
        let ms = |d: Duration| format!("{:.3}ms", d.as_secs_f64() * 1000.0);
        let pair = |p: &Percentiles| format!("{:>9} {:>9}", ms(p.p50), ms(p.p99));
        let mut line = format!(
            "{start} {:>8} {:>9.0} {} {} {:>5.1}us {:>6}MB",
            measured.messages,
            measured.rate,
            pair(&measured.reply),
            pair(&measured.delivery),
            measured.cpu_us_per_message,
            measured.peak_rss >> 20,
        );
        if self.durability == 2 {
            line += &format!("  ({:.1}x fdatasync)", measured.rate / fdatasync_rate);
        }
        line
    }
}
