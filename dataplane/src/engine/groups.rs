//! Message groups (README, "Beyond the manual: message groups"): messages published with a
//! group are delivered in the order they were published in, one at a time: the next of a
//! group waits until the one before is acked, deleted or dead-lettered (a delivery that
//! fails puts it back first in its group). Groups are independent of each other, so they
//! spread over subscribers and receivers as ungrouped messages do. A message without a group
//! is delivered as the manual says.
//!
//! Each group has a head, the one message of it that is in the waiting line or delivered,
//! and behind it the ones blocked, in order. A group is kept while it has a message, so the
//! memory is bounded by the messages: a head and a deque per group with messages.

use crate::message::ids::MessageId;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

/// The key a group name is kept by (0 is "no group"). Two names with one key share an
/// order: still in order each, one at a time between them (as likely as 1 in 2^32).
pub fn key_of(group: &str) -> u32 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    group.hash(&mut hasher);
    (hasher.finish() as u32).max(1)
}

struct Group {
    head: MessageId,
    blocked: VecDeque<MessageId>,
}

/// Where a message that waits again, or for the first time, goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enter {
    /// Into the waiting line: it is its group's head.
    Line,
    /// Behind its group's head.
    Blocked,
}

/// What a message leaving the queue for good meant to its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// It was its group's head; the next of the group, if any, is the head now and goes
    /// into the waiting line.
    Head(Option<MessageId>),
    /// It was blocked behind its head (it never was in the waiting line).
    WasBlocked,
    /// It is in no group here.
    Unknown,
}

#[derive(Default)]
pub struct Groups {
    by_key: HashMap<u32, Group>,
    blocked: usize,
}

impl Groups {
    /// `id` of group `key` waits: as the head if the group has none (or it is the head
    /// waiting again), else behind the others.
    pub fn enter(&mut self, key: u32, id: MessageId) -> Enter {
        match self.by_key.entry(key) {
            Entry::Vacant(vacant) => {
                vacant.insert(Group {
                    head: id,
                    blocked: VecDeque::new(),
                });
                Enter::Line
            }
            Entry::Occupied(group) if group.get().head == id => Enter::Line,
            Entry::Occupied(mut group) => {
                group.get_mut().blocked.push_back(id);
                self.blocked += 1;
                Enter::Blocked
            }
        }
    }

    /// `id` of group `key` left the queue for good.
    pub fn leave(&mut self, key: u32, id: MessageId) -> Left {
        let Entry::Occupied(mut group) = self.by_key.entry(key) else {
            return Left::Unknown;
        };
        if group.get().head == id {
            return match group.get_mut().blocked.pop_front() {
                Some(next) => {
                    group.get_mut().head = next;
                    self.blocked -= 1;
                    Left::Head(Some(next))
                }
                None => {
                    group.remove();
                    Left::Head(None)
                }
            };
        }
        let blocked = &mut group.get_mut().blocked;
        match blocked.iter().position(|&other| other == id) {
            Some(at) => {
                blocked.remove(at);
                self.blocked -= 1;
                Left::WasBlocked
            }
            None => Left::Unknown,
        }
    }

    /// Every blocked message, taken out of its group (a purge of what waits); the groups keep
    /// their heads, and `head_stays` says which heads are still in the queue.
    pub fn take_blocked(&mut self, head_stays: impl Fn(MessageId) -> bool) -> Vec<MessageId> {
        let mut taken = Vec::with_capacity(self.blocked);
        self.by_key.retain(|_, group| {
            taken.extend(group.blocked.drain(..));
            head_stays(group.head)
        });
        self.blocked = 0;
        taken
    }

    /// Messages blocked behind their groups' heads (waiting, but not in the waiting line).
    pub fn blocked(&self) -> usize {
        self.blocked
    }

    pub fn clear(&mut self) {
        self.by_key.clear();
        self.blocked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> MessageId {
        MessageId(uuid::Uuid::from_bytes([n; 16]))
    }

    #[test]
    fn a_group_lines_up_its_head_and_blocks_the_rest_in_order() {
        let mut groups = Groups::default();
        let g = key_of("orders-42");
        assert_ne!(g, key_of("orders-43"));
        assert_eq!(groups.enter(g, id(1)), Enter::Line);
        assert_eq!(groups.enter(g, id(2)), Enter::Blocked);
        assert_eq!(groups.enter(g, id(3)), Enter::Blocked);
        assert_eq!(
            groups.enter(g, id(1)),
            Enter::Line,
            "the head waiting again"
        );
        assert_eq!(groups.blocked(), 2);
        assert_eq!(groups.leave(g, id(3)), Left::WasBlocked);
        assert_eq!(groups.leave(g, id(1)), Left::Head(Some(id(2))));
        assert_eq!(groups.leave(g, id(2)), Left::Head(None));
        assert_eq!((groups.blocked(), groups.by_key.len()), (0, 0));
        assert_eq!(groups.leave(g, id(2)), Left::Unknown);
    }
}
