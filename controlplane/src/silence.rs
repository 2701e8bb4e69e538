//! Silent nodes: a node that runs but is not heard from (a hung process or kernel, a lost
//! network, a node that cannot start) serves nobody, and nothing else notices; its queue is
//! down until it is replaced.
//!
//! A node is heard from every `live_stats_secs` (its live report, `live.rs`) by whichever
//! replica it reaches. Each replica shares what it heard ([`share`]): every interval it writes,
//! under `heard/REPLICA`, when it last heard each node, one store write per replica per
//! interval whatever the number of queues. The leader's reconciler reads them all at each look
//! at every queue and takes the latest per queue ([`Watch::silent`]); one not heard from for
//! [`silent_after`] is fenced and replaced (`reconciler.rs`).
//!
//! A queue is judged only from when this leader could have heard it: from the start of its
//! term, or from when a replacement was placed plus the time the provider's nodes take to
//! boot, whichever is later. So a new leader, or a fresh instance, is never judged on
//! silence that came before it.

use crate::live::LiveNumbers;
use crate::model::queue::{Queue, Status};
use crate::store::Store;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// What the reconciler replaces silent nodes by.
#[derive(Clone)]
pub struct Rules {
    /// How long a node may go unheard ([`silent_after`]); `None`: never replaced for it.
    pub limit: Option<Duration>,
    /// Nodes this replica replaced since it started, for `/metrics`.
    pub replaced: Arc<AtomicU64>,
    /// Standbys this replica replaced since it started (absent from their node for the
    /// limit: [`Watch::standby_absent`]), for `/metrics`.
    pub standbys_replaced: Arc<AtomicU64>,
}

/// How long a node may go unheard before it is replaced: `intervals` live-report intervals
/// of `live_stats_secs`; `None` (never) for 0.
pub fn silent_after(intervals: u64, live_stats_secs: u64) -> Option<Duration> {
    (intervals > 0).then(|| Duration::from_secs(intervals * live_stats_secs))
}

/// Every `every`, keeps in the store when this replica last heard each node, for the leader
/// (this one too). What is older than `keep_for` is dropped: a node heard that long ago by
/// this replica is either silent or reporting elsewhere, and either way this replica's word
/// on it adds nothing.
pub async fn share(
    store: Store,
    live: Arc<LiveNumbers>,
    replica: String,
    every: Duration,
    keep_for: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let since = crate::live::now_ms().saturating_sub(keep_for.as_millis() as u64);
        let heard = live.heard_since(since);
        if let Err(error) = store.put_heard(&replica, &heard).await {
            tracing::warn!(%error, "what this replica heard from the nodes could not be shared");
        }
    }
}

/// One leadership term's view of the nodes' silence: since when it watches each queue, and
/// each replicated queue's standby.
#[derive(Default)]
pub struct Watch {
    watched: HashMap<String, Watched>,
    /// A standby is heard through its node: a node's live report says since when none has
    /// been attached to it (`Queue::standby_absent_since_ms`).
    standbys: HashMap<String, Watched>,
    /// Standbys replaced one after the other, none of them ever attached for long (a copy
    /// its node refuses for good, a zone that cannot reach it): how many in a row, and how
    /// much longer than its boot time the next is given ([`Watch::standby_replaced`]).
    standbys_replaced: HashMap<String, (u32, Duration)>,
}

/// The most a standby replaced again and again waits past its boot time to be judged.
const STANDBY_BACKOFF_AT_MOST: Duration = Duration::from_secs(3600);

/// Since when one queue's node is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watched {
    /// When this term first looked at it, or when its node was last placed.
    since_ms: u64,
    /// Until when it may stay unheard while it boots: its silence counts from here until it
    /// is first heard after `since_ms`.
    boot_until_ms: u64,
    /// Whether it was given a boot time more because its machine was being brought back by
    /// its cloud ([`Watch::grant_recovery`]): once per placement, so that a machine that
    /// never comes back is replaced all the same.
    recovery_granted: bool,
}

impl Watched {
    /// When its node was last heard, or could have been: a node heard since it was placed
    /// has booted, and counts from then; one not heard since, from the end of its boot time.
    fn last(&self, heard_ms: Option<u64>) -> u64 {
        match heard_ms {
            Some(heard) if heard >= self.since_ms => heard,
            _ => self.boot_until_ms,
        }
    }
}

