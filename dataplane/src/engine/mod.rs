//! The queue: one owner of every message and every subscriber's place.
//!
//! - [`queue`]: the rules, as a plain state machine with the clock passed in (unit-tested).
//! - [`line`]: the line of subscribers and what each holds.
//! - [`message`]: messages and the frames subscribers receive.
//! - [`ids`]: UUIDv7 ids for messages and sessions.
//! - [`copy`]: the copy queue type, which stores nothing.
//!
//! [`Queue`] is the handle connections use: short synchronous methods under one std mutex that
//! is never held across an `.await`. Delayed messages and saved sessions run out in
//! [`Queue::run_timers`].

pub mod copy;
pub mod dedup;
pub mod groups;
pub mod line;
pub mod outbox;
pub mod queue;

pub use crate::message::ids::{IdMap, MessageId, SessionId};
pub use crate::message::{BodyType, Dead, DeadReason, Durability, Message, NewMessage};
pub use copy::{CopyQueue, CopySubscription};
pub use outbox::{Frames, Outbound};
pub use queue::{
    Anchor, CarriedHolds, Counts, Limits, Pulled, QueueState, Redrive, Refused, Rules, Scope,
    Totals,
};

use crate::store::{Receipt, Store};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

/// Milliseconds since 1970, from the wall clock (delays must survive restarts, part 2).
pub use qe_shared::clock::now_ms;

/// What [`Queue::snapshot`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub counts: Counts,
    pub totals: Totals,
    /// `messages-memory-used`.
    pub memory_used: u64,
}

/// A cheap, cloneable handle on the distribute queue.
#[derive(Clone)]
pub struct Queue {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<QueueState>,
    /// Wakes the timer task when a delayed message or a saved session may have become the
    /// next thing due.
    timers_changed: Notify,
    /// Wakes one long-polling pull receiver ([`Queue::receive_within`]) when a message it may
    /// take waits; only while there are any (`pullers`), so a publish with nobody polling
    /// costs one atomic load. One, not all: 200 idle receivers woken by every publish would
    /// each take the queue's lock, which every WebSocket delivery needs. The one woken wakes
    /// the next if it leaves such messages waiting, and one that stops before it looks hands
    /// its wake-up on (tokio's `Notified`, dropped after a `notify_one`). Beside WebSocket
    /// subscribers a message is theirs first ([`queue::LINE_FIRST_MS`]): the timer task
    /// wakes a receiver when the oldest has waited that long, not the publish.
    arrivals: Notify,
    pullers: AtomicUsize,
    /// Looks long-polling receivers took for waiting messages, found or not: what a wake-up
    /// costs (the queue's lock), counted.
    pull_looks: AtomicU64,
}

impl Queue {
    pub fn new(store: Box<dyn Store>, limits: Limits) -> Queue {
        Queue {
            shared: Arc::new(Shared {
                state: Mutex::new(QueueState::new(store, limits)),
                timers_changed: Notify::new(),
                arrivals: Notify::new(),
                pullers: AtomicUsize::new(0),
                pull_looks: AtomicU64::new(0),
            }),
        }
    }

