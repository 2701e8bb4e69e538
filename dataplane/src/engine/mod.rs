//! The queue: one owner of every message and every subscriber's place.
//!
//! - [`queue`]: the rules, as a plain state machine with the clock passed in (unit-tested).
//! - [`line`]: the line of subscribers and what each holds.
//! - [`message`]: messages and the frames subscribers receive.
//! - [`ids`]: UUIDv7 ids for messages and sessions.
//! - [`copy`]: the copy queue type, which stores nothing.
//!
//! [`Queue`] is the handle connections use: short synchronous methods under one std mutex that
//! is never held across an `.await`. Delayed messages are released by [`Queue::run_delays`].

pub mod copy;
pub mod ids;
pub mod line;
pub mod message;
pub mod queue;

pub use copy::{CopyQueue, CopySubscription};
pub use ids::{MessageId, SessionId};
pub use message::{BodyType, Durability, Message, NewMessage};
pub use queue::{Limits, QueueState, Refused};

use crate::store::{Receipt, Store};
use bytes::Bytes;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::Notify;

/// Milliseconds since 1970, from the wall clock (delays must survive restarts, part 2).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64
}

/// A cheap, cloneable handle on the distribute queue.
#[derive(Clone)]
pub struct Queue {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<QueueState>,
    /// Wakes the delay timer when a delayed message may have become the next one due.
    delays_changed: Notify,
}

impl Queue {
    pub fn new(store: Box<dyn Store>, limits: Limits) -> Queue {
        Queue {
            shared: Arc::new(Shared {
                state: Mutex::new(QueueState::new(store, limits)),
                delays_changed: Notify::new(),
            }),
        }
    }

    /// Runs the queue's own operations on its state. Panics abort the process, so the lock is
    /// never poisoned.
    pub fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.shared
            .state
            .lock()
            .expect("the queue lock is never poisoned")
    }

    pub fn publish(&self, new: &NewMessage) -> Result<(MessageId, Receipt), Refused> {
        let published = self.lock().publish(new, now_ms());
        if published.is_ok() && new.delay_secs > 0 {
            self.shared.delays_changed.notify_one();
        }
        published
    }

    /// Loads what the store kept, at start.
    pub fn restore(&self, messages: Vec<crate::store::log::RecoveredMessage>) {
        self.lock().restore(messages, now_ms());
        self.shared.delays_changed.notify_one();
    }

    /// Puts damaged bytes of the store in the dead letter queue; see [`QueueState::add_damaged`].
    pub fn add_damaged(&self, file: &[u8]) -> (MessageId, Receipt) {
        self.lock().add_damaged(file, now_ms())
    }

    /// Joins the line at the back; the receiver gets every frame meant for this subscriber.
    pub fn subscribe(&self, capacity: u64) -> (Subscription, UnboundedReceiver<Bytes>) {
        let (outbox, frames) = unbounded_channel();
        let session = self.lock().join(capacity, outbox, now_ms());
        let subscription = Subscription {
            queue: self.clone(),
            session,
        };
        (subscription, frames)
    }

    /// Releases delayed messages when they fall due. Runs for the life of the node.
    pub async fn run_delays(self) {
        loop {
            let next_due = self.lock().next_due();
            let now = now_ms();
            match next_due {
                Some(due) if due <= now => self.lock().release_due(now),
                Some(due) => {
                    let wait = Duration::from_millis(due - now);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.shared.delays_changed.notified() => {}
                    }
                }
                None => self.shared.delays_changed.notified().await,
            }
        }
    }
}

/// A distribute subscriber's session in the line. Dropping it ends the session: what it held
/// goes back to the queue.
pub struct Subscription {
    queue: Queue,
    session: SessionId,
}

impl Subscription {
    pub fn session(&self) -> SessionId {
        self.session
    }

    pub fn ack(&self, id: MessageId) -> Result<Receipt, Refused> {
        self.queue.lock().ack(self.session, id)
    }

    pub fn nack(&self, id: MessageId) -> Result<Receipt, Refused> {
        self.queue.lock().nack(self.session, id)
    }

    pub fn set_capacity(&self, capacity: u64) {
        self.queue.lock().set_capacity(self.session, capacity);
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.queue.lock().leave(self.session);
    }
}
