//! Providers run queues' nodes: [`local`] as processes on this machine, [`ec2`] as
//! instances of their own (booted from [`cloud_init`]). A provider only makes, finds and removes what a node runs on; the node itself
//! takes its config from the control plane over the node channel, from a bootstrap the
//! provider hands it. The reconciler (`reconciler.rs`) decides when.

pub mod cloud_init;
pub mod ec2;
pub mod local;
mod local_ports;
mod local_standby;
mod process;

use crate::model::queue::{NewQueue, Placement, Queue};
use futures::future::BoxFuture;
use qe_shared::node_channel::Bootstrap;
use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("starting the node: {0}")]
    Start(String),
    #[error("removing the node: {0}")]
    Remove(String),
    #[error("listing what runs: {0}")]
    List(String),
    /// A start the provider refuses for good (an instance type or image its cloud does not
    /// have): trying again mends nothing, so a new queue fails at once.
    #[error("refused: {0}")]
    Refused(String),
}

/// What a queue's standby starts from.
pub struct StandbyBoot {
    /// The replication key ([`crate::nodes::NodeTokens::replication_key`]).
    pub key: String,
    /// Its own bootstrap ([`crate::nodes::Bootstraps::for_standby`]): a standby on a machine
    /// of its own asks for its config with it, and is told what to follow.
    pub bootstrap: Bootstrap,
}

/// What a provider can tell of a queue's node when the store does not know the queue (made
/// after the backup the store was restored from): enough to adopt it (`api/strays.rs`).
pub struct Stray {
    /// The credentials its node may present now: the one it started with, and one it took
    /// in a rotation since.
    pub node_tokens: Vec<String>,
    /// The config its node last took: its tier, logins, labels and SQS keys.
    pub desired: qe_shared::node_channel::DesiredConfig,
}

pub trait Provider: Send + Sync {
    /// Refuses, up front, a queue it could never run (a region it has no network in), so
    /// that it is not left `provisioning` for good.
    fn can_run(&self, new: &NewQueue) -> Result<(), String> {
        let _ = new;
        Ok(())
    }

    /// Where `queue`'s node is to listen (the node takes it at start, from its config).
    fn listen(&self, queue: &Queue) -> Result<Vec<SocketAddr>, FleetError>;

    /// Where `queue`'s node serves its SQS face (docs/sqs.md), taken at start; None where
    /// the provider runs none (its instances' network does not open a port for it yet).
    fn sqs_listen(&self, queue: &Queue) -> Result<Option<SocketAddr>, FleetError> {
        let _ = queue;
        Ok(None)
    }

