//! A connection's outbox: the frames the queue sends it on its own (deliveries, notices,
//! copies, pushes), and the bytes waiting for it, bounded by `max-write-queue-bytes`.
//!
//! The queue never waits for a connection: it only counts and queues. Two kinds of frame
//! meet the bound differently:
//! - **Deliveries** can wait, because the queue keeps their messages. Once the bytes waiting
//!   reach the bound, the subscriber has no room ([`Outbox::has_room`]): new messages go to
//!   others or wait in the queue, and held messages still to be sent wait in the line. When the
//!   connection has written enough to be under the bound again, [`Frames::written`] says so
//!   and the queue sends more. A client that reads gets everything, however big the burst.
//! - **Frames that cannot wait** (copies, notices, pushes: nothing keeps them) are queued past
//!   the bound, up to twice it, so a client that reads can take a burst. Past that the client
//!   reads too slowly for its publishers: [`Outbox::send`] refuses, and [`Overflow`] wakes the
//!   connection to cut it off.
//!
//! The connection cuts off, too, a client that does not read at all: bytes at the bound and
//! nothing written for a while (see `connection`).
//!
//! Every frame the connection takes counts as waiting until [`Frames::written`] says it is on
//! the socket, so a connection that ends knows exactly which deliveries it never wrote
//! ([`Frames::unsent`]).

use crate::message::ids::MessageId;
use crate::store::log::HoldGate;
use bytes::Bytes;
use futures::task::AtomicWaker;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::Notify;

/// A frame for a connection. `message` names the held message a delivery carries, so a
/// connection that ends can say which deliveries it never wrote. `gate`: the delivery waits
/// until the standby has heard who holds its message (`store::log::heard`), and the frames
/// after it with it.
#[derive(Debug)]
pub struct Outbound {
    pub frame: Bytes,
    pub message: Option<MessageId>,
    pub gate: Option<HoldGate>,
}

/// What both ends share.
#[derive(Debug)]
struct Waiting {
    /// The frames queued. A plain deque (allocated only once something waits, given back
    /// when the connection has taken it all) rather than a channel, whose first block of
    /// slots every connection would carry while idle.
    queued: Mutex<VecDeque<Outbound>>,
    /// Wakes the connection when a frame is queued.
    arrived: AtomicWaker,
    /// The connection is over: nothing more is queued.
    closed: AtomicBool,
    /// Bytes queued, or taken by the connection and not yet written to the socket.
    bytes: AtomicUsize,
    /// `max-write-queue-bytes`.
    limit: usize,
    /// The queue found no room for a delivery: the connection tells it when there is again.
    full: AtomicBool,
    /// A frame that cannot wait found twice the limit waiting: the client is cut off.
    overflowed: AtomicBool,
    overflow: Notify,
}

impl Waiting {
    fn at_limit(&self) -> bool {
        self.bytes.load(Ordering::SeqCst) >= self.limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Outbound>> {
        self.queued
            .lock()
            .expect("the outbox lock is never poisoned")
    }
}

/// The queue's end: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub struct Outbox {
    waiting: Arc<Waiting>,
}

/// The connection's end.
#[derive(Debug)]
pub struct Frames {
    waiting: Arc<Waiting>,
    /// Frames taken from the queue in one go, to hand out one by one.
    taken: VecDeque<Outbound>,
    /// Taken from the outbox and handed to the socket's writer, not yet known to be written.
    in_flight_bytes: usize,
    /// The deliveries among them.
    in_flight: Vec<MessageId>,
    /// Where the burst being taken stands with its turn of the runtime.
    turn: Turn,
}

/// An outbox whose deliveries stop at `limit` bytes waiting for its connection.
pub fn outbox(limit: usize) -> (Outbox, Frames) {
    let waiting = Arc::new(Waiting {
        queued: Mutex::default(),
        arrived: AtomicWaker::new(),
        closed: AtomicBool::new(false),
        bytes: AtomicUsize::new(0),
        limit,
        full: AtomicBool::new(false),
        overflowed: AtomicBool::new(false),
        overflow: Notify::new(),
    });
    let frames = Frames {
        waiting: waiting.clone(),
        taken: VecDeque::new(),
        in_flight_bytes: 0,
        in_flight: Vec::new(),
        turn: Turn::Due,
    };
    (Outbox { waiting }, frames)
}

impl Outbox {
    /// Whether a delivery may be queued now: fewer than `limit` bytes wait. When not, the
    /// connection tells the queue once it has written enough ([`Frames::written`]).
    pub fn has_room(&self) -> bool {
        let waiting = &self.waiting;
        if !waiting.at_limit() {
            return true;
        }
        // Marked before looking again: a connection that wrote in between either sees the
        // mark (and tells the queue) or its write shows here.
        waiting.full.store(true, Ordering::SeqCst);
        !waiting.at_limit()
    }

