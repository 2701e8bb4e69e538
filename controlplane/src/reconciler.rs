//! The reconciler owns every queue's life: API handlers only record what the operator wants
//! (a new queue is `provisioning`, a deleted one `deleting`) and wake it. It drives each
//! queue there through its provider: a queue to run gets its node made or found (and
//! replaced when it is gone), a queue to delete has its node removed and becomes `deleted`.
//! A queue becomes `running` when its node reports in over the channel (`api/nodes.rs`).
//! Every pass starts from the store, so a control plane that crashed anywhere carries on
//! where it was after a restart; at start it also removes what the provider holds for no
//! live queue (a crash between "launched" and "recorded").
//!
//! A node that runs but is not heard from is fenced and replaced on its data ([`crate::silence`]):
//! at each look at every queue, the leader reads when each node was last heard.
//!
//! Only the leading replica reconciles ([`crate::leadership`]): each leadership is a term
//! with its own fenced store; when it ends, every drive of the term is aborted before
//! another replica can lead, and the next leader's first pass carries on from the store.

use crate::dns::Zone;
use crate::fleet::{FleetError, Provider};
use crate::leadership::Leadership;
use crate::model::audit::{self, Actor, Entry, Target};
use crate::model::queue::{Failure, Placement, Queue, Status};
use crate::nodes::Bootstraps;
use crate::silence::{self, Rules};
use crate::store::{Store, StoreError};
use qe_shared::backoff::Backoff;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How long a deleted queue's last report is waited for once its node has stopped, before
/// its records are handed over from its data: a node reports as it stops (its last try
/// ends before it exits), so only a report still on its way from another replica is awaited.
/// The least time one try at starting a new queue's node has before the queue fails.
const ONE_TRY_AT_LEAST: Duration = Duration::from_secs(30);
const LAST_REPORT_SOON: Duration = Duration::from_secs(5);
/// Why a node was started on its standby's copy (audited).
const PROMOTED: &str = "its data was lost: it was started again on its standby's copy";
/// The longest wait between two tries to hand a deleted queue's records over from its data.
const HAND_OVER_AGAIN_AT_MOST: Duration = Duration::from_secs(60);

/// How the reconciler paces itself (from the control plane's config).
#[derive(Clone)]
pub struct Settings {
    /// How often every queue is checked even when nothing asks (an instance that vanished).
    pub recheck_every: Duration,
    /// When a node that is not heard from is replaced.
    pub silence: Rules,
    /// How long a deleted queue's data is kept, at most, for its node's last report; and a
    /// failed queue's, for the operator.
    pub keep_data_for: Duration,
    /// How long a new queue may take to run before it fails.
    pub provision_within: Duration,
    /// Drives that failed, for `/metrics`.
    pub errors: Arc<std::sync::atomic::AtomicU64>,
    /// Queues failed, for `/metrics`.
    pub failed: Arc<std::sync::atomic::AtomicU64>,
}

pub struct Reconciler {
    store: Store,
    fleet: Arc<dyn Provider>,
    zone: Arc<Zone>,
    bootstraps: Arc<Bootstraps>,
    /// Wakes it for a pass now (a queue created or deleted).
    wake: Arc<Notify>,
    settings: Settings,
    /// This term's view of the nodes' silence.
    watch: std::sync::Mutex<silence::Watch>,
    /// The queues being driven now: a pass leaves them to the drive under way.
    driving: std::sync::Mutex<std::collections::HashSet<String>>,
    /// This term's drives: aborted together when the term ends.
    drives: std::sync::Mutex<tokio::task::JoinSet<()>>,
}

impl Reconciler {
    /// Drives `store`'s queues through `fleet`, woken by `wake` and as `settings` say.
    pub fn new(
        store: Store,
        fleet: Arc<dyn Provider>,
        zone: Arc<Zone>,
        bootstraps: Arc<Bootstraps>,
        wake: Arc<Notify>,
        settings: Settings,
    ) -> Reconciler {
        Reconciler {
            store,
            fleet,
            zone,
            bootstraps,
            wake,
            settings,
            watch: Default::default(),
            driving: Default::default(),
            drives: Default::default(),
        }
    }

