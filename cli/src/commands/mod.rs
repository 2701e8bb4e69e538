//! One file per group of commands, each a function from its arguments to what it prints:
//!
//! - `login`: `qe login`, `qe profiles`, `qe queues login` (the config file only, and a check).
//! - `control`: the control plane's API: queues, logins, usage, stats, bills.
//! - `data`: a queue's messages: send, receive, tail, delete, purge, messages.
//! - `dlq`: the dead letter queue.
//! - `settings`: `qe config get|set` (the queue's getcfg and setcfg).
//! - `fleet`: `qe builds`, `qe rollouts` (the operator's rolling upgrades).

mod control;
mod data;
mod dlq;
mod fleet;
mod login;
mod settings;

use crate::args::{Cli, Command, QueuesCommand};
use crate::context::Context;
use crate::failure::Failure;
use clap::CommandFactory;

/// Runs `command` with the profile and format of `context`.
pub async fn run(context: &mut Context, command: Command) -> Result<(), Failure> {
    match command {
        Command::Login(args) => login::login(context, args).await,
        Command::Profiles => login::profiles(context),
        Command::Queues(QueuesCommand::Login {
            queue,
            role,
            username,
            url,
            ..
        }) => login::queue_login(context, &queue, role.role(), username, url),
        Command::Queues(command) => control::queues(context, command).await,
        Command::Logins(command) => control::logins(context, command).await,
        Command::Usage(range) => control::usage(context, range).await,
        Command::Stats(range) => control::stats(context, range).await,
        Command::Bills(args) => control::bills(context, args).await,
        Command::Send(args) => data::send(context, args).await,
        Command::Receive(args) => data::receive(context, args).await,
        Command::Tail(args) => data::tail(context, args).await,
        Command::Delete { queue, id } => data::delete(context, &queue, &id).await,
        Command::Purge(args) => data::purge(context, args).await,
        Command::Messages(command) => data::messages(context, command).await,
        Command::Dlq(command) => dlq::run(context, command).await,
        Command::Config(command) => settings::run(context, command).await,
        Command::Builds(command) => fleet::builds(context, command).await,
        Command::Rollouts(command) => fleet::rollouts(context, command).await,
        Command::Completions { shell } => {
            print_completions(shell);
            Ok(())
        }
    }
}

/// `qe completions SHELL`: the completion script, on stdout.
pub fn print_completions(shell: clap_complete::Shell) {
    clap_complete::generate(shell, &mut Cli::command(), "qe", &mut std::io::stdout());
}

/// The first line of stdin, without its line break (a token or password piped in).
fn first_line_of_stdin(what: &str) -> Result<String, Failure> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Failure::Usage(format!("reading the {what} from stdin: {e}")))?;
    let line = line.trim_end_matches(['\r', '\n']).to_string();
    match line.is_empty() {
        true => Err(Failure::Usage(format!("no {what} on stdin"))),
        false => Ok(line),
    }
}

/// A time in seconds since 1970 as `YYYY-MM-DDTHH:MM:SSZ`, for people.
fn utc(secs: u64) -> String {
    let (year, month, day) = qe_shared::calendar::civil_from_days(secs / 86_400);
    let of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// A value's JSON, for `--json` (the types printed all serialize).
fn json_of<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("serializes")
}
