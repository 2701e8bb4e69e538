//! The control plane's configuration: one TOML file, flags override it.

use crate::certificates::local_ca::LocalCa;
use crate::certificates::Issuer;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

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
    /// of `dns_listen` (local use).
    pub dns_name: Option<String>,
    /// The ACME CA the cluster's certificate comes from. Default: none.
    pub acme: Option<crate::certificates::acme::AcmeConfig>,
    /// Issue the cluster's certificate from a CA of our own, kept in `DATA_DIR/local-ca/`
    /// (for local use: clients must trust its `ca.pem`). Not with `[acme]`. Default false.
    #[serde(default)]
    pub local_ca: bool,
    /// Serve the API over HTTPS with this certificate (TLS 1.2 and 1.3). Default: plain
    /// HTTP, which is refused on any address but loopback unless `insecure_plain_http`.
    pub api_tls: Option<crate::api::tls::ApiTls>,
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
    /// Seconds between the reconciler's looks at every queue when nothing wakes it (an
    /// instance that vanished is replaced within this). Default 30.
    #[serde(default = "default_reconcile_every_secs")]
    pub reconcile_every_secs: u64,
    /// What runs the nodes. Default: processes on this machine (`kind = "local"`).
    #[serde(default)]
    pub provider: ProviderConfig,
    /// The price table bills are made with, in dollars. Default: everything free.
    #[serde(default)]
    pub prices: Prices,
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
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Ec2Region {
    pub image_id: String,
    pub subnet_id: String,
    pub security_group_ids: Vec<String>,
}

fn default_reconcile_every_secs() -> u64 {
    30
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
        Ok(())
    }

    /// The `dataplane` binary: configured, else the one beside this program.
    pub fn dataplane_binary(&self) -> PathBuf {
        self.dataplane.clone().unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("the running program's path");
            exe.with_file_name("dataplane")
        })
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
}
