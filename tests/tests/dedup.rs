//! Exactly-once publish (README, "Exactly-once publish"), against the real node: a
//! deduplication id on a WebSocket publish (`dedupid`) and on an SQS send
//! (`MessageDeduplicationId`, with Amazon's Rust SDK) makes one message however often it is
//! sent within the window, from one face or both, by many publishers at once, and across a
//! kill -9 of the node; bad ids get their codes.

use qe_tests::sqs::{aws_sdk_sqs, client, SqsEndpoint};
use qe_tests::{Client, Node};
use serde_json::{json, Value};

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
    let line = node.wait_for_log("sqs: serving on ");
    let addr = line.split("sqs: serving on ").nth(1).unwrap();
    let addr = addr.split_whitespace().next().unwrap().trim_matches('"');
    let url = format!("http://{addr}");
    let endpoint = SqsEndpoint {
        url: &url,
        ca_pem: None,
        resolve_to: None,
    };
    (client(&endpoint, KEY.0, KEY.1), format!("{url}/queue"))
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
    while let Some(reply) = client
        .recv_within(std::time::Duration::from_millis(300))
        .await
    {
        replies.push(reply);
    }
    replies
}
