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
//! node's data is lost (`fleet/local_standby.rs`), at the queue's next epoch ([`epoch`]): a
//! primary that hears of a higher epoch than its own has been superseded and stops. The
//! sessions and what each holds go to the standby beside the log ([`holds`]), and a node
//! started on the copy takes them as saved sessions. Not yet (the design's later steps):
//! promotion onto another machine.

pub mod epoch;
pub mod holds;
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
    /// The epoch this node serves at: taken at start ([`epoch::start_primary`]), raised by a
    /// config that gives a higher one. The lock keeps the file's writes in order.
    epoch: std::sync::Mutex<u64>,
    /// The log's directory, where the epoch is kept.
    log_dir: PathBuf,
}

/// The exit code of a primary that has been superseded: its supervisor must not start it as
/// the primary again (it would not: [`epoch::refuse_superseded`] refuses its copy).
pub const SUPERSEDED_EXIT: u8 = 3;

impl Standby {
    pub fn new(
        key: PasswordHash,
        shipping: Shipping,
        meta: Meta,
        receipt_key: PathBuf,
        epoch: u64,
        log_dir: PathBuf,
    ) -> Standby {
        Standby {
            key,
            shipping,
            meta,
            receipt_key,
            settings_saved: tokio::sync::watch::Sender::new(0),
            epoch: std::sync::Mutex::new(epoch),
            log_dir,
        }
    }

    /// The epoch this node serves at now.
    pub fn epoch(&self) -> u64 {
        *self.epoch.lock().expect("never poisoned")
    }

    /// The control plane gives this node `given`: a higher epoch is taken and kept (a lower
    /// one is not: what the copy keeps wins, as at start).
    pub fn take_epoch(&self, given: u64) -> Result<(), epoch::EpochError> {
        let mut epoch = self.epoch.lock().expect("never poisoned");
        if given > *epoch {
            epoch::raise(&self.log_dir, given)?;
            tracing::info!(from = *epoch, to = given, "the queue's epoch moved on");
            *epoch = given;
        }
        Ok(())
    }

    /// A standby that followed a primary at epoch `by` reached this node. Higher than this
    /// node's: another node is the primary now. This one keeps that (so it never serves as a
    /// primary on this copy again) and stops at once, as a kill would stop it: every write it
    /// answered is where a kill leaves it, and it answers no other, nor delivers anything the
    /// new primary may deliver too.
    pub fn stop_if_superseded(&self, by: u64) {
        // Held to the end: no config raises the epoch between the look and the mark.
        let epoch = self.epoch.lock().expect("never poisoned");
        if by <= *epoch {
            return;
        }
        let kept = epoch::supersede(&self.log_dir, *epoch, by);
        eprintln!(
            "dataplane: superseded: this node is the primary at epoch {} and a standby followed a primary at epoch {by}; it stops, and does not serve on this copy again{}",
            *epoch,
            match kept {
                Ok(()) => String::new(),
                Err(error) => format!(" (keeping that failed: {error})"),
            }
        );
        std::process::exit(i32::from(SUPERSEDED_EXIT))
    }

    /// How the standby stands, for the live report.
    pub fn lag(&self) -> qe_shared::node_channel::StandbyLag {
        self.shipping.standing()
    }
}

/// The path a standby connects to on the primary's node port.
pub const PATH: &str = "/replicate";
