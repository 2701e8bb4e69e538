//! The nodes' live numbers: the latest [`LiveStats`] each queue's node reported (every
//! `live_stats_secs`, 10 by default), for `/metrics` (`api/metrics.rs`).
//!
//! They are kept in memory on the replica that received them, never in the store: only the
//! latest value of each is worth anything, and a store write per report (100 a second for
//! 1,000 queues) would cost a sled flush or an etcd consensus round each, for numbers the
//! next report replaces. What that costs: a replica that restarts shows nothing for a queue
//! until its node's next report, one interval later.
//!
//! With several replicas, a node reports to one at a time and Prometheus scrapes each. A
//! replica shows a queue's numbers only while they are fresh ([`fresh_for`]), so a node that
//! failed over to another replica is not shown twice for long, and no replica shows numbers
//! frozen at the last report it happened to get. How old its last report is shows as long as
//! the queue lives: "not reporting" is the youngest age across replicas growing, or no
//! replica having any (infra/prometheus/alerts.yml). The holder drops a queue's numbers once
//! the queue is no longer live ([`LiveNumbers::latest_of_live`]), so what it holds is bounded
//! by the live queues.

use qe_shared::node_channel::LiveStats;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A queue's latest live numbers, and when they came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latest {
    pub stats: LiveStats,
    /// When this replica received them, in milliseconds since 1970.
    pub at_ms: u64,
}

/// The latest live numbers by queue id. One per control plane process (in `api::Metrics`).
#[derive(Default)]
pub struct LiveNumbers {
    latest: Mutex<HashMap<String, Latest>>,
    /// Live reports this replica received.
    received: AtomicU64,
}

impl LiveNumbers {
    /// Keeps `stats` as queue `queue_id`'s latest, received now.
    pub fn keep(&self, queue_id: &str, stats: LiveStats) {
        self.keep_at(queue_id, stats, now_ms());
    }

    /// Keeps `stats` as queue `queue_id`'s latest, received at `at_ms`.
    pub fn keep_at(&self, queue_id: &str, stats: LiveStats, at_ms: u64) {
        let latest = Latest { stats, at_ms };
        let mut all = self.latest.lock().expect("never poisoned");
        match all.get_mut(queue_id) {
            Some(kept) => *kept = latest,
            None => {
                all.insert(queue_id.to_string(), latest);
            }
        }
        drop(all);
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    /// The latest numbers of each queue `is_live` says is live (a copy, read outside the
    /// lock); every other queue's are dropped for good.
    pub fn latest_of_live(&self, is_live: impl Fn(&str) -> bool) -> HashMap<String, Latest> {
        let mut all = self.latest.lock().expect("never poisoned");
        all.retain(|queue_id, _| is_live(queue_id));
        all.clone()
    }

    /// Queue `queue_id`'s latest numbers if they are younger than `fresh_for`.
    pub fn fresh(&self, queue_id: &str, fresh_for: Duration) -> Option<Latest> {
        let all = self.latest.lock().expect("never poisoned");
        let latest = *all.get(queue_id)?;
        let age_ms = now_ms().saturating_sub(latest.at_ms);
        (age_ms < fresh_for.as_millis() as u64).then_some(latest)
    }

    /// Live reports this replica received since it started.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// When this replica last heard each queue's node, in milliseconds since 1970, for the
    /// nodes heard since `since_ms`; older ones are dropped for good (a queue deleted long
    /// ago, a node that reports to another replica now), so what is held stays bounded
    /// whether or not `/metrics` is scraped.
    pub fn heard_since(&self, since_ms: u64) -> std::collections::BTreeMap<String, u64> {
        let mut all = self.latest.lock().expect("never poisoned");
        all.retain(|_, latest| latest.at_ms >= since_ms);
        all.iter()
            .map(|(queue_id, latest)| (queue_id.clone(), latest.at_ms))
            .collect()
    }
}

/// How long numbers received are shown: three report intervals (two reports may be late or
/// lost), and never less than 30 s, so a node slowed for a moment does not blink out.
pub fn fresh_for(live_stats_secs: u64) -> Duration {
    Duration::from_secs((3 * live_stats_secs).max(30))
}

/// Milliseconds since 1970 now.
pub use qe_shared::clock::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_report_replaces_the_last_and_dead_queues_are_dropped() {
        let numbers = LiveNumbers::default();
        let stats = |waiting| LiveStats {
            waiting,
            ..LiveStats::default()
        };
        numbers.keep_at("a", stats(1), 1_000);
        numbers.keep_at("a", stats(2), 2_000);
        numbers.keep_at("gone", stats(9), 2_000);
        assert_eq!(numbers.received(), 3);
        let live = numbers.latest_of_live(|id| id == "a");
        assert_eq!(live.len(), 1);
        assert_eq!(
            live["a"],
            Latest {
                stats: stats(2),
                at_ms: 2_000
            }
        );
        let again = numbers.latest_of_live(|_| true);
        assert!(
            !again.contains_key("gone"),
            "dropped for good, not only hidden"
        );
    }

    #[test]
    fn what_was_heard_long_ago_is_dropped() {
        let numbers = LiveNumbers::default();
        numbers.keep_at("old", LiveStats::default(), 1_000);
        numbers.keep_at("new", LiveStats::default(), 5_000);
        let heard = numbers.heard_since(2_000);
        assert_eq!(
            heard.into_iter().collect::<Vec<_>>(),
            [("new".into(), 5_000)]
        );
        assert!(!numbers.latest_of_live(|_| true).contains_key("old"));
    }

    #[test]
    fn numbers_stay_fresh_for_three_intervals_and_at_least_thirty_seconds() {
        assert_eq!(fresh_for(10), Duration::from_secs(30));
        assert_eq!(fresh_for(1), Duration::from_secs(30));
        assert_eq!(fresh_for(60), Duration::from_secs(180));
    }
}
