//! Message groups and exactly-once publish (README, "Message groups", "Exactly-once
//! publish"), against the real node. Exactly once: a
//! deduplication id on a WebSocket publish (`dedupid`) and on an SQS send
//! (`MessageDeduplicationId`, with Amazon's Rust SDK) makes one message however often it is
//! sent within the window, from one face or both, by many publishers at once, and across a
//! kill -9 of the node; bad ids get their codes.

use qe_tests::sqs::aws_sdk_sqs;
use qe_tests::{Client, Node};
use serde_json::{json, Value};
use std::time::Duration;

const KEY: (&str, &str) = ("AKIAQEDEDUP", "dedup-secret");

fn start(node: Option<Node>) -> Node {
    let key = format!("admin:{}:{}", KEY.0, KEY.1);
    let flags = ["--sqs-listen", "127.0.0.1:0", "--sqs-key", &key];
    match node {
        None => Node::start_with(&flags),
        Some(node) => node.restart(&flags),
    }
}

/// The node's SQS client and its queue's URL.
fn sqs_of(node: &Node) -> (aws_sdk_sqs::Client, String) {
    let url = format!("http://{}/queue", node.sqs_addr());
    (qe_tests::sqs::client_of(node, KEY.0, KEY.1), url)
}

async fn publish(publisher: &mut Client, body: &str, dedup: &str) -> String {
    let request = json!({"body": body, "dedupid": dedup, "durability": 2});
    let reply = publisher.request(request).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    reply["id"].as_str().unwrap().to_string()
}

/// How many messages the queue holds (`getlivestats`' first column).
async fn held(node: &Node) -> u64 {
    let mut admin = node.admin().await;
    let stats = admin.request(json!({"cmd": "getlivestats"})).await;
    let csv = stats["csv"].as_str().unwrap();
    csv.split(',').next().unwrap().trim().parse().unwrap()
}

#[tokio::test]
async fn a_deduplication_id_makes_one_message_on_both_faces_and_across_a_kill() {
    let node = start(None);
    let mut publisher = node.publisher().await;
    let first = publish(&mut publisher, "order 1", "order-1").await;
    let again = publish(&mut publisher, "order 1, again", "order-1").await;
    assert_eq!(again, first, "a repeat gets the first's id");
    // The SQS face shares the ids: the same id sent there is the same message.
    let (sqs, queue) = sqs_of(&node);
    let sent = sqs
        .send_message()
        .queue_url(&queue)
        .message_body("order 1 over SQS")
        .message_deduplication_id("order-1")
        .send()
        .await
        .unwrap();
    assert_eq!(sent.message_id(), Some(first.as_str()));
    let other = sqs
        .send_message()
        .queue_url(&queue)
        .message_body("order 2")
        .message_deduplication_id("order-2")
        .send()
        .await
        .unwrap();
    let second = other.message_id().unwrap().to_string();
    assert_ne!(second, first);
    assert_eq!(held(&node).await, 2);

    // Many publishers at once, each sending the same 50 ids: 50 messages.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut publisher = node.publisher().await;
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for n in 0..50 {
                ids.push(publish(&mut publisher, &format!("job {n}"), &format!("job-{n}")).await);
            }
            ids
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert!(
        answers.iter().all(|ids| *ids == answers[0]),
        "every publisher was told the same ids"
    );
    assert_eq!(held(&node).await, 52);

    // A subscriber gets each message once; then a kill -9, and the ids hold on.
    let (mut subscriber, _) = node.subscriber(100).await;
    let mut bodies = Vec::new();
    let mut replies = Vec::new();
    while bodies.len() < 52 {
        let frame = subscriber.recv().await;
        match frame["body"].as_str() {
            Some(body) => {
                bodies.push(body.to_string());
                subscriber
                    .send_json(&json!({"id": frame["id"], "ack": 1}))
                    .await;
            }
            None => replies.push(frame),
        }
    }
    assert!(bodies.contains(&"order 1".to_string()), "{bodies:?}");
    assert!(!bodies
        .iter()
        .any(|b| b.contains("again") || b.contains("over SQS")));
    replies.extend(drain(&mut subscriber).await);
    assert!(
        replies
            .iter()
            .all(|r| r.get("body").is_none() && r.get("code").is_none()),
        "the acks were taken, and nothing more came: {replies:?}"
    );
    assert_eq!(held(&node).await, 0);
    drop(subscriber);
    let node = start(Some(node));
    let mut publisher = node.publisher().await;
    let after = publish(&mut publisher, "order 1, after the kill", "order-1").await;
    assert_eq!(after, first, "the id came back with the log");
    assert_eq!(held(&node).await, 0, "nothing new was made");
    let fresh = publish(&mut publisher, "order 3", "order-3").await;
    assert_ne!(fresh, first);
    assert_eq!(held(&node).await, 1);

    // Ids that do not read, and a copy queue, get their codes.
    for bad in [json!(""), json!("a b"), json!(7), json!("x".repeat(129))] {
        let reply = publisher
            .request(json!({"body": "x", "dedupid": bad}))
            .await;
        assert_eq!(reply["code"], 214, "{bad}: {reply}");
    }
    let (mut copy, _) = node.login("publisher", "copy", json!({})).await;
    let reply = copy.request(json!({"body": "x", "dedupid": "c-1"})).await;
    assert_eq!(reply["code"], 215, "{reply}");
    let refused = sqs
        .send_message()
        .queue_url(&queue)
        .message_body("x")
        .message_deduplication_id("has space")
        .send()
        .await;
    assert!(refused.is_err(), "{refused:?}");
}

