//! The node channel: what a node and its control plane say to each other, whatever runs the
//! node (a process beside the control plane, or a cloud instance behind NAT).
//!
//! The node opens every exchange, so it works from anywhere it can reach the control plane:
//! - `GET /v1/nodes/{id}/config?after=V` (long poll): the desired config once its version is
//!   past `V`, or `204` when nothing changed within [`WATCH_HOLD_SECS`];
//! - `POST /v1/nodes/{id}/applied` with [`Applied`]: the version the node now serves;
//! - `POST /v1/nodes/{id}/certificate` with [`CertificateRequest`]: a CSR for the queue's own
//!   name, answered with the chain ([`IssuedCertificate`]); the key never leaves the node;
//! - `POST /v1/nodes/{id}/reports` with [`NodeReport`]: usage and stats records, each a JSON
//!   object (labels are never joined into text a comma could split), answered with
//!   [`ReportReceipt`]; and, in a report of their own every [`LIVE_STATS_SECS`], the node's
//!   [`LiveStats`] for the control plane's `/metrics` (never stored, never sent again).
//!
//! - `POST /v1/nodes/{id}/redrive` with [`RedriveChange`]: SQS's `SetQueueAttributes` at the
//!   node naming another queue of the account as the dead letter target, or setting
//!   `RedriveAllowPolicy` (only the control plane knows the account's other queues),
//!   answered with the queue's [`DesiredRedrive`] now, or refused with SQS's error code.
//!
//! Every call carries the node's credential as a bearer token.

use crate::settings::Tier;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// How long the control plane holds a watch open before answering "no change".
pub const WATCH_HOLD_SECS: u64 = 25;

/// Seconds between a node's live reports ([`LiveStats`]) unless its desired config says
/// otherwise: under a 15 s Prometheus scrape, so each scrape sees a number at most this old.
pub const LIVE_STATS_SECS: u64 = 10;

/// The header a node's config requests carry, naming the fields it takes beyond those every
/// node takes (comma-separated, [`TAKES_REPLICATION`]). Asked on every request, so the first
/// config a node starts from already has them; a control plane from before ignores it, and
/// one answering a node that does not say leaves the fields out (the node reads its config
/// with `deny_unknown_fields`).
pub const TAKES_HEADER: &str = "qe-node-takes";
/// In [`TAKES_HEADER`]: the node takes [`DesiredConfig::replication`].
pub const TAKES_REPLICATION: &str = "replication";
/// In [`TAKES_HEADER`]: the node takes [`DesiredReplication::epoch`].
pub const TAKES_EPOCH: &str = "epoch";
/// In [`TAKES_HEADER`]: the node takes [`DesiredReplication::step_down_after_ms`].
pub const TAKES_STEP_DOWN: &str = "step-down";

/// What a node starts from, and nothing more: everything else comes over the channel.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bootstrap {
    /// The control plane's base URL (`https://HOST:PORT`): with several replicas, the
    /// preferred one.
    pub control_plane: String,
    /// Every replica's base URL when the control plane runs as several, the preferred first;
    /// the node fails over between them. Empty (and then left out, so the bootstrap reads as
    /// before for nodes that know no replicas): `control_plane` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub control_planes: Vec<String>,
    pub queue_id: String,
    /// The node's credential, sent as a bearer token. Empty in a cloud node's bootstrap, which
    /// rests in its user data (readable through EC2's API): that one carries a
    /// [`Bootstrap::bootstrap_token`] instead, and the node's first boot exchanges it for this,
    /// kept on the node's volume (`DATA_DIR/node-token`, which the node reads first).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_token: String,
    /// A cloud node's one-time token (`POST /v1/nodes/{id}/bootstrap`): valid for minutes,
    /// for one use, by one of its queue's instances; worth nothing once used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_token: Option<String>,
    /// The root (PEM) that signs the control plane's certificate, when it is a private one;
    /// it is then the only root trusted. None: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ca_pem: Option<String>,
}

impl std::fmt::Debug for Bootstrap {
    /// Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bootstrap({} as {})", self.control_plane, self.queue_id)
    }
}

/// A login as it travels and rests: never the password, only its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginHash {
    pub username: String,
    /// `sha256:SALT_HEX:HASH_HEX` ([`crate::password::PasswordHash`]).
    pub password_hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logins {
    pub publisher: LoginHash,
    pub subscriber: LoginHash,
    pub admin: LoginHash,
}

