//! The round writer on the async runtime: at low concurrency, the write of a round's records
//! without a thread switch.
//!
//! The writer thread costs two thread switches and a futex a round (woken by the first
//! record, and waking the runtime back through the progress watch), and on the node's one
//! core it runs only once the runtime lets it. With 16 publishers and one publish in flight
//! each, a round is 16 records, and those switches were most of what durability 1 cost over
//! durability 0 (issue 34). So when the node runs in a tokio runtime, the first record of a
//! round wakes this task instead (a task of the same runtime: no system call); it yields once,
//! so that the requests ready in the same turn add their records too, and then writes the
//! round itself with the writer thread's code (`Shared::write_pending`), under the same files
//! lock. The replies it completes are woken on the same runtime.
//!
//! A write on the runtime's thread holds up every connection that thread serves, so it is only
//! done where it is quick: never while the files are busy (the syncer compacting, the writer
//! thread writing), never for a round that begins a new segment file or while failed writes
//! wait for their retry (the writer thread does those), and after a write that took longer
//! than [`SLOW_WRITE`] not at all for [`STAND_DOWN`]: the disk is slow, and the writer thread
//! takes every round meanwhile. A round it does not write it hands to the writer thread.

use super::Shared;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A write that took longer than this sends rounds back to the writer thread.
const SLOW_WRITE: Duration = Duration::from_millis(1);

/// For this long after a slow write.
const STAND_DOWN: Duration = Duration::from_secs(1);

/// The task's side of the log: what wakes it, and until when it stands down.
pub(super) struct RoundWriter {
    wake: Notify,
    started: Instant,
    /// Milliseconds after `started` before which rounds go to the writer thread.
    stand_down_until_ms: AtomicU64,
    /// Rounds it wrote.
    rounds_written: AtomicU64,
}

impl RoundWriter {
    pub fn new() -> RoundWriter {
        RoundWriter {
            wake: Notify::new(),
            started: Instant::now(),
            stand_down_until_ms: AtomicU64::new(0),
            rounds_written: AtomicU64::new(0),
        }
    }

    /// Rounds it wrote so far.
    #[cfg(test)]
    pub fn rounds_written(&self) -> u64 {
        self.rounds_written.load(Ordering::Relaxed)
    }

    /// Whether rounds go to the task now.
    pub fn takes_rounds(&self) -> bool {
        self.stand_down_until_ms.load(Ordering::Relaxed) <= self.elapsed_ms()
    }

    /// Wakes the task for a round (a permit is kept if it is not waiting yet).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// Starts the task on the runtime this runs in, if any (the log's tests without one, and
/// tools that read a log, keep to the writer thread).
pub(super) fn spawn(shared: &Arc<Shared>) -> Option<tokio::task::JoinHandle<()>> {
    shared.round_writer.as_ref()?;
    let shared = shared.clone();
    Some(tokio::spawn(async move { run(&shared).await }))
}

async fn run(shared: &Shared) {
    let round_writer = shared
        .round_writer
        .as_ref()
        .expect("started with a round writer");
    loop {
        round_writer.wake.notified().await;
        // The requests ready in this turn add their records first: one write takes them all.
        tokio::task::yield_now().await;
        let started = Instant::now();
        if !shared.try_write_pending() {
            shared.hand_round_to_writer();
            continue;
        }
        round_writer.rounds_written.fetch_add(1, Ordering::Relaxed);
        if started.elapsed() > SLOW_WRITE {
            let until = round_writer.elapsed_ms() + STAND_DOWN.as_millis() as u64;
            round_writer
                .stand_down_until_ms
                .store(until, Ordering::Relaxed);
            tracing::debug!(took = ?started.elapsed(), "the log's writes go to its thread for a while");
        }
    }
}
