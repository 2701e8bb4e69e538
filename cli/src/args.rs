//! The command line, as clap reads it.

use crate::failure::EXIT_CODES;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// qe: The Queue Expert from the command line.
///
/// Profiles (in $QE_CONFIG, else $XDG_CONFIG_HOME/qe/config.toml, else
/// ~/.config/qe/config.toml) hold a control plane's URL and token and the logins of your
/// queues. Start with `qe login`; `qe queues create` then keeps the three logins it is shown.
#[derive(Debug, Parser)]
#[command(name = "qe", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// The profile to use (the config file's default_profile, else "default").
    #[arg(long, global = true, env = "QE_PROFILE")]
    pub profile: Option<String>,
    /// Print JSON: one document, or one line per item for a stream (receive, tail).
    #[arg(long, global = true, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV (RFC 4180) with a header line.
    #[arg(long, global = true)]
    pub csv: bool,
    /// Seconds a call to the control plane may take before `qe` gives up (exit 4, `timed out
    /// after N s`).
    #[arg(long, global = true, env = "QE_TIMEOUT", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Writes a profile: the control plane's URL and token (from --token, --token-stdin or
    /// QE_TOKEN, so it stays out of the shell's history), or all of `controlplane dev`'s
    /// demo.json.
    Login(LoginArgs),
    /// The profiles in the config file.
    Profiles,
    /// Queues, through the control plane.
    #[command(subcommand)]
    Queues(QueuesCommand),
    /// A queue's logins: a new password for one.
    #[command(subcommand)]
    Logins(LoginsCommand),
    /// Usage records the nodes reported (GET /v1/usage).
    Usage(RangeArgs),
    /// Stats records the nodes reported (GET /v1/stats).
    Stats(RangeArgs),
    /// A month's bill (GET /v1/bills).
    Bills(BillArgs),
    /// Publishes a message, or each element of a JSON array with --batch.
    Send(SendArgs),
    /// Receives up to --max-messages within --wait-seconds.
    ///
    /// Subscribes with a capacity of --max-messages and prints what arrives. With --delete
    /// each message is acknowledged (the queue removes it). Without it, `qe` logs out without
    /// acknowledging: the queue then gives the messages it held to the first subscriber with
    /// room, or, if none has room, puts them at the back of the queue, so a later receive
    /// gets them again (the manual's "Sessions").
    Receive(ReceiveArgs),
    /// Prints messages as they arrive until Ctrl-C (or --count of them), acknowledging each
    /// (or, with --copy, a copy-queue subscription that takes nothing away).
    Tail(TailArgs),
    /// Deletes a message that is waiting, held or delayed (admin delmsg).
    Delete {
        /// The queue's id.
        queue: String,
        /// The message's id.
        id: String,
    },
    /// Empties the queue's waiting messages (or the dead letter queue, the delayed ones, or
    /// everything).
    Purge(PurgeArgs),
    /// The dead letter queue.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// The queue's messages (admin getmsgs, every page).
    #[command(subcommand)]
    Messages(MessagesCommand),
    /// The queue's settings (admin getcfg, setcfg).
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Node builds (operator): publish a `dataplane` binary, list them.
    #[command(subcommand)]
    Builds(BuildsCommand),
    /// Rolling upgrades (operator): a build across the fleet in waves, a canary first.
    #[command(subcommand)]
    Rollouts(RolloutsCommand),
    /// Prints a completion script: `qe completions bash > /etc/bash_completion.d/qe`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The control plane's URL.
    #[arg(long, required_unless_present = "from_dev")]
    pub api: Option<String>,
    /// The token: an account's API key (qek_…) or the operator's.
    #[arg(
        long,
        env = "QE_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_stdin"
    )]
    pub token: Option<String>,
    /// Reads the token from the first line of stdin.
    #[arg(long)]
    pub token_stdin: bool,
    /// A PEM file of extra roots to trust (a private CA; `controlplane dev`'s trust).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// A DNS server (IP:PORT) to resolve queue names through.
    #[arg(long)]
    pub dns: Option<String>,
    /// Imports `controlplane dev`'s demo.json: API, the demo account's key, DNS, trust and
    /// the demo queue with its three logins.
    #[arg(long, conflicts_with_all = ["api", "token", "token_stdin"])]
    pub from_dev: Option<PathBuf>,
    /// With --from-dev: the operator's token rather than the demo account's key.
    #[arg(long, requires = "from_dev")]
    pub operator: bool,
    /// Writes the profile without first checking the token with the API.
    #[arg(long)]
    pub no_check: bool,
}