    /// Makes sure `queue`'s node runs from `bootstrap`: finds it, or launches it, or replaces
    /// one that is gone (its data comes back with it). Safe to call again at any time;
    /// returns where the node is.
    fn ensure<'a>(
        &'a self,
        queue: &'a Queue,
        bootstrap: &'a Bootstrap,
    ) -> BoxFuture<'a, Result<Placement, FleetError>>;

    /// Before `queue`'s node is started (`replicas: 2`): if its data is lost and its
    /// standby's copy is not, the copy is made its data. True if that happened now or before
    /// and is not recorded yet (a node its provider restarted by itself): the caller audits
    /// it, has the node issued a new certificate (its own went with its data), moves the
    /// epoch on, then says so ([`Provider::promotion_recorded`]).
    fn promote_if_data_lost<'a>(
        &'a self,
        queue: &'a Queue,
    ) -> BoxFuture<'a, Result<bool, FleetError>> {
        let _ = queue;
        Box::pin(async { Ok(false) })
    }

    /// The caller has recorded the promotion [`Provider::promote_if_data_lost`] reported:
    /// it is not reported again.
    fn promotion_recorded<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        let _ = queue;
        Box::pin(async { Ok(()) })
    }

    /// Makes sure `queue`'s standby (`replicas: 2`) runs, following its node at `node`, from
    /// `standby` (the key itself for a standby the provider hands it to, a bootstrap for one
    /// that asks the control plane): finds it, starts it, or starts it again on its copy.
    /// Safe to call again at any time; returns what it runs on, by kind, to be recorded with
    /// the node's.
    fn ensure_standby<'a>(
        &'a self,
        queue: &'a Queue,
        node: &'a Placement,
        standby: &'a StandbyBoot,
    ) -> BoxFuture<'a, Result<std::collections::BTreeMap<String, String>, FleetError>> {
        let _ = (queue, node, standby);
        Box::pin(async {
            Err(FleetError::Refused(
                "this provider places no standby".into(),
            ))
        })
    }

    /// Makes sure `queue`'s standby, which its node has gone without for the silence limit
    /// (a hung process or machine, one cut off from its node), runs no more, keeping its
    /// copy (EC2: its instance terminated, its volume freed; local: its process killed), so
    /// that [`Provider::ensure_standby`] then starts another on that copy. Safe to call again,
    /// and for a queue that has none.
    fn fence_standby<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        let _ = queue;
        Box::pin(async { Ok(()) })
    }

    /// Whether its standbys run on machines of their own, which can serve when the node's
    /// machine is lost: the reconciler then promotes a silent node's standby, once it is
    /// fenced, rather than start the node again on its own data ([`Queue::serving`]). The
    /// local provider's standby shares its node's machine: its node is started again.
    fn promotes_standbys(&self) -> bool {
        false
    }

    /// Makes sure `queue`'s node, which has gone silent (`silence.rs`), serves nothing and
    /// holds nothing any more (a process killed, an instance terminated and its volume
    /// freed), so that [`Provider::ensure`] then starts its replacement on the same data and
    /// no two nodes ever hold one queue's data or name. Safe to call again.
    fn fence<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>>;

    /// Whether `queue`'s node's machine is being brought back by its cloud now (a reboot, a
    /// recovery onto another host, maintenance under way): its silent node is then given one
    /// boot time more before it is replaced, since it comes back, with its data, sooner than
    /// a replacement would.
    fn recovering<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, bool> {
        let _ = queue;
        Box::pin(async { false })
    }

    /// How long a node it starts may take to boot and report for the first time: a
    /// replacement is not judged silent before.
    fn boot_within(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Stops queue `queue_id`'s node and removes what it runs on (a process, an instance),
    /// keeping its data; a stopping node makes and reports its last usage record. Safe to
    /// call again, and for a queue it holds nothing for.
    fn stop<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, Result<(), FleetError>>;

    /// Runs `queue`'s node once more from `bootstrap`, serving nothing, only to hand over the
    /// records its data holds that were never reported, with its last report (a deleted
    /// queue whose node could not report as it stopped), for at most `within`. `false` when
    /// it cannot (the provider runs no such thing, or there is no data to run it on): the
    /// records are then lost with the data.
    fn report_last<'a>(
        &'a self,
        queue: &'a Queue,
        bootstrap: &'a Bootstrap,
        within: std::time::Duration,
    ) -> BoxFuture<'a, Result<bool, FleetError>> {
        let _ = (queue, bootstrap, within);
        Box::pin(async { Ok(false) })
    }

    /// Removes queue `queue_id`'s data (its volume), once its node has stopped for good and
    /// reported its last records. Safe to call again.
    fn remove_data<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, Result<(), FleetError>>;

    /// The ids of the queues it holds anything for, so that what belongs to no live queue
    /// (a crash between "launched" and "recorded") can be removed.
    fn holdings(&self) -> BoxFuture<'_, Result<Vec<String>, FleetError>>;

    /// What it can tell of queue `queue_id`'s node, which the store does not know; `None`
    /// when it can tell nothing (it holds nothing for it, or cannot read its node's config:
    /// an instance's is on its volume).
    fn stray(&self, queue_id: &str) -> Option<Stray> {
        let _ = queue_id;
        None
    }

    /// Looks at everything it runs at once, before the reconciler's look at every queue, so
    /// that [`Provider::ensure`] of a queue whose node is as it should be costs no call of its
    /// own (EC2: one paginated listing of instances and one of volumes per region per pass,
    /// instead of two calls per queue). A provider that knows it all anyway does nothing.
    fn survey(&self) -> BoxFuture<'_, Result<(), FleetError>> {
        Box::pin(async { Ok(()) })
    }

    /// Requests sent to its cloud's API so far, by operation (EC2: every attempt), and the
    /// surveys taken, for `/metrics`: what the fleet costs in calls, against the cloud's rate
    /// limits. Empty for a provider that calls no API.
    fn requests(&self) -> (std::collections::BTreeMap<String, u64>, u64) {
        (std::collections::BTreeMap::new(), 0)
    }

    /// Whether `instance_id` is one of `queue`'s live instances of `slot` (its node's, or its
    /// standby's), as its cloud says now (a bootstrap token is good only there:
    /// `api/bootstrap.rs`). `false` from a provider that boots no instances.
    fn is_instance_of<'a>(
        &'a self,
        queue: &'a Queue,
        instance_id: &'a str,
        slot: crate::model::queue::Slot,
    ) -> BoxFuture<'a, Result<bool, FleetError>> {
        let _ = (queue, instance_id, slot);
        Box::pin(async { Ok(false) })
    }

    /// Stops looking after what it runs, leaving it running: this replica no longer leads,
    /// and the next leader takes it on (a provider that looks after nothing between calls
    /// has nothing to let go).
    fn let_go(&self) {}
}
