//! `bench standby-catchup`: what a standby that attaches to a queue with many stored messages
//! costs (issue 35): the time until it has caught up (the primary's segment files copied over
//! the replication connection, then synced), and the CPU of both processes meanwhile; then a
//! node started on the standby's copy (a promotion by hand): its time until it serves.

use crate::node::{cpu_time, Node, NodeConfig};
use crate::workload::store;
use std::time::Instant;

pub async fn catchup(config: &NodeConfig, messages: usize) {
    let Some(cpu) = config.standby_cpu else {
        panic!("bench standby-catchup needs --standby-cpu (the standby's core)");
    };
    let dir = tempfile::tempdir_in(&config.data_root).unwrap();
    let mut node = Node::start_alone(config, dir.path());
    let stored = store(config, &node.url(), messages).await.len();
    let log_bytes: u64 = std::fs::read_dir(dir.path().join("messages"))
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".log"))
        .map(|entry| entry.metadata().unwrap().len())
        .sum();
    println!(
        "stored {stored} messages of 100 B at durability 1; log files {} MB (segments made ahead full of zeros included)",
        log_bytes >> 20
    );
    let (started, node_cpu) = (Instant::now(), node.cpu_time());
    node.attach_standby(config, cpu, dir.path());
    let caught_up = started.elapsed();
    let node_cpu = node.cpu_time() - node_cpu;
    let standby_cpu = cpu_time(node.standby_pid().expect("attached"));
    let copied: u64 = std::fs::read_dir(dir.path().join("standby").join("messages"))
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .sum();
    println!(
        "standby caught up in {:.2}s: {} MB copied ({:.0} MB/s); node CPU {:.2}s, standby CPU {:.2}s (its start's check of what it holds included)",
        caught_up.as_secs_f64(),
        copied >> 20,
        (copied >> 20) as f64 / caught_up.as_secs_f64(),
        node_cpu.as_secs_f64(),
        standby_cpu.as_secs_f64(),
    );

    // The same standby back on its own copy: it reads every record of it before it says
    // what it holds, and then nothing is missing.
    node.kill_standby();
    let started = Instant::now();
    node.attach_standby(config, cpu, dir.path());
    println!(
        "the standby killed and started again on its copy: caught up in {:.2}s, standby CPU {:.2}s",
        started.elapsed().as_secs_f64(),
        cpu_time(node.standby_pid().expect("attached")).as_secs_f64(),
    );

    // The promotion by hand: the primary and the standby gone, a node on the standby's copy.
    node.kill_standby();
    node.kill();
    let promoted = Node::start_alone(config, &dir.path().join("standby"));
    println!(
        "a node started on the standby's copy of {stored} messages: serving in {:.2}s",
        promoted.startup.as_secs_f64(),
    );
}
