//! The control plane's HTTP API: queues, their logins, usage, stats and bills.
//!
//! Every request carries `Authorization: Bearer TOKEN`: the operator's token, or an account's
//! API key (`qek_…`), which sees only its account's queues. Errors are the API's
//! `{"error":{"code":..,"message":..}}`, as [`Error::Api`].

use crate::endpoint::{tls_client, Credentials};
use crate::error::{Error, Result};
use qe_shared::protocol::Role;
use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use url::Url;

/// A client of the control plane's API.
///
/// ```no_run
/// use qe_client::control_plane::{NewQueue, QueueStatus, Tier};
/// use qe_client::{ControlPlane, Endpoint, Message, Publisher};
/// use std::time::Duration;
///
/// # async fn run() -> qe_client::Result<()> {
/// let api = ControlPlane::new("https://api.CLUSTER.thequeueexpert.com/", "qek_KEYID_SECRET")?;
/// let created = api.create_queue(&NewQueue::new(Tier::Devtest, "us-east-1", "t3.small")).await?;
/// let queue = api
///     .wait_for_queue(&created.queue.id, QueueStatus::Running, Duration::from_secs(120))
///     .await?;
/// let endpoint = Endpoint::new(&queue.url)?;
/// let publisher = Publisher::connect(&endpoint, created.logins.publisher.clone()).await?;
/// publisher.publish(Message::text("the first message")).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ControlPlane {
    http: reqwest::Client,
    base: Url,
    token: String,
    /// How long a request may take, unless it says otherwise.
    timeout: Duration,
}

/// How a [`ControlPlane`] client connects: extra roots, a timeout.
///
/// ```no_run
/// # fn run(ca_pem: &str) -> qe_client::Result<()> {
/// use std::time::Duration;
/// let api = qe_client::ControlPlane::builder("https://127.0.0.1:8443/", "OPERATOR-TOKEN")
///     .add_root_certificates_pem(ca_pem)?
///     .trust_only_added_roots()
///     .timeout(Duration::from_secs(10))
///     .build()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ControlPlaneBuilder {
    base: String,
    token: String,
    roots: Vec<CertificateDer<'static>>,
    public_roots: bool,
    timeout: Duration,
}

impl ControlPlaneBuilder {
    /// Also trusts the certificates in a PEM text (a private control plane's CA).
    pub fn add_root_certificates_pem(mut self, pem: &str) -> Result<ControlPlaneBuilder> {
        use rustls::pki_types::pem::PemObject;
        for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            self.roots
                .push(der.map_err(|e| Error::Http(format!("a root that does not read: {e}")))?);
        }
        Ok(self)
    }

    /// Trusts only the roots added, not Mozilla's.
    pub fn trust_only_added_roots(mut self) -> ControlPlaneBuilder {
        self.public_roots = false;
        self
    }

    /// How long one request may take (30 s unless given; a queue waited for with
    /// [`ControlPlane::wait_for_queue`] gets its wait on top).
    pub fn timeout(mut self, timeout: Duration) -> ControlPlaneBuilder {
        self.timeout = timeout;
        self
    }

    /// The client.
    pub fn build(self) -> Result<ControlPlane> {
        let mut base = Url::parse(&self.base)
            .map_err(|e| Error::Http(format!("{}: not a URL: {e}", self.base)))?;
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let mut tls = (*tls_client(&self.roots, self.public_roots)).clone();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(self.timeout)
            .build()
            .map_err(|e| Error::Http(e.to_string()))?;
        Ok(ControlPlane {
            http,
            base,
            token: self.token,
            timeout: self.timeout,
        })
    }
}

/// A queue's tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// For development and tests: 100 connections, sessions kept an hour.
    Devtest,
    /// For production.
    Standard,
}

/// Where a queue is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueStatus {
    /// Recorded; its node is being started.
    Provisioning,
    /// Its node serves.
    Running,
    /// Its node could not be started.
    Failed,
    /// Being deleted.
    Deleting,
    /// Deleted; the record stays, for billing.
    Deleted,
}

impl QueueStatus {
    fn name(self) -> &'static str {
        match self {
            QueueStatus::Provisioning => "provisioning",
            QueueStatus::Running => "running",
            QueueStatus::Failed => "failed",
            QueueStatus::Deleting => "deleting",
            QueueStatus::Deleted => "deleted",
        }
    }
}

