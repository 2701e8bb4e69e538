//! Subscribers: the line, capacity, ack and nack, logout, drops, delays, and the copy type.

use qe_tests::{assert_failure, Client, Ending, Node};
use serde_json::{json, Value};

async fn publish(publisher: &mut Client, body: &str) -> String {
    let reply = publisher.request(json!({"body": body})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    reply["id"].as_str().unwrap().to_string()
}

/// Asserts `subscriber` was sent nothing more: it must be the first in the line with room,
/// so a marker published now is the next frame it gets, unless something came before it.
async fn assert_nothing_more(subscriber: &mut Client, publisher: &mut Client) {
    publish(publisher, "marker").await;
    assert_eq!(subscriber.recv().await["body"], "marker");
}

#[tokio::test]
async fn the_first_subscriber_in_the_line_with_room_gets_each_message() {
    let node = Node::start();
    let (mut a, _) = node.subscriber(2).await;
    let (mut b, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let m1 = publish(&mut publisher, "m1").await;
    publish(&mut publisher, "m2").await;
    publish(&mut publisher, "m3").await;
    assert_eq!(a.recv().await["id"], m1);
    assert_eq!(a.recv().await["body"], "m2");
    assert_eq!(b.recv().await["body"], "m3");
    publish(&mut publisher, "m4").await;
    // Everyone is full: m4 waits, and goes to a when a makes room. The delivery may overtake
    // the ack's reply, which waits for the ack to be written.
    a.send_json(&json!({"id": m1, "ack": 1})).await;
    let mut frames = [a.recv().await, a.recv().await];
    frames.sort_by_key(|f| f.get("status").is_some());
    assert_eq!(frames[0]["body"], "m4");
    assert_eq!(frames[1], json!({"id": m1, "status": "Success."}));
}

#[tokio::test]
async fn messages_are_not_spread_evenly() {
    let node = Node::start();
    let (mut busy, _) = node.subscriber(100).await;
    let (mut idle, _) = node.subscriber(100).await;
    let mut publisher = node.publisher().await;
    for i in 0..20 {
        publish(&mut publisher, &format!("m{i}")).await;
        assert_eq!(busy.recv().await["body"], format!("m{i}"));
    }
    // The idle subscriber gets only what the busy one has no room for.
    busy.request(json!({"capacity": 20})).await;
    assert_nothing_more(&mut idle, &mut publisher).await;
}

#[tokio::test]
async fn a_capacity_change_sends_waiting_messages_at_once() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    for body in ["m1", "m2", "m3"] {
        publish(&mut publisher, body).await;
    }
    assert_eq!(subscriber.recv().await["body"], "m1");
    subscriber
        .send_json(&json!({"capacity": 3, "context": "cap"}))
        .await;
    // The released deliveries and the reply may come in either order.
    let frames = [
        subscriber.recv().await,
        subscriber.recv().await,
        subscriber.recv().await,
    ];
    let (replies, deliveries): (Vec<_>, Vec<_>) =
        frames.into_iter().partition(|f| f.get("status").is_some());
    assert_eq!(replies, [json!({"status": "Success.", "context": "cap"})]);
    let bodies: Vec<&Value> = deliveries.iter().map(|d| &d["body"]).collect();
    assert_eq!(bodies, [&json!("m2"), &json!("m3")]);
    for bad in [json!(0), json!(1025), json!("2"), json!(2.0), json!(null)] {
        assert_failure(&subscriber.request(json!({"capacity": bad})).await, 300);
    }
}

#[tokio::test]
async fn ack_and_nack_faults_have_their_codes() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(5).await;
    let (mut other, _) = node.subscriber(5).await;
    let mut publisher = node.publisher().await;
    let held = publish(&mut publisher, "held").await;
    subscriber.recv().await;
    let unknown = "01a1c09f-62da-7000-a30b-0817c9a42e3f";
    let cases = [
        (json!({"id": held, "ack": 2}), 302),
        (json!({"id": held, "ack": "1"}), 302),
        (json!({"id": held, "ack": true}), 302),
        (json!({"id": held, "ack": 1.0}), 302),
        (json!({"id": "not-an-id", "ack": 1}), 301),
        (json!({"id": 5, "ack": 1}), 301),
        (json!({"ack": 1}), 301),
        (json!({"id": unknown, "ack": 1}), 301),
        (json!({"id": held, "ack": 1, "context": {}}), 101),
        (json!({"logout": false}), 303),
        (json!({"logout": "yes"}), 303),
        (json!({"id": held}), 304),
        (json!({"hello": 1}), 304),
        (json!({"id": held, "ack": 1, "capacity": 3}), 304),
        (json!([1, 2]), 304),
    ];
    for (request, code) in cases {
        assert_failure(&subscriber.request(request.clone()).await, code);
    }
    // Only the holder can ack.
    assert_failure(&other.request(json!({"id": held, "ack": 1})).await, 301);
    // The connection stayed open through all of that, and the message is still held.
    let reply = subscriber
        .request(json!({"id": held, "ack": 1, "context": 5}))
        .await;
    assert_eq!(
        reply,
        json!({"id": held, "status": "Success.", "context": 5})
    );
    assert_failure(
        &subscriber.request(json!({"id": held, "ack": 1})).await,
        301,
    );
}

