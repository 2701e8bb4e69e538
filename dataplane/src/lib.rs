//! One queue node.
//!
//! A message's path, top to bottom:
//! - [`server`]: accepts TCP connections as [`admission`] allows (`max-tasks` logged in, a
//!   budget before the login, a share of it per source), answers HTTP, upgrades `/` to a
//!   WebSocket (yawc, with permessage-deflate).
//! - [`connection`]: one task per connection: frames in and out, the login deadline, close
//!   codes and the reply-then-close rule.
//! - [`session`]: what a frame means: the login, then the publisher's, subscriber's or
//!   administrator's requests, and the replies with the manual's codes.
//! - [`engine`]: the queue itself: the line of subscribers, held, waiting, delayed and
//!   dead-lettered messages; the copy queue type.
//! - [`store`]: the boundary every change to the messages passes.
//!
//! - [`sqs`]: the SQS face, a second way in to the same [`engine`].
//!
//! What the path shares: [`state`] (the node every connection shares: the queue, its
//! settings, logins, limits, counters), [`config`] (flags and the TOML file, every small
//! config type), [`auth`] (the three logins, SQS keys, console tokens), [`history`] (stats
//! and usage records), [`admission`], [`limits`] and [`traffic`] (bytes on the sockets).
//!
//! Beside the path, the node's life: [`node`] starts it from a [`node::Source`], runs its
//! services (records and their reports, the control plane's config applied, certificates,
//! builds) under one stop, and stops it; [`control_plane`] is its link to the control plane
//! (the replicas, the node channel), used by the SQS face and by [`node`]. [`replication`]
//! keeps a standby's copy of the log: the primary's side on `/replicate`, and the standby
//! process (`--standby-of`).

pub mod admission;
#[cfg(feature = "count-allocations")]
pub mod allocations;
pub mod auth;
pub mod config;
pub mod connection;
pub mod control_plane;
pub mod engine;
pub mod fragments;
pub mod history;
pub mod limits;
pub mod message;
pub mod node;
pub mod replication;
pub mod server;
pub mod session;
pub mod sqs;
pub mod state;
pub mod store;
pub mod traffic;
