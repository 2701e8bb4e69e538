//! Waiting longer after each failure: the one backoff of both planes and the client library.

use std::time::Duration;

/// Waits that double from `first` up to `most`: [`Backoff::next_wait`] after each failure,
/// [`Backoff::reset`] after a success.
///
/// ```
/// use qe_shared::backoff::Backoff;
/// use std::time::Duration;
/// let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
/// let waits: Vec<u128> = (0..4).map(|_| backoff.next_wait().as_millis()).collect();
/// assert_eq!(waits, [100, 200, 300, 300]);
/// backoff.reset();
/// assert_eq!(backoff.next_wait(), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    most: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits from `first` up to `most` (a `first` over `most` waits `most`).
    pub fn new(first: Duration, most: Duration) -> Backoff {
        Backoff {
            first: first.min(most),
            most,
            next: first.min(most),
        }
    }

    /// The wait before the next try; the one after it is twice as long, up to the most.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (wait * 2).min(self.most);
        wait
    }

    /// A success: the next wait is the first again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}
