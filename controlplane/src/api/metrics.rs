//! `/metrics` in Prometheus's text format: queues by status (read from the store when scraped),
//! the API's request latency by route and status (recorded by a middleware), and each live
//! queue's numbers as its node last reported them ([`crate::live`]), labelled `queue` and
//! `account` (`""` for a queue of no account). Only live queues have series, so the label
//! sets are bounded by them and a deleted queue's series are gone from the next scrape.
//! infra/prometheus/alerts.yml and infra/grafana/queue-expert.json read these names.

use super::{ApiError, AppState};
use crate::certificates::NodeCertificates;
use crate::live::{Latest, LiveNumbers};
use crate::model::queue::{Queue, Status};
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use qe_shared::node_channel::LiveStats;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// The API's latency histograms, one per (method, route, status).
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), Histogram>>,
    /// Reports received from nodes and kept.
    pub node_reports: AtomicU64,
    /// Each queue's latest live numbers, as its node reported them to this replica.
    pub live: Arc<LiveNumbers>,
    /// Silent nodes this replica replaced while leading ([`crate::silence`]).
    pub nodes_replaced: Arc<AtomicU64>,
    /// Standbys this replica replaced while leading: absent from their node for the silence
    /// limit ([`crate::silence::Watch::standby_absent`]).
    pub standbys_replaced: Arc<AtomicU64>,
    /// Drives of a queue that failed and are tried again (an EC2 call, a process that would
    /// not start), while this replica led (`reconciler.rs`).
    pub reconcile_errors: Arc<AtomicU64>,
    /// Queues this replica failed while leading (`reconciler.rs`).
    pub queues_failed: Arc<AtomicU64>,
    /// Certificate orders for nodes that failed (the CA refused, or could not be reached).
    pub certificate_errors: AtomicU64,
    /// Changes an authenticated caller asked for and was refused (4xx): counted here, not
    /// kept in the audit log, so a caller cannot grow the store by being refused.
    pub refused_changes: AtomicU64,
    /// The API's own certificate, when it serves HTTPS: its expiry is served.
    pub api_certificate: Option<Arc<qe_tls::Certificate>>,
}

#[derive(Default)]
struct Histogram {
    /// Counts per bucket of `BUCKETS` (not cumulative; summed when rendered).
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Metrics {
    fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let key = (method.to_string(), route.to_string(), status);
        let mut requests = self.requests.lock().expect("never poisoned");
        let histogram = requests.entry(key).or_default();
        if let Some(bucket) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            histogram.buckets[bucket] += 1;
        }
        histogram.count += 1;
        histogram.sum += seconds;
    }

    fn render_requests(&self, out: &mut String) {
        let name = "qe_api_request_duration_seconds";
        let _ = writeln!(out, "# HELP {name} Operator API request latency.");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let requests = self.requests.lock().expect("never poisoned");
        for ((method, route, status), histogram) in requests.iter() {
            let labels = format!("method=\"{method}\",route=\"{route}\",status=\"{status}\"");
            let mut cumulative = 0;
            for (bound, count) in BUCKETS.iter().zip(histogram.buckets) {
                cumulative += count;
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
            }
            let count = histogram.count;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", histogram.sum);
            let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
        }
    }
}

/// The methods counted by name; any other counts as `other`, so that no request, with or
/// without a token, can add labels: the label set is these × the routes × the statuses.
const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// Times every request; the route is the matched pattern (`/v1/queues/{id}`), never an id,
/// and `unmatched` for a path that is no route's.
pub async fn record(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let method = METHODS
        .into_iter()
        .find(|known| request.method().as_str() == *known)
        .unwrap_or("other");
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let started = Instant::now();
    let response = next.run(request).await;
    let seconds = started.elapsed().as_secs_f64();
    let status = response.status().as_u16();
    state.metrics.observe(method, &route, status, seconds);
    response
}

/// `qe_queues`: how many queues there are of each status (every status, zero or not).
fn render_queues_by_status(out: &mut String, queues: &[Queue]) {
    let mut by_status: BTreeMap<&str, u64> = [
        ("provisioning", 0),
        ("running", 0),
        ("failed", 0),
        ("deleting", 0),
        ("deleted", 0),
    ]
    .into();
    for queue in queues {
        let status = match queue.status {
            Status::Provisioning => "provisioning",
            Status::Running => "running",
            Status::Failed => "failed",
            Status::Deleting => "deleting",
            Status::Deleted => "deleted",
        };
        *by_status.entry(status).or_default() += 1;
    }
    out.push_str("# HELP qe_queues Queues by status.\n# TYPE qe_queues gauge\n");
    for (status, count) in by_status {
        let _ = writeln!(out, "qe_queues{{status=\"{status}\"}} {count}");
    }
}

