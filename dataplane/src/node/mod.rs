//! The node's life, beside the request path: where its config comes from ([`Source`]: flags
//! and a file, or a bootstrap and the control plane), what it starts before serving
//! ([`start`]: its certificate, its data, its listeners), the services that run beside the
//! connections, and how it stops ([`Running::until_stopped`]: the last usage record
//! reported, or a restart into a new build).
//!
//! The services, each a task of [`Services`], started here and stopped in one place:
//! - [`records`]: stats and usage records on time; [`report`]: pushed to the control plane,
//!   and the live numbers beside them;
//! - [`apply`]: each new config the control plane sends (through the
//!   [`channel`](crate::control_plane::channel) it watches); [`upgrade`]: the build it names;
//! - [`certificate`]: the queue's own certificate, renewed; [`hangup`]: SIGHUP reloads;
//! - the SQS face ([`crate::sqs`]) and its dead-letter forwarding.

pub mod apply;
pub mod certificate;
mod following;
mod hangup;
mod records;
pub mod report;
mod services;
pub mod upgrade;

use crate::config::{Config, ConfigError, Flags, Given, Transport};
use crate::control_plane::channel::{self, Channel};
use crate::replication::epoch::EpochError;
use crate::server::Server;
use crate::sqs::Sqs;
use crate::state::Node;
use apply::NodeApply;
use certificate::OwnCertificate;
use qe_shared::backoff::Backoff;
use qe_shared::node_channel::{DesiredConfig, NodeTls};
use qe_tls::Certificate;
use report::Reporter;
use services::Services;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::Signal;
use tokio_rustls::TlsAcceptor;
use upgrade::Ready;

/// Where a node started from a bootstrap keeps its data when `--data-dir` does not say.
const DEFAULT_DATA_DIR: &str = "/var/lib/queue-expert";

/// The exit code of a node that stopped to be started again ([`Stopped::StartAgain`]): not 0,
/// so a systemd unit with `Restart=on-failure` starts it again (75: `EX_TEMPFAIL`).
pub const START_AGAIN_EXIT: u8 = 75;

/// How long a stopping node tries to report its last record.
const LAST_REPORT_WITHIN: Duration = Duration::from_secs(3);

/// Why the node did not start, and the exit code it says so with.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The flags, the file, the bootstrap or the certificate files are wrong: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Its data or its ports cannot be had: exit 1.
    #[error("{0}")]
    Failed(String),
    /// Its copy's primary was superseded (`replication::epoch`): exit 3, as a primary that
    /// hears of it while it serves.
    #[error("{0}")]
    Superseded(String),
}

impl From<ConfigError> for StartError {
    fn from(error: ConfigError) -> StartError {
        StartError::Usage(error.to_string())
    }
}

impl StartError {
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Usage(_) => 2,
            StartError::Failed(_) => 1,
            StartError::Superseded(_) => crate::replication::SUPERSEDED_EXIT,
        }
    }
}

/// Where the node's config comes from.
pub enum Source {
    /// `--config` and the flags, or the flags alone.
    Flags(Flags),
    /// `--bootstrap`: the control plane's config through the channel, the flags laid over it.
    ControlPlane { channel: Channel, flags: Flags },
}

impl Source {
    /// The source the flags name. A node started from a bootstrap first runs the build
    /// selected for it, if that is another (this process is replaced then).
    pub fn of(mut flags: Flags) -> Result<Source, StartError> {
        let Some(path) = flags.bootstrap.clone() else {
            return Ok(Source::Flags(flags));
        };
        let bootstrap =
            channel::read_bootstrap(&path).map_err(|e| StartError::Usage(e.to_string()))?;
        let data_dir = flags
            .data_dir
            .get_or_insert_with(|| DEFAULT_DATA_DIR.into())
            .clone();
        if let Some(selected) = upgrade::at_start(&data_dir) {
            let error = upgrade::exec_into(&data_dir, &selected);
            tracing::error!(%error, "the selected build could not be run: serving on this one");
        }
        let channel = Channel::new(&bootstrap, &data_dir);
        if !channel.has_token() {
            return Err(StartError::Usage(format!(
                "no node token: {} has none and {} is not there \
                 (a cloud node's first boot exchanges its bootstrap token for it)",
                path.display(),
                data_dir.join("node-token").display()
            )));
        }
        Ok(Source::ControlPlane { channel, flags })
    }