/// What `POST /v1/queues` takes.
///
/// ```
/// use qe_client::control_plane::{NewQueue, Tier};
/// let queue = NewQueue::new(Tier::Standard, "us-east-1", "m4.xlarge").ipv4(true);
/// assert!(queue.ipv4 && queue.account.is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewQueue {
    /// Its tier.
    pub tier: Tier,
    /// A region the fleet offers.
    pub region: String,
    /// An instance type the fleet offers.
    pub instance_type: String,
    /// Whether it gets an IPv4 address too (it always has IPv6).
    pub ipv4: bool,
    /// The account it is for (the operator's choice; an account's key makes its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Its name within its account (SQS's rules: 1 to 80 of `A-Za-z0-9_-`), unique there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its tags, key → value (at most 50).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tags: std::collections::BTreeMap<String, String>,
    /// 2: a standby node beside its node, on which every durability-2 publish is synced
    /// too (the standard tier only); `None`: 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u8>,
}

impl NewQueue {
    /// A queue of this tier, region and instance type, without IPv4.
    pub fn new(
        tier: Tier,
        region: impl Into<String>,
        instance_type: impl Into<String>,
    ) -> NewQueue {
        NewQueue {
            tier,
            region: region.into(),
            instance_type: instance_type.into(),
            ipv4: false,
            account: None,
            name: None,
            tags: Default::default(),
            replicas: None,
        }
    }

    /// With this many nodes holding its messages: 1, or 2 with a standby.
    pub fn replicas(mut self, replicas: u8) -> NewQueue {
        self.replicas = Some(replicas);
        self
    }

    /// Named, within its account.
    pub fn name(mut self, name: impl Into<String>) -> NewQueue {
        self.name = Some(name.into());
        self
    }

    /// With this tag.
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> NewQueue {
        self.tags.insert(key.into(), value.into());
        self
    }

    /// With an IPv4 address.
    pub fn ipv4(mut self, ipv4: bool) -> NewQueue {
        self.ipv4 = ipv4;
        self
    }

    /// For this account (the operator's token only).
    pub fn account(mut self, account: impl Into<String>) -> NewQueue {
        self.account = Some(account.into());
        self
    }
}

/// A queue, as the API shows it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Queue {
    /// Its id (12 lowercase letters and digits).
    pub id: String,
    /// `QUEUE-ID.q.CLUSTER.DOMAIN`.
    pub host: String,
    /// Where to connect: its node once it runs, `wss://HOST/` until then.
    pub url: String,
    /// Where it is in its life.
    pub status: QueueStatus,
    /// Its tier.
    pub tier: Tier,
    /// Its region.
    pub region: String,
    /// Its instance type.
    pub instance_type: String,
    /// Whether it has an IPv4 address.
    pub ipv4: bool,
    /// Where its node listens now, once placed.
    #[serde(default)]
    pub node: Option<String>,
    /// The account it belongs to.
    #[serde(default)]
    pub account: Option<String>,
    /// Its numbers as its node last reported them, when it reported recently; `None` when
    /// they are not known (which is not zero).
    #[serde(default)]
    pub live: Option<LiveNumbers>,
    /// Why it failed, when it is `failed`.
    #[serde(default)]
    pub failure: Option<QueueFailure>,
    /// Which build its node runs, as the node said.
    #[serde(default)]
    pub node_build: Option<NodeBuild>,
    /// The build its node is told to run (a rollout); none: the one it was started with.
    #[serde(default)]
    pub desired_build: Option<BuildRef>,
    /// Its name within its account, if it has one (SQS clients name it so).
    #[serde(default)]
    pub name: Option<String>,
    /// Its tags.
    #[serde(default)]
    pub tags: std::collections::BTreeMap<String, String>,
    /// Nodes that hold its messages: 1, or 2 (its node and a standby).
    #[serde(default = "one")]
    pub replicas: u8,
    /// How many times its standby's copy has been promoted (README, *Epochs*): its node
    /// serves at this epoch.
    #[serde(default)]
    pub epoch: u64,
    /// Which of its two machines serves: `first` until a promotion onto the standby's
    /// machine (README, *On EC2 the standby is an instance of its own*); None from a control
    /// plane from before.
    #[serde(default)]
    pub serving: Option<String>,
}

fn one() -> u8 {
    1
}

