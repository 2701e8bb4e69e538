//! The node's link to its control plane: where it is ([`ReportTo`]: its replicas, the queue,
//! the node's credential, the roots), an HTTP client for it, which replica requests go to
//! ([`replicas`]), and the node channel ([`channel`]: config, certificates, builds, redrive).
//! Below everything the node runs: the reporter, the SQS face and the node's start use it.

pub mod channel;
pub mod replicas;

use replicas::ControlPlanes;
use std::time::Duration;

/// Where the node reports its history, and as whom.
#[derive(Clone, PartialEq, Eq)]
pub struct ReportTo {
    /// The control plane's replicas; clones share which one is talked to now.
    pub control_planes: ControlPlanes,
    pub queue_id: String,
    pub token: String,
    /// The only roots trusted for the control plane's certificate (PEM), if not the system's.
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ReportTo {
    /// Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ReportTo({:?} as {})",
            self.control_planes, self.queue_id
        )
    }
}

/// How long an idle connection to the control plane is kept for the next request: longer
/// than the live reports' default 10 s, so each reuses the last one's connection (no new TCP
/// and TLS handshake per report, on either side).
const POOLED_AT_MOST: Duration = Duration::from_secs(15);

/// An HTTP client for the control plane: its own roots only, when the config names them.
pub fn client(to: &ReportTo, timeout: Duration) -> reqwest::Client {
    // Idle connections are dropped before the control plane closes them (it allows 20 s),
    // so a request is never sent on one the server is closing.
    let builder = reqwest::Client::builder()
        .timeout(timeout)
        .pool_idle_timeout(POOLED_AT_MOST);
    let builder = match &to.ca_pem {
        // Checked when the config was read.
        Some(pem) => builder.tls_certs_only(
            reqwest::Certificate::from_pem_bundle(pem).expect("roots checked at load"),
        ),
        None => builder,
    };
    builder.build().expect("an HTTP client")
}