pub async fn render(State(state): State<Arc<AppState>>) -> Result<String, ApiError> {
    let queues = state.store.list().await?;
    let mut out = String::new();
    render_queues_by_status(&mut out, &queues);
    render_rollouts(&state, &mut out).await?;
    let reports = state.metrics.node_reports.load(Ordering::Relaxed);
    out.push_str("# HELP qe_node_reports_total Node reports received.\n");
    out.push_str("# TYPE qe_node_reports_total counter\n");
    let _ = writeln!(out, "qe_node_reports_total {reports}");
    state.metrics.render_requests(&mut out);
    let fresh_for = crate::live::fresh_for(state.config.live_stats_secs());
    let now_ms = crate::live::now_ms();
    render_live_queues(
        &mut out,
        &queues,
        &state.metrics.live,
        now_ms,
        fresh_for.as_millis() as u64,
    );
    render_counter(
        &mut out,
        "qe_live_reports_total",
        "Live reports this replica received from nodes.",
        state.metrics.live.received(),
    );
    render_counter(
        &mut out,
        "qe_api_refused_changes_total",
        "Changes an authenticated caller asked for and was refused (4xx), not kept in the audit log.",
        state.metrics.refused_changes.load(Ordering::Relaxed),
    );
    render_counter(
        &mut out,
        "qe_log_lines_dropped_total",
        "Log lines this replica dropped because its stderr did not take them in time.",
        qe_shared::logging::dropped_lines(),
    );
    render_counter(
        &mut out,
        "qe_nodes_replaced_total",
        "Silent nodes this replica fenced and replaced while it led.",
        state.metrics.nodes_replaced.load(Ordering::Relaxed),
    );
    render_counter(
        &mut out,
        "qe_standbys_replaced_total",
        "Standbys this replica replaced while it led: their node had gone without them for the silence limit.",
        state.metrics.standbys_replaced.load(Ordering::Relaxed),
    );
    render_counter(
        &mut out,
        "qe_reconcile_errors_total",
        "Drives of a queue that failed (a provider or EC2 error) and are tried again, while this replica led.",
        state.metrics.reconcile_errors.load(Ordering::Relaxed),
    );
    render_counter(
        &mut out,
        "qe_queues_failed_total",
        "Queues this replica made failed while it led (not running in time, or refused for good).",
        state.metrics.queues_failed.load(Ordering::Relaxed),
    );
    render_counter(
        &mut out,
        "qe_certificate_errors_total",
        "Certificate orders for nodes that failed (the CA refused or could not be reached).",
        state.metrics.certificate_errors.load(Ordering::Relaxed),
    );
    let (requests, surveys) = state.fleet.requests();
    let name = "qe_cloud_requests_total";
    let _ = writeln!(
        out,
        "# HELP {name} Requests this replica sent its provider's cloud API (EC2), by operation.\n# TYPE {name} counter"
    );
    for (operation, count) in requests {
        let _ = writeln!(
            out,
            "{name}{{operation=\"{}\"}} {count}",
            escape(&operation)
        );
    }
    render_counter(
        &mut out,
        "qe_fleet_surveys_total",
        "Surveys of the whole fleet this replica took, one per look at every queue while it led.",
        surveys,
    );
    // Described always, so the alert on it names a metric this serves; a value with HTTPS.
    let name = "qe_api_certificate_expiry_timestamp_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} When the API's own certificate (api_tls) expires.\n# TYPE {name} gauge"
    );
    let api_expires = state.metrics.api_certificate.as_ref();
    if let Some(expires) = api_expires.and_then(|certificate| certificate.not_after()) {
        let _ = writeln!(out, "{name} {expires}");
    }
    // Described in every mode, so the alert on it names a metric this serves; a value only
    // in wildcard mode, once the certificate is issued.
    let name = "qe_certificate_expiry_timestamp_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} When the cluster's wildcard certificate expires."
    );
    let _ = writeln!(out, "# TYPE {name} gauge");
    if let NodeCertificates::Wildcard { .. } = state.node_certificates {
        let expires = state.store.certificate().await?.and_then(|issued| {
            qe_tls::validity::validity_of_pem(&issued.chain_pem).map(|(_, to)| to)
        });
        if let Some(expires) = expires {
            let _ = writeln!(out, "{name} {expires}");
        }
    }
    Ok(out)
}

