//! The API over HTTPS (`[api_tls]`): a listener that hands axum connections once their TLS
//! handshake is done, TLS 1.2 and 1.3 only (rustls, ring). Handshakes run on tasks of their
//! own, so a slow or silent client never holds up the next one. The certificate is
//! [`qe_tls::Certificate`], as the nodes serve theirs: read again on SIGHUP or when its files
//! change; new connections get it, open ones go on.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has for its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// `[api_tls]` in the config.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiTls {
    /// The certificate chain (PEM) the API serves; it must name the address nodes use.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The root (PEM) that signed `cert`, given to local nodes to trust it, when it is a
    /// private one. Default: nodes trust the system's roots.
    pub ca: Option<PathBuf>,
}

impl ApiTls {
    /// The certificate to serve, reread on SIGHUP and when its files change.
    pub fn certificate(&self) -> Result<Arc<qe_tls::Certificate>, qe_tls::TlsError> {
        qe_tls::Certificate::load(&self.cert, &self.key)
    }
}

pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    /// Handshakes under way; each ends with a connection, or with nothing when it failed.
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> TlsListener {
        TlsListener {
            tcp,
            acceptor,
            handshakes: JoinSet::new(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        let acceptor = self.acceptor.clone();
                        self.handshakes.spawn(async move {
                            let handshake = acceptor.accept(tcp);
                            let tls = tokio::time::timeout(HANDSHAKE_WITHIN, handshake).await;
                            Some((tls.ok()?.ok()?, peer))
                        });
                    }
                    Err(error) => {
                        // Out of file descriptors and the like: wait a moment rather than spin.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = self.handshakes.join_next() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}
