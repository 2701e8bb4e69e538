//! The queue's rules, fed publishes, acks, capacity changes and leaves, with the clock in hand.

use super::*;
use crate::engine::outbox::{outbox, Frames};
use crate::message::BodyType;
use crate::store::MemoryStore;
use bytes::Bytes;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

const T0: u64 = 1_794_233_033_000;

fn roomy() -> Limits {
    Limits {
        max_messages: 1_000_000,
        max_memory: 1 << 30,
    }
}

fn queue() -> QueueState {
    QueueState::new(Box::new(MemoryStore), roomy())
}

fn text(body: &str) -> NewMessage<'_> {
    NewMessage {
        body: body.into(),
        ..NewMessage::default()
    }
}

struct Sub {
    session: SessionId,
    frames: Frames,
}

/// The next frame queued for a connection, taken as the connection takes it.
fn take(frames: &mut Frames) -> Option<Bytes> {
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    match frames.poll_next(&mut cx, false) {
        Poll::Ready(frame) => Some(frame),
        Poll::Pending => None,
    }
}

impl Sub {
    fn join(q: &mut QueueState, capacity: u64) -> Sub {
        Sub::join_with_outbox(q, capacity, usize::MAX)
    }

    /// A subscriber whose outbox takes `limit` bytes.
    fn join_with_outbox(q: &mut QueueState, capacity: u64, limit: usize) -> Sub {
        let (outbox, frames) = outbox(limit);
        let session = q.join(capacity, outbox, T0);
        Sub { session, frames }
    }

    /// Bodies and ids of the frames sent since the last call, as a connection that writes
    /// them all and then tells the queue it has room again.
    fn received_by(&mut self, q: &mut QueueState) -> Vec<(String, MessageId)> {
        let received = self.received();
        if self.frames.written() {
            q.drained(self.session);
        }
        received
    }

    /// Bodies and ids of the frames queued since the last call (taken, not yet written).
    fn received(&mut self) -> Vec<(String, MessageId)> {
        let mut out = Vec::new();
        while let Some(frame) = take(&mut self.frames) {
            let v: serde_json::Value = serde_json::from_slice(&frame).unwrap();
            let id = MessageId::parse(v["id"].as_str().unwrap()).unwrap();
            out.push((v["body"].as_str().unwrap().to_string(), id));
        }
        out
    }

    fn bodies(&mut self) -> Vec<String> {
        self.received().into_iter().map(|(b, _)| b).collect()
    }
}

fn publish(q: &mut QueueState, body: &str) -> MessageId {
    let (id, _receipt) = q.publish(&text(body), T0).unwrap();
    id
}

#[test]
fn each_message_goes_to_the_first_subscriber_in_the_line_with_room() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 2);
    let mut b = Sub::join(&mut q, 1);
    let mut c = Sub::join(&mut q, 3);
    for body in ["m1", "m2", "m3", "m4", "m5"] {
        publish(&mut q, body);
    }
    assert_eq!(a.bodies(), ["m1", "m2"]);
    assert_eq!(b.bodies(), ["m3"]);
    assert_eq!(c.bodies(), ["m4", "m5"]);
    assert_eq!(q.waiting_count(), 0);
}

#[test]
fn messages_are_not_spread_evenly() {
    let mut q = queue();
    let mut first = Sub::join(&mut q, 10);
    let mut idle = Sub::join(&mut q, 10);
    for i in 0..5 {
        let id = publish(&mut q, &format!("m{i}"));
        let _ = q.ack(first.session, id).unwrap();
    }
    assert_eq!(first.bodies().len(), 5);
    assert!(idle.bodies().is_empty(), "the back of the line stays idle");
}

#[test]
fn an_ack_makes_room_and_the_oldest_waiting_message_follows() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 1);
    let m1 = publish(&mut q, "m1");
    publish(&mut q, "m2");
    publish(&mut q, "m3");
    assert_eq!(a.bodies(), ["m1"]);
    assert_eq!(q.waiting_count(), 2);
    let _ = q.ack(a.session, m1).unwrap();
    assert_eq!(a.bodies(), ["m2"]);
    assert_eq!(q.message_count(), 2);
}

#[test]
fn an_earlier_subscriber_that_gets_room_is_served_before_later_ones() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 1);
    let mut b = Sub::join(&mut q, 1);
    let m1 = publish(&mut q, "m1");
    publish(&mut q, "m2");
    publish(&mut q, "m3");
    assert_eq!(a.bodies(), ["m1"]);
    assert_eq!(b.bodies(), ["m2"]);
    let _ = q.ack(a.session, m1).unwrap();
    assert_eq!(a.bodies(), ["m3"]);
    assert!(b.bodies().is_empty());
}

#[test]
fn a_larger_capacity_gets_waiting_messages_at_once() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 1);
    for body in ["m1", "m2", "m3"] {
        publish(&mut q, body);
    }
    assert_eq!(a.bodies(), ["m1"]);
    q.set_capacity(a.session, 3);
    assert_eq!(a.bodies(), ["m2", "m3"]);
}

#[test]
fn a_smaller_capacity_keeps_what_is_held_and_takes_nothing_new_until_below_it() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 3);
    let ids: Vec<MessageId> = ["m1", "m2", "m3"].map(|b| publish(&mut q, b)).into();
    assert_eq!(a.bodies().len(), 3);
    q.set_capacity(a.session, 1);
    publish(&mut q, "m4");
    let _ = q.ack(a.session, ids[0]).unwrap();
    assert!(a.bodies().is_empty(), "holds 2 with capacity 1");
    let _ = q.ack(a.session, ids[1]).unwrap();
    assert!(a.bodies().is_empty(), "holds 1 with capacity 1");
    let _ = q.ack(a.session, ids[2]).unwrap();
    assert_eq!(a.bodies(), ["m4"]);
}

#[test]
fn only_the_holder_can_ack_and_only_once() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 1);
    let b = Sub::join(&mut q, 1);
    let m1 = publish(&mut q, "m1");
    assert_eq!(a.bodies(), ["m1"]);
    assert_eq!(q.ack(b.session, m1).unwrap_err(), Refused::NotHeld);
    assert!(q.ack(a.session, m1).is_ok());
    assert_eq!(q.ack(a.session, m1).unwrap_err(), Refused::NotHeld);
    let unknown = MessageId::parse("01a1c09f-62da-7000-a30b-0817c9a42e3f").unwrap();
    assert_eq!(q.ack(a.session, unknown).unwrap_err(), Refused::NotHeld);
}

#[test]
fn a_nack_dead_letters_the_message_and_it_is_never_delivered_again() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 1);
    let mut b = Sub::join(&mut q, 1);
    let m1 = publish(&mut q, "m1");
    assert_eq!(a.bodies(), ["m1"]);
    let _ = q.nack(a.session, m1).unwrap();
    assert!(q.is_dead_lettered(m1));
    assert_eq!(q.dead_letter_count(), 1);
    assert_eq!(q.message_count(), 1, "the dead letter queue counts");
    q.leave(a.session);
    assert!(b.bodies().is_empty());
    assert_eq!(q.ack(a.session, m1).unwrap_err(), Refused::NotHeld);
}

#[test]
fn the_totals_count_publishes_deliveries_acks_and_nacks_and_refusals_count_nothing() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 2);
    let m1 = publish(&mut q, "m1");
    let m2 = publish(&mut q, "m2");
    publish(&mut q, "m3");
    assert_eq!(a.bodies(), ["m1", "m2"]);
    let _ = q.ack(a.session, m1).unwrap();
    let _ = q.nack(a.session, m2).unwrap();
    assert_eq!(q.ack(a.session, m1).unwrap_err(), Refused::NotHeld);
    assert_eq!(a.bodies(), ["m3"]);
    // m3 goes back when a leaves, and out again to b: a second delivery.
    q.leave(a.session);
    let mut b = Sub::join(&mut q, 1);
    assert_eq!(b.bodies(), ["m3"]);
    let totals = q.totals();
    assert_eq!(
        totals,
        Totals {
            published: 3,
            delivered: 4,
            acked: 1,
            nacked: 1,
            deduplicated: 0,
        }
    );
    let counts = q.counts();
    assert_eq!(
        (counts.waiting, counts.unacknowledged, counts.dead_letter),
        (0, 1, 1)
    );
    let mut full = QueueState::new(
        Box::new(MemoryStore),
        Limits {
            max_messages: 0,
            ..roomy()
        },
    );
    assert_eq!(
        full.publish(&text("no room"), T0).unwrap_err(),
        Refused::QueueFull
    );
    assert_eq!(
        full.totals(),
        Totals::default(),
        "a refused publish is not counted"
    );
}

#[test]
fn a_durability_zero_message_cannot_be_nacked_and_stays_held() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 1);
    let new = NewMessage {
        durability: Durability::None,
        ..text("m1")
    };
    let (m1, _) = q.publish(&new, T0).unwrap();
    assert_eq!(a.bodies(), ["m1"]);
    assert_eq!(q.nack(a.session, m1).unwrap_err(), Refused::NackNotDurable);
    assert_eq!(Refused::NackNotDurable.code().number(), 305);
    assert!(q.ack(a.session, m1).is_ok());
}

