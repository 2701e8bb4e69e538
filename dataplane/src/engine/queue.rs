//! The distribute queue's rules, as plain synchronous code with the clock passed in.
//!
//! Every message is in exactly one place: waiting (in `waiting`, in delivery order), held by one
//! subscriber (in the line), received by a pull receiver and invisible until its visibility
//! timeout (in `invisible`, by time), delayed (in `delayed`, by due time) or dead-lettered (in
//! `dead`). After every operation, `dispatch` restores the invariant that no message waits
//! while a subscriber has room. Each step costs O(log n) in what is stored; nothing walks all
//! messages or all subscribers.
//!
//! The delivery rules beyond the manual (README, "Delivery rules"), all off by default: each
//! message counts its deliveries, and with `max-receive-count` set, a message whose last
//! allowed delivery fails (its holder's session ends, or its visibility timeout passes,
//! without an ack) goes to the dead letter queue instead of back; with an expiry (the
//! message's own, or `message-retention-secs`) a message still in the queue then is deleted.
//! Timeouts and expiries are kept by time, so each fires in O(log n) without a scan.

use super::dedup::{self, Dedup, Made};
use super::groups::{self, Enter, Groups, Left};
use super::line::{HeldIds, Line};
use super::outbox::Outbox;
use crate::message::ids::{IdGenerator, IdMap, MessageId, SessionId};
use crate::message::{
    frame_body_type, notice_frame, Dead, DeadReason, Durability, Message, NewMessage,
    RecoveredMessage,
};
use crate::store::log::{HoldChange, HoldGate};
use crate::store::{Change, Holder, Life, Receipt, Store};
use qe_shared::Code;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Memory the queue counts for each message beyond its frame: its share of the id map's node,
/// its boxed entry, the frame's allocation header, the waiting line and the log's index, as
/// measured with a million stored messages (docs/performance.md). `messages-memory-used` is
/// the frames plus this each.
pub const MESSAGE_OVERHEAD_BYTES: u64 = 220;

/// While WebSocket subscribers are in the line, a waiting message is theirs alone until this
/// long after it was sent; only then may a pull receiver (the SQS face) take it. A message
/// waits beside subscribers mostly because every one's slots were full for an instant (an ack
/// not yet read), and one takes it within a millisecond or two; a pull receive costs the node
/// and its client far more than a push, and idle long-pollers that took those messages cost
/// a 16 × 16 WebSocket load a third on its reply p99 (docs/performance.md, "Idle SQS
/// long-pollers"). A line that stalls or falls behind leaves its oldest messages to them.
pub const LINE_FIRST_MS: u64 = 10;

/// The sessions a promoted standby's copy carries over (`replication::holds`): who held
/// which message on the node it followed, and how long they stay saved from the start.
#[derive(Default)]
pub struct CarriedHolds {
    /// By message: who held it.
    pub holds: IdMap<MessageId, Holder>,
    pub saved_for_ms: u64,
}

/// Why the queue refused an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the subscriber does not hold that message")]
    NotHeld,
    #[error("a durability-0 message cannot be dead-lettered")]
    NackNotDurable,
    #[error("the queue holds max-messages messages")]
    QueueFull,
    #[error("the queue's messages use max-messages-memory bytes")]
    MemoryFull,
    #[error("no such message")]
    NotFound,
    #[error("a durability-0 message cannot be moved to the dead letter queue")]
    MoveNotDurable,
    #[error("the store can no longer make a durable message safe")]
    StoreDown,
}

impl Refused {
    pub fn code(self) -> Code {
        match self {
            Refused::NotHeld => Code::InvalidMessageId,
            Refused::NackNotDurable => Code::NackDurabilityZero,
            Refused::QueueFull => Code::MessageCountExceeded,
            Refused::MemoryFull => Code::MessageMemoryExceeded,
            Refused::NotFound => Code::InvalidMessageId,
            Refused::MoveNotDurable => Code::MoveDurabilityZero,
            Refused::StoreDown => Code::DatabaseDown,
        }
    }
}

/// What a purge empties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Messages waiting for a subscriber with room (not held, not delayed).
    Waiting,
    /// Messages waiting for their delay to end.
    Delayed,
    /// The dead letter queue.
    DeadLetter,
    /// Messages pull receivers (the SQS face) received, invisible until their timeout.
    Received,
    /// Everything: waiting, held (their holders are told), delayed and dead-lettered.
    All,
}

/// Which dead-lettered messages a redrive moves back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redrive<'a> {
    /// All of them.
    All,
    /// These; each must be in the dead letter queue (a repeated id counts once).
    Ids(&'a [MessageId]),
    /// Up to this many, oldest id first.
    Count(usize),
}

/// How much the queue may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Messages, dead letter included.
    pub max_messages: u64,
    /// Bytes of [`memory_cost`], dead letter included.
    pub max_memory: u64,
}

/// What a message counts against `max-messages-memory`.
pub fn memory_cost(message: &Message) -> u64 {
    message.frame.len() as u64 + MESSAGE_OVERHEAD_BYTES
}

/// Where an administrator's page starts: after an id (`None`: from the start) or before one
/// (`None`: from the end). Pages are in ascending id order either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    After(Option<MessageId>),
    Before(Option<MessageId>),
}

/// The live counters of `getlivestats` that the queue knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Waiting, held, delayed and dead-lettered.
    pub messages: usize,
    /// Waiting for a subscriber with room.
    pub waiting: usize,
    pub saved_sessions: usize,
    pub unacknowledged: usize,
    pub dead_letter: usize,
    pub delayed: usize,
    pub durable: usize,
}

/// What the queue has done since the node started, for the control plane's counters: plain
/// integers, added to under the lock each operation already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    /// Messages taken by [`QueueState::publish`].
    pub published: u64,
    /// Messages handed to a subscriber by `dispatch` (a returned one again when it goes out
    /// again; a resend to a resumed session is not a new delivery).
    pub delivered: u64,
    pub acked: u64,
    pub nacked: u64,
    /// Publishes answered with the message an earlier one with the same deduplication id
    /// made (nothing new made).
    pub deduplicated: u64,
}

/// Where a message in the queue (not the dead letter queue) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Waiting for a subscriber with room, in `waiting`.
    Waiting,
    Held(SessionId),
    /// Received by a pull receiver, invisible until `until_ms` (ms since 1970), in
    /// `invisible`, under the receive's own number (its receipt handle names it).
    Received {
        until_ms: u64,
        receipt: u64,
    },
    /// Waiting for its delay to end, at this time (ms since 1970).
    Delayed(u64),
}

struct Entry {
    message: Message,
    place: Place,
    /// Deliveries so far, pushed and pulled.
    receives: u32,
    /// When it was first delivered, in ms after it was sent (the time in its id), plus one;
    /// 0: not yet since the node started (SQS's `ApproximateFirstReceiveTimestamp`; not kept
    /// across a restart). Four bytes where the entry had padding.
    first_delivery: u32,
    /// When it is deleted unhandled (ms since 1970); 0: never. In `expiring` when set.
    expires_ms: u64,
}

/// The delivery rules' settings (`max-receive-count`, `message-retention-secs`); zero is off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rules {
    /// Deliveries a message may have; 0: unlimited.
    pub max_receive_count: u32,
    /// How long a new message may stay, in seconds; 0: until it is handled.
    pub retention_secs: u64,
}

