//! The cluster's certificate as the store keeps it.

use serde::{Deserialize, Serialize};

/// A certificate chain and its private key, in PEM.
#[derive(Clone, Serialize, Deserialize)]
pub struct Issued {
    pub chain_pem: String,
    pub key_pem: String,
    /// When it was issued, in seconds since 1970.
    pub issued_at: u64,
    /// Which CA issued it ([`crate::certificates::Issuer::name`]): one from another CA (another ACME directory, a
    /// restarted Pebble, a new local CA) is replaced at once.
    #[serde(default)]
    pub issuer: String,
}

impl std::fmt::Debug for Issued {
    /// Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Issued(at {})", self.issued_at)
    }
}
