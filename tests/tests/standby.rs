//! A standby node per queue (issue 35, first step): the primary ships every write of its log
//! to a standby process over `/replicate`; durability 2 is answered once both nodes synced it.
//! Real binaries on loopback: a primary (`--replication-key`), a standby (`--standby-of`), and
//! a node started on the standby's data directory, as a promotion.

use qe_tests::sqs::receive;
use qe_tests::standby::{wait_in_sync, Standby, IN_SYNC, KEY};
use qe_tests::{assert_failure, publish_until_cut, Client, Node};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn primary() -> Node {
    Node::start_with(&["--replication-key", KEY])
}

/// A primary and its standby, in sync.
fn replicated() -> (Node, Standby) {
    let primary = primary();
    let standby = Standby::start(&primary, KEY);
    wait_in_sync(&primary, 1);
    (primary, standby)
}

/// The promotion: the standby killed and a node started on its directory.
fn promote(standby: Standby) -> Node {
    Node::start_in(standby.into_data_dir(), &[])
}

/// Publishes `body` at `durability` and checks it was answered Success.
async fn published(publisher: &mut Client, body: impl Into<Value>, durability: u8) {
    let body: Value = body.into();
    let reply = publisher
        .request(json!({"body": body, "durability": durability}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
}

/// The promoted node's recovery found no damage to dead-letter.
fn assert_undamaged(node: &Node) {
    let log = node.log();
    assert!(!log.contains("damaged record"), "{log}");
}

/// Receives and acks everything waiting, up to a marker published now; returns the bodies.
async fn drain(node: &Node) -> Vec<String> {
    let mut publisher = node.publisher().await;
    let (mut subscriber, _) = node.subscriber(1024).await;
    let marker = publisher.request(json!({"body": "marker"})).await;
    assert_eq!(marker["status"], "Success.", "{marker}");
    let mut bodies = Vec::new();
    loop {
        let frame = subscriber.recv().await;
        let Some(body) = frame["body"].as_str() else {
            continue;
        };
        if body == "marker" {
            return bodies;
        }
        bodies.push(body.to_string());
        subscriber
            .send_json(&json!({"id": frame["id"], "ack": 1}))
            .await;
    }
}

#[tokio::test]
async fn durability_2_is_synced_on_the_standby_or_answered_507() {
    let primary = primary();
    let mut publisher = primary.publisher().await;

    // No standby yet: on the primary's disk only, so not "synced" as the queue promises.
    let alone = publisher
        .request(json!({"body": "before the standby", "durability": 2}))
        .await;
    assert_failure(&alone, 507);
    // Durability 1 is shipped, never awaited.
    published(&mut publisher, "eventual", 1).await;

    let mut standby = Standby::start(&primary, KEY);
    wait_in_sync(&primary, 1);
    published(&mut publisher, "on both", 2).await;

    // The standby dies: the primary stops counting on it at once.
    standby.kill();
    let gone = publisher
        .request(json!({"body": "after the standby", "durability": 2}))
        .await;
    assert_failure(&gone, 507);

    // It comes back on its own directory and catches up: durability 2 is whole again, and
    // everything published meanwhile (507 keeps the message) is in its copy.
    let standby = Standby::start_in(&primary, KEY, standby.into_data_dir());
    wait_in_sync(&primary, 2);
    published(&mut publisher, "on both again", 2).await;
    drop(publisher);
    drop(primary);
    let promoted = promote(standby);
    let bodies = drain(&promoted).await;
    for body in [
        "before the standby",
        "eventual",
        "on both",
        "after the standby",
        "on both again",
    ] {
        assert!(bodies.iter().any(|b| b == body), "{body} lost: {bodies:?}");
    }
}

#[tokio::test]
async fn a_wrong_key_is_refused_and_counts_for_nothing() {
    let primary = primary();
    let standby = Standby::start(&primary, "not the key");
    primary.wait_for_log("wrong key");
    standby.wait_for_log("closed the connection: wrong replication key");
    let mut publisher = primary.publisher().await;
    let reply = publisher
        .request(json!({"body": "x", "durability": 2}))
        .await;
    assert_failure(&reply, 507);
    assert!(!primary.log().contains(IN_SYNC));
    drop(standby);

    // A node without a standby has no /replicate at all.
    let lone = Node::start();
    let refused = Standby::start(&lone, KEY);
    refused.wait_for_log("WebSocket upgrade");
}

/// kill -9 of the primary at a moment picked at random under durability-2 publishers, while
/// the standby is stalled (SIGSTOP) for the last 100 ms, and then of the standby: a node
/// started on the standby's directory has every message acknowledged, once. (A primary that
/// answered on its own sync goes on acknowledging through the stall, and those are lost.)
#[tokio::test]
async fn every_acknowledged_durability_2_publish_is_on_the_standby_when_the_primary_dies() {
    for round in 0..3 {
        let (mut primary, standby) = replicated();
        let acked = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for task in 0..8 {
            let client = primary.publisher().await;
            tasks.push(tokio::spawn(publish_until_cut(
                client,
                acked.clone(),
                move |n| (format!("t{task}-n{n}"), 2),
            )));
        }
        // A moment between 200 and 1,000 acknowledged publishes in, picked from the clock.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as usize;
        let kill_at = 200 + nanos % 800;
        while acked.load(Ordering::Relaxed) < kill_at {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        standby.pause();
        let stalled_at = acked.load(Ordering::Relaxed);
        // The stall's length, not a wait for an event: what the primary answers meanwhile.
        tokio::time::sleep(Duration::from_millis(100)).await;
        primary.kill();
        // Killed while stalled: what it had not taken from its socket before the stall never
        // reaches its copy, so the copy is exactly what it had answered for.
        let mut standby = standby;
        standby.kill();
        let mut acknowledged = Vec::new();
        for task in tasks {
            acknowledged.extend(task.await.unwrap().into_iter().map(|(body, _)| body));
        }
        let promoted = promote(standby);
        let bodies = drain(&promoted).await;
        let unique: HashSet<&String> = bodies.iter().collect();
        assert_eq!(unique.len(), bodies.len(), "round {round}: a message twice");
        for body in &acknowledged {
            assert!(
                unique.contains(body),
                "round {round}: {body} acknowledged, then lost"
            );
        }
        eprintln!(
            "round {round}: standby stalled after {stalled_at} acknowledged, primary killed \
             after {}; {} on the standby",
            acknowledged.len(),
            bodies.len()
        );
    }
}

/// Each segment file in a log directory and its bytes, zeros after the records cut (a
/// primary's files are made full of zeros ahead of their records).
fn segments(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut segments = BTreeMap::new();
    for entry in std::fs::read_dir(dir.join("messages")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().to_string();
        if name.len() == 12 && name.ends_with(".log") {
            // Compaction may remove it meanwhile: the next look sees it gone.
            let Ok(mut bytes) = std::fs::read(entry.path()) else {
                continue;
            };
            let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |at| at + 1);
            bytes.truncate(end);
            segments.insert(name, bytes);
        }
    }
    segments
}

/// A standby that attaches to a primary with a log already (several segments) copies it, then
/// follows compaction: segments the primary removes go on the standby too, and the two
/// directories end byte for byte the same.
#[tokio::test]
async fn a_late_standby_catches_up_and_follows_compaction() {
    let primary = Node::start_with(&["--replication-key", KEY, "--log-segment-bytes", "65536"]);
    let mut publisher = primary.publisher().await;
    for n in 0..3000 {
        let body = format!("early-{n:04}-{}", "x".repeat(100));
        published(&mut publisher, body, 1).await;
    }
    assert!(segments(primary.data_dir.path()).len() >= 4);
    let standby = Standby::start(&primary, KEY);
    wait_in_sync(&primary, 1);

    // Ack all but the last 100: compaction empties the old segments and removes them.
    let (mut subscriber, _) = primary.subscriber(1024).await;
    let mut kept = Vec::new();
    let (mut handled, mut ack_replies) = (0, 0);
    while handled < 3000 {
        let frame = subscriber.recv().await;
        let Some(body) = frame["body"].as_str() else {
            ack_replies += 1;
            continue;
        };
        handled += 1;
        match handled > 2900 {
            true => kept.push(body.to_string()),
            false => {
                subscriber
                    .send_json(&json!({"id": frame["id"], "ack": 1}))
                    .await
            }
        }
    }
    // Every ack taken (and its record shipped) before the sync points below.
    while ack_replies < 2900 {
        let reply = subscriber.recv().await;
        assert_eq!(reply["status"], "Success.", "{reply}");
        ack_replies += 1;
    }
    // Logged out, so the last 100 wait again (a dropped session's holds would be carried to
    // the promoted copy, saved: the test below).
    let logout = subscriber.request(json!({"logout": true})).await;
    assert_eq!(logout["status"], "Logout Success.", "{logout}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        // Each durability-2 publish is synced on both: the standby has everything before it.
        published(&mut publisher, "sync point", 2).await;
        let (ours, theirs) = (
            segments(primary.data_dir.path()),
            segments(standby.data_dir.path()),
        );
        let compacted = ours.len() < 4;
        if compacted && ours == theirs {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby's segments never matched: primary {:?}, standby {:?}",
            ours.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(publisher);
    drop(primary);
    let promoted = promote(standby);
    let bodies = drain(&promoted).await;
    let early: Vec<&String> = bodies.iter().filter(|b| b.starts_with("early-")).collect();
    assert_eq!(
        early.len(),
        100,
        "what was acked came back, or kept went missing"
    );
    for body in &kept {
        assert!(bodies.contains(body), "{body} lost");
    }
}

/// Over wss:// (the node's own certificate path), the standby checks the primary's certificate
/// against the CA it is given: with it, it follows; with another CA, or none, it never
/// connects.
#[tokio::test]
async fn the_standby_follows_over_wss_and_checks_the_primary() {
    let ca = qe_tests::test_ca("Queue Expert test CA");
    let other_ca = qe_tests::test_ca("Some other CA");
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let pem = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (cert, key) = (
        pem("cert.pem", cert.pem()),
        pem("key.pem", key.serialize_pem()),
    );
    let (ca_file, other_ca_file) = (pem("ca.pem", ca.pem()), pem("other.pem", other_ca.pem()));
    let primary = Node::start_with(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--replication-key",
        KEY,
    ]);

    let untrusting = Standby::launch(
        &primary.tls_url(),
        KEY,
        tempfile::tempdir().unwrap(),
        &["--standby-ca", &other_ca_file],
    );
    untrusting.wait_for_log("TLS: invalid peer certificate");
    // Without --standby-ca: the public web's roots, which a private CA is not among.
    let without_ca = Standby::launch(&primary.tls_url(), KEY, tempfile::tempdir().unwrap(), &[]);
    without_ca.wait_for_log("TLS: invalid peer certificate: UnknownIssuer");
    assert!(!primary.log().contains(IN_SYNC));

    let standby = Standby::launch(
        &primary.tls_url(),
        KEY,
        tempfile::tempdir().unwrap(),
        &["--standby-ca", &ca_file],
    );
    wait_in_sync(&primary, 1);
    let roots = qe_tests::roots_from_pem(&ca.pem());
    let mut publisher = Client::connect_tls_at(&primary.tls_url(), primary.addr, roots).await;
    let login = publisher
        .request(qe_tests::login_request(
            "publisher",
            "distribute",
            json!({}),
        ))
        .await;
    assert_eq!(login["status"], "Success.", "{login}");
    published(&mut publisher, "over wss", 2).await;
    drop((publisher, primary));
    let promoted = promote(standby);
    assert_eq!(drain(&promoted).await, ["over wss"]);
}

/// A promoted standby serves with the primary's saved settings (sent at the catch-up and on
/// every save) and its SQS face signs with the same receipt key.
#[tokio::test]
async fn a_promoted_standby_has_the_settings_and_the_receipt_key() {
    let primary = Node::start_with(&[
        "--replication-key",
        KEY,
        "--sqs-listen",
        "127.0.0.1:0",
        "--sqs-key",
        "admin:AKIASTANDBYTEST:secret",
    ]);
    let (mut admin, _) = primary.login("admin", "distribute", json!({})).await;
    // Saved before the standby attaches: it gets them with its catch-up.
    let before = json!({"cmd": "setcfg", "max-subscriber-capacity": 5});
    assert_eq!(admin.request(before).await["status"], "Success.");
    let standby = Standby::start(&primary, KEY);
    wait_in_sync(&primary, 1);
    // Saved while it follows: sent on the save.
    let after = json!({"cmd": "setcfg", "saved-session-timeout-secs": 60});
    assert_eq!(admin.request(after).await["status"], "Success.");
    // Sent once with the catch-up, once on the save.
    standby.wait_for_log_count("the primary's settings are saved here", 2);
    let mut publisher = primary.publisher().await;
    published(&mut publisher, "x", 2).await;
    let key_file = |dir: &Path| std::fs::read(dir.join("sqs-receipt-key")).unwrap();
    let primary_key = key_file(primary.data_dir.path());
    drop((admin, publisher, primary));

    let promoted_dir = standby.into_data_dir();
    assert_eq!(key_file(promoted_dir.path()), primary_key);
    let promoted = Node::start_in(promoted_dir, &[]);
    let (mut admin, _) = promoted.login("admin", "distribute", json!({})).await;
    let config = admin.request(json!({"cmd": "getcfg"})).await;
    let csv = config["csv"].as_str().unwrap();
    assert!(csv.contains("max-subscriber-capacity,w,5\n"), "{csv}");
    assert!(csv.contains("saved-session-timeout-secs,w,60\n"), "{csv}");
}

/// A machine crash can leave a standby's file with its length but without writes it had not
/// synced (zeros where records were). A standby that starts again checks its records and
/// says it holds only the sound ones: the rest is sent again, and a node promoted on it has
/// every message, with no damage to dead-letter.
#[tokio::test]
async fn a_standby_whose_crash_lost_unsynced_writes_has_them_sent_again() {
    let (primary, mut standby) = replicated();
    let mut publisher = primary.publisher().await;
    for n in 0..200 {
        published(&mut publisher, format!("m{n:03}"), 2).await;
    }
    standby.kill();
    // Zeros over the middle of its copy, as pages a crash lost.
    let copy = segments(standby.data_dir.path());
    let (name, bytes) = copy.iter().next_back().expect("a segment");
    let path = standby.data_dir.path().join("messages").join(name);
    let mut damaged = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    damaged[middle..middle + 100].fill(0);
    std::fs::write(&path, damaged).unwrap();

    let standby = Standby::start_in(&primary, KEY, standby.into_data_dir());
    wait_in_sync(&primary, 2);
    published(&mut publisher, "after", 2).await;
    drop((publisher, primary));
    let promoted = promote(standby);
    let bodies = drain(&promoted).await;
    let mut expected: Vec<String> = (0..200).map(|n| format!("m{n:03}")).collect();
    expected.push("after".into());
    assert_eq!(bodies, expected);
    assert_undamaged(&promoted);
}

/// Damage found at the primary's start is dead-lettered there and padded over; a standby that
/// held the segment whole is sent the padding too, so a node promoted on its copy has the
/// damaged record's dead-letter entry and not the record as well.
#[tokio::test]
async fn the_primarys_repair_of_damage_reaches_the_standby() {
    let (mut primary, standby) = replicated();
    let mut publisher = primary.publisher().await;
    for body in ["first", "second", "third"] {
        published(&mut publisher, body, 2).await;
    }
    drop(publisher);
    primary.kill();
    // Rot in the primary's copy only.
    let (name, _) = segments(primary.data_dir.path())
        .into_iter()
        .find(|(_, bytes)| bytes.windows(6).any(|w| w == b"second"))
        .expect("the segment with the record");
    let path = primary.data_dir.path().join("messages").join(name);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(6).position(|w| w == b"second").unwrap();
    bytes[at + 2] ^= 0x20;
    std::fs::write(&path, bytes).unwrap();

    let data_dir = std::mem::replace(&mut primary.data_dir, tempfile::tempdir().unwrap());
    drop(primary);
    let addr = standby_primary_address(&standby);
    let primary = Node::start_in(data_dir, &["--replication-key", KEY, "--listen", &addr]);
    primary.wait_for_log("a damaged record went to the dead letter queue");
    wait_in_sync(&primary, 1);
    let mut publisher = primary.publisher().await;
    published(&mut publisher, "after", 2).await;
    drop((publisher, primary));

    let promoted = promote(standby);
    assert_eq!(drain(&promoted).await, ["first", "third", "after"]);
    let (mut admin, _) = promoted.login("admin", "distribute", json!({})).await;
    let list = admin
        .request(json!({"cmd": "getdlqmsgs", "after": "", "count": 10}))
        .await;
    assert_eq!(list["csv"].as_str().unwrap().lines().count(), 1, "{list}");
}

/// The address a standby follows (its `--standby-of`), for a primary started again there.
fn standby_primary_address(standby: &Standby) -> String {
    let log = standby.wait_for_log("following the primary");
    let url = log
        .split("primary=ws://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("the primary's address in the standby's log");
    url.to_string()
}

/// A message of a megabyte is shipped in pieces (a frame holds at most 512 KiB of a write):
/// durability 2 answers Success, and the promoted copy has it whole.
#[tokio::test]
async fn a_message_bigger_than_a_frame_reaches_the_standby() {
    let (primary, standby) = replicated();
    let (mut admin, _) = primary.login("admin", "distribute", json!({})).await;
    let bigger = json!({"cmd": "setcfg", "max-ws-msg-len": 1_048_576});
    assert_eq!(admin.request(bigger).await["status"], "Success.");
    let body = "b".repeat(1_000_000);
    let mut publisher = primary.publisher().await;
    published(&mut publisher, body.as_str(), 2).await;
    drop((admin, publisher, primary));
    let promoted = promote(standby);
    let (mut admin, _) = promoted.login("admin", "distribute", json!({})).await;
    let bigger = json!({"cmd": "setcfg", "max-ws-msg-len": 1_048_576});
    assert_eq!(admin.request(bigger).await["status"], "Success.");
    assert_eq!(drain(&promoted).await, [body]);
}

/// A standby that stops reading (SIGSTOP) while the primary has more to send than the
/// sockets hold is dropped within the silence limit (5 s and the next look, a second), not
/// when TCP gives up a minute later: durability 2 is answered 507 meanwhile.
#[tokio::test]
async fn a_standby_that_stops_reading_is_dropped_within_the_silence_limit() {
    let (primary, standby) = replicated();
    standby.pause();
    // About 40 MB at durability 1: more than the two sockets' buffers hold.
    let mut publisher = primary.publisher().await;
    let (mut admin, _) = primary.login("admin", "distribute", json!({})).await;
    let bigger = json!({"cmd": "setcfg", "max-ws-msg-len": 1_048_576});
    assert_eq!(admin.request(bigger).await["status"], "Success.");
    let body = "f".repeat(1_000_000);
    for _ in 0..40 {
        published(&mut publisher, body.as_str(), 1).await;
    }
    let asked = std::time::Instant::now();
    let reply = publisher
        .request(json!({"body": "d2", "durability": 2}))
        .await;
    let answered_in = asked.elapsed();
    assert_failure(&reply, 507);
    // The limit is 5 s; 20 s tells it from TCP's minute.
    assert!(
        answered_in < Duration::from_secs(20),
        "answered after {answered_in:?}"
    );
    primary.wait_for_log("did not answer");
    standby.resume();
}

/// A primary that lost a new segment file's name in a crash (only durability 1 had gone to it,
/// and a name is synced with the first sync) makes a file of that number again; the standby's
/// old file of that number is not the primary's, and is sent again from its start.
#[tokio::test]
async fn a_segment_number_used_again_is_sent_again_whole() {
    let (mut primary, standby) = replicated();
    let mut publisher = primary.publisher().await;
    for n in 0..50 {
        published(&mut publisher, format!("lost-{n:02}"), 1).await;
    }
    // A durability-2 publish with the standby in sync: everything before it is on both.
    published(&mut publisher, "synced", 2).await;
    drop(publisher);
    primary.kill();
    // As a crash would leave it had the name never been synced: the file is gone.
    for name in segments(primary.data_dir.path()).keys() {
        std::fs::remove_file(primary.data_dir.path().join("messages").join(name)).unwrap();
    }
    let data_dir = std::mem::replace(&mut primary.data_dir, tempfile::tempdir().unwrap());
    drop(primary);
    // The new file of that number is written before the standby is back.
    standby.pause();
    let addr = standby_primary_address(&standby);
    let primary = Node::start_in(data_dir, &["--replication-key", KEY, "--listen", &addr]);
    let mut publisher = primary.publisher().await;
    // More than the old file held, and more than the 4 KiB that identify a segment.
    let new: Vec<String> = (0..60).map(|n| format!("new-{n:02}")).collect();
    for body in &new {
        published(&mut publisher, body.as_str(), 1).await;
    }
    standby.resume();
    wait_in_sync(&primary, 1);
    published(&mut publisher, "new, synced", 2).await;
    let same = segments(primary.data_dir.path()) == segments(standby.data_dir.path());
    assert!(same, "the standby's copy is not the primary's");
    drop((publisher, primary));
    let promoted = promote(standby);
    let mut expected = new;
    expected.push("new, synced".into());
    assert_eq!(drain(&promoted).await, expected);
    assert_undamaged(&promoted);
}

/// A primary whose data was lost (a node started on an empty directory at its address) is a
/// new log: the standby, which holds the only copy of what was acknowledged, is not told to
/// cut or remove it; durability 2 is answered 507; a node started on the standby's copy has
/// every acknowledged message. (Without the lineage check the new primary's catch-up removes
/// the standby's segments, and the promoted node has nothing.)
#[tokio::test]
async fn a_standby_never_gives_its_copy_up_to_a_primary_whose_data_was_lost() {
    let (mut primary, standby) = replicated();
    let mut publisher = primary.publisher().await;
    let acknowledged: Vec<String> = (0..20).map(|n| format!("kept-{n:02}")).collect();
    for body in &acknowledged {
        published(&mut publisher, body.as_str(), 2).await;
    }
    drop(publisher);
    let addr = standby_primary_address(&standby);
    primary.kill();
    drop(primary);
    let fresh = Node::start_with(&["--replication-key", KEY, "--listen", &addr]);
    fresh.wait_for_log("holds a copy of another log");
    let mut publisher = fresh.publisher().await;
    let reply = publisher
        .request(json!({"body": "on one disk", "durability": 2}))
        .await;
    assert_failure(&reply, 507);
    assert!(!fresh.log().contains(IN_SYNC), "{}", fresh.log());
    // A copy from before lineages (it has none) is not taken for the fresh node's either.
    let copy = standby.into_data_dir();
    std::fs::remove_file(copy.path().join("messages/lineage")).unwrap();
    let standby = Standby::start_in(&fresh, KEY, copy);
    fresh.wait_for_log("a copy from before lineages");
    assert!(!fresh.log().contains(IN_SYNC), "{}", fresh.log());
    drop((publisher, fresh));
    let promoted = promote(standby);
    assert_eq!(drain(&promoted).await, acknowledged);
    assert_undamaged(&promoted);
}

/// After a promotion the former primary, started as the standby of the promoted node on its
/// own directory, is the same log with a divergent tail (written while the standby was
/// stalled, never acknowledged at durability 2): the tail is cut, it comes in sync, and
/// promoted in turn it has what the promoted node had, no more.
#[tokio::test]
async fn a_former_primary_rejoins_as_the_standby_of_its_promoted_standby() {
    let (mut primary, standby) = replicated();
    let mut publisher = primary.publisher().await;
    published(&mut publisher, "before", 2).await;
    standby.pause();
    for n in 0..10 {
        published(&mut publisher, format!("unshipped {n}"), 1).await;
    }
    drop(publisher);
    primary.kill();
    let old_primary = std::mem::replace(&mut primary.data_dir, tempfile::tempdir().unwrap());
    drop(primary);
    standby.resume();
    // What the stalled standby's socket held it may still take before it sees the end.
    standby.wait_for_log("connecting again");
    let promoted = Node::start_in(standby.into_data_dir(), &["--replication-key", KEY]);
    let rejoined = Standby::start_in(&promoted, KEY, old_primary);
    wait_in_sync(&promoted, 1);
    let mut publisher = promoted.publisher().await;
    published(&mut publisher, "after", 2).await;
    drop(publisher);
    let same = segments(promoted.data_dir.path()) == segments(rejoined.data_dir.path());
    assert!(
        same,
        "the rejoined standby's copy is not the promoted node's"
    );
    drop(promoted);
    let again = promote(rejoined);
    let bodies = drain(&again).await;
    // "before", the unshipped ones the standby had taken (in order, from the first), "after".
    let (first, rest) = bodies.split_first().expect("some");
    let (last, middle) = rest.split_last().expect("two at least");
    assert_eq!(
        (first.as_str(), last.as_str()),
        ("before", "after"),
        "{bodies:?}"
    );
    for (n, body) in middle.iter().enumerate() {
        assert_eq!(body, &format!("unshipped {n}"), "{bodies:?}");
    }
    assert_undamaged(&again);
}

/// The partition: the control plane promotes the standby's copy at epoch 2 while the primary
/// (epoch 1), cut off from it but not from its clients, still serves. The primary answers no
/// durability-2 publish (its standby is gone, and a standby given epoch 2 does not follow it);
/// a standby that has followed the new primary and reaches the old one by its name (not moved
/// yet) stops it, and it does not serve on its copy again, which rejoins the new primary as
/// its standby. Nothing the old primary acknowledged at durability 2 is lost.
#[tokio::test]
async fn a_primary_left_behind_by_a_promotion_is_fenced_by_the_epoch() {
    let mut primary = Node::start_with(&["--replication-key", KEY, "--epoch", "1"]);
    let standby = Standby::start(&primary, KEY);
    wait_in_sync(&primary, 1);
    let mut publisher = primary.publisher().await;
    let acknowledged: Vec<String> = (0..20).map(|n| format!("acked-{n:02}")).collect();
    for body in &acknowledged {
        published(&mut publisher, body.as_str(), 2).await;
    }
    let epoch_file = |dir: &Path| std::fs::read_to_string(dir.join("messages/epoch")).unwrap();
    assert_eq!(epoch_file(standby.data_dir.path()), "1\n");

    let promoted = Node::start_in(
        standby.into_data_dir(),
        &["--replication-key", KEY, "--epoch", "2"],
    );
    let follower = Standby::launch(
        &promoted.url(),
        KEY,
        tempfile::tempdir().unwrap(),
        &["--epoch", "2"],
    );
    wait_in_sync(&promoted, 1);
    assert_eq!(epoch_file(follower.data_dir.path()), "2\n");

    let reply = publisher
        .request(json!({"body": "left behind", "durability": 2}))
        .await;
    assert_failure(&reply, 507);
    // A new standby given epoch 2 that has followed no primary yet does not follow this one,
    // and does not stop it either (the new primary may not have taken its epoch yet).
    let refusing = Standby::launch(
        &primary.url(),
        KEY,
        tempfile::tempdir().unwrap(),
        &["--epoch", "2"],
    );
    refusing.wait_for_log("this standby follows none below 2");
    let reply = publisher
        .request(json!({"body": "still left behind", "durability": 2}))
        .await;
    assert_failure(&reply, 507);
    assert_eq!(
        primary.log().matches(IN_SYNC).count(),
        1,
        "{}",
        primary.log()
    );
    drop(refusing);

    // The follower, reaching the old primary: it stops at once (exit 3), cutting its clients.
    let followed = follower.into_data_dir();
    let misled = Standby::launch(&primary.url(), KEY, followed, &["--epoch", "2"]);
    assert_eq!(primary.wait_for_exit(), Some(3), "{}", primary.log());
    assert!(primary.log().contains("superseded"), "{}", primary.log());
    assert_eq!(publisher.ending().await, qe_tests::Ending::NoCloseFrame);
    drop(misled);
    let old_copy = std::mem::replace(&mut primary.data_dir, tempfile::tempdir().unwrap());
    drop(primary);
    assert_eq!(epoch_file(old_copy.path()), "1 superseded-by 2\n");
    // Nor as a node alone (a start by hand without the key, say).
    for extra in [&["--replication-key", KEY, "--epoch", "5"][..], &[]] {
        let (code, log) = Node::refused_start(old_copy.path(), extra);
        assert_eq!(code, Some(3), "{extra:?}: {log}");
        assert!(log.contains("superseded at epoch 1 by epoch 2"), "{log}");
    }

    // Its copy rejoins the new primary as its standby; caught up, the mark goes.
    let rejoined = Standby::start_in(&promoted, KEY, old_copy);
    wait_in_sync(&promoted, 2);
    rejoined.wait_for_log("caught up with the primary");
    assert_eq!(epoch_file(rejoined.data_dir.path()), "2\n");
    assert_eq!(drain(&promoted).await, acknowledged);
    assert_undamaged(&promoted);
}

/// Sessions and holds carried over (docs/standby-design.md, section 4): a subscriber that
/// held messages on the lost primary resumes its session on the promoted copy and gets them
/// again; a new subscriber gets none of them while their sessions are saved; what a session
/// that never comes back held goes on once its saved time runs out.
#[tokio::test]
async fn a_subscriber_resumes_on_the_promoted_copy_with_what_it_held() {
    let (mut primary, standby) = replicated();
    let mut publisher = primary.publisher().await;
    let (mut holder, holder_session) = primary.subscriber(3).await;
    for n in 0..3 {
        published(&mut publisher, format!("held {n}"), 2).await;
    }
    for n in 0..3 {
        assert_eq!(holder.next_delivery().await.0, format!("held {n}"));
    }
    // Full, so the next goes to a second subscriber, which never comes back.
    let (mut leaver, _) = primary.subscriber(1).await;
    published(&mut publisher, "held by the leaver", 1).await;
    assert_eq!(leaver.next_delivery().await.0, "held by the leaver");
    // Nobody has room: it waits. Its sync on the standby also covers every hold before it.
    published(&mut publisher, "waiting", 2).await;

    primary.kill();
    let mut standby = standby;
    standby.kill();
    let promoted = promote(standby);
    // (Its log is read on a thread of its own: waited for, not looked at once.)
    promoted.wait_for_log("carried_holds=4");
    let (mut newcomer, _) = promoted.subscriber(10).await;
    assert_eq!(newcomer.next_delivery().await.0, "waiting");
    let mut publisher = promoted.publisher().await;
    published(&mut publisher, "marker", 1).await;
    let (body, _) = newcomer.next_delivery().await;
    assert_eq!(body, "marker", "nothing a saved session holds");

    let resume = json!({"sessionid": holder_session, "replay": true});
    let (mut holder, _) = promoted.login("subscriber", "distribute", resume).await;
    let mut held = Vec::new();
    for n in 0..3 {
        let (body, id) = holder.next_delivery().await;
        assert_eq!(body, format!("held {n}"));
        held.push(id);
    }
    for id in held {
        let ack = holder.request(json!({"id": id, "ack": 1})).await;
        assert_eq!(ack["status"], "Success.", "it holds it still: {ack}");
    }
    // The leaver's session runs out (saved-session-timeout-secs, 10 s from the promoted
    // node's start) and what it held goes on: to the holder, back at its place before the
    // newcomer's and with room now.
    let frame = holder.recv_within(Duration::from_secs(30)).await;
    let frame = frame.expect("the leaver's message, once its session ran out");
    let (body, id) = (frame["body"].clone(), frame["id"].clone());
    assert_eq!(body, "held by the leaver", "{frame}");
    let ack = holder.request(json!({"id": id, "ack": 1})).await;
    assert_eq!(ack["status"], "Success.", "{ack}");
}

/// A durable delivery waits until the standby has heard who holds it (`store::log::heard`):
/// a primary lost right after a delivery leaves the hold on the promoted copy, so the message
/// never goes to a second subscriber while the first holds it. While the standby is stopped
/// nothing is delivered; once it runs again the delivery goes out, and the promoted copy keeps
/// it for the holder's session.
#[tokio::test]
async fn a_durable_delivery_waits_until_the_standby_has_heard_who_holds_it() {
    let (mut primary, standby) = replicated();
    let mut publisher = primary.publisher().await;
    let (mut holder, holder_session) = primary.subscriber(1).await;
    standby.pause();
    // Durability 1 waits for no standby: it is answered while the standby sleeps.
    published(&mut publisher, "held", 1).await;
    // A delivery's absence has no event to await: a second is a thousand times what a
    // delivery takes on loopback.
    let early = holder.recv_within(Duration::from_secs(1)).await;
    assert!(
        early.is_none(),
        "delivered before the standby heard: {early:?}"
    );
    standby.resume();
    let (body, _) = holder.next_delivery().await;
    assert_eq!(body, "held");
    // The holder is full: this one waits. Its sync on the standby covers the first's record.
    published(&mut publisher, "waiting", 2).await;
    primary.kill();
    let mut standby = standby;
    standby.kill();
    let promoted = promote(standby);
    // Not "held": the holder's saved session has it.
    assert_eq!(drain(&promoted).await, ["waiting"]);
    let resume = json!({"sessionid": holder_session, "replay": true});
    let (mut holder, _) = promoted.login("subscriber", "distribute", resume).await;
    let (body, id) = holder.next_delivery().await;
    assert_eq!(body, "held");
    let ack = holder.request(json!({"id": id, "ack": 1})).await;
    assert_eq!(ack["status"], "Success.", "{ack}");
}

/// A resume gives the session a new id: its reply waits until the standby has heard who holds
/// what under it, so the id a subscriber learns is one the promoted copy knows.
#[tokio::test]
async fn a_resumes_reply_waits_until_the_standby_has_heard_the_new_session() {
    let (mut primary, standby) = replicated();
    let mut publisher = primary.publisher().await;
    let (mut holder, old_session) = primary.subscriber(1).await;
    published(&mut publisher, "held", 2).await;
    assert_eq!(holder.next_delivery().await.0, "held");
    drop(holder);
    assert!(primary.dropped(&old_session), "saved: it holds a message");
    standby.pause();
    let mut resuming = Client::connect(&primary).await;
    let resume = json!({"sessionid": old_session, "replay": true});
    resuming
        .send_json(&qe_tests::login_request("subscriber", "distribute", resume))
        .await;
    // (An answer's absence has no event to await.)
    let early = resuming.recv_within(Duration::from_secs(1)).await;
    assert!(
        early.is_none(),
        "answered before the standby heard: {early:?}"
    );
    standby.resume();
    let reply = resuming.recv().await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let new_session = reply["sessionid"].as_str().unwrap().to_string();
    assert_ne!(new_session, old_session);
    primary.kill();
    let mut standby = standby;
    standby.kill();
    let promoted = promote(standby);
    let resume = json!({"sessionid": new_session, "replay": true});
    let (mut holder, _) = promoted.login("subscriber", "distribute", resume).await;
    assert_eq!(holder.next_delivery().await.0, "held");
}

/// A logout's reply waits until the standby has heard that what the session held waits again:
/// on a copy promoted right after the reply, the message goes to the next subscriber at once
/// (not kept with the session until its saved time runs out), and the session cannot be
/// resumed (109), as after any logout.
#[tokio::test]
async fn a_logouts_reply_waits_until_the_standby_has_heard_what_it_gave_back() {
    let (mut primary, standby) = replicated();
    let mut publisher = primary.publisher().await;
    let (mut holder, session) = primary.subscriber(1).await;
    published(&mut publisher, "given back", 2).await;
    assert_eq!(holder.next_delivery().await.0, "given back");
    standby.pause();
    holder.send_json(&json!({"logout": true})).await;
    // (An answer's absence has no event to await.)
    let early = holder.recv_within(Duration::from_secs(1)).await;
    assert!(
        early.is_none(),
        "answered before the standby heard: {early:?}"
    );
    standby.resume();
    let reply = holder.recv().await;
    assert_eq!(reply["status"], "Logout Success.", "{reply}");
    primary.kill();
    let mut standby = standby;
    standby.kill();
    let promoted = promote(standby);
    let mut resuming = Client::connect(&promoted).await;
    let resume = json!({"sessionid": session, "replay": true});
    resuming
        .send_json(&qe_tests::login_request("subscriber", "distribute", resume))
        .await;
    assert_failure(&resuming.recv().await, 109);
    assert_eq!(drain(&promoted).await, ["given back"]);
}

/// A standby that attaches after messages are held is sent who holds them first, with its
/// catch-up: a subscriber that held them before the standby existed resumes on its copy.
#[tokio::test]
async fn a_late_standby_is_sent_who_holds_what() {
    let mut primary = primary();
    let mut publisher = primary.publisher().await;
    let (mut holder, holder_session) = primary.subscriber(2).await;
    for n in 0..2 {
        // Durability 1: no standby yet, so durability 2 would be answered 507.
        published(&mut publisher, format!("held {n}"), 1).await;
        assert_eq!(holder.next_delivery().await.0, format!("held {n}"));
    }
    let standby = Standby::start(&primary, KEY);
    wait_in_sync(&primary, 1);
    // Its sync on the standby covers what the standby was sent before it.
    published(&mut publisher, "after", 2).await;
    primary.kill();
    let mut standby = standby;
    standby.kill();
    let promoted = promote(standby);
    let resume = json!({"sessionid": holder_session, "replay": true});
    let (mut holder, _) = promoted.login("subscriber", "distribute", resume).await;
    for n in 0..2 {
        assert_eq!(holder.next_delivery().await.0, format!("held {n}"));
    }
    // Its capacity (2) came with it: "after" goes to the next subscriber.
    assert_eq!(drain(&promoted).await, ["after"]);
}

/// Runs `call` with the standby stopped: it must not be answered within a second (an answer's
/// absence has no event to await); then the standby runs again, and the answer comes.
async fn answered_once_the_standby_hears<T: Send + 'static>(
    standby: &Standby,
    call: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    standby.pause();
    let call = tokio::spawn(call);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!call.is_finished(), "answered before the standby heard");
    standby.resume();
    call.await.unwrap()
}

/// The SQS face's flags: on loopback, with an admin key.
const SQS: [&str; 4] = [
    "--sqs-listen",
    "127.0.0.1:0",
    "--sqs-key",
    "admin:AKIASTANDBY:standby-secret",
];

/// A client of `node`'s SQS face, with the key [`SQS`] gives.
fn sqs_of(node: &Node) -> aws_sdk_sqs::Client {
    qe_tests::sqs::client_of(node, "AKIASTANDBY", "standby-secret")
}

/// A primary with its SQS face and a standby in sync; a client of the face and its queue's URL.
async fn replicated_with_sqs() -> (Node, Standby, aws_sdk_sqs::Client, String) {
    let primary = Node::start_with(&[&["--replication-key", KEY][..], &SQS].concat());
    let standby = Standby::start(&primary, KEY);
    wait_in_sync(&primary, 1);
    let sqs = sqs_of(&primary);
    let queue = qe_tests::sqs::lone_queue_url(&sqs).await;
    (primary, standby, sqs, queue)
}

/// ChangeMessageVisibility of `handle` to `secs`, as a future that owns what it needs (to be
/// spawned while the standby is stopped).
fn change_visibility(
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    handle: &str,
    secs: i32,
) -> impl std::future::Future<
    Output = Result<
        aws_sdk_sqs::operation::change_message_visibility::ChangeMessageVisibilityOutput,
        aws_sdk_sqs::error::SdkError<
            aws_sdk_sqs::operation::change_message_visibility::ChangeMessageVisibilityError,
        >,
    >,
> + Send
       + 'static {
    let change = sqs.change_message_visibility().queue_url(queue);
    change
        .receipt_handle(handle)
        .visibility_timeout(secs)
        .send()
}

/// An SQS receive outlives a promotion: it is answered once the standby has heard of it (and so
/// is a change of its visibility), its message stays invisible on the promoted copy for as long
/// as it was, and its receipt handle deletes it there.
#[tokio::test]
async fn an_sqs_receipt_handle_deletes_its_message_on_the_promoted_copy() {
    let (mut primary, standby, sqs, queue) = replicated_with_sqs().await;
    let mut publisher = primary.publisher().await;
    published(&mut publisher, "received", 2).await;
    // The receive is answered only once the standby has heard of it.
    let receiving = {
        let (sqs, queue) = (sqs.clone(), queue.clone());
        async move { receive(&sqs, &queue, 1, 0).await }
    };
    let got = answered_once_the_standby_hears(&standby, receiving).await;
    assert_eq!(got.len(), 1);
    let handle = got[0].receipt_handle().unwrap().to_string();
    // So is a change of its visibility.
    let changing = change_visibility(&sqs, &queue, &handle, 600);
    let changed = answered_once_the_standby_hears(&standby, changing).await;
    assert!(changed.is_ok(), "{changed:?}");
    // Its sync on the standby covers the receive shipped before it.
    published(&mut publisher, "waiting", 2).await;
    primary.kill();
    let mut standby = standby;
    standby.kill();

    let promoted = Node::start_in(standby.into_data_dir(), &SQS);
    let sqs = sqs_of(&promoted);
    let got = receive(&sqs, &queue, 10, 1).await;
    let bodies: Vec<&str> = got.iter().map(|m| m.body().unwrap()).collect();
    assert_eq!(bodies, ["waiting"], "the received one stays invisible");
    let deleted = sqs
        .delete_message()
        .queue_url(&queue)
        .receipt_handle(&handle)
        .send()
        .await;
    assert!(deleted.is_ok(), "{deleted:?}");
    // Deleted, not only answered: the queue holds only "waiting" (received again).
    let mut admin = promoted.admin().await;
    let stats = admin.request(json!({"cmd": "getlivestats"})).await;
    let csv = stats["csv"].as_str().unwrap_or_default();
    assert_eq!(csv.split(',').next(), Some("1"), "messages: {stats}");
}

/// A received message made visible again (ChangeMessageVisibility to 0) is answered once the
/// standby has heard it: on a copy promoted right after the answer it waits to be received,
/// not invisible for the rest of its old visibility (10 minutes here).
#[tokio::test]
async fn a_message_made_visible_again_waits_on_the_promoted_copy() {
    let (mut primary, standby, sqs, queue) = replicated_with_sqs().await;
    let mut publisher = primary.publisher().await;
    published(&mut publisher, "given back", 2).await;
    let got = sqs
        .receive_message()
        .queue_url(&queue)
        .visibility_timeout(600)
        .send()
        .await
        .unwrap();
    let handle = got.messages()[0].receipt_handle().unwrap().to_string();
    let giving_back = change_visibility(&sqs, &queue, &handle, 0);
    let given_back = answered_once_the_standby_hears(&standby, giving_back).await;
    assert!(given_back.is_ok(), "{given_back:?}");
    primary.kill();
    let mut standby = standby;
    standby.kill();

    let promoted = Node::start_in(standby.into_data_dir(), &SQS);
    let got = receive(&sqs_of(&promoted), &queue, 10, 1).await;
    let bodies: Vec<&str> = got.iter().map(|m| m.body().unwrap()).collect();
    assert_eq!(bodies, ["given back"], "it waits, not invisible");
}

/// A standby stops on SIGTERM (as systemd stops it), at once.
#[tokio::test]
async fn a_standby_stops_on_sigterm() {
    let (_primary, mut standby) = replicated();
    let status = standby.terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}
