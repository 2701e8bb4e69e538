//! The line of subscribers: who stands where, what each holds, and who has room.
//!
//! Finding the first subscriber with room is the hot question of every dispatch, so the line
//! keeps an ordered index of exactly the subscribers that have room: the answer is its first
//! entry, O(log n) however many subscribers are full.
//!
//! A subscriber whose connection dropped stays in the line, saved, with its place and what it
//! holds, but without an outbox and so without room, until it resumes or its time runs out.
//!
//! A subscriber has room when it holds fewer than its capacity *and* its outbox has room
//! (fewer than `max-write-queue-bytes` wait for its socket). Held messages whose frames could
//! not be queued yet (a replay bigger than the outbox, say) wait in `unsent` and go out as
//! the connection writes ([`Line::next_to_send`]).

use super::outbox::Outbox;
use crate::message::ids::{IdMap, MessageId, SessionId};
use crate::store::log::HoldGate;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};

/// A place in the line; lower stands earlier. Kept by a session for its whole life.
pub type Place = u64;

struct Subscriber {
    /// Its place in the line, from the order of logins.
    place: Place,
    /// How many messages it may hold unacknowledged.
    capacity: u64,
    /// The messages it holds now, in id order (the order a replay resends them).
    held: BTreeSet<MessageId>,
    /// Held messages whose frames its connection has not written: not yet queued (waiting
    /// for room in the outbox), or queued and never written before the connection dropped.
    /// Sent in id order.
    unsent: BTreeSet<MessageId>,
    /// Its connection's outbox; `None` while the session is saved after a drop.
    outbox: Option<Outbox>,
    /// Whether it was ever given a message: a session that never was is not saved.
    received: bool,
}

impl Subscriber {
    /// Whether it may be given another message now. Looks at the outbox last: an outbox
    /// found full remembers to say when it has room again.
    fn has_room(&self) -> bool {
        (self.held.len() as u64) < self.capacity
            && self.unsent.is_empty()
            && self.outbox.as_ref().is_some_and(Outbox::has_room)
    }
}

/// What a dropped subscriber leaves behind, to decide whether it is saved.
pub struct Dropped {
    pub holds_any: bool,
    pub received_any: bool,
}

#[derive(Default)]
pub struct Line {
    subscribers: IdMap<SessionId, Subscriber>,
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
    /// until it resumes. `unsent` are deliveries its connection never wrote; with the ones
    /// never queued, they are what a resume without replay sends.
    pub fn disconnect(
        &mut self,
        session: SessionId,
        unsent: impl IntoIterator<Item = MessageId>,
    ) -> Option<Dropped> {
        let subscriber = self.subscribers.get_mut(&session)?;
        subscriber.outbox = None;
        let held = &subscriber.held;
        let unsent = unsent.into_iter().filter(|id| held.contains(id));
        subscriber.unsent.extend(unsent);
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

    /// A saved subscriber comes back as `new`, at its old place, with its holdings; returns
    /// them. What it gets sent ([`Line::next_to_send`]) is every held message with `replay`,
    /// else the ones its last connection never wrote.
    pub fn reconnect(
        &mut self,
        old: SessionId,
        new: SessionId,
        capacity: Option<u64>,
        outbox: Outbox,
        replay: bool,
    ) -> Vec<MessageId> {
        let mut subscriber = self.subscribers.remove(&old).expect("a saved subscriber");
        if let Some(capacity) = capacity {
            subscriber.capacity = capacity;
        }
        subscriber.outbox = Some(outbox);
        if replay {
            subscriber.unsent = subscriber.held.clone();
        }
        let held = subscriber.held.iter().copied().collect();
        self.with_room.remove(&subscriber.place);
        self.subscribers.insert(new, subscriber);
        self.refresh(new);
        held
    }

    /// Every subscriber's session, capacity and held messages.
    pub fn held_by_each(&self) -> impl Iterator<Item = (SessionId, u64, &BTreeSet<MessageId>)> {
        let each = self.subscribers.iter();
        each.map(|(session, s)| (*session, s.capacity, &s.held))
    }

    /// Puts a saved subscriber in the line (at the back, as it has no place yet): one that
    /// held `held` on the node whose copy this node started on. Every one of them is sent
    /// when it resumes (this node cannot know which its last connection wrote).
    pub fn join_saved(&mut self, session: SessionId, capacity: u64, held: BTreeSet<MessageId>) {
        let place = self.next_place;
        self.next_place += 1;
        let subscriber = Subscriber {
            place,
            capacity,
            unsent: held.clone(),
            held,
            outbox: None,
            received: true,
        };
        self.subscribers.insert(session, subscriber);
    }

    /// The messages `session` holds (none: not in the line).
    pub fn held(&self, session: SessionId) -> impl Iterator<Item = &MessageId> {
        self.subscribers
            .get(&session)
            .into_iter()
            .flat_map(|s| &s.held)
    }

    /// How many messages `session` may hold (0: not in the line).
    pub fn capacity(&self, session: SessionId) -> u64 {
        self.subscribers.get(&session).map_or(0, |s| s.capacity)
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

    /// Gives `message` to `session`, which has room, to hold, and sends it `frame` once
    /// `gate` opens.
    pub fn hold(
        &mut self,
        session: SessionId,
        message: MessageId,
        frame: Bytes,
        gate: Option<HoldGate>,
    ) {
        let subscriber = self
            .subscribers
            .get_mut(&session)
            .expect("only subscribers in the line hold messages");
        subscriber.held.insert(message);
        subscriber.received = true;
        if let Some(outbox) = &subscriber.outbox {
            outbox.deliver(frame, message, gate);
        }
        self.refresh(session);
    }

    /// The next held message whose frame `session`'s connection should be given, if its
    /// outbox has room for it; taken out of `unsent` (the caller sends it with
    /// [`Line::send`]).
    pub fn next_to_send(&mut self, session: SessionId) -> Option<MessageId> {
        let subscriber = self.subscribers.get_mut(&session)?;
        if subscriber.unsent.is_empty() || !subscriber.outbox.as_ref()?.has_room() {
            return None;
        }
        subscriber.unsent.pop_first()
    }

    /// Queues the frame of a message `session` holds for its connection.
    pub fn send(&mut self, session: SessionId, message: MessageId, frame: Bytes) {
        let Some(subscriber) = self.subscribers.get_mut(&session) else {
            return;
        };
        match &subscriber.outbox {
            Some(outbox) => outbox.deliver(frame, message, None),
            // The connection is gone: the next one sends it.
            None => {
                subscriber.unsent.insert(message);
            }
        }
    }

    /// Sends `session` a frame that is not a delivery (a notice).
    pub fn notify(&mut self, session: SessionId, frame: Bytes) {
        if let Some(outbox) = self
            .subscribers
            .get(&session)
            .and_then(|s| s.outbox.as_ref())
        {
            let _ = outbox.send(frame);
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

    /// Keeps `with_room` true to the subscriber's holdings, capacity and connection; called
    /// too when its connection has written enough to have room again.
    pub fn refresh(&mut self, session: SessionId) {
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
