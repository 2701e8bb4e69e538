//! A reader of stderr that stalls (journald busy or restarting, a full pipe) must cost log
//! lines, never service: the test stops reading the node's and the control plane's stderr
//! and drives thousands of requests through each, many more lines than the pipe holds (the
//! node logs each refused SQS request at debug; the control plane's store writes lines at
//! trace), with login rotations and certificate renewals on the way; every request is
//! answered, and the node's lines show that some were dropped rather than waited for.

use qe_tests::{ControlPlane, Node};
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `request` on a new connection to `addr` each time, `connections` times, eight at once;
/// every one must be answered with `expected` within a minute in all.
async fn answered_every_time(
    addr: SocketAddr,
    request: &'static str,
    expected: &'static str,
    connections: usize,
) {
    let one = move || async move {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.unwrap();
        assert_eq!(
            &head,
            expected.as_bytes(),
            "{}",
            String::from_utf8_lossy(&head)
        );
    };
    let all = async {
        for _ in 0..connections / 8 {
            let eight: Vec<_> = (0..8).map(|_| tokio::spawn(one())).collect();
            for each in eight {
                each.await.unwrap();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every request answered while stderr is not read");
}

/// Requests to the node, each logged (at debug) as refused.
const REQUESTS: usize = 20_000;

#[tokio::test]
async fn a_node_whose_stderr_is_not_read_keeps_serving() {
    std::env::set_var("QE_TEST_RUST_LOG", "debug");
    let node = Node::start_with(&["--sqs-listen", "127.0.0.1:0"]);
    let sqs: SocketAddr = node.sqs_addr();
    node.stderr().stall();
    // An unsigned request at the SQS port: answered 403, and logged at debug.
    let request = "POST / HTTP/1.1\r\nHost: q\r\nContent-Length: 0\r\n\r\n";
    // Far more lines (one each) than the log's queue (16,384) and the pipe hold together.
    answered_every_time(sqs, request, "HTTP/1.1 403", REQUESTS).await;
    // Its queue works too: a publish and a delivery.
    let mut publisher = node.publisher().await;
    let reply = publisher.request(json!({"body": "through"})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    // Lines were dropped, not waited for: fewer of the refusals' lines (one each, at debug)
    // than requests, once the log's queue and the pipe were full.
    node.stderr().resume();
    let mut publisher = node.publisher().await;
    let reply = publisher.request(json!({"body": "after"})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let logged = node.log().matches("an SQS request was refused").count();
    assert!(
        0 < logged && logged < REQUESTS,
        "{logged} of {REQUESTS} lines"
    );
}

#[tokio::test]
async fn a_control_plane_whose_stderr_is_not_read_keeps_serving() {
    std::env::set_var("QE_TEST_RUST_LOG", "trace");
    let cp = ControlPlane::start();
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap().to_string();
    cp.stderr().stall();
    let changes = async {
        for _ in 0..5 {
            let path = format!("/v1/queues/{id}/logins/publisher/rotate");
            let (status, rotated) = cp.call("POST", &path, None).await;
            assert_eq!(status, 200, "{rotated}");
            let (status, renewing) = cp.call("POST", "/v1/certificate/renew", None).await;
            assert!(status == 202 || status == 200, "{status} {renewing}");
        }
    };
    let request = "GET /healthz HTTP/1.1\r\nHost: q\r\nConnection: close\r\n\r\n";
    // The store's lines at trace (hundreds of KiB) fill the pipe meanwhile.
    let load = answered_every_time(cp.addr, request, "HTTP/1.1 200", 4_000);
    let both = async { tokio::join!(load, changes) };
    tokio::time::timeout(Duration::from_secs(90), both)
        .await
        .expect("served while stderr is not read");
    // Lines the pipe could not take are counted, and the metrics show the count.
    let (_, metrics) = qe_tests::http_text(cp.addr, "GET", "/metrics", Some(&cp.token), None).await;
    let dropped: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("qe_log_lines_dropped_total "))
        .expect("the counter is shown")
        .parse()
        .unwrap();
    let _ = dropped;
    cp.stderr().resume();
}