    /// Runs the queue's own operations on its state. Panics abort the process, so the lock is
    /// never poisoned.
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.shared
            .state
            .lock()
            .expect("the queue lock is never poisoned")
    }

    pub fn publish(&self, new: &NewMessage<'_>) -> Result<(MessageId, Receipt), Refused> {
        let (published, expiring, first_id, pullable) = {
            let mut state = self.lock();
            let ids_before = state.next_dedup_end().is_some();
            let now = now_ms();
            let published = state.publish(new, now);
            let first_id = !ids_before && state.next_dedup_end().is_some();
            let pullable = self.has_pullers() && state.pullable_at(now);
            (published, state.next_expiring(), first_id, pullable)
        };
        // (Only the first deduplication id held needs the timers told: later ones end after it.)
        if published.is_ok() && (new.delay_secs > 0 || expiring.is_some() || first_id) {
            self.shared.timers_changed.notify_one();
        }
        // A message a WebSocket subscriber took at once, or one the line still has first, wakes
        // no pull receiver.
        if published.is_ok() && pullable {
            self.shared.arrivals.notify_one();
        }
        published
    }

    /// Messages may have started to wait: one long-polling receiver looks again (see
    /// `arrivals`).
    fn wake_pullers(&self) {
        if self.has_pullers() {
            self.shared.arrivals.notify_one();
        }
    }

    /// Whether a long-polling pull receiver waits.
    fn has_pullers(&self) -> bool {
        self.shared.pullers.load(Ordering::SeqCst) > 0
    }

    /// A long-polling pull receive: up to `max` messages as soon as any wait, or none once
    /// `wait` has passed.
    pub async fn receive_within(
        &self,
        max: usize,
        visibility: Duration,
        wait: Duration,
    ) -> Vec<Pulled> {
        let deadline = tokio::time::Instant::now() + wait;
        /// Counts this receiver among the pullers while it lives (also when its request is
        /// dropped half-way).
        struct Polling<'a>(&'a AtomicUsize);
        impl Drop for Polling<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        if self.shared.pullers.fetch_add(1, Ordering::SeqCst) == 0 {
            // The timer task looks for messages the WebSocket line left while receivers wait.
            self.shared.timers_changed.notify_one();
        }
        let _polling = Polling(&self.shared.pullers);
        loop {
            // Listening before looking: a publish between the look and the wait still wakes.
            let arrived = self.shared.arrivals.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            self.shared.pull_looks.fetch_add(1, Ordering::Relaxed);
            let (pulled, more_wait) = self.receive_and_look(max, visibility);
            if more_wait {
                // What this receiver left is the next one's.
                self.wake_pullers();
            }
            if !pulled.is_empty() || tokio::time::Instant::now() >= deadline {
                return pulled;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return self.receive(max, visibility);
            }
        }
    }

    /// When the timer task next looks for a message the WebSocket line left waiting to a
    /// long-polling receiver: when the oldest waiting may go to one, or, while none waits
    /// beside subscribers, a [`queue::LINE_FIRST_MS`] from now (no publish tells it that one
    /// started to wait: that would wake it for every publish). Only while receivers wait.
    /// Not before the receiver it woke last has looked (it takes what waits then, and wakes
    /// the next if it leaves some), or a [`queue::LINE_FIRST_MS`] has passed; and never twice
    /// in a millisecond.
    fn next_pull_look(&self, state: &mut QueueState, now: u64, last: &PullerWoken) -> Option<u64> {
        if !self.has_pullers() {
            return None;
        }
        let soonest = match self.pull_looks() > last.looks {
            true => last.at + 1,
            false => last.at + queue::LINE_FIRST_MS,
        };
        match state.next_pullable() {
            Some(at) => Some(at.max(soonest)),
            None if state.has_subscribers() => Some(now + queue::LINE_FIRST_MS),
            None => None,
        }
    }

    /// How many looks long-polling receivers have taken since start.
    pub fn pull_looks(&self) -> u64 {
        self.shared.pull_looks.load(Ordering::Relaxed)
    }

    /// New delivery rules (`max-receive-count`, `message-retention-secs`), from now on.
    pub fn set_rules(&self, rules: Rules) {
        self.lock().set_rules(rules);
    }

    /// A pull receiver takes up to `max` waiting messages, invisible for `visibility`.
    pub fn receive(&self, max: usize, visibility: Duration) -> Vec<Pulled> {
        self.receive_and_look(max, visibility).0
    }

    /// [`Queue::receive`], and whether messages may still wait for another receiver: it took
    /// all it could (`max`) and more it may take wait. (One that took fewer took everything
    /// it could: what still waits is held back, by its group or for the WebSocket line, and a
    /// wake-up passed on would go round the receivers for nothing.)
    fn receive_and_look(&self, max: usize, visibility: Duration) -> (Vec<Pulled>, bool) {
        let (pulled, more_wait) = {
            let mut state = self.lock();
            let now = now_ms();
            let pulled = state.receive(max, visibility.as_millis() as u64, now);
            let more_wait = pulled.len() == max && state.pullable_at(now);
            (pulled, more_wait)
        };
        if !pulled.is_empty() {
            self.shared.timers_changed.notify_one();
        }
        (pulled, more_wait)
    }

    /// A pull receiver deletes a message it received (receive number `receipt`).
    pub fn delete_received(&self, id: MessageId, receipt: u64) -> Result<Receipt, Refused> {
        let (deleted, lined_up) = {
            let mut state = self.lock();
            (state.delete_received(id, receipt), state.take_lined_up())
        };
        // The next of its group waits now: a long-polling receiver takes it.
        if lined_up {
            self.wake_pullers();
        }
        deleted
    }

    /// What an answer that every change recorded so far is stored waits for: a delete of a
    /// message already gone says it is deleted only once whatever removed it is written.
    pub fn everything_recorded(&self) -> Receipt {
        self.lock().everything_recorded()
    }

    /// A pull receiver changes a received message's visibility timeout, from now; what its
    /// answer waits for ([`QueueState::change_visibility`]).
    pub fn change_visibility(
        &self,
        id: MessageId,
        receipt: u64,
        visibility: Duration,
    ) -> Result<Option<crate::store::log::HoldGate>, Refused> {
        let visibility_ms = visibility.as_millis() as u64;
        let changed = self
            .lock()
            .change_visibility(id, receipt, visibility_ms, now_ms());
        self.shared.timers_changed.notify_one();
        self.wake_pullers();
        changed
    }

    /// Why and since when each of `ids` is in the dead letter queue (None: it is not), under
    /// one lock.
    pub fn deaths(&self, ids: impl IntoIterator<Item = MessageId>) -> Vec<Option<Dead>> {
        let state = self.lock();
        ids.into_iter().map(|id| state.death(id)).collect()
    }

    /// The live counters (`getlivestats`) that the queue keeps.
    pub fn counts(&self) -> Counts {
        self.lock().counts()
    }

    /// `messages-memory-used`.
    pub fn memory_used(&self) -> u64 {
        self.lock().memory_used()
    }

    /// The counters, the totals and the memory used, read under one lock (the node's live
    /// numbers), so they agree with each other.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        Snapshot {
            counts: state.counts(),
            totals: state.totals(),
            memory_used: state.memory_used(),
        }
    }

    /// An administrator's page of the queue or the dead letter queue; see [`QueueState::page`].
    pub fn page(
        &self,
        dead_letter: bool,
        anchor: Anchor,
        count: usize,
    ) -> Vec<(MessageId, Message)> {
        let state = self.lock();
        let page = state.page(dead_letter, anchor, count).into_iter();
        // A message's copy shares its frame: this copies a few fields and a pointer each.
        page.map(|(id, message)| (id, message.clone())).collect()
    }

    /// A message of the queue (`dead` false) or of the dead letter queue.
    pub fn get(&self, id: MessageId, dead: bool) -> Option<Message> {
        self.lock().get(id, dead).cloned()
    }

    /// `delmsg`; see [`QueueState::delete`].
    pub fn delete(&self, id: MessageId) -> Result<Receipt, Refused> {
        self.lock().delete(id)
    }

    /// `movetodlq`; see [`QueueState::move_to_dead_letter`].
    pub fn move_to_dead_letter(&self, id: MessageId) -> Result<Receipt, Refused> {
        self.lock().move_to_dead_letter(id)
    }

    /// `deldlqmsg`; see [`QueueState::delete_dead_letter`].
    pub fn delete_dead_letter(&self, id: MessageId) -> Result<Receipt, Refused> {
        self.lock().delete_dead_letter(id)
    }

    /// `purge`; see [`QueueState::purge`]. It takes the lock once, for time proportional to
    /// what it removes: one record must say what went.
    pub fn purge(&self, scope: Scope) -> (usize, Receipt) {
        self.purge_each(&[scope])
    }

    /// Purges each of `scopes` under one hold of the lock, so that nothing moves from one to
    /// another in between (a delay that ends, a visibility that passes) and escapes.
    pub fn purge_each(&self, scopes: &[Scope]) -> (usize, Receipt) {
        let now = now_ms();
        let mut state = self.lock();
        let (mut purged, mut receipt) = (0, Receipt::Done);
        for &scope in scopes {
            let (count, written) = state.purge(scope, now);
            purged += count;
            receipt = receipt.and(written);
        }
        (purged, receipt)
    }

    /// `redrive`: chooses what moves (see [`QueueState::redrive_selection`]), then moves it
    /// `REDRIVE_STEP` messages per hold of the lock, so that the other connections' requests,
    /// and the log's writer, go on between steps. Returns how many moved and one receipt.
    pub fn redrive(&self, which: Redrive<'_>) -> Result<(usize, Receipt), Refused> {
        const REDRIVE_STEP: usize = 1024;
        let selection = self.lock().redrive_selection(which)?;
        let mut moved = 0;
        let mut receipt = Receipt::Done;
        for step in selection.chunks(REDRIVE_STEP) {
            let (count, step_receipt) = self.lock().redrive(step);
            moved += count;
            receipt = receipt.and(step_receipt);
        }
        self.wake_pullers();
        Ok((moved, receipt))
    }

    /// Loads what the store kept, at start.
    pub fn restore(&self, recovered: crate::store::log::Recovered, carried: Option<CarriedHolds>) {
        let now_ms = now_ms();
        let mut queue = self.lock();
        queue.restore(recovered.messages, carried, now_ms);
        queue.restore_dedup(&recovered.dedup, now_ms);
        drop(queue);
        self.shared.timers_changed.notify_one();
    }

    /// Queues for the standby who holds which durable message now (see
    /// [`QueueState::holds`]), under the queue's lock, so that it lands between the hold
    /// changes at its place. Returns how many holds there are.
    pub fn ship_holds(&self, shipping: &crate::store::log::Shipping) -> usize {
        let queue = self.lock();
        let holds = queue.holds();
        let len = holds.len();
        shipping.ship_holds(holds);
        len
    }

    /// Puts damaged bytes of the store in the dead letter queue; see [`QueueState::add_damaged`].
    pub fn add_damaged(&self, file: &[u8]) -> (MessageId, Receipt) {
        self.lock().add_damaged(file, now_ms())
    }

    /// Joins the line at the back; the receiver gets every frame meant for this subscriber.
    pub fn subscribe(&self, capacity: u64, write_limit: usize) -> (Subscription, Frames) {
        let (outbox, frames) = outbox::outbox(write_limit);
        let session = self.lock().join(capacity, outbox, now_ms());
        (self.subscription(session), frames)
    }

    /// Resumes the saved session `old` (see [`QueueState::resume`]); `None` means 109. The
    /// receipt is what the resume's reply waits for.
    pub fn resume(
        &self,
        old: SessionId,
        capacity: Option<u64>,
        replay: bool,
        write_limit: usize,
    ) -> Option<(Subscription, Frames, Receipt)> {
        let (outbox, frames) = outbox::outbox(write_limit);
        let (session, heard) = self
            .lock()
            .resume(old, capacity, replay, outbox, now_ms())?;
        Some((self.subscription(session), frames, heard))
    }

    fn subscription(&self, session: SessionId) -> Subscription {
        Subscription {
            queue: self.clone(),
            session,
            ended: false,
        }
    }

    /// Releases delayed messages when they fall due, ends saved sessions whose time runs out,
    /// makes received messages visible again when their timeout passes, deletes expired
    /// ones, forgets deduplication ids whose windows ended, and wakes a long-polling receiver
    /// for a message the WebSocket line left waiting. Runs for the life of the node.
    pub async fn run_timers(self) {
        let mut last_woken = PullerWoken { at: 0, looks: 0 };
        loop {
            let now = now_ms();
            let next = {
                let mut state = self.lock();
                let timers = [
                    state.next_due(),
                    state.next_expiry(),
                    state.next_visible(),
                    state.next_expiring(),
                    state.next_dedup_end(),
                    self.next_pull_look(&mut state, now, &last_woken),
                ];
                timers.into_iter().flatten().min()
            };
            match next {
                Some(at) if at <= now => {
                    let mut state = self.lock();
                    state.release_due(now);
                    state.expire_sessions(now);
                    state.release_invisible(now);
                    state.expire_messages(now);
                    state.expire_dedup(now);
                    let pullable = state.pullable_at(now);
                    drop(state);
                    if pullable {
                        let looks = self.pull_looks();
                        self.wake_pullers();
                        last_woken = PullerWoken { at: now, looks };
                    }
                }
                Some(at) => {
                    let wait = Duration::from_millis(at - now);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.shared.timers_changed.notified() => {}
                    }
                }
                None => self.shared.timers_changed.notified().await,
            }
        }
    }
}

