//! `qe`, the command line of The Queue Expert, on `qe-client`.
//!
//! - `args`: the commands and flags (clap).
//! - `config`: the config file's profiles and the logins they keep.
//! - `context`: a profile turned into an API client and a queue's endpoint.
//! - `dns`: queue names resolved through a DNS server of the profile's.
//! - `output`: tables, JSON, CSV, progress on stderr.
//! - `failure`: what went wrong, as the exit code scripts branch on.
//! - `commands`: one file per group of commands.

mod args;
mod commands;
mod config;
mod context;
mod dns;
mod failure;
mod output;

use args::Cli;
use clap::Parser;
use context::Context;
use failure::Failure;
use output::Format;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            // Help and version are not failures; every other parse error is a usage error.
            return match error.use_stderr() {
                true => ExitCode::from(1),
                false => ExitCode::SUCCESS,
            };
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("qe: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let format = match (cli.json, cli.csv) {
        (true, _) => Format::Json,
        (_, true) => Format::Csv,
        _ => Format::Table,
    };
    // A completion script needs no config file, even one that does not read.
    if let args::Command::Completions { shell } = cli.command {
        commands::print_completions(shell);
        return Ok(());
    }
    let path = config::path()?;
    let config = config::Config::load(&path)?;
    let profile_name = config.profile_name(cli.profile.as_deref());
    let mut context = Context {
        path,
        config,
        profile_name,
        format,
        api_within: std::time::Duration::from_secs(cli.timeout),
    };
    commands::run(&mut context, cli.command).await
}
