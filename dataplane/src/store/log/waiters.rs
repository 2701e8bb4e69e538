//! Replies waiting for the log's progress (a [`Ticket`](super::Ticket)), each woken only
//! when the progress has moved past its record. They used to wait on the `progress` watch
//! itself, whose every change (a round written, a sync, a compaction) woke every waiting
//! reply's connection, most of them to find nothing done: at 16 publishers × 1 in flight at
//! durability 2 that was about 12% of the node's CPU per message (docs/performance.md).
//!
//! Why none is lost: the progress changes only in [`Shared::announce`](super::Shared), which
//! then takes this lock and wakes every waiter the new progress may have answered; a waiter
//! looks at the progress and files itself in one hold of the same lock. So a change either
//! came before the look, which sees it, or its wake-up comes after the filing.

use super::Progress;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use tokio::sync::watch;

/// What a reply waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Written,
    Synced,
}

#[derive(Default)]
pub struct Waiters {
    inner: Mutex<Filed>,
}

/// The waiters, by stage, ordered by the LSN each waits for (then by a number of its own).
#[derive(Default)]
struct Filed {
    written: BTreeMap<(u64, u64), Waker>,
    synced: BTreeMap<(u64, u64), Waker>,
    next: u64,
}

impl Filed {
    fn stage(&mut self, stage: Stage) -> &mut BTreeMap<(u64, u64), Waker> {
        match stage {
            Stage::Written => &mut self.written,
            Stage::Synced => &mut self.synced,
        }
    }
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, Filed> {
        self.inner
            .lock()
            .expect("the waiters' lock is never poisoned")
    }

    /// After a change of the progress to `now`: wakes every waiter it may have answered.
    /// Whether it did is for the waiter to say (a durability-2 record synced here may wait
    /// for the standby too): one that is not done files itself again.
    pub fn wake(&self, now: &Progress) {
        // Every wait ends when its record's write or sync failed, or the log broke down.
        let through = |reached: u64| match now.broken {
            true => u64::MAX,
            false => reached.max(now.failed_through),
        };
        let woken = {
            let mut filed = self.lock();
            let mut woken = take_through(&mut filed.written, through(now.written));
            woken.extend(take_through(&mut filed.synced, through(now.synced)));
            woken
        };
        woken.into_iter().for_each(Waker::wake);
    }

    /// How many wait (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let filed = self.lock();
        filed.written.len() + filed.synced.len()
    }
}

/// Takes the waiters of `map` whose LSN is at most `lsn`.
fn take_through(map: &mut BTreeMap<(u64, u64), Waker>, lsn: u64) -> Vec<Waker> {
    let later = match lsn.checked_add(1) {
        Some(next) => map.split_off(&(next, 0)),
        None => BTreeMap::new(),
    };
    std::mem::replace(map, later).into_values().collect()
}

/// Resolves with the progress once `done` says so of it.
pub struct Wait<'a, F> {
    waiters: &'a Waiters,
    progress: &'a watch::Sender<Progress>,
    stage: Stage,
    lsn: u64,
    done: F,
    /// Its number among the waiters, once it has filed itself.
    key: Option<u64>,
}

impl<'a, F: Fn(&Progress) -> bool> Wait<'a, F> {
    /// Waits for `done`, which can only be true once the progress has reached `lsn` at
    /// `stage` (or failed through it, or broken down).
    pub fn new(
        waiters: &'a Waiters,
        progress: &'a watch::Sender<Progress>,
        stage: Stage,
        lsn: u64,
        done: F,
    ) -> Self {
        Wait {
            waiters,
            progress,
            stage,
            lsn,
            done,
            key: None,
        }
    }
}

impl<F: Fn(&Progress) -> bool + Unpin> Future for Wait<'_, F> {
    type Output = Progress;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Progress> {
        // `Wait` holds no pinned field: it moves freely.
        let this = Pin::into_inner(self);
        let mut filed = this.waiters.lock();
        // Copied, so that the watch's lock is not held beside this one.
        let now = *this.progress.borrow();
        if (this.done)(&now) {
            if let Some(key) = this.key.take() {
                filed.stage(this.stage).remove(&(this.lsn, key));
            }
            return Poll::Ready(now);
        }
        let key = *this.key.get_or_insert_with(|| {
            filed.next += 1;
            filed.next
        });
        filed
            .stage(this.stage)
            .insert((this.lsn, key), cx.waker().clone());
        Poll::Pending
    }
}