/// How the node serves its connections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum NodeTls {
    /// ws:// (local use without a certificate issuer).
    None,
    /// A certificate of the queue's own for `host`: the node makes the key and sends a CSR.
    /// A larger `generation` asks for a new one now (a forced renewal).
    Queue { host: String, generation: u64 },
    /// The cluster's wildcard certificate, fetched whole from the control plane (opt-in).
    Cluster { generation: u64 },
}

/// What the control plane wants a node to be. A node applies a version as a whole.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredConfig {
    /// Goes up with every change.
    pub version: u64,
    pub tier: Tier,
    /// Where to listen (one port for all); taken at start.
    pub listen: Vec<SocketAddr>,
    pub tls: NodeTls,
    pub logins: Logins,
    /// The labels its usage records carry.
    pub instance_type: String,
    pub region: String,
    pub ipv4: bool,
    #[serde(default)]
    pub max_messages: Option<u64>,
    #[serde(default)]
    pub max_messages_memory: Option<u64>,
    /// While the node's credential is being rotated: the new one. The node keeps it and uses
    /// it from then on; its first use retires the old one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_token: Option<String>,
    /// Seconds between the node's live reports, taken at start. None (and then left out, so
    /// the config reads as before to nodes that know no live reports): [`LIVE_STATS_SECS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_stats_secs: Option<u64>,
    /// For `controlplane dev` and tests only: a usage record this often (seconds, 1 to
    /// 1800) instead of at `usage-frequency-secs` (at least 1800 by the manual), so that a bill
    /// shows traffic soon after it; taken at start. None (left out) in production.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_record_secs: Option<u64>,
    /// For `controlplane dev` and tests only, as `usage_record_secs`: a stats record this
    /// often (seconds, 1 to 300) instead of at `stats-frequency-secs` (300 at least).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats_record_secs: Option<u64>,
    /// The SQS face (docs/sqs.md): where it listens (taken at start) and its access keys
    /// (applied at once). None: not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqs: Option<DesiredSqs>,
    /// The settings a new queue starts with (by name, as `setcfg` takes them): what
    /// SQS's `CreateQueue` asked for. Taken once, when no setting was ever saved (a node
    /// with its data keeps what it has: an administrator's `setcfg` since wins). None (left
    /// out): the tier's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_settings: Option<std::collections::BTreeMap<String, u64>>,
    /// The build the node is to run (a rolling upgrade, or its rollback): one that runs
    /// another fetches it (`GET /v1/nodes/{id}/builds/SHA256`), checks its hash and restarts
    /// into it, its data kept. None (left out, so older nodes read the config as before): the
    /// build it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<DesiredBuild>,
    /// Where the queue's dead letters go and which queues may send theirs to it (SQS's
    /// `RedrivePolicy` and `RedriveAllowPolicy`). Sent only to a node that said it takes it
    /// ([`Applied::takes_redrive`]); None (left out): the queue's own dead letter queue, and
    /// any queue of the account may name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive: Option<DesiredRedrive>,
    /// The queue has a standby (`replicas: 2`): the key it gives on `/replicate`, hashed.
    /// Taken at start (a node requires its standby from its first durability-2 reply). Sent
    /// only to a node that says it takes it ([`TAKES_HEADER`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<DesiredReplication>,
}

/// A queue's standby, as its primary knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredReplication {
    /// The replication key, as [`crate::password::PasswordHash`] writes it.
    pub key_hash: String,
    /// The queue's epoch: moved on by the control plane each time a standby's copy is
    /// promoted. A node serves at the highest epoch it has been given or kept, and one that
    /// hears of a higher one has been superseded and stops (docs/standby-design.md, *Epochs
    /// as built*). Sent only to a node that says it takes it ([`TAKES_EPOCH`]); None: the
    /// epoch its data keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// How long the control plane goes without the node's live reports before it takes the
    /// node for lost, and may promote its standby. A node that has had no report answered for
    /// this long, and no standby in sync, may have been replaced: it refuses durable
    /// publishes (502) until either comes back (docs/standby-design.md, *A node cut off from
    /// the control plane*). Sent only to a node that says it takes it ([`TAKES_STEP_DOWN`]);
    /// None: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_down_after_ms: Option<u64>,
    /// Given only to the queue's standby instance (its own credential, never the node's):
    /// the primary it follows, and the key it gives. A node started from a bootstrap whose
    /// config carries this runs as a standby (`dataplane::replication::standby`), serving
    /// nothing; None: it is the queue's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<FollowPrimary>,
}