#[test]
fn a_leaving_subscribers_messages_go_to_the_first_subscriber_with_room() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 2);
    let mut b = Sub::join(&mut q, 1);
    let mut c = Sub::join(&mut q, 5);
    for body in ["m1", "m2", "m3"] {
        publish(&mut q, body);
    }
    assert_eq!(a.bodies(), ["m1", "m2"]);
    assert_eq!(b.bodies(), ["m3"]);
    q.leave(a.session);
    assert!(b.bodies().is_empty(), "b is full");
    assert_eq!(c.bodies(), ["m1", "m2"], "c is the first with room");
}

#[test]
fn with_nobody_to_take_them_returned_messages_go_to_the_back_of_the_queue() {
    let mut q = queue();
    let a = Sub::join(&mut q, 2);
    publish(&mut q, "m1");
    publish(&mut q, "m2");
    publish(&mut q, "m3");
    publish(&mut q, "m4");
    q.leave(a.session);
    let mut b = Sub::join(&mut q, 10);
    assert_eq!(b.bodies(), ["m3", "m4", "m1", "m2"]);
}

#[test]
fn a_delayed_message_waits_for_its_time_then_joins_the_back() {
    let mut q = queue();
    let delayed = NewMessage {
        delay_secs: 10,
        ..text("later")
    };
    let _ = q.publish(&delayed, T0).unwrap();
    publish(&mut q, "now");
    let mut a = Sub::join(&mut q, 1);
    assert_eq!(a.bodies(), ["now"]);
    assert_eq!(q.delayed_count(), 1);
    assert_eq!(q.next_due(), Some(T0 + 10_000));
    q.release_due(T0 + 9_999);
    assert_eq!(q.delayed_count(), 1);
    q.release_due(T0 + 10_000);
    assert_eq!(q.delayed_count(), 0);
    assert_eq!(
        q.waiting_count(),
        1,
        "a is full: the released message waits"
    );
    let mut b = Sub::join(&mut q, 1);
    assert_eq!(b.bodies(), ["later"]);
    assert_eq!(q.next_due(), None);
}

#[test]
fn delayed_messages_are_released_in_due_order() {
    let mut q = queue();
    for (body, delay_secs) in [("c", 30), ("a", 10), ("b", 20), ("two-days", 172_800)] {
        let new = NewMessage {
            delay_secs,
            ..text(body)
        };
        let _ = q.publish(&new, T0).unwrap();
    }
    let mut s = Sub::join(&mut q, 10);
    q.release_due(T0 + 30_000);
    assert_eq!(s.bodies(), ["a", "b", "c"]);
    q.release_due(T0 + 172_800_000);
    assert_eq!(s.bodies(), ["two-days"]);
}

#[test]
fn max_messages_counts_the_dead_letter_queue() {
    let limits = Limits {
        max_messages: 2,
        max_memory: 1 << 30,
    };
    let mut q = QueueState::new(Box::new(MemoryStore), limits);
    let a = Sub::join(&mut q, 1);
    let m1 = publish(&mut q, "m1");
    let _ = q.nack(a.session, m1).unwrap();
    publish(&mut q, "m2");
    let refused = q.publish(&text("m3"), T0).unwrap_err();
    assert_eq!(refused, Refused::QueueFull);
    assert_eq!(refused.code().number(), 210);
}

#[test]
fn max_messages_memory_counts_frames_and_overhead() {
    let mut probe = queue();
    publish(&mut probe, "0123456789");
    let one = probe.memory_used();
    assert_eq!(
        one,
        94 + MESSAGE_OVERHEAD_BYTES,
        "a 10-byte body makes a 94-byte frame"
    );
    let limits = Limits {
        max_messages: 100,
        max_memory: 2 * one,
    };
    let mut q = QueueState::new(Box::new(MemoryStore), limits);
    let a = Sub::join(&mut q, 5);
    let m1 = publish(&mut q, "0123456789");
    publish(&mut q, "0123456789");
    let refused = q.publish(&text("0123456789"), T0).unwrap_err();
    assert_eq!(refused, Refused::MemoryFull);
    assert_eq!(refused.code().number(), 211);
    let _ = q.ack(a.session, m1).unwrap();
    assert_eq!(q.memory_used(), one);
    assert!(q.publish(&text("0123456789"), T0).is_ok());
}

#[test]
fn binary_and_keyed_messages_keep_their_fields() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 1);
    let new = NewMessage {
        body_type: BodyType::Binary,
        body: "aGVsbG8=".into(),
        publisher_key: Some("k-1".into()),
        ..NewMessage::default()
    };
    let _ = q.publish(&new, T0).unwrap();
    let frame = take(&mut a.frames).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&frame).unwrap();
    assert_eq!(v["type"], 2);
    assert_eq!(v["body"], "aGVsbG8=");
    assert_eq!(v["publisherkey"], "k-1");
    assert_eq!(v["recdat"], T0 / 1000);
}

/// A store that writes down every change it is told of.
#[derive(Clone, Default)]
struct RecordingStore(Arc<Mutex<Vec<String>>>);

impl Store for RecordingStore {
    fn record(&mut self, change: Change<'_>) -> Receipt {
        let line = match change {
            // A move to the dead letter queue writes the whole message again, with why and
            // when.
            Change::Published { id, life, .. } if life.dead.is_some() => {
                format!("dead-lettered {id}")
            }
            Change::Published { id, life, .. } if life.receives > 0 => {
                format!("rewritten {id} receives {}", life.receives)
            }
            Change::Published { id, .. } => format!("published {id}"),
            Change::Delivered { id, .. } => format!("delivered {id}"),
            Change::Acked(id) => format!("acked {id}"),
            Change::DeadLettered(id) => format!("dead-lettered {id}"),
            Change::Returned(id) => format!("returned {id}"),
            Change::Purged(ids) => format!("purged {}", ids.len()),
            Change::Redriven(id) => format!("redriven {id}"),
        };
        self.0.lock().unwrap().push(line);
        Receipt::Done
    }
}

#[test]
fn every_change_passes_the_store() {
    let store = RecordingStore::default();
    let mut q = QueueState::new(Box::new(store.clone()), roomy());
    let a = Sub::join(&mut q, 2);
    let m1 = publish(&mut q, "m1");
    let m2 = publish(&mut q, "m2");
    let _ = q.ack(a.session, m1).unwrap();
    let _ = q.nack(a.session, m2).unwrap();
    let m3 = publish(&mut q, "m3");
    q.leave(a.session);
    let log = store.0.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            format!("published {m1}"),
            format!("delivered {m1}"),
            format!("published {m2}"),
            format!("delivered {m2}"),
            format!("acked {m1}"),
            format!("dead-lettered {m2}"),
            format!("published {m3}"),
            format!("delivered {m3}"),
            format!("returned {m3}"),
        ]
    );
}

/// What a standby is told of holds (`replication::holds`): every delivery of a durable
/// message with its holder, again under the new id when its session resumes (not for a
/// capacity change); nothing of a message kept in memory only, which no copy has.
#[test]
fn a_durable_messages_holder_is_told_to_the_store_and_again_after_a_resume() {
    let store = RecordingStore::default();
    let mut q = QueueState::new(Box::new(store.clone()), roomy());
    let a = Sub::join(&mut q, 2);
    let durable = publish(&mut q, "durable");
    let memory_only = NewMessage {
        durability: Durability::None,
        ..text("memory only")
    };
    let _ = q.publish(&memory_only, T0).unwrap();
    let old = a.drop_connection(&mut q, vec![], 100);
    let a = Sub::resume(&mut q, old, Some(5), true, T0 + 1).unwrap();
    q.set_capacity(a.session, 6);
    q.leave(a.session);
    let log = store.0.lock().unwrap().clone();
    let delivered = format!("delivered {durable}");
    assert_eq!(log.len(), 5, "{log:?}");
    assert_eq!(log[0], format!("published {durable}"));
    assert_eq!(log[1], delivered);
    assert!(log[2].starts_with("published "), "{log:?}");
    assert_eq!(log[3], delivered, "held under its new id and capacity");
    assert_eq!(
        log[4],
        format!("returned {durable}"),
        "not for a capacity change"
    );
    let holds = q.holds();
    assert!(holds.is_empty(), "{holds:?}");
}