    fn report_last(&self) -> bool {
        match self {
            Source::Flags(flags) | Source::ControlPlane { flags, .. } => flags.report_last,
        }
    }

    /// The config, and the control plane's desired config it came from, if it did; None when
    /// a SIGTERM came while the control plane kept the node waiting for it. Flags and a file
    /// are read at once: a SIGTERM already pending is taken once the node serves (it stops
    /// with its last record, as ever).
    async fn config(self, terminate: &mut Signal) -> Result<Option<Configured>, StartError> {
        match self {
            Source::Flags(flags) => Ok(Some((Config::load(flags)?, None))),
            Source::ControlPlane { channel, flags } => {
                let data_dir = flags.data_dir.clone().expect("set with the channel");
                std::fs::create_dir_all(&data_dir).map_err(|source| ConfigError::Read {
                    path: data_dir.clone(),
                    source,
                })?;
                let first = channel::first_config(&channel, &data_dir);
                let Some(desired) = until_terminated(first, terminate).await else {
                    return Ok(None);
                };
                let given = Given::from_desired(&desired, &data_dir, channel.report_to())?;
                let config = Config::merge(given, flags)?;
                Ok(Some((config, Some((channel, desired)))))
            }
        }
    }
}

/// A node's config, with the channel and the desired config it came from if it did.
type Configured = (Config, Option<(Channel, DesiredConfig)>);

/// How the node ended.
pub enum Stopped {
    /// On SIGTERM, or its listeners gone: the process exits.
    Done,
    /// Its config holds what it takes only at start: the process exits with
    /// [`START_AGAIN_EXIT`], for its supervisor to start it again.
    StartAgain,
    /// A new build is fetched and checked: the process `exec`s it once the runtime is gone.
    RestartInto { data_dir: PathBuf, ready: Ready },
}

/// What a start made of the process.
pub enum Started {
    /// It serves its queue.
    Serving(Running),
    /// Its config names it its queue's standby instance ([`following`]): it follows the
    /// primary, serving nothing.
    Following {
        channel: Channel,
        desired: DesiredConfig,
        data_dir: PathBuf,
    },
}

pub use following::Followed;

impl Started {
    /// Follows as told, for a standby instance ([`following::follow_as_told`]).
    pub async fn follow(channel: Channel, desired: DesiredConfig, data_dir: PathBuf) -> Followed {
        following::follow_as_told(channel, desired, data_dir).await
    }
}

/// A node that serves.
pub struct Running {
    node: Arc<Node>,
    config: Config,
    server: Server,
    services: Services,
    reporter: Option<Reporter>,
    /// Tells of a build to restart into; only with a channel.
    new_build: Option<tokio::sync::watch::Receiver<Option<Ready>>>,
    /// The config version the control plane confirmed; only with a channel.
    confirmed: Option<tokio::sync::watch::Receiver<u64>>,
}

/// Starts the node from `source`: its config, its certificate, its data, its listeners and
/// services. None when a SIGTERM came before it served (the steps before serving may wait
/// for a long time for a control plane or a CA that does not answer), or when it only
/// handed its last records over (`--report-last`).
pub async fn start(source: Source, terminate: &mut Signal) -> Result<Option<Started>, StartError> {
    let report_last = source.report_last();
    let Some((config, bootstrapped)) = source.config(terminate).await? else {
        return Ok(stopped_before_serving().map(Started::Serving));
    };
    if report_last {
        report_last_and_exit(&config, terminate).await?;
        return Ok(None);
    }
    match bootstrapped {
        Some((channel, desired)) if following::told_to_follow(&desired).is_some() => {
            Ok(Some(Started::Following {
                channel,
                desired,
                data_dir: config.data_dir,
            }))
        }
        bootstrapped => Ok(serve(config, bootstrapped, terminate)
            .await?
            .map(Started::Serving)),
    }
}

