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
//!
//! Both are [`HeldIds`]: every delivery adds to them and every ack takes from them, so they
//! are kept where those are cheap.

use super::outbox::Outbox;
use crate::message::ids::{IdMap, MessageId, SessionId};
use crate::store::log::HoldGate;
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

/// A place in the line; lower stands earlier. Kept by a session for its whole life.
pub type Place = u64;

struct Subscriber {
    /// Its place in the line, from the order of logins.
    place: Place,
    /// How many messages it may hold unacknowledged.
    capacity: u64,
    /// The messages it holds now, in id order (the order a replay resends them).
    held: HeldIds,
    /// Held messages whose frames its connection has not written: not yet queued (waiting
    /// for room in the outbox), or queued and never written before the connection dropped.
    /// Sent in id order.
    unsent: HeldIds,
    /// Its connection's outbox; `None` while the session is saved after a drop.
    outbox: Option<Outbox>,
    /// Whether it was ever given a message: a session that never was is not saved.
    received: bool,
    /// Whether it is in [`Line::with_room`] (so that a refresh that changes nothing leaves
    /// the index alone: most holds and releases do not change whether it has room).
    listed: bool,
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
            held: HeldIds::default(),
            unsent: HeldIds::default(),
            outbox: Some(outbox),
            received: false,
            listed: false,
        };
        self.subscribers.insert(session, subscriber);
        self.refresh(session);
    }

    /// Takes a subscriber out of the line for good; returns what it held.
    pub fn leave(&mut self, session: SessionId) -> HeldIds {
        match self.subscribers.remove(&session) {
            Some(subscriber) => {
                self.with_room.remove(&subscriber.place);
                subscriber.held
            }
            None => HeldIds::default(),
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
        debug_assert!(
            subscriber.outbox.is_none(),
            "only a saved subscriber resumes"
        );
        if let Some(capacity) = capacity {
            subscriber.capacity = capacity;
        }
        subscriber.outbox = Some(outbox);
        if replay {
            subscriber.unsent = subscriber.held.clone();
        }
        let held = subscriber.held.iter().copied().collect();
        self.with_room.remove(&subscriber.place);
        subscriber.listed = false;
        self.subscribers.insert(new, subscriber);
        self.refresh(new);
        held
    }

    /// Every subscriber's session, capacity and held messages.
    pub fn held_by_each(&self) -> impl Iterator<Item = (SessionId, u64, &HeldIds)> {
        let each = self.subscribers.iter();
        each.map(|(session, s)| (*session, s.capacity, &s.held))
    }

    /// Puts a saved subscriber in the line (at the back, as it has no place yet): one that
    /// held `held` on the node whose copy this node started on. Every one of them is sent
    /// when it resumes (this node cannot know which its last connection wrote).
    pub fn join_saved(&mut self, session: SessionId, capacity: u64, held: HeldIds) {
        let place = self.next_place;
        self.next_place += 1;
        let subscriber = Subscriber {
            place,
            capacity,
            unsent: held.clone(),
            held,
            outbox: None,
            received: true,
            listed: false,
        };
        self.subscribers.insert(session, subscriber);
    }

    /// The messages `session` holds (none: not in the line).
    pub fn held(&self, session: SessionId) -> impl Iterator<Item = &MessageId> {
        self.subscribers
            .get(&session)
            .into_iter()
            .flat_map(|s| s.held.iter())
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
        let Some(subscriber) = self.subscribers.get_mut(&session) else {
            return;
        };
        let has_room = subscriber.has_room();
        if has_room == subscriber.listed {
            return;
        }
        subscriber.listed = has_room;
        match has_room {
            true => self.with_room.insert(subscriber.place, session),
            false => self.with_room.remove(&subscriber.place),
        };
    }
}

/// Message ids in ascending order, kept where a subscriber's holdings change most: a new
/// delivery has the highest id yet and goes to the back, and acks come mostly in id order,
/// from the front; each of those is a step, where a B-tree set rebalanced its nodes at both
/// ends (about 500 instructions a message between them, measured with callgrind). An id out
/// of order (a message that waited again, an ack out of turn) is found by binary search and
/// moves the ids on one side of it: a subscriber holds at most max-subscriber-capacity
/// (1024), so at most 512 of them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeldIds(VecDeque<MessageId>);

/// Room kept once the ids are all gone, so that a subscriber that held many and now holds
/// none keeps no more than a small one does (with some room, so one cycling between none
/// and a few does not allocate every time).
const IDLE_ROOM: usize = 64;

