//! The binaries' log: lines go to stderr from a thread of their own, through a bounded queue
//! that drops lines when full rather than wait. A reader of stderr that stalls (journald busy
//! or restarting, a full pipe) then costs lines, counted ([`dropped_lines`]), never a worker
//! of the runtime blocked in a write, and with it every connection it drives.

use std::sync::OnceLock;

/// Lines waiting for stderr at most: past them, lines are dropped.
const LINES_WAITING_AT_MOST: usize = 16_384;

static COUNTER: OnceLock<tracing_appender::non_blocking::ErrorCounter> = OnceLock::new();

/// Installs the log for the process with `filter`, colours only on a terminal; the guard it
/// returns writes out what waits when dropped (keep it for the life of `main`).
pub fn init(filter: tracing_subscriber::EnvFilter) -> tracing_appender::non_blocking::WorkerGuard {
    use std::io::IsTerminal;
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LINES_WAITING_AT_MOST)
        .thread_name("log")
        .finish(std::io::stderr());
    let _ = COUNTER.set(writer.error_counter());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    guard
}

/// Log lines dropped since the process started because stderr did not take them in time.
pub fn dropped_lines() -> u64 {
    COUNTER
        .get()
        .map_or(0, |counter| counter.dropped_lines() as u64)
}
