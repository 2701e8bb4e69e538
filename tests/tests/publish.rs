//! Publishers: JSON publishes, binary and plain-text frames, codes 200–211, publishing in the
//! login, and the copy queue type.

use base64::Engine;
use qe_tests::{assert_failure, login_request, Client, Ending, Node};
use serde_json::json;

#[tokio::test]
async fn a_full_publish_reaches_the_subscriber_with_every_field() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(5).await;
    let mut publisher = node.publisher().await;
    let reply = publisher
        .request(json!({"body": "Order 1234 is ready", "durability": 2, "publisherkey": "order-1234", "context": "c1"}))
        .await;
    assert_eq!(reply["status"], "Success.");
    assert_eq!(reply["context"], "c1");
    let message = subscriber.recv().await;
    assert_eq!(message["id"], reply["id"]);
    assert_eq!(message["publisherkey"], "order-1234");
    assert_eq!(message["type"], 1);
    assert_eq!(message["body"], "Order 1234 is ready");
    assert!(message["recdat"].is_u64());
}

#[tokio::test]
async fn binary_and_plain_frames_are_messages_too() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(10).await;
    let mut publisher = node.publisher().await;

    publisher.send_binary(&[0, 159, 146, 150, 255]).await;
    assert_eq!(publisher.recv().await["status"], "Success.");
    let message = subscriber.recv().await;
    assert_eq!(message["type"], 2);
    let body = base64::engine::general_purpose::STANDARD
        .decode(message["body"].as_str().unwrap())
        .unwrap();
    assert_eq!(body, [0, 159, 146, 150, 255]);

    let reply = publisher
        .request(json!({"body": "aGVsbG8=", "type": 2}))
        .await;
    assert_eq!(reply["status"], "Success.");
    assert_eq!(subscriber.recv().await["body"], "aGVsbG8=");

    for text in ["Hello", "[1,2]", "42", "\"q\"", "", "  not { json"] {
        publisher.send_text(text).await;
        let reply = publisher.recv().await;
        assert_eq!(reply["status"], "Success.", "{text:?}: {reply}");
        let message = subscriber.recv().await;
        assert_eq!(message["body"], text);
        assert_eq!(message["type"], 1);
        assert_eq!(message["id"], reply["id"]);
    }
}

#[tokio::test]
async fn text_that_only_looks_like_json_is_refused_and_the_connection_stays() {
    let node = Node::start();
    let mut publisher = node.publisher().await;
    publisher.send_text("  {\"body\": \"oops\"").await;
    assert_failure(&publisher.recv().await, 100);
    let reply = publisher.request(json!({"body": "fine"})).await;
    assert_eq!(reply["status"], "Success.");
}

#[tokio::test]
async fn each_publish_fault_has_its_code_and_the_connection_stays() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(100).await;
    let mut publisher = node.publisher().await;
    let cases = [
        (json!({"body": "x", "context": [1]}), 101),
        (json!({"body": 12}), 200),
        (json!({"body": "x", "type": 0}), 201),
        (json!({"body": "x", "type": 1.0}), 201),
        (json!({"body": "%%%", "type": 2}), 202),
        (json!({"body": "x", "delay": 172_801}), 203),
        (json!({"body": "x", "delay": "5"}), 203),
        (json!({"body": "x", "durability": 3}), 204),
        (json!({"body": "x", "durability": true}), 204),
        (json!({"body": "x", "publisherkey": "k".repeat(129)}), 205),
        (json!({"body": "x", "publisherkey": "café"}), 205),
        (json!({"Body": "typo"}), 206),
        (json!({"logout": true}), 206),
    ];
    for (request, code) in cases {
        let reply = publisher.request(request.clone()).await;
        assert_failure(&reply, code);
        if code != 101 {
            assert_eq!(reply.get("id"), None);
        }
    }
    let reply = publisher
        .request(json!({"Body": "typo", "context": 9}))
        .await;
    assert_failure(&reply, 206);
    assert_eq!(reply["context"], 9, "failures echo the context");
    // Nothing refused was published: the first message the subscriber sees is this one.
    let reply = publisher
        .request(json!({"body": "valid", "delay": 0, "durability": 0}))
        .await;
    assert_eq!(reply["status"], "Success.");
    assert_eq!(subscriber.recv().await["body"], "valid");
}

#[tokio::test]
async fn a_publish_in_the_login_is_answered_by_the_publishs_reply() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(5).await;
    let mut client = Client::connect(&node).await;
    let reply = client
        .request(login_request(
            "publisher",
            "distribute",
            json!({"body": "in the login", "context": 3}),
        ))
        .await;
    assert_eq!(reply["status"], "Success.");
    assert_eq!(reply["context"], 3);
    let message = subscriber.recv().await;
    assert_eq!(
        (&message["id"], &message["body"]),
        (&reply["id"], &json!("in the login"))
    );
    // The connection is a logged-in publisher.
    let reply = client.request(json!({"body": "and another"})).await;
    assert_eq!(reply["status"], "Success.");
}

