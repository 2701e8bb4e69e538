//! Rolling node upgrades: a published build (`builds.rs`) taken across the fleet in waves,
//! a canary first. The leading replica drives each [`Rollout`] ([`run`]):
//!
//! 1. each queue of the current wave is told the build in its desired config; its node
//!    fetches it, checks it, and restarts into it, its data kept (`dataplane/src/upgrade.rs`);
//! 2. a queue is upgraded once its node confirms a config with the new build running; the
//!    wave is done when all its queues are, and the next starts after `pause_secs`;
//! 3. the roll **halts** at the first queue whose node refuses the build (it did not stay
//!    up, or its file did not check out: the node went back to the build it ran) or does not
//!    come back on it within `wave_timeout_secs`. Nothing more is touched until the operator
//!    resumes it or rolls it back: every queue it reached is told the build it ran before.
//!
//! Waves: the canary (one queue, the operator's choice or the first), then 2, 4, 8, … queues.
//! A queue made once a rollout is done starts from the installed build and is told the
//! rolled-out one at once.

use crate::model::queue::{Queue, Status};
pub use crate::model::rollout::{QueueStep, Rollout, State, Step};
use crate::store::{Store, StoreError};
use qe_shared::clock::now_ms;
use qe_shared::node_channel::DesiredBuild;
use std::collections::BTreeMap;
use std::time::Duration;

/// How often the leader looks at a rollout that is rolling.
const TICK: Duration = Duration::from_secs(1);
/// Defaults of a rollout's pacing.
pub const PAUSE_SECS: u64 = 60;
pub const WAVE_TIMEOUT_SECS: u64 = 300;
/// How many rollouts are kept (with the new one, one more).
const KEPT: usize = 20;

impl Rollout {
    /// Refused unless the rollout is `state`.
    fn must_be(&self, state: State) -> Result<(), RolloutError> {
        match self.state == state {
            true => Ok(()),
            false => Err(RolloutError::Refused(format!(
                "rollout {} is {:?}, not {state:?}",
                self.id, self.state
            ))),
        }
    }
}

/// Waves of `ids` (the canary first): 1, 2, 4, 8, … queues.
fn waves(ids: Vec<String>) -> Vec<Vec<String>> {
    let mut waves = Vec::new();
    let mut rest = ids.into_iter().peekable();
    let mut size = 1;
    while rest.peek().is_some() {
        waves.push(rest.by_ref().take(size).collect());
        size *= 2;
    }
    waves
}

/// What an operator asks for.
pub struct Plan {
    pub build: DesiredBuild,
    pub canary: Option<String>,
    pub pause_secs: u64,
    pub wave_timeout_secs: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("{0}")]
    Refused(String),
    #[error("rollout {0} is {1:?}: halt or roll it back first")]
    Busy(String, State),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A new rollout of `plan` over every running queue whose node runs another build.
