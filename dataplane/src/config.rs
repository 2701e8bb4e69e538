//! The node's configuration: what one source gives ([`Given`]: a TOML file, or the control
//! plane's desired config, each read straight into the node's types), with the flags laid over
//! it ([`Config::merge`]).

use crate::auth::{Login, Logins, PasswordHash, SqsKey};
use crate::control_plane::replicas::ControlPlanes;
use crate::control_plane::ReportTo;
use crate::history::{RecordEvery, UsageLabels};
use clap::Parser;
use qe_shared::node_channel::{DesiredConfig, LoginHash, NodeTls, SqsKeySecret, LIVE_STATS_SECS};
use qe_shared::settings::{fixed, Tier};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Command-line flags; each overrides the same setting in `--config`.
#[derive(Debug, Parser, Default)]
#[command(name = "dataplane", about = "One queue node of The Queue Expert")]
pub struct Flags {
    /// Address to listen on, repeatable; port 0 picks a free one (the same one for every
    /// address). Default [::]:443.
    #[arg(long)]
    pub listen: Vec<SocketAddr>,
    /// Directory for the queue's data.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Serve ws:// without TLS (tests, local use).
    #[arg(long)]
    pub plaintext: bool,
    /// TLS certificate chain (PEM).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// The publisher's login, NAME:PASSWORD.
    #[arg(long, value_name = "NAME:PASSWORD")]
    pub publisher: Option<String>,
    /// The subscriber's login, NAME:PASSWORD.
    #[arg(long, value_name = "NAME:PASSWORD")]
    pub subscriber: Option<String>,
    /// The administrator's login, NAME:PASSWORD.
    #[arg(long, value_name = "NAME:PASSWORD")]
    pub admin: Option<String>,
    /// standard (default) or devtest.
    #[arg(long)]
    pub tier: Option<String>,
    /// Lowers max-messages below what memory allows.
    #[arg(long)]
    pub max_messages: Option<u64>,
    /// Lowers max-messages-memory (bytes) below what memory allows.
    #[arg(long)]
    pub max_messages_memory: Option<u64>,
    /// A TOML file with the same settings.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Start from a bootstrap file (control plane, queue id, node token, its root) and take
    /// everything else from the control plane. Not with --config.
    #[arg(long, conflicts_with = "config")]
    pub bootstrap: Option<PathBuf>,
    /// Serve nothing: hand the control plane every record the data directory holds that was
    /// never reported, with the last report, then exit (0 once received). The control plane
    /// runs this for a deleted queue whose node could not report as it stopped. Needs
    /// --bootstrap.
    #[arg(long, requires = "bootstrap")]
    pub report_last: bool,
    /// Size at which the message log starts a new segment file (tuning and tests).
    #[arg(long, hide = true)]
    pub log_segment_bytes: Option<u64>,
    /// Never compact the message log (benchmarks only: the log grows without bound).
    #[arg(long, hide = true)]
    pub no_compaction: bool,
    /// Seconds between pings of an idle connection (default 15; tests make it short).
    #[arg(long, hide = true)]
    pub ping_secs: Option<u64>,
    /// Seconds a peer may stay silent before it counts as gone (default 45).
    #[arg(long, hide = true)]
    pub silence_limit_secs: Option<u64>,
    /// Seconds a fragmented message has to arrive whole (default 30; tests make it short).
    #[arg(long, hide = true)]
    pub message_timeout_secs: Option<u64>,
    /// Seconds a connection with max-write-queue-bytes waiting may go without the socket
    /// taking a byte before its client counts as not reading (default 30).
    #[arg(long, hide = true)]
    pub write_stall_secs: Option<u64>,
    /// Serve the SQS face (docs/sqs.md) on this address too; port 0 picks a free one.
    #[arg(long)]
    pub sqs_listen: Option<SocketAddr>,
    /// An SQS access key, ROLE:ACCESS_KEY_ID:SECRET, repeatable (a lone node's; the control
    /// plane's nodes get theirs from it).
    #[arg(long, value_name = "ROLE:ACCESS_KEY_ID:SECRET")]
    pub sqs_key: Vec<String>,
    /// The key a standby gives on `/replicate` (a primary: durability 2 is then synced on
    /// the standby too), or gives its primary (with --standby-of). Also read from
    /// QE_REPLICATION_KEY, which other users cannot read (an argument they can). A node of
    /// the control plane's gets its hash in its config instead.
    #[arg(
        long,
        value_name = "KEY",
        env = "QE_REPLICATION_KEY",
        hide_env_values = true
    )]
    pub replication_key: Option<String>,
    /// Run as the standby of the primary at this address (ws:// or wss://): keep a copy of
    /// its message log in --data-dir and serve nothing. Needs --replication-key.
    #[arg(long, value_name = "URL", requires = "replication_key")]
    pub standby_of: Option<String>,
    /// The CA (PEM) a wss:// primary's certificate is checked against; without it, the
    /// public web's roots.
    #[arg(long, requires = "standby_of")]
    pub standby_ca: Option<PathBuf>,
    /// Connect to the primary here instead of resolving --standby-of's name (a name only the
    /// control plane's DNS knows); TLS still checks that name.
    #[arg(long, value_name = "ADDR", requires = "standby_of")]
    pub standby_connect: Option<SocketAddr>,
    /// The queue's epoch (with --replication-key): a primary serves at the higher of this
    /// and the one its data keeps; a standby follows no primary of a lower one. A node of the
    /// control plane's gets it in its config instead.
    #[arg(long, value_name = "N", requires = "replication_key")]
    pub epoch: Option<u64>,
}