/// The timer task's last wake-up of a long-polling receiver.
struct PullerWoken {
    /// When (ms since 1970).
    at: u64,
    /// How many looks receivers had taken before it ([`Queue::pull_looks`]).
    looks: u64,
}

/// A distribute subscriber's session in the line. It ends by [`Subscription::logout`] or
/// [`Subscription::disconnect`]; dropped without either (a connection that ended before its
/// login was answered, so its client never learned the session id), it ends at once.
pub struct Subscription {
    queue: Queue,
    session: SessionId,
    /// Logout or disconnect has run.
    ended: bool,
}

impl Subscription {
    pub fn session(&self) -> SessionId {
        self.session
    }

    pub fn ack(&self, id: MessageId) -> Result<Receipt, Refused> {
        let (acked, lined_up) = {
            let mut state = self.queue.lock();
            (state.ack(self.session, id), state.take_lined_up())
        };
        if lined_up {
            self.queue.wake_pullers();
        }
        acked
    }

    pub fn nack(&self, id: MessageId) -> Result<Receipt, Refused> {
        let (nacked, lined_up) = {
            let mut state = self.queue.lock();
            (state.nack(self.session, id), state.take_lined_up())
        };
        if lined_up {
            self.queue.wake_pullers();
        }
        nacked
    }