/// A message a pull receiver received: invisible to others until its timeout, deleted with
/// its id and `receipt` (the receipt handle names both, so a handle from an earlier receive
/// of the same message no longer acts on it).
#[derive(Debug, Clone)]
pub struct Pulled {
    pub id: MessageId,
    pub message: Message,
    /// Deliveries so far, this one included (SQS's ApproximateReceiveCount).
    pub receives: u32,
    /// When it was first delivered (ms since 1970), as far as this run of the node knows.
    pub first_delivered_ms: u64,
    /// Who sent it, if known (SQS's `SenderId`).
    pub sender: Option<std::sync::Arc<str>>,
    /// This receive's number: never given twice by one run of the node, and started at
    /// random, so a handle from before a restart (when every received message waits again)
    /// names no receive after it.
    pub receipt: u64,
    /// What the receive's answer waits for: the standby has heard of it (`store::log::heard`).
    pub heard: Option<HoldGate>,
}

pub struct QueueState {
    ids: IdGenerator,
    limits: Limits,
    /// Waiting, held and delayed messages, by id (the order administrators page in). Boxed:
    /// B-tree nodes of ascending keys stay about half full, so small values save the most.
    messages: BTreeMap<MessageId, Box<Entry>>,
    /// Waiting messages in delivery order; a returned message goes to the back. An id whose
    /// message no longer waits (an administrator took it) is skipped when it comes up.
    waiting: VecDeque<MessageId>,
    /// Ids in `waiting` to skip, and how many times: an administrator took the message while
    /// it waited. Counted, not looked up by the message's place, because a message can wait
    /// again under the same id (a redrive) and must then wait at the back, not at its old
    /// place: its old entries come first and are the ones skipped.
    skipped: IdMap<MessageId, u32>,
    /// How many messages wait (`waiting` may also hold skipped ids).
    waiting_count: usize,
    /// Delayed messages by (due time in ms, id): the first entry is the next to release.
    delayed: BTreeSet<(u64, MessageId)>,
    /// The dead letter queue, by id.
    dead: BTreeMap<MessageId, Message>,
    line: Line,
    /// Saved sessions (dropped, not resumed) and when each runs out (ms since 1970).
    saved: IdMap<SessionId, u64>,
    /// The same, by time: the first entry runs out first.
    expiries: BTreeSet<(u64, SessionId)>,
    /// Sum of [`memory_cost`] over `messages` and `dead` (what the store keeps in memory for
    /// a disk that failed a write counts too: see [`QueueState::memory_used`]).
    memory_used: u64,
    /// Messages with durability 1 or 2, dead letter included.
    durable_count: usize,
    /// Publishes, deliveries, acks and nacks since start.
    totals: Totals,
    /// Received messages by (visibility timeout in ms, id): the first entry reappears first.
    invisible: BTreeSet<(u64, MessageId)>,
    /// Messages with an expiry by (expiry in ms, id): the first entry expires first.
    expiring: BTreeSet<(u64, MessageId)>,
    /// Why and since when each dead-lettered message is there.
    deaths: IdMap<MessageId, Dead>,
    rules: Rules,
    /// The next pull receive's number ([`Pulled::receipt`]).
    next_receipt: u64,
    /// The deduplication ids whose windows have not ended ([`super::dedup`]).
    dedup: Dedup,
    /// Who sent messages, numbered for [`Message::sender`].
    senders: Senders,
    /// Message groups with messages in the queue ([`super::groups`]).
    groups: Groups,
    /// A group's next message went into the waiting line since the last look
    /// ([`QueueState::take_lined_up`]): long-polling receivers are to look again.
    lined_up: bool,
    store: Box<dyn Store>,
}

impl QueueState {
    pub fn new(store: Box<dyn Store>, limits: Limits) -> QueueState {
        QueueState {
            ids: IdGenerator::new(),
            limits,
            messages: BTreeMap::new(),
            waiting: VecDeque::new(),
            skipped: IdMap::default(),
            waiting_count: 0,
            delayed: BTreeSet::new(),
            dead: BTreeMap::new(),
            line: Line::default(),
            saved: IdMap::default(),
            expiries: BTreeSet::new(),
            memory_used: 0,
            durable_count: 0,
            totals: Totals::default(),
            invisible: BTreeSet::new(),
            expiring: BTreeSet::new(),
            deaths: IdMap::default(),
            rules: Rules::default(),
            next_receipt: random_start(),
            dedup: Dedup::default(),
            senders: Senders::default(),
            groups: Groups::default(),
            lined_up: false,
            store,
        }
    }

    /// New delivery rules, from now on: a new retention applies to messages published after
    /// it (each message's expiry is fixed when it is published, and kept with it); a new
    /// `max-receive-count` to every delivery that fails after it.
    pub fn set_rules(&mut self, rules: Rules) {
        self.rules = rules;
    }

    /// Whether a delivery that fails now was the message's last allowed one.
    fn exhausted(&self, receives: u32) -> bool {
        self.rules.max_receive_count > 0 && receives >= self.rules.max_receive_count
    }

    /// What the record of a message in the queue says beyond the message.
    fn life_of(entry: &Entry) -> Life {
        Life {
            due_ms: match entry.place {
                Place::Delayed(due_ms) => Some(due_ms),
                _ => None,
            },
            expires_ms: (entry.expires_ms != 0).then_some(entry.expires_ms),
            receives: entry.receives,
            dead: None,
        }
    }

    /// Takes a new message: it waits (or waits for its delay) and goes to the first subscriber
    /// with room.
    pub fn publish(
        &mut self,
        new: &NewMessage<'_>,
        now_ms: u64,
    ) -> Result<(MessageId, Receipt), Refused> {
        self.expire_dedup(now_ms);
        let dedup_key = new.dedup_id.as_deref().map(dedup::key_of);
        // A repeat within the window: the first's message, once its record is as safe as
        // its durability (the first's reply may not have gone yet).
        if let Some(made) = dedup_key.and_then(|key| self.dedup.made(key, now_ms)) {
            self.totals.deduplicated += 1;
            // As safe as the first was made, or as the repeat asks if that is more (a sync
            // covers the first's record too); a first kept in memory only stays so.
            let receipt = match made.lsn {
                0 => Receipt::Done,
                lsn => self
                    .store
                    .receipt_at(lsn, made.durability.max(new.durability)),
            };
            return Ok((made.id, receipt));
        }
        let refused = match new.durability {
            // Kept in memory only, but still a write a promoted standby would not have.
            Durability::None => self.store.stepped_down(),
            _ => !self.store.is_writable(),
        };
        if refused {
            return Err(Refused::StoreDown);
        }
        if self.message_count() >= self.limits.max_messages {
            return Err(Refused::QueueFull);
        }
        let id = MessageId(self.ids.next(now_ms));
        let mut message = Message::new(id, new, now_ms / 1000);
        message.sender = self.senders.number(new.sender.as_deref());
        message.group = new.group.as_deref().map_or(0, groups::key_of);
        let dedup_cost = dedup_key.map_or(0, |_| dedup::ENTRY_BYTES);
        let cost = memory_cost(&message);
        if self.memory_used() + cost + dedup_cost > self.limits.max_memory {
            return Err(Refused::MemoryFull);
        }
        let dedup = dedup_key.map(|key| crate::store::log::record::Dedup {
            key,
            until_ms: now_ms + dedup::WINDOW_MS,
        });
        let due_ms = (new.delay_secs > 0).then(|| now_ms + new.delay_secs * 1000);
        // The message's own lifetime or the queue's retention, whichever ends first.
        let lifetime_secs = [new.expires_secs, self.rules.retention_secs]
            .into_iter()
            .filter(|&secs| secs > 0)
            .min();
        let expires_ms = lifetime_secs.map(|secs| now_ms + secs * 1000);
        let life = Life {
            expires_ms,
            ..Life::due(due_ms)
        };
        let receipt = self.store.record(Change::Published {
            id,
            message: &message,
            life,
            dedup,
        });
        if let Some(dedup) = dedup {
            let made = Made {
                id,
                until_ms: dedup.until_ms,
                lsn: receipt.lsn().unwrap_or(0),
                durability: new.durability,
            };
            self.dedup.insert(dedup.key, made);
            self.memory_used += dedup_cost;
        }
        self.memory_used += cost;
        self.durable_count += (new.durability != Durability::None) as usize;
        let place = match due_ms {
            Some(due_ms) => {
                self.delayed.insert((due_ms, id));
                Place::Delayed(due_ms)
            }
            None => self.enqueue(id, message.group),
        };
        if let Some(expires_ms) = expires_ms {
            self.expiring.insert((expires_ms, id));
        }
        let entry = Entry {
            message,
            place,
            receives: 0,
            first_delivery: 0,
            expires_ms: expires_ms.unwrap_or(0),
        };
        self.messages.insert(id, Box::new(entry));
        self.totals.published += 1;
        self.dispatch_at(Some(now_ms));
        Ok((id, receipt))
    }