/// The TOML file. Every field is optional here; the flags may supply what it lacks.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Address to listen on, or a list of them (one port for all). Default `[::]:443`.
    pub listen: Option<Listen>,
    /// Directory for the queue's data. Required (here or by flag).
    pub data_dir: Option<PathBuf>,
    /// Serve ws:// without TLS. Default false.
    #[serde(default)]
    pub plaintext: bool,
    /// TLS certificate chain (PEM file).
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM file).
    pub tls_key: Option<PathBuf>,
    /// `standard` (default) or `devtest`.
    pub tier: Option<Tier>,
    /// Lowers max-messages. Default: what memory allows.
    pub max_messages: Option<u64>,
    /// Lowers max-messages-memory, in bytes. Default: what memory allows.
    pub max_messages_memory: Option<u64>,
    /// The publisher's login (password as a hash).
    pub publisher: Option<LoginFile>,
    /// The subscriber's login (password as a hash).
    pub subscriber: Option<LoginFile>,
    /// The administrator's login (password as a hash).
    pub admin: Option<LoginFile>,
    /// Size at which the message log starts a new segment file. Default 16 MiB.
    pub log_segment_bytes: Option<u64>,
    /// Seconds between pings of an idle connection. Default 15.
    pub ping_secs: Option<u64>,
    /// Seconds a peer may stay silent before it counts as gone. Default 45.
    pub silence_limit_secs: Option<u64>,
    /// The machine type the queue runs on, for usage records. Default "local"; a label
    /// (`[a-z0-9][a-z0-9.-]{0,62}`).
    pub instance_type: Option<String>,
    /// The region it runs in, for usage records. Default "local"; a label.
    pub region: Option<String>,
    /// Whether the queue has an IPv4 address, for usage records. Default false.
    #[serde(default)]
    pub ipv4: bool,
    /// Where to push stats and usage records (the control plane's base URL). None: nowhere.
    pub control_plane: Option<String>,
    /// Every replica's base URL when the control plane runs as several; `control_plane` goes
    /// first (preferred), listed here or not, and the node fails over between them. Default:
    /// `control_plane` alone.
    #[serde(default)]
    pub control_planes: Vec<String>,
    /// The queue's id at the control plane.
    pub queue_id: Option<String>,
    /// This node's token for the control plane's node API.
    pub node_token: Option<String>,
    /// The root (PEM) that signs the control plane's HTTPS certificate, when it is a private
    /// one. Default: the system's roots.
    pub control_plane_ca: Option<PathBuf>,
    /// Serve TLS with the cluster certificate fetched from the control plane (kept in
    /// `DATA_DIR/tls/`), instead of files of its own.
    #[serde(default)]
    pub tls_from_control_plane: bool,
    /// Seconds between live reports to the control plane (its `/metrics`), 1 to 3600.
    /// Default 10 ([`LIVE_STATS_SECS`]).
    pub live_stats_secs: Option<u64>,
    /// For `controlplane dev` and tests only: a usage record this often (seconds, 1 to
    /// 1800) instead of at `usage-frequency-secs` (1800 at least, by the manual).
    pub usage_record_secs: Option<u64>,
    /// For `controlplane dev` and tests only: a stats record this often (seconds, 1 to 300)
    /// instead of at `stats-frequency-secs` (300 at least, by the manual).
    pub stats_record_secs: Option<u64>,
    /// Where the SQS face listens (docs/sqs.md). None: not served.
    pub sqs_listen: Option<SocketAddr>,
    /// The SQS face's access keys (from the control plane's desired config).
    #[serde(default)]
    pub sqs_keys: Vec<SqsKeyFile>,
    /// The SQS port's HTTP limits (`qe_serve::Limits`: head and idle time, connections in
    /// all and per source, body bytes read at once and their time); each left out keeps its
    /// default.
    pub sqs_http: Option<qe_serve::Limits>,
}

/// An SQS access key as the config holds it (SigV4 needs the secret itself).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SqsKeyFile {
    pub access_key_id: String,
    pub role: String,
    pub secret: String,
}

/// The PEM roots in `path`, checked to be certificates.
fn read_roots(path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    let fail =
        |what: String| ConfigError::Invalid(format!("control_plane_ca {}: {what}", path.display()));
    let pem = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(roots) if !roots.is_empty() => Ok(pem),
        Ok(_) => Err(fail("no certificate".into())),
        Err(error) => Err(fail(error.to_string())),
    }
}