    /// Runs for the life of the control plane: reconciles while this replica leads.
    pub async fn run(self: Arc<Self>, mut leadership: Leadership) {
        loop {
            let fence = leadership.lead().await;
            let term = Arc::new(Reconciler::new(
                self.store.fenced(fence.clone()),
                self.fleet.clone(),
                self.zone.clone(),
                self.bootstraps.clone(),
                self.wake.clone(),
                self.settings.clone(),
            ));
            tokio::select! {
                _ = term.clone().reconcile() => {}
                _ = leadership.lost(&fence) => {}
            }
            // Nothing of this term goes on once it is over: every drive is aborted and waited
            // for before the next term can start.
            let mut drives = std::mem::take(&mut *term.drives.lock().expect("never poisoned"));
            drives.shutdown().await;
            self.fleet.let_go();
            tracing::warn!("the reconciler stopped: this replica no longer leads");
        }
    }

    /// One term's work: takes on every queue's node, then passes when woken or due.
    async fn reconcile(self: Arc<Self>) {
        if let Err(error) = self.remove_orphans().await {
            tracing::warn!(%error, "what the provider holds could not be checked");
        }
        // A queue created or deleted through another replica reaches this one as a change
        // in the store.
        let mut changes = self.store.changes();
        let mut every_queue = true;
        // Kept across wake-ups: changes more often than this never put off the look at every
        // queue (a vanished instance replaced).
        let mut next_full = tokio::time::Instant::now();
        loop {
            changes.borrow_and_update();
            if every_queue {
                next_full = tokio::time::Instant::now() + self.settings.recheck_every;
            }
            if let Err(error) = self.pass(every_queue).await {
                tracing::error!(%error, "a reconciler pass failed");
            }
            every_queue = tokio::select! {
                _ = self.wake.notified() => false,
                _ = changes.changed() => false,
                _ = tokio::time::sleep_until(next_full) => true,
            };
        }
    }

    /// One look at the queues: at every queue (`every_queue`), or at those asked to change
    /// (provisioning, deleting). Each is driven in a task of its own, so a slow one (an
    /// instance booting, a last report awaited) holds up no other, and none twice at once.
    async fn pass(self: &Arc<Self>, every_queue: bool) -> Result<(), StoreError> {
        let queues = self.store.list().await?;
        if every_queue {
            if let Err(error) = self.fleet.survey().await {
                tracing::warn!(%error, "the fleet could not be surveyed: each queue is looked at on its own");
            }
        }
        let silent = match every_queue {
            true => self.silent(&queues).await,
            false => HashSet::new(),
        };
        let mut drives = self.drives.lock().expect("never poisoned");
        while drives.try_join_next().is_some() {}
        for queue in queues {
            let wanted = match queue.status {
                // A failed queue's data is removed once its time is up.
                Status::Failed => {
                    every_queue && queue.failure.as_ref().is_some_and(|f| !f.data_removed)
                }
                Status::Deleted => false,
                Status::Running => every_queue,
                Status::Provisioning | Status::Deleting => true,
            };
            if !wanted
                || !self
                    .driving
                    .lock()
                    .expect("never poisoned")
                    .insert(queue.id.clone())
            {
                continue;
            }
            let reconciler = self.clone();
            let silent = silent.contains(&queue.id);
            drives.spawn(async move {
                reconciler.drive(&queue, silent).await;
                let now = reconciler.store.get(&queue.id).await.ok().flatten();
                let mut driving = reconciler.driving.lock().expect("never poisoned");
                driving.remove(&queue.id);
                // Asked for something else meanwhile (deleted while it was being placed): a
                // pass now, not at the next recheck.
                if now.is_some_and(|now| now.status != queue.status) {
                    reconciler.wake.notify_one();
                }
            });
        }
        Ok(())
    }

    /// The queues whose node has not been heard from for longer than the silence limit
    /// (none when there is none, or when what was heard cannot be read: a store that cannot
    /// be read is no news about nodes).
    async fn silent(&self, queues: &[Queue]) -> HashSet<String> {
        let Some(limit) = self.settings.silence.limit else {
            return HashSet::new();
        };
        let heard = match self.store.heard().await {
            Ok(heard) => heard,
            Err(error) => {
                tracing::warn!(%error, "when the nodes were last heard could not be read");
                return HashSet::new();
            }
        };
        let now = crate::live::now_ms();
        let boot = self.fleet.boot_within();
        let mut watch = self.watch.lock().expect("never poisoned");
        watch
            .silent(queues, &heard, now, limit, boot)
            .into_iter()
            .collect()
    }