impl Watch {
    /// The ids of those of `queues` whose node is placed and has not been heard from for
    /// longer than `limit`, judged at `now_ms` with `heard` (the latest time any replica
    /// heard each node). A queue seen for the first time is watched from `now_ms`, with
    /// `boot` more if its node has never reported (it may be booting still); queues no
    /// longer listed are forgotten.
    pub fn silent(
        &mut self,
        queues: &[Queue],
        heard: &HashMap<String, u64>,
        now_ms: u64,
        limit: Duration,
        boot: Duration,
    ) -> Vec<String> {
        let placed: Vec<&Queue> = queues
            .iter()
            .filter(|queue| queue.status.is_live() && queue.node.is_some())
            .collect();
        self.watched
            .retain(|id, _| placed.iter().any(|queue| &queue.id == id));
        self.standbys
            .retain(|id, _| placed.iter().any(|queue| &queue.id == id));
        self.standbys_replaced
            .retain(|id, _| placed.iter().any(|queue| &queue.id == id));
        let mut silent = Vec::new();
        for queue in placed {
            let booting = match queue.status == Status::Provisioning {
                true => boot,
                false => Duration::ZERO,
            };
            let watched = *self
                .watched
                .entry(queue.id.clone())
                .or_insert_with(|| Watched::from(now_ms, booting));
            let last = watched.last(heard.get(&queue.id).copied());
            if now_ms.saturating_sub(last) > limit.as_millis() as u64 {
                silent.push(queue.id.clone());
            }
        }
        silent
    }

    /// Watches queue `queue_id` anew from `now_ms`: its node was placed anew, and may take
    /// `boot` to be heard; its standby has to reach the new node, and is given as long.
    pub fn placed(&mut self, queue_id: &str, now_ms: u64, boot: Duration) {
        self.watched
            .insert(queue_id.to_string(), Watched::from(now_ms, boot));
        self.standby_placed(queue_id, now_ms, boot);
    }

    /// Watches queue `queue_id`'s standby anew from `now_ms`: it was placed anew (started,
    /// launched), and may take `boot` to reach its node.
    pub fn standby_placed(&mut self, queue_id: &str, now_ms: u64, boot: Duration) {
        let backoff = self
            .standbys_replaced
            .get(queue_id)
            .map(|&(_, backoff)| backoff);
        let boot = boot + backoff.unwrap_or_default();
        self.standbys
            .insert(queue_id.to_string(), Watched::from(now_ms, boot));
    }

    /// Queue `queue_id`'s standby was replaced at `now_ms` for its absence: the next is
    /// watched from then, given `boot`, and, when this is not the first replacement since a
    /// standby last stayed, longer: `limit` more for the second in a row, then twice as much
    /// more for each (at most an hour). A standby that can never follow (its copy is of
    /// another log, which its node refuses until an operator decides) is so replaced ever
    /// more seldom. Returns how many in a row this one is.
    pub fn standby_replaced(
        &mut self,
        queue_id: &str,
        now_ms: u64,
        boot: Duration,
        limit: Duration,
    ) -> u32 {
        let (in_a_row, _) = self
            .standbys_replaced
            .get(queue_id)
            .copied()
            .unwrap_or_default();
        let in_a_row = in_a_row + 1;
        let doublings = (in_a_row - 1).min(16);
        let backoff = (limit * ((1 << doublings) - 1)).min(STANDBY_BACKOFF_AT_MOST);
        self.standbys_replaced
            .insert(queue_id.to_string(), (in_a_row, backoff));
        self.standby_placed(queue_id, now_ms, boot);
        in_a_row
    }

    /// Whether `queue`'s standby has been absent from its node (its node's reports say none
    /// is attached: a hung process or machine, one cut off from its node) for longer than
    /// `limit` at `now_ms`. Counted from when it went, but never from before this term's
    /// first look at it, nor before the end of its boot time once placed: a standby booting
    /// beside a new node is absent from the node's first report on, and is not judged on it.
    pub fn standby_absent(&mut self, queue: &Queue, now_ms: u64, limit: Duration) -> bool {
        let Some(absent_since) = queue.standby_absent_since_ms else {
            // One stays: replacements start again from the first.
            self.standbys_replaced.remove(&queue.id);
            return false;
        };
        let watched = *self
            .standbys
            .entry(queue.id.clone())
            .or_insert_with(|| Watched::from(now_ms, Duration::ZERO));
        let from = absent_since.max(watched.boot_until_ms);
        now_ms.saturating_sub(from) > limit.as_millis() as u64
    }

