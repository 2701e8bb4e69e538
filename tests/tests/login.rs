//! Connect and log in: every field, every login failure code, and how a failed login ends.

use futures::SinkExt;
use qe_tests::{assert_failure, login_request, Client, Ending, Node};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// Sends `login` as the first frame and returns the reply, checking the connection then ends
/// with no close frame.
async fn failed_login(node: &Node, login: &str) -> Value {
    let mut client = Client::connect(node).await;
    client.send_text(login).await;
    let reply = client.recv().await;
    assert_eq!(client.ending().await, Ending::NoCloseFrame, "after {reply}");
    reply
}

fn with(role: &str, queue_type: &str, changes: Value) -> String {
    let mut login = login_request(role, queue_type, json!({}));
    for (key, value) in changes.as_object().unwrap() {
        match value {
            Value::Null if key.starts_with('-') => {
                login.as_object_mut().unwrap().remove(&key[1..]);
            }
            _ => login[key] = value.clone(),
        }
    }
    login.to_string()
}

#[tokio::test]
async fn each_login_fault_has_its_code_and_closes_the_connection() {
    let node = Node::start();
    let long = "x".repeat(129);
    let cases: Vec<(String, u16)> = vec![
        ("hello".into(), 100),
        ("[1,2]".into(), 100),
        (r#"{"username":"#.into(), 100),
        (
            with("publisher", "distribute", json!({"context": true})),
            101,
        ),
        (
            with(
                "publisher",
                "distribute",
                json!({"context": "c".repeat(257)}),
            ),
            101,
        ),
        (
            with("publisher", "distribute", json!({"-username": null})),
            103,
        ),
        (with("publisher", "distribute", json!({"username": 5})), 103),
        (
            with("publisher", "distribute", json!({"username": long})),
            103,
        ),
        (
            with("publisher", "distribute", json!({"-password": null})),
            104,
        ),
        (
            with("publisher", "distribute", json!({"password": long})),
            104,
        ),
        (
            with("publisher", "distribute", json!({"role": "reader"})),
            105,
        ),
        (with("publisher", "distribute", json!({"-role": null})), 105),
        (
            with("publisher", "distribute", json!({"queuetype": "fanout"})),
            106,
        ),
        (
            with("publisher", "distribute", json!({"-queuetype": null})),
            106,
        ),
        (
            with("publisher", "distribute", json!({"password": "wrong"})),
            107,
        ),
        (
            with(
                "publisher",
                "distribute",
                json!({"username": "x".repeat(128)}),
            ),
            107,
        ),
        (
            with(
                "subscriber",
                "distribute",
                json!({"role": "publisher", "capacity": 1}),
            ),
            107,
        ),
        (
            with(
                "admin",
                "distribute",
                json!({"role": "subscriber", "capacity": 1}),
            ),
            107,
        ),
        (with("admin", "copy", json!({})), 108),
        (
            with("subscriber", "distribute", json!({"sessionid": "nope"})),
            109,
        ),
        (
            with(
                "subscriber",
                "distribute",
                json!({"sessionid": 7, "capacity": 1}),
            ),
            109,
        ),
        (
            with(
                "subscriber",
                "distribute",
                json!({"sessionid": "01a1c0a0-d4d9-7000-9721-b211a887145b", "capacity": 1}),
            ),
            109,
        ),
        (
            with(
                "subscriber",
                "distribute",
                json!({"capacity": 1, "replay": "yes"}),
            ),
            110,
        ),
        (with("subscriber", "distribute", json!({})), 300),
        (
            with("subscriber", "distribute", json!({"capacity": 0})),
            300,
        ),
        (
            with("subscriber", "distribute", json!({"capacity": 1025})),
            300,
        ),
        (
            with("subscriber", "distribute", json!({"capacity": "1"})),
            300,
        ),
        (
            with("subscriber", "distribute", json!({"capacity": 1.0})),
            300,
        ),
        // Form before authentication: a bad capacity with a wrong password is 300.
        (
            with(
                "subscriber",
                "distribute",
                json!({"capacity": 0, "password": "x"}),
            ),
            300,
        ),
        // Lowest code first.
        (
            with(
                "publisher",
                "distribute",
                json!({"-username": null, "role": "x"}),
            ),
            103,
        ),
    ];
    for (login, code) in cases {
        let reply = failed_login(&node, &login).await;
        assert_failure(&reply, code);
        assert_eq!(reply.get("context"), None, "{login}");
    }
}

#[tokio::test]
async fn a_binary_login_gets_102() {
    let node = Node::start();
    let mut client = Client::connect(&node).await;
    let login = login_request("publisher", "distribute", json!({}));
    client.send_binary(login.to_string().as_bytes()).await;
    assert_failure(&client.recv().await, 102);
    assert_eq!(client.ending().await, Ending::NoCloseFrame);
}

#[tokio::test]
async fn a_failed_login_echoes_its_context() {
    let node = Node::start();
    let reply = failed_login(
        &node,
        &with(
            "publisher",
            "distribute",
            json!({"password": "no", "context": 7}),
        ),
    )
    .await;
    assert_failure(&reply, 107);
    assert_eq!(reply["context"], 7);
    let reply = failed_login(&node, &with("admin", "copy", json!({"context": "mine"}))).await;
    assert_failure(&reply, 108);
    assert_eq!(reply["context"], "mine");
}

#[tokio::test]
async fn every_role_logs_in_and_a_context_comes_back() {
    let node = Node::start();
    for (role, queue_type, extra) in [
        ("publisher", "distribute", json!({"context": 1})),
        ("publisher", "copy", json!({"context": 2.5})),
        ("subscriber", "copy", json!({"context": "three"})),
        ("admin", "distribute", json!({"context": 4})),
    ] {
        let context = extra["context"].clone();
        let (_client, reply) = node.login(role, queue_type, extra).await;
        assert_eq!(
            reply,
            json!({"status": "Success.", "context": context}),
            "{role}"
        );
    }
    let (_client, reply) = node
        .login(
            "subscriber",
            "distribute",
            json!({"capacity": 1024, "context": "s", "replay": false}),
        )
        .await;
    assert_eq!(reply["context"], "s");
    assert!(reply["sessionid"].is_string());
}

#[tokio::test]
async fn every_login_gives_a_new_session_id_and_many_connections_share_a_login() {
    let node = Node::start();
    let (_a, first) = node.subscriber(1).await;
    let (_b, second) = node.subscriber(1).await;
    assert_ne!(first, second);
    assert!(
        second > first,
        "session ids are UUIDv7 and sort in time order"
    );
}

#[tokio::test]
async fn a_copy_subscriber_may_give_a_capacity_and_it_is_ignored() {
    let node = Node::start();
    let (_client, reply) = node
        .login("subscriber", "copy", json!({"capacity": 5000}))
        .await;
    assert_eq!(reply, json!({"status": "Success."}));
}

/// Sends the login and a second frame in one write, before any reply.
async fn login_then_at_once(node: &Node, login: Value, second: Value) -> Client {
    let mut client = Client::connect(node).await;
    let socket = client.socket();
    socket.feed(Message::text(login.to_string())).await.unwrap();
    socket
        .feed(Message::text(second.to_string()))
        .await
        .unwrap();
    socket.flush().await.unwrap();
    client
}

#[tokio::test]
async fn a_message_sent_during_the_login_ends_the_connection_unanswered() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(10).await;

    let login = login_request("publisher", "distribute", json!({}));
    let mut early = login_then_at_once(&node, login, json!({"body": "too early"})).await;
    assert_eq!(
        early.ending().await,
        Ending::NoCloseFrame,
        "no reply, no close frame"
    );

    let publish_in_login =
        login_request("publisher", "distribute", json!({"body": "in the login"}));
    let mut early = login_then_at_once(&node, publish_in_login, json!({"body": "too early"})).await;
    assert_eq!(early.ending().await, Ending::NoCloseFrame);

    // Neither message was published: the next one is the first the subscriber sees.
    let mut publisher = node.publisher().await;
    publisher.request(json!({"body": "marker"})).await;
    assert_eq!(subscriber.recv().await["body"], "marker");

    // A subscriber that sends during its login never joins the line.
    let login = login_request("subscriber", "distribute", json!({"capacity": 5}));
    let mut early = login_then_at_once(&node, login, json!({"capacity": 6})).await;
    assert_eq!(early.ending().await, Ending::NoCloseFrame);
    publisher.request(json!({"body": "second"})).await;
    assert_eq!(subscriber.recv().await["body"], "second");
}