    /// Queues a delivery, to be written once `gate` opens (if it has one). Its message is kept
    /// by the queue, so the caller has checked [`Outbox::has_room`] first; the bytes waiting
    /// pass the limit by one frame at most.
    pub fn deliver(&self, frame: Bytes, message: MessageId, gate: Option<HoldGate>) {
        self.queue(Outbound {
            frame,
            message: Some(message),
            gate,
        });
    }

    /// Queues a frame that nothing else keeps (a copy, a notice, a push); false if the
    /// connection is gone, or if twice the limit is waiting: then the frame is dropped and
    /// the client is being cut off for reading too slowly.
    pub fn send(&self, frame: Bytes) -> bool {
        let waiting = &self.waiting;
        if waiting.overflowed.load(Ordering::Relaxed) {
            return false;
        }
        let ceiling = waiting.limit.saturating_mul(2);
        if waiting.bytes.load(Ordering::SeqCst) + frame.len() > ceiling {
            waiting.overflowed.store(true, Ordering::Relaxed);
            waiting.overflow.notify_one();
            return false;
        }
        self.queue(Outbound {
            frame,
            message: None,
            gate: None,
        })
    }

    fn queue(&self, outbound: Outbound) -> bool {
        let waiting = &self.waiting;
        let mut queued = waiting.lock();
        if waiting.closed.load(Ordering::Relaxed) {
            return false;
        }
        waiting
            .bytes
            .fetch_add(outbound.frame.len(), Ordering::SeqCst);
        queued.push_back(outbound);
        drop(queued);
        waiting.arrived.wake();
        true
    }
}

impl Frames {
    /// The next frame to write, once its gate is open; it counts as waiting until
    /// [`Frames::written`].
    ///
    /// `may_wait_a_turn`: the caller would write these frames on their own (nothing else is
    /// on its way to the socket). Then the first frames of a burst wait one turn of the
    /// runtime: the task wakes itself, and the burst waits until the task's next poll (the
    /// caller says when, [`Frames::next_poll`]), after the tasks already queued on its
    /// worker thread. Without that, Tokio polls a task woken by another right after it (its
    /// LIFO slot): a subscriber woken by a publisher would write that one delivery before the
    /// other publishers the same readiness poll woke had queued theirs, a write per message
    /// at low concurrency (16 publishers with one publish in flight each: 1.88 writes a
    /// message, 1.25 with the wait; `docs/performance.md`). A turn is the other tasks'
    /// polls, not a timer: an idle node runs it at once.
    pub fn poll_next(&mut self, cx: &mut Context<'_>, may_wait_a_turn: bool) -> Poll<Bytes> {
        if self.taken.is_empty() && !self.take_queued() {
            self.waiting.arrived.register(cx.waker());
            // Looked at again: a frame queued before the registration woke nobody.
            if !self.take_queued() {
                self.turn = Turn::Due;
                return Poll::Pending;
            }
        }
        if may_wait_a_turn {
            match self.turn {
                Turn::Due => {
                    self.turn = Turn::Waiting;
                    // A task that wakes itself goes to the back of the run queue, never the
                    // LIFO slot.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                // Its wake is on its way: the task is polled again.
                Turn::Waiting => return Poll::Pending,
                Turn::Taken => {}
            }
        }
        self.turn = Turn::Taken;
        let next = self.taken.front_mut().expect("just taken");
        if let Some(gate) = &mut next.gate {
            std::task::ready!(gate.poll_open(cx));
            next.gate = None;
        }
        let outbound = self.taken.pop_front().expect("just taken");
        self.in_flight_bytes += outbound.frame.len();
        self.in_flight.extend(outbound.message);
        Poll::Ready(outbound.frame)
    }

    /// The task is polled again: a burst that waited for this has had its turn. Called once
    /// at the start of each poll of the connection's task (the loop within one poll may take
    /// frames several times, and its later rounds are not a new turn).
    pub fn next_poll(&mut self) {
        if self.turn == Turn::Waiting {
            self.turn = Turn::Taken;
        }
    }

    /// Takes every frame queued, with one hold of the lock; false if there was none.
    fn take_queued(&mut self) -> bool {
        let mut queued = self.waiting.lock();
        if queued.is_empty() {
            return false;
        }
        // The empty one (of the last burst's size) goes back to be filled; a big one is
        // given back to the allocator rather than kept by an idle connection.
        if self.taken.capacity() > KEPT_SLOTS {
            self.taken = VecDeque::new();
        }
        std::mem::swap(&mut *queued, &mut self.taken);
        true
    }

    /// Whether any frame taken is not yet known to be written.
    pub fn has_in_flight(&self) -> bool {
        self.in_flight_bytes > 0
    }

    /// Every frame taken so far is on the socket. True when the queue found no room for a
    /// delivery and there is room again: the caller tells the queue, which sends more.
    pub fn written(&mut self) -> bool {
        let waiting = &self.waiting;
        waiting
            .bytes
            .fetch_sub(std::mem::take(&mut self.in_flight_bytes), Ordering::SeqCst);
        self.in_flight.clear();
        !waiting.at_limit() && waiting.full.swap(false, Ordering::SeqCst)
    }

    /// Whether `max-write-queue-bytes` or more wait for the socket.
    pub fn at_limit(&self) -> bool {
        self.waiting.at_limit()
    }

    /// A handle that waits for the overflow without borrowing the frames.
    pub fn overflow(&self) -> Overflow {
        Overflow(self.waiting.clone())
    }

    /// The connection is over: stops new frames, and names the deliveries it never wrote
    /// (taken but not known to be written, or never taken).
    pub fn unsent(mut self) -> Vec<MessageId> {
        let mut queued = self.waiting.lock();
        self.waiting.closed.store(true, Ordering::Relaxed);
        let mut unsent = std::mem::take(&mut self.in_flight);
        let never_taken = self.taken.drain(..).chain(queued.drain(..));
        unsent.extend(never_taken.filter_map(|outbound| outbound.message));
        unsent
    }
}

/// Where the burst being taken stands with its turn of the runtime ([`Frames::poll_next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// The outbox was found empty: the next burst may wait a turn.
    Due,
    /// The task woke itself: the burst waits for its next poll.
    Waiting,
    /// Waited, or taken at once: the rest of the burst comes as it is.
    Taken,
}