    pub fn set_capacity(&self, capacity: u64) {
        self.queue.lock().set_capacity(self.session, capacity);
    }

    /// The connection has written enough to have room in its outbox again.
    pub fn drained(&self) {
        self.queue.lock().drained(self.session);
    }

    /// The subscriber asked to log out: what it holds goes to others now, before its reply.
    /// The reply waits for the receipt: a standby's hearing of it, so that a copy promoted
    /// after the reply neither keeps those messages with the session nor lets it resume.
    pub fn leave_now(&self) -> Receipt {
        let gate = self.queue.lock().leave(self.session);
        self.queue.wake_pullers();
        gate.map_or(Receipt::Done, Receipt::Heard)
    }

    /// The subscriber logged out: what it holds goes to others now (if [`Subscription::leave_now`]
    /// has not sent it already).
    pub fn logout(mut self) {
        self.ended = true;
        self.queue.lock().leave(self.session);
        self.queue.wake_pullers();
    }

    /// The connection dropped: the session is saved for `timeout` or ends, by the manual's
    /// rules (see [`QueueState::disconnect`]). What `frames` never wrote is read under the
    /// queue's lock, so no delivery slips in between.
    pub fn disconnect(mut self, frames: Frames, timeout: Duration, max_saved: u64) {
        self.ended = true;
        let timeout_ms = timeout.as_millis() as u64;
        let mut state = self.queue.lock();
        let unsent = frames.unsent();
        let saved = state.disconnect(self.session, unsent, timeout_ms, max_saved, now_ms());
        drop(state);
        self.queue.shared.timers_changed.notify_one();
        self.queue.wake_pullers();
        tracing::info!(session = %self.session, saved, "a subscriber's connection dropped");
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if !self.ended {
            self.queue.lock().leave(self.session);
            self.queue.wake_pullers();
        }
    }
}

