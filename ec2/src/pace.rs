//! Mutating calls paced under EC2's request rate limits. EC2 meters requests per account and
//! region in token buckets (its "request throttling" page: `RunInstances` a bucket of 1,000
//! refilled at 2 a second, other changes such as `AttachVolume` or `CreateVolume` 200 at 5 a
//! second) and answers `RequestLimitExceeded` past them. A fleet that mends many queues at once
//! (a zone's instances lost together) would otherwise spend the bucket in a burst and then be
//! throttled for every queue, the operator's own calls included. Each region's mutating calls
//! here wait for a token of a smaller bucket, so a burst stays well inside EC2's and the rate
//! stays under its refill; a throttled call is still retried by the SDK (adaptive mode:
//! backoff with jitter, and its own rate limit once throttled; `lib.rs`).

use std::sync::Mutex;
use tokio::time::{Duration, Instant};

/// `RunInstances` calls: a burst of 50, then 1.5 a second (EC2: 1,000, then 2).
pub const LAUNCHES: (f64, f64) = (50.0, 1.5);
/// Every other change: a burst of 100, then 4 a second (EC2: 200, then 5).
pub const CHANGES: (f64, f64) = (100.0, 4.0);

/// A token bucket: `capacity` tokens, refilled at `per_sec`; a call takes one, waiting for it
/// when there is none (its turn is reserved at once, so callers are served in order).
#[derive(Debug)]
pub struct Bucket {
    capacity: f64,
    per_sec: f64,
    /// Tokens (below zero: reserved by callers waiting) as of the instant.
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new((capacity, per_sec): (f64, f64)) -> Bucket {
        Bucket {
            capacity,
            per_sec,
            state: Mutex::new((capacity, Instant::now())),
        }
    }

    /// Waits for a token.
    pub async fn take(&self) {
        let wait = {
            let mut state = self.state.lock().expect("never poisoned");
            let now = Instant::now();
            let (tokens, then) = *state;
            let refilled = now.saturating_duration_since(then).as_secs_f64() * self.per_sec;
            let tokens = (tokens + refilled).min(self.capacity) - 1.0;
            *state = (tokens, now);
            match tokens < 0.0 {
                true => Duration::from_secs_f64(-tokens / self.per_sec),
                false => Duration::ZERO,
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// One region's buckets.
#[derive(Debug)]
pub struct Pacing {
    pub launches: Bucket,
    pub changes: Bucket,
}

impl Default for Pacing {
    fn default() -> Pacing {
        Pacing {
            launches: Bucket::new(LAUNCHES),
            changes: Bucket::new(CHANGES),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_served_at_once_and_the_rest_at_the_refill_rate() {
        let bucket = Bucket::new((3.0, 2.0));
        let start = Instant::now();
        for _ in 0..3 {
            bucket.take().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst");
        bucket.take().await;
        assert_eq!(start.elapsed(), Duration::from_millis(500));
        bucket.take().await;
        assert_eq!(start.elapsed(), Duration::from_millis(1000));
        // Refilled while idle, up to its capacity only.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let idle = Instant::now();
        for _ in 0..4 {
            bucket.take().await;
        }
        assert_eq!(idle.elapsed(), Duration::from_millis(500));
    }
}
