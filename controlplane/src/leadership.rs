//! Which replica leads: the one that runs the reconciler and orders certificates. Every
//! replica serves the API and the DNS; exactly one leads at a time.
//!
//! On etcd, leading means holding the key `PREFIX/leader`, made in a transaction only if
//! absent and bound to a lease the leader keeps alive. A replica that dies stops keeping it
//! alive; etcd deletes the key when the lease runs out, and a waiting replica makes it.
//!
//! **Fencing.** A leader that runs stops acting before another can start: it counts its lease
//! from the moment it *asked* (for the lease, then for each renewal that was answered; etcd
//! counts from when it received the request, which is later), gives up a fifth of the lease
//! before that runs out, whether or not etcd could be reached, and never revokes it, so the
//! key outlives its own count. Its terms then abort and wait for their work. And every store
//! write made while leading carries a [`Fence`]: it commits only while the leader key made at
//! that revision still exists, so a leader paused past its lease (a stopped process, a VM
//! stalled) cannot write over its successor's work. What the fence cannot cover is a call to
//! the provider made by such a paused leader in the instant it resumes, before its own timer
//! fires; each such call is one that is safe to make twice (`ensure`, `stop`).
//!
//! With sled there is one control plane: it leads from the start, for its whole life.

use crate::store::{Fence, Store, StoreError};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Who leads, as this replica sees it: `Some(fence)` while it does.
#[derive(Clone)]
pub struct Leadership {
    now: watch::Receiver<Option<Fence>>,
    /// With sled: the sender, kept so that leadership never ends.
    _alone: Option<std::sync::Arc<watch::Sender<Option<Fence>>>>,
}

impl Leadership {
    /// Starts campaigning (etcd) or leads at once (sled). `replica` names this one in the
    /// leader key, for operators.
    pub fn start(store: &Store, replica: String, lease: Duration) -> Leadership {
        let (tell, now) = watch::channel(None);
        let alone = match store.backend().etcd() {
            None => {
                let _ = tell.send(Some(Fence {
                    key: String::new(),
                    revision: 0,
                }));
                Some(std::sync::Arc::new(tell))
            }
            Some((client, prefix)) => {
                let key = format!("{prefix}{}", crate::store::LEADER);
                tokio::spawn(campaign(client, key, replica, lease, tell));
                None
            }
        };
        Leadership { now, _alone: alone }
    }

    /// Whether this replica leads now.
    pub fn leading(&self) -> bool {
        self.now.borrow().is_some()
    }

    /// The fence of this replica's leadership now, if it leads.
    pub fn fence(&self) -> Option<Fence> {
        self.now.borrow().clone()
    }

