//! When and how often a subscriber connects again after its connection drops.

use qe_shared::backoff::Backoff;
use std::time::Duration;

/// How a subscriber reconnects after its connection drops.
///
/// A distribute subscriber first tries to **resume** its session (the manual's "Resume after
/// a drop"): again and again, `initial_backoff` apart and doubling up to `max_backoff`, while
/// the queue may still hold it (`saved_session_timeout` from the drop, the queue's
/// `saved-session-timeout-secs`). Code 109 can be transient (the queue still sees the old
/// connection, or another resume of it is under way), so it is retried too, up to
/// `resume_attempts` times. If the session cannot be resumed, the subscriber logs in afresh
/// with its capacity and keeps trying, with the same backoff, for as long as the failures are
/// transient (network, the queue's 5xx).
///
/// ```
/// use qe_client::Reconnect;
/// use std::time::Duration;
///
/// // A Dev/test queue keeps a dropped session for an hour.
/// let policy = Reconnect {
///     saved_session_timeout: Duration::from_secs(3600),
///     ..Reconnect::default()
/// };
/// assert_eq!(policy.resume_attempts, 5);
/// assert!(!Reconnect::never().enabled);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconnect {
    /// Whether to reconnect at all; without it, a dropped connection ends the subscriber's
    /// stream with the error.
    pub enabled: bool,
    /// The wait before the second attempt (the first is at once). Default 100 ms.
    pub initial_backoff: Duration,
    /// The longest wait between attempts. Default 5 s.
    pub max_backoff: Duration,
    /// How long the queue keeps a dropped session (its `saved-session-timeout-secs`): resumes
    /// are tried only that long after the drop. Default 10 s, the manual's default.
    pub saved_session_timeout: Duration,
    /// How many 109 answers to take before giving up on the session. Default 5.
    pub resume_attempts: u32,
}

impl Default for Reconnect {
    fn default() -> Reconnect {
        Reconnect {
            enabled: true,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            saved_session_timeout: Duration::from_secs(10),
            resume_attempts: 5,
        }
    }
}

impl Reconnect {
    /// No reconnection: a drop ends the subscriber.
    pub fn never() -> Reconnect {
        Reconnect {
            enabled: false,
            ..Reconnect::default()
        }
    }

    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(self.initial_backoff, self.max_backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap() {
        let policy = Reconnect {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
            ..Reconnect::default()
        };
        let mut backoff = policy.backoff();
        let waits: Vec<u128> = (0..5).map(|_| backoff.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 500, 500]);
    }
}
