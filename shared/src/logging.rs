//! The binaries' log: lines go to stderr from a thread of their own, through a bounded queue
//! that drops lines when full rather than wait. A reader of stderr that stalls (journald busy
//! or restarting, a full pipe) then costs lines, counted ([`dropped_lines`]), never a worker
//! of the runtime blocked in a write, and with it every connection it drives.
//!
//! A line a client can cause at will (its connection dropped for not reading, a token
//! refused) is written only while its source, and all clients together, have lines left this
//! minute ([`client_line_allowed`]): past them its lines are dropped and counted with the
//! others, so no client, nor many, can fill the log, nor push the node's own lines out of it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

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

/// Log lines dropped since the process started: stderr did not take them in time, or their
/// client's source had written its share ([`client_line_allowed`]).
pub fn dropped_lines() -> u64 {
    let unwritten = COUNTER
        .get()
        .map_or(0, |counter| counter.dropped_lines() as u64);
    unwritten + CLIENT_LINES_DROPPED.load(Ordering::Relaxed)
}

/// Lines one source's clients may cause a minute.
pub const CLIENT_LINES_PER_MINUTE: u32 = 20;

/// Sources whose lines are counted at once at most: past it, the counts start again (each
/// source gets a fresh minute: bounded memory beats exactness here).
const SOURCES_AT_MOST: usize = 10_000;

/// Lines all clients together may cause a minute: many sources (an attacker with many IPv6
/// /64s) cannot fill the log either.
pub const CLIENT_LINES_IN_ALL_PER_MINUTE: u32 = 600;

/// Each source's minute and lines in it, and everyone's.
#[derive(Default)]
struct ClientLines {
    by_source: HashMap<IpAddr, Minute>,
    all: Minute,
}

/// A minute from its start, and the lines written in it.
#[derive(Clone, Copy)]
struct Minute {
    from: Instant,
    lines: u32,
}

impl Default for Minute {
    fn default() -> Minute {
        Minute {
            from: Instant::now(),
            lines: 0,
        }
    }
}

impl Minute {
    /// Takes a line if fewer than `at_most` were written in the minute `now` is in.
    fn take(&mut self, now: Instant, at_most: u32) -> bool {
        if now.duration_since(self.from) >= Duration::from_secs(60) {
            *self = Minute {
                from: now,
                lines: 0,
            };
        }
        let room = self.lines < at_most;
        self.lines += u32::from(room);
        room
    }
}

static CLIENT_LINES: Mutex<Option<ClientLines>> = Mutex::new(None);
static CLIENT_LINES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// Whether a line caused by a client at `source` (as the per-source caps count it:
/// `qe_serve::source_of`) may be written now: [`CLIENT_LINES_PER_MINUTE`] a minute each, and
/// [`CLIENT_LINES_IN_ALL_PER_MINUTE`] for all together.
/// Ask before writing the line; one refused is counted as dropped.
pub fn client_line_allowed(source: IpAddr) -> bool {
    client_line_allowed_at(source, Instant::now())
}

fn client_line_allowed_at(source: IpAddr, now: Instant) -> bool {
    let mut lines = CLIENT_LINES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let lines = lines.get_or_insert_with(ClientLines::default);
    if lines.by_source.len() >= SOURCES_AT_MOST && !lines.by_source.contains_key(&source) {
        lines.by_source.clear();
    }
    let of_source = lines.by_source.entry(source).or_insert(Minute {
        from: now,
        lines: 0,
    });
    // The source's share first: a line it may not write takes nothing from everyone's.
    if of_source.take(now, CLIENT_LINES_PER_MINUTE)
        && lines.all.take(now, CLIENT_LINES_IN_ALL_PER_MINUTE)
    {
        return true;
    }
    CLIENT_LINES_DROPPED.fetch_add(1, Ordering::Relaxed);
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_writes_its_share_a_minute_and_the_rest_are_counted_dropped() {
        let (one, other): (IpAddr, IpAddr) =
            ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let start = Instant::now();
        let dropped_before = dropped_lines();
        let allowed = (0..50)
            .filter(|_| client_line_allowed_at(one, start))
            .count();
        assert_eq!(allowed, CLIENT_LINES_PER_MINUTE as usize);
        assert_eq!(dropped_lines() - dropped_before, 30);
        assert!(
            client_line_allowed_at(other, start),
            "another source has its own"
        );
        let later = start + Duration::from_secs(61);
        assert!(client_line_allowed_at(one, later), "a new minute");

        // Many sources together write their share in all, no more.
        let much_later = later + Duration::from_secs(61);
        let sources = (0..100u32).map(|n| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n)));
        let written = sources
            .flat_map(|source| (0..CLIENT_LINES_PER_MINUTE).map(move |_| source))
            .filter(|source| client_line_allowed_at(*source, much_later))
            .count();
        assert_eq!(written, CLIENT_LINES_IN_ALL_PER_MINUTE as usize);
    }
}
