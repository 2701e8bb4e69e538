//! The control plane's configuration: one TOML file, flags override it.

use crate::certificates::local_ca::LocalCa;
use crate::certificates::Issuer;
use crate::model::queue::Tier;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address of the operator API. Default `127.0.0.1:8443`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Where the control plane keeps its state and its local nodes' data. Required.
    pub data_dir: PathBuf,
    /// The operator's bearer token for the API. Required.
    pub token: String,
    /// A token that reads `GET /metrics` and nothing else, for Prometheus (which then need
    /// not hold the operator's). Default: none, only the operator's token reads them.
    pub metrics_token: Option<String>,
    /// The cluster's name, in every queue's host name. Default `local`.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// The domain under which clusters live. Default `thequeueexpert.com`.
    #[serde(default = "default_domain")]
    pub domain: String,
    /// The `dataplane` binary the local provider runs. Default: beside this binary.
    pub dataplane: Option<PathBuf>,
    /// Where the authoritative DNS for `q.CLUSTER.DOMAIN` answers (UDP and TCP). Default: no
    /// DNS server.
    pub dns_listen: Option<SocketAddr>,
    /// The name server's name as the parent zone delegates `q.CLUSTER.DOMAIN` to it (with
    /// glue there), for the zone's NS record. Default: `ns.q.CLUSTER.DOMAIN` at the address
    /// of `dns_listen` (local use). One of `dns_names`, which says it for several.
    pub dns_name: Option<String>,
    /// The names the parent zone delegates `q.CLUSTER.DOMAIN` to, one per server that
    /// answers for it (each control-plane replica, each outside secondary): the zone's NS
    /// records, the first its SOA's primary. `dns_name`, if also given, must be the first.
    /// Default: `dns_name` alone.
    #[serde(default)]
    pub dns_names: Vec<String>,
    /// The sources allowed zone transfers (AXFR, IXFR) over TCP, as CIDR blocks
    /// (`["192.0.2.53/32", "2001:db8::/64"]`): the outside secondaries; with `[dns_tsig]`
    /// they must also sign with its key. Default: none, every transfer REFUSED.
    #[serde(default)]
    pub dns_transfer_allow: Vec<crate::dns::Cidr>,
    /// Where each secondary takes NOTIFY (`["192.0.2.53:53"]`), sent over UDP each time the
    /// zone's serial moves. Default: none.
    #[serde(default)]
    pub dns_notify: Vec<SocketAddr>,
    /// A TSIG key (HMAC-SHA256) shared with the outside secondaries: transfers must be signed
    /// with it, NOTIFYs are, and so is every answer to a request signed with it. Default: none,
    /// transfers by address alone.
    pub dns_tsig: Option<DnsTsig>,
    /// The ACME CA the cluster's certificate comes from. Default: none.
    pub acme: Option<crate::certificates::acme::AcmeConfig>,
    /// Issue the cluster's certificate from a CA of our own, kept in `DATA_DIR/local-ca/`
    /// (for local use: clients must trust its `ca.pem`). Not with `[acme]`. Default false.
    #[serde(default)]
    pub local_ca: bool,
    /// Serve the API over HTTPS with this certificate (TLS 1.2 and 1.3). Default: plain
    /// HTTP, which is refused on any address but loopback unless `insecure_plain_http`.
    pub api_tls: Option<ApiTls>,
    /// `[http]`: the API port's limits, `head_within_secs` (default 20: a request's head must
    /// arrive within it, and a kept-alive connection may sit idle no longer) and `connections`
    /// (default 4096 at once; past it new ones wait in the kernel's backlog).
    #[serde(default)]
    pub http: HttpLimits,
    /// Allow plain HTTP on an address that is not loopback (tokens and node credentials then
    /// cross the network in the clear). Default false.
    #[serde(default)]
    pub insecure_plain_http: bool,
    /// One wildcard certificate for the cluster, handed to every node, instead of a
    /// certificate per queue whose key never leaves its node. Only for a CA whose rate limits
    /// cannot take a certificate per queue: every node then holds a key that serves every
    /// queue's name. Default false.
    #[serde(default)]
    pub wildcard_certificate: bool,
    /// The control plane's URL as nodes reach it. Default: the API's own address.
    pub node_url: Option<String>,
    /// Every replica's URL as nodes reach it, when several share one store
    /// (`["https://cp1:8443", "https://cp2:8443"]`): nodes fail over between them, the first
    /// preferred. `node_url`, if also given, must be that first one. Default: `node_url`
    /// alone.
    pub node_urls: Option<Vec<String>>,
    /// Seconds between each node's live reports (`/metrics`), 1 to 3600, told to nodes in
    /// their desired config and taken when they start. Default: the nodes' own, 10
    /// ([`qe_shared::node_channel::LIVE_STATS_SECS`]).
    pub live_stats_secs: Option<u64>,
    /// For `controlplane dev` and tests only: nodes make a usage record this often (seconds,
    /// 1 to 1800) instead of at their `usage-frequency-secs` (1800 at least, by the manual),
    /// so that usage and bills show traffic soon after it. Unset in production.
    pub usage_record_secs: Option<u64>,
    /// For `controlplane dev` and tests only, as `usage_record_secs`: a stats record this
    /// often (seconds, 1 to 300) instead of at `stats-frequency-secs` (300 at least), so the
    /// console's plots fill in minutes. Unset in production.
    pub stats_record_secs: Option<u64>,
    /// Seconds between the reconciler's looks at every queue when nothing wakes it (an
    /// instance that vanished is replaced within this). Default 30.
    #[serde(default = "default_reconcile_every_secs")]
    pub reconcile_every_secs: u64,
    /// A node not heard from for this many live-report intervals (`live_stats_secs`) is
    /// fenced and replaced on its data (a hung process or instance, a lost network); 0 never
    /// replaces one. Default 6: a minute with the default interval.
    #[serde(default = "default_replace_silent_after_intervals")]
    pub replace_silent_after_intervals: u64,
    /// Seconds a deleted queue's data is kept, at most, for the last report of its node (its
    /// last usage record, billed): a node that could not report as it stopped (its control
    /// plane was down) has its records handed over from its data. Default 86400, a day.
    #[serde(default = "default_delete_keeps_data_secs")]
    pub delete_keeps_data_secs: u64,
    /// Days the audit log keeps an entry; older ones are removed by the leading replica
    /// (`rollup.rs`, within an hour of their time). 0 keeps them for ever. Default 90.
    #[serde(default = "default_audit_keep_days")]
    pub audit_keep_days: u64,
    /// Entries the audit log keeps at most, the newest; the oldest past it go within the
    /// hour, as old ones do (each account's own are also kept to its `max_audit_entries`).
    /// 0 keeps them all. Default 1,000,000.
    #[serde(default = "default_audit_keep_entries")]
    pub audit_keep_entries: u64,
    /// Seconds a new queue has to run (its node started and serving); one that does not, or
    /// whose provider refuses it for good (an instance type its region does not have), is
    /// `failed`, with the reason: its node is stopped and its data kept for
    /// `delete_keeps_data_secs`. Default 900.
    #[serde(default = "default_provision_within_secs")]
    pub provision_within_secs: u64,
    /// Seconds a cloud node's bootstrap token (in its user data) may be exchanged for its node
    /// token, from its launch (`api/bootstrap.rs`). The first boot exchanges it within a
    /// minute or two of the launch; a node that could not is replaced as silent. Default 900.
    #[serde(default = "default_bootstrap_token_valid_secs")]
    pub bootstrap_token_valid_secs: u64,
    /// Which instance types, in which regions, new queues may ask for, per tier and per
    /// account (`[[allow]]` rules, [`crate::policy`]): anything else is refused with 400.
    /// Default: no rules, whatever the provider can run.
    #[serde(default)]
    pub allow: Vec<crate::policy::Allow>,
    /// What runs the nodes. Default: processes on this machine (`kind = "local"`).
    #[serde(default)]
    pub provider: ProviderConfig,
    /// Where the local provider keeps its nodes (`nodes/QUEUE-ID/`). Default: `data_dir`.
    /// Replicas on one machine share one, so that a new leader adopts the nodes the last one
    /// started.
    pub local_nodes_dir: Option<PathBuf>,
    /// The price table bills are made with, in dollars. Default: everything free.
    #[serde(default)]
    pub prices: Prices,
    /// Where the state lives: sled in `DATA_DIR/state` (default: one control plane), or an
    /// etcd cluster that several replicas share (`kind = "etcd"`, `endpoints = [...]`).
    #[serde(default)]
    pub store: crate::store::StoreConfig,
    /// The SQS endpoint (`POST /` on the API's port, docs/sqs.md): how queues `CreateQueue`
    /// makes are made, and where clients reach it.
    #[serde(default)]
    pub sqs: SqsConfig,
}