/// Starts the node on `config` and serves.
async fn serve(
    config: Config,
    bootstrapped: Option<(Channel, DesiredConfig)>,
    terminate: &mut Signal,
) -> Result<Option<Running>, StartError> {
    // Before a certificate is asked for or the data opened: a superseded copy serves no
    // more, with or without a standby (`replication::epoch`). Its last records may still be
    // handed over.
    let log_dir = config.data_dir.join(crate::store::data_dir::MESSAGES);
    crate::replication::epoch::refuse_superseded(&log_dir).map_err(|error| {
        let why = format!("cannot start on {}: {error}", config.data_dir.display());
        match error {
            EpochError::Superseded { .. } => StartError::Superseded(why),
            _ => StartError::Failed(why),
        }
    })?;
    if config.tls_from_control_plane
        && until_terminated(wait_for_certificate(&config), terminate)
            .await
            .is_none()
    {
        return Ok(stopped_before_serving());
    }
    // A certificate of its own: made before the node can listen.
    let own_certificate = match &bootstrapped {
        Some((channel, desired)) => match &desired.tls {
            NodeTls::Queue { host, generation } => {
                let own = OwnCertificate::new(channel.clone(), &config.data_dir, host, *generation);
                if until_terminated(own.ensure(), terminate).await.is_none() {
                    return Ok(stopped_before_serving());
                }
                Some(own)
            }
            _ => None,
        },
        None => None,
    };
    let tls = served_certificate(&config)?;
    let server_config = tls
        .as_ref()
        .map(|certificate| certificate.server_config())
        .transpose()
        .map_err(|e| StartError::Usage(e.to_string()))?;
    std::fs::create_dir_all(&config.data_dir).map_err(|error| {
        StartError::Failed(format!(
            "cannot create {}: {error}",
            config.data_dir.display()
        ))
    })?;
    let node = Node::open(&config).await.map_err(|error| {
        StartError::Failed(format!(
            "cannot start on {}: {error}",
            config.data_dir.display()
        ))
    })?;
    let sqs_listener = bind_sqs(&config, bootstrapped.is_some()).await?;
    let server = Server::bind(&config.listen, node.clone(), server_config.clone())
        .await
        .map_err(|error| {
            StartError::Failed(format!("cannot listen on {:?}: {error}", config.listen))
        })?;
    let mut running = Running {
        node,
        config,
        server,
        services: Services::new(),
        reporter: None,
        new_build: None,
        confirmed: None,
    };
    running.start_reports(tls.clone());
    running.reread_on_hangup(tls.clone());
    running.watch_certificates(tls.clone(), own_certificate.as_ref());
    let channel = bootstrapped.as_ref().map(|(channel, _)| channel.clone());
    if let Some(channel) = &channel {
        channel.runs_with_standby(running.node.standby.is_some());
    }
    if let Some((channel, desired)) = bootstrapped {
        running.follow_control_plane(channel, desired, own_certificate, tls);
    }
    if let Some(listener) = sqs_listener {
        let acceptor = server_config.map(TlsAcceptor::from);
        running.serve_sqs(listener, acceptor, channel)?;
    }
    running.say_ready();
    Ok(Some(running))
}

impl Running {
    /// The history's records and their reports to the control plane; the live numbers for
    /// its /metrics (they end with the node: the next start's first one replaces them).
    fn start_reports(&mut self, tls: Option<Arc<Certificate>>) {
        let (node, every) = (self.node.clone(), self.config.record_every);
        self.services
            .spawn_stopped_by(|stopping| records::run(node, stopping, every));
        let Some(to) = self.config.report_to.clone() else {
            return;
        };
        let reporter = Reporter::new(self.node.clone(), to);
        self.services.spawn(reporter.clone().run());
        let live = reporter
            .clone()
            .run_live(self.config.live_stats_every, tls.clone());
        self.services.spawn(live);
        self.reporter = Some(reporter);
    }

