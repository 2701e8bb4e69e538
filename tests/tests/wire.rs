//! The wire: message size limits on open connections, and compressed frames.

use qe_tests::{raw, Ending, Node};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn a_new_max_ws_msg_len_applies_to_open_connections() {
    let node = Node::start();
    let mut publisher = node.publisher().await;
    let (mut admin, _) = node.login("admin", "distribute", json!({})).await;
    let reply = admin
        .request(json!({"cmd": "setcfg", "max-ws-msg-len": 2048}))
        .await;
    assert_eq!(reply["status"], "Success.");
    let fits = format!(r#"{{"body":"{}"}}"#, "a".repeat(2048 - 11));
    assert_eq!(fits.len(), 2048);
    publisher.send_text(&fits).await;
    assert_eq!(publisher.recv().await["status"], "Success.");
    publisher
        .send_text(&format!(r#"{{"body":"{}"}}"#, "a".repeat(2048)))
        .await;
    assert_eq!(publisher.ending().await, Ending::Closed(1009));
}

/// A raw client, upgraded (offering permessage-deflate when `deflate`) and logged in as a
/// publisher.
async fn raw_publisher(node: &Node, deflate: bool) -> TcpStream {
    let options = raw::Options {
        deflate,
        ..raw::Options::default()
    };
    let (tcp, reply) = raw::logged_in(node, options, "publisher", json!({})).await;
    assert_eq!(reply["status"], "Success.");
    tcp
}

#[tokio::test]
async fn a_compressed_message_that_cannot_be_unpacked_closes_with_1011() {
    let node = Node::start();
    let mut tcp = raw_publisher(&node, true).await;
    // A "compressed" frame of bytes that are not deflate.
    tcp.write_all(&raw::client_frame(true, true, 0x1, &[0xFF; 16]))
        .await
        .unwrap();
    let (first, payload) = raw::read_frame(&mut tcp).await;
    assert_eq!(first & 0x0F, 0x8, "a close frame");
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), 1011);
}

#[tokio::test]
async fn a_character_split_across_fragments_is_read_whole() {
    let node = Node::start();
    let (mut subscriber, _) = node
        .login("subscriber", "distribute", json!({"capacity": 1}))
        .await;
    let mut tcp = raw_publisher(&node, false).await;
    let text = r#"{"body":"é€😀"}"#.as_bytes();
    // Inside the 2-, 3- and 4-byte characters: no fragment is UTF-8 on its own.
    let (first, rest) = text.split_at(10);
    let (middle, last) = rest.split_at(3);
    for (fin, opcode, part) in [(false, 0x1, first), (false, 0x0, middle), (true, 0x0, last)] {
        assert!(std::str::from_utf8(part).is_err());
        tcp.write_all(&raw::client_frame(fin, false, opcode, part))
            .await
            .unwrap();
    }
    let (_, reply) = raw::read_frame(&mut tcp).await;
    assert!(String::from_utf8_lossy(&reply).contains("Success."));
    assert_eq!(subscriber.recv().await["body"], "é€😀");
}

#[tokio::test]
async fn a_fragmented_message_must_arrive_whole_in_time_or_the_connection_closes_with_1008() {
    let node = Node::start_with(&["--message-timeout-secs", "1"]);
    let mut tcp = raw_publisher(&node, false).await;
    // In time: two fragments, then a reply.
    tcp.write_all(&raw::client_frame(false, false, 0x1, br#"{"body":"#))
        .await
        .unwrap();
    tcp.write_all(&raw::client_frame(true, false, 0x0, br#""two parts"}"#))
        .await
        .unwrap();
    let (_, reply) = raw::read_frame(&mut tcp).await;
    assert!(String::from_utf8_lossy(&reply).contains("Success."));
    // Not in time: the first fragment, and nothing more.
    tcp.write_all(&raw::client_frame(false, false, 0x1, br#"{"body":"#))
        .await
        .unwrap();
    let (first, payload) = raw::read_frame(&mut tcp).await;
    assert_eq!(first & 0x0F, 0x8, "a close frame");
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), 1008);
}

#[tokio::test]
async fn a_client_that_reads_too_slowly_is_dropped_and_nobody_else_is_slowed() {
    // Dev/test: max-write-queue-bytes is 1 MiB.
    let node = Node::start_with(&["--tier", "devtest"]);
    let (_slow, _) = node.login("subscriber", "copy", json!({})).await;
    let (mut fast, _) = node.login("subscriber", "copy", json!({})).await;
    let (mut publisher, _) = node.login("publisher", "copy", json!({})).await;
    let body = "b".repeat(60_000);
    // The slow one never reads: its socket buffers fill, then 1 MiB waits for it.
    for n in 0..300 {
        let reply = publisher
            .request(json!({"body": format!("{n} {body}")}))
            .await;
        assert_eq!(reply["status"], "Success.", "publishing is not slowed");
        let copy = fast.recv().await;
        assert!(copy["body"].as_str().unwrap().starts_with(&format!("{n} ")));
    }
    node.wait_for_log("dropping a client that reads too slowly");
    let reply = publisher.request(json!({"body": "after"})).await;
    assert_eq!(reply["subscribers"], 1, "only the fast one is left");
}

#[tokio::test]
async fn invalid_utf8_closes_with_1007_and_a_protocol_violation_with_1002() {
    let node = Node::start();
    let mut tcp = raw_publisher(&node, false).await;
    tcp.write_all(&raw::client_frame(true, false, 0x1, &[0xC3, 0x28]))
        .await
        .unwrap();
    assert_eq!(raw::close_code(&mut tcp).await, 1007);

    // The same on a login, from a subscriber, and compressed: each text message is checked
    // once, whole, by the node itself (yawc's own check is off).
    let mut tcp = raw::upgraded(&node, raw::Options::default()).await;
    tcp.write_all(&raw::client_frame(true, false, 0x1, b"{\"role\":\"\xFF\"}"))
        .await
        .unwrap();
    assert_eq!(raw::close_code(&mut tcp).await, 1007, "a login");
    let options = raw::Options::default();
    let (mut tcp, reply) =
        raw::logged_in(&node, options, "subscriber", json!({"capacity": 1})).await;
    assert_eq!(reply["status"], "Success.");
    tcp.write_all(&raw::client_frame(true, false, 0x1, &[0x80]))
        .await
        .unwrap();
    assert_eq!(raw::close_code(&mut tcp).await, 1007, "a subscriber");
    let mut tcp = raw_publisher(&node, true).await;
    let deflated = raw::deflated(b"{\"body\":\"\xED\xA0\x80\"}");
    tcp.write_all(&raw::client_frame(true, true, 0x1, &deflated))
        .await
        .unwrap();
    assert_eq!(
        raw::close_code(&mut tcp).await,
        1007,
        "compressed (a UTF-16 surrogate)"
    );

    let mut tcp = raw_publisher(&node, false).await;
    // A reserved opcode.
    tcp.write_all(&raw::client_frame(true, false, 0x3, b"x"))
        .await
        .unwrap();
    assert_eq!(raw::close_code(&mut tcp).await, 1002);
}
