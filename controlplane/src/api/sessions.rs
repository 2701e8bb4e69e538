//! The console's sessions: an API key or the operator's token is exchanged once for a random
//! session id (256 bits) carried in an HttpOnly, SameSite=Strict cookie, so the token itself
//! never stays in the page. Sessions live in this process's memory only: a restart, or 12 h
//! without a request ([`IDLE_AT_MOST`]), signs everyone out.
//!
//! - A session keeps what it was granted ([`Grant`]), not a [`Caller`](crate::api::Caller): the
//!   caller is found again on every request, so a key revoked or expired since the sign-in
//!   ends its sessions at once (`api/auth.rs`).
//! - Sessions are found by the SHA-256 of the id, so a lookup's timing says nothing about the
//!   ids held, and the ids themselves are not kept.
//! - Each has a CSRF token of its own (128 bits) that the page reads from
//!   `GET /console/session` and sends back as `X-CSRF-Token` with every change; it is
//!   compared in constant time.

use super::ApiError;
use axum::http::Method;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// How long a session lasts without a request.
pub const IDLE_AT_MOST: Duration = Duration::from_secs(12 * 3600);

/// Sessions held at once at most, for every account together: past it, a sign-in is refused
/// (another account's session is never ended for it). Each account holds at most its
/// `max_console_sessions` ([`Sessions::open`]), so this bounds memory only.
const SESSIONS_AT_MOST: usize = 10_000;

/// The header a change made with a session cookie must carry.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// What a sign-in was granted, checked again on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// The operator's token.
    Operator,
    /// The account API key with this id.
    Key(String),
}

/// One signed-in browser.
struct Session {
    grant: Grant,
    /// The account it is of; None: the operator's.
    account: Option<String>,
    /// What the page must send as `X-CSRF-Token` with a change.
    csrf: String,
    /// Its last request: it ends [`IDLE_AT_MOST`] later.
    last_seen: Instant,
}

/// A session found: its grant and CSRF token.
#[derive(Debug, Clone)]
pub struct Found {
    pub grant: Grant,
    pub csrf: String,
}

impl Found {
    /// Whether `presented` is this session's CSRF token (constant time).
    pub fn csrf_matches(&self, presented: Option<&str>) -> bool {
        let presented = presented.unwrap_or("");
        !presented.is_empty() && bool::from(presented.as_bytes().ct_eq(self.csrf.as_bytes()))
    }
}

/// Every session of this process. One per router (`api::router`).
pub struct Sessions {
    by_hash: Mutex<HashMap<[u8; 32], Session>>,
    /// The API is served over TLS: cookies are `Secure` and named `__Host-…`.
    secure: bool,
}

impl Sessions {
    /// Whether the console is served over TLS.
    pub fn secure(&self) -> bool {
        self.secure
    }

    pub fn new(secure: bool) -> Sessions {
        Sessions {
            by_hash: Mutex::default(),
            secure,
        }
    }

    /// The session cookie's name: `__Host-` over TLS (the browser then insists on Secure,
    /// Path=/ and no Domain).
    pub fn cookie_name(&self) -> &'static str {
        match self.secure {
            true => "__Host-qe_session",
            false => "qe_session",
        }
    }

    /// Opens a session for `grant` of `account` (None: the operator), which holds at most
    /// `at_most` at once: past it, the account's own session idle longest ends. Its id and
    /// CSRF token; None when every account together holds [`SESSIONS_AT_MOST`].
    pub fn open(
        &self,
        grant: Grant,
        account: Option<&str>,
        at_most: usize,
    ) -> Option<(String, String)> {
        self.open_at(grant, account, at_most, Instant::now())
    }

    fn open_at(
        &self,
        grant: Grant,
        account: Option<&str>,
        at_most: usize,
        now: Instant,
    ) -> Option<(String, String)> {
        let id = qe_shared::random::text::<32>();
        let csrf = qe_shared::random::text::<16>();
        let session = Session {
            grant,
            account: account.map(str::to_string),
            csrf: csrf.clone(),
            last_seen: now,
        };
        let mut all = self.by_hash.lock().expect("never poisoned");
        all.retain(|_, session| now.duration_since(session.last_seen) < IDLE_AT_MOST);
        let own = |s: &Session| s.account.as_deref() == account;
        while all.values().filter(|s| own(s)).count() >= at_most.max(1) {
            let idlest = all
                .iter()
                .filter(|(_, s)| own(s))
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(hash, _)| *hash);
            match idlest {
                Some(hash) => all.remove(&hash),
                None => break,
            };
        }
        if all.len() >= SESSIONS_AT_MOST {
            return None;
        }
        all.insert(hash_of(&id), session);
        Some((id, csrf))
    }

    /// The session `id` names, if it is open; a request through it counts as use.
    pub fn find(&self, id: &str) -> Option<Found> {
        self.find_at(id, Instant::now())
    }

    fn find_at(&self, id: &str, now: Instant) -> Option<Found> {
        let hash = hash_of(id);
        let mut all = self.by_hash.lock().expect("never poisoned");
        let session = all.get_mut(&hash)?;
        if now.duration_since(session.last_seen) >= IDLE_AT_MOST {
            all.remove(&hash);
            return None;
        }
        session.last_seen = now;
        Some(Found {
            grant: session.grant.clone(),
            csrf: session.csrf.clone(),
        })
    }

    /// Ends session `id` (a sign-out); the cookie no longer works anywhere.
    pub fn close(&self, id: &str) {
        self.by_hash
            .lock()
            .expect("never poisoned")
            .remove(&hash_of(id));
    }

    /// The session id a request's cookies carry, if any.
    pub fn id_in<'a>(&self, headers: &'a axum::http::HeaderMap) -> Option<&'a str> {
        let name = self.cookie_name();
        headers
            .get_all(axum::http::header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|cookies| cookies.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(key, value)| *key == name && !value.is_empty())
            .map(|(_, value)| value)
    }

    /// The `Set-Cookie` value that gives the browser session `id`.
    pub fn cookie(&self, id: &str) -> String {
        format!("{}={id}; {}", self.cookie_name(), self.attributes())
    }

    /// The `Set-Cookie` value that has the browser forget its session cookie.
    pub fn expired_cookie(&self) -> String {
        format!("{}=; Max-Age=0; {}", self.cookie_name(), self.attributes())
    }

    /// No Max-Age on a live one: it ends with the browser, or the server's idle limit first.
    fn attributes(&self) -> &'static str {
        match self.secure {
            true => "Path=/; HttpOnly; SameSite=Strict; Secure",
            false => "Path=/; HttpOnly; SameSite=Strict",
        }
    }
}

