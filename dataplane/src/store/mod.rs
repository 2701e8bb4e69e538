//! The store boundary: every change to the queue's messages passes through here.
//!
//! The engine tells the store what changed ([`Change`]) while it holds the queue's lock; the
//! store answers with a [`Receipt`] that the connection awaits *after* the lock is released,
//! before it replies. Today's [`MemoryStore`] keeps nothing (messages live in the engine's
//! memory, durability is only validated and carried); the append-only log of part 2 slots in
//! behind the same trait, and its receipts will complete at the write (durability 1) or the
//! shared sync (durability 2).

mod memory;

pub use memory::MemoryStore;

use crate::engine::{Message, MessageId, SessionId};

/// One change to the queue's messages.
#[derive(Debug)]
pub enum Change<'a> {
    /// A new message entered the queue (waiting or delayed).
    Published(&'a Message),
    /// A subscriber was given a message to hold.
    Delivered { id: MessageId, session: SessionId },
    /// A subscriber acknowledged a message: it is gone.
    Acked(MessageId),
    /// A message moved to the dead letter queue.
    DeadLettered(MessageId),
    /// A held message went back to waiting (its holder left).
    Returned(MessageId),
}

/// Why the store could not keep a change.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("writing to the message store failed: {0}")]
    Write(#[from] std::io::Error),
}

/// The store's answer to a change: what the connection waits on before its reply.
#[must_use]
#[derive(Debug)]
pub enum Receipt {
    /// Kept as well as the change's durability asks.
    Done,
}

impl Receipt {
    /// Waits until the change is as safe as its durability promises.
    pub async fn wait(self) -> Result<(), StoreError> {
        match self {
            Receipt::Done => Ok(()),
        }
    }
}

/// Where the queue's messages rest.
pub trait Store: Send {
    /// Records a change. Called under the queue's lock, so it must not block on I/O: it hands
    /// the change on and returns a receipt to wait on.
    fn record(&mut self, change: Change<'_>) -> Receipt;
}
