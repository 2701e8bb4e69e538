//! What one control-plane replica said its DNS serves of the DNS-01 values
//! ([`crate::dns::served`]), as the store keeps it.

use serde::{Deserialize, Serialize};

/// What one replica said its zone serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Served {
    /// Who said it: the replica's host and API address.
    pub replica: String,
    /// When it said it, in milliseconds since 1970 by its clock.
    pub at_ms: u64,
    /// The DNS-01 values (the name ordered, the value).
    pub challenges: Vec<(String, String)>,
}
