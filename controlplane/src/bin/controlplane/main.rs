//! The `controlplane` binary: [`serve`] runs the operator API (and `restore` puts a backup
//! into an empty store before it starts); [`dev`] runs everything locally with a demo queue.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

mod dev;
mod serve;

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
        overrides: serve::Overrides,
    },
    /// Runs the whole path locally: DNS, certificates (Pebble, or a local CA), nodes on TLS
    /// and a demo queue; says how to try it.
    Dev(dev::DevFlags),
    /// Puts a backup (`GET /v1/backup`) into the empty store a config file names, before
    /// the control plane starts on it.
    Restore {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        from: PathBuf,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    qe_shared::panics::abort_on_panic();
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
        Command::Serve { config, overrides } => serve::serve(config, overrides).await,
        Command::Dev(flags) => dev::dev(flags).await,
        Command::Restore { config, from } => serve::restore(config, from).await,
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