impl HeldIds {
    /// Adds `id`; false if it was there.
    pub fn insert(&mut self, id: MessageId) -> bool {
        if self.0.back().is_none_or(|last| *last < id) {
            self.0.push_back(id);
            return true;
        }
        match self.0.binary_search(&id) {
            Ok(_) => false,
            Err(at) => {
                self.0.insert(at, id);
                true
            }
        }
    }

    /// Takes `id` out; false if it was not there.
    pub fn remove(&mut self, id: &MessageId) -> bool {
        let removed = if self.0.front() == Some(id) {
            self.0.pop_front();
            true
        } else if let Ok(at) = self.0.binary_search(id) {
            self.0.remove(at);
            true
        } else {
            false
        };
        self.let_go_of_room();
        removed
    }

    /// Takes the lowest id out.
    pub fn pop_first(&mut self) -> Option<MessageId> {
        let first = self.0.pop_front();
        self.let_go_of_room();
        first
    }

    pub fn contains(&self, id: &MessageId) -> bool {
        self.0.binary_search(id).is_ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// In ascending order.
    pub fn iter(&self) -> impl Iterator<Item = &MessageId> {
        self.0.iter()
    }

    fn let_go_of_room(&mut self) {
        if self.0.is_empty() && self.0.capacity() > IDLE_ROOM {
            self.0 = VecDeque::new();
        }
    }
}

impl Extend<MessageId> for HeldIds {
    fn extend<I: IntoIterator<Item = MessageId>>(&mut self, ids: I) {
        for id in ids {
            self.insert(id);
        }
    }
}

/// In ascending order.
impl IntoIterator for HeldIds {
    type Item = MessageId;
    type IntoIter = std::collections::vec_deque::IntoIter<MessageId>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// In ascending order.
impl<'a> IntoIterator for &'a HeldIds {
    type Item = &'a MessageId;
    type IntoIter = std::collections::vec_deque::Iter<'a, MessageId>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn id(n: u64) -> MessageId {
        MessageId(uuid::Uuid::from_u128(u128::from(n) << 64 | 0x7000))
    }

    impl Line {
        /// Every subscriber is `listed` exactly when its place is in `with_room` (under its
        /// session), and that is exactly when it has room.
        fn check_index(&self) {
            for (session, subscriber) in &self.subscribers {
                let indexed = self.with_room.get(&subscriber.place) == Some(session);
                assert_eq!(subscriber.listed, indexed, "{session:?}");
                assert_eq!(subscriber.has_room(), indexed, "{session:?}");
            }
            assert!(self.with_room.len() <= self.subscribers.len());
        }
    }

    #[test]
    fn held_ids_at_their_ends() {
        let mut held = HeldIds::default();
        assert_eq!(held.pop_first(), None);
        assert!(!held.remove(&id(5)));
        assert!(held.insert(id(5)));
        assert!(!held.insert(id(5)), "the last one again");
        assert!(held.insert(id(7)));
        assert!(held.insert(id(6)));
        assert!(!held.insert(id(6)), "one in the middle again");
        assert_eq!(held.len(), 3);
        assert!(!held.remove(&id(4)), "below the first");
        assert!(!held.remove(&id(8)), "above the last");
        assert!(held.contains(&id(6)) && !held.contains(&id(8)));
        assert!(held.remove(&id(6)));
        assert_eq!(held.iter().copied().collect::<Vec<_>>(), [id(5), id(7)]);
    }

    /// Mostly what a subscriber's holdings meet (new ids at the back, acks from the front),
    /// with ids out of order and repeated mixed in, against a B-tree set after every step.
    #[test]
    fn held_ids_are_a_sorted_set_at_every_step() {
        let mut held = HeldIds::default();
        let mut model = BTreeSet::new();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next_new = 1000;
        for step in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let old = id(state % (next_new + 1));
            match state >> 60 {
                0..=5 => {
                    next_new += 1;
                    assert_eq!(held.insert(id(next_new)), model.insert(id(next_new)));
                }
                6 => assert_eq!(held.insert(old), model.insert(old), "step {step}"),
                7..=10 => {
                    let first = model.first().copied();
                    let first = first.unwrap_or(old);
                    assert_eq!(held.remove(&first), model.remove(&first));
                }
                11 | 12 => assert_eq!(held.remove(&old), model.remove(&old), "step {step}"),
                13 => assert_eq!(held.pop_first(), model.pop_first()),
                _ => assert_eq!(held.contains(&old), model.contains(&old)),
            }
            assert_eq!(held.len(), model.len());
            assert!(held.iter().eq(model.iter()), "step {step}");
        }
        let mut rebuilt = HeldIds::default();
        rebuilt.extend(model.iter().rev().chain(model.iter()).copied());
        assert_eq!(rebuilt, held);
        let mut extended = HeldIds::default();
        extended.extend(model.iter().rev().copied());
        assert_eq!(extended, held);
    }