/// Rollouts rolling and halted (`rollout.rs`): a halted one waits for the operator.
async fn render_rollouts(state: &AppState, out: &mut String) -> Result<(), ApiError> {
    // Only the newest may be rolling or halted.
    let newest = state.store.newest_rollout().await?;
    let count = |wanted| usize::from(newest.as_ref().is_some_and(|r| r.state == wanted));
    let rolling = count(crate::rollout::State::Rolling);
    let halted = count(crate::rollout::State::Halted);
    out.push_str("# HELP qe_rollouts Node build rollouts rolling or halted.\n");
    out.push_str("# TYPE qe_rollouts gauge\n");
    let _ = writeln!(out, "qe_rollouts{{state=\"rolling\"}} {rolling}");
    let _ = writeln!(out, "qe_rollouts{{state=\"halted\"}} {halted}");
    Ok(())
}

fn render_counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

/// A family of per-queue series read from the live numbers: its name, type and help, and
/// each series' extra labels with the number it shows (None: no series).
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    series: &'static [(&'static str, Reading)],
}

/// What one series shows of a queue's live numbers (None: nothing to show).
type Reading = fn(&LiveStats) -> Option<u64>;

/// Every per-queue family shown while a queue's numbers are fresh, in the order rendered.
const FAMILIES: &[Family] = &[
    Family {
        name: "qe_queue_messages",
        kind: "gauge",
        help: "Messages the queue holds, by state; their sum counts against max-messages.",
        series: &[
            ("state=\"waiting\"", |s| Some(s.waiting)),
            ("state=\"delayed\"", |s| Some(s.delayed)),
            ("state=\"held\"", |s| Some(s.held)),
            ("state=\"dead_letter\"", |s| Some(s.dead_letter)),
        ],
    },
    Family {
        name: "qe_queue_durable_messages",
        kind: "gauge",
        help: "Messages of durability 1 or 2, the dead letter queue's included.",
        series: &[("", |s| Some(s.durable))],
    },
    Family {
        name: "qe_queue_connections",
        kind: "gauge",
        help: "Open connections by role, both queue types.",
        series: &[
            ("role=\"publisher\"", |s| Some(s.publishers)),
            ("role=\"subscriber\"", |s| Some(s.subscribers)),
            ("role=\"admin\"", |s| Some(s.admins)),
        ],
    },
    Family {
        name: "qe_queue_saved_sessions",
        kind: "gauge",
        help: "Subscriber sessions whose connection dropped, kept for a resume.",
        series: &[("", |s| Some(s.saved_sessions))],
    },
    Family {
        name: "qe_queue_published_messages_total",
        kind: "counter",
        help: "Messages published (and added by an administrator) since the node started.",
        series: &[("", |s| Some(s.published))],
    },
    Family {
        name: "qe_queue_delivered_messages_total",
        kind: "counter",
        help: "Messages handed to a subscriber since the node started.",
        series: &[("", |s| Some(s.delivered))],
    },
    Family {
        name: "qe_queue_acked_messages_total",
        kind: "counter",
        help: "Messages acknowledged since the node started.",
        series: &[("", |s| Some(s.acked))],
    },
    Family {
        name: "qe_queue_nacked_messages_total",
        kind: "counter",
        help: "Messages rejected (to the dead letter queue) since the node started.",
        series: &[("", |s| Some(s.nacked))],
    },
    Family {
        name: "qe_queue_network_received_bytes_total",
        kind: "counter",
        help: "Bytes the node's sockets received since it started.",
        series: &[("", |s| Some(s.network_received))],
    },
    Family {
        name: "qe_queue_network_sent_bytes_total",
        kind: "counter",
        help: "Bytes the node's sockets sent since it started.",
        series: &[("", |s| Some(s.network_sent))],
    },
    Family {
        name: "qe_queue_messages_memory_bytes",
        kind: "gauge",
        help: "The memory the queue's messages use (messages-memory-used).",
        series: &[("", |s| Some(s.messages_memory_used))],
    },
    Family {
        name: "qe_queue_max_messages",
        kind: "gauge",
        help: "The most messages the queue can hold, dead letter included (max-messages).",
        series: &[("", |s| Some(s.max_messages))],
    },
    Family {
        name: "qe_queue_max_messages_memory_bytes",
        kind: "gauge",
        help: "The memory the queue's messages may use (max-messages-memory).",
        series: &[("", |s| Some(s.max_messages_memory))],
    },
    Family {
        name: "qe_queue_certificate_expiry_timestamp_seconds",
        kind: "gauge",
        help: "When the certificate the queue's node serves expires (nodes with TLS).",
        series: &[("", |s| s.certificate_expires)],
    },
    Family {
        name: "qe_queue_log_lines_dropped_total",
        kind: "counter",
        help: "Log lines the queue's node dropped because its stderr did not take them in time.",
        series: &[("", |s| Some(s.log_lines_dropped))],
    },
];