    /// Loads what the store kept, at start. Messages that were held (or received, and
    /// invisible) wait again, in id order, with their receive counts; a delay that ended while
    /// the node was down ends now, and so does a message that expired meanwhile (its removal
    /// is recorded then). Otherwise nothing is recorded: the store already has it all. The
    /// limits are not applied: nothing kept is ever dropped.
    /// Takes back, at start, the deduplication ids the log kept ([`super::dedup`]): those
    /// whose windows have not ended. Each made a message that is as safe as it will be.
    pub fn restore_dedup(&mut self, kept: &[(u128, MessageId, u64)], now_ms: u64) {
        for &(key, id, until_ms) in kept {
            if until_ms > now_ms && self.dedup.made(key, now_ms).is_none() {
                let made = Made {
                    id,
                    until_ms,
                    lsn: 0,
                    durability: Durability::None,
                };
                self.dedup.insert(key, made);
                self.memory_used += dedup::ENTRY_BYTES;
            }
        }
    }

    /// Takes back the messages a start read from the log; with `carried`, what was out for
    /// delivery on the node whose standby's copy this is: its sessions, saved from `now_ms`
    /// with what they held, and its SQS receives, invisible as long as they were.
    pub fn restore(
        &mut self,
        messages: Vec<RecoveredMessage>,
        carried: Option<CarriedHolds>,
        now_ms: u64,
    ) {
        let carried = carried.unwrap_or_default();
        let out = self.enter_carried(&messages, &carried, now_ms);
        let mut sessions: IdMap<SessionId, (u64, HeldIds)> = IdMap::default();
        for recovered in messages {
            let id = recovered.id;
            self.ids.observe(id.0);
            let group = crate::message::frame_group(&recovered.frame).map_or(0, groups::key_of);
            let message = Message {
                durability: recovered.durability,
                body_type: frame_body_type(&recovered.frame),
                delay_secs: recovered.delay_secs as u32,
                recdat: recovered.recdat as u32,
                frame: recovered.frame,
                sender: 0,
                group,
            };
            self.memory_used += memory_cost(&message);
            self.durable_count += 1;
            if recovered.dead {
                let dead = Dead {
                    reason: recovered.dead_reason,
                    at_ms: recovered.dead_at_ms,
                };
                self.deaths.insert(id, dead);
                self.dead.insert(id, message);
                continue;
            }
            let place = match (recovered.due_ms, out.get(&id)) {
                (Some(due_ms), _) if due_ms > now_ms => {
                    self.delayed.insert((due_ms, id));
                    Place::Delayed(due_ms)
                }
                (_, Some(Some(Holder::Session { session, capacity }))) => {
                    let (_, held) = sessions
                        .entry(*session)
                        .or_insert((*capacity, HeldIds::default()));
                    held.insert(id);
                    Place::Held(*session)
                }
                (_, Some(Some(Holder::Received { until_ms, receipt }))) => {
                    self.invisible.insert((*until_ms, id));
                    Place::Received {
                        until_ms: *until_ms,
                        receipt: *receipt,
                    }
                }
                // In its group already, behind another carried one: it waits there.
                (_, Some(None)) => {
                    self.waiting_count += 1;
                    Place::Waiting
                }
                _ => self.enqueue(id, message.group),
            };
            let expires_ms = recovered.expires_ms.unwrap_or(0);
            if expires_ms != 0 {
                self.expiring.insert((expires_ms, id));
            }
            let entry = Entry {
                message,
                place,
                receives: recovered.receives,
                first_delivery: 0,
                expires_ms,
            };
            self.messages.insert(id, Box::new(entry));
        }
        let expires_ms = now_ms + carried.saved_for_ms;
        // Back in the line in the order of their ids, the order of their logins (a place is
        // taken at login; a resume's new id is later than its place).
        let mut sessions: Vec<_> = sessions.into_iter().collect();
        sessions.sort_by_key(|(session, _)| *session);
        for (session, (capacity, held)) in sessions {
            self.ids.observe(session.0);
            self.line.join_saved(session, capacity, held);
            self.saved.insert(session, expires_ms);
            self.expiries.insert((expires_ms, session));
        }
        self.expire_messages(now_ms);
        self.dead_letter_exhausted();
        self.dispatch();
    }

    /// At start, before the rest: the carried messages still out for delivery (held, or
    /// received and still invisible), each entered first into its group, as its head (as a
    /// message out for delivery is: one of its group with a lower id may wait behind it, a
    /// delay that ended or a redrive). Some(holder): it stays out; None: another carried one
    /// heads its group, and it waits behind it (entered already).
    fn enter_carried(
        &mut self,
        messages: &[RecoveredMessage],
        carried: &CarriedHolds,
        now_ms: u64,
    ) -> IdMap<MessageId, Option<Holder>> {
        let mut out = IdMap::default();
        for recovered in messages {
            let Some(&holder) = carried.holds.get(&recovered.id) else {
                continue;
            };
            let due = recovered.due_ms.is_none_or(|due_ms| due_ms <= now_ms);
            let visible = matches!(holder, Holder::Received { until_ms, .. } if until_ms <= now_ms);
            if recovered.dead || !due || visible {
                continue;
            }
            let group = crate::message::frame_group(&recovered.frame).map_or(0, groups::key_of);
            let first = group == 0 || self.groups.enter(group, recovered.id) == Enter::Line;
            out.insert(recovered.id, first.then_some(holder));
        }
        out
    }

    /// At start: a message whose last allowed delivery was under way when the node stopped
    /// (held or received, then the stop) goes to the dead letter queue, as if that delivery
    /// had failed, since it did. Without this, a message that kills the node at each
    /// delivery would come back for ever.
    fn dead_letter_exhausted(&mut self) {
        if self.rules.max_receive_count == 0 {
            return;
        }
        // (Not one carried over as held: its delivery goes on.)
        let exhausted: Vec<MessageId> = self
            .messages
            .iter()
            .filter(|(_, entry)| !matches!(entry.place, Place::Held(_) | Place::Received { .. }))
            .filter(|(_, entry)| self.exhausted(entry.receives))
            .map(|(id, _)| *id)
            .collect();
        for id in exhausted {
            let entry = self.take(id, "movedtodlq").expect("just found");
            self.retire_exhausted(id, entry);
        }
    }

    /// Puts bytes of the store that failed their checksum in the dead letter queue, as the
    /// manual's damaged entry. Returns the receipt of the entry's own record.
    pub fn add_damaged(&mut self, file: &[u8], now_ms: u64) -> (MessageId, Receipt) {
        let id = MessageId(self.ids.next(now_ms));
        let message = Message::damaged(id, file, now_ms / 1000);
        self.memory_used += memory_cost(&message);
        self.durable_count += 1;
        let dead = Dead {
            reason: DeadReason::Rejected,
            at_ms: now_ms,
        };
        let receipt = self.store.record(Change::Published {
            id,
            message: &message,
            life: Life {
                dead: Some(dead),
                ..Life::default()
            },
            dedup: None,
        });
        self.deaths.insert(id, dead);
        self.dead.insert(id, message);
        (id, receipt)
    }

