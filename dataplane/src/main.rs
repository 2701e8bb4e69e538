//! The `dataplane` binary: one queue node.

use clap::Parser;
use dataplane::certificate::OwnCertificate;
use dataplane::channel::{self, Channel, NodeApply};
use dataplane::config::{Config, ConfigError, Flags, Transport};
use dataplane::node::Node;
use dataplane::report::{self, Reporter};
use dataplane::server::Server;
use dataplane::sqs::Sqs;
use qe_shared::backoff::Backoff;
use qe_shared::node_channel::{DesiredConfig, NodeTls};
use qe_tls::Certificate;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

#[cfg(feature = "count-allocations")]
#[global_allocator]
static ALLOCATOR: dataplane::allocations::Counting = dataplane::allocations::Counting;

/// A build to `exec` once the runtime is gone ([`main`]): set at most once, by [`run`].
static THEN_EXEC: std::sync::OnceLock<(std::path::PathBuf, dataplane::upgrade::Ready)> =
    std::sync::OnceLock::new();

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let code = runtime.block_on(run());
    // Every task ends with the runtime, and the node with them: its message log writes what
    // is pending, syncs and closes (`LogStore`'s drop), as on any stop, before a new build
    // opens it.
    drop(runtime);
    if let Some((data_dir, ready)) = THEN_EXEC.get() {
        let error = dataplane::upgrade::exec_into(data_dir, ready);
        eprintln!("dataplane: the new build could not be run: {error}");
        return ExitCode::FAILURE;
    }
    code
}

