//! Limits that follow from the memory the process may use (cgroup-aware).
//!
//! The formula (documented in the README):
//! - usable memory = the smaller of the cgroup's `memory.max` and the machine's `MemTotal`;
//! - `max-messages-memory` = half of it;
//! - `max-messages` = min(1,000,000, `max-messages-memory` / 512);
//! - `max-tasks` = min(100,000, usable memory / 4 / 32 KiB, 4/5 of the descriptors the process
//!   may open less 256) on the standard tier, 100 on Dev/test. 32 KiB: an idle connection was
//!   measured at 10 KiB (ws) and 17.5 KiB (wss) of user memory (`bench connections`,
//!   docs/performance.md), plus the kernel's socket, rounded up for the buffers of one at
//!   work. The descriptors: one per connection, and the pre-login budget is a quarter of
//!   max-tasks; 256 are kept for the log, the settings store and the listeners.
//!
//! The operator's `--max-messages` and `--max-messages-memory` may lower these, never raise them.

use qe_shared::settings::{fixed, Tier};

/// Bytes assumed per stored message when turning memory into a message count.
const BYTES_PER_MESSAGE: u64 = 512;
/// Bytes assumed per open connection when turning memory into a connection count.
const BYTES_PER_CONNECTION: u64 = 32 << 10;
const MAX_TASKS_CEILING: u64 = 100_000;
/// Descriptors kept for what is not a connection.
const FD_RESERVE: u64 = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLimits {
    pub max_tasks: u64,
    pub max_messages: u64,
    pub max_messages_memory: u64,
}

impl NodeLimits {
    /// The limits for `memory` usable bytes and `descriptors` open files on `tier`, lowered
    /// by the operator's choices.
    pub fn derive(
        memory: u64,
        descriptors: u64,
        tier: Tier,
        max_messages: Option<u64>,
        max_messages_memory: Option<u64>,
    ) -> NodeLimits {
        let memory_limit = memory / 2;
        let message_limit = (memory_limit / BYTES_PER_MESSAGE).min(fixed::MAX_MESSAGES_CEILING);
        let by_descriptors = descriptors.saturating_sub(FD_RESERVE) * 4 / 5;
        let max_tasks = match tier {
            Tier::Devtest => fixed::DEVTEST_MAX_TASKS,
            Tier::Standard => (memory / 4 / BYTES_PER_CONNECTION)
                .min(by_descriptors)
                .clamp(1, MAX_TASKS_CEILING),
        };
        NodeLimits {
            max_tasks,
            max_messages: max_messages.map_or(message_limit, |n| n.min(message_limit)),
            max_messages_memory: max_messages_memory.map_or(memory_limit, |n| n.min(memory_limit)),
        }
    }
}

/// Raises the process's limit of open descriptors to the most it may have (the hard limit;
/// a connection is one), and returns it.
pub fn raise_descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// The memory this process may use: the cgroup's limit if it has one, else the machine's.
pub fn usable_memory() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_meminfo_total(&text))
        .unwrap_or(1 << 30);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    cgroup.map_or(total, |limit| limit.min(total))
}

fn parse_meminfo_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FDS: u64 = 1 << 20;

    #[test]
    fn limits_follow_memory_and_the_operator_may_only_lower_them() {
        let gib = 1u64 << 30;
        let standard = NodeLimits::derive(24 * gib, FDS, Tier::Standard, None, None);
        assert_eq!(standard.max_messages_memory, 12 * gib);
        assert_eq!(standard.max_messages, 1_000_000);
        assert_eq!(
            standard.max_tasks, 100_000,
            "6 GiB / 32 KiB is past the ceiling"
        );
        let one_gib = NodeLimits::derive(gib, FDS, Tier::Standard, None, None);
        assert_eq!(one_gib.max_tasks, 8_192);
        let small = NodeLimits::derive(gib / 4, FDS, Tier::Devtest, None, None);
        assert_eq!(small.max_tasks, 100);
        assert_eq!(small.max_messages, gib / 8 / 512);
        let lowered = NodeLimits::derive(gib, FDS, Tier::Standard, Some(10), Some(4096));
        assert_eq!(
            (lowered.max_messages, lowered.max_messages_memory),
            (10, 4096)
        );
        let raised = NodeLimits::derive(gib, FDS, Tier::Standard, Some(u64::MAX), Some(u64::MAX));
        assert_eq!(
            raised,
            NodeLimits::derive(gib, FDS, Tier::Standard, None, None)
        );
    }

    #[test]
    fn max_tasks_leaves_descriptors_for_the_pre_login_budget_and_the_files() {
        let gib = 1u64 << 30;
        let limits = NodeLimits::derive(24 * gib, 20_000, Tier::Standard, None, None);
        assert_eq!(limits.max_tasks, (20_000 - 256) * 4 / 5);
        let pre_login = limits.max_tasks / 4;
        assert!(limits.max_tasks + pre_login + 256 <= 20_000);
    }

    #[test]
    fn meminfo_total() {
        let text = "MemTotal:       24587724 kB\nMemFree:         1000 kB\n";
        assert_eq!(parse_meminfo_total(text), Some(24_587_724 * 1024));
    }
}
