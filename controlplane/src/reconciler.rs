//! The reconciler owns every queue's life: API handlers only record what the operator wants
//! (a new queue is `provisioning`, a deleted one `deleting`) and wake it. It drives each
//! queue there through its provider: a queue to run gets its node made or found (and
//! replaced when it is gone), a queue to delete has its node removed and becomes `deleted`.
//! A queue becomes `running` when its node reports in over the channel (`api/nodes.rs`).
//! Every pass starts from the store, so a control plane that crashed anywhere carries on
//! where it was after a restart; at start it also removes what the provider holds for no
//! live queue (a crash between "launched" and "recorded").

use crate::dns::Zone;
use crate::fleet::Provider;
use crate::nodes::Bootstraps;
use crate::queues::{Queue, Status};
use crate::store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How long a deleted queue's data is kept for its node's last report.
const LAST_REPORT_WITHIN: Duration = Duration::from_secs(120);

pub struct Reconciler {
    store: Store,
    fleet: Arc<dyn Provider>,
    zone: Arc<Zone>,
    bootstraps: Arc<Bootstraps>,
    /// Wakes it for a pass now (a queue created or deleted).
    wake: Arc<Notify>,
    /// How often every queue is checked even when nothing asks (an instance that vanished).
    recheck_every: Duration,
    /// The queues being driven now: a pass leaves them to the drive under way.
    driving: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Reconciler {
    /// Drives `store`'s queues through `fleet`, woken by `wake` and every `recheck_every`.
    pub fn new(
        store: Store,
        fleet: Arc<dyn Provider>,
        zone: Arc<Zone>,
        bootstraps: Arc<Bootstraps>,
        wake: Arc<Notify>,
        recheck_every: Duration,
    ) -> Reconciler {
        Reconciler {
            store,
            fleet,
            zone,
            bootstraps,
            wake,
            recheck_every,
            driving: Default::default(),
        }
    }

    /// Runs for the life of the control plane.
    pub async fn run(self: Arc<Self>) {
        if let Err(error) = self.remove_orphans().await {
            tracing::warn!(%error, "what the provider holds could not be checked");
        }
        loop {
            if let Err(error) = self.pass() {
                tracing::error!(%error, "a reconciler pass failed");
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(self.recheck_every) => {}
            }
        }
    }

    /// One look at every queue. Each is driven in a task of its own, so a slow one (an
    /// instance booting, a last report awaited) holds up no other, and none twice at once.
    fn pass(self: &Arc<Self>) -> Result<(), StoreError> {
        for queue in self.store.list()? {
            let over = matches!(queue.status, Status::Failed | Status::Deleted);
            if over
                || !self
                    .driving
                    .lock()
                    .expect("never poisoned")
                    .insert(queue.id.clone())
            {
                continue;
            }
            let reconciler = self.clone();
            tokio::spawn(async move {
                reconciler.drive(&queue).await;
                let mut driving = reconciler.driving.lock().expect("never poisoned");
                driving.remove(&queue.id);
                // Asked for something else meanwhile (deleted while it was being placed): a
                // pass now, not at the next recheck.
                let now = reconciler.store.get(&queue.id).ok().flatten();
                if now.is_some_and(|now| now.status != queue.status) {
                    reconciler.wake.notify_one();
                }
            });
        }
        Ok(())
    }

    async fn drive(&self, queue: &Queue) {
        let result = match queue.status {
            Status::Provisioning | Status::Running => self.keep_running(queue).await,
            Status::Deleting => self.finish_deleting(queue).await,
            Status::Failed | Status::Deleted => Ok(()),
        };
        if let Err(error) = result {
            tracing::warn!(queue = %queue.id, %error, "not there yet; tried again later");
        }
    }

    /// Makes sure its node runs, and records where (the zone follows).
    async fn keep_running(&self, queue: &Queue) -> Result<(), Box<dyn std::error::Error>> {
        let bootstrap = self.bootstraps.for_queue(queue);
        let placement = self.fleet.ensure(queue, &bootstrap).await?;
        if placement.recorded_in(queue) {
            return Ok(());
        }
        let recorded = self.store.update(&queue.id, |queue| {
            // Only while it is still to run: a delete meanwhile wins.
            if queue.status.is_live() {
                placement.record_in(queue);
            }
            // Its node reported in before it was recorded: it runs.
            if queue.status == Status::Provisioning && queue.applied_version > 0 {
                queue.status = Status::Running;
            }
            Ok::<_, StoreError>(())
        });
        recorded.await?;
        self.zone.refresh(&self.store)?;
        Ok(())
    }

    /// Stops its node (which reports its last records as it stops), removes its data once
    /// they are in (or [`LAST_REPORT_WITHIN`] has passed: a node that died says nothing),
    /// then records it deleted.
    async fn finish_deleting(&self, queue: &Queue) -> Result<(), Box<dyn std::error::Error>> {
        self.fleet.stop(&queue.id).await?;
        let reported = |queue: &Queue| queue.last_report.is_some();
        let waited = self
            .store
            .wait_for(&queue.id, LAST_REPORT_WITHIN, reported)
            .await?;
        if !waited.as_ref().is_some_and(reported) {
            tracing::warn!(queue = %queue.id, "its node's last report never came: deleting its data without it");
        }
        self.fleet.remove_data(&queue.id).await?;
        let deleted = self.store.update(&queue.id, |queue| {
            queue.status = Status::Deleted;
            queue.node = None;
            queue.resources.clear();
            Ok::<_, StoreError>(())
        });
        deleted.await?;
        tracing::info!(queue = %queue.id, "deleted");
        Ok(())
    }

    /// Removes what the provider holds for queues that are not to run.
    async fn remove_orphans(&self) -> Result<(), Box<dyn std::error::Error>> {
        for id in self.fleet.holdings().await? {
            let live = self
                .store
                .get(&id)?
                .is_some_and(|queue| queue.status.is_live());
            if !live {
                tracing::warn!(queue = %id, "removing what belongs to no live queue");
                self.fleet.stop(&id).await?;
                // A queue being deleted has its data removed by its own pass, after its last
                // report; only what belongs to no queue at all goes now.
                if self.store.get(&id)?.is_none() {
                    self.fleet.remove_data(&id).await?;
                }
            }
        }
        Ok(())
    }
}