    /// The config file read again on SIGHUP (a node started from one).
    fn reread_on_hangup(&mut self, tls: Option<Arc<Certificate>>) {
        if self.config.config_file.is_some() {
            let (node, config) = (self.node.clone(), self.config.clone());
            let reload = hangup::reload_on_hangup(node, config, tls, self.reporter.clone());
            self.services.spawn(reload);
        }
    }

    /// The served certificate's files, reloaded when they change; the queue's own one,
    /// renewed before it expires.
    fn watch_certificates(&mut self, tls: Option<Arc<Certificate>>, own: Option<&OwnCertificate>) {
        let Some(certificate) = tls else { return };
        self.services.spawn(certificate.clone().watch());
        if let Some(own) = own {
            own.serve(certificate);
            self.services.spawn(own.clone().keep_renewed());
        }
    }

    /// From now on the control plane hears which config the node serves, and sends changes;
    /// one that names another build has the node fetch it and restart into it.
    fn follow_control_plane(
        &mut self,
        channel: Channel,
        desired: DesiredConfig,
        own_certificate: Option<OwnCertificate>,
        tls: Option<Arc<Certificate>>,
    ) {
        let node = &self.node;
        // A queue made through SQS starts with the attributes it was made with.
        if let Some(initial) = &desired.initial_settings {
            if let Err(error) = node.take_initial_settings(initial) {
                tracing::warn!(%error, "the queue's initial settings were not taken");
            }
        }
        node.set_redrive(desired.redrive.clone());
        let queue_id = channel.report_to().queue_id;
        self.services
            .spawn(crate::sqs::dead_letters::forward(node.clone(), queue_id));
        let data_dir = self.config.data_dir.clone();
        let (upgrader, ready) = upgrade::Upgrader::start(channel.clone(), data_dir.clone());
        upgrader.want(desired.build.as_ref());
        self.new_build = Some(ready);
        self.confirmed = Some(channel.confirmed());
        self.services
            .spawn(upgrade::pass_trial(data_dir.clone(), channel.confirmed()));
        let apply = NodeApply::new(
            node.clone(),
            channel.clone(),
            self.reporter.clone(),
            own_certificate,
            tls,
            &self.config,
            &desired,
        )
        .upgrading_with(upgrader);
        let watch = channel::watch(channel, data_dir, desired.version, Arc::new(apply));
        self.services.spawn(watch);
    }

    /// The SQS face on `listener`, with the TLS of the WebSocket listeners.
    fn serve_sqs(
        &mut self,
        listener: tokio::net::TcpListener,
        acceptor: Option<TlsAcceptor>,
        channel: Option<Channel>,
    ) -> Result<(), StartError> {
        let config = &self.config;
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let queue_name = config
            .report_to
            .as_ref()
            .map_or("queue".to_string(), |to| to.queue_id.clone());
        let receipt_key = crate::sqs::ReceiptKey::kept_in(&config.data_dir).map_err(|error| {
            StartError::Failed(format!("the SQS receipt key cannot be kept: {error}"))
        })?;
        let face = Sqs::new(
            self.node.clone(),
            queue_name,
            acceptor.is_some(),
            config.report_to.clone(),
            channel,
            receipt_key,
        );
        let limits = config
            .sqs
            .as_ref()
            .map(|sqs| sqs.limits)
            .unwrap_or_default();
        self.services.spawn(face.run(listener, acceptor, limits));
        say(&format!("sqs: serving on {addr}"));
        tracing::info!("sqs: serving on {addr}");
        Ok(())
    }

    /// The lines harnesses read: the real addresses, then that the node is ready.
    fn say_ready(&self) {
        let addrs = self
            .server
            .local_addrs()
            .expect("a bound listener has an address");
        say(&format!("listening on {}", addrs[0]));
        for addr in &addrs[1..] {
            say(&format!("also listening on {addr}"));
        }
        let (node, limits) = (&self.node, &self.node.limits);
        say(&format!(
            "ready: tier {:?}, max-tasks {}, max-messages {}, max-messages-memory {}",
            node.tier, limits.max_tasks, limits.max_messages, limits.max_messages_memory
        ));
    }