/// The build a queue's node runs.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct NodeBuild {
    /// The `dataplane` package's version.
    pub version: String,
    /// SHA-256 (hex) of its binary.
    pub binary_sha256: String,
}

/// Why and when a queue failed (it did not run in time, or its provider refused it).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct QueueFailure {
    /// What went wrong, as the control plane says it.
    pub reason: String,
    /// When, in seconds since 1970.
    pub since: u64,
}

/// A queue's numbers as its node last reported them to the control plane (the queue view's
/// `live`): messages by where they are, connections, and how old the report is.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct LiveNumbers {
    /// Messages waiting for a subscriber with room.
    pub waiting: u64,
    /// Messages waiting for their delay to end.
    pub delayed: u64,
    /// Messages a subscriber holds: delivered, not acknowledged yet (in flight).
    pub held: u64,
    /// Messages in the dead letter queue.
    pub dead_letter: u64,
    /// Messages of durability 1 or 2.
    pub durable: u64,
    /// Open publisher connections.
    pub publishers: u64,
    /// Open subscriber connections.
    pub subscribers: u64,
    /// Open administrator connections.
    pub admins: u64,
    /// Saved subscriber sessions.
    pub saved_sessions: u64,
    /// How old the report is, in seconds.
    pub age_secs: f64,
    /// Its standby, for a queue with one.
    pub standby: Option<StandbyLag>,
}

/// How a queue's standby stands, as its node reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
pub struct StandbyLag {
    /// Caught up: durability 2 is synced on both nodes (and answered 507 while not).
    pub in_sync: bool,
    /// Bytes of the log the standby lacks, at most (in sync: written on the node and not yet
    /// synced on the standby; catching up: what it copies and what was written since; none
    /// attached: the whole log).
    pub lag_bytes: u64,
    /// How long none has stayed attached to the node, in milliseconds; 0 while one stays (one
    /// stays once attached for 30 s, at most half the silence limit). The control plane
    /// replaces a standby absent for its silence limit.
    #[serde(default)]
    pub absent_ms: u64,
}

/// A queue just made, with its three logins (shown this once).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct CreatedQueue {
    /// The queue.
    #[serde(flatten)]
    pub queue: Queue,
    /// Its logins.
    pub logins: Logins,
}

/// A queue's three logins.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Logins {
    /// The publisher's.
    pub publisher: Credentials,
    /// The subscriber's.
    pub subscriber: Credentials,
    /// The administrator's.
    pub admin: Credentials,
}

/// A login with a new password (shown this once).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct RotatedLogin {
    /// The name (unchanged).
    pub username: String,
    /// The new password.
    pub password: String,
    /// Whether the node confirmed it serves the new password (the old one is refused then);
    /// `false`: not within 10 s, the queue's config shows the change pending.
    pub applied: bool,
}

impl RotatedLogin {
    /// The login, to connect with.
    pub fn credentials(&self) -> Credentials {
        Credentials::new(&self.username, &self.password)
    }
}

/// Which days of records to read, and whose.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordQuery {
    /// The first day, `YYYY-MM-DD` (UTC); the first of this month unless given.
    pub from: Option<String>,
    /// The last day, included; today unless given.
    pub to: Option<String>,
    /// One queue's; all the caller's queues' unless given.
    pub queue: Option<String>,
    /// One account's queues (the operator's choice).
    pub account: Option<String>,
}

impl RecordQuery {
    fn pairs(&self) -> Vec<(&'static str, &str)> {
        [
            ("from", &self.from),
            ("to", &self.to),
            ("queue", &self.queue),
            ("account", &self.account),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.as_deref().map(|v| (name, v)))
        .collect()
    }
}

/// A usage record a node reported.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct UsageRecord {
    /// Whose.
    pub queue: String,
    /// The end of its period, in seconds since 1970.
    pub time: u64,
    /// Network bytes sent.
    #[serde(default)]
    pub network_sent: u64,
    /// Network bytes received.
    #[serde(default)]
    pub network_received: u64,
    /// Storage bytes written.
    #[serde(default)]
    pub storage_written: u64,
    /// Storage bytes read.
    #[serde(default)]
    pub storage_read: u64,
    /// Average bytes on disk over the period.
    #[serde(default)]
    pub storage_held: u64,
    /// The instance type.
    #[serde(default)]
    pub instance_type: String,
    /// The region.
    #[serde(default)]
    pub region: String,
    /// Whether the queue had an IPv4 address.
    #[serde(default)]
    pub ipv4: bool,
}