/// A node started on a promoted standby's copy: each session its primary had is saved, with
/// what it held; a new subscriber gets none of that, the holder resumes with it, and a
/// session nobody resumes in time gives it back.
#[test]
fn a_copy_carries_its_primarys_sessions_as_saved_with_what_they_held() {
    let mut q = queue();
    let session = |n: u128| SessionId(uuid::Uuid::from_u128(T0 as u128 + n));
    let (first, second) = (session(1), session(2));
    let id = |n: u128| MessageId(uuid::Uuid::from_u128(n));
    let by = |session, capacity| Holder::Session { session, capacity };
    let carried = CarriedHolds {
        holds: [
            (id(1), by(first, 2)),
            (id(2), by(first, 2)),
            (id(3), by(second, 1)),
        ]
        .into_iter()
        .collect(),
        saved_for_ms: 10_000,
    };
    let messages = (1..=4)
        .map(|n| RecoveredMessage {
            frame: Arc::from(
                format!(r#"{{"id":"{}","type":1,"body":"b{n}","recdat":1}}"#, id(n)).as_bytes(),
            ),
            ..recovered(n, 1, None)
        })
        .collect();
    q.restore(messages, Some(carried), T0);
    assert_eq!(q.saved_count(), 2);
    let mut newcomer = Sub::join(&mut q, 10);
    assert_eq!(newcomer.bodies(), ["b4"], "nothing another session holds");

    let mut resumed = Sub::resume(&mut q, first, None, false, T0 + 1).unwrap();
    assert_eq!(
        resumed.bodies(),
        ["b1", "b2"],
        "all it held: this node cannot know what was written"
    );
    assert!(q.ack(resumed.session, id(1)).is_ok());
    publish(&mut q, "next");
    assert_eq!(resumed.bodies(), ["next"], "its capacity (2) came with it");

    q.expire_sessions(T0 + 10_001);
    assert_eq!(q.saved_count(), 0);
    assert_eq!(newcomer.bodies(), ["b3"], "the unresumed session's goes on");
}

/// A carried hold heads its group again, though a message of its group with a lower id waits
/// (its delay ended while the later one was held): that one waits behind it, and the group
/// goes on in order once it is acked.
#[test]
fn a_carried_hold_heads_its_group_and_the_group_goes_on_after_it() {
    let mut q = queue();
    let holder = SessionId(uuid::Uuid::from_u128(T0 as u128 + 9));
    let id = |n: u128| MessageId(uuid::Uuid::from_u128(n));
    let in_group = |n: u128| RecoveredMessage {
        frame: Arc::from(
            format!(
                r#"{{"id":"{}","group":"g","type":1,"body":"b{n}","recdat":1}}"#,
                id(n)
            )
            .as_bytes(),
        ),
        ..recovered(n, 1, None)
    };
    let carried = CarriedHolds {
        holds: [(
            id(2),
            Holder::Session {
                session: holder,
                capacity: 1,
            },
        )]
        .into_iter()
        .collect(),
        saved_for_ms: 10_000,
    };
    q.restore(vec![in_group(1), in_group(2)], Some(carried), T0);
    assert_eq!(q.saved_count(), 1);
    let mut newcomer = Sub::join(&mut q, 10);
    assert!(newcomer.bodies().is_empty(), "b1 waits behind the held b2");
    let mut resumed = Sub::resume(&mut q, holder, None, true, T0 + 1).unwrap();
    assert_eq!(resumed.bodies(), ["b2"]);
    assert!(q.ack(resumed.session, id(2)).is_ok());
    // b1 goes to the first with room: the resumed session, back before the newcomer.
    assert_eq!(resumed.bodies(), ["b1"]);
    publish_grouped(&mut q, "b3");
    assert!(newcomer.bodies().is_empty(), "one of the group at a time");
    assert!(q.ack(resumed.session, id(1)).is_ok());
    assert_eq!(resumed.bodies(), ["b3"]);
}

fn publish_grouped(q: &mut QueueState, body: &str) {
    let _ = q.publish(&grouped(body, "g"), T0 + 2).unwrap();
}

/// An SQS receive carried to a promoted copy stays invisible as long as it was, and its
/// receive number (in its receipt handle) deletes it; one whose visibility has passed waits.
#[test]
fn a_copy_carries_its_primarys_sqs_receives_with_their_visibility() {
    let mut q = queue();
    let id = |n: u128| MessageId(uuid::Uuid::from_u128(n));
    let received = |until_ms, receipt| Holder::Received { until_ms, receipt };
    let carried = CarriedHolds {
        holds: [
            (id(1), received(T0 + 5_000, 42)),
            (id(2), received(T0 - 1, 43)),
        ]
        .into_iter()
        .collect(),
        saved_for_ms: 10_000,
    };
    let messages = (1..=2).map(|n| recovered(n, 1, None)).collect();
    q.restore(messages, Some(carried), T0);
    let pulled: Vec<MessageId> = q.receive(10, 1_000, T0).iter().map(|p| p.id).collect();
    assert_eq!(pulled, [id(2)], "the invisible one is not received again");
    assert!(
        q.delete_received(id(1), 42).is_ok(),
        "its handle deletes it"
    );
    assert!(q.receive(10, 1_000, T0 + 5_001).is_empty());
}

#[test]
fn ten_thousand_full_subscribers_do_not_stand_between_a_publish_and_the_one_with_room() {
    let mut q = queue();
    let mut full: Vec<Sub> = (0..10_000).map(|_| Sub::join(&mut q, 1)).collect();
    for i in 0..10_000 {
        publish(&mut q, &format!("m{i}"));
    }
    assert!(full.iter_mut().all(|s| s.bodies().len() == 1));
    let mut last = Sub::join(&mut q, 1);
    publish(&mut q, "for the last");
    assert_eq!(last.bodies(), ["for the last"]);
    // The index of subscribers with room holds only `last`'s absence now: every publish asked
    // it one O(log n) question instead of walking 10,000 full subscribers.
    assert_eq!(q.line.first_with_room(), None);
}

// Sessions: saved on a drop, resumed at their place, run out.

const TIMEOUT_MS: u64 = 10_000;

impl Sub {
    /// Drops the connection; `unsent` are deliveries it never sent.
    fn drop_connection(
        self,
        q: &mut QueueState,
        unsent: Vec<MessageId>,
        max_saved: u64,
    ) -> SessionId {
        let _ = q.disconnect(self.session, unsent, TIMEOUT_MS, max_saved, T0);
        self.session
    }

    fn resume(
        q: &mut QueueState,
        old: SessionId,
        capacity: Option<u64>,
        replay: bool,
        now: u64,
    ) -> Option<Sub> {
        Sub::resume_with_outbox(q, old, capacity, replay, now, usize::MAX)
    }

    fn resume_with_outbox(
        q: &mut QueueState,
        old: SessionId,
        capacity: Option<u64>,
        replay: bool,
        now: u64,
        limit: usize,
    ) -> Option<Sub> {
        let (outbox, frames) = outbox(limit);
        let (session, _) = q.resume(old, capacity, replay, outbox, now)?;
        Some(Sub { session, frames })
    }
}

#[test]
fn a_dropped_session_keeps_what_it_holds_and_resumes_at_its_place() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 2);
    let mut b = Sub::join(&mut q, 5);
    let m1 = publish(&mut q, "m1");
    assert_eq!(a.bodies(), ["m1"]);
    let old = a.drop_connection(&mut q, vec![], 100);
    assert_eq!(q.saved_count(), 1);
    publish(&mut q, "m2");
    assert_eq!(b.bodies(), ["m2"], "a saved session gets nothing new");

    let mut a = Sub::resume(&mut q, old, None, true, T0 + 1_000).unwrap();
    assert_ne!(a.session, old, "every login gives a new session id");
    assert_eq!(a.bodies(), ["m1"], "replay resends what it holds");
    assert_eq!(q.saved_count(), 0);
    // Its place is before b's, and its capacity (2) is kept: m3 goes to it.
    publish(&mut q, "m3");
    assert_eq!(a.bodies(), ["m3"]);
    assert!(
        q.ack(a.session, m1).is_ok(),
        "it still holds m1, under its new id"
    );
    assert!(
        Sub::resume(&mut q, old, None, true, T0 + 2_000).is_none(),
        "only the latest id"
    );
}

#[test]
fn without_replay_only_what_was_never_sent_is_sent_again() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 3);
    let m1 = publish(&mut q, "sent");
    let m2 = publish(&mut q, "never sent");
    assert_eq!(a.received().len(), 2);
    let old = a.drop_connection(&mut q, vec![m2], 100);
    let mut a = Sub::resume(&mut q, old, Some(1), false, T0 + 1).unwrap();
    assert_eq!(a.bodies(), ["never sent"]);
    assert!(q.ack(a.session, m1).is_ok() && q.ack(a.session, m2).is_ok());
    publish(&mut q, "next");
    assert_eq!(
        a.bodies(),
        ["next"],
        "the capacity given on resume (1) applies"
    );
}

#[test]
fn a_saved_session_runs_out_and_what_it_held_goes_on() {
    let mut q = queue();
    let a = Sub::join(&mut q, 1);
    let mut b = Sub::join(&mut q, 1);
    publish(&mut q, "m1");
    publish(&mut q, "m2");
    assert_eq!(b.bodies(), ["m2"]);
    let old = a.drop_connection(&mut q, vec![], 100);
    assert_eq!(q.next_expiry(), Some(T0 + TIMEOUT_MS));
    q.expire_sessions(T0 + TIMEOUT_MS - 1);
    assert_eq!(q.saved_count(), 1);
    let mut c = Sub::join(&mut q, 1);
    q.expire_sessions(T0 + TIMEOUT_MS);
    assert_eq!(q.saved_count(), 0);
    assert_eq!(c.bodies(), ["m1"], "b is full; c is the first with room");
    assert!(Sub::resume(&mut q, old, None, true, T0 + TIMEOUT_MS).is_none());
}

