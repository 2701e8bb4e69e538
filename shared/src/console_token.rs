//! Console tokens: short-lived, queue-scoped logins the control plane signs for the web
//! console, so the browser can open a WebSocket to the node itself (the node opens every
//! exchange with the control plane, so the control plane cannot call into it).
//!
//! The key is `HMAC-SHA256(node_token, "console")`, where `node_token` is the node's
//! credential ([`crate::node_channel::Bootstrap::node_token`]): both sides can compute it, no
//! new secret travels, and rotating the credential voids every console token.
//!
//! A token is `base64url(claims JSON) "." base64url(HMAC-SHA256(key, base64url(claims)))`
//! (no padding); the claims are [`Claims`]. While a credential rotation is under way the
//! control plane cannot know which of the two credentials the node holds, so it signs with
//! both, and the token carries a second `"." MAC`: the node takes a token any of whose MACs
//! is right for the credential it holds ([`open`]). Once the rotation is done, tokens are
//! signed with the new credential only, and the node, holding it, refuses the old one's.

use crate::hmac::hmac_sha256;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

/// The longest a token lives, in seconds.
pub const MAX_LIFETIME_SECS: u64 = 300;
/// How far past `exp` a node still takes a token: its clock and the control plane's differ.
pub const CLOCK_SKEW_SECS: u64 = 30;
/// The longest token a node reads (claims are well under this).
pub const MAX_TOKEN_BYTES: usize = 512;

/// What a console token grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// The queue it is for.
    pub q: String,
    /// [`Rights`]: "read" or "write".
    pub r: Rights,
    /// When it expires (unix seconds).
    pub exp: u64,
    /// Its id (16 random bytes, base64url): a node takes each once.
    pub jti: String,
}

/// What an admin session logged in with a console token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rights {
    /// Read commands only (`getmsgs`, `getcfg`, `getlivestats`, …).
    Read,
    /// Everything an admin may do.
    Write,
}

/// The key console tokens of the node with credential `node_token` are signed with.
pub fn console_key(node_token: &str) -> [u8; 32] {
    hmac_sha256(node_token.as_bytes(), b"console")
}

/// A new token id: 16 random bytes, base64url.
pub fn new_jti() -> String {
    crate::random::text::<16>()
}

/// The most MACs a token carries: one per credential the node may hold (two during a
/// rotation).
const MAX_MACS: usize = 2;

/// The token for `claims`, signed for the node with credential `node_token`.
pub fn sign(node_token: &str, claims: &Claims) -> String {
    sign_for_either(&[node_token], claims)
}

/// The token for `claims`, signed for a node that holds any one of `node_tokens` (at most
/// [`MAX_MACS`]: the credential and, during a rotation, the next one).
pub fn sign_for_either(node_tokens: &[&str], claims: &Claims) -> String {
    assert!((1..=MAX_MACS).contains(&node_tokens.len()));
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("claims serialize"));
    let mut token = body.clone();
    for node_token in node_tokens {
        let mac = hmac_sha256(&console_key(node_token), body.as_bytes());
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(mac));
    }
    token
}

/// The claims of `token` if one of its MACs is right for `node_token` (compared in constant
/// time); `None` for anything else. Expiry, queue and reuse are the caller's to check.
pub fn open(node_token: &str, token: &str) -> Option<Claims> {
    if token.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let mut parts = token.split('.');
    let body = parts.next()?;
    let macs: Vec<&str> = parts.collect();
    if !(1..=MAX_MACS).contains(&macs.len()) {
        return None;
    }
    let expected = hmac_sha256(&console_key(node_token), body.as_bytes());
    let mut right = subtle::Choice::from(0);
    for mac in macs {
        let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
        right |= expected.as_slice().ct_eq(&mac);
    }
    if !bool::from(right) {
        return None;
    }
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_with_its_nodes_credential_only_and_untampered() {
        let claims = Claims {
            q: "q1".into(),
            r: Rights::Read,
            exp: 100,
            jti: new_jti(),
        };
        let token = sign("cred", &claims);
        assert_eq!(open("cred", &token), Some(claims.clone()));
        assert_eq!(open("other", &token), None);
        let (body, mac) = token.split_once('.').unwrap();
        let forged = Claims {
            r: Rights::Write,
            ..claims
        };
        let forged_body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap());
        assert_eq!(open("cred", &format!("{forged_body}.{mac}")), None);
        assert_eq!(open("cred", body), None);
        assert_eq!(open("cred", "x.y"), None);
    }

    #[test]
    fn during_a_rotation_a_token_opens_with_either_credential_and_no_other() {
        let claims = Claims {
            q: "q1".into(),
            r: Rights::Write,
            exp: 100,
            jti: new_jti(),
        };
        let token = sign_for_either(&["old", "new"], &claims);
        assert_eq!(open("old", &token), Some(claims.clone()));
        assert_eq!(open("new", &token), Some(claims.clone()));
        assert_eq!(open("other", &token), None);
        // A third MAC (a forger hoping one of many matches) is refused outright.
        let (_, mac) = token.rsplit_once('.').unwrap();
        assert_eq!(open("new", &format!("{token}.{mac}")), None);
        assert_eq!(open("new", &format!("{token}.")), None);
    }
}