#[tokio::test]
async fn a_connection_that_never_logs_in_is_closed_after_the_login_time() {
    let node = Node::start();
    let mut silent = Client::connect(&node).await;
    // no-reply-timeout-secs is 10 by default.
    assert_eq!(
        silent.ending_within(Duration::from_secs(20)).await,
        Ending::NoCloseFrame
    );
}

#[tokio::test]
async fn after_a_login_there_is_no_idle_limit_and_pings_are_answered() {
    let node = Node::start();
    let mut publisher = node.publisher().await;
    publisher
        .socket()
        .send(Message::Ping(b"hi".to_vec().into()))
        .await
        .unwrap();
    let pong = futures::StreamExt::next(publisher.socket())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pong, Message::Pong(b"hi".to_vec().into()));
    let reply = publisher.request(json!({"body": "still here"})).await;
    assert_eq!(reply["status"], "Success.");
}

/// Beyond the manual (README, "Limits at login"): a login with `"limits":true` learns the
/// queue's current `max-ws-msg-len`, whatever the role; without it the reply is the manual's.
#[tokio::test]
async fn a_login_that_asks_learns_the_queues_frame_limit() {
    let node = Node::start();
    let (_, plain) = node.login("publisher", "distribute", json!({})).await;
    assert_eq!(plain, json!({"status": "Success."}), "the manual's reply");
    let asked = json!({"limits": true, "context": 7});
    let (_, reply) = node.login("publisher", "distribute", asked.clone()).await;
    assert_eq!(
        reply,
        json!({"status": "Success.", "maxwsmsglen": 65536, "context": 7})
    );
    let mut admin = node.admin().await;
    admin
        .success(json!({"cmd": "setcfg", "max-ws-msg-len": 131072}))
        .await;
    let logins = [
        ("publisher", "distribute", json!({"limits": true})),
        (
            "subscriber",
            "distribute",
            json!({"limits": true, "capacity": 1}),
        ),
        ("subscriber", "copy", json!({"limits": true})),
        ("admin", "distribute", json!({"limits": true})),
    ];
    for (role, queue_type, extra) in logins {
        let (_, reply) = node.login(role, queue_type, extra).await;
        assert_eq!(reply["maxwsmsglen"], 131072, "{role} {queue_type}: {reply}");
    }
    // A resumed session learns it too.
    let (mut subscriber, session) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    publisher.success(json!({"body": "held"})).await;
    subscriber.recv().await;
    drop(subscriber);
    assert!(node.dropped(&session));
    let resume = json!({"limits": true, "sessionid": session});
    let (_, reply) = node.login("subscriber", "distribute", resume).await;
    assert_eq!(reply["maxwsmsglen"], 131072, "{reply}");
    assert!(reply["sessionid"].is_string(), "resumed: {reply}");
    // Anything but true asks nothing.
    let (_, reply) = node
        .login("publisher", "distribute", json!({"limits": "yes"}))
        .await;
    assert!(reply.get("maxwsmsglen").is_none(), "{reply}");
}