    async fn drive(&self, queue: &Queue, silent: bool) {
        let result = match queue.status {
            Status::Provisioning if !silent => self.provision(queue).await,
            Status::Provisioning | Status::Running if silent => self.replace_silent(queue).await,
            Status::Provisioning | Status::Running => self.keep_running(queue).await,
            Status::Deleting => self.finish_deleting(queue).await,
            Status::Failed => self.finish_failed(queue).await,
            Status::Deleted => Ok(()),
        };
        if let Err(error) = result {
            self.settings.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(queue = %queue.id, %error, "not there yet; tried again later");
        }
    }

    /// Starts a new queue's node, within what is left of `provision_within` since it was
    /// made; a queue not running by then, or whose provider refuses it for good, fails.
    async fn provision(&self, queue: &Queue) -> Result<(), Box<dyn std::error::Error>> {
        let within = self.settings.provision_within;
        let deadline = queue.created + within.as_secs();
        let left = Duration::from_secs(deadline.saturating_sub(crate::unix_now()));
        let overdue = || format!("not running within {} s", within.as_secs());
        // One try has its time even past the deadline (a control plane that was down), so a
        // queue fails for what its provider did, not for when it was looked at.
        let this_try = left.max(ONE_TRY_AT_LEAST);
        let failure = match tokio::time::timeout(this_try, self.keep_running(queue)).await {
            Ok(Err(error)) => match error.downcast_ref::<FleetError>() {
                Some(FleetError::Refused(reason)) => Some(reason.clone()),
                _ if left.is_zero() => Some(overdue()),
                _ => return Err(error),
            },
            Ok(Ok(())) => None,
            Err(_) => Some(overdue()),
        };
        let failure = match failure {
            Some(failure) => failure,
            None if left.is_zero() && !self.runs(queue).await? => overdue(),
            None => return Ok(()),
        };
        self.fail(queue, &failure).await
    }

    /// Whether queue `queue`'s node has said it serves (which makes it `running`).
    async fn runs(&self, queue: &Queue) -> Result<bool, StoreError> {
        let now = self.store.get(&queue.id).await?;
        Ok(now.is_some_and(|now| now.status != Status::Provisioning))
    }

    /// Stops a queue that could not be provisioned, keeps its data for `keep_data_for`, and
    /// says why: in its record (`failure`, shown by the API), the log and the audit.
    async fn fail(&self, queue: &Queue, reason: &str) -> Result<(), Box<dyn std::error::Error>> {
        self.fleet.stop(&queue.id).await?;
        let failed = self.store.update(&queue.id, |queue| {
            // Only one still to be provisioned: a delete, or the node's first word, wins.
            if queue.status == Status::Provisioning {
                queue.status = Status::Failed;
                queue.node = None;
                queue.addresses = None;
                queue.failure = Some(Failure {
                    reason: reason.to_string(),
                    since: crate::unix_now(),
                    data_removed: false,
                });
            }
            Ok::<_, StoreError>(())
        });
        failed.await?;
        self.settings.failed.fetch_add(1, Ordering::Relaxed);
        self.audit(audit::QUEUE_FAIL, queue, reason).await;
        // Logged last: whoever reads the line finds the node stopped and the failure in the
        // queue's record and in the audit.
        tracing::error!(queue = %queue.id, reason, "the queue failed: its node is stopped, its data kept");
        self.zone.refresh(&self.store).await?;
        Ok(())
    }

    /// Removes a failed queue's data once it has been kept for `keep_data_for`.
    async fn finish_failed(&self, queue: &Queue) -> Result<(), Box<dyn std::error::Error>> {
        let Some(failure) = &queue.failure else {
            return Ok(());
        };
        let until = failure.since + self.settings.keep_data_for.as_secs();
        if failure.data_removed || crate::unix_now() < until {
            return Ok(());
        }
        self.fleet.stop(&queue.id).await?;
        self.fleet.remove_data(&queue.id).await?;
        let removed = self.store.update(&queue.id, |queue| {
            if let Some(failure) = &mut queue.failure {
                failure.data_removed = true;
            }
            Ok::<_, StoreError>(())
        });
        removed.await?;
        tracing::info!(queue = %queue.id, "a failed queue's data was removed");
        Ok(())
    }

