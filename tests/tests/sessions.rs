//! Sessions: saved when a connection drops, resumed by the latest session id, or run out.

use futures::SinkExt;
use qe_tests::{assert_failure, login_request, Client, Ending, Node};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

async fn publish(publisher: &mut Client, body: &str) -> String {
    let reply = publisher.request(json!({"body": body})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    reply["id"].as_str().unwrap().to_string()
}

/// A resume login for `session`, with `extra` fields.
fn resume_request(session: &str, extra: Value) -> Value {
    let mut login = login_request("subscriber", "distribute", json!({"sessionid": session}));
    for (key, value) in extra.as_object().unwrap() {
        login[key] = value.clone();
    }
    login
}

/// Resumes; panics unless it succeeds. Returns the client and its new session id.
async fn resume(node: &Node, session: &str, extra: Value) -> (Client, String) {
    let mut client = Client::connect(node).await;
    let reply = client.request(resume_request(session, extra)).await;
    assert_eq!(reply["status"], "Success.", "resume: {reply}");
    let new = reply["sessionid"].as_str().unwrap().to_string();
    assert_ne!(new, session, "every login gives a new session id");
    (client, new)
}

/// A resume that must fail with 109 and close the connection.
async fn resume_fails(node: &Node, session: &str) {
    let mut client = Client::connect(node).await;
    let reply = client
        .request(resume_request(session, json!({"replay": true})))
        .await;
    assert_failure(&reply, 109);
    assert_eq!(client.ending().await, Ending::NoCloseFrame);
}

/// A saved session holding one message: a subscriber received it and its connection dropped.
/// Returns the session id, the message id and the publisher.
async fn saved_session_holding_one(node: &Node) -> (String, String, Client) {
    let (mut subscriber, session) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let id = publish(&mut publisher, "m1").await;
    assert_eq!(subscriber.recv().await["id"], id);
    drop(subscriber); // TCP closed with no close frame
    assert!(node.dropped(&session));
    (session, id, publisher)
}

#[tokio::test]
async fn after_an_abrupt_drop_a_resume_with_replay_gets_back_what_it_held() {
    let node = Node::start();
    let (mut a, session) = node.subscriber(2).await;
    let mut publisher = node.publisher().await;
    let m1 = publish(&mut publisher, "m1").await;
    assert_eq!(a.recv().await["id"], m1);
    drop(a); // TCP closed with no close frame
    assert!(node.dropped(&session));

    let (mut a, new) = resume(&node, &session, json!({"replay": true})).await;
    let again = a.recv().await;
    assert_eq!((&again["id"], &again["body"]), (&json!(m1), &json!("m1")));
    assert_eq!(
        a.request(json!({"id": m1, "ack": 1})).await["status"],
        "Success."
    );
    // Only the latest session id resumes.
    drop(a);
    assert!(node.dropped(&new));
    resume_fails(&node, &session).await;
    resume(&node, &new, json!({})).await;
}

#[tokio::test]
async fn a_close_frame_without_logout_is_a_drop_and_the_session_resumes() {
    let node = Node::start();
    let (mut a, session) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let m1 = publish(&mut publisher, "m1").await;
    a.recv().await;
    let normal = CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    };
    a.socket().close(Some(normal)).await.unwrap();
    assert_eq!(
        a.ending().await,
        Ending::Closed(1000),
        "the node answers the close"
    );
    assert!(node.dropped(&session));
    let (mut a, _) = resume(&node, &session, json!({})).await;
    // Without replay, what was sent is not sent again, but it is still held.
    assert_eq!(
        a.request(json!({"id": m1, "ack": 1})).await["status"],
        "Success."
    );
}

#[tokio::test]
async fn without_replay_sent_messages_are_not_sent_again() {
    let node = Node::start();
    let (mut a, session) = node.subscriber(5).await;
    let mut publisher = node.publisher().await;
    let m1 = publish(&mut publisher, "m1").await;
    a.recv().await;
    drop(a);
    assert!(node.dropped(&session));
    let (mut a, _) = resume(&node, &session, json!({"replay": false})).await;
    // The first frame after the resume is the next new message, not m1 again.
    publish(&mut publisher, "m2").await;
    assert_eq!(a.recv().await["body"], "m2");
    assert_eq!(
        a.request(json!({"id": m1, "ack": 1})).await["status"],
        "Success."
    );
}

#[tokio::test]
async fn a_resumed_session_keeps_its_place_in_the_line_and_its_capacity() {
    let node = Node::start();
    let (mut a, session) = node.subscriber(2).await;
    let (mut b, _) = node.subscriber(2).await;
    let mut publisher = node.publisher().await;
    let m1 = publish(&mut publisher, "m1").await;
    assert_eq!(a.recv().await["id"], m1);
    drop(a);
    assert!(node.dropped(&session));
    let m2 = publish(&mut publisher, "while away").await;
    assert_eq!(b.recv().await["id"], m2, "a saved session gets nothing new");

    let (mut a, resumed) = resume(&node, &session, json!({})).await;
    // a stands before b and has room for one more (capacity 2, holds m1): m3 is a's.
    publish(&mut publisher, "m3").await;
    assert_eq!(a.recv().await["body"], "m3");
    // a is now full; m4 goes to b.
    publish(&mut publisher, "m4").await;
    assert_eq!(b.recv().await["body"], "m4");

    // A capacity given on resume replaces the old one.
    drop(a);
    assert!(node.dropped(&resumed));
    let (mut a, _) = resume(&node, &resumed, json!({"capacity": 3})).await;
    publish(&mut publisher, "m5").await;
    assert_eq!(
        a.recv().await["body"],
        "m5",
        "capacity 3 leaves room beside m1 and m3"
    );
}

