//! The store's own upkeep, by the leading replica: etcd keeps every change in its history
//! until it is compacted, and keeps the space compaction frees inside its file until a member
//! is defragmented; at its quota (`--quota-backend-bytes`) it refuses every write. Each hour
//! the leader compacts the history to the revision it saw an hour before (what etcd's own
//! `--auto-compaction-retention=1h` does, which docs/deploy.md §13.2 also sets), and
//! defragments each member holding more than [`DEFRAGMENT_OVER`] bytes free, one member at a
//! time (a defragmentation blocks its member while it copies the file; the others serve). The
//! space a compaction frees shows once a write follows it, so it is defragmented by the next
//! look, an hour later.
//! sled needs none of it.

use crate::store::Store;
use std::time::Duration;

/// How often the leader looks.
pub const EVERY: Duration = Duration::from_secs(3600);
/// Free space inside a member's file past which it is defragmented: 256 MiB.
pub const DEFRAGMENT_OVER: i64 = 256 << 20;

/// Looks after the store every [`EVERY`] while this replica leads.
pub async fn run(store: Store, mut leadership: crate::leadership::Leadership) {
    loop {
        let fence = leadership.lead().await;
        tokio::select! {
            _ = while_leading(&store) => {}
            _ = leadership.lost(&fence) => {}
        }
    }
}

async fn while_leading(store: &Store) {
    let mut seen = None;
    loop {
        match store.backend().upkeep(seen, DEFRAGMENT_OVER).await {
            Ok(Some(done)) => {
                if done.compacted_to.is_some() || done.defragmented > 0 {
                    tracing::info!(compacted_to = ?done.compacted_to, defragmented = done.defragmented, freed = done.freed, "the store's upkeep");
                }
                seen = Some(done.revision);
            }
            // A store with no history: nothing to look after.
            Ok(None) => return std::future::pending().await,
            Err(error) => tracing::warn!(%error, "the store's upkeep: tried again later"),
        }
        tokio::time::sleep(EVERY).await;
    }
}