/// Where a standby instance finds its primary, and what it proves itself with.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FollowPrimary {
    /// The primary's node address (`wss://QUEUE-ID.q.CLUSTER/`): the name its certificate
    /// is checked for.
    pub url: String,
    /// Where to connect instead of resolving the name: the primary instance's address (the
    /// name may already point at this one, a moment after a promotion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect: Option<SocketAddr>,
    /// The replication key itself (its hash is in the primary's config).
    pub key: String,
    /// The root (PEM) the primary's certificate chains to, when it is a private one (the
    /// control plane's local CA); None: the public web's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
}

impl std::fmt::Debug for FollowPrimary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowPrimary")
            .field("url", &self.url)
            .field("connect", &self.connect)
            .field("key", &"…")
            .finish_non_exhaustive()
    }
}

/// A queue's dead letter routing, kept by the control plane (docs/sqs.md, *Dead letters to
/// another queue*).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredRedrive {
    /// The queue of the account its dead letters are sent to; None: they stay in its own
    /// dead letter queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<DeadLetterTarget>,
    /// Its `RedriveAllowPolicy` as set (JSON text, checked); None: not set (every queue of
    /// the account may send it its dead letters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_policy: Option<String>,
}

/// Another queue of the account that takes a queue's dead letters, and how the node sends
/// them there: SQS's `SendMessageBatch` at its URL, signed with a key of its own that the
/// target's node knows (a publisher key derived for this source alone).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterTarget {
    /// Its ARN, as `RedrivePolicy`'s `deadLetterTargetArn` shows it.
    pub arn: String,
    pub queue_url: String,
    /// The region its requests are signed for.
    pub region: String,
    /// A FIFO queue (every send then needs a group).
    pub fifo: bool,
    pub access_key_id: String,
    pub secret: String,
    /// The roots (PEM) its node's certificate is checked against; None: the public web's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots_pem: Option<String>,
}

impl std::fmt::Debug for DeadLetterTarget {
    /// Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeadLetterTarget({} as {})",
            self.arn, self.access_key_id
        )
    }
}

/// A change to a queue's [`DesiredRedrive`] that SQS's `SetQueueAttributes` at its node asks
/// for (`POST /v1/nodes/{id}/redrive`). A field left out is left as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveChange {
    /// Another queue's ARN: its dead letters go there from now on; "": back to its own dead
    /// letter queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_target_arn: Option<String>,
    /// A `RedriveAllowPolicy` (JSON text); "": removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_policy: Option<String>,
}

/// Why the control plane refused a [`RedriveChange`]: SQS's error code and message, which the
/// node answers the SDK with (`400`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveRefused {
    pub code: String,
    pub message: String,
}

/// A node build the control plane wants a node to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredBuild {
    /// SHA-256 (hex) of the binary: what the node fetches by, and checks it against.
    pub binary_sha256: String,
    /// Its size in bytes (a download that grows past it is cut off).
    pub size: u64,
}

/// A node's SQS face, as the control plane wants it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredSqs {
    pub listen: Vec<SocketAddr>,
    /// The keys not revoked. SigV4 needs the secret itself to check a signature, so the node
    /// holds it (as it holds its credential: in memory, and in its 0600 kept config).
    pub keys: Vec<SqsKeySecret>,
}

/// One SQS access key as the node checks it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqsKeySecret {
    pub access_key_id: String,
    /// `publisher`, `subscriber` or `admin`.
    pub role: String,
    pub secret: String,
}

impl std::fmt::Debug for DesiredSqs {
    /// Never the secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<(&str, &str)> = self
            .keys
            .iter()
            .map(|key| (key.access_key_id.as_str(), key.role.as_str()))
            .collect();
        f.debug_struct("DesiredSqs")
            .field("listen", &self.listen)
            .field("keys", &keys)
            .finish()
    }
}

impl std::fmt::Debug for DesiredConfig {
    /// Never the rotated credential.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesiredConfig")
            .field("version", &self.version)
            .field("tier", &self.tier)
            .field("listen", &self.listen)
            .field("tls", &self.tls)
            .field("logins", &self.logins)
            .field("rotating_credential", &self.node_token.is_some())
            .field("sqs", &self.sqs)
            .field("build", &self.build)
            .finish_non_exhaustive()
    }
}