    /// A new subscriber at the back of the line; it gets waiting messages at once.
    pub fn join(&mut self, capacity: u64, outbox: Outbox, now_ms: u64) -> SessionId {
        let session = SessionId(self.ids.next(now_ms));
        self.line.join(session, capacity, outbox);
        self.dispatch();
        session
    }

    /// A capacity change; a larger one gets waiting messages at once. A smaller one keeps what
    /// is held and gets nothing new until it holds fewer than the new capacity.
    ///
    /// Not told to the store: its next delivery carries the new capacity to a standby (telling
    /// it for every held message would let a subscriber make the node ship its whole holding
    /// with each request).
    pub fn set_capacity(&mut self, session: SessionId, capacity: u64) {
        self.line.set_capacity(session, capacity);
        self.dispatch();
    }

    /// Tells the store again who holds `session`'s durable messages: a resume gives them a
    /// new session id (and perhaps a new capacity). What to wait for before the subscriber
    /// hears of its new id: the standby has heard it too.
    fn record_holder(&mut self, session: SessionId) -> Receipt {
        let capacity = self.line.capacity(session);
        let mut heard = Receipt::Done;
        for &id in self.line.held(session) {
            if self.messages[&id].message.durability != Durability::None {
                let holder = Holder::Session { session, capacity };
                heard = heard.and(self.store.record(Change::Delivered { id, holder }));
            }
        }
        heard
    }

    /// "Done": the message is removed.
    pub fn ack(&mut self, session: SessionId, id: MessageId) -> Result<Receipt, Refused> {
        if !self.line.release(session, id) {
            return Err(Refused::NotHeld);
        }
        let entry = self
            .messages
            .remove(&id)
            .expect("a held message is in the queue");
        let receipt = self.done_with(id, &entry);
        self.dispatch();
        Ok(receipt)
    }

    /// A message its receiver is done with (an ack, an SQS delete), taken out of the map:
    /// out of its expiry and its group, forgotten, counted, and its removal recorded.
    fn done_with(&mut self, id: MessageId, entry: &Entry) -> Receipt {
        self.unexpire(id, entry);
        self.left_group(id, entry.message.group);
        self.forget(&entry.message);
        self.totals.acked += 1;
        self.record_removal(id, entry.message.durability)
    }

    /// Records that message `id` is gone. One kept in memory only was never written: there is
    /// nothing to remove, and the store's lock is not taken (once per ack at durability 0).
    fn record_removal(&mut self, id: MessageId, durability: Durability) -> Receipt {
        match durability {
            Durability::None => Receipt::Done,
            _ => self.store.record(Change::Acked(id)),
        }
    }

    /// "I cannot handle this": the message goes to the dead letter queue, never to be
    /// delivered again.
    pub fn nack(&mut self, session: SessionId, id: MessageId) -> Result<Receipt, Refused> {
        if !self.line.holds(session, id) {
            return Err(Refused::NotHeld);
        }
        if self.messages[&id].message.durability == Durability::None {
            return Err(Refused::NackNotDurable);
        }
        self.line.release(session, id);
        let entry = self
            .messages
            .remove(&id)
            .expect("a held message is in the queue");
        self.unexpire(id, &entry);
        self.left_group(id, entry.message.group);
        let receipt = self.dead_letter(id, *entry, DeadReason::Rejected);
        self.totals.nacked += 1;
        self.dispatch();
        Ok(receipt)
    }

    /// A session ends (logout, or a drop without resume): what it held goes to the first
    /// subscriber with room, else to the back of the queue, in id order; a message whose last
    /// allowed delivery this was goes to the dead letter queue instead. What a logout's reply
    /// waits for: the standby hearing the last of those returns (each is numbered after the
    /// one before).
    pub fn leave(&mut self, session: SessionId) -> Option<HoldGate> {
        if let Some(expires_ms) = self.saved.remove(&session) {
            self.expiries.remove(&(expires_ms, session));
        }
        let mut gate = None;
        for id in self.line.leave(session) {
            gate = self.delivery_failed(id).or(gate);
        }
        self.dispatch();
        gate
    }

    /// A delivery of `id` (held or received) ended without an ack: the message waits again at
    /// the back, or, if that was its last allowed delivery, goes to the dead letter queue (a
    /// durability-0 message, which cannot go there, is deleted). What to wait for before a
    /// caller that asked for it is answered: the standby hearing it waits again (else, should
    /// the standby be promoted, the message would stay with its holder there until that
    /// holder's time runs out).
    fn delivery_failed(&mut self, id: MessageId) -> Option<HoldGate> {
        let (receives, group) = {
            let entry = &self.messages[&id];
            (entry.receives, entry.message.group)
        };
        if !self.exhausted(receives) {
            let place = self.enqueue(id, group);
            let entry = self
                .messages
                .get_mut(&id)
                .expect("a delivered message is in the queue");
            entry.place = place;
            if entry.message.durability == Durability::None {
                return None;
            }
            return self.store.record(Change::Returned(id)).into_gate();
        }
        let entry = self
            .messages
            .remove(&id)
            .expect("a delivered message is in the queue");
        self.unexpire(id, &entry);
        self.left_group(id, group);
        self.retire_exhausted(id, *entry);
        None
    }

    /// A message out of the queue whose deliveries are used up: to the dead letter queue, or,
    /// at durability 0, which cannot go there, deleted.
    fn retire_exhausted(&mut self, id: MessageId, entry: Entry) {
        match entry.message.durability {
            Durability::None => self.forget(&entry.message),
            _ => {
                let _ = self.dead_letter(id, entry, DeadReason::MaxReceives);
            }
        }
    }

    /// Puts a message taken out of the queue in the dead letter queue, recording why and when
    /// in a new record of the whole message (a mark, which older nodes wrote for a rejection,
    /// has room for neither: `qe dlq list` shows both). The time is the wall clock's, not a
    /// caller's `now_ms`: it is only ever shown, and the paths here (a nack, a session's end,
    /// a visibility timeout, a restart) do not all carry one.
    fn dead_letter(&mut self, id: MessageId, entry: Entry, reason: DeadReason) -> Receipt {
        let dead = Dead {
            reason,
            at_ms: super::now_ms(),
        };
        let life = Life {
            dead: Some(dead),
            ..QueueState::life_of(&entry)
        };
        self.deaths.insert(id, dead);
        let receipt = self.store.record(Change::Published {
            id,
            message: &entry.message,
            life,
            dedup: None,
        });
        self.dead.insert(id, entry.message);
        receipt
    }

    /// Why and since when a dead-lettered message is there; None if it is not in the dead
    /// letter queue.
    pub fn death(&self, id: MessageId) -> Option<Dead> {
        self.deaths.get(&id).copied()
    }

    /// A message left the queue (not for the dead letter queue's keeping): its expiry goes.
    fn unexpire(&mut self, id: MessageId, entry: &Entry) {
        if entry.expires_ms != 0 {
            self.expiring.remove(&(entry.expires_ms, id));
        }
    }

