//! Providers run queues' nodes. Provisioning is asynchronous: `start` returns once the node
//! reports it is listening, so a cloud provider fits the same shape.

pub mod local;
mod process;

use crate::queues::{Placement, Queue};
use futures::future::BoxFuture;

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("starting the node: {0}")]
    Start(String),
    #[error("the node did not take its new logins: {0}")]
    Reload(String),
}

pub trait Provider: Send + Sync {
    /// Starts `queue`'s node; returns where it listens, and the addresses its name is to
    /// resolve to.
    fn start<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<Placement, FleetError>>;

    /// Takes on `queue`'s node after a control-plane restart: adopts it if it still runs,
    /// starts it again otherwise; returns where it listens, as [`Provider::start`].
    fn resume<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<Placement, FleetError>>;

    /// Has every running node take the cluster certificate as it is now (after a renewal);
    /// returns once they have.
    fn renew_certificates(&self) -> BoxFuture<'_, ()>;

    /// Stops `queue`'s node, if it runs.
    fn stop<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, ()>;

    /// Gives the running node `queue`'s logins as they are now; returns once it has them.
    fn reload_logins<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>>;
}
