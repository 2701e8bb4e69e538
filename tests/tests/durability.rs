//! Durability with the real binary: `kill -9` mid-stream, restart on the same data directory.

use qe_tests::{assert_failure, publish_until_cut, Client, Node, Tmpfs};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Receives and acks everything waiting, up to a marker published now; returns the bodies.
async fn drain_queue(node: &Node) -> Vec<String> {
    let mut publisher = node.publisher().await;
    let (mut subscriber, _) = node.subscriber(1024).await;
    let marker = publisher.request(json!({"body": "marker"})).await;
    assert_eq!(marker["status"], "Success.");
    let mut bodies = receive(&mut subscriber, |body| body == "marker", usize::MAX).await;
    bodies.pop();
    bodies
}

/// Receives and acks messages until `last` says a body is the last, or `count` arrived; waits
/// for every ack's reply (an unanswered ack may not have counted).
async fn receive(
    subscriber: &mut Client,
    last: impl Fn(&str) -> bool,
    count: usize,
) -> Vec<String> {
    let mut bodies = Vec::new();
    let mut unanswered = 0;
    while bodies.len() < count {
        let frame = subscriber.recv().await;
        let Some(body) = frame["body"].as_str() else {
            assert_ack_reply(&frame);
            unanswered -= 1;
            continue;
        };
        subscriber
            .send_json(&json!({"id": frame["id"], "ack": 1}))
            .await;
        unanswered += 1;
        bodies.push(body.to_string());
        if last(body) {
            break;
        }
    }
    while unanswered > 0 {
        assert_ack_reply(&subscriber.recv().await);
        unanswered -= 1;
    }
    bodies
}

/// An ack took effect: Success, or 507 when the disk could not take its record yet (the
/// manual: the change was made, with eventual durability).
fn assert_ack_reply(reply: &Value) {
    let done = reply["status"] == "Success." || reply["code"] == 507;
    assert!(done, "an ack's reply: {reply}");
}

#[tokio::test]
async fn every_acknowledged_durable_publish_survives_a_kill_9_exactly_once() {
    let mut node = Node::start();

    // Before the stream: one acked (must stay gone), one delayed that falls due while the
    // node is down, one delayed past the restart.
    let (mut subscriber, _) = node.subscriber(10).await;
    let mut publisher = node.publisher().await;
    let acked = publisher
        .request(json!({"body": "acked before the crash"}))
        .await;
    subscriber.recv().await;
    subscriber
        .request(json!({"id": acked["id"], "ack": 1}))
        .await;
    drop(subscriber);
    publisher
        .request(json!({"body": "due while down", "delay": 1}))
        .await;
    publisher
        .request(json!({"body": "due after the restart", "delay": 3}))
        .await;
    let due_while_down = tokio::time::Instant::now() + Duration::from_secs(1);
    let due_after_restart = tokio::time::Instant::now() + Duration::from_secs(3);

    let successes = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..8 {
        let client = node.publisher().await;
        // Durabilities 0, 1, 2 in turn; the body says which.
        tasks.push(tokio::spawn(publish_until_cut(
            client,
            successes.clone(),
            move |n| {
                let durability = (n % 3) as u64;
                (format!("t{task}-n{n}-d{durability}"), durability)
            },
        )));
    }
    while successes.load(Ordering::Relaxed) < 3000 {
        tokio::task::yield_now().await;
    }
    node.kill();
    let mut acknowledged = Vec::new();
    // Each connection had at most one publish in flight at the kill: the one after its last
    // acknowledged one. It may or may not have been kept.
    let mut in_flight = HashSet::new();
    for (task, handle) in tasks.into_iter().enumerate() {
        let acked = handle.await.unwrap();
        let n = acked.len();
        in_flight.extend((0..3).map(|d| format!("t{task}-n{n}-d{d}")));
        acknowledged.extend(acked);
    }
    tokio::time::sleep_until(due_while_down).await;
    let node = node.restart(&[]);

    let bodies = drain_queue(&node).await;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for body in &bodies {
        *counts.entry(body.as_str()).or_default() += 1;
    }
    let sent: HashSet<String> = acknowledged.iter().map(|(b, _)| b.clone()).collect();
    for (body, durability) in &acknowledged {
        match durability {
            0 => assert_eq!(
                counts.get(body.as_str()),
                None,
                "{body}: durability 0 is gone"
            ),
            _ => assert_eq!(counts.get(body.as_str()), Some(&1), "{body}: exactly once"),
        }
    }
    for body in counts.keys() {
        let expected = sent.contains(*body) || in_flight.contains(*body);
        // (On a slow machine the drain can end after the last delay did.)
        let expected =
            expected || ["due while down", "due after the restart", "marker"].contains(body);
        assert!(expected, "{body} was never published");
        assert!(
            !body.ends_with("-d0"),
            "{body}: durability 0 survived a restart"
        );
    }
    assert_eq!(counts.get("acked before the crash"), None);
    assert_eq!(
        counts.get("due while down"),
        Some(&1),
        "its delay ended while down"
    );
    let durable = acknowledged.iter().filter(|(_, d)| *d > 0).count();
    assert!(
        durable >= 1500,
        "only {durable} durable publishes were acknowledged"
    );

    // The message delayed past the restart kept its delay and still arrives, once: after
    // the drain as a rule, in it when the run was slow enough for its delay to end first.
    match counts.get("due after the restart") {
        Some(count) => assert_eq!(*count, 1, "due after the restart: exactly once"),
        None => {
            let (mut subscriber, _) = node.subscriber(1).await;
            let message = subscriber.recv().await;
            assert_eq!(message["body"], "due after the restart");
        }
    }
    assert!(
        tokio::time::Instant::now() >= due_after_restart,
        "a delayed message arrived before its delay ended"
    );
}

