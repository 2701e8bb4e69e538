//! Certificates from a CA reached by ACME (instant-acme), DNS-01: the challenge values are
//! published as TXT records by our own DNS server (`dns.rs`), on every replica, while the order
//! is pending; the CA is told to validate once every replica serves them (`dns/served.rs`). The
//! ACME account is kept in the store.

use super::{CertificateError, Issued};
use crate::dns::{served, Zone};
use crate::store::Store;
use crate::unix_now as now;
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use serde::Deserialize;
use std::path::PathBuf;

/// How long every replica's DNS has to serve an order's DNS-01 values (each follows the
/// store within milliseconds; a replica that stopped saying what it serves is not waited for).
const SERVED_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// `[acme]` in the config.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// The CA's directory URL (Let's Encrypt production or staging, or Pebble).
    pub directory: String,
    /// A PEM root to trust for the CA's own HTTPS (Pebble's), besides the usual roots.
    pub ca_root: Option<PathBuf>,
}

/// The CA an account and its certificates belong to: its directory.
pub(super) fn name(config: &AcmeConfig) -> String {
    format!("acme {}", config.directory)
}

/// This directory's account: the one kept, or a new one (a directory not used before).
async fn account(config: &AcmeConfig, store: &Store) -> Result<Account, CertificateError> {
    let builder = || match &config.ca_root {
        Some(root) => Account::builder_with_root(root),
        None => Account::builder(),
    };
    if let Some(saved) = store.acme_account(&config.directory).await? {
        if let Ok(credentials) = serde_json::from_str::<AccountCredentials>(&saved) {
            return Ok(builder()?.from_credentials(credentials).await?);
        }
    }
    let new = NewAccount {
        contact: &[],
        terms_of_service_agreed: true,
        only_return_existing: false,
    };
    let (account, credentials) = builder()?
        .create(&new, config.directory.clone(), None)
        .await?;
    let saved = serde_json::to_string(&credentials).expect("credentials serialize");
    store.put_acme_account(&config.directory, &saved).await?;
    Ok(account)
}

/// The cluster's wildcard: an order for it, the key made here.
pub(super) async fn order_wildcard(
    config: &AcmeConfig,
    zone: &Zone,
    store: &Store,
) -> Result<Issued, CertificateError> {
    let (mut order, _published) = ready_order(config, zone, store, &zone.wildcard()).await?;
    let key_pem = order.finalize().await?;
    let chain_pem = order.poll_certificate(&RetryPolicy::default()).await?;
    Ok(Issued {
        chain_pem,
        key_pem,
        issued_at: now(),
        issuer: name(config),
    })
}

/// A queue's own certificate: an order for `host`, finalized with its node's CSR.
pub(super) async fn order_for_csr(
    config: &AcmeConfig,
    zone: &Zone,
    store: &Store,
    host: &str,
    csr_pem: &str,
) -> Result<String, CertificateError> {
    use rustls::pki_types::pem::PemObject;
    let csr = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
        .map_err(|e| CertificateError::Request(format!("not a CSR: {e}")))?;
    let (mut order, _published) = ready_order(config, zone, store, host).await?;
    order.finalize_csr(csr.as_ref()).await?;
    Ok(order.poll_certificate(&RetryPolicy::default()).await?)
}

/// DNS-01 values in the store, and so in every replica's zone, for as long as this lives.
struct Published {
    store: Store,
    values: Vec<(String, String)>,
}

impl Published {
    /// Puts `values` in the store and this replica's zone: the CA may ask this replica first.
    async fn publish(
        store: &Store,
        zone: &Zone,
        values: Vec<(String, String)>,
    ) -> Result<Published, CertificateError> {
        store
            .change_challenges(|all| all.extend_from_slice(&values))
            .await?;
        zone.refresh(store).await?;
        let store = store.clone();
        Ok(Published { store, values })
    }
}

impl Drop for Published {
    /// Withdrawn in the background (every zone follows the store); a replica that dies before
    /// leaves values that answer no order, harmless beside a later order's.
    fn drop(&mut self) {
        let (store, values) = (self.store.clone(), std::mem::take(&mut self.values));
        tokio::spawn(async move {
            let withdrawn = store.change_challenges(|all| all.retain(|v| !values.contains(v)));
            if let Err(error) = withdrawn.await {
                tracing::warn!(%error, "an order's DNS-01 values could not be withdrawn");
            }
        });
    }
}

/// An order for `identifier` whose DNS-01 challenges are answered with TXT records in our
/// zone and validated: ready to finalize. The records stay until the returned guard drops.
async fn ready_order(
    config: &AcmeConfig,
    zone: &Zone,
    store: &Store,
    identifier: &str,
) -> Result<(instant_acme::Order, Published), CertificateError> {
    let account = account(config, store).await?;
    let identifiers = [Identifier::Dns(identifier.to_string())];
    let mut order = account.new_order(&NewOrder::new(&identifiers)).await?;
    // First every value is published, then each challenge is declared ready: the CA may look
    // the moment it hears.
    let mut values = Vec::new();
    let mut ready = Vec::new();
    {
        let mut authorizations = order.authorizations();
        while let Some(authorization) = authorizations.next().await {
            let mut authorization = authorization?;
            if authorization.status == AuthorizationStatus::Valid {
                continue;
            }
            let challenge = authorization
                .challenge(ChallengeType::Dns01)
                .ok_or_else(|| CertificateError::Order("without a dns-01 challenge".into()))?;
            values.push((
                identifier.to_string(),
                challenge.key_authorization().dns_value(),
            ));
            ready.push(challenge.url.clone());
        }
    }
    let published = Published::publish(store, zone, values.clone()).await?;
    // The CA may ask any replica's DNS: every one must answer with the values before it is
    // told to look, or it may find none and fail the order.
    let replicas = served::until_served_everywhere(store, &values, SERVED_WITHIN).await?;
    tracing::info!(
        replicas,
        "the DNS-01 values are served by every replica: the CA may validate"
    );
    {
        let mut authorizations = order.authorizations();
        while let Some(authorization) = authorizations.next().await {
            let mut authorization = authorization?;
            if let Some(mut challenge) = authorization.challenge(ChallengeType::Dns01) {
                if ready.contains(&challenge.url) {
                    challenge.set_ready().await?;
                }
            }
        }
    }
    let status = order.poll_ready(&RetryPolicy::default()).await?;
    if status != OrderStatus::Ready {
        return Err(CertificateError::Order(format!("{status:?}")));
    }
    Ok((order, published))
}
