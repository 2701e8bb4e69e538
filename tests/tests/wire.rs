//! The wire: message size limits on open connections, and compressed frames.

use qe_tests::{login_request, Ending, Node, PROMPT};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// A masked client frame of any length.
fn client_frame(fin: bool, rsv1: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x12, 0x34, 0x56, 0x78];
    let mut out = vec![((fin as u8) << 7) | ((rsv1 as u8) << 6) | opcode];
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// A raw WebSocket client, upgraded (offering permessage-deflate when `deflate`) and logged in
/// as a publisher.
async fn raw_publisher(node: &Node, deflate: bool) -> TcpStream {
    let mut tcp = TcpStream::connect(node.addr).await.unwrap();
    let extension = if deflate {
        "Sec-WebSocket-Extensions: permessage-deflate\r\n"
    } else {
        ""
    };
    let handshake = format!(
        "GET / HTTP/1.1\r\nHost: q\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extension}\r\n"
    );
    tcp.write_all(handshake.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    while !response.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tcp.read_exact(&mut byte).await.unwrap();
        response.push(byte[0]);
    }
    let response = String::from_utf8(response).unwrap().to_lowercase();
    assert!(response.starts_with("http/1.1 101"), "{response}");
    assert_eq!(
        response.contains("permessage-deflate"),
        deflate,
        "{response}"
    );
    let login = login_request("publisher", "distribute", json!({})).to_string();
    tcp.write_all(&client_frame(true, false, 0x1, login.as_bytes()))
        .await
        .unwrap();
    read_small_frame(&mut tcp).await;
    tcp
}

/// Reads one short frame from the node: (first byte, payload).
async fn read_small_frame(tcp: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut header = [0u8; 2];
    tokio::time::timeout(PROMPT, tcp.read_exact(&mut header))
        .await
        .unwrap()
        .unwrap();
    assert!(header[1] & 0x7F < 126, "a short frame");
    let mut payload = vec![0u8; (header[1] & 0x7F) as usize];
    tcp.read_exact(&mut payload).await.unwrap();
    (header[0], payload)
}

#[tokio::test]
async fn a_compressed_message_that_cannot_be_unpacked_closes_with_1011() {
    let node = Node::start();
    let mut tcp = raw_publisher(&node, true).await;
    // A "compressed" frame of bytes that are not deflate.
    tcp.write_all(&client_frame(true, true, 0x1, &[0xFF; 16]))
        .await
        .unwrap();
    let (first, payload) = read_small_frame(&mut tcp).await;
    assert_eq!(first & 0x0F, 0x8, "a close frame");
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), 1011);
}

#[tokio::test]
async fn a_fragmented_message_must_arrive_whole_in_time_or_the_connection_closes_with_1008() {
    let node = Node::start_with(&["--message-timeout-secs", "1"]);
    let mut tcp = raw_publisher(&node, false).await;
    // In time: two fragments, then a reply.
    tcp.write_all(&client_frame(false, false, 0x1, br#"{"body":"#))
        .await
        .unwrap();
    tcp.write_all(&client_frame(true, false, 0x0, br#""two parts"}"#))
        .await
        .unwrap();
    let (_, reply) = read_small_frame(&mut tcp).await;
    assert!(String::from_utf8_lossy(&reply).contains("Success."));
    // Not in time: the first fragment, and nothing more.
    tcp.write_all(&client_frame(false, false, 0x1, br#"{"body":"#))
        .await
        .unwrap();
    let (first, payload) = read_small_frame(&mut tcp).await;
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

/// Reads the node's close frame and returns its code.
async fn close_code(tcp: &mut TcpStream) -> u16 {
    let (first, payload) = read_small_frame(tcp).await;
    assert_eq!(first & 0x0F, 0x8, "a close frame");
    u16::from_be_bytes([payload[0], payload[1]])
}

#[tokio::test]
async fn invalid_utf8_closes_with_1007_and_a_protocol_violation_with_1002() {
    let node = Node::start();
    let mut tcp = raw_publisher(&node, false).await;
    tcp.write_all(&client_frame(true, false, 0x1, &[0xC3, 0x28]))
        .await
        .unwrap();
    assert_eq!(close_code(&mut tcp).await, 1007);

    let mut tcp = raw_publisher(&node, false).await;
    // A reserved opcode.
    tcp.write_all(&client_frame(true, false, 0x3, b"x"))
        .await
        .unwrap();
    assert_eq!(close_code(&mut tcp).await, 1002);
}
