//! The API over HTTPS (`[api_tls]`): a listener that hands axum connections once their TLS
//! handshake is done, TLS 1.2 and 1.3 only (rustls, ring). Handshakes run on tasks of their
//! own, so a slow or silent client never holds up the next one. The certificate is read again
//! on SIGHUP (a renewed one): new connections get it, open ones go on.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
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
    /// A TLS acceptor for the configured certificate and key.
    pub fn acceptor(&self) -> Result<TlsAcceptor, String> {
        let fail = |what: &dyn std::fmt::Display| format!("[api_tls]: {what}");
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .and_then(|certs| certs.collect())
            .map_err(|e| fail(&format!("{}: {e}", self.cert.display())))?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| fail(&format!("{}: {e}", self.key.display())))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(&e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| fail(&e))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// The acceptor new connections use; [`reload_on_hangup`] replaces it.
pub type SharedAcceptor = Arc<std::sync::RwLock<TlsAcceptor>>;

pub struct TlsListener {
    tcp: TcpListener,
    acceptor: SharedAcceptor,
    /// Handshakes under way; each ends with a connection, or with nothing when it failed.
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, acceptor: SharedAcceptor) -> TlsListener {
        TlsListener {
            tcp,
            acceptor,
            handshakes: JoinSet::new(),
        }
    }
}

/// On SIGHUP, reads the certificate and key again; a pair that does not load leaves the old
/// one in use.
pub async fn reload_on_hangup(config: ApiTls, acceptor: SharedAcceptor) {
    let kind = tokio::signal::unix::SignalKind::hangup();
    let mut hangups = tokio::signal::unix::signal(kind).expect("a SIGHUP handler");
    while hangups.recv().await.is_some() {
        match config.acceptor() {
            Ok(new) => {
                *acceptor.write().expect("never poisoned") = new;
                tracing::info!("the API's certificate was reloaded");
            }
            Err(error) => tracing::warn!(%error, "the API keeps its certificate"),
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
                        let acceptor = self.acceptor.read().expect("never poisoned").clone();
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