/// `[provider]`: what runs the queues' nodes.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "lowercase")]
pub enum ProviderConfig {
    /// A `dataplane` process per queue beside the control plane.
    #[default]
    Local,
    /// An EC2 instance per queue, its data on an EBS volume of its own.
    Ec2(Ec2Config),
}

/// `[provider]` with `kind = "ec2"`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Ec2Config {
    /// The cloud-init template nodes boot from. Default: `infra/cloud-init/node.yaml` as
    /// built in.
    pub cloud_init: Option<PathBuf>,
    /// The EC2 endpoint instead of AWS's (an emulator). Default: AWS.
    pub endpoint: Option<String>,
    /// A queue's data volume, in GiB. Default 20.
    #[serde(default = "default_volume_size_gib")]
    pub volume_size_gib: i32,
    /// Its EBS type. Default `gp3`.
    #[serde(default = "default_volume_type")]
    pub volume_type: String,
    /// Where instances go, by AWS region name: a queue's `region` must be one of these.
    pub regions: std::collections::BTreeMap<String, Ec2Region>,
    /// Seconds a new instance has to boot and report before its silence counts
    /// (`replace_silent_after_intervals`). Default 300.
    #[serde(default = "default_boot_within_secs")]
    pub boot_within_secs: u64,
}

fn default_boot_within_secs() -> u64 {
    300
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Ec2Region {
    pub image_id: String,
    pub subnet_id: String,
    pub security_group_ids: Vec<String>,
    /// A dual-stack subnet in another availability zone, for queues' standbys (`replicas:
    /// 2`); without it, the region takes no queue with a standby.
    #[serde(default)]
    pub standby_subnet_id: Option<String>,
}

fn default_reconcile_every_secs() -> u64 {
    30
}

fn default_replace_silent_after_intervals() -> u64 {
    6
}

fn default_provision_within_secs() -> u64 {
    900
}

fn default_bootstrap_token_valid_secs() -> u64 {
    900
}

fn default_audit_keep_days() -> u64 {
    90
}

fn default_audit_keep_entries() -> u64 {
    1_000_000
}

fn default_delete_keeps_data_secs() -> u64 {
    86400
}

fn default_volume_size_gib() -> i32 {
    20
}

fn default_volume_type() -> String {
    "gp3".into()
}

/// `[prices]`: what each billable unit costs, in dollars.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Prices {
    /// An instance-hour by `"REGION/INSTANCE_TYPE"`; the key `"*"` prices any other.
    pub instance_hour: std::collections::BTreeMap<String, f64>,
    pub ipv4_hour: f64,
    pub network_out_gb: f64,
    pub network_in_gb: f64,
    pub storage_gb_month: f64,
}

