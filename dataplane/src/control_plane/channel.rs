//! The node's side of the node channel ([`qe_shared::node_channel`]). A node started with
//! `--bootstrap` knows only how to reach its control plane: it pulls its config, applies it,
//! says which version it serves, and keeps a watch open for the next one. The node opens
//! every exchange, so this works behind NAT as well as beside the control plane. Each
//! exchange goes to one of the control plane's replicas, the next one when that one fails
//! ([`crate::control_plane::replicas`]).

use crate::control_plane::replicas::{ControlPlanes, Unanswered};
use crate::control_plane::ReportTo;
use qe_shared::backoff::Backoff;
use qe_shared::node_channel::{
    Applied, Bootstrap, CertificateRequest, DesiredConfig, DesiredRedrive, IssuedCertificate,
    NodeBuild, RedriveChange, RedriveRefused, RefusedBuild, TAKES_EPOCH, TAKES_HEADER,
    TAKES_REPLICATION, TAKES_STEP_DOWN, WATCH_HOLD_SECS,
};
use sha2::Digest;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The wait after a failed exchange; it doubles while they keep failing.
const RETRY_AFTER: Duration = Duration::from_millis(250);
const RETRY_AFTER_AT_MOST: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("the bootstrap {path}: {reason}")]
    Bootstrap { path: PathBuf, reason: String },
    #[error("sending: {0}")]
    Send(#[from] reqwest::Error),
    #[error("the control plane replied {0}")]
    Refused(reqwest::StatusCode),
    #[error("the certificate: {0}")]
    Certificate(String),
}

impl From<Unanswered> for ChannelError {
    fn from(unanswered: Unanswered) -> ChannelError {
        match unanswered {
            Unanswered::Send(error) => ChannelError::Send(error),
            Unanswered::Refused(status) => ChannelError::Refused(status),
        }
    }
}

/// The node's end of the channel.
#[derive(Clone)]
pub struct Channel {
    /// The control plane's replicas (the reporter shares which one is current), the queue,
    /// the bootstrap's credential and roots.
    to: ReportTo,
    /// The node's credential now: the bootstrap's, or a rotated one it was sent and kept.
    token: Arc<RwLock<String>>,
    /// Where a rotated credential is kept (`DATA_DIR/node-token`, 0600).
    kept_token: PathBuf,
    /// The config version the control plane last heard the node serves (with its build); 0
    /// before the first.
    confirmed: Arc<tokio::sync::watch::Sender<u64>>,
    /// Waits longer than the control plane holds a watch.
    client: reqwest::Client,
    /// The build refused last, told by the upgrader: the control plane hears of it with every
    /// confirmed config.
    refused_build: Arc<RwLock<Option<RefusedBuild>>>,
    /// The node runs with a standby (said with every confirmed config).
    with_standby: Arc<std::sync::atomic::AtomicBool>,
}

