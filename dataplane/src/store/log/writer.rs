//! The log's writer thread: writes the pending records the round writer on the runtime
//! (`inline.rs`) leaves to it, or all of them where the log runs without a runtime. While it
//! writes, more records gather, and the next write takes them all: under load one `write`
//! serves many requests.
//! It runs `SCHED_BATCH` (see `batch_scheduling`): a request that woke it is not
//! interrupted, and it and the others ready go on adding records until the runtime has
//! nothing more to do; one write then takes them all. On a machine with a core to spare the
//! writer runs there at once anyway.

use super::files::RETRY_AFTER;
use super::Shared;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

pub(super) fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || run(&shared))
}

fn run(shared: &Shared) {
    super::batch_scheduling();
    loop {
        let stopping = wait_for_records(shared);
        shared.write_pending();
        if stopping {
            return;
        }
    }
}

/// Sleeps until records are pending, a retry of failed ones is due, or the store stops;
/// returns whether it stops (what is pending is written first either way).
fn wait_for_records(shared: &Shared) -> bool {
    let retry_at = shared.files.lock().expect("never poisoned").retry_at;
    let mut state = shared.lock();
    loop {
        if state.stopping {
            return true;
        }
        if !state.pending.is_empty() {
            return false;
        }
        let wait = match retry_at {
            Some(at) => match at.checked_duration_since(Instant::now()) {
                Some(wait) => wait,
                None => return false,
            },
            None => RETRY_AFTER * 50, // nothing to retry: wake now and then anyway
        };
        state.writer_idle = true;
        state = shared
            .records
            .wait_timeout(state, wait)
            .expect("never poisoned")
            .0;
        state.writer_idle = false;
    }
}
