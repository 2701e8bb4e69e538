//! `controlplane serve`: the control plane from a config file, started as a list (the store,
//! the API's listener, the zone and its DNS, certificates, the services that wait to lead,
//! the reconciler) and stopped on SIGTERM; `controlplane restore`.

use crate::Failure;
use controlplane::api::tls::TlsListener;
use controlplane::api::{self, AppState};
use controlplane::certificates::{Issuer, NodeCertificates};
use controlplane::config::Config;
use controlplane::config::ProviderConfig;
use controlplane::dns::{self, Nameserver, Zone};
use controlplane::fleet::cloud_init::{self, NodeBoot};
use controlplane::fleet::ec2::Ec2Provider;
use controlplane::fleet::local::LocalProvider;
use controlplane::fleet::Provider;
use controlplane::leadership::Leadership;
use controlplane::nodes::{Bootstraps, NodeTokens};
use controlplane::reconciler::Reconciler;
use controlplane::store::{Store, StoreConfig};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Flags that win over the config file (the token only comes from the file: a flag would
/// show it in the process list).
#[derive(clap::Args)]
pub(crate) struct Overrides {
    #[arg(long)]
    listen: Option<SocketAddr>,
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long)]
    cluster: Option<String>,
    #[arg(long)]
    domain: Option<String>,
    /// The `dataplane` binary the local provider runs.
    #[arg(long)]
    dataplane: Option<PathBuf>,
}

impl Overrides {
    pub(crate) fn apply(self, config: &mut Config) {
        config.listen = self.listen.unwrap_or(config.listen);
        config.data_dir = self.data_dir.unwrap_or(config.data_dir.clone());
        config.cluster = self.cluster.unwrap_or(config.cluster.clone());
        config.domain = self.domain.unwrap_or(config.domain.clone());
        config.dataplane = self.dataplane.or(config.dataplane.clone());
    }
}

pub(crate) async fn serve(config_path: PathBuf, overrides: Overrides) -> Result<(), Failure> {
    let mut config = Config::parse(&std::fs::read_to_string(&config_path)?)?;
    overrides.apply(&mut config);
    // The nodes go on running after this returns: the next control plane adopts them.
    let mut running = start(config).await?;
    running.wait().await?;
    running.stop().await
}

pub(crate) async fn restore(config_path: PathBuf, from: PathBuf) -> Result<(), Failure> {
    let config = Config::parse(&std::fs::read_to_string(&config_path)?)?;
    let backup = std::fs::read_to_string(&from).map_err(|e| format!("{}: {e}", from.display()))?;
    create_private_dir(&config.data_dir)?;
    let store = config.open_store().await?;
    // sled keeps the node secret in a file of its own; etcd in the store.
    let secret_file = match config.store {
        StoreConfig::Sled => Some(config.node_secret_file()),
        StoreConfig::Etcd(_) => None,
    };
    let restored = controlplane::backup::restore(&store, &backup, secret_file.as_deref()).await?;
    println!("restored {restored} entries from {}", from.display());
    Ok(())
}

/// The control plane, serving.
pub(crate) struct Running {
    pub(crate) state: Arc<AppState>,
    /// The local provider, when it runs the nodes (`dev` stops them on exit).
    pub(crate) local: Option<Arc<LocalProvider>>,
    /// Where the API listens.
    pub(crate) api_addr: SocketAddr,
    /// The API, until `stop_api`.
    pub(crate) api: tokio::task::JoinHandle<()>,
    pub(crate) stop_api: tokio::sync::oneshot::Sender<()>,
}

/// The name the leader key gives this replica, for operators: its host and the API's address
/// (`[::]:8443` alone is every replica's), and its process.
fn replica_name(host: &str, scheme: &str, bound: std::net::SocketAddr) -> String {
    let pid = std::process::id();
    format!("{} {scheme}://{bound} (pid {pid})", host.trim())
}