#[cfg(test)]
mod pull_tests {
    use super::*;
    use crate::store::MemoryStore;

    fn queue() -> Arc<Queue> {
        let limits = Limits {
            max_messages: 1_000_000,
            max_memory: 1 << 30,
        };
        Arc::new(Queue::new(Box::new(MemoryStore), limits))
    }

    fn publish(queue: &Queue, body: &str) {
        let new = NewMessage {
            body: body.into(),
            ..NewMessage::default()
        };
        let _receipt = queue.publish(&new).unwrap();
    }

    /// `count` long-polling receivers of up to `max`, each waiting up to a minute.
    async fn pollers(queue: &Arc<Queue>, count: usize, max: usize) -> Vec<JoinHandle> {
        let handles: Vec<JoinHandle> = (0..count)
            .map(|_| {
                let queue = queue.clone();
                tokio::spawn(async move {
                    let minute = Duration::from_secs(60);
                    queue.receive_within(max, minute, minute).await.len()
                })
            })
            .collect();
        while queue.shared.pullers.load(Ordering::SeqCst) < count {
            tokio::task::yield_now().await;
        }
        // Each is waiting (its look found nothing) before anything is published.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        handles
    }

    type JoinHandle = tokio::task::JoinHandle<usize>;

    /// One message wakes one receiver, not all: the others go on waiting (before, every
    /// publish woke every receiver, and each took the queue's lock).
    #[tokio::test]
    async fn a_message_wakes_one_long_polling_receiver() {
        let queue = queue();
        let mut waiting = pollers(&queue, 5, 10).await;
        publish(&queue, "one");
        let (got, index, rest) = futures::future::select_all(waiting.drain(..)).await;
        assert_eq!(got.unwrap(), 1);
        let _ = index;
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert!(
            rest.iter().all(|handle| !handle.is_finished()),
            "the others wait on"
        );
        assert_eq!(queue.shared.pullers.load(Ordering::SeqCst), 4);
        // Five first looks, and one for the message: the others were never woken.
        assert_eq!(queue.pull_looks(), 6);
        rest.iter().for_each(|handle| handle.abort());
    }

