//! The `controlplane` binary: `serve` runs the operator API; `dev` runs everything locally
//! with a demo queue.

use clap::{Parser, Subcommand};
use controlplane::api::{self, queues, AppState};
use controlplane::config::Config;
use controlplane::dns::{self, Addresses, Zone};
use controlplane::fleet::local::{LocalProvider, ReportTarget};
use controlplane::nodes::NodeTokens;
use controlplane::queues::{NewQueue, Tier};
use controlplane::store::Store;
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
    /// Runs the control plane with local nodes and a demo queue, and says how to try it.
    Dev {
        /// Where to keep everything (default: a new temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
        #[arg(long, default_value = "127.0.0.1:8443")]
        listen: SocketAddr,
    },
}

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
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let result = match Args::parse().command {
        Command::Serve { config, overrides } => serve(config, overrides).await,
        Command::Dev { dir, listen } => dev(dir, listen).await,
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
    let (state, listener, _) = start(config).await?;
    // The nodes go on running after this returns: the next control plane adopts them.
    run(state, listener).await
}

type Started = (Arc<AppState>, tokio::net::TcpListener, Arc<LocalProvider>);

/// Opens the state, takes on the running queues' nodes and binds the API; prints
/// `listening on ADDR`.
async fn start(config: Config) -> Result<Started, Failure> {
    std::fs::create_dir_all(&config.data_dir)?;
    let store = Store::open(&config.data_dir.join("state"))?;
    let node_tokens = Arc::new(NodeTokens::open(&config.data_dir.join("node-secret"))?);
    // Bound first: the nodes are told where to report.
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let mut reachable = listener.local_addr()?;
    if reachable.ip().is_unspecified() {
        reachable.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let reports = ReportTarget {
        url: format!("http://{reachable}"),
        tokens: node_tokens.clone(),
        tls_zone: config
            .acme
            .as_ref()
            .map(|_| format!("q.{}.{}", config.cluster, config.domain)),
    };
    let fleet = Arc::new(LocalProvider::new(
        config.dataplane_binary(),
        config.data_dir.clone(),
        reports,
    ));
    queues::resume_all(&store, fleet.as_ref()).await?;
    let zone = Zone::new(&config.cluster, &config.domain, Addresses::default())?;
    zone.update(&store.list()?);
    if let Some(addr) = config.dns_listen {
        let bound = dns::serve(zone.clone(), addr).await?;
        println!("dns on {bound}");
    }
    let renew_certificate = Arc::new(tokio::sync::Notify::new());
    if let Some(acme) = config.acme.clone() {
        tokio::spawn(controlplane::acme::keep_certified(
            acme,
            zone.clone(),
            store.clone(),
            fleet.clone(),
            renew_certificate.clone(),
        ));
    }
    println!("listening on {}", listener.local_addr()?);
    let _ = std::io::stdout().flush();
    let state = Arc::new(AppState {
        config,
        store,
        fleet: fleet.clone(),
        metrics: Default::default(),
        node_tokens,
        zone,
        renew_certificate,
    });
    Ok((state, listener, fleet))
}

async fn run(state: Arc<AppState>, listener: tokio::net::TcpListener) -> Result<(), Failure> {
    axum::serve(listener, api::router(state))
        .with_graceful_shutdown(stop_signal())
        .await?;
    Ok(())
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

async fn dev(dir: Option<PathBuf>, listen: SocketAddr) -> Result<(), Failure> {
    let dir = match dir {
        Some(dir) => dir,
        None => tempfile::Builder::new()
            .prefix("queue-expert-dev.")
            .tempdir()?
            .keep(),
    };
    let mut secret = [0u8; 16];
    getrandom::fill(&mut secret).expect("the OS random source");
    let token: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let config = Config::parse(&format!(
        "listen = \"{listen}\"\ndata_dir = {:?}\ntoken = \"{token}\"\ncluster = \"dev\"\n",
        dir
    ))?;
    let (state, listener, fleet) = start(config).await?;
    let demo = NewQueue {
        tier: Tier::Devtest,
        region: "local".into(),
        instance_type: "local".into(),
        ipv4: true,
    };
    let (queue, logins) = queues::provision(&state, demo)
        .await
        .map_err(|e| e.to_string())?;
    let node = queue
        .node
        .clone()
        .ok_or("the demo queue's node did not start")?;
    let login = |role: &str, name: &str, password: &str, extra: &str| {
        format!(
            r#"{{"username":"{name}","password":"{password}","role":"{role}","queuetype":"distribute"{extra}}}"#
        )
    };
    println!(
        "\nThe Queue Expert, local: everything lives in {}\n\
         operator API  http://{} (Authorization: Bearer {token})\n\
         demo queue    {} at {node}\n\n\
         Try it: in one terminal `websocat {node}`, then type\n  {}\n\
         and in another `websocat {node}`, then type\n  {}\n  {{\"body\":\"Hello\"}}\n",
        dir.display(),
        listener.local_addr()?,
        queue.id,
        login(
            "subscriber",
            &logins.subscriber.username,
            &logins.subscriber.password,
            r#","capacity":1"#
        ),
        login(
            "publisher",
            &logins.publisher.username,
            &logins.publisher.password,
            ""
        ),
    );
    println!(
        "admin login   {} / {}\n(Ctrl-C stops everything.)",
        logins.admin.username, logins.admin.password
    );
    let _ = std::io::stdout().flush();
    let result = run(state, listener).await;
    fleet.stop_all().await;
    result
}