    /// Fences its node, which has gone silent, and starts another on its data (placed anew,
    /// it is given the provider's boot time before it is judged). A node whose machine its
    /// cloud is bringing back is given that time once more instead, first.
    async fn replace_silent(&self, queue: &Queue) -> Result<(), Box<dyn std::error::Error>> {
        let limit = self.settings.silence.limit.unwrap_or_default();
        if self.fleet.recovering(queue).await {
            let (now, boot) = (crate::live::now_ms(), self.fleet.boot_within());
            let mut watch = self.watch.lock().expect("never poisoned");
            if watch.grant_recovery(&queue.id, now, boot) {
                tracing::warn!(queue = %queue.id, wait_secs = (boot + limit).as_secs(), "its node is not heard from, but its machine is being brought back: waiting for it");
                return Ok(());
            }
        }
        tracing::warn!(queue = %queue.id, silent_for_more_than_secs = limit.as_secs(), "its node is not heard from: replacing it");
        self.fleet.fence(queue).await?;
        self.settings
            .silence
            .replaced
            .fetch_add(1, Ordering::Relaxed);
        let mut reason = format!("not heard from for more than {} s", limit.as_secs());
        let promoted;
        let queue = match self.promotes_standby_of(queue) {
            true => {
                promoted = self.promote_standby(queue).await?;
                // Judged from now on, with its time to start serving: should placing it fail
                // now, the next pass must not take the old node's silence for the new one's.
                let (now, boot) = (crate::live::now_ms(), self.fleet.boot_within());
                let mut watch = self.watch.lock().expect("never poisoned");
                watch.placed(&queue.id, now, boot);
                drop(watch);
                reason += &format!(
                    ": its standby's machine serves now, at epoch {}",
                    promoted.epoch
                );
                &promoted
            }
            false => queue,
        };
        self.audit(audit::NODE_REPLACE, queue, &reason).await;
        self.keep_running(queue).await?;
        tracing::info!(queue = %queue.id, %reason, "a silent node was replaced");
        Ok(())
    }

    /// Whether a silent node of `queue` is replaced by its standby: on a provider whose
    /// standbys have machines of their own, if its node last said the standby was in sync (one
    /// still catching up from nothing holds little of the queue).
    fn promotes_standby_of(&self, queue: &Queue) -> bool {
        queue.replicas == 2 && queue.standby_in_sync && self.fleet.promotes_standbys()
    }

    /// The fenced node's standby serves from now on: one store write moves the serving slot
    /// to its machine and the epoch on (so the fenced node, should it ever serve again, is
    /// superseded), with a new config version (the standby's machine is told to serve, the
    /// next standby what to follow) and certificate generation (the standby's machine has no
    /// certificate of its own yet, and must not wait the hour between two issues).
    async fn promote_standby(&self, queue: &Queue) -> Result<Queue, StoreError> {
        let promoted = self.store.update(&queue.id, |queue| {
            queue.serving = queue.serving.other();
            queue.epoch += 1;
            queue.config_version += 1;
            queue.certificate_generation += 1;
            queue.standby_in_sync = false;
            Ok::<_, StoreError>(())
        });
        let promoted = promoted.await?.map(|(queue, ())| queue);
        let promoted = promoted.unwrap_or_else(|| queue.clone());
        tracing::warn!(queue = %queue.id, serving = ?promoted.serving, epoch = promoted.epoch, "its standby was promoted");
        Ok(promoted)
    }

    /// Keeps an audit entry of what the control plane did on its own to `queue`'s node.
    async fn audit(&self, action: &str, queue: &Queue, reason: &str) {
        let target = Target {
            id: queue.id.clone(),
            account: queue.account.clone(),
        };
        let entry = Entry::new(Actor::ControlPlane, action, target, 200).because(reason);
        self.store.record_audit(entry).await;
    }

    /// Its standby's copy was made its node's data: audited, a new certificate generation (the
    /// node's certificate went with its disk, and the hour between two issues must not hold
    /// back the new one) and the next epoch. Returns the queue as it is now.
    async fn promoted(&self, queue: &Queue) -> Result<Queue, StoreError> {
        self.audit(audit::NODE_RESTART, queue, PROMOTED).await;
        tracing::warn!(queue = %queue.id, reason = PROMOTED, "its node was restarted");
        let renewed = self.store.update(&queue.id, |queue| {
            queue.certificate_generation += 1;
            queue.config_version += 1;
            queue.epoch += 1;
            Ok::<_, StoreError>(())
        });
        let promoted = renewed.await?.map(|(queue, ())| queue);
        Ok(promoted.unwrap_or_else(|| queue.clone()))
    }

