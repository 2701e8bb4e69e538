//! A standby node per queue (issue 35; the plan is docs/standby-design.md, and this is its
//! first step: shipping and catch-up, durability 2 synced on both nodes).
//!
//! The standby opens a WebSocket to the primary's node port on `/replicate` and says who it is
//! (the replication key) and what it holds; the primary ([`primary`]) sends what the standby
//! lacks from its segment files, then every write of its log as it happens (the log's
//! `shipping`); the standby ([`standby`]) writes each at its place, syncs, and answers how far
//! it is synced. A durability-2 change is answered once both nodes synced it.
//!
//! The control plane places a standby beside a queue made with `replicas: 2` (its local
//! provider: `fleet/local_standby.rs`), with a key derived from its node secret; the node's
//! config carries the key's hash.
//!
//! A standby's copy is promoted by starting a node on it: the local provider does so when its
//! node's data is lost (`fleet/local_standby.rs`). Not yet (the design's later steps): epochs
//! and promotion onto another machine, sessions and holds carried over.

pub mod primary;
pub mod standby;
mod wire;

use crate::auth::PasswordHash;
use crate::store::log::Shipping;
use crate::store::Meta;
use std::path::PathBuf;

/// The primary's side of its standby: who may be it, the log it is shipped, and the rest of
/// the data directory a promoted standby needs (the saved settings, the SQS receipt key).
pub struct Standby {
    /// The replication key's hash: a connection on `/replicate` must give the key.
    pub key: PasswordHash,
    pub shipping: Shipping,
    /// The settings, sent as saved.
    pub meta: Meta,
    /// The SQS receipt key's file (made as the node starts serving).
    pub receipt_key: PathBuf,
    /// Moves on every save of the settings: the standby is sent them again.
    pub settings_saved: tokio::sync::watch::Sender<u64>,
}

impl Standby {
    pub fn new(key: PasswordHash, shipping: Shipping, meta: Meta, receipt_key: PathBuf) -> Standby {
        Standby {
            key,
            shipping,
            meta,
            receipt_key,
            settings_saved: tokio::sync::watch::Sender::new(0),
        }
    }

    /// How the standby stands, for the live report.
    pub fn lag(&self) -> qe_shared::node_channel::StandbyLag {
        let (in_sync, lag_bytes) = self.shipping.standing();
        qe_shared::node_channel::StandbyLag { in_sync, lag_bytes }
    }
}

/// The path a standby connects to on the primary's node port.
pub const PATH: &str = "/replicate";