    /// Gives queue `queue_id`'s silent node, whose machine its cloud is bringing back (a
    /// reboot, a recovery onto another host), `boot` more from `now_ms` to be heard, instead
    /// of replacing it now; `false` when it had that already since it was placed.
    pub fn grant_recovery(&mut self, queue_id: &str, now_ms: u64, boot: Duration) -> bool {
        let watched = self
            .watched
            .entry(queue_id.to_string())
            .or_insert_with(|| Watched::from(now_ms, boot));
        if watched.recovery_granted {
            return false;
        }
        *watched = Watched {
            recovery_granted: true,
            ..Watched::from(now_ms, boot)
        };
        true
    }
}

impl Watched {
    fn from(now_ms: u64, boot: Duration) -> Watched {
        Watched {
            since_ms: now_ms,
            boot_until_ms: now_ms + boot.as_millis() as u64,
            recovery_granted: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(id: &str, status: Status, placed: bool) -> Queue {
        let mut queue = crate::model::queue::a_queue(id, status);
        queue.node = placed.then(|| "ws://127.0.0.1:1/".to_string());
        queue
    }

    const LIMIT: Duration = Duration::from_secs(60);
    const BOOT: Duration = Duration::from_secs(300);

    #[test]
    fn a_node_unheard_past_the_limit_is_silent_and_only_then() {
        let queues = [
            queue("heard", Status::Running, true),
            queue("quiet", Status::Running, true),
            queue("unplaced", Status::Provisioning, false),
            queue("deleting", Status::Deleting, true),
        ];
        let mut watch = Watch::default();
        let start = 1_000_000;
        // A new term judges nobody on what came before it.
        let nothing = HashMap::new();
        assert!(watch
            .silent(&queues, &nothing, start, LIMIT, BOOT)
            .is_empty());
        let heard = HashMap::from([("heard".to_string(), start + 50_000)]);
        let at_limit = start + 60_000;
        assert!(watch
            .silent(&queues, &heard, at_limit, LIMIT, BOOT)
            .is_empty());
        let past = start + 60_001;
        assert_eq!(watch.silent(&queues, &heard, past, LIMIT, BOOT), ["quiet"]);
    }

    #[test]
    fn a_node_placed_anew_has_its_boot_time_until_it_is_first_heard() {
        let queues = [queue("q", Status::Running, true)];
        let mut watch = Watch::default();
        // Heard last before it was placed: the old node, not this one.
        watch.placed("q", 1_000, BOOT);
        let before = HashMap::from([("q".to_string(), 0)]);
        assert!(watch
            .silent(&queues, &before, 361_000, LIMIT, BOOT)
            .is_empty());
        assert_eq!(watch.silent(&queues, &before, 361_001, LIMIT, BOOT), ["q"]);
        // Heard at 10 s: it has booted, and its silence counts from then.
        watch.placed("q", 1_000, BOOT);
        let booted = HashMap::from([("q".to_string(), 10_000)]);
        assert!(watch
            .silent(&queues, &booted, 70_000, LIMIT, BOOT)
            .is_empty());
        assert_eq!(watch.silent(&queues, &booted, 70_001, LIMIT, BOOT), ["q"]);
    }

    #[test]
    fn a_node_that_never_reported_is_given_its_boot_time() {
        let queues = [queue("booting", Status::Provisioning, true)];
        let mut watch = Watch::default();
        let nothing = HashMap::new();
        assert!(watch.silent(&queues, &nothing, 0, LIMIT, BOOT).is_empty());
        assert!(watch
            .silent(&queues, &nothing, 360_000, LIMIT, BOOT)
            .is_empty());
        assert_eq!(
            watch.silent(&queues, &nothing, 360_001, LIMIT, BOOT),
            ["booting"]
        );
    }

    #[test]
    fn a_queue_no_longer_listed_is_forgotten() {
        let mut watch = Watch::default();
        let queues = [queue("a", Status::Running, true)];
        watch.silent(&queues, &HashMap::new(), 5, LIMIT, BOOT);
        assert!(watch.watched.contains_key("a"));
        watch.silent(&[], &HashMap::new(), 6, LIMIT, BOOT);
        assert!(!watch.watched.contains_key("a"));
    }

    #[test]
    fn a_machine_being_brought_back_is_given_one_boot_time_more_per_placement() {
        let queues = [queue("q", Status::Running, true)];
        let mut watch = Watch::default();
        let nothing = HashMap::new();
        watch.silent(&queues, &nothing, 0, LIMIT, BOOT);
        assert_eq!(watch.silent(&queues, &nothing, 60_001, LIMIT, BOOT), ["q"]);
        assert!(watch.grant_recovery("q", 60_001, BOOT));
        // Not silent again before the boot time and the limit have passed once more.
        assert!(watch
            .silent(&queues, &nothing, 60_001 + 360_000, LIMIT, BOOT)
            .is_empty());
        assert_eq!(
            watch.silent(&queues, &nothing, 60_002 + 360_000, LIMIT, BOOT),
            ["q"]
        );
        // A machine that never comes back is replaced all the same.
        assert!(!watch.grant_recovery("q", 420_002, BOOT));
        // Its replacement, placed anew, may be given one again.
        watch.placed("q", 500_000, BOOT);
        assert!(watch.grant_recovery("q", 900_000, BOOT));
    }

    #[test]
    fn a_standby_absent_past_the_limit_is_judged_from_its_boot_and_this_term() {
        let mut q = queue("q", Status::Running, true);
        let mut watch = Watch::default();
        // Its node says one is attached: never absent.
        assert!(!watch.standby_absent(&q, 10_000_000, LIMIT));
        // Absent since long before this term's first look: counted from that look.
        q.standby_absent_since_ms = Some(1_000);
        assert!(!watch.standby_absent(&q, 10_000_000, LIMIT));
        assert!(!watch.standby_absent(&q, 10_060_000, LIMIT));
        assert!(watch.standby_absent(&q, 10_060_001, LIMIT));
        // Placed anew at 20 000 000: given its boot time, though its node has said it is
        // absent since before.
        watch.standby_placed("q", 20_000_000, BOOT);
        assert!(!watch.standby_absent(&q, 20_360_000, LIMIT));
        assert!(watch.standby_absent(&q, 20_360_001, LIMIT));
        // Absent again after its boot (it reached its node, then went): from when it went.
        q.standby_absent_since_ms = Some(21_000_000);
        assert!(!watch.standby_absent(&q, 21_060_000, LIMIT));
        assert!(watch.standby_absent(&q, 21_060_001, LIMIT));
        // Its node placed anew gives the standby the boot time too.
        watch.placed("q", 22_000_000, BOOT);
        assert!(!watch.standby_absent(&q, 22_360_000, LIMIT));
        // A queue no longer listed is forgotten, its standby too.
        watch.silent(&[], &HashMap::new(), 22_360_000, LIMIT, BOOT);
        assert!(watch.standbys.is_empty());
    }

    /// A standby replaced again and again without ever staying (its copy refused for good)
    /// is given its boot time, then the limit more, then three times, seven times… the limit
    /// more, at most an hour; once one stays, the next replacement is the first again.
    #[test]
    fn a_standby_replaced_again_and_again_is_judged_ever_later() {
        let mut q = queue("q", Status::Running, true);
        let mut watch = Watch::default();
        q.standby_absent_since_ms = Some(1_000);
        let mut now = 1_000_000;
        let mut judged_after = Vec::new();
        for in_a_row in 1..=8 {
            assert_eq!(watch.standby_replaced("q", now, BOOT, LIMIT), in_a_row);
            let from = now;
            while !watch.standby_absent(&q, now, LIMIT) {
                now += 1_000;
            }
            judged_after.push((now - from) / 1_000);
        }
        // Boot 300 s, limit 60 s: 360 s, then 60, 180, 420, 900, 1860 s more, capped at 3600.
        assert_eq!(judged_after, [361, 421, 541, 781, 1261, 2221, 3961, 3961]);
        // One stays: its node reports it attached. The next replacement is the first again.
        q.standby_absent_since_ms = None;
        assert!(!watch.standby_absent(&q, now, LIMIT));
        assert_eq!(watch.standby_replaced("q", now, BOOT, LIMIT), 1);
        q.standby_absent_since_ms = Some(now);
        assert!(!watch.standby_absent(&q, now + 360_000, LIMIT));
        assert!(watch.standby_absent(&q, now + 360_001, LIMIT));
    }

    #[test]
    fn zero_intervals_never_replaces() {
        assert_eq!(silent_after(0, 10), None);
        assert_eq!(silent_after(6, 10), Some(Duration::from_secs(60)));
    }
}