/// `POST /v1/nodes/{id}/applied`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Applied {
    pub version: u64,
    /// What the node runs (left out by nodes built before they said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<NodeBuild>,
    /// A build the node was asked to run and will not try again: it did not stay up (the node
    /// started again on the build it ran before), or its file did not check out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_build: Option<RefusedBuild>,
    /// Whether the node takes a build in its desired config (`DesiredConfig::build`): nodes
    /// built before rolling upgrades refuse a config with a field they do not know.
    #[serde(default, skip_serializing_if = "is_false")]
    pub accepts_builds: bool,
    /// Whether the node takes `DesiredConfig::initial_settings`: it is sent only to a node
    /// that said so, since nodes built before it refuse a config with a field they do not
    /// know.
    #[serde(default, skip_serializing_if = "is_false")]
    pub takes_initial_settings: bool,
    /// Whether the node takes `DesiredConfig::redrive`, for the same reason.
    #[serde(default, skip_serializing_if = "is_false")]
    pub takes_redrive: bool,
    /// Whether the node runs with a standby (durability 2 synced on both); None (left out):
    /// a node built before standbys, which never does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<bool>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// A build a node refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusedBuild {
    pub binary_sha256: String,
    pub reason: String,
}

/// Which build a node runs: what the operator compares with what the control plane serves
/// before and after an upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeBuild {
    /// The `dataplane` package's version.
    pub version: String,
    /// SHA-256 (hex) of the binary it runs, as the control plane's `dataplane_sha256`.
    pub binary_sha256: String,
}

/// `POST /v1/nodes/{id}/certificate`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateRequest {
    /// A PKCS#10 request for exactly the queue's host name.
    pub csr_pem: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuedCertificate {
    /// The leaf first, then the intermediates.
    pub chain_pem: String,
}

/// `POST /v1/nodes/{id}/reports`: new records of the node's history, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeReport {
    /// Usage records not reported yet, oldest first.
    #[serde(default)]
    pub usage: Vec<UsageRecord>,
    /// Stats records not reported yet, oldest first.
    #[serde(default)]
    pub stats: Vec<StatsRecord>,
    /// The node is stopping and this is its last report.
    #[serde(default, rename = "final")]
    pub last: bool,
    /// The node's numbers now. Sent alone, never with records: a control plane that does not
    /// know the field refuses that report only, and the records' own reports read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveStats>,
}

/// A node's numbers at one moment, for the control plane's `/metrics`: what its queue holds,
/// who is connected, its totals since it started (a restart starts them at 0 again, as
/// Prometheus counters expect) and its limits. The messages are the distribute queue's (the
/// copy queue type holds none); the connections and bytes are both types'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveStats {
    /// Messages waiting for a subscriber with room.
    pub waiting: u64,
    /// Messages waiting for their delay to end.
    pub delayed: u64,
    /// Messages a subscriber holds: delivered, not acknowledged yet.
    pub held: u64,
    /// Messages in the dead letter queue.
    pub dead_letter: u64,
    /// Messages of durability 1 or 2, the dead letter queue's included.
    pub durable: u64,
    /// Open connections by role, both queue types.
    pub publishers: u64,
    pub subscribers: u64,
    pub admins: u64,
    /// Subscriber sessions whose connection dropped, kept for a resume.
    pub saved_sessions: u64,
    /// Messages taken (a publish, an administrator's `addmsg`) since the node started.
    pub published: u64,
    /// Messages handed to a subscriber since the node started; one returned and handed out
    /// again counts again, a resend after a resume does not.
    pub delivered: u64,
    /// Acks and nacks since the node started (an administrator's `delmsg` or `movetodlq` is
    /// neither).
    pub acked: u64,
    pub nacked: u64,
    /// Bytes on the node's sockets since it started, as its usage records count them.
    pub network_received: u64,
    pub network_sent: u64,
    /// The manual's `messages-memory-used`, `max-messages` and `max-messages-memory`.
    pub messages_memory_used: u64,
    pub max_messages: u64,
    pub max_messages_memory: u64,
    /// When the certificate the node serves stops being valid, in seconds since 1970; None
    /// when it serves plain ws://.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_expires: Option<u64>,
    /// Log lines the node dropped since it started because its stderr did not take them in
    /// time (`logging`). Left out while 0, so a control plane of the release before (which
    /// refuses a field it does not know) reads the report as before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub log_lines_dropped: u64,
    /// A queue with a standby: whether it is in sync, and how far behind. None (left out):
    /// the queue has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<StandbyLag>,
}

