//! The faults, in order, each a window of the run: what is done, what is waited for, and
//! the notes that say what happened (who led, how soon another did, when a process served
//! again).

use super::api::Operator;
use super::clients::{self, lock, Board, Clients};
use super::etcd::EtcdCluster;
use super::replicas::Replicas;
use super::report::{Fault, Window};
use super::Settings;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The target: a silenced node serves again within this of the silence limit.
const SERVING_AGAIN_PAST_LIMIT: Duration = Duration::from_secs(60);

/// How long past the target the run waits for a stopped node's queue before it gives up
/// (and sends SIGCONT, so the run goes on).
const STOPPED_WAIT_PAST_TARGET: Duration = Duration::from_secs(60);

/// How long the clients have to make their first publish and delivery.
const WARM_UP_WITHIN: Duration = Duration::from_secs(30);

/// How long a new leader (of the replicas, or of etcd) is waited for.
const LEADER_WITHIN: Duration = Duration::from_secs(60);

/// The drain ends once every acknowledged message was delivered and nothing came for this
/// long, or after [`DRAIN_AT_MOST`].
const DRAIN_QUIET: Duration = Duration::from_secs(3);
const DRAIN_AT_MOST: Duration = Duration::from_secs(60);

/// How often the run looks at what the clients or the logs say.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// The run once everything is up: the faults, one window each.
pub struct Chaos<'a> {
    pub settings: &'a Settings,
    /// When the clients started: the first window's start.
    pub loaded: Instant,
    pub etcd: EtcdCluster,
    pub replicas: Replicas,
    pub operator: Operator,
    pub board: Arc<Board>,
    pub ids: Vec<String>,
    pub windows: Vec<Window>,
}

