//! Several control planes on one etcd cluster (real `etcd` processes on loopback): every
//! replica serves the API and the DNS from the shared state, one leads (reconciler,
//! certificate orders), and the loss of any one process loses nothing.

use qe_tests::etcd::EtcdCluster;
use qe_tests::{
    dig, http_text, login_with, node_of, process_naming, signal, wait_until_applied, ControlPlane,
};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const QUEUE: &str = r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":true}"#;

/// Replicas of one cluster, their nodes in one directory (the local provider's): a new
/// leader adopts the nodes the last one started. The nodes are killed on drop.
struct Replicas {
    replicas: Vec<Option<ControlPlane>>,
    nodes: tempfile::TempDir,
}

impl Replicas {
    /// `count` replicas on `etcd`, each with a DNS server; nodes know every replica.
    fn start(etcd: &EtcdCluster, count: usize, extra: &str) -> Replicas {
        let dns = vec!["127.0.0.1:0".parse().unwrap(); count];
        Replicas::start_with_dns(etcd, &dns, extra)
    }

    /// A replica per address in `dns`, its DNS server there; the first one leads (the others
    /// start once it does).
    fn start_with_dns(etcd: &EtcdCluster, dns: &[SocketAddr], extra: &str) -> Replicas {
        Replicas::start_listing_first(etcd, dns, extra, None)
    }

    /// `count` replicas on `etcd` that all list replica `preferred` first in `node_urls`, so
    /// every node reports to it, whichever leads.
    fn start_preferring(
        etcd: &EtcdCluster,
        count: usize,
        extra: &str,
        preferred: usize,
    ) -> Replicas {
        let dns = vec!["127.0.0.1:0".parse().unwrap(); count];
        Replicas::start_listing_first(etcd, &dns, extra, Some(preferred))
    }

    /// Replicas as [`Replicas::start_with_dns`], each listing `preferred` first in its
    /// `node_urls`, or its own URL (as documented) for `None`.
    fn start_listing_first(
        etcd: &EtcdCluster,
        dns: &[SocketAddr],
        extra: &str,
        preferred: Option<usize>,
    ) -> Replicas {
        let count = dns.len();
        let nodes = tempfile::tempdir().unwrap();
        let listen: Vec<SocketAddr> = (0..count).map(|_| free_addr()).collect();
        let urls: Vec<String> = listen
            .iter()
            .map(|addr| format!("\"http://{addr}\""))
            .collect();
        let endpoints: Vec<String> = etcd.endpoints().iter().map(|e| format!("{e:?}")).collect();
        let nodes_dir = nodes.path().to_path_buf();
        // As infra/controlplane-replica.example.toml says: the same file on every replica but
        // for `node_urls`, which lists this replica's own URL first.
        let config = |i: usize| {
            let first = preferred.unwrap_or(i);
            let own_first = [&urls[first..], &urls[..first]].concat();
            format!(
                "dns_listen = \"{}\"\nlocal_nodes_dir = {:?}\nnode_urls = [{}]\n\
                 reconcile_every_secs = 1\n{extra}\n\
                 [store]\nkind = \"etcd\"\nendpoints = [{}]\ntimeout_secs = 3\nlease_secs = 2\n",
                dns[i],
                nodes_dir,
                own_first.join(", "),
                endpoints.join(", ")
            )
        };
        let start = |i: usize| ControlPlane::start_listening(&listen[i].to_string(), &config(i));
        let mut replicas = Replicas {
            replicas: vec![Some(start(0))],
            nodes,
        };
        assert_eq!(replicas.leader(), 0);
        replicas.replicas.extend((1..count).map(|i| Some(start(i))));
        replicas
    }

    fn at(&self, i: usize) -> &ControlPlane {
        self.replicas[i].as_ref().expect("a live replica")
    }

