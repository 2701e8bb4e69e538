//! A served certificate that can be replaced while serving. A renewed certificate is read on
//! SIGHUP, or when either file changes (checked every few seconds); new connections get it,
//! open ones keep the one they started with.

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::version::{TLS12, TLS13};
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio_rustls::TlsAcceptor;

/// How often the certificate files are checked for a change.
const CHECK_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The certificate in force, and where it comes from.
#[derive(Debug)]
pub struct Certificate {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' modification times when last read.
    read_at: RwLock<(Option<SystemTime>, Option<SystemTime>)>,
}

impl Certificate {
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Certificate>, TlsError> {
        let certificate = Certificate {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            current: RwLock::new(read(cert_path, key_path)?),
            read_at: RwLock::new(modified(cert_path, key_path)),
        };
        Ok(Arc::new(certificate))
    }

    /// Reads the files again and, if they hold a valid pair, serves it from now on.
    pub fn reload(&self) -> Result<(), TlsError> {
        let times = modified(&self.cert_path, &self.key_path);
        let pair = read(&self.cert_path, &self.key_path)?;
        *self.current.write().expect("never poisoned") = pair;
        *self.read_at.write().expect("never poisoned") = times;
        Ok(())
    }

    /// Serves `chain_pem` with `key_pem` from now on, if they are a pair; the files are the
    /// caller's to write (a node's own certificate, renewed in memory first).
    pub fn replace(&self, chain_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        let fault = |reason: String| TlsError::File {
            path: self.cert_path.clone(),
            reason,
        };
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(chain_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| fault(e.to_string()))?;
        if chain.is_empty() {
            return Err(fault("no certificate in it".into()));
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| fault(e.to_string()))?;
        *self.current.write().expect("never poisoned") = matched_pair(chain, key)?;
        Ok(())
    }

    /// When the certificate served now stops being valid, in seconds since 1970 (None if its
    /// leaf does not read): what a node reports for the expiry alert.
    pub fn not_after(&self) -> Option<u64> {
        let current = self.current.read().expect("never poisoned").clone();
        let (_, not_after) = crate::validity::validity(current.cert.first()?)?;
        Some(not_after)
    }

    fn changed(&self) -> bool {
        modified(&self.cert_path, &self.key_path) != *self.read_at.read().expect("never poisoned")
    }

    /// The acceptor for new connections: TLS 1.2 and 1.3, HTTP/1.1.
    pub fn acceptor(self: &Arc<Self>) -> Result<TlsAcceptor, TlsError> {
        Ok(TlsAcceptor::from(self.server_config()?))
    }

    /// What new connections are served with: TLS 1.2 and 1.3, HTTP/1.1, this certificate
    /// (for [`crate::server_stream::accept`]).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&TLS13, &TLS12])?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Reloads on SIGHUP and when the files change. Runs for the life of the process.
    pub async fn watch(self: Arc<Self>) {
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .expect("a SIGHUP handler");
        let mut checks = tokio::time::interval(CHECK_EVERY);
        loop {
            tokio::select! {
                _ = hangups.recv() => {}
                _ = checks.tick() => if !self.changed() { continue },
            }
            match self.reload() {
                Ok(()) => {
                    tracing::info!(cert = %self.cert_path.display(), "TLS certificate loaded")
                }
                // Half-written files during a renewal: keep serving the old pair.
                Err(error) => tracing::warn!(%error, "TLS certificate not reloaded"),
            }
        }
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("never poisoned").clone())
    }
}

fn read(cert_path: &Path, key_path: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let fault = |path: &Path, reason: String| TlsError::File {
        path: path.to_path_buf(),
        reason,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| fault(cert_path, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| fault(cert_path, e.to_string()))?;
    if chain.is_empty() {
        return Err(fault(cert_path, "no certificate in it".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| fault(key_path, e.to_string()))?;
    matched_pair(chain, key).map_err(|e| fault(key_path, e.to_string()))
}

/// A chain and its key, only if the key is the leaf's: a new key never meets an old
/// certificate, even when the files are read between two renames.
fn matched_pair(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)?;
    let pair = CertifiedKey::new(chain, signing);
    pair.keys_match()?;
    Ok(Arc::new(pair))
}

fn modified(cert_path: &Path, key_path: &Path) -> (Option<SystemTime>, Option<SystemTime>) {
    let time = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (time(cert_path), time(key_path))
}
