//! Who hears of a change: everyone that follows the whole state (the zone, the reconciler)
//! hears of every change; a request that waits on one queue (a node's config watch, a
//! rotation waiting for its node) hears of that queue's only. With N node watches held on a
//! replica, a change to one queue then costs one read, not N.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Cheap to clone: clones share the channels.
#[derive(Clone, Default)]
pub(super) struct Changes {
    /// Moves on with every change followed.
    all: Arc<watch::Sender<u64>>,
    /// One channel per queue someone waits on now, moving on with that queue's changes.
    queues: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
}

impl Changes {
    pub(super) fn everything(&self) -> watch::Receiver<u64> {
        self.all.subscribe()
    }

    /// Queue `id`'s changes, for as long as the subscription lives.
    pub(super) fn of_queue(&self, id: &str) -> QueueSubscription {
        let mut queues = self.queues.lock().expect("never poisoned");
        let sender = queues
            .entry(id.to_string())
            .or_insert_with(|| watch::channel(0).0);
        QueueSubscription {
            receiver: sender.subscribe(),
            changes: self.clone(),
            id: id.to_string(),
        }
    }

    /// A change to something other than a queue's record.
    pub(super) fn changed(&self) {
        self.all.send_modify(|n| *n += 1);
    }

    /// A change to queue `id`'s record.
    pub(super) fn queue_changed(&self, id: &str) {
        self.changed();
        if let Some(sender) = self.queues.lock().expect("never poisoned").get(id) {
            sender.send_modify(|n| *n += 1);
        }
    }

    /// Changes that may have been missed (a watch made again): everyone looks again.
    pub(super) fn anything_changed(&self) {
        self.changed();
        for sender in self.queues.lock().expect("never poisoned").values() {
            sender.send_modify(|n| *n += 1);
        }
    }
}

/// Hears of one queue's changes; its channel goes when the last subscription to it does.
pub(super) struct QueueSubscription {
    pub(super) receiver: watch::Receiver<u64>,
    changes: Changes,
    id: String,
}

impl Drop for QueueSubscription {
    fn drop(&mut self) {
        let mut queues = self.changes.queues.lock().expect("never poisoned");
        // This one's receiver is dropped after this: it is the last if it is the only one.
        if queues
            .get(&self.id)
            .is_some_and(|s| s.receiver_count() <= 1)
        {
            queues.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_s_waiters_hear_of_its_changes_only_and_its_channel_goes_with_them() {
        let changes = Changes::default();
        let mut all = changes.everything();
        let mut one = changes.of_queue("one");
        let two = changes.of_queue("two");
        changes.queue_changed("one");
        assert!(one.receiver.has_changed().unwrap());
        assert!(
            !two.receiver.has_changed().unwrap(),
            "another queue's change"
        );
        assert!(all.has_changed().unwrap());
        all.borrow_and_update();
        one.receiver.borrow_and_update();
        changes.anything_changed();
        assert!(two.receiver.has_changed().unwrap() && one.receiver.has_changed().unwrap());
        let again = changes.of_queue("one");
        drop(one);
        assert!(
            changes.queues.lock().unwrap().contains_key("one"),
            "still waited on"
        );
        drop(again);
        drop(two);
        assert!(changes.queues.lock().unwrap().is_empty());
    }
}