impl<F> Drop for Wait<'_, F> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            let mut filed = self.waiters.lock();
            filed.stage(self.stage).remove(&(self.lsn, key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Count {
        fn get(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// The log's `announce`, on a progress and waiters of a test's own.
    fn announce(
        progress: &watch::Sender<Progress>,
        waiters: &Waiters,
        change: impl FnOnce(&mut Progress),
    ) {
        progress.send_modify(change);
        let now = *progress.borrow();
        waiters.wake(&now);
    }

    fn poll<F: Fn(&Progress) -> bool + Unpin>(
        wait: &mut Wait<'_, F>,
        count: &Arc<Count>,
    ) -> Poll<Progress> {
        let waker = Waker::from(count.clone());
        Pin::new(wait).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_waiter_is_woken_once_the_progress_reaches_its_record_at_its_stage() {
        let (progress, waiters) = (watch::Sender::new(Progress::default()), Waiters::default());
        let (early, late, written) = (
            Arc::new(Count::default()),
            Arc::new(Count::default()),
            Arc::new(Count::default()),
        );
        let mut early_sync =
            Wait::new(&waiters, &progress, Stage::Synced, 100, |p| p.synced >= 100);
        let mut late_sync = Wait::new(&waiters, &progress, Stage::Synced, 200, |p| p.synced >= 200);
        let mut write = Wait::new(&waiters, &progress, Stage::Written, 200, |p| {
            p.written >= 200
        });
        assert!(poll(&mut early_sync, &early).is_pending());
        assert!(poll(&mut late_sync, &late).is_pending());
        assert!(poll(&mut write, &written).is_pending());
        assert_eq!(waiters.len(), 3);

        // Written: the writes' waiter only; nothing waiting for a sync.
        announce(&progress, &waiters, |p| p.written = 200);
        assert_eq!((early.get(), late.get(), written.get()), (0, 0, 1));
        assert!(poll(&mut write, &written).is_ready());
        // A compaction, or any change that moves no waiter's stage past its record: nobody.
        announce(&progress, &waiters, |p| p.compactions += 1);
        assert_eq!((early.get(), late.get()), (0, 0));
        // A sync through the first record: its waiter only.
        announce(&progress, &waiters, |p| p.synced = 150);
        assert_eq!((early.get(), late.get()), (1, 0));
        assert_eq!(
            poll(&mut early_sync, &early).map(|p| p.synced),
            Poll::Ready(150)
        );
        announce(&progress, &waiters, |p| p.synced = 200);
        assert_eq!(late.get(), 1);
        assert!(poll(&mut late_sync, &late).is_ready());
        assert_eq!(waiters.len(), 0);
    }

    #[test]
    fn a_failure_wakes_the_waiters_it_reaches_and_a_breakdown_wakes_all() {
        let (progress, waiters) = (watch::Sender::new(Progress::default()), Waiters::default());
        let (first, second) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let mut first_wait = Wait::new(&waiters, &progress, Stage::Synced, 10, |p| {
            p.synced >= 10 || p.failed_through >= 10
        });
        let mut second_wait = Wait::new(&waiters, &progress, Stage::Written, 20, |p| {
            p.written >= 20 || p.broken
        });
        assert!(poll(&mut first_wait, &first).is_pending());
        assert!(poll(&mut second_wait, &second).is_pending());
        announce(&progress, &waiters, |p| p.failed_through = 10);
        assert_eq!((first.get(), second.get()), (1, 0));
        assert!(poll(&mut first_wait, &first).is_ready());
        announce(&progress, &waiters, |p| p.broken = true);
        assert_eq!(second.get(), 1);
        assert!(poll(&mut second_wait, &second).is_ready());
    }

    #[test]
    fn a_waiter_woken_but_not_done_waits_again_and_a_dropped_one_leaves_nothing() {
        let (progress, waiters) = (watch::Sender::new(Progress::default()), Waiters::default());
        let count = Arc::new(Count::default());
        // Synced here and on the standby, as a durability-2 record with a standby waits.
        let done = |p: &Progress| p.synced >= 5 && p.standby_synced >= 5;
        let mut wait = Wait::new(&waiters, &progress, Stage::Synced, 5, done);
        assert!(poll(&mut wait, &count).is_pending());
        announce(&progress, &waiters, |p| p.synced = 5);
        assert_eq!(count.get(), 1);
        assert!(
            poll(&mut wait, &count).is_pending(),
            "the standby has not synced it"
        );
        assert_eq!(waiters.len(), 1);
        announce(&progress, &waiters, |p| p.standby_synced = 5);
        assert_eq!(count.get(), 2);
        assert!(poll(&mut wait, &count).is_ready());

        let mut dropped = Wait::new(&waiters, &progress, Stage::Written, 50, |p| p.written >= 50);
        assert!(poll(&mut dropped, &count).is_pending());
        assert_eq!(waiters.len(), 1);
        drop(dropped);
        assert_eq!(waiters.len(), 0);
    }
}
