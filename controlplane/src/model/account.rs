//! Customers: an account owns queues and API keys of its own, and is billed for its queues.
//!
//! An API key is `qek_KEYID_SECRET`. The key id is public (lists and the audit log name it);
//! the secret is 192 random bits, shown once when the key is made and kept only as its
//! SHA-256. A presented key is found by its id (one read of `api-keys/KEYID`, however many
//! keys there are) and its secret's hash compared in constant time. A slow password hash is
//! not needed: nobody can guess 192 random bits, so a fast one guards them as well.

use crate::model::queue::Tier;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Reads only: any request that would change something is refused (403).
    ReadOnly,
    /// Everything the account may do.
    Full,
}

/// What an account may have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Queues at most, counting every queue not yet deleted.
    #[serde(default = "default_max_queues")]
    pub max_queues: u32,
    /// The tiers its queues may have.
    #[serde(default = "every_tier")]
    pub tiers: Vec<Tier>,
    /// API keys at most, revoked ones included until they are let go (a key made past it is
    /// refused with `limit_reached`; making one drops the account's revoked keys first).
    #[serde(default = "default_max_api_keys")]
    pub max_api_keys: u32,
    /// Console sessions open at once: signing in past it ends the account's own session
    /// idle longest, never another account's.
    #[serde(default = "default_max_console_sessions")]
    pub max_console_sessions: u32,
    /// Requests per second of each of its API keys, at each replica, with a burst of twice
    /// that: past it, `429 too_many_requests` with `Retry-After`.
    #[serde(default = "default_api_requests_per_second")]
    pub api_requests_per_second: u32,
    /// Its own SQS access keys at most (the control plane's SQS endpoint), revoked ones
    /// included: one more is refused with `limit_reached`.
    #[serde(default = "default_max_sqs_keys")]
    pub max_sqs_keys: u32,
    /// Audit entries of its changes kept at most: the oldest past it go within the hour
    /// (`rollup.rs`), as those older than `audit_keep_days` do. 0 keeps them all.
    #[serde(default = "default_max_audit_entries")]
    pub max_audit_entries: u64,
}

fn default_max_sqs_keys() -> u32 {
    crate::model::queue::MAX_SQS_KEYS as u32
}

fn default_max_audit_entries() -> u64 {
    100_000
}

fn default_max_api_keys() -> u32 {
    20
}

fn default_max_console_sessions() -> u32 {
    20
}

fn default_api_requests_per_second() -> u32 {
    50
}

fn default_max_queues() -> u32 {
    10
}

fn every_tier() -> Vec<Tier> {
    vec![Tier::Devtest, Tier::Standard]
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_queues: default_max_queues(),
            tiers: every_tier(),
            max_api_keys: default_max_api_keys(),
            max_console_sessions: default_max_console_sessions(),
            api_requests_per_second: default_api_requests_per_second(),
            max_sqs_keys: default_max_sqs_keys(),
            max_audit_entries: default_max_audit_entries(),
        }
    }
}

/// An account's record, as stored at `accounts/ID`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Account {
    /// Lowercase letters and digits, starting with `a`.
    pub id: String,
    /// The customer's name, for people.
    pub name: String,
    /// Seconds since 1970.
    pub created: u64,
    pub limits: Limits,
    /// The queues made for it and not yet deleted, by id, with when each was reserved: a
    /// queue is reserved here (a compare-and-swap of this record) before its record is
    /// made, so two creates at once, on two replicas too, cannot pass the limit.
    #[serde(default)]
    pub queues: std::collections::BTreeMap<String, u64>,
    /// Its queues' names, each with its queue's id: taken in the same compare-and-swap as
    /// the place, so a name is one queue's in the account; a deleted queue's is free again.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub names: std::collections::BTreeMap<String, String>,
    /// Its SQS access keys (the control plane's SQS endpoint, docs/sqs.md), revoked ones
    /// too. Their secrets are not kept: each is derived from the cluster's node secret
    /// ([`crate::nodes::NodeTokens::account_sqs_secret`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sqs_keys: Vec<crate::model::queue::SqsKeyRecord>,
}

/// How long a reservation may wait for its queue's record before it counts as a create that
/// never finished (the replica stopped between the two writes) and is dropped.
pub const RESERVATION_EXPIRES_SECS: u64 = 60;

/// The operator's request for an account.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewAccount {
    pub name: String,
    #[serde(default)]
    pub limits: Option<Limits>,
}

/// A change to an account: its name, its limits, or both.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountChange {
    pub name: Option<String>,
    pub limits: Option<Limits>,
}

/// Names are for people: printable, short.
pub fn check_name(name: &str) -> Result<(), String> {
    let fine = !name.trim().is_empty() && name.len() <= 128 && !name.chars().any(char::is_control);
    match fine {
        true => Ok(()),
        false => Err(format!(
            "name {name:?}: 1 to 128 bytes, not blank, no control characters"
        )),
    }
}

pub fn check_limits(limits: &Limits) -> Result<(), String> {
    if limits.tiers.is_empty() {
        return Err("limits.tiers: at least one tier".into());
    }
    if limits.api_requests_per_second == 0 {
        return Err("limits.api_requests_per_second: at least 1".into());
    }
    Ok(())
}

pub fn create(new: NewAccount) -> Account {
    Account {
        id: format!("a{}", qe_shared::random::label(ACCOUNT_ID_LEN - 1)),
        name: new.name,
        created: crate::unix_now(),
        limits: new.limits.unwrap_or_default(),
        queues: Default::default(),
        names: Default::default(),
        sqs_keys: Vec::new(),
    }
}