/// How a primary's standby stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandbyLag {
    /// Attached and caught up: durability 2 is answered Success (synced on both).
    pub in_sync: bool,
    /// Bytes of the log the standby lacks, at most: in sync, written on the primary and not
    /// yet synced on the standby; catching up, what its catch-up copies and what was written
    /// since; with none attached, the whole log.
    pub lag_bytes: u64,
    /// How long no standby has stayed attached, in milliseconds: since the node started, or
    /// since the last one that had settled went away or was dropped; 0 while one stays. One
    /// that attaches settles after 30 s attached (at most half the silence limit); while it
    /// settles, this is how long it was gone before it came, and one dropped before it
    /// settles is absent throughout. The control plane replaces a standby absent for its
    /// silence limit (`reconciler.rs`). Left out while 0,
    /// so a control plane of the release before (which refuses a field it does not know)
    /// reads the report as before while the standby is attached.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub absent_ms: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// One usage record (the manual's `getusage` line): its period ends at `time`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageRecord {
    pub time: u64,
    pub network_sent: u64,
    pub network_received: u64,
    pub storage_written: u64,
    pub storage_read: u64,
    /// The average on-disk size over the period.
    pub storage_held: u64,
    pub instance_type: String,
    pub region: String,
    pub ipv4: bool,
}

impl UsageRecord {
    /// Reads one `getusage` line (`TIME,SENT,RECEIVED,WRITTEN,READ,HELD,TYPE,REGION,IPV4`);
    /// None if it is not one. Only for labels that hold no comma (as the node's own are:
    /// [`crate::labels`]).
    pub fn from_line(line: &str) -> Option<UsageRecord> {
        let fields: Vec<&str> = line.trim_end().split(',').collect();
        let [time, sent, received, written, read, held, instance_type, region, ipv4] =
            fields.as_slice()
        else {
            return None;
        };
        let number = |text: &str| text.parse::<u64>().ok();
        Some(UsageRecord {
            time: number(time)?,
            network_sent: number(sent)?,
            network_received: number(received)?,
            storage_written: number(written)?,
            storage_read: number(read)?,
            storage_held: number(held)?,
            instance_type: instance_type.to_string(),
            region: region.to_string(),
            ipv4: match *ipv4 {
                "0" => false,
                "1" => true,
                _ => return None,
            },
        })
    }
}

/// One stats record (the manual's `getstats` line): the counters of `getlivestats` at `time`,
/// and, from nodes that count them, the messages published and delivered in the interval
/// the record ends (since the record before it, or since the node started). The interval
/// counts travel to the control plane as two more columns of the line; `getstats` answers
/// the manual's nine columns only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsRecord {
    pub time: u64,
    pub messages: u64,
    pub publishers: u64,
    pub subscribers: u64,
    pub saved_subscribers: u64,
    pub administrators: u64,
    pub unacknowledged: u64,
    pub dead_letter: u64,
    pub delayed: u64,
    pub durable: u64,
    /// Messages taken in the interval (publishes and `addmsg`s); None from a record that
    /// does not carry them (made before nodes counted them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<u64>,
    /// Messages handed to subscribers in the interval (as [`LiveStats::delivered`] counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered: Option<u64>,
}

impl StatsRecord {
    /// The counters' names, in the manual's order (`getlivestats`).
    pub const COLUMNS: [&'static str; 9] = [
        "messages",
        "publishers",
        "subscribers",
        "saved_subscribers",
        "administrators",
        "unacknowledged",
        "dead_letter",
        "delayed",
        "durable",
    ];

    /// Reads one stats line: a `getstats` line (the time and nine counters), or a node's
    /// report of one with the interval's published and delivered after them; None if it is
    /// neither.
    pub fn from_line(line: &str) -> Option<StatsRecord> {
        let numbers: Vec<u64> = line
            .trim_end()
            .split(',')
            .map(|field| field.parse().ok())
            .collect::<Option<_>>()?;
        let (counters, interval) = match numbers.len() {
            10 => (numbers.as_slice(), None),
            12 => (&numbers[..10], Some((numbers[10], numbers[11]))),
            _ => return None,
        };
        let [time, messages, publishers, subscribers, saved_subscribers, administrators, unacknowledged, dead_letter, delayed, durable] =
            counters.try_into().ok()?;
        Some(StatsRecord {
            published: interval.map(|(published, _)| published),
            delivered: interval.map(|(_, delivered)| delivered),
            time,
            messages,
            publishers,
            subscribers,
            saved_subscribers,
            administrators,
            unacknowledged,
            dead_letter,
            delayed,
            durable,
        })
    }