#[derive(Debug, Subcommand)]
pub enum QueuesCommand {
    /// The queues you can see, deleted ones too.
    List {
        /// Adds each queue's messages waiting (depth), in flight (held) and in the DLQ, as
        /// its node last reported them ("-" when not known, which is not zero).
        #[arg(long)]
        live: bool,
    },
    /// One queue.
    Get {
        /// The queue's id.
        queue: String,
    },
    /// Makes a queue, waits until it runs, and keeps its three logins (shown only this once)
    /// in the profile.
    Create {
        /// devtest or standard.
        #[arg(long, default_value = "devtest")]
        tier: TierArg,
        /// A region the fleet offers.
        #[arg(long)]
        region: String,
        /// An instance type the fleet offers.
        #[arg(long)]
        instance_type: String,
        /// With an IPv4 address too.
        #[arg(long)]
        ipv4: bool,
        /// For this account (the operator's token only).
        #[arg(long)]
        account: Option<String>,
        /// Its name within the account (SQS clients find it by it).
        #[arg(long)]
        name: Option<String>,
        /// A tag, KEY=VALUE (again for more).
        #[arg(long = "tag", value_parser = parse_tag)]
        tags: Vec<(String, String)>,
        /// 2: a standby node beside it, on which every durability-2 publish is synced too
        /// (standard tier only).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        replicas: u8,
        /// Returns at once, while it is still provisioning.
        #[arg(long)]
        no_wait: bool,
    },
    /// Deletes a queue (its node goes; the record stays, for billing) and forgets its logins.
    Delete {
        /// The queue's id.
        queue: String,
    },
    /// Keeps a login you have for a queue in the profile (the password from stdin).
    Login {
        /// The queue's id.
        queue: String,
        /// Whose login.
        #[arg(long)]
        role: RoleArg,
        /// The login's name.
        #[arg(long)]
        username: String,
        /// Reads the password from the first line of stdin.
        #[arg(long, required = true)]
        password_stdin: bool,
        /// The queue's address, for a queue the control plane does not show.
        #[arg(long)]
        url: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum LoginsCommand {
    /// A new password for one login (shown once, and kept in the profile).
    Rotate {
        /// The queue's id.
        queue: String,
        /// Whose login.
        role: RoleArg,
    },
}

#[derive(Debug, Args)]
pub struct RangeArgs {
    /// The first day, YYYY-MM-DD (UTC); the first of this month unless given.
    #[arg(long)]
    pub from: Option<String>,
    /// The last day, included; today unless given.
    #[arg(long)]
    pub to: Option<String>,
    /// One queue's only.
    #[arg(long)]
    pub queue: Option<String>,
}

#[derive(Debug, Args)]
pub struct BillArgs {
    /// The month, YYYY-MM; this month unless given.
    #[arg(long)]
    pub month: Option<String>,
    /// One queue's only.
    #[arg(long)]
    pub queue: Option<String>,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The queue's id.
    pub queue: String,
    /// The message's body (stdin when neither --body nor --body-file is given).
    #[arg(long, conflicts_with = "body_file")]
    pub body: Option<String>,
    /// A file with the body ("-" for stdin).
    #[arg(long)]
    pub body_file: Option<PathBuf>,
    /// The body is a JSON array: each element is sent as one message (a string as its text,
    /// anything else as its JSON).
    #[arg(long)]
    pub batch: bool,
    /// Sends the body as a binary message (its bytes as they are).
    #[arg(long, conflicts_with = "batch")]
    pub binary: bool,
    /// Seconds before delivery, 0 to 172800.
    #[arg(long)]
    pub delay: Option<u64>,
    /// 0 (memory only), 1 (the default) or 2 (synced before the reply).
    #[arg(long)]
    pub durability: Option<u64>,
    /// A label the subscriber receives.
    #[arg(long)]
    pub publisher_key: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// The queue's id.
    pub queue: String,
    /// The most messages to receive (the subscriber's capacity), 1 to 1024.
    #[arg(long, default_value_t = 1)]
    pub max_messages: u32,
    /// How long to wait for them, in seconds (it returns as soon as it has --max-messages).
    #[arg(long, default_value_t = 1.0)]
    pub wait_seconds: f64,
    /// Acknowledges each message received: the queue removes it.
    #[arg(long)]
    pub delete: bool,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    /// The queue's id.
    pub queue: String,
    /// Subscribes to the copy type of the queue: each message published while connected, and
    /// nothing is taken away from the queue.
    #[arg(long)]
    pub copy: bool,
    /// How many messages to hold at once (distribute type).
    #[arg(long, default_value_t = 10)]
    pub capacity: u32,
    /// Stops after this many messages (for scripts); until Ctrl-C unless given.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// The queue's id.
    pub queue: String,
    /// Empties the dead letter queue instead.
    #[arg(long, conflicts_with_all = ["delayed", "all"])]
    pub dlq: bool,
    /// Empties the delayed messages instead.
    #[arg(long, conflicts_with = "all")]
    pub delayed: bool,
    /// Empties everything: waiting, held (their holders are told), delayed and dead-lettered.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// The messages in the dead letter queue (every page).
    List {
        /// The queue's id.
        queue: String,
    },
    /// One message of the dead letter queue, with its content.
    Get {
        /// The queue's id.
        queue: String,
        /// The message's id.
        id: String,
    },
    /// Deletes messages from the dead letter queue.
    Delete {
        /// The queue's id.
        queue: String,
        /// The messages' ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Moves dead-lettered messages back to the queue (all unless given ids or --count).
    Redrive {
        /// The queue's id.
        queue: String,
        /// These messages only.
        ids: Vec<String>,
        /// The oldest N only.
        #[arg(long, conflicts_with = "ids")]
        count: Option<u64>,
    },
    /// Empties the dead letter queue (the same as `qe purge QUEUE --dlq`).
    Purge {
        /// The queue's id.
        queue: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum MessagesCommand {
    /// The messages in the queue: waiting, held and delayed (every page).
    List {
        /// The queue's id.
        queue: String,
    },
    /// One message, with its content.
    Get {
        /// The queue's id.
        queue: String,
        /// The message's id.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Every setting, or the ones named.
    Get {
        /// The queue's id.
        queue: String,
        /// Settings' names (all unless given).
        names: Vec<String>,
    },
    /// Changes settings, all or none: `qe config set QUEUE saved-session-timeout-secs=60`.
    Set {
        /// The queue's id.
        queue: String,
        /// name=value pairs.
        #[arg(required = true)]
        changes: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TierArg {
    Devtest,
    Standard,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Publisher,
    Subscriber,
    Admin,
}

impl RoleArg {
    pub fn role(self) -> qe_client::Role {
        match self {
            RoleArg::Publisher => qe_client::Role::Publisher,
            RoleArg::Subscriber => qe_client::Role::Subscriber,
            RoleArg::Admin => qe_client::Role::Admin,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum BuildsCommand {
    /// Publishes a `dataplane` binary (the control plane keeps it by its SHA-256).
    Publish {
        /// The binary.
        file: PathBuf,
        /// A name for it (a version, a commit).
        #[arg(long)]
        label: Option<String>,
    },
    /// The installed build (what nodes start from) and the published ones.
    List,
}

#[derive(Debug, Subcommand)]
pub enum RolloutsCommand {
    /// Rolls a build across every running queue on another one: the canary alone, then 2,
    /// 4, 8, … queues; halts at the first node that refuses it or does not come back on it.
    Start {
        /// The build's SHA-256 (`qe builds list`).
        binary_sha256: String,
        /// The queue upgraded first, alone (default: the first by id).
        #[arg(long)]
        canary: Option<String>,
        /// Seconds to wait after a wave is back before the next (default 60).
        #[arg(long)]
        pause_secs: Option<u64>,
        /// Seconds a queue may take to come back on the build (default 300).
        #[arg(long)]
        wave_timeout_secs: Option<u64>,
        /// Waits until it is done (exit 0) or halts (exit 3), printing each wave.
        #[arg(long)]
        wait: bool,
    },
    /// The rollouts, newest first.
    List,
    /// One rollout, with each queue's step.
    Get {
        /// The rollout's id.
        id: String,
    },
    /// Touches nothing more.
    Halt {
        /// The rollout's id.
        id: String,
    },
    /// Rolls a halted rollout on.
    Resume {
        /// The rollout's id.
        id: String,
    },
    /// Tells every queue the rollout reached the build it ran before.
    Rollback {
        /// The rollout's id.
        id: String,
    },
}

/// `KEY=VALUE`.
fn parse_tag(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: a tag is KEY=VALUE"))?;
    Ok((key.to_string(), value.to_string()))
}
