//! `bench controlplane-load`: the control plane under abuse (issue 15, point 4). It starts the
//! real `controlplane` binary on loopback, runs many unauthenticated attackers against its API
//! and DNS while an operator with the real token creates and deletes queues and a resolver
//! asks for the zone's SOA, and prints the operator's and the resolver's latency, what the
//! attackers got, and the control plane's memory and CPU time.
//!
//! - `process`: the control plane's process, its config and addresses, and its nodes' end.
//! - `attackers`: the kinds of abuse, one task each, and what each counted.
//! - `clients`: the measured operator and resolver, on a runtime of their own.
//! - `wire`: HTTP/1.1 and DNS bytes written by hand.
//!
//! docs/controlplane-load.md describes each attacker and holds the measurements.

mod attackers;
mod clients;
// `bench chaos` ends its nodes the same way.
pub(crate) mod process;
mod wire;

use attackers::{Kind, Tally, Target};
use clients::{Calls, Measured};
use process::{ControlPlane, Usage};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The most attackers and seconds a run may ask for: the load stays bounded on a small
/// machine (each attacker is a task and a socket or two on each side).
pub const MAX_ATTACKERS: u64 = 1000;
pub const MAX_SECONDS: u64 = 300;

/// What a run needs.
pub struct Settings {
    /// The `controlplane` binary under test.
    pub controlplane: PathBuf,
    /// The `dataplane` binary its local nodes run.
    pub dataplane: PathBuf,
    /// Where the control plane's temporary directory goes.
    pub data_root: PathBuf,
    /// How long the operator keeps starting loops and the resolver asks.
    pub time: Duration,
    pub attackers: usize,
    /// Idle API connections beside the mix.
    pub idle: usize,
    /// Slow-header API connections beside the mix.
    pub slow: usize,
    /// Leave the control plane's directory (its log, its nodes' logs) after the run.
    pub keep: bool,
}

pub async fn controlplane_load(settings: &Settings) {
    crate::connections::raise_fd_limit();
    let mut control_plane = ControlPlane::start(
        &settings.controlplane,
        &settings.dataplane,
        &settings.data_root,
        settings.keep,
    );
    print_setup(settings, &control_plane);
    let at_start = control_plane.usage().expect("the control plane runs");
    let bench_cpu_at_start = own_cpu_time();
    let started = Instant::now();
    let (stop, stopped) = watch::channel(false);
    let target = Target::new(control_plane.api, control_plane.dns);
    let mut attackers: Vec<_> = (0..settings.attackers)
        .map(|index| tokio::spawn(attackers::run(index, target.clone(), stopped.clone())))
        .collect();
    let held = std::iter::repeat_n(Kind::IdleHttp, settings.idle)
        .chain(std::iter::repeat_n(Kind::SlowHeaders, settings.slow));
    for (n, kind) in held.enumerate() {
        let index = settings.attackers + n;
        let attacker = attackers::run_as(kind, index, target.clone(), stopped.clone());
        attackers.push(tokio::spawn(attacker));
    }
    let until = started + settings.time;
    let measured = clients::start(control_plane.api, control_plane.dns, until);
    let measured = tokio::select! {
        measured = measured => measured.expect("the measured clients' thread"),
        // The nodes are in process groups of their own: a Ctrl-C does not reach them.
        _ = tokio::signal::ctrl_c() => {
            let stopped = control_plane.stop();
            let (how, nodes) = (stopped.how, stopped.nodes_left);
            println!("interrupted: the control plane {how}; {nodes} nodes killed");
            // Its directory goes with it; the attackers and clients with the process.
            drop(control_plane);
            std::process::exit(130);
        }
    };
    // The attack lasts as long as the operator's last loop, so every call is made under it.
    let _ = stop.send(true);
    let mut tallies: BTreeMap<Kind, Tally> = BTreeMap::new();
    for attacker in attackers {
        let (kind, tally) = attacker.await.expect("an attacker");
        tallies.entry(kind).or_default().add(tally);
    }
    let elapsed = started.elapsed();
    let bench_cpu = own_cpu_time().saturating_sub(bench_cpu_at_start);
    let at_end = control_plane.usage();
    print_measured(&measured);
    print_attackers(&tallies);
    print_usage(&at_start, at_end.as_ref(), elapsed, bench_cpu);
    match control_plane.exited() {
        Some(status) => println!(
            "the control plane exited during the run ({status}); the end of its log:\n{}",
            control_plane.log_tail(20)
        ),
        None => print_metrics(control_plane.api).await,
    }
    let stopped = control_plane.stop();
    println!(
        "stop: the control plane {}; {} nodes were left running (killed)",
        stopped.how, stopped.nodes_left
    );
    if settings.keep {
        println!("kept {}", control_plane.dir().display());
    }
}

