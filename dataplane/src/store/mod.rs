//! The store boundary: every change to the queue's messages passes through here.
//!
//! The engine tells the store what changed ([`Change`]) while it holds the queue's lock; the
//! store answers with a [`Receipt`] that the connection awaits *after* the lock is released,
//! before it replies. [`LogStore`] keeps durable messages in an append-only log;
//! [`MemoryStore`] keeps nothing (for engine tests). [`Meta`] keeps the settings.

pub mod log;
mod memory;
pub mod meta;

pub use log::{LogOptions, LogStore, StorageMeter};
pub use memory::MemoryStore;
pub use meta::Meta;

/// Where a node keeps things in its data directory (a standby's copy has the same layout).
pub mod data_dir {
    /// The message log's segment files (`log`).
    pub const MESSAGES: &str = "messages";
    /// The settings and the history (sled, `meta`).
    pub const META: &str = "meta";
    /// The key the SQS face signs receipt handles with (`sqs::ReceiptKey`).
    pub const SQS_RECEIPT_KEY: &str = "sqs-receipt-key";
    /// A standby's journal of who holds which message (`replication::holds`), taken by the
    /// node started on its copy.
    pub const HOLDS: &str = "holds";
}

use crate::message::ids::{MessageId, SessionId};
use crate::message::{Dead, Message};

/// What a message's record says of it beyond the message itself (README, "Delivery rules").
/// The default is a new message that waits: what every record said before these rules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Life {
    /// When a delayed message falls due (ms since 1970).
    pub due_ms: Option<u64>,
    /// When the message leaves the queue unhandled (ms since 1970).
    pub expires_ms: Option<u64>,
    /// Deliveries so far (WebSocket and SQS).
    pub receives: u32,
    /// In the dead letter queue, why, and since when.
    pub dead: Option<Dead>,
}

impl Life {
    /// A new message due at `due_ms` (None: it waits at once).
    pub fn due(due_ms: Option<u64>) -> Life {
        Life {
            due_ms,
            ..Life::default()
        }
    }
}

/// One change to the queue's messages.
#[derive(Debug)]
pub enum Change<'a> {
    /// A new message entered the queue, or a message's record is written again because what
    /// `life` says changed (a receive counted, a move to the dead letter queue with its
    /// reason): the latest record of a message replaces the ones before.
    Published {
        id: MessageId,
        message: &'a Message,
        life: Life,
        /// Its deduplication id and window: in its first record only.
        dedup: Option<log::record::Dedup>,
    },
    /// A durable message is held by `holder` from now on: given to a subscriber, or to an SQS
    /// receive; or held anew (a resume's new session id, a new capacity, a new visibility).
    Delivered { id: MessageId, holder: Holder },
    /// A message is gone: acknowledged (or deleted).
    Acked(MessageId),
    /// A message moved to the dead letter queue, as a mark that says neither why nor when:
    /// how nodes before 2026-12-04 dead-lettered a rejected message. The engine now writes
    /// [`Change::Published`] with `life.dead` instead; the store still writes a mark when told,
    /// so that its tests make the logs older nodes left (which it must read and compact).
    DeadLettered(MessageId),
    /// A held durable message went back to waiting (its holder left).
    Returned(MessageId),
    /// Messages are gone at once (an administrator's purge): one record for them all.
    Purged(&'a [MessageId]),
    /// A message moved from the dead letter queue back to the queue (a redrive).
    Redriven(MessageId),
}

/// Who holds a durable message that is out for delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A subscriber's session, of this capacity.
    Session { session: SessionId, capacity: u64 },
    /// An SQS receive: invisible until `until_ms`, under receive number `receipt`.
    Received { until_ms: u64, receipt: u64 },
}

/// Why a change is not yet as safe as its durability promised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("the write failed; the change is kept in memory and written later")]
    NotWritten,
    #[error("the sync failed; the change is written but may not survive a machine failure")]
    NotSynced,
}