    /// Makes sure its node runs, and records where (the zone follows).
    async fn keep_running(&self, queue: &Queue) -> Result<(), Box<dyn std::error::Error>> {
        let bootstrap = self.bootstraps.for_queue(queue);
        let promoted;
        let queue = match queue.replicas == 2 && self.fleet.promote_if_data_lost(queue).await? {
            true => {
                promoted = self.promoted(queue).await?;
                self.fleet.promotion_recorded(queue).await?;
                &promoted
            }
            false => queue,
        };
        let mut placement = self.fleet.ensure(queue, &bootstrap).await?;
        let node_placed_anew = !placement.node_recorded_in(queue);
        if node_placed_anew {
            // Judged for silence only once it has been heard, or has had its time to boot.
            // (Not for its standby's restart: a standby that keeps failing would keep a silent
            // node from being judged.)
            let (now, boot) = (crate::live::now_ms(), self.fleet.boot_within());
            let mut watch = self.watch.lock().expect("never poisoned");
            watch.placed(&queue.id, now, boot);
        }
        if queue.replicas == 2 && node_placed_anew {
            // The name moves to the node now, not once its next standby is placed (on EC2 an
            // instance launch): clients reach a promoted standby's machine at once.
            self.record(queue, &placement, Placement::record_node_in)
                .await?;
        }
        if queue.replicas == 2 {
            self.keep_standby(queue, &mut placement).await?;
        }
        if let Some(reason) = placement.restarted_because {
            // Audited before it is logged: whoever reads the log finds the entry.
            self.audit(audit::NODE_RESTART, queue, reason).await;
            tracing::warn!(queue = %queue.id, reason, "its node was restarted");
        }
        if placement.recorded_in(queue) {
            return Ok(());
        }
        self.record(queue, &placement, Placement::record_in).await
    }

    /// Makes sure `queue`'s standby runs, following its node at `placement` (what it runs on
    /// goes into `placement`). One its node has gone without for the silence limit is
    /// fenced first and started again on its copy. A standby that cannot be placed now leaves
    /// the node serving (durability 2 is answered 507 meanwhile) and recorded: it is tried
    /// again at the next pass.
    async fn keep_standby(
        &self,
        queue: &Queue,
        placement: &mut Placement,
    ) -> Result<(), Box<dyn std::error::Error>> {
        if self.standby_absent(queue) {
            self.replace_absent_standby(queue).await?;
        }
        let standby = crate::fleet::StandbyBoot {
            key: self.bootstraps.tokens.replication_key(&queue.id),
            bootstrap: self.bootstraps.for_standby(queue),
        };
        match self.fleet.ensure_standby(queue, placement, &standby).await {
            Ok(standby) => {
                let placed_anew = standby
                    .iter()
                    .any(|(kind, id)| queue.resources.get(kind) != Some(id));
                if placed_anew {
                    tracing::info!(queue = %queue.id, standby = ?standby, "its standby was placed");
                    // It reaches its node only once it has booted.
                    let (now, boot) = (crate::live::now_ms(), self.fleet.boot_within());
                    let mut watch = self.watch.lock().expect("never poisoned");
                    watch.standby_placed(&queue.id, now, boot);
                }
                placement.resources.extend(standby)
            }
            Err(error) => {
                tracing::error!(queue = %queue.id, %error, "its standby could not be placed")
            }
        }
        Ok(())
    }

    /// Whether `queue`'s node has gone without its standby for longer than the silence limit
    /// (none when there is no limit).
    fn standby_absent(&self, queue: &Queue) -> bool {
        let Some(limit) = self.settings.silence.limit else {
            return false;
        };
        let now = crate::live::now_ms();
        let mut watch = self.watch.lock().expect("never poisoned");
        watch.standby_absent(queue, now, limit)
    }

    /// Fences a standby its node has gone without for the silence limit (a hung process or
    /// machine, one cut off from its node), keeping its copy; audited and counted. The caller
    /// then starts another on the copy, which catches up from the node.
    async fn replace_absent_standby(
        &self,
        queue: &Queue,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let limit = self.settings.silence.limit.unwrap_or_default();
        let mut reason = format!(
            "its node has had no standby attached for more than {} s",
            limit.as_secs()
        );
        tracing::warn!(queue = %queue.id, %reason, "its standby does not follow its node: replacing it");
        self.fleet.fence_standby(queue).await?;
        self.settings
            .silence
            .standbys_replaced
            .fetch_add(1, Ordering::Relaxed);
        // Judged anew from now: the next is given its boot time (longer after each
        // replacement in a row), whether or not it is placed at once.
        let (now, boot) = (crate::live::now_ms(), self.fleet.boot_within());
        let in_a_row = self
            .watch
            .lock()
            .expect("never poisoned")
            .standby_replaced(&queue.id, now, boot, limit);
        if in_a_row > 1 {
            reason += &format!(" ({in_a_row} replacements in a row: see its node's log)");
            tracing::error!(queue = %queue.id, in_a_row, "its standby was replaced again and again, none staying: the next is judged later each time; see its node's log for why it is dropped");
        }
        self.audit(audit::STANDBY_REPLACE, queue, &reason).await;
        Ok(())
    }