    /// Serves until a SIGTERM, the listeners' end or a new build; then stops every service,
    /// the last usage record reported (one try), and the history synced before a restart.
    pub async fn until_stopped(self, terminate: &mut Signal) -> Stopped {
        let Running {
            node,
            config,
            server,
            services,
            reporter,
            new_build,
            confirmed,
        } = self;
        let mut start_again = false;
        let restart_into = tokio::select! {
            _ = server.run() => None,
            _ = terminate.recv() => {
                tracing::info!("stopping on SIGTERM");
                None
            }
            _ = node.start_again.notified() => {
                start_again = true;
                None
            }
            ready = ready_build(new_build) => Some(ready),
        };
        services.stop().await;
        if let Some(reporter) = reporter {
            match tokio::time::timeout(LAST_REPORT_WITHIN, reporter.push_last()).await {
                Ok(Ok(())) => tracing::info!("the last usage record was reported"),
                // It stays in the history; the next start reports it.
                _ => tracing::warn!("the last usage record could not be reported now"),
            }
        }
        // A build on trial that served, confirmed, and was stopped cleanly did not fail.
        if confirmed.is_some_and(|confirmed| *confirmed.borrow() > 0) && restart_into.is_none() {
            upgrade::stopped_cleanly(&config.data_dir);
        }
        let Some(ready) = restart_into else {
            return match start_again {
                true => Stopped::StartAgain,
                false => Stopped::Done,
            };
        };
        // A SIGTERM while it stopped (a reboot, a stop) wins: the node stops for good.
        if futures::FutureExt::now_or_never(terminate.recv()).is_some() {
            tracing::info!("stopping on SIGTERM instead of restarting into the new build");
            return Stopped::Done;
        }
        // What the history holds goes to the disk first: the next build reads it from there.
        if let Err(error) = node.history.flush() {
            tracing::error!(%error, "the history could not be synced before restarting");
        }
        Stopped::RestartInto {
            data_dir: config.data_dir,
            ready,
        }
    }
}

/// The certificate the node serves, loaded from the config's files; None over plain ws://.
fn served_certificate(config: &Config) -> Result<Option<Arc<Certificate>>, StartError> {
    match &config.transport {
        Transport::Plaintext => Ok(None),
        Transport::Tls { cert, key } => Certificate::load(cert, key)
            .map(Some)
            .map_err(|e| StartError::Usage(e.to_string())),
    }
}

/// The SQS face's listener, if the config has one. A node of a control plane whose port for
/// it is taken (another process has it) still serves the queue over WebSocket, and the error
/// says why SQS is not.
async fn bind_sqs(
    config: &Config,
    bootstrapped: bool,
) -> Result<Option<tokio::net::TcpListener>, StartError> {
    let Some(sqs) = &config.sqs else {
        return Ok(None);
    };
    match crate::sqs::bind(sqs.listen).await {
        Ok(listener) => Ok(Some(listener)),
        Err(error) if bootstrapped => {
            let listen = sqs.listen;
            tracing::error!(%error, %listen, "cannot listen for SQS: serving without the SQS face");
            Ok(None)
        }
        Err(error) => Err(StartError::Failed(format!(
            "cannot listen on {} for SQS: {error}",
            sqs.listen
        ))),
    }
}

/// The build to restart into, once one is fetched and checked; never without a channel.
async fn ready_build(ready: Option<tokio::sync::watch::Receiver<Option<Ready>>>) -> Ready {
    if let Some(mut ready) = ready {
        if let Ok(build) = ready.wait_for(Option::is_some).await {
            return build.clone().expect("waited for");
        }
    }
    std::future::pending().await
}

