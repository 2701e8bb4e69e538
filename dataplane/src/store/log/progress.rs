//! How far the log has got ([`Progress`]), and the replies waiting for it (a
//! [`Ticket`](super::Ticket)), each woken only when the progress has moved past its record.
//! They used to wait on a `watch` of the progress, whose every change (a round written, a
//! sync, a compaction) woke every waiting reply's connection, most of them to find nothing
//! done: at 16 publishers × 1 in flight at durability 2 that was about 12% of the node's CPU
//! per message (docs/performance.md).
//!
//! Why no wake-up is lost: the progress changes only in [`ProgressWatch::announce`], which
//! then takes the waiters' lock and wakes every waiter the new progress may have answered; a
//! waiter looks at the progress and files itself in one hold of the same lock. So a change
//! either came before the look, which sees it, or its wake-up comes after the filing.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use tokio::sync::watch;

/// How far the writer has got, in LSNs (bytes appended since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every record ending at or before this is in the operating system's hands.
    pub written: u64,
    /// Every record ending at or before this is synced to the disk.
    pub synced: u64,
    /// Records ending at or before this, and not yet written or synced, met a failed write or
    /// sync: their changes are kept in memory and written later (eventual durability).
    pub failed_through: u64,
    /// Syncs done so far (each one answers every durability-2 change written before it).
    pub syncs: u64,
    /// Compaction rounds done so far.
    pub compactions: u64,
    /// A sync failed: nothing not synced before it can be made safe, and nothing more is
    /// written.
    pub broken: bool,
    /// Every record ending at or before this is synced on the standby too (`shipping`).
    pub standby_synced: u64,
    /// A standby is attached and caught up: durability 2 waits for its sync.
    pub standby_in_sync: bool,
}

/// The progress, changed only through [`announce`](Self::announce), and who waits for it.
#[derive(Default)]
pub struct ProgressWatch {
    /// The value; a `watch` so that tests can wait for it as well.
    value: watch::Sender<Progress>,
    waiters: Waiters,
}

impl ProgressWatch {
    /// The progress now.
    pub fn now(&self) -> Progress {
        *self.value.borrow()
    }

    /// Changes the progress (`change` says whether it did) and wakes the replies that the
    /// change may have answered.
    pub fn announce(&self, change: impl FnOnce(&mut Progress) -> bool) {
        if self.value.send_if_modified(change) {
            // Copied: the watch's lock is let go before the waiters' is taken.
            self.waiters.wake(&self.now());
        }
    }

    /// Waits until `done` says so of the progress, which it can only once the progress has
    /// reached `lsn` at `stage` (or failed through it, or broken down).
    pub fn when<F: Fn(&Progress) -> bool>(&self, stage: Stage, lsn: u64, done: F) -> Wait<'_, F> {
        Wait::new(&self.waiters, &self.value, stage, lsn, done)
    }

    /// Tests: a receiver of every change.
    #[cfg(test)]
    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.value.subscribe()
    }
}

/// What a reply waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Written,
    Synced,
}

#[derive(Default)]
struct Waiters {
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
    fn wake(&self, now: &Progress) {
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
    fn len(&self) -> usize {
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
    fn new(
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
        let (outcome, _let_go) = Pin::into_inner(self).look(cx);
        outcome
    }
}

impl<F: Fn(&Progress) -> bool> Wait<'_, F> {
    /// Ready with the progress if `done`, else filed with `cx`'s waker; with the waker it
    /// replaced or took out, to be dropped once the lock is let go (dropping a waker may run
    /// its owner's code).
    fn look(&mut self, cx: &Context<'_>) -> (Poll<Progress>, Option<Waker>) {
        let mut filed = self.waiters.lock();
        // A copy: the watch's own lock is held for the copy only.
        let now = *self.progress.borrow();
        if (self.done)(&now) {
            let taken = self
                .key
                .take()
                .and_then(|key| filed.stage(self.stage).remove(&(self.lsn, key)));
            return (Poll::Ready(now), taken);
        }
        let key = *self.key.get_or_insert_with(|| {
            filed.next += 1;
            filed.next
        });
        let replaced = filed
            .stage(self.stage)
            .insert((self.lsn, key), cx.waker().clone());
        (Poll::Pending, replaced)
    }
}

impl<F> Drop for Wait<'_, F> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            // Dropped after the lock (see `look`).
            let _let_go = self
                .waiters
                .lock()
                .stage(self.stage)
                .remove(&(self.lsn, key));
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

    fn poll<F: Fn(&Progress) -> bool + Unpin>(
        wait: &mut Wait<'_, F>,
        count: &Arc<Count>,
    ) -> Poll<Progress> {
        let waker = Waker::from(count.clone());
        Pin::new(wait).poll(&mut Context::from_waker(&waker))
    }

