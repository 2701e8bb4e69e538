//! Node tokens: how a node proves which queue it runs when it reports.
//!
//! A node's token is HMAC-SHA256(secret, queue id), the secret being 32 random bytes made
//! once in the data directory. Nothing per node is stored, a token is checked by computing
//! it again (in constant time), and a token for one queue is worthless for another.

use sha2::{Digest, Sha256};
use std::path::Path;
use subtle::ConstantTimeEq;

pub struct NodeTokens {
    secret: [u8; 32],
}

impl NodeTokens {
    /// Reads the secret from `path`, making it (readable by the owner only) the first time.
    pub fn open(path: &Path) -> std::io::Result<NodeTokens> {
        if let Ok(bytes) = std::fs::read(path) {
            if let Ok(secret) = bytes.try_into() {
                return Ok(NodeTokens { secret });
            }
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).expect("the OS random source");
        crate::write_private(path, &secret)?;
        Ok(NodeTokens { secret })
    }

    pub fn token_for(&self, queue_id: &str) -> String {
        hmac_sha256(&self.secret, queue_id.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn check(&self, queue_id: &str, presented: &str) -> bool {
        self.token_for(queue_id)
            .as_bytes()
            .ct_eq(presented.as_bytes())
            .into()
    }
}

/// RFC 2104 with SHA-256 (a 64-byte block).
fn hmac_sha256(key: &[u8; 32], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |byte: u8| block.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2_shape_and_tokens_are_per_queue() {
        // RFC 4231 test case 2 uses a 4-byte key "Jefe"; zero-padded to 32 bytes it is the
        // same HMAC key (keys shorter than the block are zero-padded).
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let mac = hmac_sha256(&key, b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let tokens = NodeTokens { secret: [7; 32] };
        let token = tokens.token_for("queue-a");
        assert!(tokens.check("queue-a", &token));
        assert!(!tokens.check("queue-b", &token));
        assert!(!tokens.check("queue-a", &token[..63]));
    }
}
