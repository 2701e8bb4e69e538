//! Backpressure: a client that reads gets every message, however big the burst the node makes
//! for it (a backlog, a replay, a larger capacity); a client that does not read is cut off,
//! and its resume sends every held message its connection never wrote, once.

use qe_tests::{login_request, raw, Client, Node};
use serde_json::{json, Value};
use std::collections::HashSet;

/// 40 of these are 2.4 MB: more than twice max-write-queue-bytes on Dev/test (1 MiB).
const BODY_BYTES: usize = 60_000;

fn devtest(extra: &[&str]) -> Node {
    let mut flags = vec!["--tier", "devtest"];
    flags.extend_from_slice(extra);
    Node::start_with(&flags)
}

/// Publishes `count` big messages; returns their ids in publish order.
async fn publish_big(publisher: &mut Client, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for n in 0..count {
        let body = format!("{n:04} {}", "b".repeat(BODY_BYTES));
        let reply = publisher.request(json!({ "body": body })).await;
        assert_eq!(reply["status"], "Success.", "{reply}");
        ids.push(reply["id"].as_str().unwrap().to_string());
    }
    ids
}

/// The ids of the next `count` deliveries, in the order they came; other frames (replies)
/// are passed over.
async fn deliveries(subscriber: &mut Client, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    while ids.len() < count {
        let frame = subscriber.recv().await;
        if frame.get("body").is_some() {
            ids.push(frame["id"].as_str().unwrap().to_string());
        } else {
            assert_eq!(frame["status"], "Success.", "{frame}");
        }
    }
    ids
}

#[tokio::test]
async fn a_backlog_bigger_than_the_write_queue_reaches_a_subscriber_that_reads() {
    let node = devtest(&[]);
    let mut publisher = node.publisher().await;
    let ids = publish_big(&mut publisher, 40).await;
    let (mut subscriber, _) = node.subscriber(40).await;
    assert_eq!(
        deliveries(&mut subscriber, 40).await,
        ids,
        "all, oldest first"
    );
    assert!(!node.log().contains("reads too slowly"));
}

#[tokio::test]
async fn a_replay_bigger_than_the_write_queue_reaches_a_subscriber_that_reads() {
    let node = devtest(&[]);
    let mut publisher = node.publisher().await;
    let ids = publish_big(&mut publisher, 40).await;
    let (mut subscriber, session) = node.subscriber(40).await;
    assert_eq!(deliveries(&mut subscriber, 40).await, ids);
    drop(subscriber); // TCP closed with no close frame
    assert!(node.dropped(&session));
    let mut resumed = Client::connect(&node).await;
    let resume = json!({"sessionid": session, "replay": true});
    let reply = resumed
        .request(login_request("subscriber", "distribute", resume))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    assert_eq!(
        deliveries(&mut resumed, 40).await,
        ids,
        "every held one again"
    );
}

#[tokio::test]
async fn a_capacity_increase_bigger_than_the_write_queue_reaches_a_subscriber_that_reads() {
    let node = devtest(&[]);
    let mut publisher = node.publisher().await;
    let ids = publish_big(&mut publisher, 40).await;
    let (mut subscriber, _) = node.subscriber(1).await;
    assert_eq!(deliveries(&mut subscriber, 1).await, ids[..1]);
    subscriber.send_json(&json!({"capacity": 40})).await;
    assert_eq!(deliveries(&mut subscriber, 39).await, ids[1..]);
}

/// The ids of the deliveries among `frames`.
fn delivered_ids(frames: &[(u8, Vec<u8>)]) -> Vec<String> {
    frames
        .iter()
        .filter(|(first, _)| first & 0x0F == 0x1)
        .filter_map(|(_, payload)| serde_json::from_slice::<Value>(payload).ok())
        .filter(|frame| frame.get("body").is_some())
        .map(|frame| frame["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_client_that_does_not_read_is_cut_off_and_its_resume_sends_what_it_never_got() {
    // More than the node's socket buffers and its write queue can hold for one client.
    const MESSAGES: usize = 120;
    let node = devtest(&["--write-stall-secs", "1"]);
    let small = raw::Options {
        receive_buffer: Some(4096),
        ..raw::Options::default()
    };
    let capacity = json!({ "capacity": MESSAGES });
    let (mut stalled, reply) = raw::logged_in(&node, small, "subscriber", capacity).await;
    let session = reply["sessionid"].as_str().unwrap().to_string();
    let mut publisher = node.publisher().await;
    let ids = publish_big(&mut publisher, MESSAGES).await;
    node.wait_for_log("dropping a client that reads too slowly");
    assert!(node.dropped(&session), "it holds messages: saved");

    // What reached the old connection's socket before the node closed it.
    let old = delivered_ids(&raw::whole_frames(&raw::rest_of_stream(&mut stalled).await));
    assert!(
        old.len() < MESSAGES,
        "it was cut off before it had them all"
    );
    let mut resumed = Client::connect(&node).await;
    let resume = json!({"sessionid": session, "replay": false});
    let reply = resumed
        .request(login_request("subscriber", "distribute", resume))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let mut got: HashSet<String> = old.iter().cloned().collect();
    let mut sent_again = HashSet::new();
    while got.len() < MESSAGES {
        let id = deliveries(&mut resumed, 1).await.remove(0);
        assert!(ids.contains(&id), "one of the published messages");
        assert!(
            sent_again.insert(id.clone()),
            "{id} sent twice on the resume"
        );
        got.insert(id);
    }
    // It holds every one of them: each ack is answered Success.
    for id in &ids {
        let reply = resumed.request(json!({"id": id, "ack": 1})).await;
        assert_eq!(reply["status"], "Success.", "{id}: {reply}");
    }
}