    /// The counters, in [`StatsRecord::COLUMNS`]' order.
    pub fn counters(&self) -> [u64; 9] {
        [
            self.messages,
            self.publishers,
            self.subscribers,
            self.saved_subscribers,
            self.administrators,
            self.unacknowledged,
            self.dead_letter,
            self.delayed,
            self.durable,
        ]
    }
}

/// The answer to a report: per kind, how many of its records were new and how many were kept
/// already (sent again after a reply that was lost).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportReceipt {
    pub usage: Counted,
    pub stats: Counted,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counted {
    /// Records kept now.
    pub new: u64,
    /// Records kept before (the same time, sent again); the first one stays.
    pub already_kept: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_desired_config_reads_back_and_debug_hides_the_token() {
        let login = |name: &str| LoginHash {
            username: name.into(),
            password_hash: "sha256:00:11".into(),
        };
        let config = DesiredConfig {
            version: 3,
            tier: Tier::Devtest,
            listen: vec!["[::]:443".parse().unwrap()],
            tls: NodeTls::Queue {
                host: "a.q.c.d".into(),
                generation: 1,
            },
            logins: Logins {
                publisher: login("p"),
                subscriber: login("s"),
                admin: login("a"),
            },
            instance_type: "t4g.small".into(),
            region: "eu-west-1".into(),
            ipv4: false,
            max_messages: None,
            max_messages_memory: None,
            node_token: None,
            live_stats_secs: None,
            usage_record_secs: None,
            stats_record_secs: None,
            sqs: None,
            build: None,
            initial_settings: None,
            redrive: None,
            replication: None,
        };
        let text = serde_json::to_string(&config).unwrap();
        assert!(!text.contains("live_stats_secs"), "left out unless set");
        assert!(text.contains(r#""tls":{"mode":"queue","host":"a.q.c.d","generation":1}"#));
        assert_eq!(
            serde_json::from_str::<DesiredConfig>(&text).unwrap(),
            config
        );
        let bootstrap = Bootstrap {
            control_plane: "https://cp".into(),
            control_planes: vec![],
            queue_id: "q".into(),
            node_token: "secret-token".into(),
            bootstrap_token: None,
            control_plane_ca_pem: None,
        };
        assert!(!format!("{bootstrap:?}").contains("secret-token"));
    }

    #[test]
    fn a_report_of_records_reads_as_before_and_live_numbers_read_back() {
        let records = NodeReport::default();
        let text = serde_json::to_string(&records).unwrap();
        assert_eq!(text, r#"{"usage":[],"stats":[],"final":false}"#);
        let live = LiveStats {
            waiting: 3,
            acked: 7,
            certificate_expires: Some(1_800_000_000),
            ..LiveStats::default()
        };
        let report = NodeReport {
            live: Some(live),
            ..NodeReport::default()
        };
        let text = serde_json::to_string(&report).unwrap();
        assert!(text.contains(r#""waiting":3"#), "{text}");
        assert_eq!(serde_json::from_str::<NodeReport>(&text).unwrap(), report);
        let plain = serde_json::to_string(&LiveStats::default()).unwrap();
        assert!(!plain.contains("certificate_expires"), "{plain}");
    }

    #[test]
    fn a_bootstrap_lists_replicas_only_when_there_are_several() {
        // (TOML on disk; the same serde rules in JSON here, which this crate has.)
        let old = r#"{"control_plane":"https://cp","queue_id":"q","node_token":"t"}"#;
        let read: Bootstrap = serde_json::from_str(old).unwrap();
        assert!(
            read.control_planes.is_empty(),
            "one from before replicas still reads"
        );
        assert_eq!(
            serde_json::to_string(&read).unwrap(),
            old,
            "and is written the same"
        );
        let replicas = Bootstrap {
            control_planes: vec!["https://cp1".into(), "https://cp2".into()],
            ..read
        };
        let text = serde_json::to_string(&replicas).unwrap();
        assert!(
            text.contains(r#""control_planes":["https://cp1","https://cp2"]"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Bootstrap>(&text).unwrap(), replicas);
    }
}