    #[test]
    fn held_ids_let_go_of_their_room_once_empty() {
        let mut held = HeldIds::default();
        for n in 0..1024 {
            held.insert(id(n));
        }
        for n in 0..1023 {
            assert!(held.remove(&id(n)));
        }
        assert!(held.0.capacity() >= 1024, "kept while one is held");
        assert_eq!(held.pop_first(), Some(id(1023)));
        assert_eq!(held.0.capacity(), 0);
        for n in 0..10 {
            held.insert(id(n));
        }
        for n in 0..10 {
            held.remove(&id(n));
        }
        assert!(held.0.capacity() > 0, "a small one keeps its room");
    }

    /// The index of subscribers with room follows holds, releases, capacity changes and a
    /// reconnect, whether or not a refresh changes anything.
    #[test]
    fn the_first_with_room_follows_holdings_and_capacity() {
        let session = |n: u128| SessionId(uuid::Uuid::from_u128(n));
        let (first, second) = (session(1), session(2));
        // Their connections' ends, kept open for the test.
        let (mut connections, mut outboxes) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let (outbox, frames) = super::super::outbox::outbox(1 << 20);
            outboxes.push(outbox);
            connections.push(frames);
        }
        let mut line = Line::default();
        line.join(first, 1, outboxes.pop().unwrap());
        line.join(second, 2, outboxes.pop().unwrap());
        assert_eq!(line.first_with_room(), Some(first));
        line.check_index();
        line.hold(first, id(1), Bytes::from_static(b"1"), None);
        assert_eq!(line.first_with_room(), Some(second));
        line.check_index();
        line.hold(second, id(2), Bytes::from_static(b"2"), None);
        line.refresh(second);
        assert_eq!(line.first_with_room(), Some(second));
        line.check_index();
        line.hold(second, id(3), Bytes::from_static(b"3"), None);
        assert_eq!(line.first_with_room(), None);
        line.check_index();
        assert!(line.release(first, id(1)));
        assert!(!line.release(first, id(1)));
        assert_eq!(line.first_with_room(), Some(first));
        line.check_index();
        line.set_capacity(first, 0);
        assert_eq!(line.first_with_room(), None);
        line.check_index();
        line.set_capacity(second, 3);
        assert_eq!(line.first_with_room(), Some(second));
        line.check_index();
        line.disconnect(second, [id(3)]);
        assert_eq!(line.first_with_room(), None);
        line.check_index();
        let resumed = session(3);
        let held = line.reconnect(second, resumed, None, outboxes.pop().unwrap(), false);
        assert_eq!(held, [id(2), id(3)]);
        assert_eq!(line.next_to_send(resumed), Some(id(3)));
        assert_eq!(
            line.first_with_room(),
            None,
            "until what it was sent is queued"
        );
        line.send(resumed, id(3), Bytes::from_static(b"3"));
        line.refresh(resumed);
        assert_eq!(line.first_with_room(), Some(resumed));
        line.check_index();
        assert_eq!(
            line.leave(resumed).into_iter().collect::<Vec<_>>(),
            [id(2), id(3)]
        );
        assert_eq!(line.first_with_room(), None);
        line.check_index();
    }

    /// A subscriber whose connection has a full outbox has no room, whatever its capacity,
    /// and is back in the index once the connection has written.
    #[test]
    fn a_full_outbox_takes_a_subscriber_out_of_the_index_until_written() {
        use std::task::{Context, Poll};
        let session = SessionId(uuid::Uuid::from_u128(1));
        let (outbox, mut frames) = super::super::outbox::outbox(10);
        let mut line = Line::default();
        line.join(session, 8, outbox);
        line.check_index();
        assert_eq!(line.first_with_room(), Some(session));
        line.hold(
            session,
            id(1),
            Bytes::from_static(b"twenty bytes of json"),
            None,
        );
        line.check_index();
        assert_eq!(line.first_with_room(), None, "its outbox is at the limit");
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(matches!(frames.poll_next(&mut cx, false), Poll::Ready(_)));
        line.refresh(session);
        assert_eq!(line.first_with_room(), None, "taken, not yet written");
        assert!(frames.written(), "the queue is told there is room again");
        line.refresh(session);
        line.check_index();
        assert_eq!(line.first_with_room(), Some(session));
    }
}
