//! The delivery rules beyond the manual (README, "Delivery rules") with the real binary, over
//! WebSocket: `max-receive-count` sends a message whose last allowed delivery failed to the
//! dead letter queue, with its reason, kept across a `kill -9`; `message-retention-secs`
//! deletes a message that stays too long, and its holder is told. Off by default: the
//! manual's behaviour (a message comes back however often its holders leave). The dead
//! letter queue says when each message went there (README, "The dead letter queue").

use qe_tests::{Client, Node};
use serde_json::json;

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
    let reply = admin
        .success(json!({"cmd": "getdlqmsgs", "after": "", "count": 100}))
        .await;
    let csv = reply["csv"].as_str().unwrap();
    csv.lines()
        .map(|l| l.split(',').next().unwrap().to_string())
        .collect()
}

/// The dead letter queue's ids once it holds any (within a deadline; a session ends just
/// after its logout's reply, as its connection ends).
async fn dlq_soon(admin: &mut Client) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let ids = dlq_ids(admin).await;
        if !ids.is_empty() || std::time::Instant::now() > deadline {
            return ids;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `getdlqmsgs` with `"dlqinfo":true`: each line's id, dead-letter time and reason; and the
/// same page without it has the manual's six columns.
async fn dlq_info(admin: &mut Client) -> Vec<(String, String, String)> {
    let plain = admin
        .success(json!({"cmd": "getdlqmsgs", "after": "", "count": 100}))
        .await;
    for line in plain["csv"].as_str().unwrap().lines() {
        assert_eq!(line.split(',').count(), 6, "the manual's columns: {line}");
    }
    let reply = admin
        .success(json!({"cmd": "getdlqmsgs", "after": "", "count": 100, "dlqinfo": true}))
        .await;
    let csv = reply["csv"].as_str().unwrap();
    csv.lines()
        .map(|line| {
            let columns: Vec<&str> = line.split(',').collect();
            assert_eq!(columns.len(), 8, "{line}");
            (columns[0].into(), columns[6].into(), columns[7].into())
        })
        .collect()
}

#[tokio::test]
async fn max_receive_count_dead_letters_after_the_last_failed_delivery_and_a_restart_keeps_it() {
    let started_secs = now_secs();
    let node = Node::start();
    let mut admin_client = node.admin().await;
    let reply = admin_client
        .request(json!({"cmd": "setcfg", "max-receive-count": 1001}))
        .await;
    assert_eq!(reply["code"], 414, "{reply}");
    admin_client
        .success(json!({"cmd": "setcfg", "max-receive-count": 3}))
        .await;
    let (mut publisher, _) = node.login("publisher", "distribute", json!({})).await;
    let published = publisher
        .success(json!({"body": "poison", "durability": 2}))
        .await;
    let id = published["id"].as_str().unwrap().to_string();
    for attempt in 1..=2 {
        assert_eq!(deliver_and_leave(&node).await, id, "attempt {attempt}");
    }
    assert!(dlq_ids(&mut admin_client).await.is_empty(), "two failed");
    // The third: the session ends as its connection does, just after the logout's reply.
    assert_eq!(deliver_and_leave(&node).await, id, "attempt 3");
    assert_eq!(dlq_soon(&mut admin_client).await, std::slice::from_ref(&id));
    let shown = admin_client
        .success(json!({"cmd": "getdlqmsg", "id": id}))
        .await;
    assert_eq!(shown["dlqreason"], "max-receive-count", "{shown}");
    assert_eq!(shown["msg"]["body"], "poison");
    let capped_at = shown["dlqdat"].as_u64().expect("when it was dead-lettered");
    assert!((started_secs..=now_secs()).contains(&capped_at), "{shown}");
    // A nack is a rejection: no dlqreason, as the manual's reply.
    let nacked = publisher
        .success(json!({"body": "bad", "durability": 1}))
        .await;
    let (mut subscriber, _) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    let message = subscriber.recv().await;
    assert_eq!(message["id"], nacked["id"]);
    subscriber
        .success(json!({"id": message["id"], "ack": 0}))
        .await;
    let shown = admin_client
        .success(json!({"cmd": "getdlqmsg", "id": nacked["id"]}))
        .await;
    assert!(shown.get("dlqreason").is_none(), "{shown}");
    let nacked_at = shown["dlqdat"].as_u64().expect("a nack says when too");
    assert!((capped_at..=now_secs()).contains(&nacked_at), "{shown}");
    let listed = [
        (
            id.clone(),
            capped_at.to_string(),
            "max-receive-count".into(),
        ),
        (
            nacked["id"].as_str().unwrap().into(),
            nacked_at.to_string(),
            "rejected".into(),
        ),
    ];
    assert_eq!(dlq_info(&mut admin_client).await, listed);
    drop((subscriber, publisher, admin_client));

    let node = node.restart(&[]);
    let mut admin_client = node.admin().await;
    let shown = admin_client
        .success(json!({"cmd": "getdlqmsg", "id": id}))
        .await;
    assert_eq!(shown["dlqreason"], "max-receive-count", "kept: {shown}");
    assert_eq!(shown["dlqdat"], capped_at, "kept: {shown}");
    assert_eq!(dlq_info(&mut admin_client).await, listed, "kept");
    let config = admin_client.success(json!({"cmd": "getcfg"})).await;
    assert!(config["csv"]
        .as_str()
        .unwrap()
        .contains("max-receive-count,w,3\n"));
}

#[tokio::test]
async fn receive_counts_survive_a_kill_and_count_on_from_there() {
    let node = Node::start();
    let mut admin_client = node.admin().await;
    admin_client
        .success(json!({"cmd": "setcfg", "max-receive-count": 3}))
        .await;
    let (mut publisher, _) = node.login("publisher", "distribute", json!({})).await;
    let published = publisher
        .success(json!({"body": "thrice", "durability": 2}))
        .await;
    let id = published["id"].as_str().unwrap().to_string();
    assert_eq!(deliver_and_leave(&node).await, id);
    // Held by a subscriber when the node is killed: its second delivery, counted.
    let (mut holder, _) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    assert_eq!(holder.recv().await["id"], id.as_str());
    // A second publish behind it, durability 2: once its reply is in, every earlier record
    // (the count's) is on the disk too.
    publisher
        .success(json!({"body": "marker", "durability": 2}))
        .await;
    drop((holder, publisher, admin_client));
    let node = node.restart(&[]);
    // The restart ended the holder's session: the message waits again, with 2 deliveries
    // counted (the one held at the kill too), so the next failed one is its third and last.
    let mut admin_client = node.admin().await;
    assert!(dlq_ids(&mut admin_client).await.is_empty());
    assert_eq!(deliver_and_leave(&node).await, id);
    let dead = dlq_soon(&mut admin_client).await;
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
    let published = publisher
        .success(json!({"body": "again", "durability": 1}))
        .await;
    for _ in 0..5 {
        assert_eq!(
            deliver_and_leave(&node).await,
            published["id"].as_str().unwrap()
        );
    }
    let mut admin_client = node.admin().await;
    assert!(dlq_ids(&mut admin_client).await.is_empty());
}

#[tokio::test]
async fn retention_deletes_a_message_held_too_long_and_its_holder_is_told() {
    let node = Node::start();
    let mut admin_client = node.admin().await;
    admin_client
        .success(json!({"cmd": "setcfg", "message-retention-secs": 1}))
        .await;
    let (mut subscriber, _) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    let (mut publisher, _) = node.login("publisher", "distribute", json!({})).await;
    let published = publisher.success(json!({"body": "short-lived"})).await;
    let message = subscriber.recv().await;
    assert_eq!(message["id"], published["id"]);
    // Held, not acked: a second later it expires, and the holder gets the delmsg notice.
    let notice = subscriber.recv().await;
    assert_eq!(notice, json!({"deleted": true, "id": published["id"]}));
    let ack = subscriber
        .request(json!({"id": published["id"], "ack": 1}))
        .await;
    assert_eq!(ack["code"], 301, "{ack}");
    let stats = admin_client.success(json!({"cmd": "getlivestats"})).await;
    assert!(stats["csv"].as_str().unwrap().starts_with("0,"), "{stats}");
}

#[tokio::test]
async fn a_publish_may_give_its_own_expiration_and_a_bad_one_gets_its_code() {
    let node = Node::start();
    let (mut subscriber, _) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    let (mut publisher, _) = node.login("publisher", "distribute", json!({})).await;
    let reply = publisher
        .request(json!({"body": "x", "expires": 0, "context": 3}))
        .await;
    qe_tests::assert_failure(&reply, 212);
    assert_eq!(reply["context"], 3);
    let published = publisher
        .success(json!({"body": "brief", "expires": 1}))
        .await;
    assert_eq!(subscriber.recv().await["id"], published["id"]);
    let notice = subscriber.recv().await;
    assert_eq!(notice, json!({"deleted": true, "id": published["id"]}));
    let (mut copy, _) = node.login("publisher", "copy", json!({})).await;
    let reply = copy.request(json!({"body": "x", "expires": 5})).await;
    qe_tests::assert_failure(&reply, 213);
}