/// Opens the state, binds and serves the API, then starts the reconciler, which takes on
/// the queues' nodes; prints `dns on ADDR` and `listening on ADDR`.
pub(crate) async fn start(config: Config) -> Result<Running, Failure> {
    config.check()?;
    create_private_dir(&config.data_dir)?;
    let store = config.open_store().await?;
    let node_tokens = Arc::new(match &config.store {
        StoreConfig::Sled => NodeTokens::open(&config.node_secret_file())?,
        StoreConfig::Etcd(_) => NodeTokens::shared(&store).await?,
    });
    // Bound first: the nodes are told where to reach it.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("the API cannot listen on {}: {e}", config.listen))?;
    let bound = listener.local_addr()?;
    let mut reachable = bound;
    if reachable.ip().is_unspecified() {
        reachable.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let issuer = config.certificate_issuer()?;
    let (api_tls, api_certificate) = api_tls(&config)?;
    let scheme = if api_tls.is_some() { "https" } else { "http" };
    let bootstraps = bootstraps(&config, format!("{scheme}://{reachable}"), &node_tokens)?;
    // The SQS endpoint is on the API's port: clients reach it where nodes reach the API,
    // unless the config names another URL.
    let mut config = config;
    config
        .sqs
        .endpoint
        .get_or_insert_with(|| bootstraps.urls[0].clone());
    let ca_root = match &issuer {
        Some(controlplane::certificates::Issuer::LocalCa(ca)) => Some(ca.root_pem.clone()),
        _ => None,
    };
    let (fleet, local) = fleet(&config, issuer.is_some(), ca_root).await?;
    let zone = serve_zone(&config, &store).await?;
    let lease = match &config.store {
        StoreConfig::Etcd(etcd) => std::time::Duration::from_secs(etcd.lease_secs),
        StoreConfig::Sled => std::time::Duration::MAX,
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let leadership = Leadership::start(&store, replica_name(&host, scheme, bound), lease);
    let renew_certificate = Arc::new(tokio::sync::Notify::new());
    let node_certificates = node_certificates(
        issuer,
        &config,
        &zone,
        &store,
        &renew_certificate,
        &leadership,
    )
    .await?;
    let reconcile = Arc::new(tokio::sync::Notify::new());
    let mut metrics = controlplane::api::Metrics::default();
    metrics.api_certificate = api_certificate;
    // Its host and API address: the same across its restarts, so a replica keeps its keys
    // (what it heard, what its DNS serves).
    let replica_key = format!("{} {scheme}://{bound}", host.trim());
    // What this replica hears from the nodes, shared with the leader, which replaces the
    // silent ones; kept for twice the limit (or a minute), never longer than it matters.
    let live_every = std::time::Duration::from_secs(config.live_stats_secs());
    let silence = controlplane::silence::Rules {
        limit: config.silent_after(),
        replaced: metrics.nodes_replaced.clone(),
        standbys_replaced: metrics.standbys_replaced.clone(),
    };
    let keep_heard_for = silence.limit.unwrap_or_default().max(live_every) * 2;
    tokio::spawn(controlplane::silence::share(
        store.clone(),
        metrics.live.clone(),
        replica_key.clone(),
        live_every,
        keep_heard_for,
    ));
    // The CA is told to validate a DNS-01 value once every replica's DNS serves it.
    tokio::spawn(controlplane::dns::served::tell(
        zone.clone(),
        store.clone(),
        replica_key.clone(),
    ));
    let builds = Arc::new(controlplane::builds::Builds::new(&config));
    let state = Arc::new(AppState {
        config,
        store: store.clone(),
        fleet: fleet.clone(),
        metrics,
        node_tokens,
        zone: zone.clone(),
        node_certificates,
        renew_certificate,
        reconcile: reconcile.clone(),
        leadership: leadership.clone(),
        builds,
        limits: Default::default(),
        sqs_signing_keys: Default::default(),
    });
    // Served before any node starts: a starting node pulls its config from it.
    let router = controlplane::app(state.clone());
    let (api, stop_api) = serve_api(listener, api_tls, router, state.config.http);
    let settings = controlplane::reconciler::Settings {
        recheck_every: std::time::Duration::from_secs(state.config.reconcile_every_secs.max(1)),
        silence,
        keep_data_for: std::time::Duration::from_secs(state.config.delete_keeps_data_secs),
        provision_within: std::time::Duration::from_secs(state.config.provision_within_secs),
        errors: state.metrics.reconcile_errors.clone(),
        failed: state.metrics.queues_failed.clone(),
    };
    run_leader_tasks(&state, &leadership);
    let reconciler = Reconciler::new(store, fleet, zone, bootstraps, reconcile, settings);
    // Its first pass takes on every queue's node: adopted, or started again.
    tokio::spawn(Arc::new(reconciler).run(leadership));
    println!("listening on {bound}");
    let _ = std::io::stdout().flush();
    Ok(Running {
        state,
        local,
        api_addr: bound,
        api,
        stop_api,
    })
}

/// The API's TLS acceptor and the certificate it serves (reloaded when its files change);
/// none over plain HTTP.
fn api_tls(
    config: &Config,
) -> Result<
    (
        Option<tokio_rustls::TlsAcceptor>,
        Option<Arc<qe_tls::Certificate>>,
    ),
    Failure,
> {
    let Some(tls) = &config.api_tls else {
        return Ok((None, None));
    };
    let certificate = tls.certificate()?;
    let acceptor = certificate.acceptor()?;
    tokio::spawn(certificate.clone().watch());
    Ok((Some(acceptor), Some(certificate)))
}

/// What a node's bootstrap says of the control plane: its URLs (the config's, or `reachable`,
/// where the API listens), the root that signs the API's certificate, and the node tokens.
fn bootstraps(
    config: &Config,
    reachable: String,
    node_tokens: &Arc<NodeTokens>,
) -> Result<Arc<Bootstraps>, Failure> {
    let ca_pem = match config.api_tls.as_ref().and_then(|tls| tls.ca.as_ref()) {
        Some(ca) => {
            Some(std::fs::read_to_string(ca).map_err(|e| format!("{}: {e}", ca.display()))?)
        }
        None => None,
    };
    Ok(Arc::new(Bootstraps {
        urls: config.node_urls_or(reachable),
        ca_pem,
        tokens: node_tokens.clone(),
    }))
}

/// The provider `[provider]` names; the local one also as itself (`dev` stops its nodes).
/// Nodes serve TLS under the queues' zone when there is a certificate issuer.
async fn fleet(
    config: &Config,
    with_issuer: bool,
    ca_root: Option<std::path::PathBuf>,
) -> Result<(Arc<dyn Provider>, Option<Arc<LocalProvider>>), Failure> {
    let zone_name = format!("q.{}.{}", config.cluster, config.domain);
    match &config.provider {
        ProviderConfig::Local => {
            let tls_zone = with_issuer.then_some(zone_name);
            let nodes_dir = config.local_nodes_dir.as_ref().unwrap_or(&config.data_dir);
            let local = Arc::new(
                LocalProvider::new(config.dataplane_binary(), nodes_dir.clone(), tls_zone)
                    .with_ca_root(ca_root),
            );
            Ok((local.clone(), Some(local)))
        }
        ProviderConfig::Ec2(ec2) => {
            Ok((Arc::new(ec2_provider(config, ec2, zone_name).await?), None))
        }
    }
}

/// The zone of the queues' names, following the shared state, and its DNS served if the
/// config says where; prints `dns on ADDR`.
async fn serve_zone(config: &Config, store: &Store) -> Result<Arc<Zone>, Failure> {
    // The name servers: the ones the parent delegates to, or (local use) `ns` in the zone
    // at the address it listens on (loopback if everywhere).
    let names = config.dns_names();
    let nameserver = match (names.is_empty(), config.dns_listen.map(|addr| addr.ip())) {
        (false, _) => Nameserver::Named(names),
        (true, Some(ip)) if !ip.is_unspecified() => Nameserver::InZone(ip),
        (true, _) => Nameserver::InZone(std::net::Ipv6Addr::LOCALHOST.into()),
    };
    let zone = Zone::new(&config.cluster, &config.domain, nameserver)?;
    zone.refresh(store).await?;
    // Every replica's zone follows the shared state, whoever changed it.
    tokio::spawn(zone.clone().follow(store.clone()));
    if let Some(addr) = config.dns_listen {
        let secondaries = dns::Secondaries {
            allow: config.dns_transfer_allow.clone(),
            notify: config.dns_notify.clone(),
            key: config.dns_tsig_key()?,
        };
        let bound = dns::serve(zone.clone(), addr, secondaries)
            .await
            .map_err(|e| format!("the DNS cannot listen on {addr}: {e}"))?;
        println!("dns on {bound}");
    }
    Ok(zone)
}

/// How nodes get their certificates: none, the cluster's wildcard (kept certified while this
/// replica leads), or each its own from `issuer` (those another CA issued renewed at once).
async fn node_certificates(
    issuer: Option<Issuer>,
    config: &Config,
    zone: &Arc<Zone>,
    store: &Store,
    renew: &Arc<tokio::sync::Notify>,
    leadership: &Leadership,
) -> Result<NodeCertificates, Failure> {
    let certificates = match issuer {
        None => NodeCertificates::None,
        Some(issuer) if config.wildcard_certificate => {
            let name = issuer.name();
            tokio::spawn(controlplane::certificates::keep_certified(
                issuer,
                zone.clone(),
                store.clone(),
                renew.clone(),
                leadership.clone(),
            ));
            NodeCertificates::Wildcard { issuer: name }
        }
        Some(issuer) => {
            controlplane::certificates::renew_certificates_not_from(store, &issuer.name()).await?;
            NodeCertificates::PerQueue(Arc::new(issuer))
        }
    };
    Ok(certificates)
}

/// What the leading replica does besides reconciling: the rollups (and the audit's trim),
/// the rollouts, the store's upkeep. Each waits to lead.
fn run_leader_tasks(state: &AppState, leadership: &Leadership) {
    let store = &state.store;
    tokio::spawn(controlplane::rollup::run(
        store.clone(),
        leadership.clone(),
        controlplane::rollup::AuditRetention {
            days: state.config.audit_keep_days,
            entries: state.config.audit_keep_entries,
        },
    ));
    tokio::spawn(controlplane::rollout::run(
        store.clone(),
        leadership.clone(),
    ));
    tokio::spawn(controlplane::upkeep::run(store.clone(), leadership.clone()));
}

/// Serves `router` on `listener` (over TLS with `tls`) until the sender it returns is used.
fn serve_api(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    router: axum::Router,
    limits: controlplane::config::HttpLimits,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (stop_api, stopping) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopping.await;
    };
    let api = match tls {
        Some(acceptor) => tokio::spawn(api::server::serve(
            TlsListener::new(listener, acceptor),
            router,
            limits,
            stopped,
        )),
        None => tokio::spawn(api::server::serve(listener, router, limits, stopped)),
    };
    (api, stop_api)
}

/// The EC2 provider `[provider]` describes: nodes boot the cloud-init template with the
/// `dataplane` this control plane serves them.
async fn ec2_provider(
    config: &Config,
    ec2: &controlplane::config::Ec2Config,
    zone: String,
) -> Result<Ec2Provider, Failure> {
    let template = match &ec2.cloud_init {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => cloud_init::BUILT_IN.to_string(),
    };
    let boot = NodeBoot::new(
        template,
        &config.dataplane_binary(),
        &config.served_dataplane(),
    )?;
    let regions = ec2
        .regions
        .iter()
        .map(|(name, region)| {
            let settings = qe_ec2::RegionSettings {
                image_id: region.image_id.clone(),
                subnet_id: region.subnet_id.clone(),
                standby_subnet_id: region.standby_subnet_id.clone(),
                security_group_ids: region.security_group_ids.clone(),
            };
            (name.clone(), settings)
        })
        .collect();
    let settings = qe_ec2::Settings {
        cluster: config.cluster.clone(),
        endpoint: ec2.endpoint.clone(),
        regions,
        volume_size_gib: ec2.volume_size_gib,
        volume_type: ec2.volume_type.clone(),
    };
    Ok(Ec2Provider::new(
        qe_ec2::Ec2::new(settings).await,
        boot,
        zone,
        std::time::Duration::from_secs(ec2.boot_within_secs),
    ))
}

/// A directory only its owner may enter: the control plane's state holds the node secret
/// and the certificates' keys.
pub(crate) fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

impl Running {
    /// Until a stop signal (Ctrl-C or SIGTERM), or an error if the API ends first.
    pub(crate) async fn wait(&mut self) -> Result<(), Failure> {
        tokio::select! {
            _ = stop_signal() => Ok(()),
            ended = &mut self.api => {
                ended?;
                Err("the API stopped".into())
            }
        }
    }

    /// Stops the API once the requests under way are answered.
    pub(crate) async fn stop(self) -> Result<(), Failure> {
        let _ = self.stop_api.send(());
        self.api.await?;
        Ok(())
    }
}

/// Ctrl-C or SIGTERM.
pub(crate) async fn stop_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