/// A login as it rests in the file: never the password itself.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoginFile {
    pub username: String,
    /// `sha256:SALT_HEX:HASH_HEX`, where HASH = SHA-256(SALT ‖ password).
    pub password_hash: String,
}

/// `listen`: one address, or several.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Listen {
    One(SocketAddr),
    Several(Vec<SocketAddr>),
}

impl Listen {
    fn addresses(self) -> Vec<SocketAddr> {
        match self {
            Listen::One(addr) => vec![addr],
            Listen::Several(addrs) => addrs,
        }
    }
}

/// How the node serves connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Plaintext,
    Tls { cert: PathBuf, key: PathBuf },
}

/// The node's whole configuration, every choice made.
#[derive(Debug, Clone)]
pub struct Config {
    /// At least one address; they share one port.
    pub listen: Vec<SocketAddr>,
    pub data_dir: PathBuf,
    pub transport: Transport,
    pub tier: Tier,
    pub logins: Logins,
    pub max_messages: Option<u64>,
    pub max_messages_memory: Option<u64>,
    pub log_segment_bytes: Option<u64>,
    /// Never compact the message log (`--no-compaction`, for benchmarks).
    pub no_compaction: bool,
    pub keepalive: Keepalive,
    pub usage_labels: UsageLabels,
    /// The file read at start, read again for a change of logins.
    pub config_file: Option<PathBuf>,
    /// The logins flags gave (publisher, subscriber, admin): they win over the file, also on a
    /// reload.
    login_flags: [Option<String>; 3],
    pub message_timeout: Duration,
    pub report_to: Option<ReportTo>,
    /// The TLS files are the control plane's certificate, fetched by `report.rs`.
    pub tls_from_control_plane: bool,
    /// How often live numbers go to the control plane (`report.rs`).
    pub live_stats_every: Duration,
    /// Stats and usage records this often instead of at their frequency settings (dev and
    /// tests).
    pub record_every: RecordEvery,
    /// Where the SQS face listens, and its keys; None: not served.
    pub sqs: Option<SqsConfig>,
    /// The key a standby must give, hashed; None: the queue has no standby.
    pub replication_key: Option<PasswordHash>,
    /// The queue's epoch as given (`replication::epoch`); None: the one the data keeps.
    pub epoch: Option<u64>,
}

/// The SQS face's listener and access keys.
#[derive(Debug, Clone)]
pub struct SqsConfig {
    pub listen: SocketAddr,
    pub keys: Vec<SqsKey>,
    pub limits: qe_serve::Limits,
}

/// How often an idle connection is pinged, and how long a peer may stay silent (no frame,
/// not even a pong) before it counts as gone: a peer that vanished without a FIN is noticed
/// within `silence_limit` plus one `ping_every`. TCP keepalive (set at accept) backs this up.
/// A client whose outbox is full (`max-write-queue-bytes` wait for it) and whose socket takes
/// nothing for `write_stall_limit` does not read, and is cut off.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    pub ping_every: Duration,
    pub silence_limit: Duration,
    pub write_stall_limit: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            ping_every: Duration::from_secs(15),
            silence_limit: Duration::from_secs(45),
            write_stall_limit: WRITE_STALL_LIMIT,
        }
    }
}

/// How long a connection whose outbox is at `max-write-queue-bytes` may go without the socket
/// taking a byte before its client counts as not reading and is cut off.
pub const WRITE_STALL_LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad config file: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("{0}")]
    Invalid(String),
}

const DEFAULT_LISTEN: &str = "[::]:443";

/// What one source gives (a config file, or the control plane's desired config), read and
/// checked into the node's own types; the flags are laid over it ([`Config::merge`]). Each
/// source makes it straight from its own typed form: nothing goes back through text.
#[derive(Debug)]
pub struct Given {
    listen: Vec<SocketAddr>,
    data_dir: Option<PathBuf>,
    plaintext: bool,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    /// The certificate is the control plane's, fetched into `DATA_DIR/tls/` (the data
    /// directory the flags may still choose).
    tls_from_control_plane: bool,
    tier: Tier,
    max_messages: Option<u64>,
    max_messages_memory: Option<u64>,
    log_segment_bytes: Option<u64>,
    publisher: Option<Login>,
    subscriber: Option<Login>,
    admin: Option<Login>,
    usage_labels: UsageLabels,
    report_to: Option<ReportTo>,
    ping_secs: Option<u64>,
    silence_limit_secs: Option<u64>,
    live_stats_every: Duration,
    record_every: RecordEvery,
    sqs_listen: Option<SocketAddr>,
    sqs_keys: Vec<SqsKey>,
    sqs_limits: Option<qe_serve::Limits>,
    /// The standby's key, hashed: from the control plane's config only.
    replication_key: Option<PasswordHash>,
    /// The queue's epoch, from the control plane's config only.
    epoch: Option<u64>,
}