/// The per-queue families of the live ones of `queues` (every queue the store has), from
/// `numbers`, which forgets every other queue's.
fn render_live_queues(
    out: &mut String,
    queues: &[Queue],
    numbers: &LiveNumbers,
    now_ms: u64,
    fresh_for_ms: u64,
) {
    let live: Vec<&Queue> = queues.iter().filter(|q| q.status.is_live()).collect();
    let live_ids: std::collections::HashSet<&str> = live.iter().map(|q| q.id.as_str()).collect();
    let latest = numbers.latest_of_live(|id| live_ids.contains(id));
    render_queues(out, &live, &latest, now_ms, fresh_for_ms);
}

/// The per-queue families: for each of `live` (the live queues), an info series, and, once
/// this replica has its node's numbers (`latest`), when they came and how old they are at
/// `now_ms`; the numbers themselves only while younger than `fresh_for_ms`.
fn render_queues(
    out: &mut String,
    live: &[&Queue],
    latest: &HashMap<String, Latest>,
    now_ms: u64,
    fresh_for_ms: u64,
) {
    let labels: Vec<String> = live.iter().map(|queue| queue_labels(queue)).collect();
    let name = "qe_queue_info";
    let _ = writeln!(out, "# HELP {name} 1 for each live queue, with its tier.");
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (queue, labels) in live.iter().zip(&labels) {
        let tier = match queue.tier {
            crate::model::queue::Tier::Standard => "standard",
            crate::model::queue::Tier::Devtest => "devtest",
        };
        let _ = writeln!(out, "{name}{{{labels},tier=\"{tier}\"}} 1");
    }
    let reported: Vec<(&String, &Latest)> = live
        .iter()
        .zip(&labels)
        .filter_map(|(queue, labels)| Some((labels, latest.get(&queue.id)?)))
        .collect();
    let seconds = |ms: u64| format!("{}.{:03}", ms / 1000, ms % 1000);
    let name = "qe_queue_last_report_timestamp_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} When this replica last had live numbers from the queue's node."
    );
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (labels, latest) in &reported {
        let _ = writeln!(out, "{name}{{{labels}}} {}", seconds(latest.at_ms));
    }
    let name = "qe_queue_report_age_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} How old the live numbers this replica has from the queue's node are."
    );
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (labels, latest) in &reported {
        let age = now_ms.saturating_sub(latest.at_ms);
        let _ = writeln!(out, "{name}{{{labels}}} {}", seconds(age));
    }
    let fresh: Vec<&(&String, &Latest)> = reported
        .iter()
        .filter(|(_, latest)| now_ms.saturating_sub(latest.at_ms) < fresh_for_ms)
        .collect();
    for family in FAMILIES {
        let name = family.name;
        let _ = writeln!(out, "# HELP {name} {}", family.help);
        let _ = writeln!(out, "# TYPE {name} {}", family.kind);
        for (labels, latest) in &fresh {
            for (extra, value) in family.series {
                let Some(value) = value(&latest.stats) else {
                    continue;
                };
                let comma = if extra.is_empty() { "" } else { "," };
                let _ = writeln!(out, "{name}{{{labels}{comma}{extra}}} {value}");
            }
        }
    }
}

/// `queue="ID",account="ACCOUNT"`, escaped.
fn queue_labels(queue: &Queue) -> String {
    let account = queue.account.as_deref().unwrap_or("");
    format!(
        "queue=\"{}\",account=\"{}\"",
        escape(&queue.id),
        escape(account)
    )
}

