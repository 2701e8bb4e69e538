//! `/metrics` in Prometheus's text format: queues by status (read from the store when scraped),
//! and the API's request latency by route and status (recorded by a middleware).

use super::{ApiError, AppState};
use crate::queues::Status;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::collections::BTreeMap;
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

pub async fn render(State(state): State<Arc<AppState>>) -> Result<String, ApiError> {
    let mut by_status: BTreeMap<&str, u64> = [
        ("provisioning", 0),
        ("running", 0),
        ("failed", 0),
        ("deleting", 0),
        ("deleted", 0),
    ]
    .into();
    for queue in state.store.list().await? {
        let status = match queue.status {
            Status::Provisioning => "provisioning",
            Status::Running => "running",
            Status::Failed => "failed",
            Status::Deleting => "deleting",
            Status::Deleted => "deleted",
        };
        *by_status.entry(status).or_default() += 1;
    }
    let mut out = String::new();
    out.push_str("# HELP qe_queues Queues by status.\n# TYPE qe_queues gauge\n");
    for (status, count) in by_status {
        let _ = writeln!(out, "qe_queues{{status=\"{status}\"}} {count}");
    }
    let reports = state.metrics.node_reports.load(Ordering::Relaxed);
    out.push_str("# HELP qe_node_reports_total Node reports received.\n");
    out.push_str("# TYPE qe_node_reports_total counter\n");
    let _ = writeln!(out, "qe_node_reports_total {reports}");
    state.metrics.render_requests(&mut out);
    Ok(out)
}