#[test]
fn a_session_that_never_received_a_message_is_not_saved() {
    let mut q = queue();
    let a = Sub::join(&mut q, 1);
    let old = a.drop_connection(&mut q, vec![], 100);
    assert_eq!(q.saved_count(), 0);
    assert!(Sub::resume(&mut q, old, None, true, T0).is_none());
}

#[test]
fn one_that_holds_nothing_is_saved_only_below_max_saved() {
    let mut q = queue();
    let mut olds = Vec::new();
    for _ in 0..3 {
        let mut s = Sub::join(&mut q, 1);
        let id = publish(&mut q, "m");
        assert_eq!(s.bodies().len(), 1);
        let _ = q.ack(s.session, id).unwrap();
        olds.push(s.drop_connection(&mut q, vec![], 2));
    }
    assert_eq!(
        q.saved_count(),
        2,
        "the third held nothing and two were saved already"
    );
    assert!(Sub::resume(&mut q, olds[2], None, false, T0).is_none());
    // One that holds a message is saved whatever the count.
    let s = Sub::join(&mut q, 1);
    publish(&mut q, "held");
    s.drop_connection(&mut q, vec![], 2);
    assert_eq!(q.saved_count(), 3);
    assert!(Sub::resume(&mut q, olds[0], None, false, T0).is_some());
}

#[test]
fn a_session_resumes_once() {
    let mut q = queue();
    let a = Sub::join(&mut q, 1);
    publish(&mut q, "m1");
    let old = a.drop_connection(&mut q, vec![], 100);
    assert!(Sub::resume(&mut q, old, None, true, T0).is_some());
    assert!(
        Sub::resume(&mut q, old, None, true, T0).is_none(),
        "the second finds it taken"
    );
}

/// Room for two of the test's frames (~90 bytes each) in an outbox.
const TWO_FRAMES: usize = 150;

#[test]
fn a_full_outbox_leaves_messages_waiting_and_they_flow_as_it_is_written() {
    let mut q = queue();
    let mut a = Sub::join_with_outbox(&mut q, 10, TWO_FRAMES);
    for i in 0..10 {
        publish(&mut q, &format!("m{i}"));
    }
    assert_eq!(
        q.waiting_count(),
        8,
        "two frames fill a's outbox; the rest wait"
    );
    let mut bodies = Vec::new();
    for _ in 0..5 {
        let round = a.received_by(&mut q);
        assert_eq!(round.len(), 2, "each time a has written, two more");
        bodies.extend(round.into_iter().map(|(body, _)| body));
    }
    let expected: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies, expected, "all of them, oldest first");
    assert_eq!(q.waiting_count(), 0);
}

#[test]
fn while_one_outbox_is_full_the_next_subscriber_with_room_gets_the_message() {
    let mut q = queue();
    let mut a = Sub::join_with_outbox(&mut q, 10, TWO_FRAMES);
    let mut b = Sub::join(&mut q, 10);
    for i in 0..3 {
        publish(&mut q, &format!("m{i}"));
    }
    assert_eq!(a.bodies(), ["m0", "m1"]);
    assert_eq!(b.bodies(), ["m2"], "a has no room while its outbox is full");
}

#[test]
fn a_replay_bigger_than_the_outbox_goes_out_as_the_connection_writes() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 10);
    let ids: Vec<MessageId> = (0..10).map(|i| publish(&mut q, &format!("m{i}"))).collect();
    assert_eq!(a.received().len(), 10);
    let old = a.drop_connection(&mut q, vec![], 100);
    let mut a = Sub::resume_with_outbox(&mut q, old, None, true, T0 + 1, TWO_FRAMES).unwrap();
    let mut resent = Vec::new();
    for _ in 0..6 {
        resent.extend(a.received_by(&mut q).into_iter().map(|(_, id)| id));
    }
    assert_eq!(resent, ids, "every held message once, in id order");
}

#[test]
fn a_resume_without_replay_sends_what_the_old_connection_never_wrote() {
    let mut q = queue();
    let mut a = Sub::join_with_outbox(&mut q, 10, TWO_FRAMES);
    let ids: Vec<MessageId> = (0..6).map(|i| publish(&mut q, &format!("m{i}"))).collect();
    // The connection writes m0 and m1; it takes m2 and m3 but never writes them; m4 and m5
    // never fit in its outbox.
    assert_eq!(a.received_by(&mut q).len(), 2);
    assert_eq!(a.received().len(), 2);
    assert_eq!(q.waiting_count(), 2);
    let unsent = std::mem::replace(&mut a.frames, outbox(0).1).unsent();
    let old = a.drop_connection(&mut q, unsent, 100);
    // The two that waited in the queue are held by nobody: a only ever held four.
    let mut a = Sub::resume(&mut q, old, None, false, T0 + 1).unwrap();
    let mut sent: Vec<MessageId> = a.received().into_iter().map(|(_, id)| id).collect();
    sent.sort();
    assert_eq!(
        sent,
        ids[2..].to_vec(),
        "m2, m3 (never written), then m4, m5"
    );
}

/// Every frame queued for a connection since the last call, as JSON (messages and notices).
fn frames_of(sub: &mut Sub) -> Vec<serde_json::Value> {
    std::iter::from_fn(|| take(&mut sub.frames))
        .map(|frame| serde_json::from_slice(&frame).unwrap())
        .collect()
}

fn delayed(q: &mut QueueState, body: &str) -> MessageId {
    let new = NewMessage {
        delay_secs: 60,
        ..text(body)
    };
    q.publish(&new, T0).unwrap().0
}

/// A message that waits, then is moved to the dead letter queue.
fn dead(q: &mut QueueState, body: &str) -> MessageId {
    let id = publish(q, body);
    let _ = q.move_to_dead_letter(id).unwrap();
    id
}

/// A queue with one subscriber (capacity 2) holding `held1`, `held2`, three more waiting
/// (one of durability 0), two delayed and two dead-lettered.
struct Mixed {
    q: QueueState,
    sub: Sub,
    held: [MessageId; 2],
}

fn mixed() -> Mixed {
    let mut q = queue();
    let dead = [dead(&mut q, "x1"), dead(&mut q, "x2")];
    let mut sub = Sub::join(&mut q, 2);
    let held = [publish(&mut q, "h1"), publish(&mut q, "h2")];
    assert_eq!(sub.bodies(), ["h1", "h2"]);
    publish(&mut q, "w1");
    publish(&mut q, "w2");
    let memory_only = NewMessage {
        durability: Durability::None,
        ..text("w0")
    };
    let _ = q.publish(&memory_only, T0).unwrap();
    delayed(&mut q, "d1");
    delayed(&mut q, "d2");
    assert_eq!(q.dead_letter_count(), dead.len());
    Mixed { q, sub, held }
}

#[test]
fn a_purge_of_waiting_messages_takes_those_and_leaves_the_held_delayed_and_dead() {
    let Mixed { mut q, mut sub, .. } = mixed();
    let before = q.memory_used();
    let (purged, _) = q.purge(Scope::Waiting, T0);
    assert_eq!(purged, 3, "durability 0 too: it is only in memory");
    let counts = q.counts();
    assert_eq!(
        (
            counts.waiting,
            counts.unacknowledged,
            counts.delayed,
            counts.dead_letter
        ),
        (0, 2, 2, 2)
    );
    assert_eq!(counts.messages, 6);
    assert_eq!(counts.durable, 6);
    let three = 3 * (94 - 10 + 2 + MESSAGE_OVERHEAD_BYTES);
    assert_eq!(
        before - q.memory_used(),
        three,
        "w1, w2, w0: 86-byte frames"
    );
    assert!(
        frames_of(&mut sub).is_empty(),
        "the holder is not told of others' messages"
    );
    assert_eq!(q.purge(Scope::Waiting, T0).0, 0, "nothing left to purge");
}

#[test]
fn a_purge_of_delayed_or_dead_messages_takes_only_those() {
    let Mixed { mut q, .. } = mixed();
    assert_eq!(q.purge(Scope::Delayed, T0).0, 2);
    assert_eq!((q.delayed_count(), q.next_due()), (0, None));
    assert_eq!(q.waiting_count(), 3);
    assert_eq!(q.purge(Scope::DeadLetter, T0).0, 2);
    assert_eq!(q.dead_letter_count(), 0);
    let counts = q.counts();
    assert_eq!(
        (counts.messages, counts.unacknowledged, counts.durable),
        (5, 2, 4)
    );
}

#[test]
fn a_delay_that_has_ended_is_waiting_for_a_purge_even_before_the_timer_ran() {
    let mut q = queue();
    delayed(&mut q, "d1");
    assert_eq!(q.purge(Scope::Delayed, T0 + 60_000).0, 0);
    assert_eq!(q.purge(Scope::Waiting, T0 + 60_000).0, 1);
}

