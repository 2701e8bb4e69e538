//! The nodes' certificates. They come from an [`Issuer`]: a CA reached by ACME DNS-01
//! ([`acme`], answered from our own DNS), or, for local use without one, a CA the control
//! plane makes itself ([`local_ca`]).
//!
//! By default every queue has a certificate of its own, for `QUEUE-ID.q.CLUSTER.DOMAIN` only:
//! its node makes the key and sends a CSR ([`issue_for_node`]), so the key never leaves the
//! node and one node's key can never serve another queue's name. Nodes renew two thirds into
//! the validity; a forced renewal moves every queue's certificate generation on.
//!
//! Opt-in (`wildcard_certificate = true`), for a CA whose rate limits cannot take a
//! certificate per queue: one wildcard `*.q.CLUSTER.DOMAIN` for the cluster, kept in the store
//! with its key and handed to every node. Its risk: every node holds the key that serves
//! every queue's name, so one compromised node can impersonate any queue of the cluster.

pub mod acme;
pub mod local_ca;

use crate::dns::Zone;
use crate::leadership::Leadership;
pub use crate::model::certificate::Issued;
use crate::store::{Store, StoreError};
use crate::unix_now as now;
use qe_shared::backoff::Backoff;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("ACME: {0}")]
    Acme(#[from] instant_acme::Error),
    #[error("the order ended {0}")]
    Order(String),
    #[error("the local CA: {0}")]
    LocalCa(String),
    #[error("the store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Request(String),
    /// A DNS-01 value a replica's DNS did not serve in time: the CA was not told to look.
    #[error("{0}")]
    NotServed(#[from] crate::dns::served::NotServed),
}

/// How this cluster's nodes get their certificates.
pub enum NodeCertificates {
    /// None: nodes serve ws:// (local use).
    None,
    /// Each queue's own, from a CSR its node sends.
    PerQueue(Arc<Issuer>),
    /// The cluster's wildcard, from this issuer ([`Issuer::name`]), fetched whole by nodes.
    Wildcard { issuer: String },
}

/// A node's CSR, if it is one (its signature checked) for `host` (a queue's name) and nothing
/// else.
pub fn checked_request(
    host: &str,
    csr_pem: &str,
) -> Result<rcgen::CertificateSigningRequestParams, CertificateError> {
    let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|e| CertificateError::Request(format!("not a CSR: {e}")))?;
    let names: Vec<String> = csr
        .params
        .subject_alt_names
        .iter()
        .map(|name| match name {
            rcgen::SanType::DnsName(name) => name.to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    if names != [host] {
        return Err(CertificateError::Request(format!(
            "the CSR must name {host} and nothing else, not {names:?}"
        )));
    }
    Ok(csr)
}

/// A certificate for `host` with the key of `csr` (one [`checked_request`] passed); returns the
/// chain.
pub async fn issue_for_node(
    issuer: &Issuer,
    zone: &Zone,
    store: &Store,
    host: &str,
    csr_pem: &str,
    csr: rcgen::CertificateSigningRequestParams,
) -> Result<String, CertificateError> {
    match issuer {
        Issuer::Acme(config) => acme::order_for_csr(config, zone, store, host, csr_pem).await,
        Issuer::LocalCa(ca) => ca.sign(host, csr),
    }
}

/// Where the cluster's certificate comes from.
pub enum Issuer {
    Acme(acme::AcmeConfig),
    LocalCa(Box<local_ca::LocalCa>),
}

impl Issuer {
    /// Which CA this is: an ACME directory, or a local CA's root.
    pub fn name(&self) -> String {
        match self {
            Issuer::Acme(config) => acme::name(config),
            Issuer::LocalCa(ca) => ca.name.clone(),
        }
    }

    /// A new certificate for `zone`'s wildcard.
    async fn issue(&self, zone: &Zone, store: &Store) -> Result<Issued, CertificateError> {
        match self {
            Issuer::Acme(config) => acme::order_wildcard(config, zone, store).await,
            Issuer::LocalCa(ca) => ca.issue(&zone.wildcard()),
        }
    }
}

/// Puts `issued` in the store, trying again (with backoff) while the store is unavailable:
/// ordering again would spend the CA's limits on a certificate already issued.
async fn keep_certificate(store: &Store, issued: &Issued) {
    let mut backoff = Backoff::new(RETRY_AFTER, RETRY_AFTER_AT_MOST);
    while let Err(error) = store.put_certificate(issued).await {
        if matches!(error, crate::store::StoreError::NotLeader) {
            return;
        }
        let wait = backoff.next_wait();
        tracing::warn!(%error, retry_in = ?wait, "the new certificate could not be kept yet");
        tokio::time::sleep(wait).await;
    }
}

/// The wait after a failed order; it doubles while orders keep failing.
const RETRY_AFTER: Duration = Duration::from_secs(5);
const RETRY_AFTER_AT_MOST: Duration = Duration::from_secs(3600);
/// When a certificate's validity cannot be read, it is renewed this long after issue (two
/// thirds of a public CA's 90 days).
const RENEW_AFTER: Duration = Duration::from_secs(60 * 86_400);

/// When `issued` is due for renewal: two thirds into its validity.
fn renewal_due(issued: &Issued) -> u64 {
    match qe_tls::validity::validity_of_pem(&issued.chain_pem) {
        Some((from, to)) if to > from => qe_tls::validity::renewal_due((from, to)),
        _ => issued.issued_at + RENEW_AFTER.as_secs(),
    }
}

/// Wildcard mode: keeps a valid certificate in the store: gets one when there is none or it
/// is due, retrying with backoff, then has every node fetch it. Runs for the life of the
/// control plane, ordering only while this replica leads.
pub async fn keep_certified(
    issuer: Issuer,
    zone: Arc<Zone>,
    store: Store,
    renew_now: Arc<Notify>,
    mut leadership: Leadership,
) {
    loop {
        let fence = leadership.lead().await;
        let store = store.fenced(fence.clone());
        tokio::select! {
            _ = keep_certified_while_leading(&issuer, &zone, &store, &renew_now) => {}
            _ = leadership.lost(&fence) => {}
        }
    }
}

async fn keep_certified_while_leading(
    issuer: &Issuer,
    zone: &Zone,
    store: &Store,
    renew_now: &Notify,
) {
    let mut backoff = Backoff::new(RETRY_AFTER, RETRY_AFTER_AT_MOST);
    let mut forced = false;
    loop {
        let due = match store.certificate().await {
            Ok(Some(issued)) if !forced && issued.issuer == issuer.name() => renewal_due(&issued),
            _ => 0,
        };
        let now = now();
        if due > now {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(due - now)) => {}
                _ = renew_now.notified() => forced = true,
            }
            continue;
        }
        match issuer.issue(zone, store).await {
            Ok(issued) => {
                // Kept before anything else: an order that cannot be kept is not made again.
                keep_certificate(store, &issued).await;
                // Every node is told before this is said: whoever waits for the log line
                // then finds the change asked for.
                if let Err(error) = renew_certificates(store).await {
                    tracing::warn!(%error, "the nodes could not be told of the new certificate");
                }
                let target = crate::model::audit::Target {
                    id: zone.wildcard(),
                    account: None,
                };
                let entry = crate::model::audit::Entry::new(
                    crate::model::audit::Actor::ControlPlane,
                    crate::model::audit::CERTIFICATE_ISSUE,
                    target,
                    200,
                );
                store.record_audit(entry).await;
                tracing::info!("certificate issued for {}", zone.wildcard());
                forced = false;
                backoff.reset();
            }
            Err(error) => {
                let wait = backoff.next_wait();
                tracing::warn!(%error, retry_in = ?wait, "no certificate yet");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Has every live queue's node get a new certificate now (a forced renewal, or a new
/// cluster wildcard): their certificate generation and config move on.
pub async fn renew_certificates(store: &Store) -> Result<(), StoreError> {
    renew_certificates_where(store, |_| true).await
}

/// Has every live queue whose certificate another CA issued get a new one now: another
/// ACME directory, a restarted Pebble, a new local CA. Its clients trust only the new CA.
pub async fn renew_certificates_not_from(store: &Store, issuer: &str) -> Result<(), StoreError> {
    renew_certificates_where(store, |queue| {
        queue
            .certificate_issuer
            .as_ref()
            .is_some_and(|name| name != issuer)
    })
    .await
}

async fn renew_certificates_where(
    store: &Store,
    which: impl Fn(&crate::model::queue::Queue) -> bool,
) -> Result<(), StoreError> {
    for queue in store.list().await? {
        let renewed = store.update(&queue.id, |queue| {
            if queue.status.is_live() && which(queue) {
                queue.certificate_generation += 1;
                queue.config_version += 1;
            }
            Ok::<_, StoreError>(())
        });
        renewed.await?;
    }
    Ok(())
}
