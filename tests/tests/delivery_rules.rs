//! The delivery rules beyond the manual (README, "Delivery rules") with the real binary, over
//! WebSocket: `max-receive-count` sends a message whose last allowed delivery failed to the
//! dead letter queue, with its reason, kept across a `kill -9`; `message-retention-secs`
//! deletes a message that stays too long, and its holder is told. Off by default: the
//! manual's behaviour (a message comes back however often its holders leave).

use qe_tests::{Client, Node};
use serde_json::{json, Value};

async fn admin(node: &Node) -> Client {
    node.login("admin", "distribute", json!({})).await.0
}

async fn success(client: &mut Client, request: Value) -> Value {
    let reply = client.request(request).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    reply
}

/// A subscriber of capacity 1 takes the next message and logs out without an ack: one
/// failed delivery. Returns the id it got.
async fn deliver_and_leave(node: &Node) -> String {
    let (mut subscriber, _) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    let message = subscriber.recv().await;
    let id = message["id"].as_str().unwrap().to_string();
    let reply = subscriber.request(json!({"logout": true})).await;
    assert_eq!(reply["status"], "Logout Success.", "{reply}");
    id
}

async fn dlq_ids(admin: &mut Client) -> Vec<String> {
    let reply = success(
        admin,
        json!({"cmd": "getdlqmsgs", "after": "", "count": 100}),
    )
    .await;
    let csv = reply["csv"].as_str().unwrap();
    csv.lines()
        .map(|l| l.split(',').next().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn max_receive_count_dead_letters_after_the_last_failed_delivery_and_a_restart_keeps_it() {
    let node = Node::start();
    let mut admin_client = admin(&node).await;
    let reply = admin_client
        .request(json!({"cmd": "setcfg", "max-receive-count": 1001}))
        .await;
    assert_eq!(reply["code"], 414, "{reply}");
    success(
        &mut admin_client,
        json!({"cmd": "setcfg", "max-receive-count": 3}),
    )
    .await;
    let (mut publisher, _) = node.login("publisher", "distribute", json!({})).await;
    let published = success(&mut publisher, json!({"body": "poison", "durability": 2})).await;
    let id = published["id"].as_str().unwrap().to_string();
    for attempt in 1..=3 {
        assert_eq!(deliver_and_leave(&node).await, id, "attempt {attempt}");
        let in_dlq = dlq_ids(&mut admin_client).await.contains(&id);
        assert_eq!(in_dlq, attempt == 3, "attempt {attempt}");
    }
    let shown = success(&mut admin_client, json!({"cmd": "getdlqmsg", "id": id})).await;
    assert_eq!(shown["dlqreason"], "max-receive-count", "{shown}");
    assert_eq!(shown["msg"]["body"], "poison");
    // A nack is a rejection: no dlqreason, as the manual's reply.
    let nacked = success(&mut publisher, json!({"body": "bad", "durability": 1})).await;
    let (mut subscriber, _) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    let message = subscriber.recv().await;
    assert_eq!(message["id"], nacked["id"]);
    success(&mut subscriber, json!({"id": message["id"], "ack": 0})).await;
    let shown = success(
        &mut admin_client,
        json!({"cmd": "getdlqmsg", "id": nacked["id"]}),
    )
    .await;
    assert!(shown.get("dlqreason").is_none(), "{shown}");
    drop((subscriber, publisher, admin_client));

    let node = node.restart(&[]);
    let mut admin_client = admin(&node).await;
    let shown = success(&mut admin_client, json!({"cmd": "getdlqmsg", "id": id})).await;
    assert_eq!(shown["dlqreason"], "max-receive-count", "kept: {shown}");
    let config = success(&mut admin_client, json!({"cmd": "getcfg"})).await;
    assert!(config["csv"]
        .as_str()
        .unwrap()
        .contains("max-receive-count,w,3\n"));
}

#[tokio::test]
async fn receive_counts_survive_a_kill_and_count_on_from_there() {
    let node = Node::start();
    let mut admin_client = admin(&node).await;
    success(
        &mut admin_client,
        json!({"cmd": "setcfg", "max-receive-count": 3}),
    )
    .await;
    let (mut publisher, _) = node.login("publisher", "distribute", json!({})).await;
    let published = success(&mut publisher, json!({"body": "thrice", "durability": 2})).await;
    let id = published["id"].as_str().unwrap().to_string();
    assert_eq!(deliver_and_leave(&node).await, id);
    // Held by a subscriber when the node is killed: its second delivery, counted.
    let (mut holder, _) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    assert_eq!(holder.recv().await["id"], id.as_str());
    // A second publish behind it, durability 2: once its reply is in, every earlier record
    // (the count's) is on the disk too.
    success(&mut publisher, json!({"body": "marker", "durability": 2})).await;
    drop((holder, publisher, admin_client));
    let node = node.restart(&[]);
    // The restart ended the holder's session: the message waits again, with 2 deliveries
    // counted (the one held at the kill too), so the next failed one is its third and last.
    let mut admin_client = admin(&node).await;
    assert!(dlq_ids(&mut admin_client).await.is_empty());
    assert_eq!(deliver_and_leave(&node).await, id);
    let dead = dlq_ids(&mut admin_client).await;
    assert_eq!(
        dead,
        [id],
        "two counted before the kill and one after: the limit of 3"
    );
}

#[tokio::test]
async fn without_the_settings_a_message_comes_back_however_often_its_holders_leave() {
    let node = Node::start();
    let (mut publisher, _) = node.login("publisher", "distribute", json!({})).await;
    let published = success(&mut publisher, json!({"body": "again", "durability": 1})).await;
    for _ in 0..5 {
        assert_eq!(
            deliver_and_leave(&node).await,
            published["id"].as_str().unwrap()
        );
    }
    let mut admin_client = admin(&node).await;
    assert!(dlq_ids(&mut admin_client).await.is_empty());
}

#[tokio::test]
async fn retention_deletes_a_message_held_too_long_and_its_holder_is_told() {
    let node = Node::start();
    let mut admin_client = admin(&node).await;
    success(
        &mut admin_client,
        json!({"cmd": "setcfg", "message-retention-secs": 1}),
    )
    .await;
    let (mut subscriber, _) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    let (mut publisher, _) = node.login("publisher", "distribute", json!({})).await;
    let published = success(&mut publisher, json!({"body": "short-lived"})).await;
    let message = subscriber.recv().await;
    assert_eq!(message["id"], published["id"]);
    // Held, not acked: a second later it expires, and the holder gets the delmsg notice.
    let notice = subscriber.recv().await;
    assert_eq!(notice, json!({"deleted": true, "id": published["id"]}));
    let ack = subscriber
        .request(json!({"id": published["id"], "ack": 1}))
        .await;
    assert_eq!(ack["code"], 301, "{ack}");
    let stats = success(&mut admin_client, json!({"cmd": "getlivestats"})).await;
    assert!(stats["csv"].as_str().unwrap().starts_with("0,"), "{stats}");
}