/// Slots of a taken deque kept for the next burst.
const KEPT_SLOTS: usize = 64;

impl Drop for Frames {
    /// Nothing more is queued for a connection that is gone.
    fn drop(&mut self) {
        let mut queued = self.waiting.lock();
        self.waiting.closed.store(true, Ordering::Relaxed);
        queued.clear();
    }
}

/// Waits until a frame that cannot wait found twice the limit waiting.
pub struct Overflow(Arc<Waiting>);

impl Overflow {
    pub async fn happened(&self) {
        let notified = self.0.overflow.notified();
        if !self.0.overflowed.load(Ordering::Relaxed) {
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::log::heard::HoldsHeard;
    use futures::task::noop_waker_ref;

    fn take(frames: &mut Frames) -> Option<Bytes> {
        match frames.poll_next(&mut Context::from_waker(noop_waker_ref()), false) {
            Poll::Ready(frame) => Some(frame),
            Poll::Pending => None,
        }
    }

    fn id(n: u128) -> MessageId {
        MessageId(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn deliveries_stop_at_the_limit_and_resume_once_it_is_written() {
        let (outbox, mut frames) = outbox(100);
        assert!(outbox.has_room());
        outbox.deliver(Bytes::from(vec![b'x'; 60]), id(1), None);
        assert!(outbox.has_room(), "60 of 100");
        outbox.deliver(Bytes::from(vec![b'x'; 60]), id(2), None);
        assert!(!outbox.has_room(), "120 of 100: no room until written");
        take(&mut frames).unwrap();
        assert!(
            frames.written(),
            "60 wait now: room again, and the queue asked to hear"
        );
        assert!(outbox.has_room());
        take(&mut frames).unwrap();
        assert!(
            !frames.written(),
            "the queue found room last time: nothing to tell"
        );
    }

    #[test]
    fn frames_that_cannot_wait_may_reach_twice_the_limit() {
        let (outbox, mut frames) = outbox(100);
        assert!(outbox.send(Bytes::from(vec![b'c'; 150])));
        assert!(!outbox.send(Bytes::from(vec![b'c'; 60])), "210 > 200");
        assert!(!outbox.send(Bytes::from(vec![b'c'; 1])), "cut off for good");
        take(&mut frames).unwrap();
        frames.written();
        assert!(!outbox.send(Bytes::from(vec![b'c'; 1])), "still cut off");
    }

    #[test]
    fn a_connection_that_ends_names_what_it_never_wrote() {
        let (outbox, mut frames) = outbox(1000);
        outbox.deliver(Bytes::from_static(b"one"), id(1), None);
        outbox.deliver(Bytes::from_static(b"two"), id(2), None);
        assert!(outbox.send(Bytes::from_static(b"notice")));
        outbox.deliver(Bytes::from_static(b"three"), id(3), None);
        take(&mut frames).unwrap();
        frames.written(); // "one" is on the socket
        take(&mut frames).unwrap(); // "two" was handed to the writer, never written
        assert_eq!(frames.unsent(), vec![id(2), id(3)]);
    }

    /// Counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wakes {
        fn count(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    impl futures::task::ArcWake for Wakes {
        fn wake_by_ref(wakes: &Arc<Self>) {
            wakes.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn next_alone(frames: &mut Frames, wakes: &Arc<Wakes>) -> Poll<Bytes> {
        let waker = futures::task::waker(wakes.clone());
        frames.poll_next(&mut Context::from_waker(&waker), true)
    }

    #[test]
    fn a_burst_written_alone_waits_one_turn_then_comes_whole() {
        let (outbox, mut frames) = outbox(1000);
        let wakes = Arc::new(Wakes::default());
        assert!(next_alone(&mut frames, &wakes).is_pending(), "nothing yet");
        outbox.deliver(Bytes::from_static(b"one"), id(1), None);
        assert_eq!(wakes.count(), 1, "woken by the delivery");
        frames.next_poll();
        assert!(
            next_alone(&mut frames, &wakes).is_pending(),
            "the burst's first frame waits a turn"
        );
        assert_eq!(wakes.count(), 2, "the task woke itself");
        outbox.deliver(Bytes::from_static(b"two"), id(2), None);
        assert!(
            next_alone(&mut frames, &wakes).is_pending(),
            "looked at again in the same poll of the task: still its turn to wait"
        );
        assert_eq!(wakes.count(), 2, "and no second wake");
        frames.next_poll();
        assert_eq!(
            next_alone(&mut frames, &wakes),
            Poll::Ready(Bytes::from("one"))
        );
        assert_eq!(
            next_alone(&mut frames, &wakes),
            Poll::Ready(Bytes::from("two")),
            "the rest of the burst comes without another wait"
        );
        assert!(next_alone(&mut frames, &wakes).is_pending(), "all taken");
        outbox.deliver(Bytes::from_static(b"three"), id(3), None);
        frames.next_poll();
        assert!(
            next_alone(&mut frames, &wakes).is_pending(),
            "a new burst waits its turn again"
        );
        frames.next_poll();
        assert_eq!(
            next_alone(&mut frames, &wakes),
            Poll::Ready(Bytes::from("three"))
        );
        // The delivery of "three", and its burst's wait: "two" came while the task ran.
        assert_eq!(wakes.count(), 4);
    }

    #[test]
    fn frames_join_a_write_under_way_without_waiting() {
        let (outbox, mut frames) = outbox(1000);
        outbox.deliver(Bytes::from_static(b"one"), id(1), None);
        assert_eq!(take(&mut frames), Some(Bytes::from("one")));
        // A burst waiting its turn goes at once with a reply fed later in the same poll.
        let wakes = Arc::new(Wakes::default());
        assert!(take(&mut frames).is_none(), "\"one\" was its burst's last");
        outbox.deliver(Bytes::from_static(b"two"), id(2), None);
        frames.next_poll();
        assert!(next_alone(&mut frames, &wakes).is_pending());
        assert_eq!(take(&mut frames), Some(Bytes::from("two")));
    }

    #[test]
    fn a_gated_burst_waits_its_turn_once_then_for_its_gate() {
        let heard = Arc::new(HoldsHeard::default());
        heard.wait_for_standby(true);
        let gate = heard.gate(heard.number_next());
        assert!(gate.is_some(), "a standby is waited for");
        let (outbox, mut frames) = outbox(1000);
        let wakes = Arc::new(Wakes::default());
        outbox.deliver(Bytes::from_static(b"one"), id(1), gate);
        frames.next_poll();
        assert!(next_alone(&mut frames, &wakes).is_pending(), "its turn");
        assert_eq!(wakes.count(), 1);
        frames.next_poll();
        assert!(next_alone(&mut frames, &wakes).is_pending(), "its gate");
        assert_eq!(wakes.count(), 1, "the gate has the waker now");
        heard.heard(1);
        assert_eq!(wakes.count(), 2, "woken by the gate");
        frames.next_poll();
        assert_eq!(
            next_alone(&mut frames, &wakes),
            Poll::Ready(Bytes::from("one")),
            "no second turn"
        );
    }

    #[test]
    fn a_connection_that_ends_while_its_burst_waits_names_it_unsent() {
        let (outbox, mut frames) = outbox(1000);
        let wakes = Arc::new(Wakes::default());
        outbox.deliver(Bytes::from_static(b"one"), id(1), None);
        assert!(next_alone(&mut frames, &wakes).is_pending());
        outbox.deliver(Bytes::from_static(b"two"), id(2), None);
        assert_eq!(frames.unsent(), vec![id(1), id(2)]);
    }
}
