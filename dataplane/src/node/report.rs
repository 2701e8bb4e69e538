//! Pushes the node's stats and usage records to the control plane, which bills from them.
//!
//! The node's own history is the source of truth: records are sent oldest first, and the
//! history notes how far the control plane has acknowledged (a cursor in sled), so a push that
//! fails is sent again, through outages and restarts, and none is lost. The control plane
//! keeps records by (queue, kind, time), so one sent twice is stored once. Pushes go to the
//! replica the channel talks to, and on to the next when it fails ([`crate::control_plane::replicas`]).
//!
//! Beside the records, the node's live numbers ([`LiveStats`]) go every few seconds
//! ([`Reporter::run_live`]), each in a report of its own: they are worth only their latest
//! value, so one that fails is not sent again (the next replaces it), and they never wait
//! for, delay or share a request with the records.

use crate::control_plane::channel::refused_a_field;
use crate::control_plane::replicas::Unanswered;
use crate::control_plane::{client, ReportTo};
use crate::history::Kind;
use crate::state::Node;
use qe_shared::backoff::Backoff;
use qe_shared::node_channel::{LiveStats, NodeReport, StatsRecord, UsageRecord};
use qe_tls::Certificate;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The wait after a failed push; it doubles while pushes keep failing.
const RETRY_AFTER: Duration = Duration::from_secs(1);
const RETRY_AFTER_AT_MOST: Duration = Duration::from_secs(60);
/// Records per request.
const BATCH: usize = 500;

#[derive(Clone)]
pub struct Reporter {
    node: Arc<Node>,
    /// Where to, and the client for it; a reread config may move it (`retarget`).
    target: Arc<RwLock<Target>>,
}