#[tokio::test]
async fn the_dead_letter_queue_survives_and_is_never_redelivered() {
    let mut node = Node::start_with(&["--max-messages", "3"]);
    let (mut subscriber, _) = node.subscriber(5).await;
    let mut publisher = node.publisher().await;
    for body in ["rejected 1", "rejected 2"] {
        publisher
            .request(json!({"body": body, "durability": 2}))
            .await;
        let message = subscriber.recv().await;
        assert_eq!(
            subscriber
                .request(json!({"id": message["id"], "ack": 0}))
                .await["status"],
            "Success."
        );
    }
    drop(subscriber);
    publisher
        .request(json!({"body": "waiting", "durability": 2}))
        .await;
    node.kill();
    let node = node.restart(&["--max-messages", "3"]);

    let mut publisher = node.publisher().await;
    assert_failure(&publisher.request(json!({"body": "no room"})).await, 210);
    let (mut subscriber, _) = node.subscriber(5).await;
    let message = subscriber.recv().await;
    assert_eq!(
        message["body"], "waiting",
        "dead letters are not delivered again"
    );
    subscriber
        .request(json!({"id": message["id"], "ack": 1}))
        .await;
    assert_eq!(
        publisher.request(json!({"body": "room"})).await["status"],
        "Success."
    );
    assert_failure(&publisher.request(json!({"body": "no room"})).await, 210);
}

fn first_segment(node: &Node) -> std::path::PathBuf {
    node.data_dir.path().join("messages/00000001.log")
}

#[tokio::test]
async fn a_damaged_record_goes_to_the_dead_letter_queue_and_hides_nothing() {
    let mut node = Node::start();
    let mut publisher = node.publisher().await;
    for body in ["first", "second", "third"] {
        publisher
            .request(json!({"body": body, "durability": 2}))
            .await;
    }
    node.kill();
    let segment = first_segment(&node);
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = bytes.windows(6).position(|w| w == b"second").unwrap();
    bytes[at + 2] ^= 0x20;
    std::fs::write(&segment, bytes).unwrap();

    let node = node.restart(&[]);
    node.wait_for_log("a damaged record went to the dead letter queue");
    assert_eq!(drain_queue(&node).await, ["first", "third"]);

    // An administrator sees it in the dead letter queue as the manual's damaged entry.
    let (mut admin, _) = node.login("admin", "distribute", json!({})).await;
    let list = admin
        .request(json!({"cmd": "getdlqmsgs", "after": "", "count": 10}))
        .await;
    let csv = list["csv"].as_str().unwrap();
    assert_eq!(csv.lines().count(), 1, "{csv}");
    let id = csv.split(',').next().unwrap();
    let entry = admin.request(json!({"cmd": "getdlqmsg", "id": id})).await;
    assert_eq!(entry["msg"]["id"], id);
    assert_eq!(entry["msg"]["damaged"], true);
    let file = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        entry["msg"]["file"].as_str().unwrap(),
    )
    .unwrap();
    assert!(
        file.windows(6).any(|w| w == b"seCond"),
        "the whole damaged record"
    );

    // The damaged bytes were padded over: the next start finds no damage.
    let node = node.restart(&[]);
    let last_start = node.wait_for_log("damaged=0");
    assert!(!last_start.contains("damaged record"), "{last_start}");
}

#[tokio::test]
async fn a_write_torn_at_the_end_of_the_log_is_cut_off() {
    let mut node = Node::start();
    let mut publisher = node.publisher().await;
    publisher
        .request(json!({"body": "whole", "durability": 2}))
        .await;
    publisher
        .request(json!({"body": "torn", "durability": 2}))
        .await;
    node.kill();
    // The segment was made full of zeros ahead of time, so a write torn by a crash leaves
    // zeros where its last bytes should be.
    let segment = first_segment(&node);
    let mut bytes = std::fs::read(&segment).unwrap();
    let written = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    assert!(written < bytes.len(), "zeros after the written part");
    bytes[written - 3..written].fill(0);
    std::fs::write(&segment, &bytes).unwrap();
    let node = node.restart(&[]);
    node.wait_for_log("damaged=0");
    assert_eq!(drain_queue(&node).await, ["whole"]);
}

#[tokio::test]
async fn a_full_disk_gets_507_then_211_and_loses_no_acknowledged_message() {
    let data_dir = tempfile::tempdir().unwrap();
    let _tmpfs = Tmpfs::mount(&data_dir.path().join("messages"), "256k");
    let node = Node::start_in(data_dir, &["--max-messages-memory", "2000000"]);
    let mut publisher = node.publisher().await;
    let body = "z".repeat(30_000);
    let mut kept = Vec::new();
    let mut codes = Vec::new();
    for n in 0..100 {
        let reply = publisher
            .request(json!({"body": format!("{n} {body}"), "durability": 2}))
            .await;
        match reply["status"].as_str() {
            Some("Success.") => kept.push(n),
            _ => {
                let code = reply["code"].as_u64().unwrap();
                codes.push(code);
                match code {
                    507 => kept.push(n), // the message is kept; only its durability is eventual
                    211 => break,
                    _ => panic!("unexpected {reply}"),
                }
            }
        }
    }
    assert!(codes.contains(&507), "{codes:?}");
    assert_eq!(codes.last(), Some(&211), "{codes:?}");
    // The queue is full, so no marker: receive exactly what was kept.
    let (mut subscriber, _) = node.subscriber(1024).await;
    let received: Vec<usize> = receive(&mut subscriber, |_| false, kept.len())
        .await
        .iter()
        .map(|b| b.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        received, kept,
        "every message that was answered with its id is there"
    );
    drop(node);
}