impl Prices {
    pub fn instance_hour(&self, region: &str, instance_type: &str) -> f64 {
        let key = format!("{region}/{instance_type}");
        let price = self.instance_hour.get(&key).or(self.instance_hour.get("*"));
        price.copied().unwrap_or(0.0)
    }
}

fn default_listen() -> SocketAddr {
    "127.0.0.1:8443".parse().expect("a valid default")
}

fn default_cluster() -> String {
    "local".into()
}

fn default_domain() -> String {
    "thequeueexpert.com".into()
}

impl Config {
    pub fn parse(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str(text)
    }

    /// Where the cluster's certificate comes from, if it has one (then nodes serve TLS).
    pub fn certificate_issuer(&self) -> Result<Option<Issuer>, String> {
        match (&self.acme, self.local_ca) {
            (Some(_), true) => Err("`[acme]` and `local_ca` do not go together".into()),
            (Some(acme), false) => Ok(Some(Issuer::Acme(acme.clone()))),
            (None, true) => {
                let ca =
                    LocalCa::open(&self.data_dir.join("local-ca")).map_err(|e| e.to_string())?;
                Ok(Some(Issuer::LocalCa(Box::new(ca))))
            }
            (None, false) => Ok(None),
        }
    }

    /// Refuses what would expose secrets: plain HTTP off loopback.
    pub fn check(&self) -> Result<(), String> {
        let ip = self.listen.ip();
        if self.api_tls.is_none() && !ip.is_loopback() && !self.insecure_plain_http {
            return Err(format!(
                "the API would listen on {} over plain HTTP: give [api_tls], a loopback \
                 address, or insecure_plain_http = true",
                self.listen
            ));
        }
        if let Some(urls) = &self.node_urls {
            // Replicas on sled would each keep a state of their own, and each take the
            // others' nodes for leftovers.
            if urls.len() > 1 && self.store == crate::store::StoreConfig::Sled {
                return Err(
                    "node_urls lists several replicas: they share one store, [store] kind = \"etcd\""
                        .into(),
                );
            }
            match urls.first() {
                None => return Err("node_urls lists no URL".into()),
                Some(first) if self.node_url.as_ref().is_some_and(|url| url != first) => {
                    return Err(format!(
                        "node_url is not node_urls' first ({first}), the preferred: give \
                         node_urls alone"
                    ));
                }
                Some(_) => {}
            }
        }
        self.check_dns()?;
        if self.http.connections == 0 || self.http.head_within_secs == 0 {
            return Err("[http] connections and head_within_secs are 1 at least".into());
        }
        if self
            .live_stats_secs
            .is_some_and(|secs| !(1..=3600).contains(&secs))
        {
            return Err("live_stats_secs is 1 to 3600".into());
        }
        if self
            .usage_record_secs
            .is_some_and(|secs| !(1..=1800).contains(&secs))
        {
            return Err("usage_record_secs is 1 to 1800".into());
        }
        if self
            .stats_record_secs
            .is_some_and(|secs| !(1..=300).contains(&secs))
        {
            return Err("stats_record_secs is 1 to 300".into());
        }
        Ok(())
    }