    /// A pull receiver takes up to `max` waiting messages, front first: each is invisible to
    /// every other receiver and subscriber for `visibility_ms`, then waits again unless it was
    /// deleted ([`QueueState::delete_received`]) or its visibility changed. Each receive
    /// counts as a delivery; a durable message's count is written at once.
    /// While WebSocket subscribers are in the line, only messages sent [`LINE_FIRST_MS`]
    /// before `now_ms` are taken.
    pub fn receive(&mut self, max: usize, visibility_ms: u64, now_ms: u64) -> Vec<Pulled> {
        self.release_due(now_ms);
        let mut pulled = Vec::new();
        while pulled.len() < max {
            let Some(id) = self.front_pullable(now_ms) else {
                break;
            };
            self.waiting.pop_front();
            let Some(entry) = self.messages.get_mut(&id) else {
                continue; // (front_pullable found it held)
            };
            self.waiting_count -= 1;
            let until_ms = now_ms + visibility_ms;
            let receipt = self.next_receipt;
            self.next_receipt = self.next_receipt.wrapping_add(1);
            entry.place = Place::Received { until_ms, receipt };
            entry.receives = entry.receives.saturating_add(1);
            note_delivery(entry, id, now_ms);
            self.invisible.insert((until_ms, id));
            self.totals.delivered += 1;
            let mut received = Pulled {
                id,
                message: entry.message.clone(),
                receives: entry.receives,
                first_delivered_ms: first_delivered_ms(entry, id),
                sender: self.senders.name(entry.message.sender).cloned(),
                receipt,
                heard: None,
            };
            self.record_receives(id);
            received.heard = self.record_received(id, until_ms, receipt);
            pulled.push(received);
        }
        pulled
    }

    /// Writes a durable message's receive count (a new record of it), so that a restart
    /// keeps it. Not waited on: a crash in between loses at most the count of this delivery.
    fn record_receives(&mut self, id: MessageId) {
        let entry = &self.messages[&id];
        if entry.message.durability == Durability::None {
            return;
        }
        let life = QueueState::life_of(entry);
        let message = &entry.message;
        let _ = self.store.record(Change::Published {
            id,
            message,
            life,
            dedup: None,
        });
    }

    /// When a message received under receive number `receipt` stops being invisible; None
    /// if it is not received under that number (any more).
    fn received(&self, id: MessageId, receipt: u64) -> Option<u64> {
        match self.messages.get(&id)?.place {
            Place::Received {
                until_ms,
                receipt: current,
            } if current == receipt => Some(until_ms),
            _ => None,
        }
    }

    /// A pull receiver deletes a message it received (receive number `receipt`): done, as an
    /// ack. `NotHeld` if the message is not received under that number any more (its
    /// visibility ran out, and perhaps it was received again).
    pub fn delete_received(&mut self, id: MessageId, receipt: u64) -> Result<Receipt, Refused> {
        let Some(until_ms) = self.received(id, receipt) else {
            return Err(Refused::NotHeld);
        };
        self.invisible.remove(&(until_ms, id));
        let entry = self.messages.remove(&id).expect("just found");
        let receipt = self.done_with(id, &entry);
        self.dispatch();
        Ok(receipt)
    }

    /// What an answer that every change recorded so far is stored waits for
    /// ([`Store::everything_recorded`]).
    pub fn everything_recorded(&self) -> Receipt {
        self.store.everything_recorded()
    }

    /// A pull receiver changes how long a message it received stays invisible: from now,
    /// `visibility_ms` more (0: it waits again at once, at the back, as a failed delivery).
    /// What its answer waits for: the standby hearing the new visibility.
    pub fn change_visibility(
        &mut self,
        id: MessageId,
        receipt: u64,
        visibility_ms: u64,
        now_ms: u64,
    ) -> Result<Option<HoldGate>, Refused> {
        let Some(until_ms) = self.received(id, receipt) else {
            return Err(Refused::NotHeld);
        };
        self.invisible.remove(&(until_ms, id));
        if visibility_ms == 0 {
            let gate = self.delivery_failed(id);
            self.dispatch();
            return Ok(gate);
        }
        let until_ms = now_ms + visibility_ms;
        self.invisible.insert((until_ms, id));
        self.messages.get_mut(&id).expect("just found").place =
            Place::Received { until_ms, receipt };
        Ok(self.record_received(id, until_ms, receipt))
    }

    /// Tells the store that a durable message is received until `until_ms` under receive
    /// number `receipt` (a standby keeps it, so the receipt handle outlives a promotion);
    /// what to wait for before the receiver hears of it.
    fn record_received(&mut self, id: MessageId, until_ms: u64, receipt: u64) -> Option<HoldGate> {
        if self.messages[&id].message.durability == Durability::None {
            return None;
        }
        let holder = Holder::Received { until_ms, receipt };
        self.store
            .record(Change::Delivered { id, holder })
            .into_gate()
    }

    /// Every received message whose visibility timeout has passed waits again (or goes to the
    /// dead letter queue, if that was its last allowed delivery).
    pub fn release_invisible(&mut self, now_ms: u64) {
        while let Some(&(until_ms, id)) = self.invisible.first() {
            if until_ms > now_ms {
                break;
            }
            self.invisible.pop_first();
            self.delivery_failed(id);
        }
        self.dispatch();
    }

    /// When the next received message becomes visible again (ms since 1970).
    pub fn next_visible(&self) -> Option<u64> {
        self.invisible.first().map(|&(until_ms, _)| until_ms)
    }

    /// Deletes every message in the queue whose expiry has passed, wherever it is (a holder
    /// is told, as for `delmsg`). The dead letter queue keeps what it has.
    pub fn expire_messages(&mut self, now_ms: u64) {
        while let Some(&(expires_ms, id)) = self.expiring.first() {
            if expires_ms > now_ms {
                break;
            }
            let entry = self
                .take(id, "deleted")
                .expect("an expiring message is queued");
            self.forget(&entry.message);
            let _ = self.record_removal(id, entry.message.durability);
        }
        self.dispatch();
    }

    /// When the next message expires (ms since 1970).
    pub fn next_expiring(&self) -> Option<u64> {
        self.expiring.first().map(|&(expires_ms, _)| expires_ms)
    }

    /// The connection of `session` dropped without a logout. The session is saved for
    /// `timeout_ms` if it holds a message, or if it has received one and fewer than
    /// `max_saved` sessions are saved; otherwise it ends now. `unsent` are deliveries the
    /// connection never sent. Returns whether the session was saved.
    pub fn disconnect(
        &mut self,
        session: SessionId,
        unsent: Vec<MessageId>,
        timeout_ms: u64,
        max_saved: u64,
        now_ms: u64,
    ) -> bool {
        let Some(dropped) = self.line.disconnect(session, unsent) else {
            return false;
        };
        let room_to_save = (self.saved.len() as u64) < max_saved;
        if !(dropped.holds_any || dropped.received_any && room_to_save) {
            self.leave(session);
            return false;
        }
        let expires_ms = now_ms + timeout_ms;
        self.saved.insert(session, expires_ms);
        self.expiries.insert((expires_ms, session));
        true
    }

    /// Resumes a saved session under a new id, at its old place and with what it held:
    /// resending all of it (`replay`) or only what was never sent. `None` if `old` is not a
    /// saved session (never saved, ended, already resumed, or its time ran out). With the new
    /// id, what its reply waits for (a standby hearing who holds what now).
    pub fn resume(
        &mut self,
        old: SessionId,
        capacity: Option<u64>,
        replay: bool,
        outbox: Outbox,
        now_ms: u64,
    ) -> Option<(SessionId, Receipt)> {
        let expires_ms = *self.saved.get(&old)?;
        if expires_ms <= now_ms {
            self.expire_sessions(now_ms);
            return None;
        }
        self.saved.remove(&old);
        self.expiries.remove(&(expires_ms, old));
        let new = SessionId(self.ids.next(now_ms));
        let held = self.line.reconnect(old, new, capacity, outbox, replay);
        for id in &held {
            self.messages
                .get_mut(id)
                .expect("a held message is in the queue")
                .place = Place::Held(new);
        }
        let heard = self.record_holder(new);
        self.pump(new);
        self.dispatch();
        Some((new, heard))
    }

    /// `session`'s connection has written enough to have room in its outbox again: it gets
    /// what it holds and was not sent yet, then new messages.
    pub fn drained(&mut self, session: SessionId) {
        self.pump(session);
        self.dispatch();
    }