#[tokio::test]
async fn a_bad_publish_in_the_login_still_logs_in() {
    let node = Node::start();
    let mut client = Client::connect(&node).await;
    let reply = client
        .request(login_request(
            "publisher",
            "distribute",
            json!({"body": "x", "delay": -5}),
        ))
        .await;
    assert_failure(&reply, 203);
    let reply = client.request(json!({"body": "after"})).await;
    assert_eq!(reply["status"], "Success.");

    let mut client = Client::connect(&node).await;
    let reply = client
        .request(login_request(
            "publisher",
            "distribute",
            json!({"delay": 5}),
        ))
        .await;
    assert_failure(&reply, 206);

    // A login fault is a failed login, even with a publish in it.
    let mut client = Client::connect(&node).await;
    let reply = client
        .request(login_request(
            "publisher",
            "distribute",
            json!({"body": "x", "password": "bad"}),
        ))
        .await;
    assert_failure(&reply, 107);
    assert_eq!(client.ending().await, Ending::NoCloseFrame);
}

#[tokio::test]
async fn a_copy_queue_sends_to_every_connected_copy_subscriber() {
    let node = Node::start();
    let (mut publisher, _) = node.login("publisher", "copy", json!({})).await;
    let reply = publisher.request(json!({"body": "nobody listens"})).await;
    assert_eq!(reply, json!({"status": "Success.", "subscribers": 0}));

    let (mut first, _) = node.login("subscriber", "copy", json!({})).await;
    let (mut second, _) = node.login("subscriber", "copy", json!({})).await;
    let (mut distribute, _) = node.subscriber(5).await;
    let reply = publisher
        .request(json!({"body": "to all", "context": 1}))
        .await;
    assert_eq!(
        reply,
        json!({"status": "Success.", "subscribers": 2, "context": 1})
    );
    for copy in [&mut first, &mut second] {
        let message = copy.recv().await;
        assert_eq!(message["body"], "to all");
        assert_eq!(message["type"], 1);
        assert!(message["recdat"].is_u64());
        assert_eq!(message.as_object().unwrap().len(), 3, "no id: {message}");
    }
    publisher.send_binary(b"\x01\x02").await;
    assert_eq!(publisher.recv().await["subscribers"], 2);
    assert_eq!(
        first.recv().await,
        json!({"type": 2, "body": "AQI=", "recdat": second.recv().await["recdat"]})
    );

    // Copy and distribute are separate: the distribute subscriber got nothing. A distribute
    // publish reaches it first.
    let mut distribute_publisher = node.publisher().await;
    distribute_publisher
        .request(json!({"body": "distribute"}))
        .await;
    assert_eq!(distribute.recv().await["body"], "distribute");

    drop(second);
    let mut copy_publisher = Client::connect(&node).await;
    let reply = copy_publisher
        .request(login_request(
            "publisher",
            "copy",
            json!({"body": "in the login"}),
        ))
        .await;
    assert_eq!(reply["status"], "Success.");
    assert!(reply.get("id").is_none());
    assert_eq!(first.recv().await["body"], "in the login");
}

#[tokio::test]
async fn a_copy_queue_refuses_delay_durability_and_publisher_key() {
    let node = Node::start();
    let (mut publisher, _) = node.login("publisher", "copy", json!({})).await;
    for (request, code) in [
        (json!({"body": "x", "delay": 0}), 207),
        (json!({"body": "x", "durability": 1}), 208),
        (json!({"body": "x", "publisherkey": "k"}), 209),
        (json!({"body": "x", "delay": -1}), 203),
    ] {
        assert_failure(&publisher.request(request).await, code);
    }
}

#[tokio::test]
async fn the_biggest_message_is_max_ws_msg_len_and_a_bigger_one_closes_with_1009() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let envelope = r#"{"body":""}"#.len();
    let body = "b".repeat(65_536 - envelope);
    let request = format!(r#"{{"body":"{body}"}}"#);
    assert_eq!(request.len(), 65_536);
    publisher.send_text(&request).await;
    assert_eq!(publisher.recv().await["status"], "Success.");
    assert_eq!(
        subscriber.recv().await["body"].as_str().unwrap().len(),
        body.len()
    );

    publisher
        .send_text(&format!(r#"{{"body":"{body}x"}}"#))
        .await;
    assert_eq!(publisher.ending().await, Ending::Closed(1009));
}

#[tokio::test]
async fn a_full_queue_refuses_with_210_counting_the_dead_letter_queue() {
    let node = Node::start_with(&["--max-messages", "2"]);
    let (mut subscriber, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let first = publisher.request(json!({"body": "one"})).await;
    subscriber.recv().await;
    let nack = subscriber
        .request(json!({"id": first["id"], "ack": 0}))
        .await;
    assert_eq!(nack["status"], "Success.");
    assert_eq!(
        publisher.request(json!({"body": "two"})).await["status"],
        "Success."
    );
    assert_failure(&publisher.request(json!({"body": "three"})).await, 210);
    let second = subscriber.recv().await;
    subscriber
        .request(json!({"id": second["id"], "ack": 1}))
        .await;
    assert_eq!(
        publisher.request(json!({"body": "three"})).await["status"],
        "Success."
    );
}

#[tokio::test]
async fn messages_beyond_max_messages_memory_are_refused_with_211() {
    // A 600 B body makes a ~675 B frame, counted with 220 B of overhead: two fit, not three,
    // and a small one still fits beside the two.
    let node = Node::start_with(&["--max-messages-memory", "2200"]);
    let mut publisher = node.publisher().await;
    let body = "m".repeat(600);
    for _ in 0..2 {
        assert_eq!(
            publisher.request(json!({"body": body})).await["status"],
            "Success."
        );
    }
    assert_failure(&publisher.request(json!({"body": body})).await, 211);
    assert_eq!(
        publisher.request(json!({"body": "small"})).await["status"],
        "Success."
    );
}