    /// How long a node may go unheard before it is replaced; `None`: never.
    pub fn silent_after(&self) -> Option<std::time::Duration> {
        crate::silence::silent_after(self.replace_silent_after_intervals, self.live_stats_secs())
    }

    /// After how long without its live reports answered a node of a replicated queue steps
    /// down (`DesiredReplication::step_down_after_ms`): one report interval before
    /// [`Config::silent_after`], since the leader judges a node by when the replicas say they
    /// last heard it, which each says once an interval. Never less than a second.
    pub fn step_down_after(&self) -> Option<std::time::Duration> {
        let interval = std::time::Duration::from_secs(self.live_stats_secs());
        let limit = self.silent_after()?;
        Some(
            limit
                .saturating_sub(interval)
                .max(std::time::Duration::from_secs(1)),
        )
    }

    /// Seconds between each node's live reports: what nodes are told, or their default.
    pub fn live_stats_secs(&self) -> u64 {
        self.live_stats_secs
            .unwrap_or(qe_shared::node_channel::LIVE_STATS_SECS)
    }

    /// Refuses DNS settings that cannot all hold: two first name servers, or secondaries
    /// without a DNS server.
    fn check_dns(&self) -> Result<(), String> {
        if let (Some(name), Some(first)) = (&self.dns_name, self.dns_names.first()) {
            if name.trim_end_matches('.') != first.trim_end_matches('.') {
                return Err(format!(
                    "dns_name is not dns_names' first ({first}), the SOA's primary: give \
                     dns_names alone"
                ));
            }
        }
        let secondaries = !self.dns_transfer_allow.is_empty() || !self.dns_notify.is_empty();
        if secondaries && self.dns_listen.is_none() {
            return Err("dns_transfer_allow and dns_notify need dns_listen".into());
        }
        if self.dns_tsig.is_some() && !secondaries {
            return Err(
                "[dns_tsig] signs for secondaries: give dns_transfer_allow or dns_notify".into(),
            );
        }
        Ok(())
    }

    /// The TSIG key `[dns_tsig]` names, its secret read from its file; none without one.
    pub fn dns_tsig_key(&self) -> Result<Option<crate::dns::TsigKey>, String> {
        let Some(tsig) = &self.dns_tsig else {
            return Ok(None);
        };
        let file = tsig.secret_file.display();
        let secret = std::fs::read_to_string(&tsig.secret_file)
            .map_err(|e| format!("[dns_tsig] secret_file {file}: {e}"))?;
        crate::dns::TsigKey::new(&tsig.key_name, &secret)
            .map(Some)
            .map_err(|e| format!("[dns_tsig] ({file}): {e}"))
    }

