//! How the bench's clients connect: plain or TLS, with or without permessage-deflate (yawc's
//! client, which can compress; tokio-tungstenite cannot).

use futures::{SinkExt, StreamExt};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use yawc::frame::{Frame, OpCode};
use yawc::{MaybeTlsStream, Options};

/// A client's byte stream: TCP (or TLS over it) behind a read buffer.
///
/// yawc reads through tokio-util's `Framed`, which asks its buffer for one byte more than it
/// holds (`reserve(1)`), and once the frames cut from that buffer are dropped, `bytes` grants
/// exactly that: a burst of small frames was then read a few bytes at a time, about five
/// `recvfrom` per message at W6, which made the bench's core, not the node, the limit. The
/// buffer in front takes what the socket holds with one read and hands it out from memory.
pub type Stream = BufReader<MaybeTlsStream<TcpStream>>;
pub type Socket = yawc::WebSocket<Stream>;

/// The read buffer in front of each connection (the bench's memory only, not the node's).
const READ_BUFFER_BYTES: usize = 16 * 1024;

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
        self.open(url, None).await
    }

    /// Connects from the loopback address `source`: the node lets only a few connections
    /// of one source wait for their login at once.
    pub async fn connect_from(&self, url: &str, source: Ipv4Addr) -> Socket {
        self.open(url, Some(source)).await
    }

    /// The node listens on 127.0.0.1; a `wss://localhost` URL names it for TLS.
    async fn open(&self, url: &str, source: Option<Ipv4Addr>) -> Socket {
        self.try_open(url, source)
            .await
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Connects as [`Wire::connect`] does, saying what failed instead of panicking (a client
    /// that reconnects to a node that may be down).
    pub async fn try_connect(&self, url: &str) -> Result<Socket, String> {
        self.try_open(url, None).await
    }

    /// Connects from `source` as [`Wire::connect_from`] does, saying what failed (a node
    /// under attack may close a connection before its upgrade).
    pub async fn try_connect_from(&self, url: &str, source: Ipv4Addr) -> Result<Socket, String> {
        self.try_open(url, Some(source)).await
    }

    async fn try_open(&self, url: &str, source: Option<Ipv4Addr>) -> Result<Socket, String> {
        let url: url::Url = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let port = url.port_or_known_default().ok_or("a URL without a port")?;
        let socket = tokio::net::TcpSocket::new_v4().map_err(|e| format!("a socket: {e}"))?;
        if let Some(source) = source {
            socket
                .bind((source, 0).into())
                .map_err(|e| format!("a loopback source: {e}"))?;
        }
        let tcp = socket
            .connect((Ipv4Addr::LOCALHOST, port).into())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        tcp.set_nodelay(true)
            .map_err(|e| format!("no delay: {e}"))?;
        let io: MaybeTlsStream<TcpStream> = match &self.tls {
            Some(connector) => {
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await;
                tls.map_err(|e| format!("TLS: {e}"))?.into()
            }
            None => tcp.into(),
        };
        let io = BufReader::with_capacity(READ_BUFFER_BYTES, io);
        yawc::WebSocket::handshake(url, io, self.options())
            .await
            .map_err(|e| format!("upgrade: {e}"))
    }

    fn options(&self) -> Options {
        // TCP_NODELAY, as every client in `bench peers` has it: without it Nagle holds a
        // small frame back while the previous one is unacknowledged.
        let options = Options::default().with_no_delay();
        match self.compress {
            true => options.with_balanced_compression(),
            false => options,
        }
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
    // For a standby, which checks the node's certificate as a client does.
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    (
        cert_path,
        key_path,
        TlsConnector::from(qe_tls::client_config(roots)),
    )
}