#[tokio::test]
async fn a_nack_moves_the_message_to_the_dead_letter_queue_for_good() {
    let node = Node::start();
    let (mut a, _) = node.subscriber(1).await;
    let (mut b, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let rejected = publish(&mut publisher, "poison").await;
    assert_eq!(a.recv().await["id"], rejected);
    let reply = a.request(json!({"id": rejected, "ack": 0})).await;
    assert_eq!(reply, json!({"id": rejected, "status": "Success."}));
    assert_failure(&a.request(json!({"id": rejected, "ack": 1})).await, 301);
    // a logs out; the rejected message goes to nobody.
    a.request(json!({"logout": true})).await;
    assert_nothing_more(&mut b, &mut publisher).await;
}

#[tokio::test]
async fn a_durability_zero_message_cannot_be_nacked() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let reply = publisher
        .request(json!({"body": "fleeting", "durability": 0}))
        .await;
    let id = reply["id"].clone();
    subscriber.recv().await;
    assert_failure(&subscriber.request(json!({"id": id, "ack": 0})).await, 305);
    assert_eq!(
        subscriber.request(json!({"id": id, "ack": 1})).await["status"],
        "Success."
    );
}

#[tokio::test]
async fn a_logout_replies_closes_with_1000_and_hands_on_what_was_held() {
    let node = Node::start();
    let (mut leaving, _) = node.subscriber(2).await;
    let (mut staying, _) = node.subscriber(5).await;
    let mut publisher = node.publisher().await;
    let m1 = publish(&mut publisher, "m1").await;
    let m2 = publish(&mut publisher, "m2").await;
    leaving.recv().await;
    leaving.recv().await;
    let reply = leaving.request(json!({"logout": true, "context": 1})).await;
    assert_eq!(reply, json!({"status": "Logout Success.", "context": 1}));
    assert_eq!(leaving.ending().await, Ending::Closed(1000));
    let got: Vec<Value> = vec![
        staying.recv().await["id"].clone(),
        staying.recv().await["id"].clone(),
    ];
    assert_eq!(got, [json!(m1), json!(m2)]);
}

#[tokio::test]
async fn an_ack_sent_just_before_a_logout_still_counts() {
    let node = Node::start();
    let (mut leaving, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let id = publish(&mut publisher, "done").await;
    leaving.recv().await;
    leaving.send_json(&json!({"id": id, "ack": 1})).await;
    leaving.send_json(&json!({"logout": true})).await;
    assert_eq!(leaving.recv().await["status"], "Success.");
    assert_eq!(leaving.recv().await["status"], "Logout Success.");
    let (mut next, _) = node.subscriber(5).await;
    assert_nothing_more(&mut next, &mut publisher).await;
}

#[tokio::test]
async fn text_that_is_not_json_from_a_subscriber_gets_100_and_the_connection_ends() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(1).await;
    subscriber.send_text("ack it").await;
    assert_failure(&subscriber.recv().await, 100);
    assert_eq!(subscriber.ending().await, Ending::NoCloseFrame);

    let (mut subscriber, _) = node.subscriber(1).await;
    subscriber.send_binary(b"{}").await;
    assert_failure(&subscriber.recv().await, 100);
    assert_eq!(subscriber.ending().await, Ending::NoCloseFrame);
}

#[tokio::test]
async fn a_copy_subscriber_may_send_nothing() {
    let node = Node::start();
    let (mut copy, _) = node.login("subscriber", "copy", json!({})).await;
    assert_failure(&copy.request(json!({"logout": true})).await, 306);
    let reply = copy.request(json!({"anything": 1, "context": 4})).await;
    assert_failure(&reply, 306);
    assert_eq!(reply["context"], 4);
    assert_failure(&copy.request(json!({"context": false})).await, 101);
    // Still connected: it still receives.
    let (mut publisher, _) = node.login("publisher", "copy", json!({})).await;
    publisher.request(json!({"body": "still here"})).await;
    assert_eq!(copy.recv().await["body"], "still here");
    copy.send_text("not json").await;
    assert_failure(&copy.recv().await, 100);
    assert_eq!(copy.ending().await, Ending::NoCloseFrame);
}

#[tokio::test]
async fn a_delayed_message_waits_and_others_pass_it() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(5).await;
    let mut publisher = node.publisher().await;
    let delayed = publisher
        .request(json!({"body": "later", "delay": 1}))
        .await;
    assert_eq!(delayed["status"], "Success.");
    publish(&mut publisher, "now").await;
    assert_eq!(subscriber.recv().await["body"], "now");
    let message = subscriber.recv().await;
    assert_eq!(
        (&message["id"], &message["body"]),
        (&delayed["id"], &json!("later"))
    );
}

#[tokio::test]
async fn ids_sort_in_publish_order() {
    let node = Node::start();
    let mut publisher = node.publisher().await;
    let mut last = String::new();
    for i in 0..200 {
        let id = publish(&mut publisher, &i.to_string()).await;
        assert!(id > last, "{id} after {last}");
        last = id;
    }
}
