//! Who may hold a connection.
//!
//! `max-tasks` counts logged-in connections: a connection takes one of its slots when its
//! login succeeds, and a connection that arrives while they are all taken is closed at once,
//! with nothing sent (the manual's rule). Before its login a connection holds a slot of a
//! budget of its own, and at most a few dozen of those come from one source (an IPv4
//! address, an IPv6 /64), so a flood of idle unauthenticated sockets from one host cannot keep
//! the slots, or the logged-in ones, from anyone else. A pre-login connection lasts at most
//! `no-reply-timeout-secs`, and before its login it may send a frame of
//! [`PRE_LOGIN_FRAME_BYTES`] at most, unless it takes the bytes of a bigger one (a publish in
//! the login) from a pool all connections share ([`Admission::big_logins`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The biggest frame a connection may send before its login without taking bytes from the
/// shared pool: a login needs well under 1 KiB (a 128-byte name and password, a 256-byte
/// context, a session id), and JSON escapes may make that a few times longer.
pub const PRE_LOGIN_FRAME_BYTES: usize = 4096;

/// Bytes all connections together may use for login frames bigger than
/// [`PRE_LOGIN_FRAME_BYTES`] at one moment.
pub const BIG_LOGIN_POOL_BYTES: usize = 16 << 20;

/// Most connections from one source that may be waiting for their login at once: enough for
/// a fleet behind one NAT address starting together, few enough that a quarter of the budget
/// takes sixty hosts.
const MAX_PRE_LOGIN_PER_SOURCE: usize = 64;

/// The least pre-login budget, whatever `max-tasks` (Dev/test's is 100).
const MIN_PRE_LOGIN: usize = 128;

pub struct Admission {
    /// One permit per logged-in connection: `max-tasks` of them.
    sessions: Arc<Semaphore>,
    /// One permit per connection that has not logged in yet.
    pre_login: Arc<Semaphore>,
    /// Connections that have not logged in yet, by source ([`qe_serve::source_of`]: an IPv4
    /// address, or the /64 an IPv6 address is in, one host's share of a network).
    waiting_by_source: Mutex<HashMap<IpAddr, usize>>,
    max_per_source: usize,
    /// Bytes for login frames bigger than [`PRE_LOGIN_FRAME_BYTES`].
    pub big_logins: Arc<Semaphore>,
}

/// The budgets, for `max_tasks` logged-in connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    pub max_tasks: usize,
    /// Connections that may wait for their login at once: a quarter of `max_tasks`, and 128
    /// at least.
    pub pre_login: usize,
    /// Of those, from one source: half of them, and 64 at most.
    pub per_source: usize,
}

impl Budgets {
    pub fn for_max_tasks(max_tasks: u64) -> Budgets {
        let max_tasks = max_tasks as usize;
        let pre_login = (max_tasks / 4).max(MIN_PRE_LOGIN);
        Budgets {
            max_tasks,
            pre_login,
            per_source: (pre_login / 2).clamp(1, MAX_PRE_LOGIN_PER_SOURCE),
        }
    }
}

impl Admission {
    pub fn new(budgets: Budgets) -> Arc<Admission> {
        Arc::new(Admission {
            sessions: Arc::new(Semaphore::new(budgets.max_tasks)),
            pre_login: Arc::new(Semaphore::new(budgets.pre_login)),
            waiting_by_source: Mutex::default(),
            max_per_source: budgets.per_source,
            big_logins: Arc::new(Semaphore::new(BIG_LOGIN_POOL_BYTES)),
        })
    }

    /// A slot for a connection from `peer` that has just been accepted, or `None`: every
    /// logged-in slot is taken, or the pre-login budget or `peer`'s share of it is.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<PreLogin> {
        if self.sessions.available_permits() == 0 {
            return None;
        }
        let permit = self.pre_login.clone().try_acquire_owned().ok()?;
        let source = qe_serve::source_of(peer);
        let mut waiting = self.lock();
        let count = waiting.entry(source).or_default();
        if *count >= self.max_per_source {
            return None;
        }
        *count += 1;
        Some(PreLogin {
            admission: self.clone(),
            source,
            _permit: permit,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.waiting_by_source
            .lock()
            .expect("the admission lock is never poisoned")
    }
}

/// A connection that has not logged in yet. Dropped, it gives back its pre-login slot.
pub struct PreLogin {
    admission: Arc<Admission>,
    source: IpAddr,
    _permit: OwnedSemaphorePermit,
}

/// A logged-in connection's slot among `max-tasks`.
pub struct Session {
    _permit: OwnedSemaphorePermit,
}

impl PreLogin {
    /// The login succeeded: a logged-in slot in place of this one, or `None` if the last
    /// one went to another connection meanwhile (then this one closes, as one arriving with
    /// every slot in use does).
    pub fn logged_in(self) -> Option<Session> {
        let permit = self.admission.sessions.clone().try_acquire_owned().ok()?;
        Some(Session { _permit: permit })
    }
}

impl Drop for PreLogin {
    fn drop(&mut self) {
        let mut waiting = self.admission.lock();
        if let Some(count) = waiting.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn one_source_cannot_take_every_pre_login_slot() {
        let admission = Admission::new(Budgets {
            max_tasks: 100,
            pre_login: 4,
            per_source: 2,
        });
        let a1 = admission.admit(ip("10.0.0.1")).unwrap();
        let _a2 = admission.admit(ip("10.0.0.1")).unwrap();
        assert!(admission.admit(ip("10.0.0.1")).is_none(), "its share is 2");
        assert!(
            admission.admit(ip("::ffff:10.0.0.1")).is_none(),
            "the same host over IPv6"
        );
        let _b = admission.admit(ip("10.0.0.2")).unwrap();
        drop(a1);
        let _a3 = admission.admit(ip("10.0.0.1")).unwrap();
        let _c = admission.admit(ip("10.0.0.3")).unwrap();
        assert!(
            admission.admit(ip("10.0.0.4")).is_none(),
            "4 wait: all of them"
        );
    }

    #[test]
    fn an_ipv6_source_is_its_slash_64() {
        let admission = Admission::new(Budgets {
            max_tasks: 100,
            pre_login: 8,
            per_source: 1,
        });
        let _one = admission.admit(ip("2001:db8:1:2::1")).unwrap();
        assert!(admission.admit(ip("2001:db8:1:2:ffff::9")).is_none());
        assert!(admission.admit(ip("2001:db8:1:3::1")).is_some());
    }

    #[test]
    fn a_login_takes_a_session_slot_and_gives_back_its_pre_login_one() {
        let admission = Admission::new(Budgets {
            max_tasks: 1,
            pre_login: 2,
            per_source: 2,
        });
        let first = admission.admit(ip("10.0.0.1")).unwrap();
        let second = admission.admit(ip("10.0.0.1")).unwrap();
        let session = first.logged_in().unwrap();
        assert!(second.logged_in().is_none(), "max-tasks is 1");
        assert!(
            admission.admit(ip("10.0.0.2")).is_none(),
            "every logged-in slot is taken: closed at once"
        );
        drop(session);
        assert!(admission.admit(ip("10.0.0.2")).is_some());
    }

    #[test]
    fn the_budgets_follow_max_tasks() {
        let devtest = Budgets::for_max_tasks(100);
        assert_eq!((devtest.pre_login, devtest.per_source), (128, 64));
        let big = Budgets::for_max_tasks(100_000);
        assert_eq!((big.pre_login, big.per_source), (25_000, 64));
        assert_eq!(Budgets::for_max_tasks(1).pre_login, 128);
    }
}