async fn run() -> ExitCode {
    #[cfg(feature = "count-allocations")]
    dataplane::allocations::report_on_signal();
    // Taken first: a SIGTERM that arrives while the node starts (its control plane may have
    // seen it serve and deleted it already) must stop it with its last report, never kill it.
    let mut terminate = terminate_signal();
    // One crypto provider for the process: the TLS listener and the reporter's HTTP client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Never blocks a worker: lines a stalled stderr cannot take are dropped and counted.
    let _log = qe_shared::logging::init(filter);

    let mut flags = Flags::parse();
    let report_last = flags.report_last;
    let bootstrapped = match &flags.bootstrap {
        Some(path) => match channel::read_bootstrap(path) {
            Ok(bootstrap) => {
                let data_dir = flags
                    .data_dir
                    .get_or_insert_with(|| DEFAULT_DATA_DIR.into());
                // The build it is to run, if another: before anything else.
                if let Some(selected) = dataplane::upgrade::at_start(data_dir) {
                    let error = dataplane::upgrade::exec_into(data_dir, &selected);
                    tracing::error!(%error, "the selected build could not be run: serving on this one");
                }
                let channel = Channel::new(&bootstrap, data_dir);
                if !channel.has_token() {
                    eprintln!(
                        "dataplane: no node token: {} has none and {} is not there \
                         (a cloud node's first boot exchanges its bootstrap token for it)",
                        path.display(),
                        data_dir.join("node-token").display()
                    );
                    return ExitCode::from(2);
                }
                Some(channel)
            }
            Err(error) => {
                eprintln!("dataplane: {error}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let (config, desired) = match &bootstrapped {
        Some(channel) => {
            match until_terminated(from_control_plane(channel, flags), &mut terminate).await {
                None => return stopped_before_serving(),
                Some(Ok((config, desired))) => (config, Some(desired)),
                Some(Err(error)) => {
                    eprintln!("dataplane: {error}");
                    return ExitCode::from(2);
                }
            }
        }
        None => match Config::load(flags) {
            Ok(config) => (config, None),
            Err(error) => {
                eprintln!("dataplane: {error}");
                return ExitCode::from(2);
            }
        },
    };
    if report_last {
        return report_last_and_exit(&config, &mut terminate).await;
    }
    if config.tls_from_control_plane
        && until_terminated(wait_for_certificate(&config), &mut terminate)
            .await
            .is_none()
    {
        return stopped_before_serving();
    }
    // A certificate of its own: made before the node can listen.
    let own_certificate = match (&bootstrapped, desired.as_ref().map(|d| &d.tls)) {
        (Some(channel), Some(NodeTls::Queue { host, generation })) => {
            let own = OwnCertificate::new(channel.clone(), &config.data_dir, host, *generation);
            if until_terminated(own.ensure(), &mut terminate)
                .await
                .is_none()
            {
                return stopped_before_serving();
            }
            Some(own)
        }
        _ => None,
    };
    let tls = match &config.transport {
        Transport::Plaintext => None,
        Transport::Tls { cert, key } => match Certificate::load(cert, key) {
            Ok(certificate) => Some(certificate),
            Err(error) => {
                eprintln!("dataplane: {error}");
                return ExitCode::from(2);
            }
        },
    };
    let acceptor = match tls
        .as_ref()
        .map(|certificate| certificate.acceptor())
        .transpose()
    {
        Ok(acceptor) => acceptor,
        Err(error) => {
            eprintln!("dataplane: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = std::fs::create_dir_all(&config.data_dir) {
        eprintln!(
            "dataplane: cannot create {}: {error}",
            config.data_dir.display()
        );
        return ExitCode::FAILURE;
    }

    let node = match Node::open(&config).await {
        Ok(node) => node,
        Err(error) => {
            eprintln!(
                "dataplane: cannot start on {}: {error}",
                config.data_dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let sqs_listener = match &config.sqs {
        Some(sqs) => match dataplane::sqs::bind(sqs.listen).await {
            Ok(listener) => Some(listener),
            // The control plane's port for it is taken (another process has it): the queue
            // is still served over WebSocket, and the error says why SQS is not.
            Err(error) if bootstrapped.is_some() => {
                let listen = sqs.listen;
                tracing::error!(%error, %listen, "cannot listen for SQS: serving without the SQS face");
                None
            }
            Err(error) => {
                eprintln!(
                    "dataplane: cannot listen on {} for SQS: {error}",
                    sqs.listen
                );
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let sqs_acceptor = acceptor.clone();
    let server = match Server::bind(&config.listen, node.clone(), acceptor).await {
        Ok(server) => server,
        Err(error) => {
            eprintln!("dataplane: cannot listen on {:?}: {error}", config.listen);
            return ExitCode::FAILURE;
        }
    };
    let addrs = server
        .local_addrs()
        .expect("a bound listener has an address");
    if let Some(certificate) = tls.clone() {
        tokio::spawn(certificate.watch());
    }
    if let (Some(own), Some(certificate)) = (&own_certificate, &tls) {
        own.serve(certificate.clone());
        tokio::spawn(own.clone().keep_renewed());
    }
    // The history's records, and their reports to the control plane.
    let (stop_history, stopping) = tokio::sync::watch::channel(false);
    let history = tokio::spawn(dataplane::history::run(
        node.clone(),
        stopping,
        config.record_every,
    ));
    let reporter = config
        .report_to
        .clone()
        .map(|to| Reporter::new(node.clone(), to));
    let reporting = reporter.as_ref().map(|r| tokio::spawn(r.clone().run()));
    // Live numbers for the control plane's /metrics; they end with the node (nothing to
    // hand over: the next start's first one replaces them).
    if let Some(reporter) = &reporter {
        let live = reporter
            .clone()
            .run_live(config.live_stats_every, tls.clone());
        tokio::spawn(live);
    }
    if config.config_file.is_some() {
        let (node, config, reporter) = (node.clone(), config.clone(), reporter.clone());
        tokio::spawn(reload_on_hangup(node, config, tls.clone(), reporter));
    }
    // From now on the control plane hears which config the node serves, and sends changes;
    // one that names another build has the node fetch it and restart into it.
    let mut new_build = None;
    let mut confirmed = None;
    let sqs_channel = bootstrapped.clone();
    if let (Some(channel), Some(desired)) = (bootstrapped, desired) {
        // A queue made through SQS starts with the attributes it was made with.
        if let Some(initial) = &desired.initial_settings {
            if let Err(error) = node.take_initial_settings(initial) {
                tracing::warn!(%error, "the queue's initial settings were not taken");
            }
        }
        node.set_redrive(desired.redrive.clone());
        let queue_id = channel.report_to().queue_id;
        tokio::spawn(dataplane::sqs::dead_letters::forward(
            node.clone(),
            queue_id,
        ));
        let (upgrader, ready) =
            dataplane::upgrade::Upgrader::start(channel.clone(), config.data_dir.clone());
        upgrader.want(desired.build.as_ref());
        new_build = Some(ready);
        confirmed = Some(channel.confirmed());
        let trial = dataplane::upgrade::pass_trial(config.data_dir.clone(), channel.confirmed());
        tokio::spawn(trial);
        let apply = NodeApply::new(
            node.clone(),
            channel.clone(),
            reporter.clone(),
            own_certificate,
            tls.clone(),
            &config,
            &desired,
        )
        .upgrading_with(upgrader);
        let data_dir = config.data_dir.clone();
        tokio::spawn(channel::watch(
            channel,
            data_dir,
            desired.version,
            Arc::new(apply),
        ));
    }
    if let Some(listener) = sqs_listener {
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let queue_name = config
            .report_to
            .as_ref()
            .map_or("queue".to_string(), |to| to.queue_id.clone());
        let control_plane = config.report_to.clone();
        let receipt_key = match dataplane::sqs::ReceiptKey::kept_in(&config.data_dir) {
            Ok(key) => key,
            Err(error) => {
                eprintln!("dataplane: the SQS receipt key cannot be kept: {error}");
                return ExitCode::FAILURE;
            }
        };
        let face = Sqs::new(
            node.clone(),
            queue_name,
            sqs_acceptor.is_some(),
            control_plane,
            sqs_channel,
            receipt_key,
        );
        let limits = config
            .sqs
            .as_ref()
            .map(|sqs| sqs.limits)
            .unwrap_or_default();
        tokio::spawn(face.run(listener, sqs_acceptor, limits));
        say(&format!("sqs: serving on {addr}"));
        tracing::info!("sqs: serving on {addr}");
    }
    // Harnesses read the real address from this line.
    say(&format!("listening on {}", addrs[0]));
    for addr in &addrs[1..] {
        say(&format!("also listening on {addr}"));
    }
    say(&format!(
        "ready: tier {:?}, max-tasks {}, max-messages {}, max-messages-memory {}",
        node.tier, node.limits.max_tasks, node.limits.max_messages, node.limits.max_messages_memory
    ));
    let restart_into = tokio::select! {
        _ = server.run() => None,
        _ = terminate.recv() => {
            tracing::info!("stopping on SIGTERM");
            None
        }
        ready = ready_build(new_build) => Some(ready),
    };
    // The last, partial usage record, and one try to hand it over before going.
    let _ = stop_history.send(true);
    let _ = history.await;
    if let (Some(reporter), Some(reporting)) = (reporter, reporting) {
        reporting.abort();
        match tokio::time::timeout(LAST_REPORT_WITHIN, reporter.push_last()).await {
            Ok(Ok(())) => tracing::info!("the last usage record was reported"),
            // It stays in the history; the next start reports it.
            _ => tracing::warn!("the last usage record could not be reported now"),
        }
    }
    // A build on trial that served, confirmed, and was stopped cleanly did not fail.
    if confirmed.is_some_and(|confirmed| *confirmed.borrow() > 0) && restart_into.is_none() {
        dataplane::upgrade::stopped_cleanly(&config.data_dir);
    }
    if let Some(ready) = restart_into {
        // A SIGTERM while it stopped (a reboot, a stop) wins: the node stops for good.
        if futures::FutureExt::now_or_never(terminate.recv()).is_some() {
            tracing::info!("stopping on SIGTERM instead of restarting into the new build");
            return ExitCode::SUCCESS;
        }
        // What the history holds goes to the disk first: the next build reads it from there.
        if let Err(error) = node.history.flush() {
            tracing::error!(%error, "the history could not be synced before restarting");
        }
        let _ = THEN_EXEC.set((config.data_dir.clone(), ready));
    }
    ExitCode::SUCCESS
}

/// The build to restart into, once one is fetched and checked; never without a channel.
async fn ready_build(
    ready: Option<tokio::sync::watch::Receiver<Option<dataplane::upgrade::Ready>>>,
) -> dataplane::upgrade::Ready {
    if let Some(mut ready) = ready {
        if let Ok(build) = ready.wait_for(Option::is_some).await {
            return build.clone().expect("waited for");
        }
    }
    std::future::pending().await
}

/// Where a node started from a bootstrap keeps its data when `--data-dir` does not say.
const DEFAULT_DATA_DIR: &str = "/var/lib/queue-expert";

/// The config of a node started from a bootstrap: the control plane's (or the one kept from
/// the last run, when it cannot be reached), with the flags laid over it.
async fn from_control_plane(
    channel: &Channel,
    flags: Flags,
) -> Result<(Config, DesiredConfig), ConfigError> {
    let data_dir = flags.data_dir.clone().expect("set with the channel");
    std::fs::create_dir_all(&data_dir).map_err(|source| ConfigError::Read {
        path: data_dir.clone(),
        source,
    })?;
    let desired = channel::first_config(channel, &data_dir).await;
    let mut config = Config::merge(
        channel::config_file(&desired, &data_dir, &channel.report_to()),
        flags,
    )?;
    config.report_to = Some(channel.report_to());
    Ok((config, desired))
}

/// Fetches the control plane's certificate into `DATA_DIR/tls/` before the node can listen,
/// retrying while the control plane has none. A node that already has one from an earlier
/// run starts with it when the control plane cannot be reached (a node restarted while its
/// control plane is down still serves; the next renewal's SIGHUP brings the new one).
async fn wait_for_certificate(config: &Config) {
    let Some(to) = &config.report_to else { return };
    let dir = config.data_dir.join("tls");
    let kept = dir.join("cert.pem").exists() && dir.join("key.pem").exists();
    let most = std::time::Duration::from_secs(30);
    let mut backoff = Backoff::new(std::time::Duration::from_millis(250), most);
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
/// hands every unreported record over with the last report, and exits, having served nothing;
/// tried again, backing off, until received or SIGTERM.
async fn report_last_and_exit(
    config: &Config,
    terminate: &mut tokio::signal::unix::Signal,
) -> ExitCode {
    let Some(to) = config.report_to.clone() else {
        eprintln!("dataplane: --report-last reports to the control plane of --bootstrap");
        return ExitCode::from(2);
    };
    let node = match Node::open(config).await {
        Ok(node) => node,
        Err(error) => {
            eprintln!(
                "dataplane: cannot open {}: {error}",
                config.data_dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let reporter = Reporter::new(node, to);
    let most = std::time::Duration::from_secs(30);
    let mut backoff = Backoff::new(std::time::Duration::from_secs(1), most);
    loop {
        // How long this round waits if the report does not go.
        let wait = backoff.next_wait();
        match until_terminated(reporter.push_last(), terminate).await {
            Some(Ok(())) => {
                tracing::info!("the last usage record was reported");
                return ExitCode::SUCCESS;
            }
            Some(Err(error)) => {
                tracing::warn!(%error, retry_in = ?wait, "the last usage record could not be reported yet");
            }
            None => {
                tracing::warn!("stopped on SIGTERM before the last usage record was reported");
                return ExitCode::FAILURE;
            }
        }
        if until_terminated(tokio::time::sleep(wait), terminate)
            .await
            .is_none()
        {
            return ExitCode::FAILURE;
        }
    }
}

/// How long a stopping node tries to report its last record.
const LAST_REPORT_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// `step`'s result, or None if a SIGTERM came first. The steps before serving may wait for
/// a long time (a control plane or a CA that does not answer): a SIGTERM meanwhile stops the
/// node, which has served nothing yet.
async fn until_terminated<T>(
    step: impl std::future::Future<Output = T>,
    terminate: &mut tokio::signal::unix::Signal,
) -> Option<T> {
    tokio::select! {
        done = step => Some(done),
        _ = terminate.recv() => None,
    }
}

fn stopped_before_serving() -> ExitCode {
    tracing::info!("stopping on SIGTERM before serving");
    ExitCode::SUCCESS
}

fn terminate_signal() -> tokio::signal::unix::Signal {
    let kind = tokio::signal::unix::SignalKind::terminate();
    tokio::signal::unix::signal(kind).expect("a SIGTERM handler")
}

/// One line on stdout. Whoever reads it may have gone (a control plane restarting): the node
/// goes on regardless, where `println!` would panic.
fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
}

/// On SIGHUP, reads the config file again: the logins (a rotated password) and where the
/// control plane is (one that moved). Then fetches and loads the control plane's certificate
/// again if it serves that one (a renewal), and says so on stdout, where whoever started the
/// node watches for it.
async fn reload_on_hangup(
    node: std::sync::Arc<Node>,
    config: Config,
    tls: Option<std::sync::Arc<Certificate>>,
    reporter: Option<Reporter>,
) {
    let kind = tokio::signal::unix::SignalKind::hangup();
    let mut hangups = tokio::signal::unix::signal(kind).expect("a SIGHUP handler");
    while hangups.recv().await.is_some() {
        let reread = config.reread();
        if let (
            Some(reporter),
            Ok(Config {
                report_to: Some(to),
                ..
            }),
        ) = (&reporter, &reread)
        {
            reporter.retarget(to.clone());
        }
        // A renewed cluster certificate: written to the files the TLS watcher reloads.
        if let (true, Some(reporter), Some(certificate)) =
            (config.tls_from_control_plane, &reporter, &tls)
        {
            let fetched =
                report::fetch_certificate(&reporter.to(), &config.data_dir.join("tls")).await;
            if let Err(error) = fetched
                .map_err(|e| e.to_string())
                .and_then(|()| certificate.reload().map_err(|e| e.to_string()))
            {
                tracing::warn!(%error, "the certificate could not be renewed");
            }
        }
        match reread {
            Ok(reread) => {
                node.replace_logins(reread.logins);
                say("logins reloaded");
            }
            Err(error) => tracing::warn!(%error, "logins not reloaded; the old ones stay"),
        }
    }
}
