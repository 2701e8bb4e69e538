//! How the bench's clients connect: plain or TLS, with or without permessage-deflate (yawc's
//! client, which can compress; tokio-tungstenite cannot).

use futures::{SinkExt, StreamExt};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::path::{Path, PathBuf};
use tokio_rustls::TlsConnector;
use yawc::frame::{Frame, OpCode};
use yawc::{Options, TcpWebSocket};

pub type Socket = TcpWebSocket;

/// How clients reach the node.
#[derive(Clone)]
pub struct Wire {
    /// Trusts the bench's own CA; `None` for plain ws://.
    pub tls: Option<TlsConnector>,
    pub compress: bool,
}

impl Wire {
    pub fn url(&self, addr: std::net::SocketAddr) -> String {
        match self.tls {
            Some(_) => format!("wss://localhost:{}/", addr.port()),
            None => format!("ws://{addr}/"),
        }
    }

    pub fn describe(&self) -> &'static str {
        match (self.tls.is_some(), self.compress) {
            (false, false) => "ws",
            (false, true) => "ws+deflate",
            (true, false) => "wss",
            (true, true) => "wss+deflate",
        }
    }

    pub async fn connect(&self, url: &str) -> Socket {
        let options = match self.compress {
            true => Options::default().with_balanced_compression(),
            false => Options::default(),
        };
        let mut builder =
            yawc::WebSocket::connect(url.parse().expect("a URL")).with_options(options);
        if let Some(connector) = &self.tls {
            builder = builder.with_connector(connector.clone());
        }
        builder.await.expect("connect")
    }
}

/// Sends `login` and checks its reply.
pub async fn login(wire: &Wire, url: &str, login: serde_json::Value) -> Socket {
    let mut socket = wire.connect(url).await;
    socket.send(Frame::text(login.to_string())).await.unwrap();
    let reply = next_text(&mut socket).await.expect("a reply");
    assert!(reply.contains("Success."), "login: {reply}");
    socket
}

/// The next text frame's text; control frames are skipped.
pub async fn next_text<S: futures::Stream<Item = Frame> + Unpin>(stream: &mut S) -> Option<String> {
    loop {
        let frame = stream.next().await?;
        if frame.opcode() == OpCode::Text {
            return Some(frame.as_str().to_string());
        }
    }
}

/// A CA for the bench and a certificate for `localhost` signed by it, written to `dir`.
/// Returns the certificate and key paths and a connector that trusts the CA.
pub fn test_pki(dir: &Path) -> (PathBuf, PathBuf, TlsConnector) {
    std::fs::create_dir_all(dir).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "bench CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, leaf.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    (
        cert_path,
        key_path,
        TlsConnector::from(qe_tls::client_config(roots)),
    )
}