#[test]
fn a_purge_of_all_tells_each_holder_and_frees_its_slots_and_all_memory() {
    let Mixed {
        mut q,
        mut sub,
        held,
    } = mixed();
    let (purged, _) = q.purge(Scope::All, T0);
    assert_eq!(purged, 2 + 3 + 2 + 2);
    assert_eq!(q.counts(), Counts::default());
    assert_eq!(q.memory_used(), 0);
    let notices = frames_of(&mut sub);
    let told: Vec<_> = notices
        .iter()
        .map(|n| (n["deleted"].clone(), n["id"].clone()))
        .collect();
    let expected: Vec<_> = held
        .iter()
        .map(|id| (serde_json::json!(true), serde_json::json!(id.to_string())))
        .collect();
    assert_eq!(told, expected);
    assert_eq!(q.ack(sub.session, held[0]).unwrap_err(), Refused::NotHeld);
    publish(&mut q, "next");
    assert_eq!(sub.bodies(), ["next"], "the slots are free at once");
}

#[test]
fn a_purge_is_one_change_for_the_store_and_an_empty_one_is_none() {
    let store = RecordingStore::default();
    let mut q = QueueState::new(Box::new(store.clone()), roomy());
    for n in 0..5 {
        publish(&mut q, &format!("m{n}"));
    }
    let _ = q.purge(Scope::DeadLetter, T0);
    let _ = q.purge(Scope::Waiting, T0);
    let log = store.0.lock().unwrap().clone();
    assert_eq!(log.len(), 6, "{log:?}");
    assert_eq!(log[5], "purged 5");
}

#[test]
fn a_waiting_purge_counts_a_message_that_waits_twice_in_the_line_once() {
    let mut q = queue();
    let m = dead(&mut q, "m");
    // Its old place in the waiting line is still there, skipped, when it waits again.
    assert_eq!(q.redrive(&[m]).0, 1);
    assert_eq!(q.purge(Scope::Waiting, T0).0, 1);
    assert_eq!(q.counts(), Counts::default());
}

#[test]
fn a_redrive_puts_dead_messages_at_the_back_of_the_queue_unchanged() {
    let mut q = queue();
    let d1 = dead(&mut q, "d1");
    let d2 = dead(&mut q, "d2");
    let before = (q.get(d1, true).unwrap().clone(), q.memory_used());
    let w = publish(&mut q, "w");
    let selection = q.redrive_selection(Redrive::All).unwrap();
    assert_eq!(selection, [d1, d2]);
    assert_eq!(q.redrive(&selection).0, 2);
    assert_eq!(q.dead_letter_count(), 0);
    assert_eq!(
        q.memory_used(),
        before.1 + memory_cost(q.get(w, false).unwrap())
    );
    let mut a = Sub::join(&mut q, 3);
    let received = a.received();
    assert_eq!(
        received,
        [("w".into(), w), ("d1".into(), d1), ("d2".into(), d2)]
    );
    let again = q.get(d1, false).unwrap();
    assert_eq!(
        again.frame, before.0.frame,
        "id, type, body and recdat are kept"
    );
    assert_eq!(
        (again.durability, again.recdat),
        (before.0.durability, before.0.recdat)
    );
    let counts = q.counts();
    assert_eq!(
        (counts.unacknowledged, counts.durable, counts.dead_letter),
        (3, 3, 0)
    );
}

#[test]
fn a_redrive_goes_to_a_subscriber_with_room_at_once() {
    let mut q = queue();
    let d = dead(&mut q, "d");
    let mut a = Sub::join(&mut q, 1);
    assert!(a.bodies().is_empty());
    let _ = q.redrive(&[d]);
    assert_eq!(a.bodies(), ["d"]);
}

#[test]
fn a_redrive_chooses_by_count_or_ids_and_refuses_ids_not_in_the_dead_letter_queue() {
    let mut q = queue();
    let dead_ones: Vec<MessageId> = (0..4).map(|n| dead(&mut q, &format!("d{n}"))).collect();
    let queued = publish(&mut q, "queued");
    assert_eq!(
        q.redrive_selection(Redrive::Count(2)).unwrap(),
        dead_ones[..2]
    );
    assert_eq!(q.redrive_selection(Redrive::Count(99)).unwrap(), dead_ones);
    let listed = [dead_ones[3], dead_ones[1], dead_ones[3]];
    assert_eq!(
        q.redrive_selection(Redrive::Ids(&listed)).unwrap(),
        [dead_ones[3], dead_ones[1]],
        "in the list's order, a repeated id once"
    );
    for ids in [
        vec![dead_ones[0], queued],
        vec![MessageId(uuid::Uuid::nil())],
    ] {
        assert_eq!(
            q.redrive_selection(Redrive::Ids(&ids)).unwrap_err(),
            Refused::NotFound
        );
    }
    assert_eq!(q.dead_letter_count(), 4, "choosing moves nothing");
    // Deleted between the choice and the move: passed over, and not counted.
    let _ = q.delete_dead_letter(dead_ones[0]).unwrap();
    assert_eq!(q.redrive(&dead_ones).0, 3);
}

#[test]
fn a_damaged_entry_stays_in_the_dead_letter_queue() {
    let mut q = queue();
    let (damaged, _) = q.add_damaged(b"\x01\x02", T0);
    let d = dead(&mut q, "d");
    assert!(q.get(damaged, true).unwrap().is_damaged());
    assert!(!q.get(d, true).unwrap().is_damaged());
    assert_eq!(q.redrive_selection(Redrive::All).unwrap(), [d]);
    assert_eq!(
        q.redrive_selection(Redrive::Ids(&[damaged])).unwrap_err(),
        Refused::NotFound
    );
}

#[test]
fn a_redrive_tells_the_store_of_each_message() {
    let store = RecordingStore::default();
    let mut q = QueueState::new(Box::new(store.clone()), roomy());
    let d1 = dead(&mut q, "d1");
    let d2 = dead(&mut q, "d2");
    let _ = q.redrive(&[d1, d2]);
    let log = store.0.lock().unwrap().clone();
    assert_eq!(
        log[4..],
        [format!("redriven {d1}"), format!("redriven {d2}")]
    );
}

#[test]
fn ids_taken_from_the_waiting_line_do_not_pile_up_in_it_with_nobody_subscribed() {
    let mut q = queue();
    let kept: Vec<MessageId> = (0..10).map(|n| publish(&mut q, &format!("k{n}"))).collect();
    let dead: Vec<MessageId> = (0..20_000)
        .map(|n| dead(&mut q, &format!("d{n}")))
        .collect();
    // The line is compacted as the skipped ids grow: never more than the larger of the
    // threshold and the waiting messages, beside the waiting ones.
    assert!(q.waiting.len() <= 10 + 4096, "{}", q.waiting.len());
    assert!(q.skipped.len() <= 4096);
    // A redrive after compaction waits once, at the back, and a purge counts what waits.
    assert_eq!(q.redrive(&dead[..3]).0, 3);
    let mut sub = Sub::join(&mut q, 13);
    let ids: Vec<MessageId> = sub.received().into_iter().map(|(_, id)| id).collect();
    assert_eq!(ids, [&kept[..], &dead[..3]].concat());
    assert_eq!(q.waiting_count(), 0);
}

// ---- the delivery rules (README, "Delivery rules") ------------------------------------------

const VISIBILITY_MS: u64 = 30_000;

fn rules(max_receive_count: u32, retention_secs: u64) -> Rules {
    Rules {
        max_receive_count,
        retention_secs,
    }
}

/// The ids of what a pull receiver got.
fn pulled_ids(pulled: &[Pulled]) -> Vec<MessageId> {
    pulled.iter().map(|p| p.id).collect()
}

#[test]
fn a_received_message_is_invisible_until_its_timeout_then_waits_again_counted() {
    let mut q = queue();
    let m1 = publish(&mut q, "m1");
    let m2 = publish(&mut q, "m2");
    let first = q.receive(10, VISIBILITY_MS, T0);
    assert_eq!(pulled_ids(&first), [m1, m2]);
    assert_eq!(first[0].receives, 1);
    assert!(q.receive(10, VISIBILITY_MS, T0 + 1).is_empty(), "invisible");
    assert_eq!(q.counts().unacknowledged, 2, "in flight");
    assert_eq!(q.next_visible(), Some(T0 + VISIBILITY_MS));
    // A subscriber joining meanwhile gets nothing either.
    let mut sub = Sub::join(&mut q, 5);
    assert!(sub.bodies().is_empty());
    // Just before the timeout nothing changes; at it, both wait again and go to the
    // subscriber with room, each now received twice.
    q.release_invisible(T0 + VISIBILITY_MS - 1);
    assert!(sub.bodies().is_empty());
    q.release_invisible(T0 + VISIBILITY_MS);
    assert_eq!(sub.bodies(), ["m1", "m2"]);
    assert_eq!(q.messages[&m1].receives, 2);
    assert_eq!(q.next_visible(), None);
}

