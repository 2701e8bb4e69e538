//! The limits every HTTP port keeps (`qe_serve`), from outside over raw sockets: a node's SQS
//! port and the control plane's API. A client that sends nothing, drips its headers or opens
//! many connections from one source holds nothing for long and locks nobody else out; a
//! reply given before a request's body was read closes the connection, so a keep-alive
//! client's next request never meets a reset.

use qe_tests::{ControlPlane, Node, PROMPT};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A node whose SQS port keeps the limits of `sqs_http` (TOML lines of `[sqs_http]`).
fn node_with_sqs_limits(sqs_http: &str) -> (Node, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("node.toml");
    std::fs::write(&config, format!("[sqs_http]\n{sqs_http}\n")).unwrap();
    let node = Node::start_with(&[
        "--config",
        config.to_str().unwrap(),
        "--sqs-listen",
        "127.0.0.1:0",
        "--sqs-key",
        "admin:AKIALIMITS:limits-secret",
    ]);
    let addr = node.sqs_addr();
    (node, addr, dir)
}

/// A connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap()
}

/// Reads until the peer closes; what it sent. Panics if it keeps the connection past `within`.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, stream.read_to_end(&mut got)).await;
    // A reset counts as closed too.
    assert!(
        read.is_ok(),
        "still open after {within:?}: {}",
        String::from_utf8_lossy(&got)
    );
    String::from_utf8_lossy(&got).into_owned()
}

/// A request that gets an answer: an unsigned POST with no body (refused, but answered).
async fn answered(stream: &mut TcpStream) -> String {
    let request = "POST / HTTP/1.1\r\nHost: q\r\nContent-Length: 0\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buffer = vec![0u8; 4096];
    let n = tokio::time::timeout(PROMPT, stream.read(&mut buffer))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&buffer[..n]).into_owned()
}

#[tokio::test]
async fn the_sqs_port_closes_idle_and_dripping_connections_and_caps_each_source() {
    let (_node, sqs, _dir) = node_with_sqs_limits("per_source = 4\nhead_within_secs = 1");

    // Four idle connections from one source are all it may hold: a fifth is closed at once,
    // while another source is served.
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(connect_from("127.0.0.1", sqs).await);
    }
    let mut fifth = connect_from("127.0.0.1", sqs).await;
    let sent = read_until_closed(&mut fifth, PROMPT).await;
    assert_eq!(sent, "", "closed with nothing sent");
    let mut other = connect_from("127.0.0.2", sqs).await;
    let reply = answered(&mut other).await;
    assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");

    // Idle, they are closed once the head time passes, and the source may connect again.
    for mut connection in idle {
        read_until_closed(&mut connection, Duration::from_secs(10)).await;
    }
    let mut again = connect_from("127.0.0.1", sqs).await;
    assert!(answered(&mut again).await.starts_with("HTTP/1.1 403"));

    // A head dripped a byte at a time never completes: closed within the head time.
    let mut dripping = connect_from("127.0.0.1", sqs).await;
    dripping
        .write_all(b"POST / HTTP/1.1\r\nHost: q\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let drip = async {
        loop {
            if dripping.write_all(b"X").await.is_err() {
                return;
            }
            let mut byte = [0u8; 1];
            match tokio::time::timeout(Duration::from_millis(300), dripping.read(&mut byte)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), drip)
        .await
        .expect("a dripping head is cut off");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// The unsigned request's reply comes before its body was read: it says
/// `Connection: close`, and the connection then closes cleanly.
#[tokio::test]
async fn an_sqs_reply_before_the_body_was_read_closes_the_connection() {
    let (_node, sqs, _dir) = node_with_sqs_limits("");
    let body = "x".repeat(64 * 1024);
    let mut stream = connect_from("127.0.0.1", sqs).await;
    let request = format!(
        "POST / HTTP/1.1\r\nHost: q\r\nContent-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: AmazonSQS.SendMessage\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let reply = read_until_closed(&mut stream, PROMPT)
        .await
        .to_ascii_lowercase();
    assert!(reply.starts_with("http/1.1 403"), "{reply}");
    assert!(reply.contains("connection: close"), "{reply}");
}

/// The API refuses a POST without a token before reading its body: the same.
#[tokio::test]
async fn an_api_reply_before_the_body_was_read_closes_the_connection() {
    let cp = ControlPlane::start();
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(64 * 1024));
    for token in ["", "Authorization: Bearer wrong\r\n"] {
        let mut stream = TcpStream::connect(cp.addr).await.unwrap();
        let request = format!(
            "POST /v1/queues HTTP/1.1\r\nHost: q\r\n{token}Content-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let reply = read_until_closed(&mut stream, PROMPT)
            .await
            .to_ascii_lowercase();
        assert!(reply.starts_with("http/1.1 401"), "{reply}");
        assert!(reply.contains("connection: close"), "{token:?}: {reply}");
    }
    // A request whose body was read keeps its connection.
    let mut stream = TcpStream::connect(cp.addr).await.unwrap();
    let request = "GET /healthz HTTP/1.1\r\nHost: q\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buffer = vec![0u8; 4096];
    let n = stream.read(&mut buffer).await.unwrap();
    let reply = String::from_utf8_lossy(&buffer[..n]).to_ascii_lowercase();
    assert!(
        reply.starts_with("http/1.1 200") && !reply.contains("connection: close"),
        "{reply}"
    );
}

/// The API port's `[http]` limits are settings: with `head_within_secs = 1` an idle
/// connection, and one whose head drips, is closed within about a second (20 s by default),
/// while a request sent in time is answered.
#[tokio::test]
async fn the_api_ports_head_time_is_a_setting() {
    let cp = ControlPlane::start_with("[http]\nhead_within_secs = 1\nconnections = 64\n");
    let mut idle = TcpStream::connect(cp.addr).await.unwrap();
    let mut dripping = TcpStream::connect(cp.addr).await.unwrap();
    dripping
        .write_all(b"GET /healthz HTTP/1.1\r\nHost")
        .await
        .unwrap();
    let mut fresh = TcpStream::connect(cp.addr).await.unwrap();
    let request = "GET /healthz HTTP/1.1\r\nHost: q\r\nConnection: close\r\n\r\n";
    fresh.write_all(request.as_bytes()).await.unwrap();
    let reply = read_until_closed(&mut fresh, PROMPT).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // Far sooner than the default's 20 s.
    for stream in [&mut idle, &mut dripping] {
        read_until_closed(stream, Duration::from_secs(5)).await;
    }
}