    /// Beside a WebSocket subscriber, a publish wakes no receiver (the line has the message
    /// first); once the line has left it for `LINE_FIRST_MS`, the timer task wakes one.
    #[tokio::test]
    async fn a_message_the_line_leaves_wakes_one_receiver_from_the_timer() {
        let queue = queue();
        tokio::spawn(Queue::clone(&queue).run_timers());
        let (_subscription, _frames) = queue.subscribe(1, usize::MAX);
        publish(&queue, "held");
        let mut waiting = pollers(&queue, 5, 10).await;
        publish(&queue, "left");
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(queue.pull_looks(), 5, "the publish woke nobody");
        let taken = tokio::time::timeout(Duration::from_secs(5), async {
            let (got, _, rest) = futures::future::select_all(waiting.drain(..)).await;
            (got.unwrap(), rest)
        });
        let (got, rest) = taken.await.expect("the timer woke a receiver");
        assert_eq!(got, 1);
        assert_eq!(queue.pull_looks(), 6, "one receiver, woken once");
        rest.iter().for_each(|handle| handle.abort());
    }

    /// Messages released at once go to as many receivers as they need: the one woken takes
    /// its most and wakes the next while some wait.
    #[tokio::test]
    async fn a_receiver_that_takes_its_most_wakes_the_next() {
        let queue = queue();
        let waiting = pollers(&queue, 4, 10).await;
        // A subscriber's session ends with 25 held: they wait again all at once.
        let (subscription, _frames) = queue.subscribe(100, usize::MAX);
        for n in 0..25 {
            publish(&queue, &format!("m{n}"));
        }
        subscription.logout();
        let mut taken = Vec::new();
        let mut left = waiting;
        while taken.iter().sum::<usize>() < 25 {
            let (got, _, rest) = futures::future::select_all(left).await;
            taken.push(got.unwrap());
            left = rest;
        }
        taken.sort();
        assert_eq!(taken, [5, 10, 10]);
        assert_eq!(left.len(), 1, "the fourth was not needed");
        // Four first looks and three takes: the 25 publishes, which the subscriber took at
        // once, woke nobody, and the fourth receiver was never woken.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(queue.pull_looks(), 7);
        left.iter().for_each(|handle| handle.abort());
    }
}
