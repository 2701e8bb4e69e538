//! The HTTP side: only a WebSocket upgrade on `/` is served, by RFC 6455; a connection beyond
//! max-tasks is closed with nothing sent.

use qe_tests::{Client, Node, PROMPT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const KEY: &str = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/// Sends a raw HTTP request and returns the status line of the response.
async fn status_line(node: &Node, request: &str) -> String {
    let head = response_head(node, request).await;
    head.lines().next().unwrap().to_string()
}

fn upgrade(method: &str, path: &str, headers: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nHost: q\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n{headers}\r\n")
}

#[tokio::test]
async fn anything_but_a_websocket_upgrade_on_the_root_gets_400() {
    let node = Node::start();
    let version = "Sec-WebSocket-Version: 13\r\n";
    let cases = [
        "GET / HTTP/1.1\r\nHost: q\r\n\r\n".to_string(),
        "GET /index.html HTTP/1.1\r\nHost: q\r\n\r\n".to_string(),
        "POST / HTTP/1.1\r\nHost: q\r\nContent-Length: 2\r\n\r\n{}".to_string(),
        upgrade("GET", "/other", &format!("{KEY}{version}")),
        upgrade("POST", "/", &format!("{KEY}{version}")),
        upgrade("GET", "/", version),
        upgrade("GET", "/", KEY),
        // RFC 6455 §4.1: the key is the base64 of 16 random bytes.
        upgrade(
            "GET",
            "/",
            &format!("Sec-WebSocket-Key: not base64!\r\n{version}"),
        ),
        upgrade(
            "GET",
            "/",
            &format!("Sec-WebSocket-Key: c2hvcnQ=\r\n{version}"),
        ),
        upgrade("GET", "/", &format!("{KEY}{KEY}{version}")),
        format!("GET / HTTP/1.1\r\nHost: q\r\nConnection: Upgrade\r\n{KEY}{version}\r\n"),
    ];
    for request in cases {
        assert_eq!(
            status_line(&node, &request).await,
            "HTTP/1.1 400 Bad Request",
            "{request}"
        );
    }
    let good = upgrade("GET", "/?any=query", &format!("{KEY}{version}"));
    assert_eq!(
        status_line(&node, &good).await,
        "HTTP/1.1 101 Switching Protocols"
    );
}

/// The whole response head to a raw HTTP request.
async fn response_head(node: &Node, request: &str) -> String {
    let mut tcp = TcpStream::connect(node.addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let mut buffer = [0u8; 1024];
    while !response.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(PROMPT, tcp.read(&mut buffer))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed without a whole response head");
        response.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8_lossy(&response).to_string()
}

#[tokio::test]
async fn a_websocket_version_other_than_13_gets_426_naming_13() {
    let node = Node::start();
    for version in ["12", "8", "13, 8"] {
        let request = upgrade(
            "GET",
            "/",
            &format!("{KEY}Sec-WebSocket-Version: {version}\r\n"),
        );
        // Header names are case-insensitive; the status line's reason phrase too, for us.
        let head = response_head(&node, &request).await.to_ascii_lowercase();
        assert!(
            head.starts_with("http/1.1 426 upgrade required\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nsec-websocket-version: 13\r\n"), "{head}");
    }
}

#[tokio::test]
async fn a_connection_beyond_max_tasks_is_closed_with_nothing_sent() {
    // Dev/test: max-tasks is 100 logged-in connections.
    let node = Node::start_with(&["--tier", "devtest"]);
    let mut open = Vec::new();
    for _ in 0..100 {
        open.push(node.publisher().await);
    }
    let mut extra = TcpStream::connect(node.addr).await.unwrap();
    let mut buffer = [0u8; 64];
    let read = tokio::time::timeout(PROMPT, extra.read(&mut buffer))
        .await
        .unwrap();
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed with nothing sent: {read:?}"
    );

    // A slot frees when a connection ends.
    drop(open.pop());
    // The node frees the slot when it sees the close; until then each try is refused at once.
    let mut tries = 0;
    let mut client = loop {
        match Client::try_connect(&node).await {
            Ok(client) => break client,
            Err(_) if tries < 10_000 => tries += 1,
            Err(error) => panic!("no slot was freed: {error}"),
        }
    };
    let reply = client
        .request(qe_tests::login_request(
            "publisher",
            "distribute",
            serde_json::json!({}),
        ))
        .await;
    assert_eq!(reply["status"], "Success.");
}

#[tokio::test]
async fn on_the_ipv6_wildcard_the_node_takes_ipv4_and_ipv6() {
    let node = Node::start_with(&["--listen", "[::]:0"]);
    let port = node.addr.port();
    for host in ["127.0.0.1", "[::1]"] {
        let url = format!("ws://{host}:{port}/");
        let (socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        drop(socket);
    }
}