impl Given {
    /// What the control plane's desired config gives a node that keeps its data in
    /// `data_dir` and reports to `to`.
    pub fn from_desired(
        desired: &DesiredConfig,
        data_dir: &Path,
        to: ReportTo,
    ) -> Result<Given, ConfigError> {
        let (plaintext, tls_cert, tls_key, tls_from_control_plane) = match &desired.tls {
            NodeTls::None => (true, None, None, false),
            NodeTls::Queue { .. } => {
                let (cert, key) = own_certificate_paths(data_dir);
                (false, Some(cert), Some(key), false)
            }
            NodeTls::Cluster { .. } => (false, None, None, true),
        };
        let logins = desired_logins(desired).map_err(ConfigError::Invalid)?;
        let sqs = desired.sqs.as_ref();
        let sqs_keys = sqs.map_or(Ok(Vec::new()), |sqs| desired_sqs_keys(&sqs.keys));
        let replication_key = match &desired.replication {
            Some(replication) => Some(
                PasswordHash::parse(&replication.key_hash)
                    .ok_or_else(|| invalid("the replication key's hash is not one"))?,
            ),
            None => None,
        };
        Ok(Given {
            replication_key,
            epoch: desired.replication.as_ref().and_then(|r| r.epoch),
            listen: desired.listen.clone(),
            data_dir: Some(data_dir.to_path_buf()),
            plaintext,
            tls_cert,
            tls_key,
            tls_from_control_plane,
            tier: desired.tier,
            max_messages: desired.max_messages,
            max_messages_memory: desired.max_messages_memory,
            log_segment_bytes: None,
            publisher: Some(logins.publisher),
            subscriber: Some(logins.subscriber),
            admin: Some(logins.admin),
            usage_labels: UsageLabels {
                instance_type: label("instance_type", Some(desired.instance_type.clone()))?,
                region: label("region", Some(desired.region.clone()))?,
                ipv4: desired.ipv4,
            },
            report_to: Some(to),
            ping_secs: None,
            silence_limit_secs: None,
            live_stats_every: live_stats_every(desired.live_stats_secs)?,
            record_every: record_every(desired.stats_record_secs, desired.usage_record_secs)?,
            sqs_listen: sqs.and_then(|sqs| sqs.listen.first().copied()),
            sqs_keys: sqs_keys.map_err(ConfigError::Invalid)?,
            sqs_limits: None,
        })
    }
}

impl ConfigFile {
    pub fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
        Ok(toml::from_str(text)?)
    }

    /// What the file gives, checked.
    pub fn given(self) -> Result<Given, ConfigError> {
        if self.tls_from_control_plane && self.control_plane.is_none() {
            return Err(invalid("tls_from_control_plane needs control_plane"));
        }
        let login = |file: Option<LoginFile>, role: &str| file.map(|f| login_from_file(f, role));
        let sqs_keys = self.sqs_keys.iter().map(|key| {
            SqsKey::new(&key.role, &key.access_key_id, &key.secret)
                .ok_or_else(|| invalid("an SQS key's role, access_key_id or secret is not one"))
        });
        Ok(Given {
            report_to: report_to(
                self.control_plane,
                self.control_planes,
                self.queue_id,
                self.node_token,
                self.control_plane_ca,
            )?,
            listen: self.listen.map(Listen::addresses).unwrap_or_default(),
            data_dir: self.data_dir,
            plaintext: self.plaintext,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            tls_from_control_plane: self.tls_from_control_plane,
            tier: self.tier.unwrap_or_default(),
            max_messages: self.max_messages,
            max_messages_memory: self.max_messages_memory,
            log_segment_bytes: self.log_segment_bytes,
            publisher: login(self.publisher, "publisher").transpose()?,
            subscriber: login(self.subscriber, "subscriber").transpose()?,
            admin: login(self.admin, "admin").transpose()?,
            usage_labels: UsageLabels {
                instance_type: label("instance_type", self.instance_type)?,
                region: label("region", self.region)?,
                ipv4: self.ipv4,
            },
            ping_secs: self.ping_secs,
            silence_limit_secs: self.silence_limit_secs,
            live_stats_every: live_stats_every(self.live_stats_secs)?,
            record_every: record_every(self.stats_record_secs, self.usage_record_secs)?,
            sqs_listen: self.sqs_listen,
            sqs_keys: sqs_keys.collect::<Result<_, _>>()?,
            sqs_limits: self.sqs_http,
            replication_key: None,
            epoch: None,
        })
    }
}

/// The logins of a desired config, as the node checks them.
pub fn desired_logins(desired: &DesiredConfig) -> Result<Logins, String> {
    let login = |login: &LoginHash, role: &str| {
        let password = PasswordHash::parse(&login.password_hash)
            .ok_or_else(|| format!("{role}.password_hash is not sha256:SALT:HASH"))?;
        Ok::<_, String>(Login {
            username: login.username.clone(),
            password,
        })
    };
    Ok(Logins {
        publisher: login(&desired.logins.publisher, "publisher")?,
        subscriber: login(&desired.logins.subscriber, "subscriber")?,
        admin: login(&desired.logins.admin, "admin")?,
    })
}

