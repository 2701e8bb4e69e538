//! Counts of the limits hit, logged as one line at the first hit and then at most once per
//! [`LOG_INTERVAL`], whatever the flood: a line per packet would turn a flood of queries into
//! a flood of log.

use super::Service;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The shortest time between two log lines about limits: often enough to see a flood begin
/// and end, seldom enough that a long one fills no disk.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A limit hit, by where.
#[derive(Debug, Clone, Copy)]
pub(super) enum Limit {
    /// A UDP query over its source's budget, dropped.
    UdpDropped,
    /// A UDP query over its source's budget, answered truncated.
    UdpSlipped,
    /// A UDP query within its budget, dropped because too many were being answered already.
    UdpBusy,
    /// A TCP connection closed at once: the cap on connections in all was reached.
    TcpFull,
    /// A TCP connection closed at once: its host had its cap of connections open.
    TcpSourceFull,
    /// A TCP connection closed for sending no whole query, or taking no response, in time.
    TcpIdle,
    /// A TCP connection closed at the end of its lifetime.
    TcpLifetime,
    /// A TCP query made to wait for its source's budget.
    TcpPaced,
    /// A source forgotten by the full rate table.
    SourceEvicted,
    /// A TCP accept that failed (out of file descriptors, say).
    AcceptFailed,
}

impl Limit {
    const ALL: [Limit; 10] = [
        Limit::UdpDropped,
        Limit::UdpSlipped,
        Limit::UdpBusy,
        Limit::TcpFull,
        Limit::TcpSourceFull,
        Limit::TcpIdle,
        Limit::TcpLifetime,
        Limit::TcpPaced,
        Limit::SourceEvicted,
        Limit::AcceptFailed,
    ];

    fn name(self) -> &'static str {
        match self {
            Limit::UdpDropped => "udp_dropped",
            Limit::UdpSlipped => "udp_slipped",
            Limit::UdpBusy => "udp_busy",
            Limit::TcpFull => "tcp_full",
            Limit::TcpSourceFull => "tcp_source_full",
            Limit::TcpIdle => "tcp_idle",
            Limit::TcpLifetime => "tcp_lifetime",
            Limit::TcpPaced => "tcp_paced",
            Limit::SourceEvicted => "sources_evicted",
            Limit::AcceptFailed => "accept_failed",
        }
    }
}

#[derive(Default)]
pub(super) struct Tally {
    /// One count per [`Limit`], in the order of [`Limit::ALL`]; atomics, so that counting a
    /// dropped packet takes no lock.
    counts: [AtomicU64; Limit::ALL.len()],
    /// Wakes the reporter; a wake while it sleeps is kept for when it is done.
    hit: Notify,
}

impl Tally {
    pub(super) fn hit(&self, limit: Limit) {
        self.add(limit, 1);
    }

    pub(super) fn add(&self, limit: Limit, count: u64) {
        if count > 0 {
            self.counts[limit as usize].fetch_add(count, Ordering::Relaxed);
            self.hit.notify_one();
        }
    }

    /// The counts since the last call, as `name=count` for those not zero.
    pub(super) fn take(&self) -> String {
        let taken = Limit::ALL.map(|limit| {
            let count = self.counts[limit as usize].swap(0, Ordering::Relaxed);
            (limit.name(), count)
        });
        let hit = taken.iter().filter(|(_, count)| *count > 0);
        let text: Vec<String> = hit.map(|(name, count)| format!("{name}={count}")).collect();
        text.join(" ")
    }
}

/// Logs the limits hit, for as long as the process runs.
pub(super) async fn report(service: Arc<Service>) {
    loop {
        service.tally.hit.notified().await;
        let counts = service.tally.take();
        if !counts.is_empty() {
            tracing::warn!("dns limits hit: {counts}");
        }
        tokio::time::sleep(LOG_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counts_are_told_once_and_the_zeros_not_at_all() {
        let tally = Tally::default();
        tally.hit(Limit::UdpDropped);
        tally.hit(Limit::UdpDropped);
        tally.add(Limit::SourceEvicted, 3);
        tally.add(Limit::TcpIdle, 0);
        assert_eq!(tally.take(), "udp_dropped=2 sources_evicted=3");
        assert_eq!(tally.take(), "");
    }
}