fn print_setup(settings: &Settings, control_plane: &ControlPlane) {
    println!(
        "control plane {} (pid {}), API {}, DNS {}; nodes run {}",
        settings.controlplane.display(),
        control_plane.pid(),
        control_plane.api,
        control_plane.dns,
        settings.dataplane.display()
    );
    println!(
        "{} attackers for {} s (HTTP from 127.0.2.1, DNS flood from 127.0.3.1, idle DNS TCP \
         from 127.0.5.1), and {} idle API connections (from 127.0.6.1) and {} more slow heads; \
         the operator from 127.0.0.1, the resolver from 127.0.4.1",
        settings.attackers,
        settings.time.as_secs(),
        settings.idle,
        settings.slow,
    );
}

fn print_measured(measured: &Measured) {
    println!();
    println!(
        "{:<44} {:>6} {:>5} {:>7} {:>10} {:>10} {:>10} {:>10}",
        "measured call", "count", "fail", "timeout", "p50", "p90", "p99", "max"
    );
    let all = measured.operator.iter().chain([&measured.resolver]);
    for calls in all.clone() {
        println!("{}", calls_line(calls));
    }
    println!(
        "operator loops (create to delete): {}; DNS timeout = no answer within {:?}",
        measured.queues,
        clients::DNS_ANSWER_WITHIN
    );
    for calls in all {
        for example in &calls.examples {
            println!("  failed {}: {example}", calls.name);
        }
    }
}

/// Count, failures, timeouts and the latency of the successes.
fn calls_line(calls: &Calls) -> String {
    let mut sorted = calls.latencies.clone();
    sorted.sort_unstable();
    let at = |q: f64| match sorted.len() {
        0 => "-".to_string(),
        n => ms(sorted[((n - 1) as f64 * q) as usize]),
    };
    format!(
        "{:<44} {:>6} {:>5} {:>7} {:>10} {:>10} {:>10} {:>10}",
        calls.name,
        calls.count(),
        calls.failures,
        calls.timeouts,
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    )
}

fn ms(duration: Duration) -> String {
    format!("{:.3}ms", duration.as_secs_f64() * 1000.0)
}

fn print_attackers(tallies: &BTreeMap<Kind, Tally>) {
    println!();
    if tallies.is_empty() {
        println!("no attackers");
        return;
    }
    println!(
        "{:<32} {:>5} {:>7} {:>9} {:<8} {:>6} {:>6}  answers",
        "attacker", "tasks", "conns", "sent", "", "closed", "errors"
    );
    for (kind, tally) in tallies {
        println!(
            "{:<32} {:>5} {:>7} {:>9} {:<8} {:>6} {:>6}  {}",
            kind.name(),
            tally.tasks,
            tally.connections,
            tally.sent,
            kind.unit(),
            tally.closed,
            tally.errors,
            tally.answers_line()
        );
    }
}

fn print_usage(start: &Usage, end: Option<&Usage>, elapsed: Duration, bench_cpu: Duration) {
    println!();
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64);
    let Some(end) = end else {
        println!(
            "control plane memory at start {} (VmRSS); gone at the end",
            mib(start.rss)
        );
        return;
    };
    println!(
        "control plane memory (VmRSS): start {}, end {}; peak (VmHWM) {}",
        mib(start.rss),
        mib(end.rss),
        mib(end.peak_rss)
    );
    let used = end.cpu.saturating_sub(start.cpu);
    let share = |cpu: Duration| 100.0 * cpu.as_secs_f64() / elapsed.as_secs_f64();
    println!(
        "control plane CPU (utime+stime): start {:.2} s, end {:.2} s: {:.2} s in the run's \
         {:.1} s ({:.0}% of one core); the bench used {:.2} s ({:.0}%)",
        start.cpu.as_secs_f64(),
        end.cpu.as_secs_f64(),
        used.as_secs_f64(),
        elapsed.as_secs_f64(),
        share(used),
        bench_cpu.as_secs_f64(),
        share(bench_cpu)
    );
}

/// `/metrics` with the token, after the run: how many lines and how many request series (a
/// label set that grows with what attackers send shows here).
async fn print_metrics(api: std::net::SocketAddr) {
    let head = wire::request_head("GET", "/metrics", Some(process::TOKEN), 0, true);
    let fetched = async {
        let mut stream = wire::connect_from(std::net::Ipv4Addr::LOCALHOST, api).await?;
        wire::exchange(&mut stream, &head, &[]).await
    };
    match tokio::time::timeout(Duration::from_secs(30), fetched).await {
        Ok(Ok(response)) if response.status == 200 => {
            let text = String::from_utf8_lossy(&response.body);
            let series = text
                .lines()
                .filter(|line| line.starts_with("qe_api_request_duration_seconds_count"))
                .count();
            println!(
                "/metrics: {} lines, {} bytes, {series} request series (method, route, status)",
                text.lines().count(),
                response.body.len()
            );
        }
        Ok(Ok(response)) => println!("/metrics: status {}", response.status),
        Ok(Err(error)) => println!("/metrics: {error}"),
        Err(_) => println!("/metrics: no answer within 30 s"),
    }
}

/// The bench's own user plus system CPU time (the attackers' cost, on the same two cores).
fn own_cpu_time() -> Duration {
    crate::node::cpu_time(std::process::id())
}