/// A stats record a node reported: the nine `getlivestats` counters at a time, and the
/// messages published and delivered in the interval it ends.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct StatsRecord {
    /// Whose.
    pub queue: String,
    /// When, in seconds since 1970.
    pub time: u64,
    /// Every message the queue held.
    pub messages: u64,
    /// Publisher connections.
    pub publishers: u64,
    /// Subscriber connections.
    pub subscribers: u64,
    /// Saved sessions.
    pub saved_subscribers: u64,
    /// Administrator connections.
    pub administrators: u64,
    /// Messages held, unacknowledged.
    pub unacknowledged: u64,
    /// Messages in the dead letter queue.
    pub dead_letter: u64,
    /// Delayed messages.
    pub delayed: u64,
    /// Durable messages.
    pub durable: u64,
    /// Messages published in the interval this record ends; None from a record that does
    /// not carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<u64>,
    /// Messages delivered to subscribers in the interval; None as for `published`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered: Option<u64>,
}

/// A month's bill: billable lines per queue, each queue's total, and the sum.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Invoice {
    /// The month, `YYYY-MM`.
    #[serde(default)]
    pub month: String,
    /// The account, when it is one account's.
    #[serde(default)]
    pub account: Option<String>,
    /// The lines.
    pub lines: Vec<BillLine>,
    /// Each queue's lines summed.
    pub queues: Vec<QueueTotal>,
    /// Every line summed, in dollars.
    pub total: f64,
}

/// One billable line.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct BillLine {
    /// Whose.
    pub queue: String,
    /// What: `instance TYPE in REGION`, `ipv4`, `network out`, `network in`, `storage`.
    pub item: String,
    /// How much.
    pub quantity: f64,
    /// Of what: `hours`, `GB`, `GB-months`.
    pub unit: String,
    /// Dollars per unit.
    pub unit_price: f64,
    /// Dollars, to a millionth.
    pub amount: f64,
}

/// A queue's lines summed.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct QueueTotal {
    /// Whose.
    pub queue: String,
    /// Dollars.
    pub total: f64,
}

#[derive(Deserialize)]
struct ApiError {
    error: ApiErrorBody,
}

#[derive(Deserialize)]
struct ApiErrorBody {
    code: String,
    message: String,
}

impl ControlPlane {
    /// A client of the API at `base_url` (`https://HOST[:PORT]/`), with `token`: the
    /// operator's, or an account's key.
    pub fn new(base_url: &str, token: impl Into<String>) -> Result<ControlPlane> {
        ControlPlane::builder(base_url, token).build()
    }

    /// A client with options of its own.
    pub fn builder(base_url: &str, token: impl Into<String>) -> ControlPlaneBuilder {
        ControlPlaneBuilder {
            base: base_url.to_string(),
            token: token.into(),
            roots: Vec::new(),
            public_roots: true,
            timeout: Duration::from_secs(30),
        }
    }