/// Fetches the control plane's certificate into `DATA_DIR/tls/` before the node can listen,
/// retrying while the control plane has none. A node that already has one from an earlier
/// run starts with it when the control plane cannot be reached (a node restarted while its
/// control plane is down still serves; the next renewal's SIGHUP brings the new one).
async fn wait_for_certificate(config: &Config) {
    let Some(to) = &config.report_to else { return };
    let dir = config.data_dir.join("tls");
    let kept = dir.join("cert.pem").exists() && dir.join("key.pem").exists();
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
    loop {
        match report::fetch_certificate(to, &dir).await {
            Ok(()) => return,
            Err(report::ReportError::Send(error)) if kept => {
                tracing::warn!(%error, "the control plane cannot be reached: serving the certificate kept from before");
                return;
            }
            Err(error) => {
                let wait = backoff.next_wait();
                tracing::warn!(%error, retry_in = ?wait, "no certificate from the control plane yet");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// `--report-last`: the node's queue was deleted while it could not report (its control plane
/// was down as it stopped, or it had died), so its records wait in its data. Opens the data,
/// hands every unreported record over with the last report, and returns, having served
/// nothing; tried again, backing off, until received or SIGTERM (an error then).
async fn report_last_and_exit(config: &Config, terminate: &mut Signal) -> Result<(), StartError> {
    let Some(to) = config.report_to.clone() else {
        return Err(StartError::Usage(
            "--report-last reports to the control plane of --bootstrap".into(),
        ));
    };
    let node = Node::open(config).await.map_err(|error| {
        StartError::Failed(format!(
            "cannot open {}: {error}",
            config.data_dir.display()
        ))
    })?;
    let reporter = Reporter::new(node, to);
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let stopped = || {
        StartError::Failed("stopped on SIGTERM before the last usage record was reported".into())
    };
    loop {
        // How long this round waits if the report does not go.
        let wait = backoff.next_wait();
        match until_terminated(reporter.push_last(), terminate).await {
            Some(Ok(())) => {
                tracing::info!("the last usage record was reported");
                return Ok(());
            }
            Some(Err(error)) => {
                tracing::warn!(%error, retry_in = ?wait, "the last usage record could not be reported yet");
            }
            None => return Err(stopped()),
        }
        if until_terminated(tokio::time::sleep(wait), terminate)
            .await
            .is_none()
        {
            return Err(stopped());
        }
    }
}

/// `step`'s result, or None if a SIGTERM came first.
async fn until_terminated<T>(
    step: impl std::future::Future<Output = T>,
    terminate: &mut Signal,
) -> Option<T> {
    tokio::select! {
        done = step => Some(done),
        _ = terminate.recv() => None,
    }
}

fn stopped_before_serving() -> Option<Running> {
    tracing::info!("stopping on SIGTERM before serving");
    None
}

/// One line on stdout. Whoever reads it may have gone (a control plane restarting): the node
/// goes on regardless, where `println!` would panic.
pub(crate) fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source_error(flags: Flags) -> StartError {
        match Source::of(flags) {
            Ok(_) => panic!("a source"),
            Err(error) => error,
        }
    }

    #[test]
    fn a_bootstrap_the_node_cannot_use_is_a_usage_error() {
        // As `main` does before anything else: the channel's HTTP client needs it.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let unreadable = Flags {
            bootstrap: Some(dir.path().join("no-such-bootstrap.toml")),
            data_dir: Some(dir.path().join("data")),
            ..Flags::default()
        };
        assert_eq!(source_error(unreadable).exit_code(), 2);
        // A cloud node's bootstrap carries no node token; without one kept from its first
        // boot, it has nothing to present.
        let path = dir.path().join("bootstrap.toml");
        std::fs::write(&path, "control_plane = \"https://cp\"\nqueue_id = \"q1\"\n").unwrap();
        let tokenless = Flags {
            bootstrap: Some(path),
            data_dir: Some(dir.path().join("data")),
            ..Flags::default()
        };
        let error = source_error(tokenless);
        assert_eq!(error.exit_code(), 2);
        assert!(error.to_string().contains("no node token"), "{error}");
    }

    #[test]
    fn flags_alone_are_a_source_of_their_own() {
        assert!(matches!(Source::of(Flags::default()), Ok(Source::Flags(_))));
    }
}
