//! The etcd harness itself: a three-member cluster on loopback answers with one member down, not
//! with two, and again once one of them is back; a lone member keeps its data across a kill.

use qe_tests::etcd::EtcdCluster;
use std::time::{Duration, Instant};

/// How long a cluster whose majority runs gets to elect a leader and take a write: several
/// election timeouts (500 ms each, randomized up to twice that).
const FAILOVER: Duration = Duration::from_secs(5);

#[test]
fn a_majority_answers_and_a_minority_does_not() {
    let started = Instant::now();
    let mut cluster = EtcdCluster::start(3);
    eprintln!("3 members healthy in {:?}", started.elapsed());
    assert_eq!(cluster.endpoints().len(), 3);

    cluster.put(0, "greeting", "hello").unwrap();
    assert_eq!(
        cluster.get(1, "greeting").unwrap().as_deref(),
        Some("hello")
    );
    assert_eq!(cluster.get(2, "nothing").unwrap(), None);

    let leader = cluster.leader().expect("a leader");
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let killed = Instant::now();
    cluster.kill(leader);
    assert!(!cluster.is_alive(leader));
    let new_leader = leader_within(&cluster);
    eprintln!(
        "a new leader {:?} after the leader's kill",
        killed.elapsed()
    );
    assert!(others.contains(&new_leader), "m{new_leader} was killed");
    put_within(&cluster, others[0], "after-failover", "1");
    eprintln!("a put {:?} after the leader's kill", killed.elapsed());

    cluster.kill(others[0]);
    let refused = cluster.put(others[1], "without-majority", "1");
    assert!(refused.is_err(), "one member of three took a write");

    // The old leader missed a write: it must catch up from the member that kept running.
    let restarted = Instant::now();
    cluster.restart(leader);
    assert!(cluster.is_alive(leader));
    put_within(&cluster, others[1], "majority-again", "1");
    eprintln!("a put {:?} after the restart", restarted.elapsed());
    assert_eq!(
        cluster.get(leader, "after-failover").unwrap().as_deref(),
        Some("1")
    );
}

#[test]
fn a_single_member_keeps_its_data_across_a_kill() {
    let started = Instant::now();
    let mut cluster = EtcdCluster::single();
    eprintln!("1 member healthy in {:?}", started.elapsed());
    assert_eq!(cluster.leader(), Some(0));
    cluster.put(0, "kept", "yes").unwrap();
    cluster.kill(0);
    assert!(cluster.get(0, "kept").is_err(), "a killed member answered");
    cluster.restart(0);
    let deadline = Instant::now() + FAILOVER;
    loop {
        match cluster.get(0, "kept") {
            Ok(value) => break assert_eq!(value.as_deref(), Some("yes")),
            Err(err) => assert!(Instant::now() < deadline, "no read after a restart: {err}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Puts through member `i` until a put succeeds, within [`FAILOVER`].
fn put_within(cluster: &EtcdCluster, i: usize, key: &str, value: &str) {
    let deadline = Instant::now() + FAILOVER;
    while let Err(err) = cluster.put(i, key, value) {
        assert!(
            Instant::now() < deadline,
            "no put through m{i} within {FAILOVER:?}: {err}"
        );
        // A refusal can come at once (no leader yet); a timed-out put already waited.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The leader, once there is one, within [`FAILOVER`].
fn leader_within(cluster: &EtcdCluster) -> usize {
    let deadline = Instant::now() + FAILOVER;
    loop {
        if let Some(leader) = cluster.leader() {
            return leader;
        }
        assert!(Instant::now() < deadline, "no leader within {FAILOVER:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
