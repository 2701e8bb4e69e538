//! How long the log's rounds take, for the bench (`getlogrounds`, README "Beyond the
//! manual"): a write, from its batch's first record to the end of its `write`; a sync, from
//! the first request it answers to the end of its `fdatasync` (a request that finds
//! everything synced already is answered at once and not counted). Counted in powers of two of
//! microseconds with one atomic add per round (a round serves many requests), never per
//! record. A lost wake-up or a slow disk shows as rounds in the high buckets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bucket k counts rounds under 2^k µs; the last one also counts every longer round
/// (2^23 µs is 8.4 s).
pub const BUCKETS: usize = 24;

/// Rounds counted by how long they took.
#[derive(Default)]
pub struct Histogram([AtomicU64; BUCKETS]);

impl Histogram {
    pub fn add(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        // The number of bits `micros` needs: under 2^k µs for the smallest such k.
        let bucket = (u64::BITS - micros.leading_zeros()) as usize;
        self.0[bucket.min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts since start, bucket by bucket.
    pub fn counts(&self) -> [u64; BUCKETS] {
        std::array::from_fn(|k| self.0[k].load(Ordering::Relaxed))
    }
}

/// The log's two kinds of round.
#[derive(Default)]
pub struct Rounds {
    /// Batches of records written.
    pub write: Histogram,
    /// Syncs asked for and done.
    pub sync: Histogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_lands_in_the_first_bucket_whose_bound_is_above_it() {
        let rounds = Histogram::default();
        for micros in [0, 1, 2, 3, 4, 1_000, 1 << 22, u64::MAX / 2] {
            rounds.add(Duration::from_micros(micros));
        }
        let counts = rounds.counts();
        // 0 µs: under 1; 1: under 2; 2 and 3: under 4; 4: under 8; 1,000: under 1,024;
        // 2^22: under 2^23; the longest: the last bucket.
        let expected: Vec<(usize, u64)> = vec![(0, 1), (1, 1), (2, 2), (3, 1), (10, 1), (23, 2)];
        let found: Vec<(usize, u64)> = (0..BUCKETS)
            .filter(|&k| counts[k] > 0)
            .map(|k| (k, counts[k]))
            .collect();
        assert_eq!(found, expected);
    }
}