/// Reads the bootstrap file: TOML, the fields of [`Bootstrap`].
pub fn read_bootstrap(path: &Path) -> Result<Bootstrap, ChannelError> {
    let fail = |reason: String| ChannelError::Bootstrap {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let bootstrap: Bootstrap = toml::from_str(&text).map_err(|e| fail(e.to_string()))?;
    if let Some(pem) = &bootstrap.control_plane_ca_pem {
        match reqwest::Certificate::from_pem_bundle(pem.as_bytes()) {
            Ok(roots) if !roots.is_empty() => {}
            _ => return Err(fail("control_plane_ca_pem holds no certificate".into())),
        }
    }
    Ok(bootstrap)
}

impl Channel {
    /// The channel of the node that starts from `bootstrap` with its data in `data_dir`.
    pub fn new(bootstrap: &Bootstrap, data_dir: &Path) -> Channel {
        let to = ReportTo {
            control_planes: ControlPlanes::new(&bootstrap.control_plane, &bootstrap.control_planes),
            queue_id: bootstrap.queue_id.clone(),
            token: bootstrap.node_token.clone(),
            ca_pem: bootstrap
                .control_plane_ca_pem
                .as_ref()
                .map(|pem| pem.as_bytes().to_vec()),
        };
        let client = super::client(&to, Duration::from_secs(WATCH_HOLD_SECS + 15));
        let kept_token = data_dir.join("node-token");
        let token = std::fs::read_to_string(&kept_token)
            .ok()
            .map(|token| token.trim().to_string())
            .filter(|token| !token.is_empty())
            .unwrap_or_else(|| bootstrap.node_token.clone());
        Channel {
            to,
            token: Arc::new(RwLock::new(token)),
            kept_token,
            confirmed: Arc::new(tokio::sync::watch::channel(0).0),
            client,
            refused_build: Arc::default(),
            with_standby: Arc::default(),
        }
    }

    /// Whether the node runs with a standby, said with every confirmation from now on.
    pub fn runs_with_standby(&self, with_standby: bool) {
        let with = &self.with_standby;
        with.store(with_standby, std::sync::atomic::Ordering::Relaxed);
    }

    /// Where the reporter sends records: the same control plane, as the same node.
    pub fn report_to(&self) -> ReportTo {
        ReportTo {
            token: self.token(),
            ..self.to.clone()
        }
    }

    /// Whether it has a node token to present: its bootstrap's, or one kept in its data
    /// directory (a cloud node's, from its bootstrap token).
    pub fn has_token(&self) -> bool {
        !self.token().is_empty()
    }

    pub(crate) fn token(&self) -> String {
        self.token.read().expect("never poisoned").clone()
    }

    /// Takes on a rotated credential: kept first (synced), then used for every call.
    pub(crate) fn take_token(&self, token: &str) -> std::io::Result<()> {
        write_private(&self.kept_token, token.as_bytes())?;
        *self.token.write().expect("never poisoned") = token.to_string();
        Ok(())
    }

    /// `/v1/nodes/ID/{what}` on the replica at `base`.
    fn url(&self, base: &str, what: &str) -> String {
        format!("{base}/v1/nodes/{}/{what}", self.to.queue_id)
    }

    /// The answer to what `request` builds (for a replica's base URL), with the credential,
    /// from the current replica or the next ones ([`ControlPlanes::send`]).
    async fn send(
        &self,
        request: impl Fn(&str) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ChannelError> {
        let response = self
            .to
            .control_planes
            .send(|base| request(base).bearer_auth(self.token()))
            .await?;
        Ok(response)
    }

    /// The desired config once its version is past `after` (at once with `None`); `None`
    /// when the control plane held the watch and nothing changed. A watch that breaks goes
    /// on with the same `after` at the next replica.
    pub async fn desired(&self, after: Option<u64>) -> Result<Option<DesiredConfig>, ChannelError> {
        let query = match after {
            Some(after) => format!("?after={after}"),
            None => String::new(),
        };
        let response = self
            .send(|base| {
                let url = format!("{}{query}", self.url(base, "config"));
                // So that the first config already has the standby's key (taken at start).
                let takes = format!("{TAKES_REPLICATION},{TAKES_EPOCH},{TAKES_STEP_DOWN}");
                self.client.get(url).header(TAKES_HEADER, takes)
            })
            .await?;
        match response.status() {
            reqwest::StatusCode::NO_CONTENT => Ok(None),
            _ => Ok(Some(response.json().await?)),
        }
    }

    /// Tells the control plane the node serves `version` now, and which build it is.
    pub async fn applied(&self, version: u64) -> Result<(), ChannelError> {
        let applied = Applied {
            version,
            build: this_build().await,
            refused_build: self.refused_build.read().expect("never poisoned").clone(),
            accepts_builds: true,
            takes_initial_settings: true,
            takes_redrive: true,
            standby: Some(self.with_standby.load(std::sync::atomic::Ordering::Relaxed)),
        };
        let sent = self
            .send(|base| self.client.post(self.url(base, "applied")).json(&applied))
            .await;
        match sent {
            // A control plane from before standbys reads `applied` with
            // `deny_unknown_fields`: it is told the rest, as before.
            Err(ChannelError::Refused(status)) if refused_a_field(status) => {
                let before = Applied {
                    standby: None,
                    ..applied
                };
                self.send(|base| self.client.post(self.url(base, "applied")).json(&before))
                    .await?;
            }
            sent => {
                sent?;
            }
        }
        self.confirmed.send_replace(version);
        Ok(())
    }

    /// The build refused last, said with every confirmation from now on.
    pub fn tell_refused(&self, refused: Option<RefusedBuild>) {
        *self.refused_build.write().expect("never poisoned") = refused;
    }

    /// Confirms the version confirmed last once more: the control plane hears of a build
    /// refused since (retried until it does).
    pub async fn confirm_again(&self) {
        let mut backoff = Backoff::new(RETRY_AFTER, RETRY_AFTER_AT_MOST);
        loop {
            let version = *self.confirmed.borrow();
            // Nothing confirmed yet: the first confirmation, which is on its way, says it.
            if version == 0 {
                return;
            }
            match self.applied(version).await {
                Ok(()) => return,
                Err(error) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(%error, retry_in = ?wait, "telling the control plane of a refused build failed");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// The config version the control plane last confirmed from this process (0: none yet).
    pub fn confirmed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.confirmed.subscribe()
    }

    /// `GET /v1/nodes/ID/{what}`, answered within `within` (a download).
    pub async fn fetch(
        &self,
        what: &str,
        within: Duration,
    ) -> Result<reqwest::Response, ChannelError> {
        self.send(|base| self.client.get(self.url(base, what)).timeout(within))
            .await
    }

    /// Tells a control plane that refuses the node's credential what the node is: its kept
    /// config. A control plane restored from a backup made before the queue was (one that
    /// knows nothing of it) keeps it, so that the operator may adopt the queue; any other
    /// refuses it.
    pub async fn report_stray(&self, kept: &DesiredConfig) -> Result<(), ChannelError> {
        self.send(|base| self.client.post(self.url(base, "stray")).json(kept))
            .await?;
        Ok(())
    }

    /// Asks the control plane for a change to the queue's redrive (SQS's `SetQueueAttributes`
    /// naming another queue as its dead letter target, or setting `RedriveAllowPolicy`): the
    /// redrive now, or why it was refused.
    pub async fn change_redrive(
        &self,
        change: &RedriveChange,
    ) -> Result<Result<DesiredRedrive, RedriveRefused>, ChannelError> {
        // A refusal (400) is an answer, not a fault to fail over on.
        let response = self
            .to
            .control_planes
            .call(|base| {
                let url = self.url(&base, "redrive");
                let sent = self.client.post(url).json(change).bearer_auth(self.token());
                async move {
                    let response = sent.send().await?;
                    match response.status() {
                        status if status.is_success() => Ok(response),
                        reqwest::StatusCode::BAD_REQUEST => Ok(response),
                        status => Err(Unanswered::Refused(status)),
                    }
                }
            })
            .await?;
        match response.status() {
            reqwest::StatusCode::BAD_REQUEST => Ok(Err(response.json().await?)),
            _ => Ok(Ok(response.json().await?)),
        }
    }

    /// Sends a CSR for the queue's name; returns the chain the control plane had issued.
    pub async fn certificate(&self, csr_pem: String) -> Result<String, ChannelError> {
        let request = CertificateRequest { csr_pem };
        let response = self
            .send(|base| {
                let url = self.url(base, "certificate");
                self.client.post(url).json(&request)
            })
            .await?;
        Ok(response.json::<IssuedCertificate>().await?.chain_pem)
    }
}

/// Whether `status` is how a control plane refuses a body with a field it does not know
/// (axum's JSON rejection: 422, or 400).
pub fn refused_a_field(status: reqwest::StatusCode) -> bool {
    status == reqwest::StatusCode::UNPROCESSABLE_ENTITY
        || status == reqwest::StatusCode::BAD_REQUEST
}

/// Where the last config taken is kept: a node restarted while its control plane cannot be
/// reached starts with it.
fn kept_path(data_dir: &Path) -> PathBuf {
    data_dir.join("desired-config.json")
}

pub(crate) fn keep(data_dir: &Path, desired: &DesiredConfig) -> std::io::Result<()> {
    write_private(
        &kept_path(data_dir),
        &serde_json::to_vec(desired).expect("plain fields"),
    )
}

/// A rotated credential is used, and the old one retired, only once it would outlast a power
/// loss (issue 28): every file the node keeps is written whole (`qe_shared::files`).
use qe_shared::files::write_private;

/// After the control plane refused the node's credential: a node that has a kept config
/// reports itself as a stray ([`Channel::report_stray`]), in case the control plane no
/// longer knows its queue.
async fn refused(channel: &Channel, data_dir: &Path, error: &ChannelError) {
    let ChannelError::Refused(reqwest::StatusCode::UNAUTHORIZED) = error else {
        return;
    };
    let Some(kept) = kept(data_dir) else {
        return;
    };
    match channel.report_stray(&kept).await {
        Ok(()) => tracing::warn!("the control plane does not know this node's queue: reported it, for the operator to adopt"),
        Err(error) => tracing::debug!(%error, "not taken as a stray"),
    }
}

fn kept(data_dir: &Path) -> Option<DesiredConfig> {
    let bytes = std::fs::read(kept_path(data_dir)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The config to start with: the control plane's, retried while it refuses; the kept one
/// when it cannot be reached and there is one.
pub async fn first_config(channel: &Channel, data_dir: &Path) -> DesiredConfig {
    let mut backoff = Backoff::new(RETRY_AFTER, RETRY_AFTER_AT_MOST);
    loop {
        // How long this round waits if it gets nothing.
        let wait = backoff.next_wait();
        match channel.desired(None).await {
            Ok(Some(desired)) => {
                if let Err(error) = keep(data_dir, &desired) {
                    tracing::warn!(%error, "the config could not be kept");
                }
                return desired;
            }
            Err(ChannelError::Send(error)) if kept(data_dir).is_some() => {
                tracing::warn!(%error, "the control plane cannot be reached: starting with the config kept from before");
                return kept(data_dir).expect("just read");
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, retry_in = ?wait, "no config from the control plane yet");
                refused(channel, data_dir, &error).await;
            }
        }
        tokio::time::sleep(wait).await;
    }
}

/// The build this process runs: its version, and the SHA-256 of its binary, read once (on a
/// blocking thread: the binary is tens of megabytes). None if the binary cannot be read.
pub(crate) async fn this_build() -> Option<NodeBuild> {
    static BUILD: tokio::sync::OnceCell<Option<NodeBuild>> = tokio::sync::OnceCell::const_new();
    let hashed = || async {
        let binary = tokio::task::spawn_blocking(|| std::fs::read("/proc/self/exe")).await;
        match binary {
            Ok(Ok(binary)) => Some(NodeBuild {
                version: env!("CARGO_PKG_VERSION").to_string(),
                binary_sha256: qe_shared::hex(&sha2::Sha256::digest(&binary)),
            }),
            Ok(Err(error)) => {
                tracing::warn!(%error, "its own binary cannot be read: its build is not reported");
                None
            }
            Err(_) => None,
        }
    };
    BUILD.get_or_init(hashed).await.clone()
}

/// What a running node does with a new config: the logins now (open connections go on), a
/// new certificate when one is asked for. Where to listen and the tier are taken at start.
pub trait Apply: Send + Sync {
    fn apply<'a>(
        &'a self,
        desired: &'a DesiredConfig,
    ) -> futures::future::BoxFuture<'a, Result<(), String>>;
}

/// Confirms `started` (the version the node started with), then applies each new version and
/// confirms it. Runs for the life of the node.
pub async fn watch(channel: Channel, data_dir: PathBuf, started: u64, apply: Arc<dyn Apply>) {
    let mut backoff = Backoff::new(RETRY_AFTER, RETRY_AFTER_AT_MOST);
    let mut serving = started;
    let mut confirmed = None;
    loop {
        if confirmed != Some(serving) {
            match channel.applied(serving).await {
                Ok(()) => confirmed = Some(serving),
                Err(error) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(%error, retry_in = ?wait, "the applied version could not be confirmed");
                    refused(&channel, &data_dir, &error).await;
                    tokio::time::sleep(wait).await;
                    continue;
                }
            }
        }
        match channel.desired(Some(serving)).await {
            Ok(None) => backoff.reset(),
            Ok(Some(desired)) => match apply.apply(&desired).await {
                Ok(()) => {
                    if let Err(error) = keep(&data_dir, &desired) {
                        tracing::warn!(%error, "the config could not be kept");
                    }
                    tracing::info!(version = desired.version, "config applied");
                    serving = desired.version;
                    backoff.reset();
                }
                Err(error) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(%error, version = desired.version, retry_in = ?wait, "a config could not be applied");
                    tokio::time::sleep(wait).await;
                }
            },
            Err(error) => {
                let wait = backoff.next_wait();
                tracing::warn!(%error, retry_in = ?wait, "watching the config failed");
                refused(&channel, &data_dir, &error).await;
                tokio::time::sleep(wait).await;
            }
        }
    }
}
