//! Passwords as they may rest: salted SHA-256, compared in constant time. The control plane
//! writes them into a node's config; the node checks logins against them.
//!
//! SHA-256 rather than a slow password hash: the control plane issues random passwords of at
//! least 128 bits, which no guessing can reach, and a slow hash on every login would let
//! anyone spend the node's CPU.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A password as it may rest: `sha256:SALT_HEX:HASH_HEX`, where HASH = SHA-256(SALT ‖ password).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswordHash {
    salt: [u8; 16],
    hash: [u8; 32],
}

impl PasswordHash {
    /// Hashes `password` with a fresh random salt.
    pub fn new(password: &str) -> PasswordHash {
        let salt = crate::random::bytes::<16>();
        PasswordHash {
            salt,
            hash: salted_hash(&salt, password),
        }
    }

    pub fn parse(text: &str) -> Option<PasswordHash> {
        let mut parts = text.split(':');
        if parts.next()? != "sha256" {
            return None;
        }
        let salt = from_hex(parts.next()?)?;
        let hash = from_hex(parts.next()?)?;
        if parts.next().is_some() {
            return None;
        }
        Some(PasswordHash { salt, hash })
    }

    pub fn matches(&self, password: &str) -> bool {
        salted_hash(&self.salt, password).ct_eq(&self.hash).into()
    }
}

impl std::fmt::Display for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sha256:{}:{}",
            crate::hex(&self.salt),
            crate::hex(&self.hash)
        )
    }
}

fn salted_hash(salt: &[u8], password: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(salt);
    hasher.update(password.as_bytes());
    hasher.finalize().into()
}

fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_survives_its_text_form_and_keeps_no_password() {
        let hash = PasswordHash::new("correct horse");
        let text = hash.to_string();
        assert!(!text.contains("correct"));
        let parsed = PasswordHash::parse(&text).unwrap();
        assert!(parsed.matches("correct horse"));
        assert!(!parsed.matches("correct horse "));
        assert_eq!(PasswordHash::parse("md5:00:00"), None);
        assert_eq!(PasswordHash::parse("sha256:zz:00"), None);
    }
}
