//! What the standby has heard of the holds shipped to it. A durable delivery on a queue with
//! a standby goes to its subscriber only once the standby has heard who holds it
//! (docs/standby-design.md, section 4): a primary lost a moment after a delivery then leaves
//! that hold on the promoted copy, which keeps the message for the subscriber's session and
//! gives it to nobody else meanwhile. An SQS receive is answered once the standby has heard
//! it, for the same reason.
//!
//! Holds are numbered as they are queued for the standby. The standby answers how many it has
//! applied on its connection, which the primary's end of the connection turns back into the
//! last number it heard ([`HoldsHeard::heard`]). A delivery's [`HoldGate`] opens once the
//! standby has heard its hold, or once no standby that answers holds is in sync: there is
//! then nothing to wait for (and durability 2 is answered 507 meanwhile).
//!
//! Only a queue with a standby in sync pays for this, one standby round trip per delivery,
//! group-committed: the standby answers once for everything it read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

#[derive(Default)]
pub struct HoldsHeard {
    /// The number given to the last hold queued for a standby.
    numbered: AtomicU64,
    /// The standby has applied every hold up to this number.
    heard: AtomicU64,
    /// A standby in sync that answers holds is attached: deliveries wait for it.
    waited_for: AtomicBool,
    waiters: Mutex<Waiters>,
}

/// The connections whose next delivery waits, each with the number it waits for.
#[derive(Default)]
struct Waiters {
    list: Vec<(u64, Waker)>,
    /// Moves on whenever every waiter is woken because there is no standby to wait for: a
    /// gate still closed after that (a standby in sync again) registers anew.
    round: u64,
}

impl HoldsHeard {
    /// The number of a hold about to be queued. The caller holds the holds' follower's lock,
    /// so numbers go on the standby's queue in their order.
    pub(crate) fn number_next(&self) -> u64 {
        self.numbered.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The gate of the hold numbered `number`; None when no standby is waited for.
    pub(crate) fn gate(self: &Arc<Self>, number: u64) -> Option<HoldGate> {
        self.waited_for.load(Ordering::SeqCst).then(|| HoldGate {
            number,
            heard: self.clone(),
            registered_in: None,
        })
    }

    /// The standby has applied every hold up to `number`.
    pub fn heard(&self, number: u64) {
        if self.heard.fetch_max(number, Ordering::SeqCst) >= number {
            return;
        }
        let mut waiters = self.lock();
        let mut woken = Vec::new();
        waiters.list.retain(|(waits_for, waker)| {
            let open = *waits_for <= number;
            if open {
                woken.push(waker.clone());
            }
            !open
        });
        drop(waiters);
        woken.into_iter().for_each(Waker::wake);
    }

    /// Whether deliveries wait for the standby (one that answers holds is in sync) or not
    /// (none is, or it went away: every gate opens).
    pub fn wait_for_standby(&self, wait: bool) {
        self.waited_for.store(wait, Ordering::SeqCst);
        if wait {
            return;
        }
        let mut waiters = self.lock();
        waiters.round += 1;
        let woken = std::mem::take(&mut waiters.list);
        drop(waiters);
        woken.into_iter().for_each(|(_, waker)| waker.wake());
    }

    fn opens(&self, number: u64) -> bool {
        !self.waited_for.load(Ordering::SeqCst) || self.heard.load(Ordering::SeqCst) >= number
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.waiters.lock().expect("never poisoned")
    }
}

/// What a delivery of a durable message waits for before it is written: the standby has heard
/// who holds the message.
pub struct HoldGate {
    number: u64,
    heard: Arc<HoldsHeard>,
    /// The round of waiters this gate's waker is in, if any.
    registered_in: Option<u64>,
}

/// A copy waits for the same hold, and registers for itself.
impl Clone for HoldGate {
    fn clone(&self) -> HoldGate {
        HoldGate {
            number: self.number,
            heard: self.heard.clone(),
            registered_in: None,
        }
    }
}

impl std::fmt::Debug for HoldGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldGate")
            .field("number", &self.number)
            .finish_non_exhaustive()
    }
}

impl HoldGate {
    /// Of two gates, the one that opens last.
    pub fn later(self, other: HoldGate) -> HoldGate {
        match self.number >= other.number {
            true => self,
            false => other,
        }
    }

    /// Ready once open; else the task is woken when it may be. Polled again while closed, it
    /// registers no second time.
    pub fn poll_open(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.heard.opens(self.number) {
            return Poll::Ready(());
        }
        let mut waiters = self.heard.lock();
        // Looked at again under the lock: `heard` moves the number before it takes it.
        if self.heard.opens(self.number) {
            return Poll::Ready(());
        }
        if self.registered_in != Some(waiters.round) {
            waiters.list.push((self.number, cx.waker().clone()));
            self.registered_in = Some(waiters.round);
        }
        Poll::Pending
    }

    pub async fn open(mut self) {
        std::future::poll_fn(|cx| self.poll_open(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker_ref;

    fn poll(gate: &mut HoldGate) -> bool {
        gate.poll_open(&mut Context::from_waker(noop_waker_ref()))
            .is_ready()
    }

    #[test]
    fn a_gate_opens_once_the_standby_heard_its_hold() {
        let heard = Arc::new(HoldsHeard::default());
        heard.wait_for_standby(true);
        let mut first = heard.gate(heard.number_next()).expect("waited for");
        let mut second = heard.gate(heard.number_next()).expect("waited for");
        assert!(!poll(&mut first));
        assert!(!poll(&mut first), "polled twice: registered once");
        assert_eq!(heard.lock().list.len(), 1);
        heard.heard(1);
        assert!(poll(&mut first));
        assert!(!poll(&mut second));
        assert!(heard.lock().list.len() == 1, "the first's waker is gone");
        heard.heard(2);
        assert!(poll(&mut second));
        assert!(heard.lock().list.is_empty());
    }

    #[test]
    fn every_gate_opens_when_no_standby_is_waited_for() {
        let heard = Arc::new(HoldsHeard::default());
        assert!(heard.gate(heard.number_next()).is_none(), "no standby");
        heard.wait_for_standby(true);
        let mut gate = heard.gate(heard.number_next()).expect("waited for");
        assert!(!poll(&mut gate));
        heard.wait_for_standby(false);
        assert!(poll(&mut gate));
        assert!(heard.lock().list.is_empty());
        // In sync again before the gate was polled: it waits, and registers anew.
        heard.wait_for_standby(true);
        assert!(!poll(&mut gate));
        assert_eq!(heard.lock().list.len(), 1);
        heard.heard(2);
        assert!(poll(&mut gate));
    }
}
