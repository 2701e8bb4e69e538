//! Before the login: a budget of connections of its own, a share of it per source address,
//! and a small frame budget unless a bigger login takes its bytes from a shared pool.

use qe_tests::{login_request, raw, Client, Node};
use serde_json::json;
use std::net::Ipv4Addr;
use tokio::io::AsyncWriteExt;

fn from(source: Ipv4Addr) -> raw::Options {
    raw::Options {
        source: Some(source),
        ..raw::Options::default()
    }
}

#[tokio::test]
async fn idle_sockets_from_one_address_cannot_keep_another_from_logging_in() {
    // Dev/test: 128 connections may wait for their login, 64 of them from one source.
    let node = Node::start_with(&["--tier", "devtest"]);
    let flooding = Ipv4Addr::new(127, 0, 0, 1);
    let mut idle = Vec::new();
    for _ in 0..64 {
        idle.push(raw::upgraded(&node, from(flooding)).await);
    }
    let mut one_more = raw::connect(&node, from(flooding)).await;
    assert!(
        raw::closed_with_nothing_sent(&mut one_more).await,
        "its source's share is taken"
    );
    let other = raw::Options {
        source: Some(Ipv4Addr::new(127, 0, 0, 2)),
        ..raw::Options::default()
    };
    let (_publisher, reply) = raw::logged_in(&node, other, "publisher", json!({})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    // One of them logs in: it no longer waits for its login, and its source may open another.
    let mut logging_in = idle.pop().unwrap();
    let login = login_request("publisher", "distribute", json!({})).to_string();
    logging_in
        .write_all(&raw::client_frame(true, false, 0x1, login.as_bytes()))
        .await
        .unwrap();
    let (_, reply) = raw::read_frame(&mut logging_in).await;
    assert!(String::from_utf8_lossy(&reply).contains("Success."));
    let (_, reply) = raw::logged_in(&node, from(flooding), "publisher", json!({})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
}

#[tokio::test]
async fn a_login_frame_bigger_than_any_max_ws_msg_len_is_refused_before_its_payload() {
    let node = Node::start();
    let mut tcp = raw::upgraded(&node, raw::Options::default()).await;
    // The header of a 2 MiB text frame (masked), and no payload.
    let mut header = vec![0x81, 0x80 | 127];
    header.extend_from_slice(&(2u64 << 20).to_be_bytes());
    header.extend_from_slice(&[1, 2, 3, 4]);
    tcp.write_all(&header).await.unwrap();
    assert_eq!(raw::close_code(&mut tcp).await, 1009);
}

/// The header of a masked text frame of `len` bytes, and its first `sent` bytes.
fn start_of_frame(len: usize, sent: usize) -> Vec<u8> {
    let whole = raw::client_frame(true, false, 0x1, &vec![b' '; len]);
    let header = whole.len() - len;
    whole[..header + sent].to_vec()
}

#[tokio::test]
async fn big_logins_share_a_pool_and_small_logins_never_wait_for_it() {
    let node = Node::start();
    // Sixteen connections each begin a 1 MiB login frame and stop: together they hold the
    // whole pool (16 MiB).
    let mut hoarders = Vec::new();
    for n in 0..16 {
        let mut tcp = raw::upgraded(&node, from(Ipv4Addr::new(127, 0, 1, n))).await;
        tcp.write_all(&start_of_frame(1 << 20, 100)).await.unwrap();
        hoarders.push(tcp);
    }
    // A publish in the login, of 60 kB, waits for bytes of the pool ...
    let mut big = Client::connect(&node).await;
    let body = "p".repeat(60_000);
    let login = login_request("publisher", "distribute", json!({ "body": body }));
    big.send_json(&login).await;
    // ... while a login of the usual size is answered at once.
    let (_small, reply) = raw::logged_in(
        &node,
        from(Ipv4Addr::new(127, 0, 2, 1)),
        "publisher",
        json!({}),
    )
    .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    assert!(
        big.recv_within(std::time::Duration::from_millis(500))
            .await
            .is_none(),
        "the big login is not read while the pool is taken"
    );
    // Compressed, a big login is small on the wire; inflated, it is held to the budget too:
    // with the pool taken it is refused at once, rather than held in memory while it waits.
    let compressed = raw::Options {
        deflate: true,
        source: Some(Ipv4Addr::new(127, 0, 2, 2)),
        ..raw::Options::default()
    };
    let mut inflates_big = raw::upgraded(&node, compressed).await;
    let frame = raw::client_frame(
        true,
        true,
        0x1,
        &raw::deflated(login.to_string().as_bytes()),
    );
    assert!(frame.len() < 4096, "small on the wire: {}", frame.len());
    inflates_big.write_all(&frame).await.unwrap();
    assert_eq!(raw::close_code(&mut inflates_big).await, 1009);
    // One hoarder goes: its megabyte goes back, and the big login goes through.
    drop(hoarders.pop());
    let reply = big.recv().await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    assert!(reply["id"].is_string(), "the publish's reply: {reply}");
    // And so does a compressed one, now that the pool has room.
    let mut compressed_login = raw::upgraded(&node, compressed).await;
    compressed_login.write_all(&frame).await.unwrap();
    let (_, reply) = raw::read_frame(&mut compressed_login).await;
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply["status"], "Success.", "{reply}");
}