    /// Queues the frames of `session`'s held messages that its connection has not been given,
    /// while its outbox has room; the rest go as it writes (see [`QueueState::drained`]).
    /// Then it has room for new messages if its capacity and outbox allow.
    fn pump(&mut self, session: SessionId) {
        while let Some(id) = self.line.next_to_send(session) {
            let frame = self.messages[&id].message.frame_for_delivery();
            self.line.send(session, id, frame);
        }
        self.line.refresh(session);
    }

    /// Ends every saved session whose time has run out: what they held goes back.
    pub fn expire_sessions(&mut self, now_ms: u64) {
        while let Some(&(expires_ms, session)) = self.expiries.first() {
            if expires_ms > now_ms {
                break;
            }
            self.expiries.pop_first();
            self.saved.remove(&session);
            self.leave(session);
        }
    }

    /// Whether a group's next message went into the waiting line since the last call (an ack
    /// or a delete can make a message wait, with groups only).
    pub fn take_lined_up(&mut self) -> bool {
        std::mem::take(&mut self.lined_up)
    }

    /// Forgets the deduplication ids whose windows ended by `now_ms`, and gives back the
    /// memory they counted.
    pub fn expire_dedup(&mut self, now_ms: u64) {
        self.memory_used -= self.dedup.expire(now_ms) as u64 * dedup::ENTRY_BYTES;
    }

    /// When the next deduplication id's window ends (ms since 1970).
    pub fn next_dedup_end(&self) -> Option<u64> {
        self.dedup.next_end()
    }

    /// When the next saved session runs out (ms since 1970).
    pub fn next_expiry(&self) -> Option<u64> {
        self.expiries.first().map(|&(expires_ms, _)| expires_ms)
    }

    /// Who holds which durable message, subscribers' sessions and SQS receives: what a
    /// standby that attaches is sent first (`replication::holds`). Costs the holds, not the
    /// messages.
    pub fn holds(&self) -> Vec<HoldChange> {
        let mut holds = Vec::new();
        for (session, capacity, held) in self.line.held_by_each() {
            for &id in held {
                let durable = self.messages[&id].message.durability != Durability::None;
                if durable {
                    let holder = Holder::Session { session, capacity };
                    holds.push(HoldChange::Held { id, holder });
                }
            }
        }
        for &(_, id) in &self.invisible {
            let entry = &self.messages[&id];
            let Place::Received { until_ms, receipt } = entry.place else {
                continue;
            };
            if entry.message.durability != Durability::None {
                let holder = Holder::Received { until_ms, receipt };
                holds.push(HoldChange::Held { id, holder });
            }
        }
        holds
    }

    /// Saved sessions (the manual's "saved subscribers").
    pub fn saved_count(&self) -> usize {
        self.saved.len()
    }

    /// The live counters (`getlivestats`) that the queue keeps.
    pub fn counts(&self) -> Counts {
        let delayed = self.delayed.len();
        Counts {
            messages: self.messages.len() + self.dead.len(),
            waiting: self.waiting_count,
            saved_sessions: self.saved.len(),
            // Every message in `messages` waits, is held, or is delayed.
            unacknowledged: self.messages.len() - self.waiting_count - delayed,
            dead_letter: self.dead.len(),
            delayed,
            durable: self.durable_count,
        }
    }