/// The SQS keys a desired config gives, checked.
pub fn desired_sqs_keys(keys: &[SqsKeySecret]) -> Result<Vec<SqsKey>, String> {
    keys.iter()
        .map(|key| {
            SqsKey::new(&key.role, &key.access_key_id, &key.secret)
                .ok_or_else(|| format!("SQS key {} does not read", key.access_key_id))
        })
        .collect()
}

/// A usage label, "local" when not given; it goes into every usage record, so it must be one
/// ([`qe_shared::labels`]).
fn label(field: &str, value: Option<String>) -> Result<String, ConfigError> {
    let value = value.unwrap_or_else(|| "local".into());
    qe_shared::labels::check(field, &value).map_err(ConfigError::Invalid)?;
    Ok(value)
}

/// Seconds between live reports, [`LIVE_STATS_SECS`] when not given.
fn live_stats_every(secs: Option<u64>) -> Result<Duration, ConfigError> {
    let secs = secs.unwrap_or(LIVE_STATS_SECS);
    if !(1..=3600).contains(&secs) {
        return Err(invalid("live_stats_secs is 1 to 3600"));
    }
    Ok(Duration::from_secs(secs))
}

impl Config {
    /// Reads `--config` if given, then lays the flags over it.
    pub fn load(flags: Flags) -> Result<Config, ConfigError> {
        let file = match &flags.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                ConfigFile::parse(&text)?
            }
            None => ConfigFile::default(),
        };
        Config::merge(file.given()?, flags)
    }

    /// The config as the file has it now (flags still win; the transport stays): how a
    /// password rotated by the control plane, or its new address, reaches a running node.
    pub fn reread(&self) -> Result<Config, ConfigError> {
        let path = self
            .config_file
            .as_ref()
            .ok_or_else(|| ConfigError::Invalid("no --config to read logins from".into()))?;
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let given = ConfigFile::parse(&text)?.given()?;
        let [publisher, subscriber, admin] = self.login_flags.clone();
        // The transport as it is: only the logins are read again.
        let (plaintext, tls_cert, tls_key) = match &self.transport {
            Transport::Plaintext => (true, None, None),
            Transport::Tls { cert, key } => (false, Some(cert.clone()), Some(key.clone())),
        };
        let flags = Flags {
            publisher,
            subscriber,
            admin,
            plaintext,
            tls_cert,
            tls_key,
            data_dir: Some(self.data_dir.clone()),
            ..Flags::default()
        };
        Config::merge(given, flags)
    }

    /// Lays `flags` over what a source gave.
    pub fn merge(given: Given, flags: Flags) -> Result<Config, ConfigError> {
        let tier = match flags.tier.as_deref() {
            Some(name) => {
                Tier::parse(name).ok_or_else(|| invalid("--tier is standard or devtest"))?
            }
            None => given.tier,
        };
        let data_dir = flags
            .data_dir
            .clone()
            .or(given.data_dir.clone())
            .ok_or_else(|| invalid("--data-dir is required"))?;
        let transport = transport(&given, &flags, &data_dir)?;
        let login = |flag: &Option<String>, given: Option<Login>, role: &str| match (flag, given) {
            (Some(flag), _) => login_from_flag(flag, role),
            (None, Some(given)) => Ok(given),
            (None, None) => Err(ConfigError::Invalid(format!(
                "--{role} NAME:PASSWORD is required"
            ))),
        };
        let logins = Logins {
            publisher: login(&flags.publisher, given.publisher, "publisher")?,
            subscriber: login(&flags.subscriber, given.subscriber, "subscriber")?,
            admin: login(&flags.admin, given.admin, "admin")?,
        };
        let keepalive = Keepalive::of(&flags, given.ping_secs, given.silence_limit_secs);
        Ok(Config {
            sqs: sqs(&flags, given.sqs_keys, given.sqs_listen, given.sqs_limits)?,
            replication_key: flags
                .replication_key
                .as_deref()
                .map(PasswordHash::new)
                .or(given.replication_key),
            epoch: flags.epoch.or(given.epoch),
            live_stats_every: given.live_stats_every,
            record_every: given.record_every,
            tls_from_control_plane: given.tls_from_control_plane,
            report_to: given.report_to,
            listen: match (flags.listen, given.listen) {
                (flags, _) if !flags.is_empty() => flags,
                (_, given) if !given.is_empty() => given,
                _ => vec![DEFAULT_LISTEN.parse().expect("a valid default address")],
            },
            data_dir,
            transport,
            tier,
            logins,
            config_file: flags.config.clone(),
            login_flags: [flags.publisher, flags.subscriber, flags.admin],
            max_messages: flags.max_messages.or(given.max_messages),
            max_messages_memory: flags.max_messages_memory.or(given.max_messages_memory),
            log_segment_bytes: flags.log_segment_bytes.or(given.log_segment_bytes),
            no_compaction: flags.no_compaction,
            message_timeout: Duration::from_secs(
                flags
                    .message_timeout_secs
                    .unwrap_or(fixed::MESSAGE_TIMEOUT_SECS),
            ),
            usage_labels: given.usage_labels,
            keepalive,
        })
    }
}