fn hash_of(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// The refusal of a change made with a session cookie but without its CSRF token.
pub fn csrf_refused() -> ApiError {
    ApiError::Forbidden("a change made from the console needs its X-CSRF-Token header".into())
}

/// Whether a method may change something (it then needs the CSRF token).
pub fn is_change(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderMap, HeaderValue};

    #[test]
    fn a_session_is_found_by_its_id_until_it_is_idle_too_long_or_closed() {
        let sessions = Sessions::new(false);
        let start = Instant::now();
        let (id, csrf) = sessions
            .open_at(Grant::Key("k1".into()), Some("a1"), 5, start)
            .unwrap();
        assert_eq!(id.len(), 43, "256 bits, base64url");
        assert_eq!(csrf.len(), 22, "128 bits, base64url");
        assert!(sessions.find_at("not-an-id", start).is_none());
        let later = start + IDLE_AT_MOST - Duration::from_secs(1);
        let found = sessions.find_at(&id, later).unwrap();
        assert_eq!(found.grant, Grant::Key("k1".into()));
        assert!(found.csrf_matches(Some(&csrf)));
        assert!(!found.csrf_matches(Some("wrong")));
        assert!(!found.csrf_matches(None));
        // Used just now: idle counts from its last use.
        assert!(sessions.find_at(&id, later + IDLE_AT_MOST / 2).is_some());
        let idle = later + IDLE_AT_MOST / 2 + IDLE_AT_MOST;
        assert!(sessions.find_at(&id, idle).is_none());
        let (id, _) = sessions.open(Grant::Operator, None, 5).unwrap();
        sessions.close(&id);
        assert!(sessions.find(&id).is_none());
    }

    #[test]
    fn an_account_signing_in_in_a_loop_ends_only_its_own_sessions() {
        let sessions = Sessions::new(false);
        let start = Instant::now();
        let other = sessions
            .open_at(Grant::Key("b-key".into()), Some("b"), 2, start)
            .unwrap();
        let mut own = Vec::new();
        for n in 0..10 {
            let at = start + Duration::from_secs(n);
            let (id, _) = sessions
                .open_at(Grant::Key("a-key".into()), Some("a"), 3, at)
                .unwrap();
            own.push(id);
        }
        let now = start + Duration::from_secs(10);
        let open: Vec<bool> = own
            .iter()
            .map(|id| sessions.find_at(id, now).is_some())
            .collect();
        assert_eq!(
            open.iter().filter(|open| **open).count(),
            3,
            "its latest three"
        );
        assert!(open[7] && open[8] && open[9], "{open:?}");
        assert!(sessions.find_at(&other.0, now).is_some(), "another's stays");
    }

    #[test]
    fn the_cookie_is_read_among_others_and_secure_over_tls() {
        let plain = Sessions::new(false);
        let mut headers = HeaderMap::new();
        let cookies = HeaderValue::from_static("a=1; qe_session=abc; b=2");
        headers.insert(header::COOKIE, cookies);
        assert_eq!(plain.id_in(&headers), Some("abc"));
        assert_eq!(
            plain.cookie("abc"),
            "qe_session=abc; Path=/; HttpOnly; SameSite=Strict"
        );
        let tls = Sessions::new(true);
        assert_eq!(tls.id_in(&headers), None);
        assert!(tls.cookie("x").starts_with("__Host-qe_session=x;"));
        assert!(tls.cookie("x").ends_with("; Secure"));
    }
}