pub async fn start(
    store: &Store,
    builds: &crate::builds::Builds,
    plan: Plan,
) -> Result<Rollout, RolloutError> {
    let rollouts = store.rollouts().await?;
    if let Some(busy) = rollouts
        .iter()
        .find(|rollout| matches!(rollout.state, State::Rolling | State::Halted))
    {
        return Err(RolloutError::Busy(busy.id.clone(), busy.state));
    }
    // Bounded: the last ones are history enough (each holds a step per queue).
    if let Some(oldest_kept) = rollouts.iter().rev().nth(KEPT - 1) {
        store.forget_rollouts_before(&oldest_kept.id).await?;
    }
    let target = &plan.build.binary_sha256;
    let running_build = |queue: &Queue| {
        queue
            .node_build
            .as_ref()
            .map(|build| build.binary_sha256.clone())
    };
    let (mut queues, left_out): (Vec<Queue>, Vec<Queue>) = store
        .list()
        .await?
        .into_iter()
        .filter(|queue| queue.status == Status::Running)
        .filter(|queue| running_build(queue).as_ref() != Some(target))
        .partition(|queue| queue.node_accepts_builds);
    let left_out: Vec<String> = left_out.into_iter().map(|queue| queue.id).collect();
    queues.sort_by(|a, b| a.id.cmp(&b.id));
    if let Some(canary) = &plan.canary {
        let Some(at) = queues.iter().position(|queue| &queue.id == canary) else {
            return Err(RolloutError::Refused(format!(
                "the canary {canary} is not a running queue on another build"
            )));
        };
        let canary = queues.remove(at);
        queues.insert(0, canary);
    }
    if queues.is_empty() {
        let reason = match left_out.is_empty() {
            true => "every running queue runs this build already".to_string(),
            false => format!(
                "no running queue on another build takes a build over its channel (their nodes \
                 are from before rolling upgrades: replace their instances): {}",
                left_out.join(", ")
            ),
        };
        return Err(RolloutError::Refused(reason));
    }
    let mut steps = BTreeMap::new();
    for queue in &queues {
        let from = running_build(queue);
        let from_build = match &from {
            Some(sha256) => builds.desired(store, sha256).await?,
            None => None,
        };
        let step = QueueStep {
            step: Step::Waiting,
            from,
            from_build,
            told_ms: None,
            upgraded_ms: None,
        };
        steps.insert(queue.id.clone(), step);
    }
    let now_ms = now_ms();
    let rollout = Rollout {
        id: format!("r{now_ms:013}"),
        build: plan.build,
        state: State::Rolling,
        reason: None,
        created: now_ms / 1000,
        pause_secs: plan.pause_secs,
        wave_timeout_secs: plan.wave_timeout_secs,
        waves: waves(queues.into_iter().map(|queue| queue.id).collect()),
        left_out,
        installed: builds.installed().await,
        wave: 0,
        wave_done_ms: None,
        queues: steps,
    };
    if !store.put_rollout(&rollout).await? {
        return Err(RolloutError::Refused(
            "a rollout was started at the same moment".into(),
        ));
    }
    Ok(rollout)
}

/// Halts rollout `id` (the operator's word): nothing more is touched.
pub async fn halt(store: &Store, id: &str) -> Result<Option<Rollout>, RolloutError> {
    let halted = store.update_rollout(id, |rollout| {
        rollout.must_be(State::Rolling)?;
        rollout.state = State::Halted;
        rollout.reason = Some("halted by the operator".into());
        Ok::<_, RolloutError>(())
    });
    Ok(halted.await?.map(|(rollout, ())| rollout))
}

/// Rolls a halted rollout on: queues that timed out are waited for again from now.
pub async fn resume(store: &Store, id: &str) -> Result<Option<Rollout>, RolloutError> {
    let resumed = store.update_rollout(id, |rollout| {
        rollout.must_be(State::Halted)?;
        if let Some((queue, _)) = rollout.queues.iter().find(|(_, s)| s.step == Step::Refused) {
            return Err(RolloutError::Refused(format!(
                "queue {queue} refused the build: roll it back"
            )));
        }
        let now = now_ms();
        for step in rollout.queues.values_mut() {
            if step.step == Step::TimedOut {
                step.step = Step::Upgrading;
                step.told_ms = Some(now);
            }
        }
        rollout.state = State::Rolling;
        rollout.reason = None;
        Ok::<_, RolloutError>(())
    });
    Ok(resumed.await?.map(|(rollout, ())| rollout))
}

/// Rolls rollout `id` back. Its record says so first (the leader then tells no queue more of
/// it); then every queue told its build — in its waves, or made after it was done — is told
/// the build it ran before: the one its step recorded, else (a later queue) the fleet's
/// build without this rollout. Where that is not known here, none (its node runs on what it
/// runs). Returns the rollout and the queues left on what they run.
pub async fn roll_back(
    store: &Store,
    id: &str,
) -> Result<Option<(Rollout, Vec<String>)>, RolloutError> {
    let told = [
        Step::Upgrading,
        Step::Upgraded,
        Step::Refused,
        Step::TimedOut,
    ];
    let rolled_back = store.update_rollout(id, |rollout| {
        if rollout.state == State::RolledBack {
            return Err(RolloutError::Refused(format!(
                "rollout {id} is rolled back already"
            )));
        }
        rollout.state = State::RolledBack;
        for step in rollout.queues.values_mut() {
            if told.contains(&step.step) {
                step.step = Step::RolledBack;
            }
        }
        Ok(())
    });
    let Some((rollout, ())) = rolled_back.await? else {
        return Ok(None);
    };
    let unknown = tell_what_ran_before(store, &rollout, None).await?;
    Ok(Some((rollout, unknown)))
}