/// A label value as the text format writes it: backslash, double quote and line feed
/// escaped.
fn escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::queue::{NewQueue, Tier};

    fn queue(account: Option<&str>, status: Status) -> Queue {
        let (mut queue, _) = crate::model::queue::create(NewQueue {
            tier: Tier::Devtest,
            region: "local".into(),
            instance_type: "local".into(),
            ipv4: false,
            account: account.map(String::from),
            ..Default::default()
        });
        queue.status = status;
        queue
    }

    const NOW_MS: u64 = 1_800_000_000_000;
    const FRESH_FOR_MS: u64 = 30_000;

    fn render(queues: &[Queue], numbers: &LiveNumbers) -> String {
        let mut out = String::new();
        render_live_queues(&mut out, queues, numbers, NOW_MS, FRESH_FOR_MS);
        out
    }

    #[test]
    fn label_values_escape_backslash_quote_and_line_feed() {
        assert_eq!(escape(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape("two\nlines"), r"two\nlines");
        assert_eq!(escape("plain-id"), "plain-id");
    }

    #[test]
    fn a_queue_of_an_account_with_odd_characters_reads_back_escaped() {
        let odd = queue(Some("ac\"me\\\nltd"), Status::Running);
        let numbers = LiveNumbers::default();
        let stats = LiveStats {
            waiting: 4,
            acked: 9,
            ..LiveStats::default()
        };
        numbers.keep_at(&odd.id, stats, NOW_MS - 1_500);
        let out = render(std::slice::from_ref(&odd), &numbers);
        let labels = format!(r#"queue="{}",account="ac\"me\\\nltd""#, odd.id);
        for line in [
            format!("qe_queue_messages{{{labels},state=\"waiting\"}} 4"),
            format!("qe_queue_acked_messages_total{{{labels}}} 9"),
            format!("qe_queue_report_age_seconds{{{labels}}} 1.500"),
            format!("qe_queue_info{{{labels},tier=\"devtest\"}} 1"),
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        assert!(
            !out.contains("certificate_expiry_timestamp_seconds{"),
            "no series for a node without TLS:\n{out}"
        );
        // Every sample line is one line: nothing unescaped split it.
        for line in out.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("qe_queue_"), "{line:?}");
        }
    }

    #[test]
    fn a_deleted_queues_series_are_gone_and_its_numbers_forgotten() {
        let kept = queue(None, Status::Running);
        let deleted = queue(Some("acme"), Status::Deleted);
        let deleting = queue(Some("acme"), Status::Deleting);
        let numbers = LiveNumbers::default();
        for queue in [&kept, &deleted, &deleting] {
            numbers.keep_at(&queue.id, LiveStats::default(), NOW_MS - 1_000);
        }
        let queues = [kept.clone(), deleted.clone(), deleting.clone()];
        let out = render(&queues, &numbers);
        assert!(
            out.contains(&format!("queue=\"{}\",account=\"\"", kept.id)),
            "{out}"
        );
        for gone in [&deleted, &deleting] {
            assert!(!out.contains(&gone.id), "{} shows:\n{out}", gone.id);
        }
        assert_eq!(
            numbers.latest_of_live(|_| true).len(),
            1,
            "what the deleted queues reported is dropped, not kept hidden"
        );
    }

    #[test]
    fn stale_numbers_hide_but_their_age_still_shows() {
        let stale = queue(None, Status::Running);
        let silent = queue(None, Status::Provisioning);
        let numbers = LiveNumbers::default();
        numbers.keep_at(&stale.id, LiveStats::default(), NOW_MS - FRESH_FOR_MS);
        let out = render(&[stale.clone(), silent.clone()], &numbers);
        let labels = format!(r#"queue="{}",account="""#, stale.id);
        assert!(
            out.contains(&format!("qe_queue_report_age_seconds{{{labels}}} 30.000")),
            "{out}"
        );
        assert!(
            !out.contains(&format!("qe_queue_messages{{{labels}")),
            "{out}"
        );
        // A queue whose node never reported here: its info alone, for the alert on absence.
        assert_eq!(out.matches(&silent.id).count(), 1, "{out}");
    }

    #[test]
    fn each_family_is_described_once() {
        let mut out = String::new();
        render_queues(&mut out, &[], &HashMap::new(), NOW_MS, FRESH_FOR_MS);
        let types: Vec<&str> = out.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let mut unique = types.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(types.len(), unique.len(), "{out}");
        assert_eq!(types.len(), FAMILIES.len() + 3, "{out}");
    }
}