/// A new SQS access key id of account `account_id`: `QE`, the account's id in capitals (so
/// the key's account is read from it: one store read per request), six random characters.
pub fn new_sqs_key_id(account_id: &str) -> String {
    let tail = qe_shared::random::label(6).to_ascii_uppercase();
    format!("QE{}{tail}", account_id.to_ascii_uppercase())
}

/// The account an SQS access key id is of ([`new_sqs_key_id`]), if it reads as one.
pub fn account_of_sqs_key(access_key_id: &str) -> Option<String> {
    let rest = access_key_id.strip_prefix("QE")?;
    let account = rest.get(..ACCOUNT_ID_LEN)?;
    let fine = rest.len() == ACCOUNT_ID_LEN + 6
        && account.starts_with('A')
        && rest
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
    fine.then(|| account.to_ascii_lowercase())
}

/// An account id's length: `a` and eleven letters and digits.
const ACCOUNT_ID_LEN: usize = 12;

/// An API key's record, as stored at `api-keys/KEYID`: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: String,
    pub account: String,
    #[serde(default)]
    pub name: Option<String>,
    pub scope: Scope,
    /// SHA-256 of the secret, hex.
    pub secret_sha256: String,
    pub created: u64,
    /// Refused from this moment on (seconds since 1970).
    #[serde(default)]
    pub expires: Option<u64>,
    /// When it was revoked.
    #[serde(default)]
    pub revoked: Option<u64>,
}

impl ApiKey {
    /// Whether it lets a request in at `now`.
    pub fn is_valid_at(&self, now: u64) -> bool {
        self.revoked.is_none() && self.expires.is_none_or(|expires| now < expires)
    }
}

/// The request for a new key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    #[serde(default)]
    pub name: Option<String>,
    pub scope: Scope,
    /// Refused after this many seconds (none: it never expires).
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
}

/// The longest life a key may be given: ten years.
const KEY_LIFE_AT_MOST_SECS: u64 = 10 * 365 * 86_400;

/// Makes a key for `account`; returns its record and the token, shown only now.
pub fn issue_key(account: &str, new: NewKey) -> Result<(ApiKey, String), String> {
    if let Some(name) = &new.name {
        check_name(name)?;
    }
    let now = crate::unix_now();
    let expires = match new.expires_in_secs {
        Some(0) => return Err("expires_in_secs: at least 1".into()),
        Some(secs) if secs > KEY_LIFE_AT_MOST_SECS => {
            return Err(format!("expires_in_secs: at most {KEY_LIFE_AT_MOST_SECS}"))
        }
        Some(secs) => Some(now + secs),
        None => None,
    };
    let id = qe_shared::random::label(16);
    let secret = qe_shared::random::text::<24>();
    let key = ApiKey {
        id: id.clone(),
        account: account.to_string(),
        name: new.name,
        scope: new.scope,
        secret_sha256: sha256_hex(&secret),
        created: now,
        expires,
        revoked: None,
    };
    Ok((key, format!("{TOKEN_PREFIX}{id}_{secret}")))
}

/// What every API key starts with, so that a key is told from the operator's token at once
/// (and secret scanners can find a leaked one).
pub const TOKEN_PREFIX: &str = "qek_";

/// The key id and secret of a presented API key, if it has the form of one.
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let id_fine = id.len() == 16 && id.bytes().all(|b| b.is_ascii_alphanumeric());
    (id_fine && !secret.is_empty()).then_some((id, secret))
}

/// Whether `secret` is the one `key` was made with, compared in constant time.
pub fn secret_matches(key: &ApiKey, secret: &str) -> bool {
    sha256_hex(secret)
        .as_bytes()
        .ct_eq(key.secret_sha256.as_bytes())
        .into()
}

fn sha256_hex(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_kept_as_a_hash_and_its_token_reads_back() {
        let new = NewKey {
            name: Some("ci".into()),
            scope: Scope::ReadOnly,
            expires_in_secs: Some(60),
        };
        let (key, token) = issue_key("aabc", new).unwrap();
        let (id, secret) = parse_token(&token).unwrap();
        assert_eq!(id, key.id);
        assert!(secret_matches(&key, secret));
        assert!(!secret_matches(&key, "guess"));
        let stored = serde_json::to_string(&key).unwrap();
        assert!(!stored.contains(secret), "no secret rests");
        assert!(key.is_valid_at(key.created));
        assert!(!key.is_valid_at(key.created + 60), "expired");
        let revoked = ApiKey {
            revoked: Some(key.created),
            ..key
        };
        assert!(!revoked.is_valid_at(revoked.created));
    }

    #[test]
    fn tokens_of_another_form_are_not_keys() {
        for token in [
            "",
            "qek_",
            "qek_short_x",
            "operator-token",
            "qek_aaaaaaaaaaaaaaaa_",
        ] {
            assert_eq!(parse_token(token), None, "{token:?}");
        }
        assert!(parse_token("qek_aaaaaaaaaaaaaaaa_s").is_some());
    }

    #[test]
    fn limits_default_to_ten_queues_of_any_tier() {
        let limits: Limits = serde_json::from_str("{}").unwrap();
        assert_eq!(limits, Limits::default());
        assert!(check_limits(&Limits {
            tiers: vec![],
            ..Limits::default()
        })
        .is_err());
    }
}
