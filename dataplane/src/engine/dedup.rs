//! Deduplication ids (README, "Exactly-once publish"): a publish that carries one (`dedupid`
//! over WebSocket, `MessageDeduplicationId` over SQS) makes a message only if no message with
//! the same id was published within the window before; a repeat is answered as the first
//! was (its message id, once the first's record is as safe as its durability), and makes
//! nothing. A publisher that sends again after a dropped connection, not knowing whether its
//! publish was taken, so makes one message.
//!
//! An id is kept as the first 16 bytes of its SHA-256 (a collision of two ids within a window
//! is as likely as a guess of a random 128-bit number). The ids are in memory, each counting
//! [`ENTRY_BYTES`] against `max-messages-memory` until its window ends; a durable message's
//! id is also in its first log record, whose segment the log keeps until the window ends, so
//! a restart within the window still knows it.

use crate::message::ids::MessageId;
use crate::message::Durability;
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};

/// How long a deduplication id holds: five minutes, as Amazon SQS's.
pub const WINDOW_MS: u64 = 5 * 60 * 1000;

/// What one id held costs in memory, at most: its hash-map slot (key, message id, window end,
/// LSN, durability: about 65 bytes, twice that just after the table grows) and its place in
/// the by-time set (about 56). Measured with a million ids held (`bench dedup`,
/// docs/performance.md): 131 B an id before the table grows, 192 B after.
pub const ENTRY_BYTES: u64 = 200;

/// The message a deduplication id made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Made {
    pub id: MessageId,
    /// When the window ends (ms since 1970).
    pub until_ms: u64,
    /// Where its first record ends in the log (0: safe already, or not written).
    pub lsn: u64,
    pub durability: Durability,
}

/// The ids whose windows have not ended.
#[derive(Debug, Default)]
pub struct Dedup {
    by_key: HashMap<u128, Made>,
    /// (window end, key): the order they end in.
    by_end: BTreeSet<(u64, u128)>,
}

/// The key a deduplication id is kept by.
pub fn key_of(dedup_id: &str) -> u128 {
    let hash = Sha256::digest(dedup_id.as_bytes());
    u128::from_le_bytes(hash[..16].try_into().expect("16 of SHA-256's 32 bytes"))
}

impl Dedup {
    /// The message `key` made, if its window has not ended at `now_ms`.
    pub fn made(&self, key: u128, now_ms: u64) -> Option<Made> {
        self.by_key
            .get(&key)
            .filter(|made| made.until_ms > now_ms)
            .copied()
    }

    /// Keeps `key` as having made `made` (a key seen again after its window replaces it).
    pub fn insert(&mut self, key: u128, made: Made) {
        if let Some(old) = self.by_key.insert(key, made) {
            self.by_end.remove(&(old.until_ms, key));
        }
        self.by_end.insert((made.until_ms, key));
    }

    /// Forgets the ids whose windows ended by `now_ms`; how many.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let mut expired = 0;
        while let Some(&(until_ms, key)) = self.by_end.first() {
            if until_ms > now_ms {
                break;
            }
            self.by_end.pop_first();
            self.by_key.remove(&key);
            expired += 1;
        }
        expired
    }

    /// When the next window ends (ms since 1970).
    pub fn next_end(&self) -> Option<u64> {
        self.by_end.first().map(|&(until_ms, _)| until_ms)
    }

    /// Ids held.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(n: u8, until_ms: u64) -> Made {
        Made {
            id: MessageId(uuid::Uuid::from_bytes([n; 16])),
            until_ms,
            lsn: 0,
            durability: Durability::Eventual,
        }
    }

    #[test]
    fn an_id_holds_for_its_window_and_is_forgotten_after() {
        let mut dedup = Dedup::default();
        let (a, b) = (key_of("order-1"), key_of("order-2"));
        assert_ne!(a, b);
        dedup.insert(a, made(1, 1_000));
        dedup.insert(b, made(2, 2_000));
        assert_eq!(dedup.made(a, 999), Some(made(1, 1_000)));
        assert_eq!(dedup.made(a, 1_000), None, "the window has ended");
        assert_eq!(dedup.expire(1_500), 1);
        assert_eq!(
            (dedup.len(), dedup.made(b, 1_500)),
            (1, Some(made(2, 2_000)))
        );
        // Seen again after its window: a new message, a new window.
        dedup.insert(b, made(3, 5_000));
        assert_eq!(dedup.expire(2_500), 0, "b's old end no longer counts");
        assert_eq!(dedup.made(b, 2_500), Some(made(3, 5_000)));
        assert_eq!(dedup.expire(5_000), 1);
        assert!(dedup.is_empty());
    }
}
