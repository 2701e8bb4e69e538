//! The line of subscribers: who stands where, what each holds, and who has room.
//!
//! Finding the first subscriber with room is the hot question of every dispatch, so the line
//! keeps an ordered index of exactly the subscribers that have room: the answer is its first
//! entry, O(log n) however many subscribers are full.

use super::ids::{MessageId, SessionId};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tokio::sync::mpsc::UnboundedSender;

/// Where a subscriber's frames go: its connection's outbox. Deliveries are bounded by the
/// subscriber's capacity, so the channel needs no bound of its own.
pub type Outbox = UnboundedSender<Bytes>;

/// A place in the line; lower stands earlier. Kept by a session for its whole life.
pub type Place = u64;

struct Subscriber {
    /// Its place in the line, from the order of logins.
    place: Place,
    /// How many messages it may hold unacknowledged.
    capacity: u64,
    /// The messages it holds now, in id order (the order a replay resends them).
    held: BTreeSet<MessageId>,
    /// Its connection's outbox.
    outbox: Outbox,
}

impl Subscriber {
    fn has_room(&self) -> bool {
        (self.held.len() as u64) < self.capacity
    }
}

#[derive(Default)]
pub struct Line {
    subscribers: HashMap<SessionId, Subscriber>,
    /// Exactly the subscribers with room, by place: the first one gets the next message.
    with_room: BTreeMap<Place, SessionId>,
    /// The place the next new subscriber takes: the back of the line.
    next_place: Place,
}

impl Line {
    /// Puts a new subscriber at the back of the line.
    pub fn join(&mut self, session: SessionId, capacity: u64, outbox: Outbox) {
        let place = self.next_place;
        self.next_place += 1;
        let subscriber = Subscriber {
            place,
            capacity,
            held: BTreeSet::new(),
            outbox,
        };
        self.subscribers.insert(session, subscriber);
        self.refresh(session);
    }

    /// Takes a subscriber out of the line; returns what it held.
    pub fn leave(&mut self, session: SessionId) -> BTreeSet<MessageId> {
        match self.subscribers.remove(&session) {
            Some(subscriber) => {
                self.with_room.remove(&subscriber.place);
                subscriber.held
            }
            None => BTreeSet::new(),
        }
    }

    pub fn set_capacity(&mut self, session: SessionId, capacity: u64) {
        if let Some(subscriber) = self.subscribers.get_mut(&session) {
            subscriber.capacity = capacity;
            self.refresh(session);
        }
    }

    /// The subscriber that gets the next message, if any has room.
    pub fn first_with_room(&self) -> Option<SessionId> {
        self.with_room
            .first_key_value()
            .map(|(_, session)| *session)
    }

    /// Gives `message` to `session` to hold, and sends it `frame`.
    pub fn hold(&mut self, session: SessionId, message: MessageId, frame: Bytes) {
        let subscriber = self
            .subscribers
            .get_mut(&session)
            .expect("only subscribers in the line hold messages");
        subscriber.held.insert(message);
        // A closed outbox means the connection is ending; its session's leave returns the
        // message, so nothing is lost by ignoring the error here.
        let _ = subscriber.outbox.send(frame);
        self.refresh(session);
    }

    /// Ends `session`'s hold on `message`; false if it did not hold it.
    pub fn release(&mut self, session: SessionId, message: MessageId) -> bool {
        let Some(subscriber) = self.subscribers.get_mut(&session) else {
            return false;
        };
        let released = subscriber.held.remove(&message);
        self.refresh(session);
        released
    }

    pub fn holds(&self, session: SessionId, message: MessageId) -> bool {
        self.subscribers
            .get(&session)
            .is_some_and(|s| s.held.contains(&message))
    }

    /// Connected subscribers.
    pub fn len(&self) -> usize {
        self.subscribers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.subscribers.is_empty()
    }

    /// Keeps `with_room` true to the subscriber's holdings and capacity.
    fn refresh(&mut self, session: SessionId) {
        let Some(subscriber) = self.subscribers.get(&session) else {
            return;
        };
        if subscriber.has_room() {
            self.with_room.insert(subscriber.place, session);
        } else {
            self.with_room.remove(&subscriber.place);
        }
    }
}
