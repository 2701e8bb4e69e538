//! The manual's quick start, step by step, against the real binary.

use qe_tests::{Ending, Node, PROMPT};
use serde_json::json;
use std::time::{SystemTime, UNIX_EPOCH};

#[tokio::test]
async fn the_quick_start_works_as_the_manual_says() {
    let node = Node::start();

    // 1. Start a subscriber.
    let (mut subscriber, login) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    let session_id = login["sessionid"].as_str().unwrap();
    assert_eq!(
        uuid::Uuid::parse_str(session_id).unwrap().get_version_num(),
        7
    );
    assert_eq!(login.as_object().unwrap().len(), 2, "{login}");

    // 2. Start a publisher.
    let (mut publisher, login) = node.login("publisher", "distribute", json!({})).await;
    assert_eq!(login, json!({"status": "Success."}));

    // 3. Send a message.
    let reply = publisher.request(json!({"body": "Hello"})).await;
    assert_eq!(reply["status"], "Success.");
    let id = reply["id"].as_str().unwrap().to_string();
    assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 7);

    // 4. Receive it.
    let message = subscriber.recv().await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(message["id"], id.as_str());
    assert_eq!(message["type"], 1);
    assert_eq!(message["body"], "Hello");
    let recdat = message["recdat"].as_u64().unwrap();
    assert!(
        recdat <= now && recdat + PROMPT.as_secs() >= now,
        "recdat {recdat}, now {now}"
    );
    assert_eq!(
        message.as_object().unwrap().len(),
        4,
        "no publisherkey: {message}"
    );

    // 5. Acknowledge it, then log out.
    let reply = subscriber.request(json!({"id": id, "ack": 1})).await;
    assert_eq!(reply, json!({"id": id, "status": "Success."}));
    let reply = subscriber.request(json!({"logout": true})).await;
    assert_eq!(reply, json!({"status": "Logout Success."}));
    assert_eq!(subscriber.ending().await, Ending::Closed(1000));
}