    /// The names the zone's NS records give, the SOA's primary first: `dns_names`, else
    /// `dns_name`; none for a zone that names its own server (local use).
    pub fn dns_names(&self) -> Vec<String> {
        match (self.dns_names.is_empty(), &self.dns_name) {
            (false, _) => self.dns_names.clone(),
            (true, Some(name)) => vec![name.clone()],
            (true, None) => Vec::new(),
        }
    }

    /// The URLs nodes reach the control plane at, one per replica, the preferred first:
    /// `node_urls`, else `node_url`, else `derived` (the API's own address).
    pub fn node_urls_or(&self, derived: String) -> Vec<String> {
        match (&self.node_urls, &self.node_url) {
            (Some(urls), _) if !urls.is_empty() => urls.clone(),
            (_, Some(url)) => vec![url.clone()],
            _ => vec![derived],
        }
    }

    /// The store `[store]` names (sled in `DATA_DIR/state`).
    pub async fn open_store(&self) -> Result<crate::store::Store, crate::store::StoreError> {
        let sled_dir = self.data_dir.join("state");
        crate::store::Store::open(&self.store, &sled_dir, &self.cluster).await
    }

    /// Where a sled install keeps the node secret (on etcd it is in the store).
    pub fn node_secret_file(&self) -> PathBuf {
        self.data_dir.join("node-secret")
    }

    /// The copy of the `dataplane` binary cloud nodes download, as it was when this control
    /// plane started (`fleet/cloud_init.rs`): its hash is in their user data.
    pub fn served_dataplane(&self) -> PathBuf {
        self.data_dir.join("dataplane-served")
    }

    /// The `dataplane` binary: configured, else the one beside this program.
    pub fn dataplane_binary(&self) -> PathBuf {
        self.dataplane.clone().unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("the running program's path");
            exe.with_file_name("dataplane")
        })
    }
}

/// `[dns_tsig]`: the key shared with the outside secondaries.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsTsig {
    /// The key's name, as the secondaries name it (`transfer.eu1.example.com`).
    pub key_name: String,
    /// A file holding its secret in base64 alone (what `keymgr -t NAME hmac-sha256` prints as
    /// `secret`), readable by the control plane only.
    pub secret_file: PathBuf,
}

/// `[api_tls]` in the config.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiTls {
    /// The certificate chain (PEM) the API serves; it must name the address nodes use.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The root (PEM) that signed `cert`, given to local nodes to trust it, when it is a
    /// private one. Default: nodes trust the system's roots.
    pub ca: Option<PathBuf>,
}

impl ApiTls {
    /// The certificate to serve, reread on SIGHUP and when its files change.
    pub fn certificate(&self) -> Result<Arc<qe_tls::Certificate>, qe_tls::TlsError> {
        qe_tls::Certificate::load(&self.cert, &self.key)
    }
}

/// The API port's limits (`[http]`): a request's whole head within `head_within_secs`
/// (default 20 s; also how long a kept-alive connection may sit idle; the nodes' clients drop
/// theirs sooner, `dataplane/src/report.rs`, so they never send on a connection being
/// closed); `connections` at once (default 4096, far more than the operator and the nodes need
/// and well under the descriptors the process has; past that, new ones wait in the kernel's
/// backlog). No cap per source beyond the TLS handshakes' (`tls.rs`): every node of the local
/// provider, and every node behind one NAT, comes from one address. Bodies are bounded per
/// route (axum's limit), not by a shared budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpLimits {
    pub head_within_secs: u64,
    pub connections: usize,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            head_within_secs: 20,
            connections: 4096,
        }
    }
}

impl HttpLimits {
    pub fn serve_limits(self) -> qe_serve::Limits {
        qe_serve::Limits {
            head_within_secs: self.head_within_secs,
            connections: self.connections,
            per_source: self.connections,
            ..qe_serve::Limits::default()
        }
    }
}

/// `[sqs]` in the config: how queues made through SQS are made.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SqsConfig {
    /// The endpoint's URL as clients reach it (`endpoint_url`). Default: the first URL
    /// nodes reach the control plane at (the API's own port).
    pub endpoint: Option<String>,
    /// The tier of a queue `CreateQueue` makes (an account that may not have it gets its
    /// first allowed tier). Default `standard`.
    #[serde(default)]
    pub tier: Tier,
    /// Its instance type. Default `local` (the local provider's); an EC2 cluster names one.
    #[serde(default = "default_instance_type")]
    pub instance_type: String,
    /// Whether it has IPv4. Default true: most SQS clients reach their endpoint over IPv4.
    #[serde(default = "yes")]
    pub ipv4: bool,
    /// PEM roots trusted for the nodes' certificates when a queue's action is handed on to
    /// its node over HTTPS. Default: the public web's roots (webpki-roots).
    pub node_roots: Option<std::path::PathBuf>,
}

