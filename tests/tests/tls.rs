//! TLS: wss:// for real clients, old protocols and plain HTTP refused, a renewed certificate
//! served without a restart while open connections go on.

use qe_tests::{
    cases, login_request, node_program, run_node, run_python, test_ca, workspace, Node, PROMPT,
};
use rcgen::{CertificateParams, CertifiedIssuer, KeyPair};
use serde_json::{json, Value};
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::{connect_async_tls_with_config, Connector, MaybeTlsStream};

/// A test CA and leaves for `localhost` signed by it.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        Pki {
            ca: test_ca("Queue Expert test CA"),
        }
    }

    /// Writes a new leaf and its key to `dir/cert.pem` and `dir/key.pem`; returns its DER.
    fn leaf(&self, dir: &Path) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        // Write to the side, then rename, as a renewal should: never a half-written file.
        std::fs::write(dir.join("key.pem.new"), key.serialize_pem()).unwrap();
        std::fs::write(dir.join("cert.pem.new"), cert.pem()).unwrap();
        std::fs::rename(dir.join("key.pem.new"), dir.join("key.pem")).unwrap();
        std::fs::rename(dir.join("cert.pem.new"), dir.join("cert.pem")).unwrap();
        cert.der().to_vec()
    }

    fn write_ca(&self, dir: &Path) -> std::path::PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.ca.pem()).unwrap();
        path
    }

    fn client(&self) -> Connector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        Connector::Rustls(qe_tls::client_config(roots))
    }
}

fn start(pki: &Pki, dir: &Path) -> (Node, Vec<u8>) {
    let leaf = pki.leaf(dir);
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    let node = Node::start_with(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    (node, leaf)
}

type Socket = tokio_tungstenite::WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// Connects over wss:// and logs in; returns the socket and the certificate the node showed.
async fn login_tls(node: &Node, pki: &Pki, login: Value) -> (Socket, Vec<u8>) {
    use futures::{SinkExt, StreamExt};
    let (mut socket, _) =
        connect_async_tls_with_config(node.tls_url(), None, false, Some(pki.client()))
            .await
            .unwrap();
    let shown = match socket.get_ref() {
        MaybeTlsStream::Rustls(tls) => tls.get_ref().1.peer_certificates().unwrap()[0].to_vec(),
        _ => panic!("not TLS"),
    };
    socket.send(login.to_string().into()).await.unwrap();
    let reply = socket.next().await.unwrap().unwrap();
    assert!(reply.to_text().unwrap().contains("Success."), "{reply}");
    (socket, shown)
}

async fn request(socket: &mut Socket, request: Value) -> Value {
    use futures::{SinkExt, StreamExt};
    socket.send(request.to_string().into()).await.unwrap();
    loop {
        let frame = tokio::time::timeout(PROMPT, socket.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if frame.is_text() {
            return serde_json::from_str(frame.to_text().unwrap()).unwrap();
        }
    }
}

#[tokio::test]
async fn wss_works_and_a_renewed_certificate_is_served_without_a_restart() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (node, first) = start(&pki, dir.path());

    let (mut publisher, shown) = login_tls(
        &node,
        &pki,
        login_request("publisher", "distribute", json!({})),
    )
    .await;
    assert_eq!(shown, first);
    let (mut subscriber, _) = login_tls(
        &node,
        &pki,
        login_request("subscriber", "distribute", json!({"capacity": 1})),
    )
    .await;
    let reply = request(&mut publisher, json!({"body": "over TLS"})).await;
    assert_eq!(reply["status"], "Success.");

    let second = pki.leaf(dir.path());
    node.hang_up();
    node.wait_for_log("TLS certificate loaded");
    let (_late, shown) = login_tls(
        &node,
        &pki,
        login_request("publisher", "distribute", json!({})),
    )
    .await;
    assert_eq!(shown, second, "new connections get the new certificate");
    // The connections opened before go on.
    let reply = request(&mut publisher, json!({"body": "still over the old one"})).await;
    assert_eq!(reply["status"], "Success.");
    let delivered = request(&mut subscriber, json!({"capacity": 2})).await;
    assert!(
        delivered["body"] == "over TLS" || delivered["status"] == "Success.",
        "{delivered}"
    );
}

#[tokio::test]
async fn python_speaks_tls_1_2_and_1_3_and_tls_1_1_is_refused() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = start(&pki, dir.path());
    let ca = pki.write_ca(dir.path());
    let script = workspace().join("tests/interop/tls_check.py");
    let args = [node.tls_url(), ca.to_string_lossy().into_owned()];
    let output = run_python(&script, &args).await;
    let case = cases(&output);
    assert_eq!(case("tls")["reply"]["status"], "Success.");
    assert_eq!(case("tls")["extension"], "permessage-deflate");
    assert_eq!(case("tls12")["reply"]["status"], "Success.");
    let old = case("tls11")["outcome"].as_str().unwrap().to_string();
    assert!(old.starts_with("refused"), "{old}");
}

#[tokio::test]
async fn plain_http_on_the_tls_port_is_refused_and_https_that_is_not_an_upgrade_gets_400() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = start(&pki, dir.path());

    assert!(!qe_tests::answers_plain_http(node.addr).await, "refused");

    let Connector::Rustls(config) = pki.client() else {
        unreachable!()
    };
    let connector = tokio_rustls::TlsConnector::from(config);
    let tcp = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 64];
    let n = tokio::time::timeout(PROMPT, tls.read(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
}

#[tokio::test]
async fn the_manuals_node_publisher_works_over_wss() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = start(&pki, dir.path());
    let ca = pki.write_ca(dir.path());
    let program = node_program(&node, "publisher.mjs", &node.tls_url(), &[]);
    let output = run_node(&program, &[], &[("NODE_EXTRA_CA_CERTS", &ca)]).await;
    assert!(
        output.starts_with("Published. The message id is "),
        "{output}"
    );
}

#[tokio::test]
async fn a_certificate_replaced_on_disk_is_picked_up_without_a_signal() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (node, first) = start(&pki, dir.path());
    let (_open, shown) = login_tls(
        &node,
        &pki,
        login_request("publisher", "distribute", json!({})),
    )
    .await;
    assert_eq!(shown, first);
    let second = pki.leaf(dir.path());
    // The files are checked every 5 s.
    node.wait_for_log("TLS certificate loaded");
    let (_late, shown) = login_tls(
        &node,
        &pki,
        login_request("publisher", "distribute", json!({})),
    )
    .await;
    assert_eq!(shown, second);
}