#[tokio::test]
async fn a_session_whose_old_connection_is_still_open_cannot_be_resumed() {
    let node = Node::start();
    let (mut a, session) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    publish(&mut publisher, "m1").await;
    a.recv().await;
    resume_fails(&node, &session).await;
    // The open connection is untouched.
    assert_eq!(
        a.request(json!({"capacity": 2})).await["status"],
        "Success."
    );
}

#[tokio::test]
async fn of_two_concurrent_resumes_exactly_one_wins() {
    let node = Node::start();
    let (session, _, _publisher) = saved_session_holding_one(&node).await;

    let mut first = Client::connect(&node).await;
    let mut second = Client::connect(&node).await;
    let login = resume_request(&session, json!({"replay": true})).to_string();
    let (r1, r2) = tokio::join!(
        first.socket().send(Message::text(login.clone())),
        second.socket().send(Message::text(login)),
    );
    r1.unwrap();
    r2.unwrap();
    let (one, two) = tokio::join!(first.recv(), second.recv());
    let statuses = [one["status"].clone(), two["status"].clone()];
    let successes = statuses.iter().filter(|s| *s == "Success.").count();
    assert_eq!(successes, 1, "{one} {two}");
    let failure = if one["status"] == "Success." {
        &two
    } else {
        &one
    };
    assert_failure(failure, 109);
}

#[tokio::test]
async fn a_logged_out_session_cannot_be_resumed() {
    let node = Node::start();
    let (mut a, session) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    publish(&mut publisher, "m1").await;
    a.recv().await;
    assert_eq!(
        a.request(json!({"logout": true})).await["status"],
        "Logout Success."
    );
    assert_eq!(a.ending().await, Ending::Closed(1000));
    resume_fails(&node, &session).await;
}

#[tokio::test]
async fn a_session_that_never_received_a_message_is_not_saved() {
    let node = Node::start();
    let (a, session) = node.subscriber(1).await;
    drop(a);
    assert!(!node.dropped(&session));
    resume_fails(&node, &session).await;
}

#[tokio::test]
async fn a_failed_resume_does_not_use_up_the_saved_session() {
    let node = Node::start();
    let (session, _, _publisher) = saved_session_holding_one(&node).await;
    for (extra, code) in [
        (json!({"password": "wrong"}), 107),
        (json!({"replay": "yes"}), 110),
        (json!({"capacity": 0}), 300),
    ] {
        let mut client = Client::connect(&node).await;
        let reply = client.request(resume_request(&session, extra)).await;
        assert_failure(&reply, code);
    }
    resume(&node, &session, json!({"replay": true})).await;
}

#[tokio::test]
async fn a_saved_session_runs_out_and_what_it_held_goes_to_another_subscriber() {
    let node = Node::start();
    let (mut a, session) = node.subscriber(1).await;
    let (mut b, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let m1 = publish(&mut publisher, "held by a").await;
    assert_eq!(a.recv().await["id"], m1);
    drop(a);
    assert!(node.dropped(&session));
    // saved-session-timeout-secs is 10 by default: the message reaches b then.
    let handed_on = b
        .recv_within(Duration::from_secs(20))
        .await
        .expect("handed on");
    assert_eq!(handed_on["id"], m1);
    resume_fails(&node, &session).await;
}

#[tokio::test]
async fn past_max_tasks_saved_sessions_one_that_holds_nothing_is_not_saved() {
    // Dev/test: max-tasks is 100.
    let node = Node::start_with(&["--tier", "devtest"]);
    let mut publisher = node.publisher().await;
    let mut sessions = Vec::new();
    for i in 0..101 {
        let (mut subscriber, session) = node.subscriber(1).await;
        let id = publish(&mut publisher, &format!("m{i}")).await;
        subscriber.recv().await;
        assert_eq!(
            subscriber.request(json!({"id": id, "ack": 1})).await["status"],
            "Success."
        );
        drop(subscriber);
        let saved = node.dropped(&session);
        assert_eq!(saved, i < 100, "session {i}");
        sessions.push(session);
    }
    resume_fails(&node, &sessions[100]).await;
    resume(&node, &sessions[0], json!({})).await;
}

#[tokio::test]
async fn a_silent_peer_is_noticed_and_its_session_saved() {
    // Pings every second; a peer silent for 2 s is gone: noticed within 3 s.
    let node = Node::start_with(&["--ping-secs", "1", "--silence-limit-secs", "2"]);
    let (mut a, session) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let m1 = publish(&mut publisher, "m1").await;
    assert_eq!(a.recv().await["id"], m1);
    // From here `a` reads nothing, so it answers no ping; its TCP connection stays open.
    node.wait_for_log("dropping a silent peer");
    assert!(node.dropped(&session));
    let (mut resumed, _) = resume(&node, &session, json!({"replay": true})).await;
    assert_eq!(resumed.recv().await["id"], m1);
    drop(a);
}

#[tokio::test]
async fn a_peer_that_answers_pings_stays_connected() {
    let node = Node::start_with(&["--ping-secs", "1", "--silence-limit-secs", "2"]);
    let (mut a, _) = node.subscriber(1).await;
    // Reading for 4 s answers the pings (the client library pongs as it reads).
    assert_eq!(a.recv_within(Duration::from_secs(4)).await, None);
    let mut publisher = node.publisher().await;
    publish(&mut publisher, "still here").await;
    assert_eq!(a.recv().await["body"], "still here");
    assert!(!node.log().contains("dropping a silent peer"));
}
