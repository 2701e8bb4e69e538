//! The node's stats and usage records, made on time: at multiples of the queue's frequency
//! settings, pruned by its retention settings, and a last, partial usage record when the
//! node stops. The records themselves are kept by [`crate::history`].

use crate::history::{next_multiple, FlowMeter, RecordEvery, UsageMeter};
use crate::state::Node;
use qe_shared::files::on_disk;
use qe_shared::settings::Setting;
use std::sync::Arc;
use std::time::Duration;

/// Records stats and usage at multiples of their frequencies (read anew each time, so a
/// `setcfg` applies from the next record) and prunes by retention. When `stopping` turns true
/// it makes a last, partial usage record (the period so far) and returns. `every` (dev and
/// tests only) replaces the frequency settings.
pub async fn run(
    node: Arc<Node>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    every: RecordEvery,
) {
    let now = || crate::engine::now_ms() / 1000;
    let mut meter = UsageMeter::new(node.totals());
    let mut flow = FlowMeter::new(node.queue.snapshot().totals);
    loop {
        let stats_every = every
            .stats_secs
            .unwrap_or_else(|| node.setting(Setting::StatsFrequencySecs));
        let usage_every_secs = every.usage_secs;
        let usage_every =
            usage_every_secs.unwrap_or_else(|| node.setting(Setting::UsageFrequencySecs));
        let start = now();
        let (next_stats, next_usage) = (
            next_multiple(start, stats_every),
            next_multiple(start, usage_every),
        );
        let next = next_stats.min(next_usage);
        let history = &node.history;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(next - start)) => {}
            _ = stopping.wait_for(|stopping| *stopping) => {
                let usage = meter.take(node.totals(), node.storage_held());
                let recorded = on_disk(|| {
                    history.record_usage(now(), &usage, &node.usage_labels)
                });
                if let Err(error) = recorded {
                    tracing::error!(%error, "recording the last usage failed");
                }
                return;
            }
        }
        meter.sample_held(node.storage_held());
        if next == next_stats {
            let (counters, flow) = (
                node.live_stats_csv(),
                flow.take(node.queue.snapshot().totals),
            );
            // A sync blocks: the other tasks move to another worker meanwhile.
            let recorded = on_disk(|| history.record_stats(next, &counters, flow));
            if let Err(error) = recorded {
                tracing::error!(%error, "recording stats failed");
            }
        }
        if next == next_usage {
            let usage = meter.take(node.totals(), node.storage_held());
            let recorded = on_disk(|| history.record_usage(next, &usage, &node.usage_labels));
            if let Err(error) = recorded {
                tracing::error!(%error, "recording usage failed");
            }
        }
        let (stats_years, usage_years) = (
            node.setting(Setting::StatsRetentionPeriodYrs),
            node.setting(Setting::UsageRetentionPeriodYrs),
        );
        if let Err(error) = history.prune(next, stats_years, usage_years) {
            tracing::error!(%error, "pruning the history failed");
        }
    }
}