fn default_instance_type() -> String {
    "local".into()
}

fn yes() -> bool {
    true
}

impl SqsConfig {
    /// The roots (PEM) nodes' certificates are checked against (`[sqs] node_roots`), read once;
    /// None: the public web's. A file that cannot be read trusts nothing (and says so once).
    pub fn node_roots_pem(&self) -> Option<&'static str> {
        static PEM: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let pem = PEM.get_or_init(|| {
            let path = self.node_roots.as_ref()?;
            Some(std::fs::read_to_string(path).unwrap_or_else(|error| {
                tracing::error!(%error, path = %path.display(), "[sqs] node_roots cannot be read");
                String::new()
            }))
        });
        pem.as_deref()
    }
}

impl Default for SqsConfig {
    fn default() -> SqsConfig {
        SqsConfig {
            endpoint: None,
            tier: Tier::Standard,
            instance_type: default_instance_type(),
            ipv4: true,
            node_roots: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_unknown_fields() {
        let config = Config::parse("data_dir = \"/tmp/cp\"\ntoken = \"t\"\n").unwrap();
        assert_eq!(config.listen.port(), 8443);
        assert_eq!(
            (config.cluster.as_str(), config.domain.as_str()),
            ("local", "thequeueexpert.com")
        );
        assert!(Config::parse("data_dir = \"/d\"\ntoken = \"t\"\nport = 1\n").is_err());
        assert!(
            Config::parse("data_dir = \"/d\"\n").is_err(),
            "a token is required"
        );
    }

    #[test]
    fn the_example_config_in_infra_is_one_this_build_takes() {
        let text = include_str!("../../infra/controlplane.example.toml");
        let config = Config::parse(text).unwrap();
        assert!(config.check().is_ok(), "HTTPS on every address");
        let ProviderConfig::Ec2(ec2) = &config.provider else {
            panic!("the example runs nodes on EC2");
        };
        assert_eq!(ec2.regions["eu-west-1"].security_group_ids.len(), 1);
        assert_eq!(
            config.node_url.as_deref(),
            Some("https://cp.example.com:8443")
        );
    }

    #[test]
    fn nodes_reach_every_replica_node_urls_lists() {
        let base = "data_dir = \"/d\"\ntoken = \"t\"\n";
        let with = |extra: &str| Config::parse(&format!("{base}{extra}")).unwrap();
        let derived = || "http://127.0.0.1:8443".to_string();
        assert_eq!(with("").node_urls_or(derived()), [derived()]);
        let one = with("node_url = \"https://cp:8443\"\n");
        assert_eq!(one.node_urls_or(derived()), ["https://cp:8443"]);
        let two = "node_urls = [\"https://cp1:8443\", \"https://cp2:8443\"]\n";
        let both = ["https://cp1:8443", "https://cp2:8443"];
        assert_eq!(with(two).node_urls_or(derived()), both);
        let sled = with(two).check().unwrap_err();
        assert!(sled.contains("etcd"), "replicas share a store: {sled}");
        let etcd = "[store]\nkind = \"etcd\"\nendpoints = [\"http://e:2379\"]\n";
        let two = format!("{two}node_url = \"https://cp1:8443\"\n");
        let agreeing = with(&format!("{two}{etcd}"));
        assert!(agreeing.check().is_ok());
        let two = two.replace(
            "node_url = \"https://cp1:8443\"",
            "node_url = \"https://cp2:8443\"",
        );
        let differing = with(&format!("{two}{etcd}"));
        assert!(differing.check().unwrap_err().contains("node_urls"));
        assert!(with("node_urls = []\n").check().is_err());
    }

    #[test]
    fn the_replica_example_in_infra_is_one_this_build_takes() {
        let text = include_str!("../../infra/controlplane-replica.example.toml");
        let config = Config::parse(text).unwrap();
        assert!(config.check().is_ok());
        let crate::store::StoreConfig::Etcd(etcd) = &config.store else {
            panic!("the replicas share an etcd");
        };
        assert_eq!(etcd.endpoints.len(), 3);
        assert_eq!(config.dns_names().len(), 3);
        assert_eq!(config.node_urls_or(String::new()).len(), 3);
        assert!(
            config.acme.is_some() && !config.local_ca,
            "ACME: a local CA is per host"
        );
        assert!(matches!(config.provider, ProviderConfig::Ec2(_)));
    }

    #[test]
    fn plain_http_only_on_loopback_unless_insecure_is_said() {
        let base = "data_dir = \"/d\"\ntoken = \"t\"\n";
        let with = |extra: &str| Config::parse(&format!("{base}{extra}")).unwrap();
        assert!(with("listen = \"127.0.0.1:1\"\n").check().is_ok());
        assert!(with("listen = \"[::1]:1\"\n").check().is_ok());
        let error = with("listen = \"0.0.0.0:1\"\n").check().unwrap_err();
        assert!(error.contains("plain HTTP"), "{error}");
        assert!(with("listen = \"[::]:1\"\n").check().is_err());
        let insecure = with("listen = \"[::]:1\"\ninsecure_plain_http = true\n");
        assert!(insecure.check().is_ok());
    }

    #[test]
    fn dns_names_transfers_and_notify() {
        let base = "data_dir = \"/d\"\ntoken = \"t\"\n";
        let with = |extra: &str| Config::parse(&format!("{base}{extra}")).unwrap();
        assert!(with("").dns_names().is_empty());
        assert_eq!(with("dns_name = \"ns1.x\"\n").dns_names(), ["ns1.x"]);
        let two = "dns_names = [\"ns1.x\", \"ns2.y\"]\n";
        assert_eq!(with(two).dns_names(), ["ns1.x", "ns2.y"]);
        let agreeing = with(&format!("{two}dns_name = \"ns1.x\"\n"));
        assert!(agreeing.check().is_ok());
        let differing = with(&format!("{two}dns_name = \"ns2.y\"\n"));
        assert!(differing.check().unwrap_err().contains("dns_names"));

        let secondaries = "dns_transfer_allow = [\"127.0.0.1/32\", \"::1\"]\n\
                           dns_notify = [\"127.0.0.1:5301\"]\n";
        let config = with(&format!("dns_listen = \"127.0.0.1:53\"\n{secondaries}"));
        assert!(config.check().is_ok());
        assert!(config.dns_transfer_allow[1].contains("::1".parse().unwrap()));
        assert_eq!(config.dns_notify, ["127.0.0.1:5301".parse().unwrap()]);
        let error = with(secondaries).check().unwrap_err();
        assert!(error.contains("dns_listen"), "{error}");
        let host_bits = Config::parse(&format!("{base}dns_transfer_allow = [\"10.0.0.1/8\"]\n"));
        let error = host_bits.unwrap_err().to_string();
        assert!(error.contains("starts at 10.0.0.0"), "{error}");
        let default = with("").dns_transfer_allow;
        assert!(default.is_empty(), "no transfers by default");

        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("tsig.secret");
        std::fs::write(&secret, "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==\n").unwrap();
        let tsig = format!("[dns_tsig]\nkey_name = \"t.example\"\nsecret_file = {secret:?}\n");
        let signed = with(&format!(
            "dns_listen = \"127.0.0.1:53\"\n{secondaries}{tsig}"
        ));
        assert!(signed.check().is_ok());
        let key = signed.dns_tsig_key().unwrap().unwrap();
        assert_eq!(format!("{key:?}"), "TsigKey(t.example.)");
        let alone = with(&format!("dns_listen = \"127.0.0.1:53\"\n{tsig}"));
        assert!(alone.check().unwrap_err().contains("secondaries"));
        std::fs::write(&secret, "c2hvcnQ=").unwrap();
        let short = signed.dns_tsig_key().unwrap_err();
        assert!(short.contains("at least 16"), "{short}");
        std::fs::remove_file(&secret).unwrap();
        assert!(signed.dns_tsig_key().unwrap_err().contains("secret_file"));
        assert!(with("").dns_tsig_key().unwrap().is_none());

        let closed = with("[http]\nconnections = 0\n").check().unwrap_err();
        assert!(closed.contains("[http]"), "{closed}");
        assert!(with("[http]\nhead_within_secs = 0\n").check().is_err());
        assert!(with("[http]\nhead_within_secs = 5\n").check().is_ok());
    }
}
