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

/// A WebSocket client frame: FIN, the given RSV1 and opcode, masked.
fn frame(rsv1: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x12, 0x34, 0x56, 0x78];
    let mut out = vec![0x80 | ((rsv1 as u8) << 6) | opcode];
    assert!(payload.len() < 126);
    out.push(0x80 | payload.len() as u8);
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

#[tokio::test]
async fn a_compressed_message_that_cannot_be_unpacked_closes_with_1011() {
    let node = Node::start();
    let mut tcp = TcpStream::connect(node.addr).await.unwrap();
    let handshake = "GET / HTTP/1.1\r\nHost: q\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
        Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n";
    tcp.write_all(handshake.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    while !response.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tcp.read_exact(&mut byte).await.unwrap();
        response.push(byte[0]);
    }
    let response = String::from_utf8(response).unwrap().to_lowercase();
    assert!(response.starts_with("http/1.1 101"), "{response}");
    assert!(
        response.contains("permessage-deflate"),
        "deflate is negotiated: {response}"
    );

    // An uncompressed login, then a "compressed" frame of bytes that are not deflate.
    let login = login_request("publisher", "distribute", json!({})).to_string();
    let mut out = Vec::new();
    let mut masked_login = vec![0x81, 0xFE];
    masked_login.extend_from_slice(&(login.len() as u16).to_be_bytes());
    let mask = [1u8, 2, 3, 4];
    masked_login.extend_from_slice(&mask);
    masked_login.extend(login.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out.extend(masked_login);
    tcp.write_all(&out).await.unwrap();
    // Read the login's reply (one unmasked text frame, maybe compressed) before going on.
    let mut header = [0u8; 2];
    tcp.read_exact(&mut header).await.unwrap();
    let mut reply = vec![0u8; (header[1] & 0x7F) as usize];
    tcp.read_exact(&mut reply).await.unwrap();

    tcp.write_all(&frame(true, 0x1, &[0xFF; 16])).await.unwrap();
    let mut close = [0u8; 4];
    tokio::time::timeout(PROMPT, tcp.read_exact(&mut close))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(close[0] & 0x0F, 0x8, "a close frame");
    assert_eq!(u16::from_be_bytes([close[2], close[3]]), 1011);
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
