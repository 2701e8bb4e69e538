//! A rollout of a node build across the fleet, wave by wave, as the store keeps it
//! ([`crate::rollout`] runs it).

use qe_shared::node_channel::DesiredBuild;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Rolling,
    Halted,
    Done,
    RolledBack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// In a wave not reached yet.
    Waiting,
    /// Told the build; its node has not come back on it yet.
    Upgrading,
    Upgraded,
    /// Its node refused the build (it runs the one from before).
    Refused,
    /// Not back on the build within the wave's time.
    TimedOut,
    /// Deleted meanwhile, or no longer running: left out.
    Skipped,
    /// Told the build it ran before.
    RolledBack,
}

/// One queue's part in a rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStep {
    pub step: Step,
    /// The build its node ran before (SHA-256), if it said.
    pub from: Option<String>,
    /// That build as its node is told of it (a rollback tells it), if this control plane
    /// knows it (installed or published).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_build: Option<DesiredBuild>,
    /// When it was told the build, and when its node came back on it (ms since 1970).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub told_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgraded_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    pub id: String,
    pub build: DesiredBuild,
    pub state: State,
    /// Why it halted (or was rolled back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Seconds since 1970.
    pub created: u64,
    pub pause_secs: u64,
    pub wave_timeout_secs: u64,
    /// Queue ids, wave by wave; the first is the canary.
    pub waves: Vec<Vec<String>>,
    /// Running queues on another build whose nodes take no build over their channel (built
    /// before rolling upgrades): not in any wave; their instances are replaced instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// The installed build when it started: what a queue made after it and rolled back is
    /// told when no earlier rollout is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed: Option<DesiredBuild>,
    /// The wave being rolled (`waves.len()` once done).
    pub wave: usize,
    /// When the current wave's last queue came back (ms): the pause runs from then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_done_ms: Option<u64>,
    pub queues: BTreeMap<String, QueueStep>,
}
