//! A connection's outbox: the frames the queue sends it on its own (deliveries, notices,
//! copies, pushes), and a bound on the bytes waiting for it (`max-write-queue-bytes`).
//!
//! The queue never waits for a connection: [`Outbox::send`] only counts and queues. A client
//! that reads too slowly lets its bytes pile up; past the bound, the outbox refuses and marks
//! the connection to be cut off, and [`Frames::overflowed`] wakes the connection even when it
//! is stuck writing to that client. Nobody else is slowed.

use super::ids::MessageId;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::Notify;

/// A frame for a connection. `message` names the held message a delivery carries, so a
/// connection that drops can say which deliveries it never sent.
#[derive(Debug)]
pub struct Outbound {
    pub frame: Bytes,
    pub message: Option<MessageId>,
}

/// What both ends share.
#[derive(Debug)]
struct Waiting {
    /// Bytes queued or being written, not yet on the socket.
    bytes: AtomicUsize,
    limit: usize,
    overflowed: AtomicBool,
    overflow: Notify,
}

/// The queue's end: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: UnboundedSender<Outbound>,
    waiting: Arc<Waiting>,
}

/// The connection's end.
#[derive(Debug)]
pub struct Frames {
    rx: UnboundedReceiver<Outbound>,
    waiting: Arc<Waiting>,
}

/// An outbox that holds at most `limit` bytes waiting for its connection.
pub fn outbox(limit: usize) -> (Outbox, Frames) {
    let (tx, rx) = unbounded_channel();
    let waiting = Arc::new(Waiting {
        bytes: AtomicUsize::new(0),
        limit,
        overflowed: AtomicBool::new(false),
        overflow: Notify::new(),
    });
    let frames = Frames {
        rx,
        waiting: waiting.clone(),
    };
    (Outbox { tx, waiting }, frames)
}

impl Outbox {
    /// Queues `outbound`; false if the connection is gone or is being cut off for reading too
    /// slowly (then the frame is dropped: a held message stays held, and returns when the
    /// session ends).
    pub fn send(&self, outbound: Outbound) -> bool {
        let waiting = &self.waiting;
        if waiting.overflowed.load(Ordering::Relaxed) {
            return false;
        }
        let len = outbound.frame.len();
        if waiting.bytes.fetch_add(len, Ordering::Relaxed) + len > waiting.limit {
            waiting.overflowed.store(true, Ordering::Relaxed);
            waiting.overflow.notify_one();
            return false;
        }
        self.tx.send(outbound).is_ok()
    }
}

impl Frames {
    pub async fn recv(&mut self) -> Option<Outbound> {
        self.rx.recv().await
    }

    pub fn try_recv(&mut self) -> Option<Outbound> {
        self.rx.try_recv().ok()
    }

    /// `len` bytes of this outbox's frames are on the socket now.
    pub fn sent(&self, len: usize) {
        self.waiting.bytes.fetch_sub(len, Ordering::Relaxed);
    }

    /// A handle that waits for the overflow without borrowing the frames.
    pub fn overflow(&self) -> Overflow {
        Overflow(self.waiting.clone())
    }

    /// Stops new frames; what is queued can still be read.
    pub fn close(&mut self) {
        self.rx.close();
    }
}

/// Waits until the outbox went over its bound.
pub struct Overflow(Arc<Waiting>);

impl Overflow {
    pub async fn happened(&self) {
        if !self.0.overflowed.load(Ordering::Relaxed) {
            self.0.overflow.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize) -> Outbound {
        Outbound {
            frame: Bytes::from(vec![b'x'; len]),
            message: None,
        }
    }

    #[tokio::test]
    async fn an_outbox_refuses_past_its_bound_and_says_so() {
        let (outbox, mut frames) = outbox(100);
        assert!(outbox.send(frame(60)));
        frames.try_recv().unwrap();
        frames.sent(60);
        assert!(outbox.send(frame(60)), "written bytes no longer count");
        assert!(!outbox.send(frame(60)), "60 waiting + 60 is over 100");
        frames.overflow().happened().await;
        assert!(
            !outbox.send(frame(1)),
            "once over, the connection is being cut off"
        );
    }
}