    /// The replica that says it leads (waits for one).
    fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for (i, replica) in self.replicas.iter().enumerate() {
                let Some(replica) = replica else { continue };
                let log = replica.log_text();
                if log.matches(": leading").count() > log.matches("no longer leading").count() {
                    return i;
                }
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = self
                    .replicas
                    .iter()
                    .flatten()
                    .map(|r| r.log_text())
                    .collect();
                panic!("no replica leads:\n{}", logs.join("\n-----\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills replica `i` (SIGKILL); returns what it had logged.
    fn kill(&mut self, i: usize) -> String {
        let mut replica = self.replicas[i].take().expect("a live replica");
        replica.kill();
        replica.log_text()
    }

    /// The node processes running for queue `id`.
    fn nodes_of(&self, id: &str) -> usize {
        let bootstrap = self
            .nodes
            .path()
            .join("nodes")
            .join(id)
            .join("bootstrap.toml");
        process_naming(&bootstrap).into_iter().count()
    }

    fn node_dir(&self, id: &str) -> PathBuf {
        self.nodes.path().join("nodes").join(id)
    }
}

impl Drop for Replicas {
    /// A failing test shows how each node's log ends: the replicas share this nodes
    /// directory, so their own drop does not show them.
    fn drop(&mut self) {
        self.replicas.clear();
        kill_nodes_in(self.nodes.path());
        if std::thread::panicking() {
            let nodes = std::fs::read_dir(self.nodes.path().join("nodes"));
            for node in nodes.into_iter().flatten().flatten() {
                qe_tests::show_node_log(&node.path());
            }
        }
    }
}

fn kill_nodes_in(dir: &Path) {
    for node in std::fs::read_dir(dir.join("nodes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Some(pid) = process_naming(&node.path().join("bootstrap.toml")) {
            signal(pid, libc::SIGKILL);
        }
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The queue ids a replica lists.
async fn ids(cp: &ControlPlane) -> Vec<String> {
    let (status, list) = cp.call("GET", "/v1/queues", None).await;
    assert_eq!(status, 200, "{list}");
    let mut ids: Vec<String> = list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["status"] != "deleted")
        .map(|q| q["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

fn soa_serial(dns: SocketAddr, zone: &str) -> u32 {
    let soa = dig(dns, zone, "SOA", false);
    soa.soa_serial()
        .unwrap_or_else(|| panic!("no SOA: {soa:?}"))
}

/// Whether `login` logs in as `role` at the queue's node.
async fn logs_in(node: &str, login: &Value, role: &str) -> bool {
    let mut client = qe_tests::Client::connect_url(node).await;
    let request = serde_json::json!({
        "username": login["username"], "password": login["password"],
        "role": role, "queuetype": "distribute",
    });
    client.request(request).await["status"] == "Success."
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_queues_logins_and_zone_and_race_safely() {
    let etcd = EtcdCluster::start(3);
    let mut replicas = Replicas::start(&etcd, 3, "");
    // Three creates at once, one through each replica.
    let created =
        futures::future::join_all((0..3).map(|i| replicas.at(i).create_queue(QUEUE))).await;
    let mut expected: Vec<String> = created
        .iter()
        .map(|queue| queue["id"].as_str().unwrap().to_string())
        .collect();
    expected.sort();
    for i in 0..3 {
        assert_eq!(ids(replicas.at(i)).await, expected, "replica {i}");
    }
    let queue = &created[0];
    let id = queue["id"].as_str().unwrap();
    assert_eq!(replicas.nodes_of(id), 1, "one node per queue");
    let node = queue["node"].as_str().unwrap();

    // Rotations one after another through different replicas: each time exactly the new
    // password works.
    let mut old = queue["logins"]["publisher"].clone();
    for i in [1, 2, 0] {
        let path = format!("/v1/queues/{id}/logins/publisher/rotate");
        let (status, rotated) = replicas.at(i).call("POST", &path, None).await;
        assert_eq!(status, 200, "{rotated}");
        wait_until_applied(replicas.at((i + 1) % 3), id).await;
        let new = rotated.clone();
        assert!(
            logs_in(node, &new, "publisher").await,
            "the new login, via {i}"
        );
        assert!(
            !logs_in(node, &old, "publisher").await,
            "the old login, via {i}"
        );
        old = new;
    }
    // Two at once through two replicas: both land (compare-and-swap), and exactly one of
    // the two new passwords works: the one applied last.
    let path = format!("/v1/queues/{id}/logins/publisher/rotate");
    let (a, b) = tokio::join!(
        replicas.at(0).call("POST", &path, None),
        replicas.at(1).call("POST", &path, None)
    );
    assert_eq!((a.0, b.0), (200, 200));
    wait_until_applied(replicas.at(2), id).await;
    let works = [
        logs_in(node, &a.1, "publisher").await,
        logs_in(node, &b.1, "publisher").await,
    ];
    assert_eq!(works.iter().filter(|w| **w).count(), 1, "{works:?}");
    assert!(!logs_in(node, &old, "publisher").await);

    // Every replica answers the zone alike, with one serial.
    let zone = "q.test.thequeueexpert.com";
    let host = format!("{id}.{zone}");
    let dns: Vec<SocketAddr> = (0..3).map(|i| replicas.at(i).dns.unwrap()).collect();
    let serials: Vec<u32> = dns.iter().map(|d| soa_serial(*d, zone)).collect();
    assert!(serials.iter().all(|s| s == &serials[0]), "{serials:?}");
    let answers: Vec<_> = dns.iter().map(|d| dig(*d, &host, "AAAA", false)).collect();
    assert_eq!(answers[0].status, "NOERROR");
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");

    // A delete through one replica: gone from every replica's list and zone.
    let (status, deleting) = replicas
        .at(2)
        .call("DELETE", &format!("/v1/queues/{id}"), None)
        .await;
    assert_eq!(status, 200, "{deleting}");
    replicas.at(0).wait_for_status(id, "deleted").await;
    for (i, d) in dns.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while dig(*d, &host, "AAAA", false).status != "NXDOMAIN" {
            assert!(
                Instant::now() < deadline,
                "replica {i} still answers for {host}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert_eq!(replicas.nodes_of(id), 0, "its node stopped");

    // A replica killed: the others answer the API and the zone as before, at once.
    let other = &created[1];
    let other_host = format!("{}.{zone}", other["id"].as_str().unwrap());
    let before = dig(dns[1], &other_host, "AAAA", false);
    replicas.kill(0);
    let killed = Instant::now();
    let (status, _) = replicas.at(1).call("GET", "/v1/queues", None).await;
    assert_eq!(status, 200);
    eprintln!(
        "replica killed: the API answered from another in {:?}",
        killed.elapsed()
    );
    for d in &dns[1..] {
        assert_eq!(dig(*d, &other_host, "AAAA", false), before);
        assert_eq!(soa_serial(*d, zone), soa_serial(dns[1], zone));
    }
    let (status, created_after) = replicas.at(2).call("POST", "/v1/queues", Some(QUEUE)).await;
    assert_eq!(status, 201, "{created_after}");
    let id_after = created_after["id"].as_str().unwrap();
    replicas.at(1).wait_for_status(id_after, "running").await;
}

/// A leader change on the documented per-replica config (each replica's own URL first in
/// `node_urls`) keeps every node's process and connections: the new leader adopts the node it
/// finds serving. (It restarted every node, cutting every connection, because the bootstraps'
/// orders differed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_leaves_every_node_and_its_connections_serving() {
    let etcd = EtcdCluster::start(3);
    let mut replicas = Replicas::start(&etcd, 3, "");
    let leader = replicas.leader();
    let created = replicas.at(leader).create_queue(QUEUE).await;
    let id = created["id"].as_str().unwrap().to_string();
    let queue = replicas.at(leader).wait_for_status(&id, "running").await;
    let node = queue["node"].as_str().unwrap().to_string();
    let bootstrap = replicas.node_dir(&id).join("bootstrap.toml");
    let pid = process_naming(&bootstrap).expect("the queue's node runs");
    let capacity = serde_json::json!({"capacity": 1});
    let subscriber = &created["logins"]["subscriber"];
    let mut subscriber = login_with(&node, subscriber, "subscriber", capacity).await;

    replicas.kill(leader);
    let new_leader = replicas.leader();
    // The new leader has taken the queue's node on: adopted it, or (before) restarted it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let log = loop {
        let log = replicas.at(new_leader).log_text();
        if log.contains("adopted a running node") || log.contains("started a node") {
            break log;
        }
        assert!(Instant::now() < deadline, "no node taken on:\n{log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        !log.contains("restarting a node"),
        "the new leader restarted the node:\n{log}"
    );
    assert_eq!(
        process_naming(&bootstrap),
        Some(pid),
        "the same node process"
    );
    let publisher = &created["logins"]["publisher"];
    let mut publisher = login_with(&node, publisher, "publisher", serde_json::json!({})).await;
    let published = publisher
        .request(serde_json::json!({"body": "after the failover", "durability": 2}))
        .await;
    assert_eq!(published["status"], "Success.", "{published}");
    let delivered = subscriber.recv().await;
    assert_eq!(delivered["body"], "after the failover", "{delivered}");
}

/// A node heard by a replica that does not lead is not taken for silent: every replica shares
/// what it hears, and the leader judges from all of it. Here every replica lists replica 1
/// first, so the node reports to it while replica 0 leads; stopped, it is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_heard_by_a_replica_that_does_not_lead_is_kept_and_replaced_once_silent() {
    let etcd = EtcdCluster::start(1);
    let silence = "live_stats_secs = 1\nreplace_silent_after_intervals = 3\n";
    let replicas = Replicas::start_preferring(&etcd, 2, silence, 1);
    assert_eq!(replicas.leader(), 0);
    let created = replicas.at(0).create_queue(QUEUE).await;
    let id = created["id"].as_str().unwrap().to_string();
    let bootstrap = replicas.node_dir(&id).join("bootstrap.toml");
    let pid = process_naming(&bootstrap).expect("the queue's node runs");

    // Heard by replica 1 only, for twice the limit, while replica 0 looks every second.
    replicas.at(1).wait_for_live_reports(7).await;
    assert_eq!(
        replicas.at(0).live_reports().await,
        0,
        "the leader hears nothing itself"
    );
    let log = replicas.at(0).log_text();
    assert!(!log.contains("replacing it"), "{log}");
    assert_eq!(process_naming(&bootstrap), Some(pid), "the same node");

    signal(pid, libc::SIGSTOP);
    replicas.at(0).wait_for_log("a silent node was replaced", 1);
    let replacement = process_naming(&bootstrap).expect("a node runs");
    assert_ne!(replacement, pid);
    let publisher = &created["logins"]["publisher"];
    let node = replicas.at(0).wait_for_status(&id, "running").await["node"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(logs_in(&node, publisher, "publisher").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_create_is_replaced_within_its_lease_and_nothing_runs_twice() {
    let etcd = EtcdCluster::start(3);
    let mut replicas = Replicas::start(&etcd, 2, "");
    let leader = replicas.leader();
    let follower = 1 - leader;
    let (status, created) = replicas
        .at(follower)
        .call("POST", "/v1/queues", Some(QUEUE))
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    // Killed while its reconciler starts the node (or just after).
    let killed = Instant::now();
    replicas.kill(leader);
    assert_eq!(replicas.leader(), follower);
    let took_over = killed.elapsed();
    let queue = replicas.at(follower).wait_for_status(&id, "running").await;
    let running = killed.elapsed();
    eprintln!("failover: leader killed → new leader in {took_over:?}; the queue running {running:?} after the kill");
    assert_eq!(replicas.nodes_of(&id), 1, "one node for the queue, not two");
    let node = queue["node"].as_str().unwrap();
    let publisher = login_with(
        node,
        &created["logins"]["publisher"],
        "publisher",
        serde_json::json!({}),
    )
    .await;
    drop(publisher);
    assert!(replicas.node_dir(&id).join("bootstrap.toml").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_certificate_order_is_replaced_and_the_certificate_issued_once() {
    use controlplane::pebble::Pebble;
    let etcd = EtcdCluster::start(3);
    let ip = std::net::Ipv4Addr::LOCALHOST.into();
    let mut dns = Vec::new();
    for _ in 0..3 {
        dns.push(controlplane::dns::free_addr(ip).await.unwrap());
    }
    // The CA asks the last replica's DNS, which never leads here: the first one does.
    let pebble_dir = tempfile::tempdir().unwrap();
    let pebble = Pebble::start(dns[2], pebble_dir.path()).await.unwrap();
    let acme = format!(
        "[acme]\ndirectory = \"{}\"\nca_root = {:?}\n",
        pebble.directory, pebble.listener_ca
    );
    let mut replicas = Replicas::start_with_dns(&etcd, &dns, &acme);
    let (status, created) = replicas.at(1).call("POST", "/v1/queues", Some(QUEUE)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    // Killed as its order for the node's certificate starts.
    replicas
        .at(0)
        .wait_for_log("ordering a node's certificate", 1);
    let killed = Instant::now();
    let leader_log = replicas.kill(0);
    let new_leader = replicas.leader();
    let cert = replicas.node_dir(&id).join("data/tls/own-cert.pem");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&cert).is_ok_and(|pem| pem.contains("BEGIN CERTIFICATE")) {
        assert!(
            Instant::now() < deadline,
            "the node never got its certificate"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "failover: leader killed mid-order → the node's certificate issued by replica {new_leader} after {:?}",
        killed.elapsed()
    );
    replicas.at(1).wait_for_status(&id, "running").await;
    // Issued once, by the new leader; the killed one never finished its order.
    let issued = "a node's certificate was issued";
    assert_eq!(leader_log.matches(issued).count(), 0);
    let by_survivors: usize = [1, 2]
        .iter()
        .map(|i| replicas.at(*i).log_text().matches(issued).count())
        .sum();
    assert_eq!(by_survivors, 1);
    // The CA was told to look only once both live replicas' DNS served the value (the dead
    // one's word had lapsed); before the kill, all three were waited for.
    let new_log = replicas.at(new_leader).log_text();
    assert!(
        new_log.contains(
            "the DNS-01 values are served by every replica: the CA may validate replicas=2"
        ),
        "{new_log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_stops_leading_and_lets_its_nodes_go() {
    let etcd = EtcdCluster::start(3);
    let replicas = Replicas::start(&etcd, 2, "");
    let queue = replicas.at(1).create_queue(QUEUE).await;
    let id = queue["id"].as_str().unwrap();
    assert_eq!(replicas.nodes_of(id), 1, "started by the leader, replica 0");
    // Paused (a stall, a VM stolen from) past its lease: the other one leads meanwhile.
    let paused = replicas.at(0).pid();
    signal(paused, libc::SIGSTOP);
    replicas.at(1).wait_for_log(": leading", 1);
    signal(paused, libc::SIGCONT);
    // Back, it finds its lease over before doing anything as leader, and lets go.
    replicas.at(0).wait_for_log("no longer leading", 1);
    // Deleted through the new leader: the node stops, and the old leader, which started
    // it, does not start it again.
    let (status, _) = replicas
        .at(1)
        .call("DELETE", &format!("/v1/queues/{id}"), None)
        .await;
    assert_eq!(status, 200);
    replicas.at(1).wait_for_status(id, "deleted").await;
    assert_eq!(replicas.nodes_of(id), 0);
    // (A supervisor restarts a node 200 ms after it exits: a second is past that.)
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(replicas.nodes_of(id), 0, "not started again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_etcd_member_lost_changes_nothing_and_a_majority_lost_answers_503() {
    let mut etcd = EtcdCluster::start(3);
    let replicas = Replicas::start(&etcd, 2, "");
    let cp = replicas.at(0);
    let first = cp.create_queue(QUEUE).await;
    // A member down, whichever it is: the API answers, reads and writes.
    etcd.kill(etcd.leader().unwrap_or(0));
    // Every read answers, through the election too: a request that finds the dead member goes
    // on to the next, and one that finds no leader waits for the new one.
    for _ in 0..20 {
        let (status, listed) = cp.call("GET", "/v1/queues", None).await;
        assert_eq!(status, 200, "{listed}");
    }
    let started = Instant::now();
    let second = replicas.at(1).create_queue(QUEUE).await;
    eprintln!(
        "etcd leader killed: a create answered within {:?}",
        started.elapsed()
    );
    assert_eq!(ids(cp).await.len(), 2, "{first} {second}");
    // A second member down: no majority. Writes and (linearizable) reads are refused, never
    // answered from a stale copy.
    let alive: Vec<usize> = (0..3).filter(|i| etcd.is_alive(*i)).collect();
    etcd.kill(alive[0]);
    // (Its outcome is unknown, as with any write that timed out: etcd may still commit it
    // once a majority is back.)
    let (status, refused) = cp.call("POST", "/v1/queues", Some(QUEUE)).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{refused}"
    );
    let (status, refused) = cp.call("GET", "/v1/queues", None).await;
    assert_eq!(status, 503, "{refused}");
    // The majority back: so is the API, with everything.
    etcd.restart(alive[0]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _) = cp.call("GET", "/v1/queues", None).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the API never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = ids(cp).await;
    assert!(after.len() == 2 || after.len() == 3, "{after:?}");
}

/// Writes sent from just before to a second and a half after the etcd leader is killed are
/// all answered: a try stuck at the dead leader, or at a follower waiting for it, takes only a
/// share of `timeout_secs`, and the write is sent again to the next member once the election
/// is over. (Each try could take all of `timeout_secs`, and several writes answered 503
/// exactly `timeout_secs` after they were sent.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_flight_when_the_etcd_leader_dies_are_all_answered() {
    let mut etcd = EtcdCluster::start(3);
    let replicas = Replicas::start(&etcd, 1, "");
    let cp = replicas.at(0);
    let until = Instant::now() + Duration::from_millis(1800);
    let writer = |n: usize| async move {
        let mut answers = Vec::new();
        let mut i = 0;
        while Instant::now() < until {
            let body = serde_json::json!({ "name": format!("writer {n} account {i}") });
            let sent = Instant::now();
            let (status, reply) = cp
                .call("POST", "/v1/accounts", Some(&body.to_string()))
                .await;
            answers.push((status, sent.elapsed(), reply));
            i += 1;
        }
        answers
    };
    let killer = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let leader = etcd.leader().expect("an etcd leader");
        etcd.kill(leader);
    };
    let (_, a, b, c, d) = tokio::join!(killer, writer(0), writer(1), writer(2), writer(3));
    let answers: Vec<_> = [a, b, c, d].into_iter().flatten().collect();
    let slowest = answers.iter().map(|(_, took, _)| *took).max().unwrap();
    let failed: Vec<_> = answers
        .iter()
        .filter(|(status, ..)| *status != 201)
        .collect();
    eprintln!(
        "etcd leader killed under writes: {} writes, {} failed, the slowest answered in {slowest:?}",
        answers.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_backup_restores_into_etcd_and_the_running_nodes_carry_on() {
    // A one-host control plane on sled: a queue, a backup, then a rotation and a second queue
    // the backup does not have.
    let mut single = ControlPlane::start();
    let queue = single.create_queue(QUEUE).await;
    let id = queue["id"].as_str().unwrap().to_string();
    let (status, backup) =
        http_text(single.addr, "GET", "/v1/backup", Some(&single.token), None).await;
    assert_eq!(status, 200);
    assert!(backup.lines().count() >= 3, "{backup}");
    let rotate = format!("/v1/queues/{id}/logins/publisher/rotate");
    let (status, rotated_after_backup) = single.call("POST", &rotate, None).await;
    assert_eq!(status, 200, "{rotated_after_backup}");
    // Its node's credential too: the restored record knows only the one before.
    let path = format!("/v1/queues/{id}/node-credential/rotate");
    let (status, rotation) = single.call("POST", &path, None).await;
    assert_eq!(status, 200, "{rotation}");
    let newer = single.create_queue(QUEUE).await;
    let newer_id = newer["id"].as_str().unwrap().to_string();
    // Its node's credential rotated once, and a message it holds durably.
    let path = format!("/v1/queues/{newer_id}/node-credential/rotate");
    let (status, rotation) = single.call("POST", &path, None).await;
    assert_eq!(status, 200, "{rotation}");
    let newer_node = node_of(&newer).to_string();
    let mut publisher = login_with(
        &newer_node,
        &newer["logins"]["publisher"],
        "publisher",
        serde_json::json!({}),
    )
    .await;
    let reply = publisher
        .request(serde_json::json!({"body": "made after the backup", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    // The host is lost; its nodes go on running.
    single.kill();
    let nodes_dir = single.dir.path().join("data");

    // Restored into an etcd cluster, once: the queue, its logins' hashes and the node secret.
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let endpoints = format!("{:?}", etcd.endpoint(0));
    let store = format!("[store]\nkind = \"etcd\"\nendpoints = [{endpoints}]\n");
    let restore = |prefix: &str, backup: &str| {
        let config = format!(
            "data_dir = {:?}\ntoken = \"t\"\ncluster = \"test\"\n{store}prefix = \"{prefix}\"\n",
            dir.path().join(prefix.trim_matches('/'))
        );
        std::fs::write(dir.path().join("cp.toml"), config).unwrap();
        std::fs::write(dir.path().join("backup"), backup).unwrap();
        std::process::Command::new(qe_tests::controlplane_binary())
            .args(["restore", "--config"])
            .arg(dir.path().join("cp.toml"))
            .arg("--from")
            .arg(dir.path().join("backup"))
            .output()
            .unwrap()
    };
    let restored = restore("/qe/test/", &backup);
    let stderr = String::from_utf8_lossy(&restored.stderr).to_string();
    assert!(restored.status.success(), "{stderr}");
    assert!(
        !restore("/qe/test/", &backup).status.success(),
        "not twice into one store"
    );

    // A control plane on it, at the lost one's address, with its nodes: they carry on with
    // it, watching from the config version they serve.
    let extra = format!("local_nodes_dir = {nodes_dir:?}\n{store}");
    let cp = ControlPlane::start_listening(&single.addr.to_string(), &extra);
    // The queue created after the backup is unknown here: its node is no leftover to remove.
    cp.wait_for_log("created after the backup it was restored from", 1);
    let newer_bootstrap = nodes_dir
        .join("nodes")
        .join(&newer_id)
        .join("bootstrap.toml");
    assert!(process_naming(&newer_bootstrap).is_some(), "left running");
    assert!(
        nodes_dir
            .join("nodes")
            .join(&newer_id)
            .join("data")
            .exists(),
        "with its data"
    );
    // It is listed as a stray, and adopted: its record comes back from what its node kept,
    // the same process serves it (with its logins and its message), and its node takes a
    // fresh credential.
    let (status, strays) = cp.call("GET", "/v1/strays", None).await;
    assert_eq!(status, 200, "{strays}");
    assert_eq!(
        strays["strays"],
        serde_json::json!([{"id": newer_id, "adoptable": true}])
    );
    // Only a node of the queue reports itself as its stray: a token that is no credential of
    // it is refused, and a known queue has no stray.
    let report = |id: &str| format!("/v1/nodes/{id}/stray");
    let wrong = Some("0f0f0f0f");
    let (status, _) = qe_tests::http(cp.addr, "POST", &report(&newer_id), wrong, Some("{}")).await;
    assert_eq!(status, 401);
    let (status, _) = qe_tests::http(cp.addr, "POST", &report(&id), wrong, Some("{}")).await;
    assert_eq!(status, 409);
    // A standby's report, with the node's own credential, is refused too: its config names
    // the node it follows, and kept it would make the record say the standby serves.
    let bootstrap: toml::Table =
        toml::from_str(&std::fs::read_to_string(&newer_bootstrap).unwrap()).unwrap();
    let node_token = bootstrap["node_token"].as_str();
    let kept = newer_bootstrap.with_file_name("data/desired-config.json");
    let mut standbys: Value = serde_json::from_slice(&std::fs::read(kept).unwrap()).unwrap();
    standbys["replication"] = serde_json::json!({
        "key_hash": "kept",
        "follow": {"url": "wss://its-node/", "key": "k"},
    });
    let body = standbys.to_string();
    let (status, said) =
        qe_tests::http(cp.addr, "POST", &report(&newer_id), node_token, Some(&body)).await;
    assert_eq!(status, 409, "{said}");
    let newer_pid = process_naming(&newer_bootstrap).unwrap();
    let (status, adopted) = cp
        .call("POST", &format!("/v1/strays/{newer_id}/adopt"), None)
        .await;
    assert_eq!(status, 201, "{adopted}");
    let adopted = cp.wait_for_status(&newer_id, "running").await;
    assert_eq!(adopted["tier"], newer["tier"]);
    wait_until_applied(&cp, &newer_id).await;
    assert_eq!(
        process_naming(&newer_bootstrap),
        Some(newer_pid),
        "not restarted"
    );
    let mut subscriber = login_with(
        &newer_node,
        &newer["logins"]["subscriber"],
        "subscriber",
        serde_json::json!({"capacity": 1}),
    )
    .await;
    assert_eq!(subscriber.recv().await["body"], "made after the backup");
    let (status, again) = cp
        .call("POST", &format!("/v1/strays/{newer_id}/adopt"), None)
        .await;
    assert_eq!(status, 409, "{again}");
    let (_, strays) = cp.call("GET", "/v1/strays", None).await;
    assert_eq!(strays["strays"], serde_json::json!([]));
    // Audited: the adoption (the one refused is counted, not kept).
    let adoptions = cp.audited("queue.adopt").await;
    let results: Vec<_> = adoptions.iter().map(|entry| &entry["result"]).collect();
    assert_eq!(results, ["ok"], "{adoptions:?}");
    assert_eq!(adoptions[0]["target"], newer_id.as_str());

    // The known one is taken on, and changes reach its node again (though it served a
    // config version the backup never had, and presents a credential rotated after the
    // backup): exactly the new password works.
    cp.wait_for_status(&id, "running").await;
    let (status, rotated) = cp.call("POST", &rotate, None).await;
    assert_eq!(status, 200, "applied: {rotated}");
    let node = cp.call("GET", &format!("/v1/queues/{id}"), None).await.1["node"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(logs_in(&node, &rotated, "publisher").await);
    assert!(!logs_in(&node, &rotated_after_backup, "publisher").await);

    // A backup of the etcd store holds no leader key (a restore would keep it for ever):
    // restored elsewhere, a control plane leads there and runs a new queue.
    let (status, etcd_backup) =
        http_text(cp.addr, "GET", "/v1/backup", Some(&cp.token), None).await;
    assert_eq!(status, 200);
    assert!(!etcd_backup.contains("\"key\":\"leader\""), "{etcd_backup}");
    let restored = restore("/qe/again/", &etcd_backup);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    drop(cp);
    let again = ControlPlane::start_with(&format!("{store}prefix = \"/qe/again/\"\n"));
    again.wait_for_log(": leading", 1);
    again.create_queue(QUEUE).await;
}
