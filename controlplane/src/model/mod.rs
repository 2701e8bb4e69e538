//! The control plane's records: what the store keeps and the API shows, with the rules that
//! need nothing but the record itself (a queue's new logins, an account's limits). Below the
//! store and every service: a record never reads or writes the store.
//!
//! - [`queue`]: a queue, its logins, keys, placement and status; [`account`]: an account and
//!   its API keys;
//! - [`audit`]: who changed what, when, and how it went;
//! - [`build`], [`rollout`]: node builds and their rollouts; [`certificate`]: the cluster's
//!   certificate; [`served`]: what each replica's DNS serves of the DNS-01 values.

pub mod account;
pub mod audit;
pub mod build;
pub mod certificate;
pub mod queue;
pub mod rollout;
pub mod served;