struct Target {
    to: ReportTo,
    client: reqwest::Client,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("reading the history: {0}")]
    History(#[from] crate::history::HistoryError),
    #[error("sending: {0}")]
    Send(#[from] reqwest::Error),
    #[error("the control plane replied {0}")]
    Refused(reqwest::StatusCode),
    #[error("writing the certificate: {0}")]
    Write(#[from] std::io::Error),
    #[error("the control plane's certificate reply is not a key and a chain: {0}")]
    NotACertificate(&'static str),
}

impl From<Unanswered> for ReportError {
    fn from(unanswered: Unanswered) -> ReportError {
        match unanswered {
            Unanswered::Send(error) => ReportError::Send(error),
            Unanswered::Refused(status) => ReportError::Refused(status),
        }
    }
}

/// How long the standby's numbers are left out of the live reports after a control plane
/// refused them (one from before standbys), before they are tried again.
const STANDBY_LEFT_OUT: Duration = Duration::from_secs(600);

/// How long one report or certificate request may take.
const REQUEST_WITHIN: Duration = Duration::from_secs(10);

/// Fetches the cluster certificate and writes it to `dir/cert.pem` and `dir/key.pem` (the
/// node's alone), each whole, so a reload never reads half a file; a reply that is not a
/// private key and a chain of certificates leaves both as they were.
pub async fn fetch_certificate(to: &ReportTo, dir: &std::path::Path) -> Result<(), ReportError> {
    let client = client(to, REQUEST_WITHIN);
    let response = to
        .control_planes
        .send(|base| {
            let url = format!("{base}/v1/nodes/{}/certificate", to.queue_id);
            client.get(url).bearer_auth(&to.token)
        })
        .await?;
    let issued: serde_json::Value = response.json().await?;
    let (key, chain) = checked_key_and_chain(&issued)?;
    std::fs::create_dir_all(dir)?;
    qe_shared::files::write_private(&dir.join("key.pem"), key.as_bytes())?;
    qe_shared::files::write_whole(&dir.join("cert.pem"), chain.as_bytes(), 0o644)?;
    Ok(())
}

/// The `key_pem` and `chain_pem` of a certificate reply, once each reads as what it must be.
fn checked_key_and_chain(issued: &serde_json::Value) -> Result<(&str, &str), ReportError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let key = issued["key_pem"].as_str().unwrap_or_default();
    let chain = issued["chain_pem"].as_str().unwrap_or_default();
    if PrivateKeyDer::from_pem_slice(key.as_bytes()).is_err() {
        return Err(ReportError::NotACertificate("key_pem is not a private key"));
    }
    let certificates: Result<Vec<_>, _> =
        CertificateDer::pem_slice_iter(chain.as_bytes()).collect();
    match certificates {
        Ok(certificates) if !certificates.is_empty() => Ok((key, chain)),
        _ => Err(ReportError::NotACertificate(
            "chain_pem is not a chain of certificates",
        )),
    }
}

impl Reporter {
    pub fn new(node: Arc<Node>, to: ReportTo) -> Reporter {
        let client = client(&to, REQUEST_WITHIN);
        let target = Arc::new(RwLock::new(Target { to, client }));
        Reporter { node, target }
    }

    /// Where reports go now, and the client for it.
    fn target(&self) -> (ReportTo, reqwest::Client) {
        let target = self.target.read().expect("never poisoned");
        (target.to.clone(), target.client.clone())
    }

    /// Where reports go now.
    pub fn to(&self) -> ReportTo {
        self.target.read().expect("never poisoned").to.clone()
    }

    /// Reports go to `to` from now on (a control plane that moved), with its roots.
    pub fn retarget(&self, to: ReportTo) {
        let mut target = self.target.write().expect("never poisoned");
        if target.to != to {
            tracing::info!(control_planes = ?to.control_planes, "reporting to a new control plane address");
            *target = Target {
                client: client(&to, REQUEST_WITHIN),
                to,
            };
        }
    }

    /// Pushes whatever is new, then waits for the next record; backs off while pushes fail.
    /// Runs until aborted.
    pub async fn run(self) {
        let mut backoff = Backoff::new(RETRY_AFTER, RETRY_AFTER_AT_MOST);
        loop {
            let recorded = self.node.history.recorded.notified();
            tokio::pin!(recorded);
            // Registered before the push, so a record made during it is not missed.
            recorded.as_mut().enable();
            match self.push_all().await {
                Ok(()) => {
                    backoff.reset();
                    recorded.await;
                }
                Err(error) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(%error, retry_in = ?wait, "reporting to the control plane failed");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Sends the node's live numbers now and then every `every`, until aborted. `certificate`:
    /// the one the node serves, whose expiry goes with them.
    pub async fn run_live(self, every: Duration, certificate: Option<Arc<Certificate>>) {
        let mut ticks = tokio::time::interval(every);
        // A push slower than `every` puts the next off; pushes never pile up.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        // Until when the standby's numbers are left out: a control plane from before them
        // refuses the whole report (its numbers are read with `deny_unknown_fields`), and one
        // whose live report is refused would judge the node silent.
        let mut without_standby_until = None;
        let mut stepped_down = false;
        loop {
            ticks.tick().await;
            let mut live = LiveStats {
                certificate_expires: certificate.as_ref().and_then(|c| c.not_after()),
                ..self.node.live_stats()
            };
            if without_standby_until.is_some_and(|until| Instant::now() < until) {
                live.standby = None;
            }
            let report_of = |live| NodeReport {
                live: Some(live),
                ..NodeReport::default()
            };
            let sent_at = Instant::now();
            let mut sent = self.send(&report_of(live)).await;
            if let Err(ReportError::Refused(status)) = &sent {
                if refused_a_field(*status) && live.standby.is_some() {
                    tracing::info!(%status, "the control plane refused the standby's numbers: leaving them out for {STANDBY_LEFT_OUT:?}");
                    without_standby_until = Some(Instant::now() + STANDBY_LEFT_OUT);
                    live.standby = None;
                    sent = self.send(&report_of(live)).await;
                }
            }
            if let Some(standby) = &self.node.standby {
                if sent.is_ok() {
                    standby.shipping.control_plane_heard(sent_at);
                }
                match (standby.shipping.stepped_down(), stepped_down) {
                    (true, false) => tracing::warn!("no report answered for as long as the control plane waits before it promotes the standby, and no standby in sync: this node may have been replaced, and refuses durable publishes until one of them is back"),
                    (false, true) => tracing::info!("durable publishes are taken again"),
                    _ => {}
                }
                stepped_down = standby.shipping.stepped_down();
            }
            match (sent, failing) {
                (Ok(()), true) => {
                    tracing::info!("live numbers reach the control plane again");
                    failing = false;
                }
                (Err(error), false) => {
                    tracing::warn!(%error, "live numbers could not be reported; trying again at each interval");
                    failing = true;
                }
                (Err(error), true) => tracing::debug!(%error, "live numbers not reported"),
                (Ok(()), false) => {}
            }
        }
    }

    /// The node is stopping: sends every unreported record, then says that was the last
    /// (the control plane removes a deleted queue's data only after it).
    pub async fn push_last(&self) -> Result<(), ReportError> {
        self.push_all().await?;
        self.send(&NodeReport {
            last: true,
            ..NodeReport::default()
        })
        .await
    }

    /// Sends `report` to the current replica, or the next ones ([`ControlPlanes::send`]).
    ///
    /// [`ControlPlanes::send`]: crate::control_plane::replicas::ControlPlanes::send
    async fn send(&self, report: &NodeReport) -> Result<(), ReportError> {
        let (to, client) = self.target();
        to.control_planes
            .send(|base| {
                let url = format!("{base}/v1/nodes/{}/reports", to.queue_id);
                client.post(url).bearer_auth(&to.token).json(report)
            })
            .await?;
        Ok(())
    }

    /// Sends every unreported record, in batches, noting each batch once it is received.
    pub async fn push_all(&self) -> Result<(), ReportError> {
        let history = &self.node.history;
        loop {
            let usage = history.unreported(Kind::Usage, BATCH)?;
            let stats = history.unreported(Kind::Stats, BATCH)?;
            if usage.is_empty() && stats.is_empty() {
                return Ok(());
            }
            let body = NodeReport {
                usage: read_lines(&usage, UsageRecord::from_line),
                stats: read_lines(&stats, StatsRecord::from_line),
                last: false,
                live: None,
            };
            self.send(&body).await?;
            let marks: Vec<(Kind, u64)> = [(Kind::Usage, &usage), (Kind::Stats, &stats)]
                .into_iter()
                .filter_map(|(kind, records)| Some((kind, records.last()?.0)))
                .collect();
            // Each mark is synced (sled flush, then fsync): on a blocking thread, not the runtime's.
            let node = self.node.clone();
            let marked = tokio::task::spawn_blocking(move || {
                let history = &node.history;
                marks
                    .into_iter()
                    .try_for_each(|(kind, time)| history.mark_reported(kind, time))
            });
            marked.await.expect("marking never panics")?;
        }
    }
}

/// The history's lines as records. A line that does not read (a damaged entry) cannot be
/// billed from either: it is logged and skipped, and the cursor moves past it with the rest.
fn read_lines<T>(lines: &[(u64, String)], read: impl Fn(&str) -> Option<T>) -> Vec<T> {
    lines
        .iter()
        .filter_map(|(time, line)| {
            let record = read(line);
            if record.is_none() {
                tracing::warn!(time, line, "a history record does not read; not reported");
            }
            record
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_reply_that_is_not_a_key_and_a_chain_is_refused() {
        let made = rcgen::generate_simple_self_signed(vec!["q.example".into()]).unwrap();
        let (key, chain) = (made.signing_key.serialize_pem(), made.cert.pem());
        let good = serde_json::json!({"key_pem": key, "chain_pem": chain});
        assert!(checked_key_and_chain(&good).is_ok());
        let not_base64 = "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n";
        for bad in [
            serde_json::json!({}),
            serde_json::json!({"key_pem": "", "chain_pem": chain}),
            serde_json::json!({"key_pem": key, "chain_pem": ""}),
            serde_json::json!({"key_pem": chain, "chain_pem": chain}),
            serde_json::json!({"key_pem": key, "chain_pem": not_base64}),
        ] {
            assert!(checked_key_and_chain(&bad).is_err(), "{bad}");
        }
    }
}