fn invalid(text: &str) -> ConfigError {
    ConfigError::Invalid(text.to_string())
}

/// Plain ws://, or TLS with the files the flags or the source name (the control plane's
/// certificate, fetched into `DATA_DIR/tls/`, with `tls_from_control_plane`).
fn transport(given: &Given, flags: &Flags, data_dir: &Path) -> Result<Transport, ConfigError> {
    let (given_cert, given_key) = match given.tls_from_control_plane {
        true => {
            let dir = data_dir.join("tls");
            (Some(dir.join("cert.pem")), Some(dir.join("key.pem")))
        }
        false => (given.tls_cert.clone(), given.tls_key.clone()),
    };
    match (
        flags.plaintext || given.plaintext,
        flags.tls_cert.clone().or(given_cert),
        flags.tls_key.clone().or(given_key),
    ) {
        (true, None, None) => Ok(Transport::Plaintext),
        (false, Some(cert), Some(key)) => Ok(Transport::Tls { cert, key }),
        (true, _, _) => Err(invalid("--plaintext excludes --tls-cert and --tls-key")),
        (false, None, None) => Err(invalid("give --plaintext, or --tls-cert and --tls-key")),
        (false, _, _) => Err(invalid("--tls-cert and --tls-key go together")),
    }
}

/// Where the node reports, from the file's `control_plane`, `control_planes`, `queue_id`,
/// `node_token` and `control_plane_ca`: all of the first three, or none.
fn report_to(
    control_plane: Option<String>,
    control_planes: Vec<String>,
    queue_id: Option<String>,
    node_token: Option<String>,
    control_plane_ca: Option<PathBuf>,
) -> Result<Option<ReportTo>, ConfigError> {
    if !control_planes.is_empty() && control_plane.is_none() {
        return Err(invalid(
            "control_planes needs control_plane (the preferred one)",
        ));
    }
    match (control_plane, queue_id, node_token) {
        (Some(url), Some(queue_id), Some(token)) => Ok(Some(ReportTo {
            control_planes: ControlPlanes::new(&url, &control_planes),
            queue_id,
            token,
            ca_pem: match control_plane_ca {
                Some(path) => Some(read_roots(&path)?),
                None => None,
            },
        })),
        (None, None, None) => Ok(None),
        _ => Err(invalid(
            "control_plane, queue_id and node_token go together",
        )),
    }
}

/// Records more often than the settings allow (dev and tests), within their ranges.
fn record_every(
    stats_secs: Option<u64>,
    usage_secs: Option<u64>,
) -> Result<RecordEvery, ConfigError> {
    if usage_secs.is_some_and(|secs| !(1..=1800).contains(&secs)) {
        return Err(invalid("usage_record_secs is 1 to 1800"));
    }
    if stats_secs.is_some_and(|secs| !(1..=300).contains(&secs)) {
        return Err(invalid("stats_record_secs is 1 to 300"));
    }
    Ok(RecordEvery {
        stats_secs,
        usage_secs,
    })
}

/// The SQS face, if a listen address is given: the flags' keys and then the source's.
fn sqs(
    flags: &Flags,
    given_keys: Vec<SqsKey>,
    given_listen: Option<SocketAddr>,
    limits: Option<qe_serve::Limits>,
) -> Result<Option<SqsConfig>, ConfigError> {
    let from_flags = flags.sqs_key.iter().map(|text| {
        SqsKey::parse(text).ok_or_else(|| invalid("an SQS key is not ROLE:ACCESS_KEY_ID:SECRET"))
    });
    let mut keys = from_flags.collect::<Result<Vec<_>, _>>()?;
    keys.extend(given_keys);
    match flags.sqs_listen.or(given_listen) {
        Some(listen) => Ok(Some(SqsConfig {
            listen,
            keys,
            limits: limits.unwrap_or_default(),
        })),
        None if keys.is_empty() => Ok(None),
        None => Err(invalid("--sqs-key needs --sqs-listen")),
    }
}

impl Keepalive {
    /// The flags' times, else the source's, else the defaults.
    fn of(flags: &Flags, ping_secs: Option<u64>, silence_limit_secs: Option<u64>) -> Keepalive {
        let default = Keepalive::default();
        let secs = |flag: Option<u64>, given: Option<u64>, default: Duration| {
            flag.or(given).map_or(default, Duration::from_secs)
        };
        Keepalive {
            ping_every: secs(flags.ping_secs, ping_secs, default.ping_every),
            silence_limit: secs(
                flags.silence_limit_secs,
                silence_limit_secs,
                default.silence_limit,
            ),
            write_stall_limit: secs(flags.write_stall_secs, None, default.write_stall_limit),
        }
    }
}

/// The certificate chain and key files: `DATA_DIR/tls/own-cert.pem` and `own-key.pem` (apart
/// from a fetched cluster certificate's).
pub fn own_certificate_paths(data_dir: &Path) -> (PathBuf, PathBuf) {
    let dir = data_dir.join("tls");
    (dir.join("own-cert.pem"), dir.join("own-key.pem"))
}