/// What the connection has to read now (the acks' replies).
async fn drain(client: &mut Client) -> Vec<Value> {
    let mut replies = Vec::new();
    while let Some(reply) = client.recv_within(Duration::from_millis(300)).await {
        replies.push(reply);
    }
    replies
}

/// What the consumers of a group test saw: (group, id, body) as delivered on either face,
/// and a wake-up for each.
#[derive(Clone, Default)]
struct Seen {
    log: std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>,
    more: std::sync::Arc<tokio::sync::Notify>,
}

impl Seen {
    fn push(&self, group: &str, id: &str, body: &str) {
        let entry = (group.to_string(), id.to_string(), body.to_string());
        self.log.lock().unwrap().push(entry);
        self.more.notify_one();
    }

    fn len(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    fn distinct(&self) -> usize {
        let log = self.log.lock().unwrap();
        let ids: std::collections::HashSet<&String> = log.iter().map(|entry| &entry.1).collect();
        ids.len()
    }

    /// Waits (60 s at most) until `done` holds.
    async fn until(&self, done: impl Fn(&Seen) -> bool) {
        let waited = async {
            while !done(self) {
                self.more.notified().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), waited)
            .await
            .expect("the consumers got there");
    }
}

/// Three WebSocket subscribers (capacity 5) and an SQS receiver (10 at a time), each
/// checking that no other message of a group is out while it has one, until `seen` has
/// `until` deliveries.
async fn consumers(node: &Node, seen: &Seen, until: usize) -> Vec<tokio::task::JoinHandle<()>> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let out: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let take = move |out: &Arc<Mutex<HashMap<String, String>>>, group: &str, id: &str| {
        let other = out
            .lock()
            .unwrap()
            .insert(group.to_string(), id.to_string());
        assert_eq!(other, None, "two of group {group} out at once");
    };
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (mut subscriber, _) = node.subscriber(5).await;
        let (seen, out) = (seen.clone(), out.clone());
        tasks.push(tokio::spawn(async move {
            while seen.len() < until {
                let Some(frame) = subscriber.recv_within(Duration::from_millis(200)).await else {
                    continue;
                };
                let Some(body) = frame["body"].as_str() else {
                    continue; // an ack's reply
                };
                let id = frame["id"].as_str().unwrap();
                let group = frame["group"].as_str().unwrap();
                take(&out, group, id);
                seen.push(group, id, body);
                tokio::task::yield_now().await;
                // Given back before the ack: the next of the group cannot come before it.
                out.lock().unwrap().remove(group);
                subscriber.send_json(&json!({"id": id, "ack": 1})).await;
            }
        }));
    }
    let (sqs, queue) = sqs_of(node);
    let (seen, out) = (seen.clone(), out.clone());
    tasks.push(tokio::spawn(async move {
        use aws_sdk_sqs::types::MessageSystemAttributeName as Name;
        while seen.len() < until {
            let received = sqs
                .receive_message()
                .queue_url(&queue)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_system_attribute_names(Name::All)
                .send()
                .await
                .unwrap();
            for message in received.messages() {
                let group = &message.attributes().unwrap()[&Name::MessageGroupId];
                let id = message.message_id().unwrap();
                take(&out, group, id);
                seen.push(group, id, message.body().unwrap());
                out.lock().unwrap().remove(group);
                let handle = message.receipt_handle().unwrap();
                let delete = sqs
                    .delete_message()
                    .queue_url(&queue)
                    .receipt_handle(handle);
                delete.send().await.unwrap();
            }
        }
    }));
    tasks
}

/// Message groups (README, "Message groups"): eight publishers at once publish 200 messages
/// over ten groups; three WebSocket subscribers and an SQS receiver take them, never two of
/// one group at once, each group in the order it was published in; the node is killed -9
/// halfway and the rest comes after the restart, still in order.
#[tokio::test]
async fn a_groups_messages_come_in_order_one_at_a_time_across_faces_and_a_kill() {
    use std::collections::{BTreeMap, HashSet};
    let node = start(None);
    let mut tasks = Vec::new();
    for p in 0..8 {
        let mut publisher = node.publisher().await;
        tasks.push(tokio::spawn(async move {
            for n in 0..25 {
                let group = format!("g{}", (p + n) % 10);
                let body = format!("p{p}-{n}");
                let request = json!({"body": body, "group": group, "durability": 2});
                let reply = publisher.request(request).await;
                assert_eq!(reply["status"], "Success.", "{reply}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(held(&node).await, 200);

    let seen = Seen::default();
    for task in consumers(&node, &seen, 100).await {
        task.await.unwrap();
    }
    // Killed with messages held and received: they come again after the restart.
    let node = start(Some(node));
    let tasks = consumers(&node, &seen, usize::MAX).await;
    seen.until(|seen| seen.distinct() == 200).await;
    for task in tasks {
        task.abort();
    }
    // Each group in the order it was published in (its ids' order; one delivered again after
    // the kill counts at its first delivery).
    let mut by_group: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut first = HashSet::new();
    for (group, id, _) in seen.log.lock().unwrap().iter() {
        if first.insert(id.clone()) {
            by_group.entry(group.clone()).or_default().push(id.clone());
        }
    }
    assert_eq!((by_group.len(), first.len()), (10, 200));
    for (group, ids) in &by_group {
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, &sorted, "group {group} out of order");
    }
    // Bad groups, and a copy queue, get their codes.
    let mut publisher = node.publisher().await;
    let reply = publisher
        .request(json!({"body": "x", "group": "a b"}))
        .await;
    assert_eq!(reply["code"], 216, "{reply}");
    let (mut copy, _) = node.login("publisher", "copy", json!({})).await;
    let reply = copy.request(json!({"body": "x", "group": "g"})).await;
    assert_eq!(reply["code"], 217, "{reply}");
}