    /// Writes `placement` into `queue`'s record with `write`, and moves the zone's records to
    /// it.
    async fn record(
        &self,
        queue: &Queue,
        placement: &Placement,
        write: fn(&Placement, &mut Queue),
    ) -> Result<(), Box<dyn std::error::Error>> {
        let recorded = self.store.update(&queue.id, |queue| {
            // Only while it is still to run: a delete meanwhile wins.
            if queue.status.is_live() {
                write(placement, queue);
            }
            // Its node reported in before it was recorded: it runs.
            if queue.status == Status::Provisioning && queue.applied_version > 0 {
                queue.status = Status::Running;
            }
            Ok::<_, StoreError>(())
        });
        recorded.await?;
        self.zone.refresh(&self.store).await?;
        Ok(())
    }

    /// Stops its node (which reports its last records as it stops), removes its data once
    /// they are in, then records it deleted. A node that could not report as it stopped (its
    /// control plane was down, or it had died) still holds them in its data: they are handed
    /// over from there, tried again until they are in or the data has been kept for
    /// `keep_data_for` since the delete (a restart of the control plane carries on).
    async fn finish_deleting(&self, queue: &Queue) -> Result<(), Box<dyn std::error::Error>> {
        self.fleet.stop(&queue.id).await?;
        let since = queue.deleting_since.unwrap_or_else(crate::unix_now);
        let keep_until = since + self.settings.keep_data_for.as_secs();
        let left = || Duration::from_secs(keep_until.saturating_sub(crate::unix_now()));
        // A failed queue whose node never said it serves has made no record to wait for.
        let never_ran = queue.failure.is_some() && queue.applied_version == 0;
        let mut reported = never_ran || self.last_report_within(queue, LAST_REPORT_SOON).await?;
        let mut again_after = Backoff::new(Duration::from_secs(1), HAND_OVER_AGAIN_AT_MOST);
        while !reported && !left().is_zero() {
            tracing::warn!(queue = %queue.id, "its node's last report has not come: handing its records over from its data");
            let bootstrap = self.bootstraps.for_queue(queue);
            match self.fleet.report_last(queue, &bootstrap, left()).await {
                Ok(true) => {}
                // Nothing can hand them over: waiting keeps the data for nobody.
                Ok(false) => break,
                Err(error) => {
                    tracing::warn!(queue = %queue.id, %error, "its records could not be handed over yet")
                }
            }
            reported = self
                .last_report_within(queue, LAST_REPORT_SOON.min(left()))
                .await?;
            if !reported {
                tokio::time::sleep(again_after.next_wait().min(left())).await;
            }
        }
        if !reported {
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

    /// Whether `queue`'s node has made its last report, waiting up to `within` for it.
    async fn last_report_within(
        &self,
        queue: &Queue,
        within: Duration,
    ) -> Result<bool, StoreError> {
        let reported = |queue: &Queue| queue.last_report.is_some();
        let waited = self.store.wait_for(&queue.id, within, reported).await?;
        Ok(waited.as_ref().is_some_and(reported))
    }

    /// Removes what the provider holds for queues that are not to run. After a restore from a
    /// backup, a node of a queue the store does not know is one created after the backup, not
    /// a leftover: it is left running, with its data, for the operator (docs/deploy.md).
    async fn remove_orphans(&self) -> Result<(), Box<dyn std::error::Error>> {
        let restored = self.store.restored().await?;
        for id in self.fleet.holdings().await? {
            if let (Some(backup_made), None) = (restored, self.store.get(&id).await?) {
                tracing::warn!(queue = %id, backup_made, "a node of a queue this store does not know (created after the backup it was restored from): left running, with its data");
                continue;
            }
            let live = self
                .store
                .get(&id)
                .await?
                .is_some_and(|queue| queue.status.is_live());
            if !live {
                tracing::warn!(queue = %id, "removing what belongs to no live queue");
                self.fleet.stop(&id).await?;
                // A queue being deleted has its data removed by its own pass, after its last
                // report; only what belongs to no queue at all goes now.
                if self.store.get(&id).await?.is_none() {
                    self.fleet.remove_data(&id).await?;
                }
            }
        }
        Ok(())
    }
}