    /// Waits until this replica leads; the fence of its leadership.
    pub async fn lead(&mut self) -> Fence {
        loop {
            if let Some(fence) = self.now.borrow_and_update().clone() {
                return fence;
            }
            if self.now.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Returns when the leadership `fence` names is over.
    pub async fn lost(&mut self, fence: &Fence) {
        loop {
            let same = self
                .now
                .borrow_and_update()
                .as_ref()
                .is_some_and(|now| now.revision == fence.revision);
            if !same {
                return;
            }
            if self.now.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Runs `work` with a store fenced by this replica's leadership whenever it leads, and
    /// stops it when the leadership ends; for the life of the process.
    pub async fn while_leading<Work, Running>(mut self, store: Store, work: Work)
    where
        Work: Fn(Store) -> Running,
        Running: std::future::Future<Output = ()>,
    {
        loop {
            let fence = self.lead().await;
            let fenced = store.fenced(fence.clone());
            tokio::select! {
                _ = work(fenced) => {}
                _ = self.lost(&fence) => {}
            }
        }
    }
}

/// Campaigns for `key` for the life of the process, telling `tell` when this replica leads
/// and when it stops.
async fn campaign(
    client: etcd_client::Client,
    key: String,
    replica: String,
    lease: Duration,
    tell: watch::Sender<Option<Fence>>,
) {
    let lease = lease.max(Duration::from_secs(2));
    loop {
        match try_to_lead(&client, &key, &replica, lease).await {
            Ok(Some((lease_id, fence, asked_at))) => {
                tracing::info!(replica = %replica, revision = fence.revision, "leading");
                let _ = tell.send(Some(fence));
                let why = keep_leading(&client, lease_id, lease, asked_at).await;
                // Told at once: the reconciler stops now. The lease is not revoked: it runs
                // out at etcd after this replica's own count of it, so no other replica can
                // lead before this one's work has stopped.
                let _ = tell.send(None);
                tracing::warn!(replica = %replica, %why, "no longer leading");
            }
            Ok(None) => wait_for_vacancy(&client, &key, lease).await,
            Err(error) => {
                tracing::warn!(%error, "cannot campaign for leadership: the store is unavailable");
                tokio::time::sleep(lease / 4).await;
            }
        }
    }
}

/// Makes the leader key if there is none; the lease, the fence and when the lease was asked
/// for (etcd counts it from a moment after that) if this replica now leads.
async fn try_to_lead(
    client: &etcd_client::Client,
    key: &str,
    replica: &str,
    lease: Duration,
) -> Result<Option<(i64, Fence, Instant)>, StoreError> {
    let asked_at = Instant::now();
    let granted = client
        .lease_client()
        .grant(lease.as_secs() as i64, None)
        .await?;
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            replica,
            Some(PutOptions::new().with_lease(granted.id())),
        )]);
    let response = client.kv_client().txn(txn).await?;
    if !response.succeeded() {
        let _ = client.lease_client().revoke(granted.id()).await;
        return Ok(None);
    }
    let revision = response.header().map(|h| h.revision()).unwrap_or_default();
    let fence = Fence {
        key: key.to_string(),
        revision,
    };
    Ok(Some((granted.id(), fence, asked_at)))
}

/// Keeps the lease alive; returns why leadership ends: the lease not renewed in time, or
/// gone. Ends a margin before the lease could run out at etcd, counted from `asked_at` and
/// then from each renewal's sending; a keep-alive stream that breaks (its member lost) is
/// opened again meanwhile.
async fn keep_leading(
    client: &etcd_client::Client,
    lease_id: i64,
    lease: Duration,
    asked_at: Instant,
) -> String {
    let margin = lease / 5;
    let every = lease / 4;
    let mut valid_until = asked_at + lease - margin;
    let mut stream = None;
    loop {
        let sent = Instant::now();
        let answered = tokio::time::timeout_at(valid_until, async {
            let (keeper, answers) = match &mut stream {
                Some(open) => open,
                None => stream.insert(client.lease_client().keep_alive(lease_id).await?),
            };
            keeper.keep_alive().await?;
            answers.message().await
        })
        .await;
        match answered {
            Err(_) => return "the lease could not be renewed in time".into(),
            // The stream broke (its member lost): opened again, while the lease holds.
            Ok(Err(_)) | Ok(Ok(None)) => {
                tracing::info!("the lease's keep-alive stream is opened again");
                stream = None;
                let pause = (lease / 20).min(valid_until.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
                continue;
            }
            Ok(Ok(Some(answer))) if answer.ttl() <= 0 => return "the lease expired".into(),
            Ok(Ok(Some(answer))) => {
                let ttl = Duration::from_secs(answer.ttl() as u64);
                valid_until = sent + ttl.saturating_sub(margin);
            }
        }
        tokio::time::sleep_until((sent + every).min(valid_until)).await;
    }
}

/// Returns when the leader key is deleted (its lease ran out, its leader resigned), or after
/// a lease's time at most, to try again.
async fn wait_for_vacancy(client: &etcd_client::Client, key: &str, lease: Duration) {
    let watched = async {
        let mut stream = client.watch_client().watch(key, None).await.ok()?;
        // Gone already, between the failed transaction and this watch?
        let now = client.kv_client().get(key, None).await.ok()?;
        if now.kvs().is_empty() {
            return Some(());
        }
        while let Ok(Some(response)) = stream.message().await {
            let deleted = response
                .events()
                .iter()
                .any(|event| event.event_type() == etcd_client::EventType::Delete);
            if deleted {
                return Some(());
            }
        }
        None
    };
    if tokio::time::timeout(lease, watched).await == Ok(None) {
        // The store did not answer: not again at once.
        tokio::time::sleep(lease / 4).await;
    }
}