impl Chaos<'_> {
    /// The clients' first publishes and deliveries, then the baseline's load with no fault.
    pub async fn baseline(&mut self) {
        let mut notes = Vec::new();
        let warm = self
            .wait_for(WARM_UP_WITHIN, |board| {
                board.queues.iter().all(|queue| {
                    !lock(&queue.published).acks.is_empty()
                        && !lock(&queue.received).deliveries.is_empty()
                })
            })
            .await;
        match warm {
            Some(after) => notes.push(format!(
                "every queue published and delivered within {:.1} s",
                after.as_secs_f64()
            )),
            None => notes.push(format!(
                "not every queue published and delivered within {WARM_UP_WITHIN:?}"
            )),
        }
        sleep_secs(self.settings.baseline_secs).await;
        self.close("baseline (no fault)", Fault::None, notes);
    }

    /// (a) SIGKILL to the leading replica; started again after `down_secs`.
    pub async fn kill_leader(&mut self) {
        let Some(leader) = self.wait_replica_leader(None).await else {
            return self.skip("a. control-plane leader SIGKILLed", "no replica leads");
        };
        let start = Instant::now();
        let pid = self.replicas.kill(leader);
        self.board.set_apis(self.replicas.running());
        let mut notes = vec![format!("r{leader} (pid {pid}) led and was SIGKILLed")];
        match self.wait_replica_leader(Some(leader)).await {
            Some(next) => notes.push(format!(
                "r{next} led {:.1} s later",
                start.elapsed().as_secs_f64()
            )),
            None => notes.push(format!("no other replica led within {LEADER_WITHIN:?}")),
        }
        sleep_until(start + Duration::from_secs(self.settings.down_secs)).await;
        self.replicas.start_one(leader);
        self.board.set_apis(self.replicas.running());
        notes.push(format!(
            "r{leader} serving again {:.1} s after the kill (same config and address)",
            start.elapsed().as_secs_f64()
        ));
        sleep_secs(self.settings.settle_secs).await;
        self.close(
            "a. control-plane leader SIGKILLed",
            Fault::LeaderKilled,
            notes,
        );
    }

    /// (b) SIGKILL to the etcd member that leads; started again after `down_secs`.
    pub async fn kill_etcd_leader(&mut self) {
        let name = "b. etcd leader SIGKILLed";
        let Some(leader) = self.wait_etcd_leader(None).await else {
            return self.skip(name, "no etcd member leads");
        };
        let start = Instant::now();
        self.etcd.kill(leader);
        let member = self.etcd.name(leader).to_string();
        let mut notes = vec![format!("{member} led and was SIGKILLed")];
        match self.wait_etcd_leader(Some(leader)).await {
            Some(next) => notes.push(format!(
                "{} led {:.1} s later",
                self.etcd.name(next),
                start.elapsed().as_secs_f64()
            )),
            None => notes.push(format!("no other member led within {LEADER_WITHIN:?}")),
        }
        sleep_until(start + Duration::from_secs(self.settings.down_secs)).await;
        self.etcd.restart(leader);
        notes.push(format!(
            "{member} healthy again {:.1} s after the kill",
            start.elapsed().as_secs_f64()
        ));
        sleep_secs(self.settings.settle_secs).await;
        self.close(name, Fault::EtcdLeaderKilled, notes);
    }

    /// (c) SIGSTOP to the last queue's node, until its publisher has a publish acknowledged
    /// on a new connection (the node replaced, or started again).
    pub async fn stop_node(&mut self) {
        let q = self.ids.len() - 1;
        let name = format!("c. node SIGSTOPped (q{q})");
        let id = self.ids[q].clone();
        let Some(pid) = self.node_pid(&id).await else {
            return self.skip(&name, "its node's pid could not be read");
        };
        let limit = self.settings.silence_limit();
        let target = limit + SERVING_AGAIN_PAST_LIMIT;
        sleep_secs(self.settings.stop_delay_secs).await;
        let start = Instant::now();
        signal(pid, libc::SIGSTOP);
        let mut notes = vec![format!(
            "q{q}'s node (pid {pid}) SIGSTOPped at {} UTC; silence limit {} s, target {} s",
            utc_time_of_day(std::time::SystemTime::now()),
            limit.as_secs(),
            target.as_secs()
        )];
        let serving = self
            .wait_for(target + STOPPED_WAIT_PAST_TARGET, |board| {
                let published = lock(&board.queues[q].published);
                published
                    .acks
                    .iter()
                    .any(|ack| ack.connection > start && ack.at > start)
            })
            .await;
        match serving {
            Some(after) => notes.push(format!(
                "q{q} took a publish on a new connection {:.1} s after the SIGSTOP",
                after.as_secs_f64()
            )),
            None => {
                signal(pid, libc::SIGCONT);
                notes.push(format!(
                    "q{q} did not serve again within {} s: SIGCONT sent",
                    start.elapsed().as_secs()
                ));
            }
        }
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| Some(stat.rsplit_once(") ")?.1.chars().next()?.to_string()));
        match state.as_deref() {
            None => notes.push(format!("the stopped node (pid {pid}) is gone")),
            Some("Z") => notes.push(format!("the stopped node (pid {pid}) was killed")),
            Some(state) => notes.push(format!(
                "the stopped node (pid {pid}) is still there (state {state})"
            )),
        }
        if let Some(now) = self.node_pid(&id).await {
            notes.push(format!("q{q}'s node is now pid {now}"));
        }
        for line in self.replicas.grep("its node is not heard from") {
            notes.push(line);
        }
        sleep_secs(self.settings.settle_secs).await;
        let fault = Fault::NodeStopped {
            serving_after: serving,
            target,
        };
        self.close(&name, fault, notes);
    }

    /// (d) SIGTERM to a replica that does not lead, started again once it has exited.
    pub async fn restart_replica(&mut self) {
        let name = "d. replica (not leading) restarted";
        let Some(leader) = self.wait_replica_leader(None).await else {
            return self.skip(name, "no replica leads");
        };
        let pick = (0..self.replicas.count())
            .find(|&i| i != leader)
            .expect("another replica");
        let start = Instant::now();
        let how = self.replicas.terminate(pick);
        self.board.set_apis(self.replicas.running());
        self.replicas.start_one(pick);
        self.board.set_apis(self.replicas.running());
        let notes = vec![format!(
            "r{pick} (r{leader} leads) {how}; serving again {:.0} ms after the SIGTERM",
            start.elapsed().as_secs_f64() * 1e3
        )];
        sleep_secs(self.settings.settle_secs).await;
        self.close(name, Fault::ReplicaRestarted, notes);
    }

    /// Stops publishing, lets the subscribers take what is left, then stops them.
    pub async fn drain(&mut self, clients: Clients) {
        let start = Instant::now();
        clients.stop_publishing();
        let all_stopped = |board: &Board| {
            board
                .queues
                .iter()
                .all(|queue| lock(&queue.published).stopped.is_some())
        };
        self.wait_for(clients::REPLY_WITHIN * 2, all_stopped).await;
        let drained = self
            .wait_for(DRAIN_AT_MOST, |board| {
                let quiet = board.queues.iter().all(|queue| {
                    let received = lock(&queue.received);
                    received
                        .deliveries
                        .last()
                        .is_none_or(|(at, _)| at.elapsed() >= DRAIN_QUIET)
                });
                quiet && board.queues.iter().all(every_ack_delivered)
            })
            .await;
        let note = match drained {
            Some(_) => format!(
                "every acknowledged message delivered, and quiet for {DRAIN_QUIET:?}, {:.1} s \
                 after publishing stopped",
                start.elapsed().as_secs_f64()
            ),
            None => format!("not every acknowledged message delivered within {DRAIN_AT_MOST:?}"),
        };
        clients.stop();
        self.close("drain (publishers stopped)", Fault::Drain, vec![note]);
    }

    /// Ends a window now: it began where the last one ended (the windows leave no time out).
    fn close(&mut self, name: &str, fault: Fault, notes: Vec<String>) {
        let start = self.windows.last().map_or(self.loaded, |last| last.end);
        let end = Instant::now();
        println!(
            "{name}: {:.1} s (at {:.0} s)",
            (end - start).as_secs_f64(),
            (end - self.loaded).as_secs_f64()
        );
        self.windows.push(Window {
            name: name.to_string(),
            fault,
            start,
            end,
            notes,
        });
    }

    /// A fault that could not be made: a window with why.
    fn skip(&mut self, name: &str, why: &str) {
        let note = format!("not done: {why}");
        self.close(name, Fault::None, vec![note]);
    }

    /// How long until `ready` holds of the clients' board, if it does within `within`.
    async fn wait_for(&self, within: Duration, ready: impl Fn(&Board) -> bool) -> Option<Duration> {
        let start = Instant::now();
        loop {
            if ready(&self.board) {
                return Some(start.elapsed());
            }
            if start.elapsed() > within {
                return None;
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// The replica that leads, other than `not`, once one does.
    async fn wait_replica_leader(&mut self, not: Option<usize>) -> Option<usize> {
        let start = Instant::now();
        while start.elapsed() < LEADER_WITHIN {
            match self.replicas.leader() {
                Some(leader) if Some(leader) != not => return Some(leader),
                _ => tokio::time::sleep(LOOK_EVERY).await,
            }
        }
        None
    }

    /// The etcd member that leads, other than `not`, once one does.
    async fn wait_etcd_leader(&mut self, not: Option<usize>) -> Option<usize> {
        let start = Instant::now();
        while start.elapsed() < LEADER_WITHIN {
            match self.etcd.leader() {
                Some(leader) if Some(leader) != not => return Some(leader),
                _ => tokio::time::sleep(LOOK_EVERY).await,
            }
        }
        None
    }

    /// The pid of queue `id`'s node, as the API says (`resources.process`).
    async fn node_pid(&self, id: &str) -> Option<u32> {
        for api in self.replicas.running() {
            if let Ok(queue) = self.operator.queue(api, id).await {
                return queue["resources"]["process"].as_str()?.parse().ok();
            }
        }
        None
    }
}

/// Whether every message `queue`'s publisher had acknowledged was delivered.
fn every_ack_delivered(queue: &clients::QueueLog) -> bool {
    let published = lock(&queue.published);
    let received = lock(&queue.received);
    let seen: std::collections::HashSet<u64> =
        received.deliveries.iter().map(|(_, seq)| *seq).collect();
    published.acks.iter().all(|ack| seen.contains(&ack.seq))
}

/// `HH:MM:SS.mmm` of `time`, in UTC (as the replicas' logs write it).
fn utc_time_of_day(time: std::time::SystemTime) -> String {
    let since = time
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        since.subsec_millis()
    )
}

fn signal(pid: u32, signal: libc::c_int) {
    crate::controlplane_load::process::signal(pid, signal);
}

async fn sleep_secs(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}
