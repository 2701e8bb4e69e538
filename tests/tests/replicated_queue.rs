//! A queue made with `replicas: 2` through the API (issue 35, placement): the local provider
//! runs a standby process beside its node, keyed with a key derived from the node secret;
//! durability 2 is answered Success once the standby is in sync (the live report says so),
//! 507 after the standby's process dies, Success again once the provider has started it
//! again; a restarted control plane adopts the standby; a delete stops it and removes its
//! copy. Real binaries on loopback.

use qe_tests::{assert_failure, http_response, login_with, node_of, Client, ControlPlane};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Live reports every second, a reconcile pass every second (a restarted standby's pid is
/// recorded at the next).
const CONFIG: &str = "live_stats_secs = 1\nreconcile_every_secs = 1\n";
const REPLICATED: &str =
    r#"{"tier":"standard","region":"local","instance_type":"local","replicas":2}"#;

/// Asks for queue `id` until `wanted` holds of it; panics after 60 s.
async fn wait_for(
    cp: &ControlPlane,
    id: &str,
    what: &str,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
        if wanted(&queue) {
            return queue;
        }
        assert!(Instant::now() < deadline, "never {what}: {queue}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn in_sync(queue: &Value) -> bool {
    queue["live"]["standby"]["in_sync"] == true
}

fn standby_pid(queue: &Value) -> Option<u32> {
    queue["resources"]["standby_process"].as_str()?.parse().ok()
}

/// Publishes at durability 2 until the reply has `status`; panics after 30 s.
async fn publish_until(publisher: &mut Client, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = publisher
            .request(json!({"body": "d2", "durability": 2}))
            .await;
        if reply["status"]
            .as_str()
            .is_some_and(|s| s.starts_with(status))
        {
            return reply;
        }
        assert!(Instant::now() < deadline, "never {status}: {reply}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether process `pid` runs (one that exited and waits to be reaped by whoever adopted it
/// does not).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command's closing parenthesis.
    let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
    !matches!(state, Some(Some('Z' | 'X')) | None)
}

/// The processes whose arguments include `needle`.
fn processes_with(needle: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .filter(|cmdline| {
            cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == needle.as_bytes())
        })
        .count()
}

#[tokio::test]
async fn a_replicated_queue_answers_durability_2_only_with_its_standby_in_sync() {
    let cp = ControlPlane::start_with(CONFIG);
    let (status, created) = cp.call("POST", "/v1/queues", Some(REPLICATED)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["replicas"], 2, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    cp.wait_for_status(&id, "running").await;
    let queue = wait_for(&cp, &id, "in sync", |q| {
        in_sync(q) && standby_pid(q).is_some()
    })
    .await;
    // Its node said it runs with a standby.
    assert_eq!(queue["node_standby"], true, "{queue}");
    let pid = standby_pid(&queue).unwrap();
    let standby_dir = queue["resources"]["standby_directory"]
        .as_str()
        .unwrap()
        .to_string();
    // The key is an environment variable, never an argument others can read.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        args.contains("--standby-of") && !args.contains("replication-key"),
        "{args}"
    );

    let node = node_of(&queue).to_string();
    let mut publisher = login_with(
        &node,
        &created["logins"]["publisher"],
        "publisher",
        json!({}),
    )
    .await;
    let reply = publisher
        .request(json!({"body": "on two disks", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    // The standby dies: durability 2 cannot be synced on two disks.
    // SAFETY: kill takes a pid and a signal; the standby is the provider's child, not ours.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    let refused = publish_until(&mut publisher, "Failure").await;
    assert_failure(&refused, 507);
    // The provider starts it again on its copy; it catches up and Success comes back.
    publish_until(&mut publisher, "Success").await;
    let queue = wait_for(&cp, &id, "recorded again", |q| {
        in_sync(q) && standby_pid(q).is_some_and(|new| new != pid)
    })
    .await;
    let restarted = standby_pid(&queue).unwrap();
    assert!(alive(restarted));

    // A control plane started again adopts the standby: the same process, no twin.
    let cp = cp.restart();
    cp.wait_for_log("adopted a running standby", 1);
    let queue = wait_for(&cp, &id, "in sync after the restart", in_sync).await;
    assert_eq!(standby_pid(&queue), Some(restarted), "{queue}");
    let data = format!("{standby_dir}/data");
    assert_eq!(processes_with(&data), 1, "one standby on {data}");

    // Deleted: the standby stops and its copy goes with the node's data.
    let (status, _) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert!(status == 200 || status == 202, "{status}");
    cp.wait_for_status(&id, "deleted").await;
    assert!(!alive(restarted), "the standby stopped");
    assert!(!std::path::Path::new(&data).exists(), "its copy removed");
}

/// The standby hangs (SIGSTOP: its process runs, and does nothing) on an idle queue: its node,
/// whose pings it leaves unanswered, drops it and reports it absent; once it has been absent
/// for the silence limit (6 s here) the control plane kills it and starts another on its copy,
/// which catches up, and durability 2 is Success again. (A hung standby was never replaced
/// before: its process ran, so the provider found it running.)
#[tokio::test]
async fn a_hung_standby_is_replaced_once_its_node_has_gone_without_it_for_the_silence_limit() {
    let cp = ControlPlane::start_with(CONFIG);
    let (status, created) = cp.call("POST", "/v1/queues", Some(REPLICATED)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    cp.wait_for_status(&id, "running").await;
    // In sync, and attached long enough to count as staying (half the limit here).
    let queue = wait_for(&cp, &id, "in sync, staying", |q| {
        in_sync(q) && standby_pid(q).is_some() && q["standby_absent_since"].is_null()
    })
    .await;
    let hung = standby_pid(&queue).unwrap();
    let node = node_of(&queue).to_string();
    let publisher = created["logins"]["publisher"].clone();
    let mut publisher = login_with(&node, &publisher, "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "on two disks", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    // Nothing is published meanwhile: the node notices by itself.
    // SAFETY: kill takes a pid and a signal; the standby is the provider's child, not ours.
    unsafe { libc::kill(hung as libc::pid_t, libc::SIGSTOP) };
    // (The record is written just after the live numbers are kept: both are waited for.)
    let absent = wait_for(&cp, &id, "reported absent", |q| {
        let absent_ms = q["live"]["standby"]["absent_ms"].as_u64();
        absent_ms.is_some_and(|ms| ms > 0) && q["standby_absent_since"].is_u64()
    })
    .await;
    assert_eq!(absent["live"]["standby"]["in_sync"], false, "{absent}");
    wait_for(&cp, &id, "replaced", |q| {
        let placed_anew = standby_pid(q).is_some_and(|new| new != hung);
        placed_anew && in_sync(q) && q["standby_absent_since"].is_null()
    })
    .await;
    assert!(!alive(hung), "the hung standby was killed");
    let audited = cp.audited("standby.replace").await;
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(
        audited[0]["reason"],
        "its node has had no standby attached for more than 6 s"
    );
    let token = Some(cp.token.as_str());
    let (_, metrics) = qe_tests::http_text(cp.addr, "GET", "/metrics", token, None).await;
    assert!(
        metrics.contains("\nqe_standbys_replaced_total 1\n"),
        "{metrics}"
    );
    // The same publisher, on the same connection: on two disks again.
    publish_until(&mut publisher, "Success").await;
}

/// The standby flaps: it hangs (SIGSTOP) until its node drops it (5 s unanswered), runs
/// again (SIGCONT) and attaches again, and hangs again as soon as it is in sync, each time
/// before it has stayed attached for its settling time (7.5 s here, half the 15 s limit: a
/// limit longer than one hang, so that only the flapping adds up to it). Its absence goes on
/// across those attaches, from when it first went silent, so it is replaced once that is the
/// limit ago. (Before, each attach ended its absence, and a standby that kept being dropped
/// was never replaced.)
#[tokio::test]
async fn a_standby_that_keeps_being_dropped_is_replaced() {
    if qe_tests::on_etcd() {
        // The record's side (the absence kept, judged, replaced) is the hung standby's test's,
        // which runs on both stores; this one's 30 s are the node's rule.
        return eprintln!("the node's rule, the same on every store: run on sled only");
    }
    let cp = ControlPlane::start_with(&format!("{CONFIG}replace_silent_after_intervals = 15\n"));
    let (status, created) = cp.call("POST", "/v1/queues", Some(REPLICATED)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let queue = wait_for(&cp, &id, "in sync, staying", |q| {
        in_sync(q) && standby_pid(q).is_some() && q["standby_absent_since"].is_null()
    })
    .await;
    let flapping = standby_pid(&queue).unwrap();
    let signal = |signal| {
        // SAFETY: kill takes a pid and a signal; the standby is the provider's child, not ours.
        unsafe { libc::kill(flapping as libc::pid_t, signal) };
    };
    let mut attaches = 0;
    loop {
        signal(libc::SIGSTOP);
        // Dropped by its node (5 s without an answer), then running again: it attaches
        // again and catches up, or it is replaced meanwhile.
        let dropped = wait_for(&cp, &id, "dropped", |q| {
            !in_sync(q) || standby_pid(q) != Some(flapping)
        })
        .await;
        if standby_pid(&dropped) != Some(flapping) {
            break;
        }
        signal(libc::SIGCONT);
        let back = wait_for(&cp, &id, "back in sync, or replaced", |q| {
            in_sync(q) || standby_pid(q) != Some(flapping)
        })
        .await;
        if standby_pid(&back) != Some(flapping) {
            break;
        }
        attaches += 1;
        assert!(
            attaches < 6,
            "never replaced, though attached again {attaches} times: {back}"
        );
    }
    assert!(attaches >= 1, "it attached again before it was replaced");
    assert!(!alive(flapping), "the flapping standby was killed");
    let audited = cp.audited("standby.replace").await;
    assert_eq!(audited.len(), 1, "{audited:?}");
    // The new one stays: in sync, and no longer absent.
    wait_for(&cp, &id, "in sync, staying", |q| {
        in_sync(q) && q["standby_absent_since"].is_null()
    })
    .await;
}

/// The node's disk is lost (its data directory removed, the process killed): the provider
/// starts it again on its standby's copy instead of on nothing, so every message acknowledged
/// at durability 2 is delivered; a new standby follows, and durability 2 is Success again.
/// (Without the promotion the node starts empty: nothing is delivered.)
#[tokio::test]
async fn a_node_whose_data_is_lost_starts_again_on_its_standbys_copy() {
    let cp = ControlPlane::start_with(CONFIG);
    let (_, created) = cp.call("POST", "/v1/queues", Some(REPLICATED)).await;
    let id = created["id"].as_str().unwrap().to_string();
    let logins = &created["logins"];
    let queue = wait_for(&cp, &id, "in sync", |q| {
        in_sync(q) && standby_pid(q).is_some()
    })
    .await;
    let node = node_of(&queue).to_string();
    // Time enough for the resume below on a loaded machine (the settings go to the standby).
    let mut admin = login_with(&node, &logins["admin"], "admin", json!({})).await;
    let set = json!({"cmd": "setcfg", "saved-session-timeout-secs": 60});
    let reply = admin.request(set).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    drop(admin);
    // A subscriber holds the first 5 when the disk goes: it resumes on the copy with them.
    let login = &logins["subscriber"];
    let mut holder = Client::connect_url(&node).await;
    let holding = json!({
        "username": login["username"], "password": login["password"],
        "role": "subscriber", "queuetype": "distribute", "capacity": 5,
    });
    let reply = holder.request(holding.clone()).await;
    let holder_session = reply["sessionid"].as_str().unwrap().to_string();
    let mut publisher = login_with(&node, &logins["publisher"], "publisher", json!({})).await;
    let acknowledged: Vec<String> = (0..30).map(|n| format!("acknowledged {n:02}")).collect();
    for body in &acknowledged {
        let reply = publisher
            .request(json!({"body": body, "durability": 2}))
            .await;
        assert_eq!(reply["status"], "Success.", "{reply}");
    }
    drop(publisher);
    let (held, acknowledged) = acknowledged.split_at(5);
    for body in held {
        assert_eq!(holder.next_delivery().await.0, *body);
    }
    // The disk goes, then the process.
    let node_pid: i32 = queue["resources"]["process"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    std::fs::remove_dir_all(cp.node_dir(&id).join("data")).unwrap();
    // SAFETY: kill takes a pid and a signal.
    unsafe { libc::kill(node_pid, libc::SIGKILL) };
    cp.wait_for_log("its standby's copy is its data now", 1);

    // Its new process is recorded once it listens.
    let old_pid = node_pid.to_string();
    wait_for(&cp, &id, "started again", |q| {
        q["resources"]["process"]
            .as_str()
            .is_some_and(|pid| pid != old_pid)
    })
    .await;
    let capacity = json!({"capacity": 100});
    let mut subscriber = login_with(&node, &logins["subscriber"], "subscriber", capacity).await;
    let mut delivered = Vec::new();
    while delivered.len() < acknowledged.len() {
        let frame = subscriber.recv().await;
        let Some(body) = frame["body"].as_str() else {
            continue;
        };
        delivered.push(body.to_string());
        subscriber
            .send_json(&json!({"id": frame["id"], "ack": 1}))
            .await;
    }
    assert_eq!(
        delivered, acknowledged,
        "none that the holder's saved session holds"
    );
    let mut holder = Client::connect_url(&node).await;
    let mut resume = holding;
    resume["sessionid"] = holder_session.into();
    resume["replay"] = true.into();
    let reply = holder.request(resume).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    for body in held {
        let (delivered, id) = holder.next_delivery().await;
        assert_eq!(delivered, *body);
        holder.send_json(&json!({"id": id, "ack": 1})).await;
    }
    // A new standby, on an empty directory, catches up: durability 2 is on two disks again.
    wait_for(&cp, &id, "a new standby in sync", |q| {
        in_sync(q) && standby_pid(q).is_some_and(|pid| pid != standby_pid(&queue).unwrap())
    })
    .await;
    assert_at_epoch(&cp, &id, 1).await;
    let mut publisher = login_with(&node, &logins["publisher"], "publisher", json!({})).await;
    publish_until(&mut publisher, "Success").await;
}

#[tokio::test]
async fn a_standby_follows_its_node_over_tls_by_the_local_cas_root() {
    let cp = ControlPlane::start_with(&format!("{CONFIG}local_ca = true\n"));
    let (status, created) = cp.call("POST", "/v1/queues", Some(REPLICATED)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let queue = wait_for(&cp, &id, "in sync", in_sync).await;
    assert!(node_of(&queue).starts_with("wss://"), "{queue}");
}

/// A queue made with `replicas: 2` on `cp`, once its standby is in sync: its id, and its
/// node's process.
async fn replicated_in_sync(cp: &ControlPlane) -> (String, String) {
    let (_, created) = cp.call("POST", "/v1/queues", Some(REPLICATED)).await;
    let id = created["id"].as_str().unwrap().to_string();
    let queue = wait_for(cp, &id, "in sync", |q| {
        in_sync(q) && standby_pid(q).is_some()
    })
    .await;
    let node_pid = queue["resources"]["process"].as_str().unwrap().to_string();
    (id, node_pid)
}

/// Queue `id`'s node loses its disk: its data directory removed, then its process `pid`
/// killed.
fn lose_the_disk(cp: &ControlPlane, id: &str, pid: &str) {
    std::fs::remove_dir_all(cp.node_dir(id).join("data")).unwrap();
    // SAFETY: kill takes a pid and a signal.
    unsafe { libc::kill(pid.parse().unwrap(), libc::SIGKILL) };
}

/// Waits until queue `id`'s node, no longer process `old_pid`, serves again with a standby in
/// sync (its new process is recorded once it listens, which with certificates it does once it
/// has one), and checks the promotion was audited.
async fn served_again_on_the_copy(cp: &ControlPlane, id: &str, old_pid: &str) {
    wait_for(cp, id, "serving again", |q| {
        let process = q["resources"]["process"].as_str();
        in_sync(q) && process.is_some_and(|pid| pid != old_pid)
    })
    .await;
    let restarts = cp.audited("node.restart").await;
    let promoted = restarts
        .iter()
        .any(|entry| entry.to_string().contains("standby's copy"));
    assert!(promoted, "{restarts:?}");
    assert_at_epoch(cp, id, 1).await;
}

/// Queue `id` is at `epoch` (moved on by each promotion): in its record, in its node's copy
/// (taken from its config), and in its standby's command line. (A standby in sync says the
/// node took it: a standby given an epoch follows no node at a lower one.)
async fn assert_at_epoch(cp: &ControlPlane, id: &str, epoch: u64) {
    let queue = wait_for(cp, id, "in sync", in_sync).await;
    assert_eq!(queue["epoch"], epoch, "{queue}");
    let kept = std::fs::read_to_string(cp.node_dir(id).join("data/messages/epoch")).unwrap();
    assert_eq!(kept, format!("{epoch}\n"));
    let pid = standby_pid(&queue).unwrap();
    let command_line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let given = format!("--epoch={epoch}");
    let given = command_line
        .split(|&byte| byte == 0)
        .any(|argument| argument == given.as_bytes());
    assert!(given, "{}", String::from_utf8_lossy(&command_line));
}

/// With certificates: the promoted copy has no certificate of the node's (it went with the
/// disk); the promotion is audited and moves the queue's certificate generation on, so the
/// node gets a new one at once (not after the hour between two issues) and serves again.
#[tokio::test]
async fn a_promoted_node_gets_its_certificate_again() {
    let cp = ControlPlane::start_with(&format!("{CONFIG}local_ca = true\n"));
    let (id, node_pid) = replicated_in_sync(&cp).await;
    lose_the_disk(&cp, &id, &node_pid);
    cp.wait_for_log("its standby's copy is its data now", 1);
    served_again_on_the_copy(&cp, &id, &node_pid).await;
}

/// The disk is lost while no control plane runs: the next one promotes the standby's copy
/// before it starts the node (so the node, with certificates, is issued a new one at once),
/// and audits it.
#[tokio::test]
async fn a_control_plane_started_again_promotes_the_copy_before_it_starts_the_node() {
    let mut cp = ControlPlane::start_with(&format!("{CONFIG}local_ca = true\n"));
    let (id, node_pid) = replicated_in_sync(&cp).await;
    cp.kill();
    lose_the_disk(&cp, &id, &node_pid);
    let cp = cp.start_again();
    served_again_on_the_copy(&cp, &id, &node_pid).await;
}

/// The node's directory goes while its process still runs (it writes through the files it
/// holds open): the reconciler kills it before the copy takes the directory's place, so no
/// node goes on beside the promoted copy, and the queue serves from the copy at epoch 1.
/// (Without the fence the old process stays, recorded as the node: never served again.)
#[tokio::test]
async fn a_node_whose_directory_goes_while_it_runs_is_fenced_before_the_promotion() {
    let cp = ControlPlane::start_with(CONFIG);
    let (id, node_pid) = replicated_in_sync(&cp).await;
    std::fs::remove_dir_all(cp.node_dir(&id).join("data")).unwrap();
    served_again_on_the_copy(&cp, &id, &node_pid).await;
    assert!(!alive(node_pid.parse().unwrap()), "the old node still runs");
}

#[tokio::test]
async fn replicas_are_1_or_2_and_2_only_on_the_standard_tier() {
    let cp = ControlPlane::start();
    let devtest = r#"{"tier":"devtest","region":"local","instance_type":"local","replicas":2}"#;
    let (status, refused) = cp.call("POST", "/v1/queues", Some(devtest)).await;
    assert_eq!(status, 400, "{refused}");
    let three = r#"{"tier":"standard","region":"local","instance_type":"local","replicas":3}"#;
    let (status, refused) = cp.call("POST", "/v1/queues", Some(three)).await;
    assert_eq!(status, 400, "{refused}");
    // One replica: no standby, and the view says 1.
    let one = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let (status, created) = cp.call("POST", "/v1/queues", Some(one)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["replicas"], 1, "{created}");
    let id = created["id"].as_str().unwrap();
    let queue = cp.wait_for_status(id, "running").await;
    assert!(queue["resources"]["standby_process"].is_null(), "{queue}");
    assert_eq!(queue["node_standby"], false, "{queue}");
}

/// Queue `id`'s node's config as the node channel answers it, asked with the node's own
/// credential and the header lines `takes`.
async fn config_of(cp: &ControlPlane, id: &str, takes: &str) -> Value {
    let bootstrap = std::fs::read_to_string(cp.node_bootstrap(id)).unwrap();
    let bootstrap: toml::Table = toml::from_str(&bootstrap).unwrap();
    // The node's credential as it is now (rotated since its bootstrap, or not).
    let token = std::fs::read_to_string(cp.node_dir(id).join("data/node-token"))
        .unwrap_or_else(|_| bootstrap["node_token"].as_str().unwrap().to_string());
    let request = format!(
        "GET /v1/nodes/{id}/config HTTP/1.1\r\nHost: cp\r\nAuthorization: Bearer {}\r\n\
         {takes}Connection: close\r\n\r\n",
        token.trim()
    );
    let response = http_response(cp.addr, &request).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body = &response[response.find("\r\n\r\n").unwrap() + 4..];
    serde_json::from_str::<Value>(body).unwrap()
}

/// The key's hash goes only to a node that says it takes it (a node from before standbys
/// reads its config with `deny_unknown_fields` and would refuse it), and only for a queue
/// with a standby.
#[tokio::test]
async fn the_standbys_key_hash_goes_only_to_a_node_that_takes_it() {
    let cp = ControlPlane::start_with(CONFIG);
    let (_, created) = cp.call("POST", "/v1/queues", Some(REPLICATED)).await;
    let id = created["id"].as_str().unwrap().to_string();
    cp.wait_for_status(&id, "running").await;
    let old_node = config_of(&cp, &id, "").await;
    assert!(old_node.get("replication").is_none(), "{old_node}");
    let takes = "qe-node-takes: replication\r\n";
    let new_node = config_of(&cp, &id, takes).await;
    let hash = new_node["replication"]["key_hash"].as_str().unwrap();
    assert!(hash.starts_with("sha256:"), "{new_node}");
    // The epoch, likewise, only to a node that says it takes it.
    assert!(new_node["replication"].get("epoch").is_none(), "{new_node}");
    let newer_node = config_of(&cp, &id, "qe-node-takes: replication, epoch\r\n").await;
    assert_eq!(newer_node["replication"]["epoch"], 0, "{newer_node}");
    // A queue of one replica: none, whatever its node takes.
    let one = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let (_, alone) = cp.call("POST", "/v1/queues", Some(one)).await;
    let alone = alone["id"].as_str().unwrap().to_string();
    cp.wait_for_status(&alone, "running").await;
    let config_of_alone = config_of(&cp, &alone, takes).await;
    assert!(
        config_of_alone.get("replication").is_none(),
        "{config_of_alone}"
    );
}

/// A request on the node channel with `token`: its status and body.
async fn as_node(
    cp: &ControlPlane,
    token: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: cp\r\nAuthorization: Bearer {token}\r\n\
         qe-node-takes: replication, epoch\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = http_response(cp.addr, &request).await;
    let status = response[9..12].parse().unwrap();
    let body = response[response.find("\r\n\r\n").unwrap() + 4..].to_string();
    (status, body)
}

/// A queue's standby on a machine of its own (EC2) has a credential of its own, which the
/// control plane tells from its node's: with it, the config names the node to follow and
/// gives the key itself; it may not report, confirm a config or have a certificate issued.
/// (The local provider hands its standbys the key; any provider's queue has the slot.)
#[tokio::test]
async fn a_standby_instances_credential_reads_what_to_follow_and_nothing_else() {
    if qe_tests::on_etcd() {
        // The test derives the second machine's credential from sled's node-secret file; on
        // etcd the secret is in the store (the code that derives and checks it is the same).
        return eprintln!("derived from sled's node-secret file: on etcd it is in the store");
    }
    let cp = ControlPlane::start_with(CONFIG);
    let (_, created) = cp.call("POST", "/v1/queues", Some(REPLICATED)).await;
    let id = created["id"].as_str().unwrap().to_string();
    cp.wait_for_status(&id, "running").await;
    let (_, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    let secret = std::fs::read(cp.dir.path().join("data/node-secret")).unwrap();
    let derived =
        |label: String| qe_shared::hex(&qe_shared::hmac::hmac_sha256(&secret, label.as_bytes()));
    let second_token = derived(format!("second/{id}/0"));
    let key = derived(format!("replication/{id}"));

    let path = format!("/v1/nodes/{id}/config");
    let (status, body) = as_node(&cp, &second_token, "GET", &path, "").await;
    assert_eq!(status, 200, "{body}");
    let config: Value = serde_json::from_str(&body).unwrap();
    let follow = &config["replication"]["follow"];
    assert_eq!(follow["url"], queue["node"], "{config}");
    assert_eq!(follow["key"], key.as_str());
    // `ws://HOST:PORT/`: the node's port, at the address its name resolves to.
    let node = queue["node"].as_str().unwrap().trim_end_matches('/');
    let port: u16 = node.rsplit(':').next().unwrap().parse().unwrap();
    let v6: std::net::Ipv6Addr = queue["addresses"]["v6"].as_str().unwrap().parse().unwrap();
    let connect = std::net::SocketAddr::new(v6.into(), port);
    assert_eq!(follow["connect"], connect.to_string(), "the node's address");
    // The node's own config names nothing to follow.
    let node = config_of(&cp, &id, "qe-node-takes: replication, epoch\r\n").await;
    assert!(node["replication"].get("follow").is_none(), "{node}");

    // Nothing but reading: no confirmation, no report, no certificate.
    let applied = r#"{"version":1}"#;
    let refused = [
        ("POST", "applied", applied),
        ("POST", "reports", r#"{"records":[]}"#),
        ("POST", "certificate", r#"{"csr_pem":""}"#),
        ("POST", "redrive", "{}"),
    ];
    for (method, what, body) in refused {
        let path = format!("/v1/nodes/{id}/{what}");
        let (status, answer) = as_node(&cp, &second_token, method, &path, body).await;
        assert_eq!(status, 403, "{what}: {answer}");
    }
    // It may fetch the node's builds (a build no one serves: not found, not forbidden).
    let build = format!("/v1/nodes/{id}/builds/{}", "0".repeat(64));
    let (status, answer) = as_node(&cp, &second_token, "GET", &build, "").await;
    assert_eq!(status, 404, "{answer}");

    // A rotation of the queue's credential gives each machine its own slot's new one, and
    // the standby's old one is retired only once it has used its new one: the node taking
    // its own (at once, here) locks the standby's machine out of nothing.
    let rotate = format!("/v1/queues/{id}/node-credential/rotate");
    let (status, rotated) = cp.call("POST", &rotate, None).await;
    assert!(status == 200 || status == 202, "{status} {rotated}");
    let (status, body) = as_node(&cp, &second_token, "GET", &path, "").await;
    assert_eq!(status, 200, "{body}");
    let config: Value = serde_json::from_str(&body).unwrap();
    let rotated_token = derived(format!("second/{id}/1"));
    assert_eq!(config["node_token"], rotated_token.as_str(), "{config}");
    let (status, body) = as_node(&cp, &rotated_token, "GET", &path, "").await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = as_node(&cp, &second_token, "GET", &path, "").await;
    assert_eq!(status, 401, "retired by its first use of the new one");

    // A queue of one replica has no standby slot: its token is worth nothing there.
    let one = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let (_, alone) = cp.call("POST", "/v1/queues", Some(one)).await;
    let alone = alone["id"].as_str().unwrap().to_string();
    let token = derived(format!("second/{alone}/0"));
    let (status, _) = as_node(&cp, &token, "GET", &format!("/v1/nodes/{alone}/config"), "").await;
    assert_eq!(status, 401);
}
