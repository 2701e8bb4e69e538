//! The control plane: provisions queues and their three logins, and runs their nodes.
//!
//! - [`api`]: the operator's HTTP API (axum): routes, bearer-token check, JSON errors.
//! - [`console`]: the web console at `/console/`, signed in with a session cookie.
//! - [`model`]: the records (queues, accounts and their keys, the audit, builds, rollouts,
//!   the certificate), below the store and every service; [`policy`]: which instance types
//!   and regions a new queue may ask for.
//! - [`reconciler`]: drives every queue to what the operator asked for, through its provider.
//! - [`fleet`]: the providers that run nodes ([`fleet::local`] runs them on this machine).
//! - [`store`]: where the records rest (sled under the data directory, or etcd); [`upkeep`]:
//!   the leader's trims of it.
//! - [`config`]: the TOML config, which flags override.
//! - [`dns`]: the authoritative DNS for the queues' names; [`certificates`]: each queue's
//!   certificate (or the opt-in cluster wildcard), by ACME DNS-01 answered from that DNS (or
//!   from a local CA).
//! - [`nodes`]: node credentials and bootstraps; [`usage`]: usage records and bills;
//!   [`live`]: the nodes' latest live numbers, for `/metrics`.
//! - [`pebble`]: Let's Encrypt's test CA, run for `controlplane dev` and the tests.

pub mod api;
pub mod backup;
pub mod builds;
pub mod certificates;
pub mod config;
pub mod console;
pub mod dns;
pub mod fleet;
pub mod leadership;
pub mod live;
pub mod model;
pub mod nodes;
pub mod pebble;
pub mod policy;
pub mod reconciler;
pub mod rollout;
pub mod rollup;
pub mod silence;
pub mod store;
pub mod upkeep;
pub mod usage;

/// Seconds since 1970 now: the time every record, serial and certificate date is kept in.
pub use qe_shared::clock::now_secs as unix_now;

/// Every secret and key is written whole, its owner's alone (`qe_shared::files`).
pub use qe_shared::files::{sync_dir, write_private};

/// The control plane's HTTP face: the API, and the web console's pages beside it, sharing one
/// set of console sessions (built once per process).
pub fn app(state: std::sync::Arc<api::AppState>) -> axum::Router {
    let sessions =
        std::sync::Arc::new(api::sessions::Sessions::new(state.config.api_tls.is_some()));
    let pages = console::router(sessions.clone());
    api::router(state, sessions, pages)
}
