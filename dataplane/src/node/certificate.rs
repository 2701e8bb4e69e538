//! The node's own certificate, for its queue's name only. The key is made here, kept 0600,
//! and never leaves the node: the control plane gets a CSR and returns the chain, so one
//! node's key can never serve another queue's name. It is renewed two thirds into its
//! validity, or at once when the control plane asks (a larger generation); the new key and
//! certificate are put in service as one checked pair, then written to disk for the next
//! start.

use crate::config::own_certificate_paths as paths;
use crate::control_plane::channel::{Channel, ChannelError};
use qe_shared::backoff::Backoff;
use qe_shared::files::write_private;
use qe_tls::Certificate;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The wait after a failed renewal; it doubles while they keep failing.
const RETRY_AFTER: Duration = Duration::from_secs(1);
const RETRY_AFTER_AT_MOST: Duration = Duration::from_secs(600);
/// The least time between two renewals the node decides on itself.
const RENEW_AT_MOST_EVERY: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct OwnCertificate {
    channel: Channel,
    data_dir: PathBuf,
    host: String,
    /// The generation the control plane asks for: a certificate got from now on is that one.
    generation: Arc<AtomicU64>,
    /// The pair in service, once the node serves TLS.
    served: Arc<Mutex<Option<Arc<Certificate>>>>,
    /// One renewal at a time (the timer and a forced one may meet).
    renewing: Arc<tokio::sync::Mutex<()>>,
    /// Has [`Self::keep_renewed`] retry a renewal the control plane asked for.
    retry: Arc<tokio::sync::Notify>,
}

impl OwnCertificate {
    pub fn new(channel: Channel, data_dir: &Path, host: &str, generation: u64) -> OwnCertificate {
        OwnCertificate {
            channel,
            data_dir: data_dir.to_path_buf(),
            host: host.to_string(),
            generation: Arc::new(AtomicU64::new(generation)),
            served: Arc::default(),
            renewing: Arc::default(),
            retry: Arc::default(),
        }
    }

    /// Makes sure the files hold a pair that is not due, getting one (retrying while the
    /// control plane refuses) when not. A node whose control plane cannot be reached starts
    /// with the pair it kept, even a due one.
    pub async fn ensure(&self) {
        let (cert, key) = paths(&self.data_dir);
        let kept = Certificate::load(&cert, &key).is_ok();
        let asked = self.generation.load(Ordering::Relaxed);
        let fresh = self.kept_generation().is_some_and(|kept| kept >= asked);
        if kept && fresh && self.due_in().is_some_and(|due| !due.is_zero()) {
            return;
        }
        let mut backoff = Backoff::new(RETRY_AFTER, Duration::from_secs(30));
        loop {
            match self.renew().await {
                Ok(()) => return,
                Err(ChannelError::Send(error)) if kept => {
                    tracing::warn!(%error, "the control plane cannot be reached: serving the certificate kept from before");
                    return;
                }
                Err(error) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(%error, retry_in = ?wait, "no certificate of its own yet");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Renewals from now on go into `certificate` (the pair the node serves).
    pub fn serve(&self, certificate: Arc<Certificate>) {
        *self.served.lock().expect("never poisoned") = Some(certificate);
    }

    /// How long until the certificate on disk is due for renewal (zero if it is due now);
    /// `None` if it cannot be read.
    fn due_in(&self) -> Option<Duration> {
        let (cert, _) = paths(&self.data_dir);
        let pem = std::fs::read_to_string(cert).ok()?;
        let due = qe_tls::validity::renewal_due(qe_tls::validity::validity_of_pem(&pem)?);
        Some(Duration::from_secs(
            due.saturating_sub(crate::engine::now_ms() / 1000),
        ))
    }

    /// Renews two thirds into each certificate's validity, and retries one the control plane
    /// asked for that failed, for the life of the node.
    pub async fn keep_renewed(self) {
        let mut backoff = Backoff::new(RETRY_AFTER, RETRY_AFTER_AT_MOST);
        loop {
            let asked =
                self.kept_generation().unwrap_or(0) < self.generation.load(Ordering::Relaxed);
            let due = match asked {
                true => Duration::ZERO,
                // Never more often than this, whatever a CA's validity says.
                false => self.due_in().unwrap_or_default().max(RENEW_AT_MOST_EVERY),
            };
            tokio::select! {
                _ = tokio::time::sleep(due) => {}
                _ = self.retry.notified() => {}
            }
            match self.renew().await {
                Ok(()) => backoff.reset(),
                Err(error) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(%error, retry_in = ?wait, "the certificate could not be renewed");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Renews now if the control plane asks for a generation past the one served. One that
    /// fails (a CA down, a rate limit) is left to [`Self::keep_renewed`] to retry, backing off:
    /// the rest of a config (a rotated password) must not wait for a CA.
    pub async fn renew_if_asked(&self, generation: u64) {
        if generation <= self.kept_generation().unwrap_or(0) {
            return;
        }
        self.generation.fetch_max(generation, Ordering::Relaxed);
        if let Err(error) = self.renew().await {
            tracing::warn!(%error, "the certificate asked for could not be had now; retrying");
            self.retry.notify_one();
        }
    }

    /// The generation the certificate on disk was asked for (`tls/own-generation`).
    fn kept_generation(&self) -> Option<u64> {
        let path = self.data_dir.join("tls").join("own-generation");
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// A new key and a certificate for it: in service first (as a checked pair), then on disk.
    async fn renew(&self) -> Result<(), ChannelError> {
        let _one = self.renewing.lock().await;
        let key =
            rcgen::KeyPair::generate().map_err(|e| ChannelError::Certificate(e.to_string()))?;
        let csr = rcgen::CertificateParams::new(vec![self.host.clone()])
            .and_then(|params| params.serialize_request(&key))
            .and_then(|request| request.pem())
            .map_err(|e| ChannelError::Certificate(e.to_string()))?;
        let chain = self.channel.certificate(csr).await?;
        let key_pem = key.serialize_pem();
        let served = self.served.lock().expect("never poisoned").clone();
        if let Some(served) = served {
            served
                .replace(&chain, &key_pem)
                .map_err(|e| ChannelError::Certificate(e.to_string()))?;
        }
        qe_shared::files::on_disk(|| self.write(&chain, &key_pem))
            .map_err(|e| ChannelError::Certificate(e.to_string()))?;
        tracing::info!(host = %self.host, "a certificate of its own is in service");
        Ok(())
    }

    /// Each file whole (to the side, synced, renamed): a restart reads a whole pair, or a
    /// mismatched one that [`Certificate::load`] refuses (and [`Self::ensure`] replaces).
    fn write(&self, chain: &str, key: &str) -> std::io::Result<()> {
        let (cert_path, key_path) = paths(&self.data_dir);
        let dir = cert_path.parent().expect("in tls/");
        std::fs::create_dir_all(dir)?;
        let generation = self.generation.load(Ordering::Relaxed).to_string();
        // The generation last: a crash before it only means one renewal more.
        write_private(&key_path, key.as_bytes())?;
        write_private(&cert_path, chain.as_bytes())?;
        write_private(&dir.join("own-generation"), generation.as_bytes())?;
        std::fs::File::open(dir)?.sync_all()
    }
}