/// The store's answer to a change: what the connection waits on before its reply.
#[must_use]
#[derive(Debug)]
pub enum Receipt {
    /// Nothing to wait for (durability 0, or a change that is not kept).
    Done,
    /// Durability 1: wait until the record is written (handed to the operating system).
    Written(log::Ticket),
    /// Durability 2: wait until the record is synced.
    Synced(log::Ticket),
    /// A durable message held (delivered or received) on a queue whose standby answers
    /// holds: wait until the standby has heard who holds it (`log::heard`). Nothing is
    /// written, so it never fails.
    Heard(log::HoldGate),
}

impl Receipt {
    /// What a delivery of the held message waits for, if anything.
    pub fn into_gate(self) -> Option<log::HoldGate> {
        match self {
            Receipt::Heard(gate) => Some(gate),
            _ => None,
        }
    }

    /// Where the change's record ends in the log (None: nothing to wait for).
    pub fn lsn(&self) -> Option<u64> {
        match self {
            Receipt::Done | Receipt::Heard(_) => None,
            Receipt::Written(ticket) | Receipt::Synced(ticket) => Some(ticket.lsn()),
        }
    }

    /// One receipt for two changes: it is as safe as both once the later record is, with the
    /// stronger durability of the two (a sync covers every record written before it).
    pub fn and(self, other: Receipt) -> Receipt {
        match (self, other) {
            (Receipt::Done, receipt) | (receipt, Receipt::Done) => receipt,
            (Receipt::Heard(a), Receipt::Heard(b)) => Receipt::Heard(a.later(b)),
            // The engine combines holds only with holds (the messages of one receive). Were
            // one combined with a record's receipt, the record's is kept, not the hold's.
            (Receipt::Heard(_), receipt) | (receipt, Receipt::Heard(_)) => receipt,
            (Receipt::Written(a), Receipt::Written(b)) => Receipt::Written(a.later(b)),
            (
                Receipt::Written(a) | Receipt::Synced(a),
                Receipt::Written(b) | Receipt::Synced(b),
            ) => Receipt::Synced(a.later(b)),
        }
    }

    /// Waits until the change is as safe as its durability promises.
    pub async fn wait(self) -> Result<(), StoreError> {
        match self {
            Receipt::Done => Ok(()),
            Receipt::Written(ticket) => match ticket.wait(false).await {
                true => Ok(()),
                false => Err(StoreError::NotWritten),
            },
            Receipt::Synced(ticket) => match ticket.wait(true).await {
                true => Ok(()),
                false => Err(StoreError::NotSynced),
            },
            Receipt::Heard(gate) => {
                gate.open().await;
                Ok(())
            }
        }
    }
}

/// Where the queue's messages rest.
pub trait Store: Send {
    /// Records a change. Called under the queue's lock, so it must not block on I/O: it hands
    /// the change on and returns a receipt to wait on.
    fn record(&mut self, change: Change<'_>) -> Receipt;

    /// Whether a durable change can still be made safe. A store that cannot (its disk failed
    /// a sync) makes the queue refuse new durable messages.
    fn is_writable(&self) -> bool {
        true
    }

    /// Whether this node may have been replaced by its standby (the control plane unheard for
    /// its silence limit, no standby in sync): the queue takes no publish then, of any
    /// durability, so that never two nodes of one queue take them.
    fn stepped_down(&self) -> bool {
        false
    }

    /// The receipt of a change already recorded, whose record ends at `lsn`: a repeat of a
    /// deduplicated publish waits on the first's record.
    fn receipt_at(&self, _lsn: u64, _durability: crate::message::Durability) -> Receipt {
        Receipt::Done
    }

    /// Bytes of changes held in memory because the disk would not take them yet: they count
    /// against `max-messages-memory`.
    fn backlog_bytes(&self) -> u64 {
        0
    }

    /// A receipt for every change recorded so far, written (durability 1): what an answer
    /// about a change that may have been recorded earlier, and not by this request, waits for.
    fn everything_recorded(&self) -> Receipt {
        Receipt::Done
    }
}
