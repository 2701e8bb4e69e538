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
//! Beside the path: [`config`] (flags and the TOML file), [`auth`] (the three logins),
//! [`node`] (what every connection shares), [`history`] (stats and usage records),
//! [`report`] (pushing those records to the control plane), [`channel`] (a node started from
//! a bootstrap: its config from the control plane, watched), [`control_planes`] (the control
//! plane's replicas, and which one both of those talk to now), [`certificate`] (its own TLS
//! certificate: key made here, CSR sent) and [`traffic`] (bytes on the sockets).

pub mod admission;
#[cfg(feature = "count-allocations")]
pub mod allocations;
pub mod auth;
pub mod certificate;
pub mod channel;
pub mod config;
pub mod connection;
pub mod control_planes;
pub mod engine;
pub mod fragments;
pub mod history;
pub mod limits;
pub mod message;
pub mod node;
pub mod report;
pub mod server;
pub mod session;
pub mod sqs;
pub mod store;
pub mod traffic;
pub mod upgrade;