#[test]
fn a_receive_takes_at_most_max_and_a_delete_needs_the_latest_receive() {
    let mut q = queue();
    let ids: Vec<MessageId> = (0..5).map(|n| publish(&mut q, &format!("m{n}"))).collect();
    let pulled = q.receive(3, VISIBILITY_MS, T0);
    assert_eq!(pulled_ids(&pulled), ids[..3]);
    // Each receive has its own number: after a timeout and a second receive, the first
    // receive's handle no longer deletes it.
    q.release_invisible(T0 + VISIBILITY_MS);
    let again = q.receive(5, VISIBILITY_MS, T0 + VISIBILITY_MS);
    assert_eq!(pulled_ids(&again), [ids[3], ids[4], ids[0], ids[1], ids[2]]);
    let (first, second) = (pulled[0].receipt, again[2].receipt);
    assert_ne!(first, second);
    assert_eq!(again[2].receives, 2);
    assert_eq!(
        q.delete_received(ids[0], first).unwrap_err(),
        Refused::NotHeld
    );
    let _ = q.delete_received(ids[0], second).unwrap();
    assert_eq!(
        q.delete_received(ids[0], second).unwrap_err(),
        Refused::NotHeld
    );
    assert_eq!(q.message_count(), 4);
    assert_eq!(q.totals().acked, 1);
    assert_eq!(q.totals().delivered, 8);
}

/// Beside a WebSocket subscriber, a waiting message is the line's for its first
/// `LINE_FIRST_MS`: one the subscriber takes in that time never reaches a pull receiver, and one
/// the line leaves longer does. With no subscriber in the line, a pull receiver takes at once.
#[test]
fn beside_subscribers_a_pull_receiver_takes_only_what_the_line_left() {
    let mut q = queue();
    assert_eq!(q.next_pullable(), None);
    let first = publish(&mut q, "alone");
    assert_eq!(q.next_pullable(), Some(0), "no subscriber: at once");
    let mut sub = Sub::join(&mut q, 1);
    assert_eq!(sub.bodies(), ["alone"]);
    let kept_up = publish(&mut q, "kept up");
    assert_eq!(q.next_pullable(), Some(T0 + LINE_FIRST_MS));
    assert!(q
        .receive(10, VISIBILITY_MS, T0 + LINE_FIRST_MS - 1)
        .is_empty());
    // The subscriber answers within its moment: the line takes the message.
    let _receipt = q.ack(sub.session, first).unwrap();
    assert_eq!(sub.bodies(), ["kept up"]);
    assert_eq!(q.next_pullable(), None);
    assert!(q.receive(10, VISIBILITY_MS, T0 + LINE_FIRST_MS).is_empty());
    // It does not answer in time: the pull receiver takes what waited.
    let left = publish(&mut q, "left");
    let pulled = q.receive(10, VISIBILITY_MS, T0 + LINE_FIRST_MS);
    assert_eq!(pulled_ids(&pulled), [left]);
    let _receipt = q.ack(sub.session, kept_up).unwrap();
    assert_eq!(
        sub.bodies(),
        Vec::<String>::new(),
        "nothing left for the line"
    );
}

#[test]
fn a_purge_of_the_received_takes_what_pull_receivers_hold_and_nothing_else() {
    let mut q = queue();
    let ids: Vec<MessageId> = (0..3).map(|n| publish(&mut q, &format!("m{n}"))).collect();
    let mut sub = Sub::join(&mut q, 1);
    assert_eq!(sub.bodies(), ["m0"], "held by a subscriber");
    // Beside the subscriber, a pull receiver takes what the line left for LINE_FIRST_MS.
    let pulled = q.receive(1, VISIBILITY_MS, T0 + LINE_FIRST_MS);
    assert_eq!(pulled_ids(&pulled), [ids[1]]);
    let (purged, _) = q.purge(Scope::Received, T0);
    assert_eq!(purged, 1);
    assert_eq!(
        q.delete_received(ids[1], pulled[0].receipt).unwrap_err(),
        Refused::NotHeld
    );
    assert_eq!(q.next_visible(), None, "no timeout left to fire");
    assert_eq!(
        q.message_count(),
        2,
        "the held one and the waiting one stay"
    );
    assert_eq!(q.counts().unacknowledged, 1);
    assert_eq!(q.purge(Scope::Received, T0).0, 0);
}

#[test]
fn a_visibility_change_moves_the_timeout_and_zero_makes_it_wait_at_once() {
    let mut q = queue();
    let m1 = publish(&mut q, "m1");
    let m2 = publish(&mut q, "m2");
    let first = q.receive(2, VISIBILITY_MS, T0);
    let m1_receipt = first[0].receipt;
    q.change_visibility(m1, m1_receipt, 120_000, T0 + 10_000)
        .unwrap();
    assert_eq!(q.next_visible(), Some(T0 + VISIBILITY_MS), "m2's");
    q.release_invisible(T0 + VISIBILITY_MS);
    assert_eq!(
        pulled_ids(&q.receive(10, VISIBILITY_MS, T0 + VISIBILITY_MS)),
        [m2]
    );
    assert_eq!(
        q.next_visible(),
        Some(T0 + 2 * VISIBILITY_MS),
        "m2's second"
    );
    q.change_visibility(m1, m1_receipt, 0, T0 + 40_000).unwrap();
    assert_eq!(pulled_ids(&q.receive(10, VISIBILITY_MS, T0 + 40_000)), [m1]);
    assert_eq!(
        q.change_visibility(m1, m1_receipt, 1000, T0 + 40_000)
            .unwrap_err(),
        Refused::NotHeld,
        "an old receive's handle"
    );
}

#[test]
fn without_max_receive_count_a_message_comes_back_however_often_it_fails() {
    let mut q = queue();
    let m = publish(&mut q, "poison");
    for round in 1..=20u64 {
        let pulled = q.receive(1, VISIBILITY_MS, T0 + round * VISIBILITY_MS);
        assert_eq!(pulled_ids(&pulled), [m]);
        q.release_invisible(T0 + (round + 1) * VISIBILITY_MS);
    }
    assert_eq!(q.messages[&m].receives, 20);
    assert_eq!(q.dead_letter_count(), 0);
}

#[test]
fn the_last_allowed_receive_that_times_out_sends_the_message_to_the_dead_letter_queue() {
    let mut q = queue();
    q.set_rules(rules(3, 0));
    let m = publish(&mut q, "poison");
    for round in 0..3u64 {
        let at = T0 + round * VISIBILITY_MS;
        let pulled = q.receive(1, VISIBILITY_MS, at);
        assert_eq!(pulled_ids(&pulled), [m]);
        assert_eq!(pulled[0].receives as u64, round + 1);
        assert_eq!(q.dead_letter_count(), 0, "round {round}");
        q.release_invisible(at + VISIBILITY_MS);
    }
    // The third receive timed out: no fourth.
    assert_eq!(q.dead_letter_count(), 1);
    assert_eq!(q.death(m).map(|d| d.reason), Some(DeadReason::MaxReceives));
    assert!(q
        .receive(10, VISIBILITY_MS, T0 + 10 * VISIBILITY_MS)
        .is_empty());
}

#[test]
fn a_poison_message_that_ends_its_subscribers_sessions_is_capped_too() {
    let mut q = queue();
    q.set_rules(rules(2, 0));
    let m = publish(&mut q, "poison");
    let mut first = Sub::join(&mut q, 1);
    assert_eq!(first.bodies(), ["poison"]);
    q.leave(first.session);
    let mut second = Sub::join(&mut q, 1);
    assert_eq!(second.bodies(), ["poison"]);
    assert_eq!(q.dead_letter_count(), 0);
    q.leave(second.session);
    assert_eq!(q.dead_letter_count(), 1);
    assert_eq!(q.death(m).map(|d| d.reason), Some(DeadReason::MaxReceives));
    // A nack is a rejection, whatever the count.
    let n = publish(&mut q, "rejected");
    let third = Sub::join(&mut q, 1);
    let before = crate::engine::now_ms();
    let _ = q.nack(third.session, n).unwrap();
    assert_eq!(q.death(n).map(|d| d.reason), Some(DeadReason::Rejected));
    // It says when (the wall clock's time: it is only shown).
    let at_ms = q.death(n).unwrap().at_ms;
    assert!(
        (before..=crate::engine::now_ms()).contains(&at_ms),
        "{at_ms}"
    );
    // A redrive starts the count again.
    let (moved, _) = q.redrive(&[m]);
    assert_eq!(moved, 1);
    assert_eq!(q.death(m).map(|d| d.reason), None);
    assert_eq!(q.messages[&m].receives, 1, "delivered to the third at once");
}

