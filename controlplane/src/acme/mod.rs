//! The cluster's wildcard certificate, `*.q.CLUSTER.DOMAIN`, by ACME DNS-01 (instant-acme).
//!
//! One certificate per cluster rather than per queue, so a public CA's rate limits never
//! block a new queue. The challenge values are published as TXT records by our own DNS
//! server (`dns.rs`) while the order is pending. The account and the certificate are kept in
//! the store.

mod validity;

use crate::dns::Zone;
use crate::fleet::Provider;
use crate::store::Store;
use crate::unix_now as now;
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// `[acme]` in the config.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// The CA's directory URL (Let's Encrypt production or staging, or Pebble).
    pub directory: String,
    /// A PEM root to trust for the CA's own HTTPS (Pebble's), besides the usual roots.
    pub ca_root: Option<PathBuf>,
}

/// A certificate chain and its private key, in PEM.
#[derive(Clone, Serialize, Deserialize)]
pub struct Issued {
    pub chain_pem: String,
    pub key_pem: String,
    /// When it was issued, in seconds since 1970.
    pub issued_at: u64,
}

impl std::fmt::Debug for Issued {
    /// Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Issued(at {})", self.issued_at)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AcmeError {
    #[error("ACME: {0}")]
    Acme(#[from] instant_acme::Error),
    #[error("the order ended {0}")]
    Order(String),
    #[error("the store: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// The wait after a failed order; it doubles while orders keep failing.
const RETRY_AFTER: Duration = Duration::from_secs(5);
const RETRY_AFTER_AT_MOST: Duration = Duration::from_secs(3600);
/// When a certificate's validity cannot be read, it is renewed this long after issue (two
/// thirds of a public CA's 90 days).
const RENEW_AFTER: Duration = Duration::from_secs(60 * 86_400);

/// When `issued` is due for renewal: two thirds into its validity.
fn renewal_due(issued: &Issued) -> u64 {
    match validity::validity_of_pem(&issued.chain_pem) {
        Some((from, to)) if to > from => from + (to - from) * 2 / 3,
        _ => issued.issued_at + RENEW_AFTER.as_secs(),
    }
}

/// Keeps a valid certificate in the store: orders one when there is none or it is due,
/// retrying with backoff. Runs for the life of the control plane.
pub async fn keep_certified(
    config: AcmeConfig,
    zone: Arc<Zone>,
    store: Store,
    fleet: Arc<dyn Provider>,
    renew_now: Arc<Notify>,
) {
    let mut wait = RETRY_AFTER;
    let mut forced = false;
    loop {
        let due = match store.certificate() {
            Ok(Some(issued)) if !forced => renewal_due(&issued),
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
        match order(&config, &zone, &store).await {
            Ok(issued) => {
                store.put_certificate(&issued).ok();
                tracing::info!("certificate issued for {}", zone.wildcard());
                fleet.renew_certificates().await;
                tracing::info!("the nodes serve the new certificate");
                forced = false;
                wait = RETRY_AFTER;
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?wait, "no certificate yet");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RETRY_AFTER_AT_MOST);
            }
        }
    }
}

async fn account(config: &AcmeConfig, store: &Store) -> Result<Account, AcmeError> {
    let builder = || match &config.ca_root {
        Some(root) => Account::builder_with_root(root),
        None => Account::builder(),
    };
    if let Some(saved) = store.acme_account()? {
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
    store.put_acme_account(&saved)?;
    Ok(account)
}

/// One order for the wildcard, answered with TXT records in our zone.
async fn order(config: &AcmeConfig, zone: &Zone, store: &Store) -> Result<Issued, AcmeError> {
    let account = account(config, store).await?;
    let identifiers = [Identifier::Dns(zone.wildcard())];
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
                .ok_or_else(|| AcmeError::Order("without a dns-01 challenge".into()))?;
            values.push(challenge.key_authorization().dns_value());
            ready.push(challenge.url.clone());
        }
    }
    zone.set_challenges(values);
    let result = async {
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
            return Err(AcmeError::Order(format!("{status:?}")));
        }
        let key_pem = order.finalize().await?;
        let chain_pem = order.poll_certificate(&RetryPolicy::default()).await?;
        Ok(Issued {
            chain_pem,
            key_pem,
            issued_at: now(),
        })
    }
    .await;
    zone.set_challenges(Vec::new());
    result
}