    /// Publishes, deliveries, acks and nacks since start.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Up to `count` messages of the queue (`dead_letter` false) or the dead letter queue, in
    /// id order, from `anchor`: O(log n + count).
    pub fn page(
        &self,
        dead_letter: bool,
        anchor: Anchor,
        count: usize,
    ) -> Vec<(MessageId, &Message)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let range = match anchor {
            Anchor::After(Some(id)) => (Excluded(id), Unbounded),
            Anchor::Before(Some(id)) => (Unbounded, Excluded(id)),
            Anchor::After(None) | Anchor::Before(None) => (Unbounded, Unbounded),
        };
        let backwards = matches!(anchor, Anchor::Before(_));
        let mut page: Vec<(MessageId, &Message)> = match (dead_letter, backwards) {
            (false, false) => {
                let rows = self.messages.range(range).take(count);
                rows.map(|(id, entry)| queued(id, entry)).collect()
            }
            (false, true) => {
                let rows = self.messages.range(range).rev().take(count);
                rows.map(|(id, entry)| queued(id, entry)).collect()
            }
            (true, false) => self.dead.range(range).take(count).map(dead).collect(),
            (true, true) => self.dead.range(range).rev().take(count).map(dead).collect(),
        };
        if backwards {
            page.reverse();
        }
        page
    }

    /// A message of the queue (`dead` false) or of the dead letter queue.
    pub fn get(&self, id: MessageId, dead: bool) -> Option<&Message> {
        match dead {
            false => self.messages.get(&id).map(|e| &e.message),
            true => self.dead.get(&id),
        }
    }

    /// An administrator deletes a waiting, held or delayed message; its holder is told.
    pub fn delete(&mut self, id: MessageId) -> Result<Receipt, Refused> {
        let entry = self.take(id, "deleted").ok_or(Refused::NotFound)?;
        self.forget(&entry.message);
        let receipt = self.store.record(Change::Acked(id));
        self.dispatch();
        Ok(receipt)
    }

    /// An administrator moves a waiting, held or delayed message to the dead letter queue;
    /// its holder is told. A durability-0 message cannot go there.
    pub fn move_to_dead_letter(&mut self, id: MessageId) -> Result<Receipt, Refused> {
        let entry = self.messages.get(&id).ok_or(Refused::NotFound)?;
        if entry.message.durability == Durability::None {
            return Err(Refused::MoveNotDurable);
        }
        let entry = self.take(id, "movedtodlq").expect("just found");
        let receipt = self.dead_letter(id, entry, DeadReason::Rejected);
        self.dispatch();
        Ok(receipt)
    }

    /// An administrator deletes a message from the dead letter queue.
    pub fn delete_dead_letter(&mut self, id: MessageId) -> Result<Receipt, Refused> {
        let message = self.dead.remove(&id).ok_or(Refused::NotFound)?;
        self.deaths.remove(&id);
        self.forget(&message);
        Ok(self.store.record(Change::Acked(id)))
    }

    /// An administrator empties a part of the queue (see [`Scope`]): holders of what goes are
    /// told, as for `delmsg`. One store record names every message that goes. Costs O(log n)
    /// per message removed (and the waiting line's skipped ids), nothing for what stays.
    /// Returns how many went, and the receipt of the record.
    pub fn purge(&mut self, scope: Scope, now_ms: u64) -> (usize, Receipt) {
        // A delay that has ended makes its message waiting, whether or not the timer ran.
        self.release_due(now_ms);
        let mut gone: Vec<MessageId> = Vec::new();
        let mut forgotten = (0u64, 0usize);
        let mut forget = |message: &Message| {
            forgotten.0 += memory_cost(message);
            forgotten.1 += (message.durability != Durability::None) as usize;
        };
        if scope == Scope::Waiting {
            for id in std::mem::take(&mut self.waiting) {
                if self.skip(id) {
                    continue;
                }
                let entry = self
                    .messages
                    .remove(&id)
                    .expect("a waiting message is queued");
                debug_assert_eq!(entry.place, Place::Waiting);
                if entry.expires_ms != 0 {
                    self.expiring.remove(&(entry.expires_ms, id));
                }
                forget(&entry.message);
                gone.push(id);
            }
            debug_assert!(self.skipped.is_empty());
            // And the messages blocked behind their groups' heads; a group keeps its head
            // only if that is delivered (not purged above).
            let messages = &self.messages;
            for id in self
                .groups
                .take_blocked(|head| messages.contains_key(&head))
            {
                let entry = self
                    .messages
                    .remove(&id)
                    .expect("a blocked message is queued");
                if entry.expires_ms != 0 {
                    self.expiring.remove(&(entry.expires_ms, id));
                }
                forget(&entry.message);
                gone.push(id);
            }
            self.waiting_count = 0;
        }
        // Delayed and received messages are both kept by time: each scope empties its set.
        let timed = match scope {
            Scope::Delayed => std::mem::take(&mut self.delayed),
            Scope::Received => std::mem::take(&mut self.invisible),
            _ => BTreeSet::new(),
        };
        for (_, id) in timed {
            let entry = self
                .messages
                .remove(&id)
                .expect("a delayed or received message is queued");
            if entry.expires_ms != 0 {
                self.expiring.remove(&(entry.expires_ms, id));
            }
            // A received group head: the next of its group waits in the line now.
            self.left_group(id, entry.message.group);
            forget(&entry.message);
            gone.push(id);
        }
        if scope == Scope::All {
            self.groups.clear();
            self.waiting.clear();
            self.skipped.clear();
            self.waiting_count = 0;
            self.delayed.clear();
            self.invisible.clear();
            self.expiring.clear();
            for (id, entry) in std::mem::take(&mut self.messages) {
                if let Place::Held(session) = entry.place {
                    self.line.release(session, id);
                    self.line.notify(session, notice_frame("deleted", id));
                }
                forget(&entry.message);
                gone.push(id);
            }
        }
        if matches!(scope, Scope::DeadLetter | Scope::All) {
            for (id, message) in std::mem::take(&mut self.dead) {
                forget(&message);
                gone.push(id);
            }
            self.deaths.clear();
        }
        self.memory_used -= forgotten.0;
        self.durable_count -= forgotten.1;
        let receipt = match gone.is_empty() {
            true => Receipt::Done,
            false => self.store.record(Change::Purged(&gone)),
        };
        self.dispatch();
        (gone.len(), receipt)
    }

    /// The dead-lettered messages a redrive of `which` would move, in the order it moves them
    /// (ascending id; a list in its own order); `NotFound` if a listed id is not in the dead
    /// letter queue, or is a damaged entry (which is no message to deliver); `StoreDown` if the
    /// store can no longer make the move durable. Changes nothing.
    pub fn redrive_selection(&self, which: Redrive<'_>) -> Result<Vec<MessageId>, Refused> {
        if !self.store.is_writable() {
            return Err(Refused::StoreDown);
        }
        let redrivable =
            |(id, message): (&MessageId, &Message)| (!message.is_damaged()).then_some(*id);
        match which {
            Redrive::All => Ok(self.dead.iter().filter_map(redrivable).collect()),
            Redrive::Count(count) => Ok(self
                .dead
                .iter()
                .filter_map(redrivable)
                .take(count)
                .collect()),
            Redrive::Ids(ids) => {
                let found = |id: &MessageId| self.dead.get_key_value(id).and_then(redrivable);
                if !ids.iter().all(|id| found(id).is_some()) {
                    return Err(Refused::NotFound);
                }
                let mut seen = BTreeSet::new();
                Ok(ids.iter().copied().filter(|id| seen.insert(*id)).collect())
            }
        }
    }

    /// Moves `ids` from the dead letter queue to the back of the queue, unchanged (id, frame,
    /// durability, publish time), in that order, and delivers them to subscribers with room.
    /// An id no longer there (deleted since it was chosen) is passed over. Each move is its
    /// own store record, which flips the message's place: however many of them a crash lets
    /// through, each message is in exactly one of the two. Returns how many moved, and one
    /// receipt for them all.
    pub fn redrive(&mut self, ids: &[MessageId]) -> (usize, Receipt) {
        let mut moved = 0;
        let mut receipt = Receipt::Done;
        for &id in ids {
            let Some(message) = self.dead.remove(&id) else {
                continue;
            };
            self.deaths.remove(&id);
            // A redriven message starts again: no receives counted, no expiry.
            let place = self.enqueue(id, message.group);
            let entry = Entry {
                message,
                place,
                receives: 0,
                first_delivery: 0,
                expires_ms: 0,
            };
            self.messages.insert(id, Box::new(entry));
            receipt = receipt.and(self.store.record(Change::Redriven(id)));
            moved += 1;
        }
        self.dispatch();
        (moved, receipt)
    }

    /// Takes `id` out of the queue, wherever it is; a holder gets a `notice` and its slot back.
    fn take(&mut self, id: MessageId, notice: &str) -> Option<Entry> {
        let entry = *self.messages.remove(&id)?;
        self.unexpire(id, &entry);
        let was_blocked = self.left_group(id, entry.message.group);
        match entry.place {
            // Its receiver learns at its delete or visibility change, which then fails.
            Place::Received { until_ms, .. } => {
                self.invisible.remove(&(until_ms, id));
            }
            // Blocked behind its group's head: it never was in `waiting`.
            Place::Waiting if was_blocked => self.waiting_count -= 1,
            // Its id stays in `waiting` and is skipped when it comes up.
            Place::Waiting => {
                self.waiting_count -= 1;
                *self.skipped.entry(id).or_default() += 1;
                self.compact_waiting_if_mostly_skipped();
            }
            Place::Held(session) => {
                self.line.release(session, id);
                self.line.notify(session, notice_frame(notice, id));
            }
            Place::Delayed(due_ms) => {
                self.delayed.remove(&(due_ms, id));
            }
        }
        Some(entry)
    }

    /// A message left for good: it no longer counts against the limits.
    fn forget(&mut self, message: &Message) {
        self.memory_used -= memory_cost(message);
        self.durable_count -= (message.durability != Durability::None) as usize;
    }

    /// Moves every delayed message whose time has come to the back of the queue.
    pub fn release_due(&mut self, now_ms: u64) {
        while let Some(&(due_ms, id)) = self.delayed.first() {
            if due_ms > now_ms {
                break;
            }
            self.delayed.pop_first();
            let group = self.messages[&id].message.group;
            let place = self.enqueue(id, group);
            self.messages
                .get_mut(&id)
                .expect("a delayed message is in the queue")
                .place = place;
        }
        self.dispatch();
    }

    /// When the next delayed message is due (ms since 1970).
    pub fn next_due(&self) -> Option<u64> {
        self.delayed.first().map(|&(due_ms, _)| due_ms)
    }

    /// Messages the queue holds, dead letter included (what `max-messages` limits).
    pub fn message_count(&self) -> u64 {
        (self.messages.len() + self.dead.len()) as u64
    }

    pub fn dead_letter_count(&self) -> usize {
        self.dead.len()
    }

    pub fn is_dead_lettered(&self, id: MessageId) -> bool {
        self.dead.contains_key(&id)
    }

    pub fn waiting_count(&self) -> usize {
        self.waiting_count
    }

    /// When the oldest waiting message may go to a pull receiver (ms since 1970; see
    /// [`LINE_FIRST_MS`]): 0 with no WebSocket subscriber in the line. None: none waits in
    /// the line.
    pub fn next_pullable(&mut self) -> Option<u64> {
        let oldest = self.front_waiting()?;
        Some(self.pullable_from(oldest))
    }

    /// Whether a pull receiver may take a waiting message at `now_ms`.
    pub fn pullable_at(&mut self, now_ms: u64) -> bool {
        self.front_pullable(now_ms).is_some()
    }

    /// The message at the front of the waiting line, if a pull receiver may take it at
    /// `now_ms`.
    fn front_pullable(&mut self, now_ms: u64) -> Option<MessageId> {
        let oldest = self.front_waiting()?;
        (self.pullable_from(oldest) <= now_ms).then_some(oldest)
    }

    /// When waiting message `id` may go to a pull receiver: at once (0) with no WebSocket
    /// subscriber in the line, else [`LINE_FIRST_MS`] after it was sent.
    fn pullable_from(&self, id: MessageId) -> u64 {
        match self.line.is_empty() {
            true => 0,
            false => sent_ms(id) + LINE_FIRST_MS,
        }
    }

    /// Whether a WebSocket subscriber is in the line (with room or not).
    pub fn has_subscribers(&self) -> bool {
        !self.line.is_empty()
    }

    /// The message at the front of the waiting line, once the ids ahead of it that no longer
    /// wait (skipped, or taken otherwise) are dropped.
    fn front_waiting(&mut self) -> Option<MessageId> {
        while let Some(&id) = self.waiting.front() {
            let stale = self.skipped.contains_key(&id)
                || self
                    .messages
                    .get(&id)
                    .is_none_or(|entry| entry.place != Place::Waiting);
            if !stale {
                return Some(id);
            }
            self.waiting.pop_front();
            self.skip(id);
        }
        None
    }

    pub fn delayed_count(&self) -> usize {
        self.delayed.len()
    }

    /// `messages-memory-used`: the messages, and the records the store holds in memory
    /// because the disk would not take them yet.
    pub fn memory_used(&self) -> u64 {
        self.memory_used + self.store.backlog_bytes()
    }

    /// Puts `id` at the back of the waiting line, or, when its group (`group`, 0: none) has
    /// a message waiting or delivered already, behind that one; its place is then `Waiting`.
    fn enqueue(&mut self, id: MessageId, group: u32) -> Place {
        if group == 0 || self.groups.enter(group, id) == Enter::Line {
            self.waiting.push_back(id);
        }
        self.waiting_count += 1;
        Place::Waiting
    }

    /// `id` of `group` left the queue for good: the next of its group, if any, goes into
    /// the waiting line. Whether `id` was blocked behind its group's head (so never in the
    /// waiting line).
    fn left_group(&mut self, id: MessageId, group: u32) -> bool {
        if group == 0 {
            return false;
        }
        match self.groups.leave(group, id) {
            Left::Head(Some(next)) => {
                self.waiting.push_back(next);
                self.lined_up = true;
                false
            }
            Left::WasBlocked => true,
            Left::Head(None) | Left::Unknown => false,
        }
    }

    /// Whether this entry of `id` in `waiting`, just taken from its front, is one to skip.
    fn skip(&mut self, id: MessageId) -> bool {
        let Some(count) = self.skipped.get_mut(&id) else {
            return false;
        };
        *count -= 1;
        if *count == 0 {
            self.skipped.remove(&id);
        }
        true
    }

    /// Drops the skipped ids from `waiting` once they outnumber the waiting messages (and
    /// `MIN_SKIPPED_TO_COMPACT`): with nobody subscribed, nothing pops them, so a million
    /// messages moved to the dead letter queue would otherwise keep a million ids in the line
    /// and in `skipped`, and the next purge of a few waiting ones would walk them all. Each
    /// pass costs the line's length and at least halves it, so each take pays O(1) amortized.
    fn compact_waiting_if_mostly_skipped(&mut self) {
        const MIN_SKIPPED_TO_COMPACT: usize = 4096;
        // (Blocked messages wait, but not in the line.)
        let in_line = self.waiting_count - self.groups.blocked();
        let skipped = self.waiting.len() - in_line;
        if skipped < MIN_SKIPPED_TO_COMPACT.max(in_line) {
            return;
        }
        let mut line = std::mem::take(&mut self.waiting);
        line.retain(|id| !self.skip(*id));
        debug_assert!(self.skipped.is_empty());
        debug_assert_eq!(line.len(), in_line);
        self.waiting = line;
    }

    /// Gives waiting messages, front first, to the first subscriber with room, until nothing
    /// waits or nobody has room.
    fn dispatch(&mut self) {
        self.dispatch_at(None);
    }

    /// `dispatch`, with the clock's reading if the caller took one: a delivery notes the time
    /// (once for all it makes), and the clock costs more than the rest of its bookkeeping.
    fn dispatch_at(&mut self, mut now_ms: Option<u64>) {
        while let Some(session) = self.line.first_with_room() {
            let Some(id) = self.waiting.pop_front() else {
                break;
            };
            if self.skip(id) {
                continue;
            }
            let Some(entry) = self.messages.get_mut(&id) else {
                continue; // taken by an administrator while it waited
            };
            if entry.place != Place::Waiting {
                continue;
            }
            self.waiting_count -= 1;
            entry.place = Place::Held(session);
            entry.receives = entry.receives.saturating_add(1);
            let delivered_ms = *now_ms.get_or_insert_with(crate::engine::now_ms);
            note_delivery(entry, id, delivered_ms);
            let frame = entry.message.frame_for_delivery();
            let mut gate = None;
            if entry.message.durability != Durability::None {
                let capacity = self.line.capacity(session);
                let holder = Holder::Session { session, capacity };
                gate = self
                    .store
                    .record(Change::Delivered { id, holder })
                    .into_gate();
            }
            self.line.hold(session, id, frame, gate);
            self.totals.delivered += 1;
            // Written only when the count can decide something: without max-receive-count,
            // a pushed delivery writes nothing, as before the rules.
            if self.rules.max_receive_count > 0 {
                self.record_receives(id);
            }
        }
    }
}

