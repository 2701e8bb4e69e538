//! The copy queue type: each message goes to every copy subscriber connected at that moment.
//! Nothing is stored, so there is no id, no ack and no line.

use super::outbox::{outbox, Frames, Outbox};
use crate::message::{copy_frame, BodyType};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct CopyQueue {
    /// Connected copy subscribers by a number of their own.
    subscribers: Mutex<HashMap<u64, Outbox>>,
    next_number: AtomicU64,
}

impl CopyQueue {
    /// Adds a subscriber; the receiver gets every copy published from now on.
    pub fn subscribe(self: &Arc<Self>, write_limit: usize) -> (CopySubscription, Frames) {
        let (outbox, frames) = outbox(write_limit);
        let number = self.next_number.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(number, outbox);
        let subscription = CopySubscription {
            queue: self.clone(),
            number,
        };
        (subscription, frames)
    }

    /// Sends a copy to every connected subscriber; returns how many got it.
    pub fn publish(&self, body_type: BodyType, body: &str, recdat: u64) -> usize {
        let frame = copy_frame(body_type, body, recdat);
        self.lock()
            .values()
            .filter(|outbox| outbox.send(frame.clone()))
            .count()
    }

    pub fn subscriber_count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Outbox>> {
        self.subscribers
            .lock()
            .expect("the copy lock is never poisoned")
    }
}

/// A copy subscriber's registration; dropping it stops the copies.
pub struct CopySubscription {
    queue: Arc<CopyQueue>,
    number: u64,
}

impl Drop for CopySubscription {
    fn drop(&mut self) {
        self.queue.lock().remove(&self.number);
    }
}