/// Tells every queue whose desired build is `rollout`'s (of `only`, if given) the one it ran
/// before it; the queues for which that is not known.
async fn tell_what_ran_before(
    store: &Store,
    rollout: &Rollout,
    only: Option<&[String]>,
) -> Result<Vec<String>, StoreError> {
    let target = &rollout.build.binary_sha256;
    let fleet_before = fleet_build(store)
        .await?
        .or_else(|| rollout.installed.clone());
    let mut unknown = Vec::new();
    for queue in store.list().await? {
        let told = queue.desired_build.as_ref().map(|b| &b.binary_sha256);
        let chosen = only.is_none_or(|only| only.contains(&queue.id));
        if told != Some(target) || !chosen {
            continue;
        }
        let before = match rollout.queues.get(&queue.id) {
            Some(step) => step.from_build.clone(),
            None => fleet_before.clone(),
        };
        if before.is_none() {
            unknown.push(queue.id.clone());
        }
        tell(store, &queue.id, Some(target), before.as_ref()).await?;
    }
    Ok(unknown)
}

/// Tells queue `id` to run `build` (None: whatever it runs), in a new config version; only
/// while it is told `instead_of` when that is given (a rollback undoes only its own rollout).
async fn tell(
    store: &Store,
    id: &str,
    instead_of: Option<&str>,
    build: Option<&DesiredBuild>,
) -> Result<(), StoreError> {
    let told = store.update(id, |queue| {
        let now = queue
            .desired_build
            .as_ref()
            .map(|b| b.binary_sha256.as_str());
        if instead_of.is_none() || now == instead_of {
            queue.desired_build = build.cloned();
            queue.config_version += 1;
        }
        Ok::<_, StoreError>(())
    });
    told.await?;
    Ok(())
}

/// The build the fleet was last rolled to: what a new queue is told (None: the installed
/// one). A rollout rolled back took the fleet back to where it was before it, so it does not
/// count: the newest one done and not rolled back does.
pub async fn fleet_build(store: &Store) -> Result<Option<DesiredBuild>, StoreError> {
    let rollouts = store.rollouts().await?;
    let last_done = rollouts
        .into_iter()
        .rev()
        .find(|rollout| rollout.state == State::Done);
    Ok(last_done.map(|rollout| rollout.build))
}

/// Drives rollouts while this replica leads.
pub async fn run(store: Store, leadership: crate::leadership::Leadership) {
    leadership.while_leading(store, roll_while_leading).await
}

async fn roll_while_leading(store: Store) {
    loop {
        if let Err(error) = tick(&store).await {
            tracing::warn!(%error, "rolling a build: tried again");
        }
        tokio::time::sleep(TICK).await;
    }
}

/// One look at the rolling rollout, if there is one.
async fn tick(store: &Store) -> Result<(), StoreError> {
    let newest = store.newest_rollout().await?;
    let Some(rolling) = newest.filter(|r| r.state == State::Rolling) else {
        return Ok(());
    };
    let queues: BTreeMap<String, Queue> = store
        .list()
        .await?
        .into_iter()
        .map(|queue| (queue.id.clone(), queue))
        .collect();
    let now = now_ms();
    let mut next = rolling.clone();
    advance(&mut next, &queues, now);
    if next == rolling {
        return Ok(());
    }
    // Kept first, and only while it still rolls as read: a halt or rollback meanwhile
    // stands, and then no queue is told (a queue told before its step is kept would be
    // missed by a rollback).
    let id = next.id.clone();
    let kept = store
        .update_rollout(&id, |stored| {
            let still = *stored == rolling;
            if still {
                *stored = next.clone();
            }
            Ok::<_, StoreError>(still)
        })
        .await?;
    if !matches!(kept, Some((_, true))) {
        return Ok(());
    }
    if let Some(reason) = &next.reason {
        tracing::error!(rollout = %next.id, %reason, "a rollout halted");
    }
    if next.state == State::Done {
        tracing::info!(rollout = %next.id, "a rollout is done");
    }
    let mut told = Vec::new();
    for (queue_id, step) in &next.queues {
        let was = rolling.queues.get(queue_id).map(|s| s.step);
        if step.step == Step::Upgrading && was == Some(Step::Waiting) {
            told.push(queue_id.clone());
            tell(store, queue_id, None, Some(&next.build)).await?;
            tracing::info!(queue = %queue_id, build = %next.build.binary_sha256, "told a node to run a new build");
        }
    }
    // Rolled back while these were being told (after the rollback looked at them): undone.
    let rolled_back = store.rollout(&id).await?;
    if let Some(rolled_back) = rolled_back.filter(|r| r.state == State::RolledBack) {
        if !told.is_empty() {
            tell_what_ran_before(store, &rolled_back, Some(&told)).await?;
        }
    }
    Ok(())
}