/// Where receive numbers start: at random, so those of one run are not those of the last.
fn random_start() -> u64 {
    u64::from_le_bytes(qe_shared::random::bytes())
}

/// A page's row from the queue's map.
fn queued<'a>(id: &MessageId, entry: &'a Entry) -> (MessageId, &'a Message) {
    (*id, &entry.message)
}

/// A page's row from the dead letter queue's map.
fn dead<'a>((id, message): (&MessageId, &'a Message)) -> (MessageId, &'a Message) {
    (*id, message)
}

#[cfg(test)]
mod tests;

/// When a message was sent (ms since 1970): the time in its id (a UUID v7).
fn sent_ms(id: MessageId) -> u64 {
    let (secs, nanos) = id.0.get_timestamp().map_or((0, 0), |t| t.to_unix());
    secs * 1000 + u64::from(nanos) / 1_000_000
}

/// Notes a delivery at `now_ms`: the first one's time is kept.
fn note_delivery(entry: &mut Entry, id: MessageId, now_ms: u64) {
    if entry.first_delivery == 0 {
        let after_ms = now_ms.saturating_sub(sent_ms(id)).saturating_add(1);
        entry.first_delivery = after_ms.min(u64::from(u32::MAX)) as u32;
    }
}

/// When a message was first delivered (ms since 1970).
fn first_delivered_ms(entry: &Entry, id: MessageId) -> u64 {
    sent_ms(id) + u64::from(entry.first_delivery.saturating_sub(1))
}

/// The senders messages name, numbered from 1 (0 is "not known"), at most `u16::MAX - 1`: a
/// sender past that is not known. Senders are few (a queue's SQS keys and logins).
#[derive(Debug, Default)]
struct Senders {
    names: Vec<std::sync::Arc<str>>,
    numbers: std::collections::HashMap<std::sync::Arc<str>, u16>,
    /// The number given last: a run of publishes mostly comes from one sender, and a
    /// comparison costs less than hashing the name.
    last: u16,
}

impl Senders {
    fn number(&mut self, sender: Option<&str>) -> u16 {
        let Some(sender) = sender else { return 0 };
        if self.name(self.last).is_some_and(|last| **last == *sender) {
            return self.last;
        }
        if let Some(&number) = self.numbers.get(sender) {
            self.last = number;
            return number;
        }
        if self.names.len() >= usize::from(u16::MAX - 1) {
            return 0;
        }
        let name: std::sync::Arc<str> = sender.into();
        self.names.push(name.clone());
        let number = self.names.len() as u16;
        self.numbers.insert(name, number);
        self.last = number;
        number
    }

    fn name(&self, number: u16) -> Option<&std::sync::Arc<str>> {
        let index = usize::from(number).checked_sub(1)?;
        self.names.get(index)
    }
}
