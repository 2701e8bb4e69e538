//! The `dataplane` binary: one queue node. It parses the flags and runs [`dataplane::node`].

use clap::Parser;
use dataplane::config::Flags;
use dataplane::node::{self, Followed, Source, Started, Stopped};
use std::process::ExitCode;

#[cfg(feature = "count-allocations")]
#[global_allocator]
static ALLOCATOR: dataplane::allocations::Counting = dataplane::allocations::Counting;

fn main() -> ExitCode {
    qe_shared::panics::abort_on_panic();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let (code, stopped) = runtime.block_on(run());
    // Every task ends with the runtime, and the node with them: its message log writes what
    // is pending, syncs and closes (`LogStore`'s drop), as on any stop, before a new build
    // opens it.
    drop(runtime);
    if let Some(Stopped::RestartInto { data_dir, ready }) = stopped {
        let error = node::upgrade::exec_into(&data_dir, &ready);
        eprintln!("dataplane: the new build could not be run: {error}");
        return ExitCode::FAILURE;
    }
    code
}

async fn run() -> (ExitCode, Option<Stopped>) {
    #[cfg(feature = "count-allocations")]
    dataplane::allocations::report_on_signal();
    // Taken first: a SIGTERM that arrives while the node starts (its control plane may have
    // seen it serve and deleted it already) must stop it with its last report, never kill it.
    let kind = tokio::signal::unix::SignalKind::terminate();
    let mut terminate = tokio::signal::unix::signal(kind).expect("a SIGTERM handler");
    // One crypto provider for the process: the TLS listener and the reporter's HTTP client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Never blocks a worker: lines a stalled stderr cannot take are dropped and counted.
    let _log = qe_shared::logging::init(filter);

    loop {
        match run_once(&mut terminate).await {
            Ran::Ended(code, stopped) => return (code, stopped),
            // A standby whose config names it the node now: started again, in this process,
            // as a node on its copy (no supervisor's restart delay in a failover).
            Ran::StartAgain => tracing::warn!("starting again as the queue's node"),
        }
    }
}

/// How one start of the process ended.
enum Ran {
    Ended(ExitCode, Option<Stopped>),
    StartAgain,
}

async fn run_once(terminate: &mut tokio::signal::unix::Signal) -> Ran {
    let flags = Flags::parse();
    if flags.standby_of.is_some() {
        // A standby stops at once on SIGTERM: what it wrote is in the kernel's hands, and
        // what it did not sync its next start reads back as it would after a crash.
        let code = tokio::select! {
            code = dataplane::replication::standby::run_flags(flags) => code,
            _ = terminate.recv() => ExitCode::SUCCESS,
        };
        return Ran::Ended(code, None);
    }
    let started = match Source::of(flags) {
        Ok(source) => node::start(source, terminate).await,
        Err(error) => Err(error),
    };
    match started {
        Ok(Some(Started::Following {
            channel,
            desired,
            data_dir,
        })) => {
            // As a standby started by its flags: it stops at once on SIGTERM.
            let followed = tokio::select! {
                followed = Started::follow(channel, desired, data_dir) => followed,
                _ = terminate.recv() => Followed::Ended(ExitCode::SUCCESS),
            };
            match followed {
                Followed::Ended(code) => Ran::Ended(code, None),
                Followed::Promoted => Ran::StartAgain,
            }
        }
        Ok(Some(Started::Serving(running))) => match running.until_stopped(terminate).await {
            Stopped::StartAgain => Ran::Ended(ExitCode::from(node::START_AGAIN_EXIT), None),
            stopped => Ran::Ended(ExitCode::SUCCESS, Some(stopped)),
        },
        Ok(None) => Ran::Ended(ExitCode::SUCCESS, None),
        Err(error) => {
            eprintln!("dataplane: {error}");
            Ran::Ended(ExitCode::from(error.exit_code()), None)
        }
    }
}