    fn url(&self, path: &str, query: &[(&str, &str)]) -> Result<Url> {
        let mut url = self
            .base
            .join(path)
            .map_err(|e| Error::Http(format!("{path}: {e}")))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T> {
        let request = request
            .bearer_auth(&self.token)
            .build()
            .map_err(|e| Error::Http(e.to_string()))?;
        let within = request.timeout().copied().unwrap_or(self.timeout);
        // A control plane that takes the connection and never answers is a timeout, said as
        // one (reqwest's own words are "error sending request").
        let failed = |error: reqwest::Error| match error.is_timeout() {
            true => Error::Timeout(within),
            false => Error::Http(error.to_string()),
        };
        let response = self.http.execute(request).await.map_err(failed)?;
        let status = response.status();
        let body = response.bytes().await.map_err(failed)?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<ApiError>(&body) {
                Ok(error) => Error::Api {
                    status: status.as_u16(),
                    code: error.error.code,
                    message: error.error.message,
                },
                Err(_) => Error::Api {
                    status: status.as_u16(),
                    code: String::new(),
                    message: String::from_utf8_lossy(&body).into_owned(),
                },
            });
        }
        Ok(serde_json::from_slice(&body)?)
    }

    /// `POST /v1/queues`: makes a queue (status `provisioning` at once; the control plane
    /// starts its node). The logins are shown this once.
    pub async fn create_queue(&self, queue: &NewQueue) -> Result<CreatedQueue> {
        let url = self.url("v1/queues", &[])?;
        self.call(self.http.post(url).json(queue)).await
    }

    /// `GET /v1/queues`: the caller's queues, deleted ones too.
    pub async fn queues(&self) -> Result<Vec<Queue>> {
        #[derive(Deserialize)]
        struct Queues {
            queues: Vec<Queue>,
        }
        let url = self.url("v1/queues", &[])?;
        let queues: Queues = self.call(self.http.get(url)).await?;
        Ok(queues.queues)
    }

    /// `GET /v1/queues/{id}`.
    pub async fn queue(&self, id: &str) -> Result<Queue> {
        let url = self.url(&format!("v1/queues/{id}"), &[])?;
        self.call(self.http.get(url)).await
    }

    /// `GET /v1/queues/{id}?until=STATUS`: the queue once it has `status`, or as it is after
    /// `within` (the API holds the request at most 120 s; check the status returned).
    pub async fn wait_for_queue(
        &self,
        id: &str,
        status: QueueStatus,
        within: Duration,
    ) -> Result<Queue> {
        let within = within.as_secs().min(120).to_string();
        let url = self.url(
            &format!("v1/queues/{id}"),
            &[("until", status.name()), ("within", &within)],
        )?;
        let wait = Duration::from_secs(within.parse().unwrap_or(0));
        self.call(self.http.get(url).timeout(wait + Duration::from_secs(30)))
            .await
    }

    /// `DELETE /v1/queues/{id}`: removes the queue's node; the record stays (status
    /// `deleted`, or `deleting` if that takes over 20 s).
    pub async fn delete_queue(&self, id: &str) -> Result<Queue> {
        let url = self.url(&format!("v1/queues/{id}"), &[])?;
        self.call(self.http.delete(url)).await
    }

    /// `POST /v1/queues/{id}/logins/{role}/rotate`: a new password for one login; open
    /// connections go on.
    pub async fn rotate_login(&self, id: &str, role: Role) -> Result<RotatedLogin> {
        let url = self.url(
            &format!("v1/queues/{id}/logins/{}/rotate", role.name()),
            &[],
        )?;
        self.call(self.http.post(url)).await
    }

    /// `GET /v1/usage`: the usage records the nodes reported.
    pub async fn usage(&self, query: &RecordQuery) -> Result<Vec<UsageRecord>> {
        #[derive(Deserialize)]
        struct Usage {
            usage: Vec<UsageRecord>,
        }
        let url = self.url("v1/usage", &query.pairs())?;
        let usage: Usage = self.call(self.http.get(url)).await?;
        Ok(usage.usage)
    }

    /// `GET /v1/stats`: the stats records the nodes reported.
    pub async fn stats(&self, query: &RecordQuery) -> Result<Vec<StatsRecord>> {
        #[derive(Deserialize)]
        struct Stats {
            stats: Vec<StatsRecord>,
        }
        let url = self.url("v1/stats", &query.pairs())?;
        let stats: Stats = self.call(self.http.get(url)).await?;
        Ok(stats.stats)
    }

    /// `GET /v1/bills`: a month's bill (`YYYY-MM`, this month unless given), for one queue or
    /// one account if given.
    pub async fn bill(
        &self,
        month: Option<&str>,
        queue: Option<&str>,
        account: Option<&str>,
    ) -> Result<Invoice> {
        let query: Vec<(&str, &str)> = [("month", month), ("queue", queue), ("account", account)]
            .into_iter()
            .filter_map(|(name, value)| value.map(|v| (name, v)))
            .collect();
        let url = self.url("v1/bills", &query)?;
        self.call(self.http.get(url)).await
    }

    /// `POST /v1/builds` (operator): publishes a node build, the `dataplane` binary, for
    /// rollouts. Uploads take as long as they take (no request timeout).
    pub async fn publish_build(&self, binary: Vec<u8>, label: Option<&str>) -> Result<Build> {
        let query: Vec<(&str, &str)> = label.map(|label| ("label", label)).into_iter().collect();
        let url = self.url("v1/builds", &query)?;
        let request = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .timeout(Duration::from_secs(3600))
            .body(binary);
        self.call(request).await
    }

    /// `GET /v1/builds` (operator): the installed build and the published ones.
    pub async fn builds(&self) -> Result<Builds> {
        let url = self.url("v1/builds", &[])?;
        self.call(self.http.get(url)).await
    }

    /// `POST /v1/rollouts` (operator): rolls build `binary_sha256` across the fleet in waves,
    /// `canary` (or the first queue) alone first.
    pub async fn start_rollout(&self, plan: &RolloutPlan) -> Result<Rollout> {
        let url = self.url("v1/rollouts", &[])?;
        self.call(self.http.post(url).json(plan)).await
    }

    /// `GET /v1/rollouts` (operator): newest first.
    pub async fn rollouts(&self) -> Result<Vec<Rollout>> {
        #[derive(Deserialize)]
        struct Rollouts {
            rollouts: Vec<Rollout>,
        }
        let url = self.url("v1/rollouts", &[])?;
        let rollouts: Rollouts = self.call(self.http.get(url)).await?;
        Ok(rollouts.rollouts)
    }

    /// `GET /v1/rollouts/{id}` (operator).
    pub async fn rollout(&self, id: &str) -> Result<Rollout> {
        let url = self.url(&format!("v1/rollouts/{id}"), &[])?;
        self.call(self.http.get(url)).await
    }

    /// `POST /v1/rollouts/{id}/{action}` (operator): `halt`, `resume` or `rollback`.
    pub async fn act_on_rollout(&self, id: &str, action: RolloutAction) -> Result<Rollout> {
        let action = match action {
            RolloutAction::Halt => "halt",
            RolloutAction::Resume => "resume",
            RolloutAction::Rollback => "rollback",
        };
        let url = self.url(&format!("v1/rollouts/{id}/{action}"), &[])?;
        self.call(self.http.post(url)).await
    }
}