#[test]
fn a_durability_0_message_past_its_last_receive_is_deleted_as_it_cannot_be_dead_lettered() {
    let mut q = queue();
    q.set_rules(rules(1, 0));
    let new = NewMessage {
        durability: Durability::None,
        ..text("volatile")
    };
    let _ = q.publish(&new, T0).unwrap();
    let _ = q.receive(1, VISIBILITY_MS, T0);
    q.release_invisible(T0 + VISIBILITY_MS);
    assert_eq!(q.message_count(), 0);
    assert_eq!(q.memory_used(), 0);
}

#[test]
fn retention_deletes_a_message_still_in_the_queue_wherever_it_is_and_a_holder_is_told() {
    let mut q = queue();
    q.set_rules(rules(0, 60));
    let waiting = publish(&mut q, "waiting");
    let held = publish(&mut q, "held");
    let received = publish(&mut q, "received");
    let delayed_one = delayed(&mut q, "delayed");
    let dead_one = dead(&mut q, "dead");
    // Published before the retention: kept until handled.
    q.set_rules(rules(0, 0));
    let kept = publish(&mut q, "kept");
    q.set_rules(rules(0, 60));
    let _ = q.delete(waiting); // out of the way, so the subscriber takes `held`
    let waiting = publish(&mut q, "waiting");
    let mut sub = Sub::join(&mut q, 1);
    assert_eq!(sub.bodies(), ["held"]);
    // `received` is at the front now, then `kept`, then `waiting`; the subscriber left it.
    let pulled = q.receive(1, 600_000, T0 + LINE_FIRST_MS);
    assert_eq!(pulled_ids(&pulled), [received]);
    assert_eq!(q.next_expiring(), Some(T0 + 60_000));
    q.expire_messages(T0 + 59_999);
    assert_eq!(q.message_count(), 6);
    q.expire_messages(T0 + 60_000);
    // The holder is told, and its slot is free again at once: `kept` follows.
    let frames = frames_of(&mut sub);
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[0]["deleted"], true, "{frames:?}");
    assert_eq!(frames[0]["id"], held.to_string());
    assert_eq!(frames[1]["body"], "kept");
    for gone in [held, received, delayed_one, waiting] {
        assert!(q.get(gone, false).is_none(), "{gone}");
    }
    assert!(q.get(kept, false).is_some());
    assert!(
        q.get(dead_one, true).is_some(),
        "the dead letter queue keeps its messages"
    );
    assert_eq!(q.message_count(), 2);
    assert_eq!(q.next_expiring(), None);
    assert!(q.invisible.is_empty());
}

#[test]
fn a_messages_own_expiry_counts_when_it_is_sooner_than_the_retention() {
    let mut q = queue();
    q.set_rules(rules(0, 3600));
    let soon = NewMessage {
        expires_secs: 10,
        ..text("soon")
    };
    let late = NewMessage {
        expires_secs: 7200,
        ..text("late")
    };
    let (soon, _) = q.publish(&soon, T0).unwrap();
    let (late, _) = q.publish(&late, T0).unwrap();
    q.expire_messages(T0 + 10_000);
    assert!(q.get(soon, false).is_none());
    q.expire_messages(T0 + 3_599_999);
    assert!(q.get(late, false).is_some());
    q.expire_messages(T0 + 3_600_000);
    assert!(q.get(late, false).is_none(), "the retention came first");
}

/// Message `n` as the log gives it back at start: waiting, durability 1, with its receive
/// count and expiry.
fn recovered(n: u128, receives: u32, expires_ms: Option<u64>) -> RecoveredMessage {
    RecoveredMessage {
        id: MessageId(uuid::Uuid::from_u128(n)),
        durability: Durability::Eventual,
        dead: false,
        delay_secs: 0,
        due_ms: None,
        recdat: T0 / 1000,
        receives,
        expires_ms,
        dead_reason: DeadReason::Rejected,
        dead_at_ms: 0,
        frame: Arc::from(format!(r#"{{"id":"x","type":1,"body":"b{n}","recdat":1}}"#).as_bytes()),
    }
}

#[test]
fn a_restart_makes_received_messages_visible_with_their_counts_and_ends_the_expired() {
    let mut q = queue();
    q.restore(
        vec![
            recovered(1, 4, None),
            recovered(2, 0, Some(T0 - 1)),
            recovered(3, 1, Some(T0 + 1000)),
        ],
        None,
        T0,
    );
    let pulled = q.receive(10, VISIBILITY_MS, T0);
    let counts: Vec<(u128, u32)> = pulled
        .iter()
        .map(|p| (p.id.0.as_u128(), p.receives))
        .collect();
    assert_eq!(counts, [(1, 5), (3, 2)], "the expired one is gone");
    assert_eq!(q.next_expiring(), Some(T0 + 1000));
}

#[test]
fn the_rules_write_receive_counts_only_where_they_decide_something() {
    let store = RecordingStore::default();
    let mut q = QueueState::new(Box::new(store.clone()), roomy());
    let m1 = publish(&mut q, "m1");
    let a = Sub::join(&mut q, 1);
    let _ = q.ack(a.session, m1).unwrap();
    // A push writes nothing; a pull receive writes the count at once (and tells who holds
    // it: `delivered`, written nowhere, for a standby); with max-receive-count, so does a push.
    let m2 = publish(&mut q, "m2");
    q.leave(a.session);
    let m3 = publish(&mut q, "m3");
    let _ = q.receive(2, VISIBILITY_MS, T0);
    q.set_rules(rules(5, 0));
    let b = Sub::join(&mut q, 1);
    let m4 = publish(&mut q, "m4");
    let _ = b;
    let log = store.0.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            format!("published {m1}"),
            format!("delivered {m1}"),
            format!("acked {m1}"),
            format!("published {m2}"),
            format!("delivered {m2}"),
            format!("returned {m2}"),
            format!("published {m3}"),
            format!("rewritten {m2} receives 2"),
            format!("delivered {m2}"),
            format!("rewritten {m3} receives 1"),
            format!("delivered {m3}"),
            format!("published {m4}"),
            format!("delivered {m4}"),
            format!("rewritten {m4} receives 1"),
        ]
    );
}

#[test]
fn a_restart_during_the_last_allowed_delivery_counts_it_as_failed() {
    let mut q = queue();
    q.set_rules(rules(2, 0));
    q.restore(vec![recovered(1, 2, None), recovered(2, 1, None)], None, T0);
    let poison = MessageId(uuid::Uuid::from_u128(1));
    assert_eq!(
        q.death(poison).map(|d| d.reason),
        Some(DeadReason::MaxReceives)
    );
    let pulled = q.receive(10, VISIBILITY_MS, T0);
    assert_eq!(pulled.len(), 1, "only the one with a delivery left");
    assert_eq!(pulled[0].receives, 2);
}

/// A publish again with the same deduplication id within the window makes nothing: it gets
/// the first's id, whether the first is still in the queue or already acked; after the
/// window, or with another id, it is a new message. Each id held counts against the memory
/// until its window ends.
#[test]
fn a_deduplication_id_makes_one_message_within_its_window() {
    let mut q = queue();
    let mut a = Sub::join(&mut q, 10);
    let keyed = |body: &'static str, dedup: &'static str| NewMessage {
        dedup_id: Some(dedup.into()),
        ..text(body)
    };
    let (first, _) = q.publish(&keyed("order 1", "o-1"), T0).unwrap();
    let one_message = memory_cost(&q.messages[&first].message);
    assert_eq!(q.memory_used(), one_message + dedup::ENTRY_BYTES);
    let (again, _) = q
        .publish(&keyed("order 1, sent again", "o-1"), T0 + 1_000)
        .unwrap();
    assert_eq!(again, first);
    assert_eq!(a.bodies(), ["order 1"], "one message, delivered once");
    let _ = q.ack(a.session, first).unwrap();
    // Acked: still a repeat within the window.
    let (after_ack, _) = q.publish(&keyed("order 1", "o-1"), T0 + 60_000).unwrap();
    assert_eq!(after_ack, first);
    let (other, _) = q.publish(&keyed("order 2", "o-2"), T0 + 60_000).unwrap();
    assert_ne!(other, first);
    let unkeyed = publish(&mut q, "no id");
    assert_ne!(unkeyed, first);
    assert_eq!(q.totals().published, 3);
    assert_eq!(q.totals().deduplicated, 2);
    assert_eq!(a.bodies(), ["order 2", "no id"]);
    // The window ends: the id makes a new message, and the old id's memory is given back.
    let later = T0 + dedup::WINDOW_MS;
    let (new_window, _) = q
        .publish(&keyed("order 1, a day later", "o-1"), later)
        .unwrap();
    assert_ne!(new_window, first);
    assert_eq!(q.dedup.len(), 2, "o-1 again, and o-2, whose window runs on");
    assert_eq!(a.bodies(), ["order 1, a day later"]);
    // A copy of the ids as the log keeps them comes back at start, if their windows have
    // not ended.
    let mut restarted = queue();
    let kept = [
        (dedup::key_of("o-1"), new_window, later + dedup::WINDOW_MS),
        (dedup::key_of("o-2"), other, later),
    ];
    restarted.restore_dedup(&kept, later + 1);
    assert_eq!(restarted.dedup.len(), 1, "o-2's window had ended");
    let (repeat, _) = restarted
        .publish(&keyed("order 1", "o-1"), later + 2)
        .unwrap();
    assert_eq!(repeat, new_window);
    assert_eq!(restarted.message_count(), 0, "nothing made");
}