/// `rollout` one step on, given the queues as they are at `now` (ms).
fn advance(rollout: &mut Rollout, queues: &BTreeMap<String, Queue>, now: u64) {
    let target = rollout.build.binary_sha256.clone();
    let timeout = rollout.wave_timeout_secs * 1000;
    let mut halt = None;
    for (id, step) in rollout.queues.iter_mut() {
        let queue = queues
            .get(id)
            .filter(|queue| queue.status == Status::Running);
        let Some(queue) = queue else {
            if matches!(step.step, Step::Waiting | Step::Upgrading) {
                step.step = Step::Skipped;
            }
            continue;
        };
        let refused = queue
            .refused_build
            .as_ref()
            .filter(|refused| refused.binary_sha256 == target);
        if let (Some(refused), Step::Upgrading | Step::Upgraded) = (refused, step.step) {
            step.step = Step::Refused;
            halt.get_or_insert(format!("queue {id} refused the build: {}", refused.reason));
            continue;
        }
        let running = queue.node_build.as_ref().map(|b| &b.binary_sha256);
        let confirmed = queue.applied_version >= queue.config_version;
        if step.step == Step::Upgrading {
            if running == Some(&target) && confirmed {
                step.step = Step::Upgraded;
                step.upgraded_ms = Some(now);
            } else if now.saturating_sub(step.told_ms.unwrap_or(now)) > timeout {
                step.step = Step::TimedOut;
                halt.get_or_insert(format!(
                    "queue {id} did not come back on the build within {} s",
                    rollout.wave_timeout_secs
                ));
            }
        }
    }
    if let Some(reason) = halt {
        rollout.state = State::Halted;
        rollout.reason = Some(reason);
        return;
    }
    let Some(wave) = rollout.waves.get(rollout.wave).cloned() else {
        rollout.state = State::Done;
        return;
    };
    let mut all_back = true;
    for id in &wave {
        let step = rollout
            .queues
            .get_mut(id)
            .expect("every wave's queue has a step");
        match step.step {
            Step::Waiting => {
                step.step = Step::Upgrading;
                step.told_ms = Some(now);
                all_back = false;
            }
            Step::Upgrading => all_back = false,
            _ => {}
        }
    }
    if !all_back {
        return;
    }
    let done_at = *rollout.wave_done_ms.get_or_insert(now);
    if now.saturating_sub(done_at) >= rollout.pause_secs * 1000 {
        rollout.wave += 1;
        rollout.wave_done_ms = None;
        if rollout.wave == rollout.waves.len() {
            rollout.state = State::Done;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qe_shared::node_channel::{NodeBuild, RefusedBuild};

    const NEW: &str = "new";

    fn queue(id: &str, runs: &str) -> Queue {
        let mut queue = crate::model::queue::a_queue(id, Status::Running);
        queue.node_build = Some(NodeBuild {
            version: "0".into(),
            binary_sha256: runs.into(),
        });
        queue.applied_version = queue.config_version;
        queue
    }

    fn rollout(ids: &[&str]) -> Rollout {
        let step = QueueStep {
            step: Step::Waiting,
            from: Some("old".into()),
            from_build: None,
            told_ms: None,
            upgraded_ms: None,
        };
        Rollout {
            id: "r1".into(),
            build: DesiredBuild {
                binary_sha256: NEW.into(),
                size: 1,
            },
            state: State::Rolling,
            reason: None,
            created: 0,
            pause_secs: 10,
            wave_timeout_secs: 60,
            waves: waves(ids.iter().map(|id| id.to_string()).collect()),
            left_out: Vec::new(),
            installed: None,
            wave: 0,
            wave_done_ms: None,
            queues: ids
                .iter()
                .map(|id| (id.to_string(), step.clone()))
                .collect(),
        }
    }

    fn fleet(queues: &[Queue]) -> BTreeMap<String, Queue> {
        queues.iter().map(|q| (q.id.clone(), q.clone())).collect()
    }

    #[test]
    fn a_wave_waits_for_its_queues_then_the_pause_then_the_next_wave_starts() {
        let mut rolling = rollout(&["a", "b", "c"]);
        let mut queues = vec![queue("a", "old"), queue("b", "old"), queue("c", "old")];
        advance(&mut rolling, &fleet(&queues), 1_000);
        assert_eq!(rolling.queues["a"].step, Step::Upgrading);
        assert_eq!(
            rolling.queues["b"].step,
            Step::Waiting,
            "the canary goes alone"
        );
        // Back on the new build, but its node has not confirmed the config naming it yet.
        queues[0].node_build.as_mut().unwrap().binary_sha256 = NEW.into();
        queues[0].config_version += 1;
        advance(&mut rolling, &fleet(&queues), 2_000);
        assert_eq!(rolling.queues["a"].step, Step::Upgrading);
        queues[0].applied_version = queues[0].config_version;
        advance(&mut rolling, &fleet(&queues), 3_000);
        assert_eq!(rolling.queues["a"].step, Step::Upgraded);
        assert_eq!((rolling.wave, rolling.wave_done_ms), (0, Some(3_000)));
        advance(&mut rolling, &fleet(&queues), 12_999);
        assert_eq!(rolling.wave, 0, "the pause is 10 s");
        advance(&mut rolling, &fleet(&queues), 13_000);
        assert_eq!(rolling.wave, 1);
        advance(&mut rolling, &fleet(&queues), 13_001);
        assert_eq!(rolling.queues["b"].step, Step::Upgrading);
        assert_eq!(rolling.queues["c"].step, Step::Upgrading);
        for queue in &mut queues[1..] {
            queue.node_build.as_mut().unwrap().binary_sha256 = NEW.into();
        }
        advance(&mut rolling, &fleet(&queues), 14_000);
        advance(&mut rolling, &fleet(&queues), 24_000);
        assert_eq!(rolling.state, State::Done);
    }

    #[test]
    fn a_refusal_or_a_queue_not_back_in_time_halts_the_roll() {
        let mut rolling = rollout(&["a", "b"]);
        let mut queues = vec![queue("a", "old"), queue("b", "old")];
        advance(&mut rolling, &fleet(&queues), 0);
        queues[0].refused_build = Some(RefusedBuild {
            binary_sha256: NEW.into(),
            reason: "it did not stay up".into(),
        });
        advance(&mut rolling, &fleet(&queues), 1_000);
        assert_eq!(rolling.state, State::Halted);
        assert_eq!(rolling.queues["a"].step, Step::Refused);
        assert_eq!(
            rolling.queues["b"].step,
            Step::Waiting,
            "nothing more touched"
        );
        assert!(rolling
            .reason
            .as_deref()
            .unwrap()
            .contains("did not stay up"));

        let mut rolling = rollout(&["a", "b"]);
        let queues = vec![queue("a", "old"), queue("b", "old")];
        advance(&mut rolling, &fleet(&queues), 0);
        advance(&mut rolling, &fleet(&queues), 60_000);
        assert_eq!(rolling.state, State::Rolling, "60 s is within the timeout");
        advance(&mut rolling, &fleet(&queues), 60_001);
        assert_eq!(rolling.state, State::Halted);
        assert_eq!(rolling.queues["a"].step, Step::TimedOut);
    }

    #[test]
    fn a_queue_deleted_meanwhile_is_skipped() {
        let mut rolling = rollout(&["a"]);
        advance(&mut rolling, &BTreeMap::new(), 0);
        assert_eq!(rolling.queues["a"].step, Step::Skipped);
        advance(&mut rolling, &BTreeMap::new(), 1);
        advance(&mut rolling, &BTreeMap::new(), 20_000);
        assert_eq!(rolling.state, State::Done);
    }

    #[test]
    fn waves_are_a_canary_then_doubling() {
        let ids: Vec<String> = (0..10).map(|n| format!("q{n}")).collect();
        let sizes: Vec<usize> = waves(ids).iter().map(Vec::len).collect();
        assert_eq!(sizes, [1, 2, 4, 3]);
        assert!(waves(Vec::new()).is_empty());
    }
}