fn login_from_flag(flag: &str, role: &str) -> Result<Login, ConfigError> {
    // The password may itself hold ':'; the name may not.
    let (username, password) = flag
        .split_once(':')
        .ok_or_else(|| ConfigError::Invalid(format!("--{role} takes NAME:PASSWORD")))?;
    Ok(Login {
        username: username.to_string(),
        password: PasswordHash::new(password),
    })
}

fn login_from_file(file: LoginFile, role: &str) -> Result<Login, ConfigError> {
    let password = PasswordHash::parse(&file.password_hash).ok_or_else(|| {
        ConfigError::Invalid(format!("{role}.password_hash is not sha256:SALT:HASH"))
    })?;
    Ok(Login {
        username: file.username,
        password,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        Flags::parse_from(std::iter::once("dataplane").chain(args.iter().copied()))
    }

    const LOGINS: [&str; 6] = [
        "--publisher",
        "p:pw",
        "--subscriber",
        "s:pw:with:colons",
        "--admin",
        "a:pw",
    ];

    #[test]
    fn flags_alone_make_a_config() {
        let mut args = vec![
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "/tmp/q",
            "--plaintext",
        ];
        args.extend(LOGINS);
        let config = Config::merge(ConfigFile::default().given().unwrap(), flags(&args)).unwrap();
        assert_eq!(config.listen, vec!["127.0.0.1:0".parse().unwrap()]);
        assert_eq!(config.transport, Transport::Plaintext);
        assert_eq!(config.tier, Tier::Standard);
        assert!(config.logins.subscriber.password.matches("pw:with:colons"));
    }

    #[test]
    fn listen_takes_one_address_or_a_list() {
        let text =
            "listen = [\"127.0.0.1:9000\", \"[::1]:9000\"]\ndata_dir = \"/q\"\nplaintext = true\n";
        let file = ConfigFile::parse(text).unwrap();
        let config = Config::merge(file.given().unwrap(), flags(&LOGINS)).unwrap();
        let both: Vec<SocketAddr> = vec![
            "127.0.0.1:9000".parse().unwrap(),
            "[::1]:9000".parse().unwrap(),
        ];
        assert_eq!(config.listen, both);
        let file = ConfigFile::parse("listen = \"[::1]:1\"\ndata_dir = \"/q\"\nplaintext = true\n")
            .unwrap();
        let mut args = vec!["--listen", "127.0.0.1:2", "--listen", "[::1]:2"];
        args.extend(LOGINS);
        let config = Config::merge(file.given().unwrap(), flags(&args)).unwrap();
        let flagged: Vec<SocketAddr> =
            vec!["127.0.0.1:2".parse().unwrap(), "[::1]:2".parse().unwrap()];
        assert_eq!(config.listen, flagged, "flags win");
        assert!(ConfigFile::parse("listen = 5\n").is_err());
    }

    #[test]
    fn flags_override_the_file() {
        let hash = PasswordHash::new("filepw").to_string();
        let text = format!(
            "listen = \"127.0.0.1:9000\"\ndata_dir = \"/tmp/a\"\nplaintext = true\ntier = \"devtest\"\n\
             max_messages = 50\n[publisher]\nusername = \"fp\"\npassword_hash = \"{hash}\"\n\
             [subscriber]\nusername = \"fs\"\npassword_hash = \"{hash}\"\n\
             [admin]\nusername = \"fa\"\npassword_hash = \"{hash}\"\n"
        );
        let file = ConfigFile::parse(&text).unwrap();
        let config = Config::merge(
            file.given().unwrap(),
            flags(&["--data-dir", "/tmp/b", "--admin", "x:y"]),
        )
        .unwrap();
        assert_eq!(config.listen, vec!["127.0.0.1:9000".parse().unwrap()]);
        assert_eq!(config.data_dir, PathBuf::from("/tmp/b"));
        assert_eq!(config.tier, Tier::Devtest);
        assert_eq!(config.max_messages, Some(50));
        assert!(config.logins.publisher.password.matches("filepw"));
        assert_eq!(config.logins.admin.username, "x");
    }

    #[test]
    fn the_control_plane_may_list_its_replicas() {
        let base = "data_dir = \"/q\"\nplaintext = true\nqueue_id = \"q\"\nnode_token = \"t\"\n";
        let report_to = |extra: &str| {
            let file = ConfigFile::parse(&format!("{base}{extra}")).unwrap();
            Config::merge(file.given()?, flags(&LOGINS)).map(|config| config.report_to.unwrap())
        };
        let alone = report_to("control_plane = \"https://cp1/\"\n").unwrap();
        assert_eq!(alone.control_planes.urls(), ["https://cp1"]);
        let listed = "control_plane = \"https://cp2\"\ncontrol_planes = [\"https://cp1\", \"https://cp2\"]\n";
        let listed = report_to(listed).unwrap();
        assert_eq!(
            listed.control_planes.urls(),
            ["https://cp2", "https://cp1"],
            "control_plane is the preferred"
        );
        assert!(report_to("control_planes = [\"https://cp1\"]\n").is_err());
    }

    #[test]
    fn live_reports_go_every_ten_seconds_unless_the_file_says() {
        let base = "data_dir = \"/q\"\nplaintext = true\n";
        let every = |extra: &str| {
            let file = ConfigFile::parse(&format!("{base}{extra}")).unwrap();
            Config::merge(file.given()?, flags(&LOGINS)).map(|config| config.live_stats_every)
        };
        assert_eq!(every("").unwrap(), Duration::from_secs(10));
        assert_eq!(
            every("live_stats_secs = 1\n").unwrap(),
            Duration::from_secs(1)
        );
        assert!(every("live_stats_secs = 0\n").is_err());
        assert!(every("live_stats_secs = 3601\n").is_err());
    }

    fn desired(password_hash: &str) -> DesiredConfig {
        use qe_shared::node_channel::{DesiredSqs, Logins as DesiredLogins};
        let login = |name: &str| LoginHash {
            username: name.into(),
            password_hash: password_hash.into(),
        };
        DesiredConfig {
            version: 1,
            tier: Tier::Devtest,
            listen: vec!["[::]:8443".parse().unwrap()],
            tls: NodeTls::Queue {
                host: "a.q.c.d".into(),
                generation: 1,
            },
            logins: DesiredLogins {
                publisher: login("p"),
                subscriber: login("s"),
                admin: login("a"),
            },
            instance_type: "t4g.small".into(),
            region: "eu-west-1".into(),
            ipv4: true,
            max_messages: Some(9),
            max_messages_memory: None,
            node_token: None,
            live_stats_secs: Some(2),
            usage_record_secs: None,
            stats_record_secs: None,
            sqs: Some(DesiredSqs {
                listen: vec!["[::]:9324".parse().unwrap()],
                keys: vec![SqsKeySecret {
                    access_key_id: "QEKEY1".into(),
                    role: "publisher".into(),
                    secret: "s3cret".into(),
                }],
            }),
            build: None,
            initial_settings: None,
            redrive: None,
            replication: None,
        }
    }

    #[test]
    fn a_desired_config_makes_the_config_and_flags_still_win() {
        let to = ReportTo {
            control_planes: ControlPlanes::new("https://cp1", &["https://cp2".into()]),
            queue_id: "q".into(),
            token: "t".into(),
            ca_pem: Some(b"the roots".to_vec()),
        };
        let hash = PasswordHash::new("pw").to_string();
        let data_dir = Path::new("/var/lib/q");
        let given = Given::from_desired(&desired(&hash), data_dir, to.clone()).unwrap();
        let args = [
            "--data-dir",
            "/var/lib/q",
            "--admin",
            "x:y",
            "--ping-secs",
            "1",
        ];
        let config = Config::merge(given, flags(&args)).unwrap();
        assert_eq!(config.listen, vec!["[::]:8443".parse().unwrap()]);
        let (cert, key) = own_certificate_paths(data_dir);
        assert_eq!(config.transport, Transport::Tls { cert, key });
        assert_eq!(config.tier, Tier::Devtest);
        assert_eq!(config.max_messages, Some(9));
        assert!(config.logins.publisher.password.matches("pw"));
        assert_eq!(config.logins.admin.username, "x", "a flag wins");
        assert_eq!(config.keepalive.ping_every, Duration::from_secs(1));
        assert_eq!(config.live_stats_every, Duration::from_secs(2));
        assert_eq!(config.usage_labels.region, "eu-west-1");
        assert!(config.usage_labels.ipv4);
        let report_to = config.report_to.unwrap();
        assert_eq!(report_to.control_planes.urls(), to.control_planes.urls());
        assert_eq!(
            report_to.ca_pem, to.ca_pem,
            "the bootstrap's roots, as they are"
        );
        let sqs = config.sqs.unwrap();
        assert_eq!(sqs.listen, "[::]:9324".parse().unwrap());
        assert_eq!(sqs.keys[0].access_key_id, "QEKEY1");
        assert_eq!(sqs.keys[0].role, qe_shared::protocol::Role::Publisher);
        assert!(Given::from_desired(&desired("sha256:zz"), data_dir, to).is_err());
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(ConfigFile::parse("no_such_setting = 1").is_err());
        let no_transport = Config::merge(
            ConfigFile::default().given().unwrap(),
            flags(&["--data-dir", "/d"]),
        );
        assert!(no_transport.is_err());
        let mut args = vec!["--data-dir", "/d", "--plaintext", "--tier", "gold"];
        args.extend(LOGINS);
        assert!(Config::merge(ConfigFile::default().given().unwrap(), flags(&args)).is_err());
        let mut args = vec!["--data-dir", "/d", "--plaintext", "--publisher", "nocolon"];
        args.extend(&LOGINS[2..]);
        assert!(Config::merge(ConfigFile::default().given().unwrap(), flags(&args)).is_err());
    }
}
