//! The line of subscribers: who stands where, what each holds, and who has room.
//!
//! Finding the first subscriber with room is the hot question of every dispatch, so the line
//! keeps an ordered index of exactly the subscribers that have room: the answer is its first
//! entry, O(log n) however many subscribers are full.
//!
//! A subscriber whose connection dropped stays in the line, saved, with its place and what it
//! holds, but without an outbox and so without room, until it resumes or its time runs out.

use super::ids::{MessageId, SessionId};
use super::outbox::{Outbound, Outbox};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A place in the line; lower stands earlier. Kept by a session for its whole life.
pub type Place = u64;

struct Subscriber {
    /// Its place in the line, from the order of logins.
    place: Place,
    /// How many messages it may hold unacknowledged.
    capacity: u64,
    /// The messages it holds now, in id order (the order a replay resends them).
    held: BTreeSet<MessageId>,
    /// Held messages whose frames never left for the client (the connection dropped first).
    unsent: BTreeSet<MessageId>,
    /// Its connection's outbox; `None` while the session is saved after a drop.
    outbox: Option<Outbox>,
    /// Whether it was ever given a message: a session that never was is not saved.
    received: bool,
}

impl Subscriber {
    fn has_room(&self) -> bool {
        self.outbox.is_some() && (self.held.len() as u64) < self.capacity
    }
}

/// What a dropped subscriber leaves behind, to decide whether it is saved.
pub struct Dropped {
    pub holds_any: bool,
    pub received_any: bool,
}

/// A resumed subscriber's held messages: all of them, and the ones to send again.
pub struct Resumed {
    pub held: Vec<MessageId>,
    pub resend: Vec<MessageId>,
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
            unsent: BTreeSet::new(),
            outbox: Some(outbox),
            received: false,
        };
        self.subscribers.insert(session, subscriber);
        self.refresh(session);
    }

    /// Takes a subscriber out of the line for good; returns what it held.
    pub fn leave(&mut self, session: SessionId) -> BTreeSet<MessageId> {
        match self.subscribers.remove(&session) {
            Some(subscriber) => {
                self.with_room.remove(&subscriber.place);
                subscriber.held
            }
            None => BTreeSet::new(),
        }
    }

    /// The connection dropped: the subscriber keeps its place and holdings but gets nothing
    /// until it resumes. `unsent` are deliveries its connection never sent.
    pub fn disconnect(
        &mut self,
        session: SessionId,
        unsent: impl IntoIterator<Item = MessageId>,
    ) -> Option<Dropped> {
        let subscriber = self.subscribers.get_mut(&session)?;
        subscriber.outbox = None;
        subscriber.unsent = unsent
            .into_iter()
            .filter(|id| subscriber.held.contains(id))
            .collect();
        let dropped = Dropped {
            holds_any: !subscriber.held.is_empty(),
            received_any: subscriber.received,
        };
        self.refresh(session);
        Some(dropped)
    }

    /// Whether `session` is in the line and saved (dropped, not resumed).
    pub fn is_saved(&self, session: SessionId) -> bool {
        self.subscribers
            .get(&session)
            .is_some_and(|s| s.outbox.is_none())
    }

    /// A saved subscriber comes back as `new`, at its old place, with its holdings.
    pub fn reconnect(
        &mut self,
        old: SessionId,
        new: SessionId,
        capacity: Option<u64>,
        outbox: Outbox,
        replay: bool,
    ) -> Resumed {
        let mut subscriber = self.subscribers.remove(&old).expect("a saved subscriber");
        if let Some(capacity) = capacity {
            subscriber.capacity = capacity;
        }
        subscriber.outbox = Some(outbox);
        let unsent = std::mem::take(&mut subscriber.unsent);
        let held: Vec<MessageId> = subscriber.held.iter().copied().collect();
        let resend = if replay {
            held.clone()
        } else {
            unsent.into_iter().collect()
        };
        self.with_room.remove(&subscriber.place);
        self.subscribers.insert(new, subscriber);
        self.refresh(new);
        Resumed { held, resend }
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
        subscriber.received = true;
        self.send(session, message, frame);
        self.refresh(session);
    }

    /// Sends the frame of a message `session` holds to its connection.
    pub fn send(&mut self, session: SessionId, message: MessageId, frame: Bytes) {
        let Some(subscriber) = self.subscribers.get_mut(&session) else {
            return;
        };
        let outbound = Outbound {
            frame,
            message: Some(message),
        };
        // No outbox, or a closed one: the connection is gone or going. Either way the session
        // is saved or ended with the message still held, so nothing is lost.
        if let Some(outbox) = &subscriber.outbox {
            outbox.send(outbound);
        }
    }

    /// Sends `session` a frame that is not a delivery (a notice).
    pub fn notify(&mut self, session: SessionId, frame: Bytes) {
        if let Some(outbox) = self
            .subscribers
            .get(&session)
            .and_then(|s| s.outbox.as_ref())
        {
            let _ = outbox.send(Outbound {
                frame,
                message: None,
            });
        }
    }

    /// Ends `session`'s hold on `message`; false if it did not hold it.
    pub fn release(&mut self, session: SessionId, message: MessageId) -> bool {
        let Some(subscriber) = self.subscribers.get_mut(&session) else {
            return false;
        };
        let released = subscriber.held.remove(&message);
        subscriber.unsent.remove(&message);
        self.refresh(session);
        released
    }

    pub fn holds(&self, session: SessionId, message: MessageId) -> bool {
        self.subscribers
            .get(&session)
            .is_some_and(|s| s.held.contains(&message))
    }

    /// Subscribers in the line, connected or saved.
    pub fn len(&self) -> usize {
        self.subscribers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.subscribers.is_empty()
    }

    /// Keeps `with_room` true to the subscriber's holdings, capacity and connection.
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
