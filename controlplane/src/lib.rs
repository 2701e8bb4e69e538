//! The control plane: provisions queues and their three logins, and runs their nodes.
//!
//! - [`api`]: the operator's HTTP API (axum): routes, bearer-token check, JSON errors.
//! - [`queues`]: what a queue is to the control plane, and how one is created.
//! - [`fleet`]: the providers that run nodes ([`fleet::local`] runs them on this machine).
//! - [`store`]: the queues' records, in sled under the data directory.
//! - [`config`]: the TOML config, which flags override.
//! - [`dns`]: the authoritative DNS for the queues' names; [`acme`]: the cluster's wildcard
//!   certificate, by DNS-01 answered from that DNS.
//! - [`nodes`]: node tokens; [`usage`]: usage records and bills.

pub mod acme;
pub mod api;
pub mod config;
pub mod dns;
pub mod fleet;
pub mod nodes;
pub mod queues;
pub mod store;
pub mod usage;
