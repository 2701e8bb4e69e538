//! The queues' records, in sled.
//!
//! Every change is synced before it is answered; the sync (sled's flush) runs on tokio's
//! blocking threads, never on the runtime's workers, so a slow disk delays the requests that
//! wrote but not the rest (health checks, node watches, DNS). (sled's own `flush_async`
//! hops through its thread pool: 0.4 ms more per write, measured.) Reads come from sled's
//! page cache.

use crate::queues::Queue;
use qe_shared::node_channel::Counted;
use std::path::Path;

/// Cheap to clone: sled's handles are shared.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    /// Queue id → the queue's record (JSON).
    queues: sled::Tree,
    /// `QUEUE-ID/TIME` (time as 20 digits, so keys sort by time) → a node's usage record
    /// (JSON; a `getusage` line in stores from before reports were structured).
    usage: sled::Tree,
    /// `QUEUE-ID/TIME` → a node's stats record (likewise).
    stats: sled::Tree,
    /// Moves on with every change to a queue's record, so a request can wait for one (a
    /// node applying a config, a queue coming up) instead of polling.
    changed: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

/// Which of a node's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    Usage,
    Stats,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store: {0}")]
    Sled(#[from] sled::Error),
    #[error("a stored record does not read back: {0}")]
    Record(#[from] serde_json::Error),
}

impl Store {
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let db = sled::Config::new().path(dir).flush_every_ms(None).open()?;
        Ok(Store {
            queues: db.open_tree("queues")?,
            usage: db.open_tree("usage")?,
            stats: db.open_tree("stats")?,
            db,
            changed: std::sync::Arc::new(tokio::sync::watch::channel(0).0),
        })
    }

    /// Saves a new queue's record, synced.
    pub async fn put(&self, queue: &Queue) -> Result<(), StoreError> {
        self.queues.insert(&queue.id, serde_json::to_vec(queue)?)?;
        self.sync().await?;
        self.changed.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Waits until every change made so far is on disk, on a blocking thread.
    async fn sync(&self) -> Result<(), StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .expect("a flush neither panics nor is cancelled")?;
        Ok(())
    }

    /// Changes queue `id`'s record with `change` as one compare-and-swap, synced: two
    /// changes at once each see the other's result (two rotations of one queue both land),
    /// never a read-then-write race. `change` may run more than once, and may refuse with
    /// `Err`, which changes nothing. `None` if there is no such queue.
    pub async fn update<T, E: From<StoreError>>(
        &self,
        id: &str,
        mut change: impl FnMut(&mut Queue) -> Result<T, E>,
    ) -> Result<Option<(Queue, T)>, E> {
        loop {
            let Some(old) = self.queues.get(id).map_err(StoreError::from)? else {
                return Ok(None);
            };
            let mut queue: Queue = serde_json::from_slice(&old).map_err(StoreError::from)?;
            let answer = change(&mut queue)?;
            let new = serde_json::to_vec(&queue).map_err(StoreError::from)?;
            // Nothing changed: nothing to write, sync or wake anyone for.
            if new == old.as_ref() {
                return Ok(Some((queue, answer)));
            }
            let swapped = self
                .queues
                .compare_and_swap(id, Some(&old), Some(new))
                .map_err(StoreError::from)?;
            if swapped.is_ok() {
                self.sync().await?;
                self.changed.send_modify(|n| *n += 1);
                return Ok(Some((queue, answer)));
            }
        }
    }

    /// Waits until queue `id`'s record passes `test`, at most `within`; returns the record as
    /// it was last read (`None` if there is no such queue).
    pub async fn wait_for(
        &self,
        id: &str,
        within: std::time::Duration,
        test: impl Fn(&Queue) -> bool,
    ) -> Result<Option<Queue>, StoreError> {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Marked seen before the read, so a change during it wakes the wait below.
            changes.borrow_and_update();
            let queue = self.get(id)?;
            match &queue {
                Some(queue) if !test(queue) => {}
                _ => return Ok(queue),
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Ok(queue);
            }
        }
    }

    pub fn get(&self, id: &str) -> Result<Option<Queue>, StoreError> {
        match self.queues.get(id)? {
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
            None => Ok(None),
        }
    }

    /// Keeps a report's records (time, JSON) of each kind, synced once for all. One sent
    /// again (its reply was lost) is kept once, as first sent, and counted as already kept;
    /// the sync is waited for then too, since the first request's may still be under way. A
    /// different record at a time already kept is logged, and the first one stays.
    pub async fn keep_reports(
        &self,
        queue_id: &str,
        usage: Vec<(u64, Vec<u8>)>,
        stats: Vec<(u64, Vec<u8>)>,
    ) -> Result<(Counted, Counted), StoreError> {
        let counted = (
            self.keep(queue_id, Report::Usage, usage)?,
            self.keep(queue_id, Report::Stats, stats)?,
        );
        if counted != Default::default() {
            self.sync().await?;
        }
        Ok(counted)
    }

    /// Inserts each record of `kind` whose key is free; unsynced.
    fn keep(
        &self,
        queue_id: &str,
        kind: Report,
        records: Vec<(u64, Vec<u8>)>,
    ) -> Result<Counted, StoreError> {
        let tree = self.tree(kind);
        let mut counted = Counted::default();
        for (time, record) in records {
            let key = report_key(queue_id, time);
            match tree.compare_and_swap(&key, None as Option<&[u8]>, Some(record.as_slice()))? {
                Ok(()) => counted.new += 1,
                Err(kept) => {
                    if kept.current.as_deref() != Some(record.as_slice()) {
                        tracing::warn!(%key, "a record sent again differs from the one kept: the first stays");
                    }
                    counted.already_kept += 1;
                }
            }
        }
        Ok(counted)
    }

    /// The cluster's certificate, if one was issued.
    pub fn certificate(&self) -> Result<Option<crate::certificates::Issued>, StoreError> {
        match self.db.get("certificate")? {
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
            None => Ok(None),
        }
    }

    pub async fn put_certificate(
        &self,
        issued: &crate::certificates::Issued,
    ) -> Result<(), StoreError> {
        self.db.insert("certificate", serde_json::to_vec(issued)?)?;
        self.sync().await
    }

    /// The credentials (JSON) of the account at the ACME `directory`, once made.
    pub fn acme_account(&self, directory: &str) -> Result<Option<String>, StoreError> {
        let value = self.db.get(format!("acme-account/{directory}"))?;
        Ok(value.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()))
    }

    pub async fn put_acme_account(
        &self,
        directory: &str,
        credentials: &str,
    ) -> Result<(), StoreError> {
        self.db
            .insert(format!("acme-account/{directory}"), credentials.as_bytes())?;
        self.sync().await
    }

    fn tree(&self, kind: Report) -> &sled::Tree {
        match kind {
            Report::Usage => &self.usage,
            Report::Stats => &self.stats,
        }
    }

    /// Every record of one queue of one kind, oldest first, as stored.
    pub fn reports_of(&self, queue_id: &str, kind: Report) -> Result<Vec<sled::IVec>, StoreError> {
        self.reports_in(queue_id, kind, 0..u64::MAX)
    }

    /// One queue's records of one kind whose time is in `times`, oldest first, as stored: a
    /// range of keys, so years of history are not read for one day.
    pub fn reports_in(
        &self,
        queue_id: &str,
        kind: Report,
        times: std::ops::Range<u64>,
    ) -> Result<Vec<sled::IVec>, StoreError> {
        let range = report_key(queue_id, times.start)..report_key(queue_id, times.end);
        let values = self.tree(kind).range(range).values();
        Ok(values.collect::<Result<_, _>>()?)
    }

    pub fn list(&self) -> Result<Vec<Queue>, StoreError> {
        self.queues
            .iter()
            .values()
            .map(|value| Ok(serde_json::from_slice(&value?)?))
            .collect()
    }
}

/// `QUEUE-ID/TIME`, the time as 20 digits so that keys sort by time.
fn report_key(queue_id: &str, time: u64) -> String {
    format!("{queue_id}/{time:020}")
}