/// A published node build.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Build {
    /// SHA-256 (hex) of the binary.
    pub sha256: String,
    /// Bytes.
    pub size: u64,
    /// `x86_64` or `aarch64`.
    pub architecture: String,
    /// The operator's name for it.
    #[serde(default)]
    pub label: Option<String>,
    /// When it was published, in seconds since 1970.
    pub published: u64,
}

/// A build as nodes are told of it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct BuildRef {
    /// SHA-256 (hex) of the binary.
    pub binary_sha256: String,
    /// Bytes.
    pub size: u64,
}

/// `GET /v1/builds`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Builds {
    /// What nodes start from.
    pub installed: Option<BuildRef>,
    /// The published ones.
    pub builds: Vec<Build>,
}

/// What `POST /v1/rollouts` is asked.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct RolloutPlan {
    /// The build to roll out.
    pub binary_sha256: String,
    /// The queue upgraded first, alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<String>,
    /// The wait after a wave is back before the next (default 60).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_secs: Option<u64>,
    /// How long a queue may take to come back on the build (default 300).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wave_timeout_secs: Option<u64>,
}

/// What an operator does to a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutAction {
    /// Nothing more is touched.
    Halt,
    /// A halted rollout rolls on.
    Resume,
    /// Every queue it reached is told the build it ran before.
    Rollback,
}

/// A rollout as the API shows it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Rollout {
    /// Its id.
    pub id: String,
    /// The build rolled out.
    pub build: BuildRef,
    /// `rolling`, `halted`, `done` or `rolled-back`.
    pub state: String,
    /// Why it halted.
    #[serde(default)]
    pub reason: Option<String>,
    /// When it started, in seconds since 1970.
    pub created: u64,
    /// Queue ids, wave by wave (the canary first).
    pub waves: Vec<Vec<String>>,
    /// The wave being rolled.
    pub wave: usize,
    /// Each queue's step (`waiting`, `upgrading`, `upgraded`, `refused`, `timed-out`,
    /// `skipped`, `rolled-back`) and the build it ran before.
    pub queues: std::collections::BTreeMap<String, RolloutStep>,
}

/// One queue's part in a rollout.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct RolloutStep {
    /// Where it is.
    pub step: String,
    /// SHA-256 of the build its node ran before.
    #[serde(default)]
    pub from: Option<String>,
    /// When it was told the build, in milliseconds since 1970.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub told_ms: Option<u64>,
    /// When its node came back on the build, in milliseconds since 1970.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgraded_ms: Option<u64>,
}
