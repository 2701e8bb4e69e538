//! 10,000 logged-in subscribers on one node: a publish still goes to the first subscriber in
//! the line with room, and the node's memory per connection is reported (the bench measures
//! it on a release build: docs/performance.md).

use futures::StreamExt;
use qe_tests::{raise_descriptor_limit, Client, Node};
use serde_json::json;
use std::net::Ipv4Addr;

const SUBSCRIBERS: usize = 10_000;

/// The loopback address the `n`th subscriber connects from, so that no source has more than
/// a few logins under way.
fn source(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 3, (n / 250) as u8, (n % 250 + 1) as u8)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_subscribers_and_a_publish_goes_to_the_first_with_room() {
    let descriptors = raise_descriptor_limit();
    assert!(
        descriptors as usize > SUBSCRIBERS + 1_000,
        "this test needs more than {} descriptors; the hard limit is {descriptors}",
        SUBSCRIBERS + 1_000
    );
    let node = Node::start();
    let (mut admin, _) = node.login("admin", "distribute", json!({})).await;
    let before = node.resident_bytes();
    // The first two in the line, then the rest, 64 logins at a time.
    let login = qe_tests::login_request("subscriber", "distribute", json!({"capacity": 1}));
    let mut first = Client::connect_from(&node, source(0)).await;
    assert_eq!(first.request(login.clone()).await["status"], "Success.");
    let mut second = Client::connect_from(&node, source(1)).await;
    assert_eq!(second.request(login.clone()).await["status"], "Success.");
    let logins = futures::stream::iter(2..SUBSCRIBERS)
        .map(|n| {
            let (node, login) = (&node, login.clone());
            async move {
                let mut client = Client::connect_from(node, source(n)).await;
                let reply = client.request(login).await;
                assert_eq!(reply["status"], "Success.", "subscriber {n}: {reply}");
                client
            }
        })
        .buffer_unordered(64);
    let rest: Vec<Client> = logins.collect().await;
    let after = node.resident_bytes();
    eprintln!(
        "{SUBSCRIBERS} logged-in subscribers: {} MiB resident more, {:.1} KiB each (debug build)",
        (after - before) >> 20,
        (after - before) as f64 / SUBSCRIBERS as f64 / 1024.0
    );
    let stats = admin.request(json!({"cmd": "getlivestats"})).await;
    let columns: Vec<&str> = stats["csv"].as_str().unwrap().split(',').collect();
    assert_eq!(columns[2], SUBSCRIBERS.to_string(), "subscribers: {stats}");

    let mut publisher = node.publisher().await;
    let reply = publisher.request(json!({"body": "to the first"})).await;
    let delivered = first.recv().await;
    assert_eq!(
        (&delivered["id"], &delivered["body"]),
        (&reply["id"], &json!("to the first"))
    );
    // The first now has no room (capacity 1): the next message goes to the next in the line.
    let reply = publisher.request(json!({"body": "to the second"})).await;
    let delivered_second = second.recv().await;
    assert_eq!(delivered_second["id"], reply["id"]);
    // Acked, the first has room again and is first in the line once more.
    let ack = first
        .request(json!({"id": delivered["id"], "ack": 1}))
        .await;
    assert_eq!(ack["status"], "Success.");
    let reply = publisher.request(json!({"body": "first again"})).await;
    let delivered = first.recv().await;
    assert_eq!(
        (&delivered["id"], &delivered["body"]),
        (&reply["id"], &json!("first again"))
    );
    drop(rest);
}
