//! What keeps one caller from costing the others, in this replica's memory:
//!
//! - each API key's requests per second (its account's `api_requests_per_second`, with a
//!   burst of twice that): past it, `429` with `Retry-After`;
//! - console sign-ins per source address and per key id ([`SIGN_INS_PER_MINUTE`] each):
//!   past it, `429`;
//! - key ids the store does not have, remembered for [`UNKNOWN_KEY_FOR`], so a flood of made-up
//!   keys costs no store read after the first of each.
//!
//! Each replica counts for itself (a caller spread over three replicas gets three times the
//! rate); every table is bounded ([`TRACKED_AT_MOST`] entries), forgetting first what has
//! refilled or expired.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Console sign-ins a minute from one source address, and for one key id.
pub const SIGN_INS_PER_MINUTE: f64 = 10.0;

/// How long a key id the store does not have is remembered as unknown.
pub const UNKNOWN_KEY_FOR: Duration = Duration::from_secs(60);

/// Entries a table holds at most.
const TRACKED_AT_MOST: usize = 100_000;

/// Token buckets by name.
#[derive(Default)]
pub struct Buckets {
    by_name: Mutex<HashMap<String, Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Buckets {
    /// Takes one token from `name`'s bucket, which refills at `per_sec` up to `burst`; the
    /// whole seconds to wait when it is empty.
    pub fn take(&self, name: &str, per_sec: f64, burst: f64) -> Result<(), u64> {
        self.take_at(name, per_sec, burst, Instant::now())
    }

    fn take_at(&self, name: &str, per_sec: f64, burst: f64, now: Instant) -> Result<(), u64> {
        let mut all = self.by_name.lock().expect("never poisoned");
        if all.len() >= TRACKED_AT_MOST && !all.contains_key(name) {
            // What has refilled since is as good as new: forgotten.
            all.retain(|_, bucket| {
                bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * per_sec < burst
            });
        }
        let bucket = all.entry(name.to_string()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refilled = now.duration_since(bucket.at).as_secs_f64() * per_sec;
        bucket.tokens = (bucket.tokens + refilled).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - bucket.tokens) / per_sec.max(f64::MIN_POSITIVE);
        Err(wait.ceil().max(1.0) as u64)
    }
}

/// Key ids the store did not have, and when that was found.
#[derive(Default)]
pub struct UnknownKeys {
    found_at: Mutex<HashMap<String, Instant>>,
}

impl UnknownKeys {
    /// Whether `id` was found unknown within [`UNKNOWN_KEY_FOR`].
    pub fn knows_unknown(&self, id: &str) -> bool {
        let found_at = self.found_at.lock().expect("never poisoned");
        found_at
            .get(id)
            .is_some_and(|at| at.elapsed() < UNKNOWN_KEY_FOR)
    }

    /// Remembers that the store has no key `id`.
    pub fn remember(&self, id: &str) {
        let now = Instant::now();
        let mut found_at = self.found_at.lock().expect("never poisoned");
        if found_at.len() >= TRACKED_AT_MOST {
            found_at.retain(|_, at| now.duration_since(*at) < UNKNOWN_KEY_FOR);
            if found_at.len() >= TRACKED_AT_MOST {
                found_at.clear();
            }
        }
        found_at.insert(id.to_string(), now);
    }
}

/// How long an account's request rate is used before its record is read again: a change of
/// the operator's applies within it, and a request costs no second store read.
pub const RATE_KNOWN_FOR: Duration = Duration::from_secs(30);

/// Each account's `api_requests_per_second`, as last read.
#[derive(Default)]
pub struct AccountRates {
    by_account: Mutex<HashMap<String, (u32, Instant)>>,
}

impl AccountRates {
    /// Account `id`'s rate, if read within [`RATE_KNOWN_FOR`].
    pub fn known(&self, id: &str) -> Option<u32> {
        let by_account = self.by_account.lock().expect("never poisoned");
        let (rate, at) = by_account.get(id)?;
        (at.elapsed() < RATE_KNOWN_FOR).then_some(*rate)
    }

    pub fn keep(&self, id: &str, rate: u32) {
        let mut by_account = self.by_account.lock().expect("never poisoned");
        if by_account.len() >= TRACKED_AT_MOST {
            by_account.clear();
        }
        by_account.insert(id.to_string(), (rate, Instant::now()));
    }
}

/// Every per-caller table of a replica (one in `AppState`).
#[derive(Default)]
pub struct CallerLimits {
    pub requests: Buckets,
    pub rates: AccountRates,
    pub sign_ins_by_source: Buckets,
    pub sign_ins_by_key: Buckets,
    pub unknown_keys: UnknownKeys,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_its_burst_through_then_its_rate_and_says_how_long_to_wait() {
        let buckets = Buckets::default();
        let start = Instant::now();
        for _ in 0..4 {
            assert_eq!(buckets.take_at("k", 2.0, 4.0, start), Ok(()));
        }
        assert_eq!(buckets.take_at("k", 2.0, 4.0, start), Err(1));
        assert_eq!(
            buckets.take_at("other", 2.0, 4.0, start),
            Ok(()),
            "its own bucket"
        );
        let later = start + Duration::from_millis(500);
        assert_eq!(
            buckets.take_at("k", 2.0, 4.0, later),
            Ok(()),
            "refilled by one"
        );
        assert_eq!(buckets.take_at("k", 2.0, 4.0, later), Err(1));
        let slow = Buckets::default();
        assert_eq!(slow.take_at("k", 0.1, 1.0, start), Ok(()));
        assert_eq!(slow.take_at("k", 0.1, 1.0, start), Err(10));
    }

    #[test]
    fn an_unknown_key_is_remembered_for_a_while() {
        let unknown = UnknownKeys::default();
        assert!(!unknown.knows_unknown("k1"));
        unknown.remember("k1");
        assert!(unknown.knows_unknown("k1"));
        assert!(!unknown.knows_unknown("k2"));
    }
}
