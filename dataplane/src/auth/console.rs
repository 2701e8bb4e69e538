//! Console tokens at the node: the web console's admin logins (README, "Beyond the manual").
//!
//! `{"console_token":T,"role":"admin","queuetype":"distribute"}` logs in as an administrator
//! with the rights the control plane signed ([`qe_shared::console_token`]) instead of a
//! username and password. The token must be signed with this node's credential, name this
//! queue, not have expired (30 s of clock skew allowed) and not have been used before; else
//! the login fails as a wrong password does (107, then the connection closes). A node with no
//! control plane (started with login flags) has no credential and takes no console token.

use qe_shared::console_token::{self, Rights, CLOCK_SKEW_SECS, MAX_LIFETIME_SECS};
use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

/// The most token ids kept at once: more logins than this within five minutes are refused
/// until the oldest expire (a bound on memory, far above any console's use).
const MAX_SEEN: usize = 10_000;

/// What the node checks console tokens with.
pub struct ConsoleTokens {
    /// The queue's id and the node's credential now; `None` on a node without a control plane.
    credential: RwLock<Option<(String, String)>>,
    /// Ids of tokens taken, with their expiry: kept until then, so each is taken once.
    seen: Mutex<HashMap<String, u64>>,
}

impl ConsoleTokens {
    /// For the node of queue `queue_id` holding credential `token`, if it has a control plane.
    pub fn new(credential: Option<(String, String)>) -> ConsoleTokens {
        ConsoleTokens {
            credential: RwLock::new(credential),
            seen: Mutex::default(),
        }
    }

    /// A rotated credential: tokens signed with the old one no longer open.
    pub fn rotate(&self, token: &str) {
        if let Some((_, held)) = self.credential.write().expect("never poisoned").as_mut() {
            *held = token.to_string();
        }
    }

    /// The rights `token` grants at `now` (unix seconds), taking it; `None` if it grants none.
    pub fn take(&self, token: &str, now: u64) -> Option<Rights> {
        let claims = {
            let credential = self.credential.read().expect("never poisoned");
            let (queue_id, node_token) = credential.as_ref()?;
            let claims = console_token::open(node_token, token)?;
            (claims.q == *queue_id).then_some(claims)?
        };
        let live = now <= claims.exp + CLOCK_SKEW_SECS
            && claims.exp <= now + MAX_LIFETIME_SECS + CLOCK_SKEW_SECS;
        if !live {
            return None;
        }
        let mut seen = self.seen.lock().expect("never poisoned");
        seen.retain(|_, exp| now <= *exp + CLOCK_SKEW_SECS);
        if seen.len() >= MAX_SEEN || seen.contains_key(&claims.jti) {
            return None;
        }
        seen.insert(claims.jti, claims.exp);
        Some(claims.r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qe_shared::console_token::{new_jti, sign, Claims};

    fn token(q: &str, r: Rights, exp: u64) -> String {
        let claims = Claims {
            q: q.into(),
            r,
            exp,
            jti: new_jti(),
        };
        sign("cred", &claims)
    }

    #[test]
    fn a_token_is_taken_once_for_its_queue_before_it_expires() {
        let tokens = ConsoleTokens::new(Some(("q1".into(), "cred".into())));
        let read = token("q1", Rights::Read, 1_000);
        assert_eq!(tokens.take(&read, 900), Some(Rights::Read));
        assert_eq!(tokens.take(&read, 900), None, "used twice");
        assert_eq!(
            tokens.take(&token("q1", Rights::Write, 1_000), 1_030),
            Some(Rights::Write)
        );
        assert_eq!(
            tokens.take(&token("q1", Rights::Write, 1_000), 1_031),
            None,
            "expired"
        );
        assert_eq!(
            tokens.take(&token("q2", Rights::Write, 1_000), 900),
            None,
            "another queue"
        );
        let far = token(
            "q1",
            Rights::Write,
            900 + MAX_LIFETIME_SECS + CLOCK_SKEW_SECS + 1,
        );
        assert_eq!(tokens.take(&far, 900), None, "lives too long");
    }

    #[test]
    fn a_rotation_voids_old_tokens_and_a_lone_node_takes_none() {
        let tokens = ConsoleTokens::new(Some(("q1".into(), "cred".into())));
        let old = token("q1", Rights::Write, 1_000);
        tokens.rotate("cred2");
        assert_eq!(tokens.take(&old, 900), None);
        let lone = ConsoleTokens::new(None);
        assert_eq!(lone.take(&token("q1", Rights::Write, 1_000), 900), None);
    }

    #[test]
    fn expired_ids_are_forgotten() {
        let tokens = ConsoleTokens::new(Some(("q1".into(), "cred".into())));
        for _ in 0..3 {
            assert!(tokens
                .take(&token("q1", Rights::Read, 1_000), 900)
                .is_some());
        }
        assert!(tokens
            .take(&token("q1", Rights::Read, 5_000), 4_900)
            .is_some());
        assert_eq!(tokens.seen.lock().unwrap().len(), 1);
    }
}