/// A queue that gets no more publishes still forgets its ids when their windows end (the
/// node's timers call this), and gives their memory back.
#[test]
fn deduplication_ids_end_with_their_windows_without_a_publish() {
    let mut q = queue();
    let keyed = NewMessage {
        dedup_id: Some("once".into()),
        ..text("once")
    };
    let (id, _) = q.publish(&keyed, T0).unwrap();
    let message_only = memory_cost(&q.messages[&id].message);
    assert_eq!(q.next_dedup_end(), Some(T0 + dedup::WINDOW_MS));
    q.expire_dedup(T0 + dedup::WINDOW_MS - 1);
    assert_eq!(q.memory_used(), message_only + dedup::ENTRY_BYTES);
    q.expire_dedup(T0 + dedup::WINDOW_MS);
    assert_eq!((q.next_dedup_end(), q.memory_used()), (None, message_only));
}

/// A received message says who sent it and when it was first delivered (SQS's `SenderId`
/// and `ApproximateFirstReceiveTimestamp`), a later receive the same first time; neither
/// makes a stored message bigger.
#[test]
fn a_message_knows_its_sender_and_its_first_delivery() {
    let mut q = queue();
    let sent = NewMessage {
        sender: Some("QEKEYOFTHESENDER".into()),
        ..text("from a key")
    };
    let (id, _) = q.publish(&sent, T0).unwrap();
    publish(&mut q, "from nobody known");
    let first = q.receive(10, 0, T0 + 500);
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].id, id);
    assert_eq!(first[0].sender.as_deref(), Some("QEKEYOFTHESENDER"));
    assert_eq!(first[1].sender, None);
    assert_eq!(first[0].first_delivered_ms, T0 + 500);
    q.release_invisible(T0 + 600);
    let again = q.receive(1, 1_000, T0 + 2_000);
    assert_eq!((again[0].id, again[0].receives), (id, 2));
    assert_eq!(
        again[0].first_delivered_ms,
        T0 + 500,
        "the first delivery's time stays"
    );
    // Both in what was padding: an entry and a message are as big as before.
    assert_eq!(std::mem::size_of::<Entry>(), 72);
    assert_eq!(std::mem::size_of::<Message>(), 32);
}

#[test]
fn each_message_keeps_its_own_sender_when_senders_take_turns() {
    let mut q = queue();
    let senders = [
        Some("A"),
        Some("B"),
        Some("A"),
        None,
        Some("C"),
        Some("B"),
        Some("B"),
    ];
    for (n, sender) in senders.iter().enumerate() {
        let body = format!("{n}");
        let sent = NewMessage {
            sender: sender.map(Into::into),
            ..text(&body)
        };
        let _ = q.publish(&sent, T0).unwrap();
    }
    let received = q.receive(10, 0, T0 + 1);
    let got: Vec<Option<&str>> = received.iter().map(|r| r.sender.as_deref()).collect();
    assert_eq!(got, senders);
}

fn grouped<'a>(body: &'a str, group: &'a str) -> NewMessage<'a> {
    NewMessage {
        group: Some(group.into()),
        ..text(body)
    }
}

/// A group's messages go out in order, one at a time: the next waits until the one before
/// is acked; groups spread over the subscribers with room, and ungrouped messages go as
/// ever.
#[test]
fn a_groups_messages_go_out_one_at_a_time_in_order() {
    let mut q = queue();
    for (body, group) in [
        ("a1", "a"),
        ("a2", "a"),
        ("b1", "b"),
        ("a3", "a"),
        ("b2", "b"),
    ] {
        let _ = q.publish(&grouped(body, group), T0).unwrap();
    }
    publish(&mut q, "free");
    let mut one = Sub::join(&mut q, 10);
    let held = one.received_by(&mut q);
    let bodies: Vec<&str> = held.iter().map(|(b, _)| b.as_str()).collect();
    assert_eq!(bodies, ["a1", "b1", "free"], "one of each group at a time");
    assert_eq!(q.counts().waiting, 3, "a2, a3, b2 wait behind their heads");
    let mut two = Sub::join(&mut q, 10);
    assert!(
        two.received_by(&mut q).is_empty(),
        "nothing of a group while one is out"
    );
    // Acked: the next of its group goes to the first subscriber with room, as any message.
    let _ = q.ack(one.session, held[0].1).unwrap();
    let next = one.received_by(&mut q);
    assert_eq!(
        next.iter().map(|(b, _)| b.as_str()).collect::<Vec<_>>(),
        ["a2"]
    );
    assert!(two.received_by(&mut q).is_empty());
    let _ = q.ack(one.session, held[1].1).unwrap();
    assert_eq!(one.bodies(), ["b2"]);
    let _ = q.ack(one.session, next[0].1).unwrap();
    assert_eq!(one.bodies(), ["a3"]);
    assert_eq!(q.counts().waiting, 0);
}

/// A delivery that fails (its holder leaves, its visibility ends) puts the message back
/// first in its group; a nack, a delete or an expiry lets the next go.
#[test]
fn a_failed_delivery_keeps_its_place_in_its_group_and_a_removal_frees_the_next() {
    let mut q = queue();
    let (g1, _) = q.publish(&grouped("g1", "g"), T0).unwrap();
    let (g2, _) = q.publish(&grouped("g2", "g"), T0).unwrap();
    let (g3, _) = q.publish(&grouped("g3", "g"), T0).unwrap();
    let mut a = Sub::join(&mut q, 5);
    assert_eq!(a.bodies(), ["g1"]);
    q.leave(a.session);
    let mut b = Sub::join(&mut q, 5);
    assert_eq!(b.bodies(), ["g1"], "back first in its group");
    q.leave(b.session);
    // Pulled, and its visibility runs out: first again.
    let pulled = q.receive(10, 1_000, T0);
    assert_eq!(pulled.iter().map(|p| p.id).collect::<Vec<_>>(), [g1]);
    q.release_invisible(T0 + 1_000);
    let pulled = q.receive(10, 1_000, T0 + 1_000);
    assert_eq!(pulled.iter().map(|p| p.id).collect::<Vec<_>>(), [g1]);
    // Deleted by its receiver: g2 is next; an administrator deletes g3 while it waits.
    let _ = q.take_lined_up();
    let _ = q.delete_received(g1, pulled[0].receipt).unwrap();
    assert!(q.take_lined_up(), "long-polling receivers are woken for g2");
    let _ = q.delete(g3).unwrap();
    let pulled = q.receive(10, 1_000, T0 + 2_000);
    assert_eq!(pulled.iter().map(|p| p.id).collect::<Vec<_>>(), [g2]);
    assert_eq!(q.counts().waiting, 0);
    let _ = q.delete_received(g2, pulled[0].receipt).unwrap();
    assert!(q.groups.blocked() == 0 && q.message_count() == 0);
}

/// A purge of what waits takes the blocked messages too; the delivered head stays, and its
/// group is empty behind it. A restart lines the groups up again from the frames.
#[test]
fn a_purge_takes_blocked_messages_and_a_restore_lines_groups_up_again() {
    let mut q = queue();
    for body in ["h1", "h2", "h3"] {
        let _ = q.publish(&grouped(body, "h"), T0).unwrap();
    }
    let mut sub = Sub::join(&mut q, 1);
    let held = sub.received_by(&mut q);
    assert_eq!(held[0].0, "h1");
    let (purged, _) = q.purge(Scope::Waiting, T0);
    assert_eq!((purged, q.counts().waiting, q.groups.blocked()), (2, 0, 0));
    let _ = q.publish(&grouped("h4", "h"), T0).unwrap();
    assert_eq!(q.counts().waiting, 1);
    let _ = q.ack(sub.session, held[0].1).unwrap();
    assert_eq!(sub.bodies(), ["h4"], "behind the head that stayed");

    // The frames carry the group: a restore gets the order back.
    let mut first = queue();
    let mut recovered = Vec::new();
    for body in ["r1", "r2"] {
        let (id, _) = first.publish(&grouped(body, "r"), T0).unwrap();
        let message = &first.messages[&id].message;
        assert_eq!(crate::message::frame_group(&message.frame), Some("r"));
        recovered.push(crate::message::RecoveredMessage {
            id,
            durability: Durability::Eventual,
            dead: false,
            delay_secs: 0,
            due_ms: None,
            recdat: T0 / 1000,
            receives: 0,
            expires_ms: None,
            dead_reason: DeadReason::default(),
            dead_at_ms: 0,
            frame: message.frame.clone(),
        });
    }
    let mut restarted = queue();
    restarted.restore(recovered, None, T0);
    let mut sub = Sub::join(&mut restarted, 10);
    assert_eq!(
        sub.bodies(),
        ["r1"],
        "r2 waits behind r1 after a restart too"
    );
}