    /// A change that always says it changed something.
    fn set(watch: &ProgressWatch, change: impl FnOnce(&mut Progress)) {
        watch.announce(|p| {
            change(p);
            true
        });
    }

    #[test]
    fn a_waiter_is_woken_once_the_progress_reaches_its_record_at_its_stage() {
        let watch = ProgressWatch::default();
        let (early, late, written) = (
            Arc::new(Count::default()),
            Arc::new(Count::default()),
            Arc::new(Count::default()),
        );
        let mut early_sync = watch.when(Stage::Synced, 100, |p| p.synced >= 100);
        let mut late_sync = watch.when(Stage::Synced, 200, |p| p.synced >= 200);
        let mut write = watch.when(Stage::Written, 200, |p| p.written >= 200);
        assert!(poll(&mut early_sync, &early).is_pending());
        assert!(poll(&mut late_sync, &late).is_pending());
        assert!(poll(&mut write, &written).is_pending());
        assert!(
            poll(&mut write, &written).is_pending(),
            "polled again, unwoken"
        );
        assert_eq!(watch.waiters.len(), 3, "filed once each");

        // Written: the writes' waiter only; nothing waiting for a sync.
        set(&watch, |p| p.written = 200);
        assert_eq!((early.get(), late.get(), written.get()), (0, 0, 1));
        assert!(poll(&mut write, &written).is_ready());
        // A compaction, or any change that moves no waiter's stage past its record: nobody.
        set(&watch, |p| p.compactions += 1);
        assert_eq!((early.get(), late.get()), (0, 0));
        // A sync through the first record: its waiter only.
        set(&watch, |p| p.synced = 150);
        assert_eq!((early.get(), late.get()), (1, 0));
        assert_eq!(
            poll(&mut early_sync, &early).map(|p| p.synced),
            Poll::Ready(150)
        );
        set(&watch, |p| p.synced = 200);
        assert_eq!(late.get(), 1);
        assert!(poll(&mut late_sync, &late).is_ready());
        assert_eq!(watch.waiters.len(), 0);
    }

    #[test]
    fn a_change_that_says_it_changed_nothing_wakes_nobody() {
        let watch = ProgressWatch::default();
        let count = Arc::new(Count::default());
        let mut wait = watch.when(Stage::Written, 10, |p| p.written >= 10);
        assert!(poll(&mut wait, &count).is_pending());
        watch.announce(|_| false);
        assert_eq!(count.get(), 0);
        // Done already: nothing is filed.
        let mut done = watch.when(Stage::Written, 0, |_| true);
        assert!(poll(&mut done, &count).is_ready());
        assert_eq!(watch.waiters.len(), 1);
    }

    #[test]
    fn a_failure_wakes_the_waiters_it_reaches_and_a_breakdown_wakes_all() {
        let watch = ProgressWatch::default();
        let (first, second) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let mut first_wait = watch.when(Stage::Synced, 10, |p| {
            p.synced >= 10 || p.failed_through >= 10
        });
        let mut second_wait = watch.when(Stage::Written, 20, |p| p.written >= 20 || p.broken);
        assert!(poll(&mut first_wait, &first).is_pending());
        assert!(poll(&mut second_wait, &second).is_pending());
        set(&watch, |p| p.failed_through = 10);
        assert_eq!((first.get(), second.get()), (1, 0));
        assert!(poll(&mut first_wait, &first).is_ready());
        set(&watch, |p| p.broken = true);
        assert_eq!(second.get(), 1);
        assert!(poll(&mut second_wait, &second).is_ready());
    }

    #[test]
    fn a_waiter_woken_but_not_done_waits_again_and_a_dropped_one_leaves_nothing() {
        let watch = ProgressWatch::default();
        let count = Arc::new(Count::default());
        // Synced here and on the standby, as a durability-2 record with a standby waits.
        let done = |p: &Progress| p.synced >= 5 && p.standby_synced >= 5;
        let mut wait = watch.when(Stage::Synced, 5, done);
        assert!(poll(&mut wait, &count).is_pending());
        set(&watch, |p| p.synced = 5);
        assert_eq!(count.get(), 1);
        assert!(
            poll(&mut wait, &count).is_pending(),
            "the standby has not synced it"
        );
        assert_eq!(watch.waiters.len(), 1);
        set(&watch, |p| p.standby_synced = 5);
        assert_eq!(count.get(), 2);
        assert!(poll(&mut wait, &count).is_ready());

        let mut dropped = watch.when(Stage::Written, 50, |p| p.written >= 50);
        assert!(poll(&mut dropped, &count).is_pending());
        assert_eq!(watch.waiters.len(), 1);
        drop(dropped);
        assert_eq!(watch.waiters.len(), 0);
    }
}
