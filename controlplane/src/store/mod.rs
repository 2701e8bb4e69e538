//! The control plane's state: the queues' records, the nodes' usage and stats records, the
//! certificates, the ACME account, the pending DNS-01 values and the node secret.
//!
//! [`Store`] gives them their types; underneath is a [`Backend`], a key-value store with
//! compare-and-swap, of one of two kinds ([`StoreConfig`]):
//! - [`sled`](sled_backend): embedded, in `DATA_DIR/state`, for one control plane on one
//!   host (the default);
//! - [`etcd`](etcd_backend): a cluster shared by several control-plane replicas, so that the
//!   loss of any one host loses no state and stops no service.
//!
//! Every change is durable before it is answered (sled: synced; etcd: committed by a
//! majority). Every change that must not race is one compare-and-swap against the version
//! read (a sled value, an etcd revision), retried on a lost race, never a read-then-write.
//! Writes made while leading ([`crate::leadership`]) carry a [`Fence`]: on etcd they commit
//! only while the lease they were made under still holds.

mod accounts;
mod builds;
mod changes;
mod etcd_backend;
mod sled_backend;

use crate::model::queue::Queue;
use async_trait::async_trait;
use qe_shared::node_channel::Counted;
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

pub use etcd_backend::EtcdBackend;

/// What one look of the store's upkeep ([`crate::upkeep`]) did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UpkeepDone {
    /// The store's revision as it began.
    pub revision: i64,
    /// The revision the history was compacted to, if it was.
    pub compacted_to: Option<i64>,
    /// Members defragmented, and the bytes they had free.
    pub defragmented: usize,
    pub freed: i64,
}

/// `[store]`: where the state lives.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "lowercase")]
pub enum StoreConfig {
    /// sled, in `DATA_DIR/state`: one control plane.
    #[default]
    Sled,
    /// An etcd cluster, shared by every replica.
    Etcd(EtcdConfig),
}

/// `[store]` with `kind = "etcd"`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// The cluster's client URLs (`http://10.0.0.1:2379`, …); the client fails over
    /// between them.
    pub endpoints: Vec<String>,
    /// Every key starts with this. Default `/qe/CLUSTER/`: clusters may share one etcd.
    pub prefix: Option<String>,
    /// Seconds a request to etcd may take before it is answered `unavailable` (a majority
    /// lost). Default 5.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// The leader's lease, in seconds: a replica that dies is replaced as leader within
    /// this. Default 5.
    #[serde(default = "default_lease_secs")]
    pub lease_secs: u64,
    /// TLS to etcd (`https://` endpoints): the root (PEM file) the members' certificates are
    /// checked against. None: plain HTTP (a private network only).
    pub ca_file: Option<std::path::PathBuf>,
    /// The control plane's client certificate and key (PEM files), for an etcd that asks
    /// for one (`--client-cert-auth`).
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// etcd's user (an etcd with `auth enable`), and the file its password is read from
    /// (never the config itself, which is shown in logs and backups).
    pub user: Option<String>,
    pub password_file: Option<std::path::PathBuf>,
}

fn default_timeout_secs() -> u64 {
    5
}

fn default_lease_secs() -> u64 {
    5
}

/// What a compare-and-swap checks a stored value by.
#[derive(Debug, Clone, PartialEq)]
pub enum Version {
    /// sled: the value itself.
    Value(Vec<u8>),
    /// etcd: the revision that last changed the key.
    Revision(i64),
}

/// A value as stored, with its version.
pub struct Stored {
    pub value: Vec<u8>,
    pub version: Version,
}

/// The values of a range of keys, in key order, and the latest revision that changed one of
/// them (etcd only).
pub struct Listed {
    pub values: Vec<Vec<u8>>,
    pub revision: Option<u64>,
}

/// Proof of leadership a write carries: the revision at which the leader's key was made. On
/// etcd, a fenced write commits only while that key (and so the lease) still exists.
#[derive(Debug, Clone)]
pub struct Fence {
    pub key: String,
    pub revision: i64,
}

/// What [`Backend::follow_changes`] calls: with the key that changed, or `None` for "maybe
/// anything".
pub type OnChange = Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// A key-value store with compare-and-swap: what a backend provides.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    async fn get(&self, key: &str) -> Result<Option<Stored>, StoreError>;
    /// Keys from `start` (included) to `end` (excluded).
    async fn range(&self, start: &str, end: &str) -> Result<Listed, StoreError>;
    /// The values of the first `limit` keys from `start` to `end`, in key order: a page.
    async fn range_first(
        &self,
        start: &str,
        end: &str,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError>;
    /// How many keys there are from `start` to `end`, values unread.
    async fn count(&self, start: &str, end: &str) -> Result<u64, StoreError>;
    /// Puts `value` at `key` if the key is still at `expected` (`None`: absent) and `fence`
    /// holds; durable. `false` if it was not.
    async fn swap(
        &self,
        key: &str,
        expected: Option<&Version>,
        value: Vec<u8>,
        fence: Option<&Fence>,
    ) -> Result<bool, StoreError>;
    /// Puts each entry whose key is absent, durable once for all; for each, `None` if it was
    /// put, else the value already there.
    async fn put_absent(
        &self,
        entries: Vec<(String, Vec<u8>)>,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError>;
    /// Keys from `start` to `end` and the value at `key`, as of one moment: what the zone is
    /// built from must be one state, or two replicas could serve one serial with two zones.
    async fn range_and_get(
        &self,
        start: &str,
        end: &str,
        key: &str,
    ) -> Result<(Listed, Option<Stored>), StoreError> {
        // One process writes a sled store: a change between the two reads is followed by
        // a wake-up, and the zone is read again.
        Ok((self.range(start, end).await?, self.get(key).await?))
    }
    /// The value of the last key from `start` to `end` (excluded), if any.
    async fn range_last(&self, start: &str, end: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Deletes every key from `start` to `end` and puts `entries` (keys in that range), as one
    /// durable write, if `fence` holds.
    async fn replace_range(
        &self,
        start: &str,
        end: &str,
        entries: Vec<(String, Vec<u8>)>,
        fence: Option<&Fence>,
    ) -> Result<(), StoreError>;
    /// Every key and value (a backup).
    async fn dump(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    /// Calls `changed` after every change to a key starting with one of `prefixes`, made by
    /// anyone (another replica too), with the key; with `None` when changes may have been
    /// missed (a watch made again). Runs for the life of the process.
    fn follow_changes(&self, prefixes: Vec<String>, changed: OnChange);
    /// The etcd client, for leader election.
    fn etcd(&self) -> Option<(etcd_client::Client, String)>;
    /// Keeps the store's own files from growing without end (`upkeep.rs`): compacts the
    /// history before `compact_before` (a revision seen a while ago), defragments each member
    /// whose free space inside its file is over `defragment_over` bytes, one at a time. The
    /// revision now, for the next call; `None` from a store with no history (sled).
    async fn upkeep(
        &self,
        _compact_before: Option<i64>,
        _defragment_over: i64,
    ) -> Result<Option<UpkeepDone>, StoreError> {
        Ok(None)
    }
}

/// Cheap to clone.
#[derive(Clone)]
pub struct Store {
    kv: Arc<dyn Backend>,
    /// Tells of every change to a queue's record or the DNS-01 values (here or on another
    /// replica), so a request can wait for one (a node applying a config, a queue coming up)
    /// instead of polling, and the zone follows.
    changed: changes::Changes,
    /// Set while leading: the writes this handle makes are fenced by it.
    fence: Option<Fence>,
    /// What the zone's serials count from on a store with revisions ([`SERIAL_BASE`]).
    serial_base: Arc<tokio::sync::OnceCell<u64>>,
    /// The [`RESTORED`] marker once read: set by a restore into an empty store, before any
    /// control plane runs on it, so it never changes under a running one. Read on every
    /// refused node token, which must cost no store read.
    restored: Arc<tokio::sync::OnceCell<Option<u64>>>,
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
    Sled(#[from] ::sled::Error),
    /// A write whose sync failed, now or before (`qe_shared::synced_sled`).
    #[error(transparent)]
    NotSynced(#[from] qe_shared::synced_sled::NotSynced),
    /// etcd did not answer (no majority, no member reachable) or refused.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    #[error("a stored record does not read back: {0}")]
    Record(#[from] serde_json::Error),
    #[error("the store holds state already: restore into an empty one")]
    NotEmpty,
    #[error("{0}")]
    Config(String),
    /// A fenced write after this replica's leadership ended.
    #[error("no longer the leader")]
    NotLeader,
}

/// Key prefixes.
const QUEUES: &str = "queues/";
const CHALLENGES: &str = "challenges";
const CERTIFICATE: &str = "certificate";
const NODE_SECRET: &str = "node-secret";
/// The leader's key ([`crate::leadership`]): bound to its lease, so never in a backup.
pub const LEADER: &str = "leader";
/// Set by a restore: the state is older than what the provider may hold.
const RESTORED: &str = "restored";
/// What the zone's serials count from on etcd, where they are `base + revision`: set once,
/// at the first read of a new store (seconds since 1970 then, above any serial a one-host
/// install served before it), or by a restore past the serial the backup's zone had. A
/// store's revisions start again at 1, a zone's serial must never go back.
const SERIAL_BASE: &str = "zone-serial-base";
/// One control plane (sled), whose serials are its own (seconds since 1970, or one more than
/// the last): every serial its zone has served is at most this. It is raised before a serial
/// past it is served, so a restart starts above it (see `dns::zone`).
const SERIAL_RESERVED: &str = "zone-serial-reserved";

/// When each replica last heard each queue's node (`heard/REPLICA`, [`crate::silence`]):
/// rewritten every few seconds, worth nothing in a backup.
const HEARD: &str = "heard/";

/// What each replica's DNS serves of the DNS-01 values (`served/REPLICA`,
/// [`crate::dns::served`]): rewritten every few seconds, worth nothing in a backup.
const SERVED: &str = "served/";

/// What the node of a queue this store does not know said of itself (`strays/QUEUE-ID`,
/// `api/strays.rs`): after a restore, a node made since reports its kept config, so that it
/// can be adopted where the provider cannot read it (an instance's volume). One per queue,
/// rewritten while the node goes on reporting.
const STRAYS: &str = "strays/";

/// The queues' records and the DNS-01 values: what the zone and the node watches follow.
fn followed() -> Vec<String> {
    vec![QUEUES.to_string(), CHALLENGES.to_string()]
}

impl Store {
    /// Opens the store `config` names (sled in `dir`); `cluster` names the default etcd
    /// prefix.
    pub async fn open(
        config: &StoreConfig,
        dir: &Path,
        cluster: &str,
    ) -> Result<Store, StoreError> {
        let kv: Arc<dyn Backend> = match config {
            StoreConfig::Sled => Arc::new(sled_backend::SledBackend::open(dir)?),
            StoreConfig::Etcd(etcd) => Arc::new(EtcdBackend::connect(etcd, cluster).await?),
        };
        let changed = changes::Changes::default();
        let heard = changed.clone();
        let on_change: OnChange = Arc::new(move |key| match key.map(|k| k.strip_prefix(QUEUES)) {
            Some(Some(id)) => heard.queue_changed(id),
            Some(None) => heard.changed(),
            None => heard.anything_changed(),
        });
        kv.follow_changes(followed(), on_change);
        Ok(Store {
            kv,
            changed,
            fence: None,
            serial_base: Arc::default(),
            restored: Arc::default(),
        })
    }

    /// This store, its writes fenced by `fence` (a leader's).
    pub fn fenced(&self, fence: Fence) -> Store {
        Store {
            fence: Some(fence),
            ..self.clone()
        }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.kv
    }

    /// A receiver that sees every change the zone and the node watches follow.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.everything()
    }

    /// Saves a new queue's record; `false` if one with its id exists.
    pub async fn put(&self, queue: &Queue) -> Result<bool, StoreError> {
        let key = format!("{QUEUES}{}", queue.id);
        let value = serde_json::to_vec(queue)?;
        let put = self.kv.swap(&key, None, value, self.fence.as_ref()).await?;
        if put {
            self.changed.queue_changed(&queue.id);
        }
        Ok(put)
    }

    /// Changes queue `id`'s record with `change` as one compare-and-swap: two changes at
    /// once each see the other's result (two rotations of one queue both land), never a
    /// read-then-write race. `change` may run more than once, and may refuse with `Err`,
    /// which changes nothing. `None` if there is no such queue.
    pub async fn update<T, E: From<StoreError>>(
        &self,
        id: &str,
        change: impl FnMut(&mut Queue) -> Result<T, E>,
    ) -> Result<Option<(Queue, T)>, E> {
        let key = format!("{QUEUES}{id}");
        let updated = self.swap_json(&key, change).await?;
        if let Some((_, _, true)) = &updated {
            self.changed.queue_changed(id);
        }
        Ok(updated.map(|(queue, answer, _)| (queue, answer)))
    }

    /// Queue `id`'s record once there is one, waiting up to `within`: a queue reserved in
    /// its account a moment ago has no record until its create finishes.
    pub async fn wait_for_record(
        &self,
        id: &str,
        within: std::time::Duration,
    ) -> Result<Option<Queue>, StoreError> {
        self.wait_until(id, within, |queue| queue.is_some()).await
    }

    /// Waits until queue `id`'s record passes `test`, at most `within`; returns the record as
    /// it was last read (`None` if there is no such queue).
    pub async fn wait_for(
        &self,
        id: &str,
        within: std::time::Duration,
        test: impl Fn(&Queue) -> bool,
    ) -> Result<Option<Queue>, StoreError> {
        // An absent record ends the wait: there is nothing to pass the test.
        let done = |queue: Option<&Queue>| queue.is_none_or(&test);
        self.wait_until(id, within, done).await
    }

    /// Queue `id`'s record (or its absence) once `done` says so, or after `within`.
    async fn wait_until(
        &self,
        id: &str,
        within: std::time::Duration,
        done: impl Fn(Option<&Queue>) -> bool,
    ) -> Result<Option<Queue>, StoreError> {
        // This queue's changes only: another queue's wakes no one here.
        let mut subscription = self.changed.of_queue(id);
        let changes = &mut subscription.receiver;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Marked seen before the read, so a change during it wakes the wait below.
            changes.borrow_and_update();
            let queue = self.get(id).await?;
            if done(queue.as_ref()) {
                return Ok(queue);
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Ok(queue);
            }
        }
    }

    pub async fn get(&self, id: &str) -> Result<Option<Queue>, StoreError> {
        match self.kv.get(&format!("{QUEUES}{id}")).await? {
            Some(stored) => Ok(Some(serde_json::from_slice(&stored.value)?)),
            None => Ok(None),
        }
    }

    pub async fn list(&self) -> Result<Vec<Queue>, StoreError> {
        Ok(self.zone_inputs().await?.queues)
    }

    /// What the zone is built from, read at once: the queues, the pending DNS-01 values, and
    /// (etcd) the latest revision that changed one of them, the same on every replica.
    pub async fn zone_inputs(&self) -> Result<ZoneInputs, StoreError> {
        let (listed, challenges) = self
            .kv
            .range_and_get(QUEUES, &end_of(QUEUES), CHALLENGES)
            .await?;
        let queues = listed
            .values
            .iter()
            .map(|value| serde_json::from_slice(value))
            .collect::<Result<_, _>>()?;
        let revision = match (&challenges, listed.revision) {
            (
                Some(Stored {
                    version: Version::Revision(r),
                    ..
                }),
                Some(queues),
            ) => Some(queues.max(*r as u64)),
            (_, revision) => revision,
        };
        let serial = match revision {
            Some(revision) => Some(self.serial_base().await? + revision),
            None => None,
        };
        let challenges = match challenges {
            Some(stored) => serde_json::from_slice(&stored.value)?,
            None => Vec::new(),
        };
        Ok(ZoneInputs {
            queues,
            challenges,
            serial,
        })
    }

    /// [`SERIAL_BASE`]: the store's, or now if it has none yet (the first replica's wins).
    async fn serial_base(&self) -> Result<u64, StoreError> {
        let base = self.serial_base.get_or_try_init(|| async {
            let now = crate::unix_now().to_string().into_bytes();
            let kept = self
                .kv
                .put_absent(vec![(SERIAL_BASE.into(), now.clone())])
                .await?;
            let text = kept.into_iter().next().flatten().unwrap_or(now);
            Ok::<_, StoreError>(String::from_utf8_lossy(&text).parse().unwrap_or_default())
        });
        Ok(*base.await?)
    }

    /// The highest serial a zone with serials of its own may have served (0 for none yet).
    pub async fn zone_serial_reserved(&self) -> Result<u32, StoreError> {
        Ok(self.serial_reserve().await?.1)
    }

    /// Raises [`Self::zone_serial_reserved`] to `serial` (never lowers it), durably, before a
    /// serial up to it is served.
    pub async fn reserve_zone_serial(&self, serial: u32) -> Result<(), StoreError> {
        loop {
            let (old, kept) = self.serial_reserve().await?;
            if kept >= serial {
                return Ok(());
            }
            let expected = old.as_ref().map(|stored| &stored.version);
            let new = serial.to_string().into_bytes();
            if self.kv.swap(SERIAL_RESERVED, expected, new, None).await? {
                return Ok(());
            }
        }
    }

    /// [`SERIAL_RESERVED`] as kept (for a swap) and as a number (0 for none).
    async fn serial_reserve(&self) -> Result<(Option<Stored>, u32), StoreError> {
        let kept = self.kv.get(SERIAL_RESERVED).await?;
        let serial = kept
            .as_ref()
            .and_then(|stored| String::from_utf8_lossy(&stored.value).parse().ok())
            .unwrap_or(0);
        Ok((kept, serial))
    }

    /// Changes the pending DNS-01 values (name ordered, value) with `change`, as one
    /// compare-and-swap, so that every replica's zone serves them.
    pub async fn change_challenges(
        &self,
        change: impl Fn(&mut Vec<(String, String)>),
    ) -> Result<(), StoreError> {
        loop {
            let old = self.kv.get(CHALLENGES).await?;
            let mut values: Vec<(String, String)> = match &old {
                Some(stored) => serde_json::from_slice(&stored.value)?,
                None => Vec::new(),
            };
            change(&mut values);
            let new = serde_json::to_vec(&values)?;
            let expected = old.as_ref().map(|stored| &stored.version);
            // Fenced while leading: a leader that lost its lease publishes nothing more.
            let fence = self.fence.as_ref();
            if self.kv.swap(CHALLENGES, expected, new, fence).await? {
                self.changed.changed();
                return Ok(());
            }
        }
    }

    /// Keeps a report's records (time, JSON) of each kind, durable once for all. One sent
    /// again (its reply was lost) is kept once, as first sent, and counted as already kept. A
    /// different record at a time already kept is logged, and the first one stays.
    pub async fn keep_reports(
        &self,
        queue_id: &str,
        usage: Vec<(u64, Vec<u8>)>,
        stats: Vec<(u64, Vec<u8>)>,
    ) -> Result<(Counted, Counted), StoreError> {
        let entries = |kind, records: Vec<(u64, Vec<u8>)>| {
            records
                .into_iter()
                .map(move |(time, record)| (report_key(kind, queue_id, time), record))
                .collect::<Vec<_>>()
        };
        let usage = entries(Report::Usage, usage);
        let usage_count = usage.len();
        let mut all = usage;
        all.extend(entries(Report::Stats, stats));
        let sent: Vec<_> = all.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let kept = self.kv.put_absent(all).await?;
        let mut counted = (Counted::default(), Counted::default());
        for (i, ((key, record), kept)) in sent.into_iter().zip(kept).enumerate() {
            let count = match i < usage_count {
                true => &mut counted.0,
                false => &mut counted.1,
            };
            match kept {
                None => count.new += 1,
                Some(kept) => {
                    if kept != record {
                        tracing::warn!(%key, "a record sent again differs from the one kept: the first stays");
                    }
                    count.already_kept += 1;
                }
            }
        }
        Ok(counted)
    }

    /// The cluster's certificate, if one was issued.
    pub async fn certificate(
        &self,
    ) -> Result<Option<crate::model::certificate::Issued>, StoreError> {
        match self.kv.get(CERTIFICATE).await? {
            Some(stored) => Ok(Some(serde_json::from_slice(&stored.value)?)),
            None => Ok(None),
        }
    }

    pub async fn put_certificate(
        &self,
        issued: &crate::model::certificate::Issued,
    ) -> Result<(), StoreError> {
        self.put_value(CERTIFICATE, serde_json::to_vec(issued)?)
            .await
    }

    /// The credentials (JSON) of the account at the ACME `directory`, once made.
    pub async fn acme_account(&self, directory: &str) -> Result<Option<String>, StoreError> {
        let value = self.kv.get(&format!("acme-account/{directory}")).await?;
        Ok(value.map(|stored| String::from_utf8_lossy(&stored.value).into_owned()))
    }

    pub async fn put_acme_account(
        &self,
        directory: &str,
        credentials: &str,
    ) -> Result<(), StoreError> {
        let key = format!("acme-account/{directory}");
        self.put_value(&key, credentials.as_bytes().to_vec()).await
    }

    /// When the backup this store was restored from was made (seconds since 1970), if it was:
    /// the provider may then hold nodes of queues created after it, which the store does not
    /// know and which must not be taken for leftovers.
    pub async fn restored(&self) -> Result<Option<u64>, StoreError> {
        let restored = self.restored.get_or_try_init(|| async {
            let marker = self.kv.get(RESTORED).await?;
            let made = marker.and_then(|stored| String::from_utf8(stored.value).ok()?.parse().ok());
            Ok::<_, StoreError>(made)
        });
        Ok(*restored.await?)
    }

    /// The node secret every replica checks nodes' credentials with: the one stored, or
    /// `made` if there is none yet (the first replica's wins).
    pub async fn node_secret(&self, made: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let kept = self
            .kv
            .put_absent(vec![(NODE_SECRET.into(), made.clone())])
            .await?;
        Ok(kept.into_iter().next().flatten().unwrap_or(made))
    }

    /// Keeps what replica `replica` heard: when it last heard each queue's node, in
    /// milliseconds since 1970 by its clock.
    pub async fn put_heard(
        &self,
        replica: &str,
        heard: &std::collections::BTreeMap<String, u64>,
    ) -> Result<(), StoreError> {
        let key = format!("{HEARD}{replica}");
        self.put_value(&key, serde_json::to_vec(heard)?).await
    }

    /// When any replica last heard each queue's node: the latest of what each kept.
    pub async fn heard(&self) -> Result<std::collections::HashMap<String, u64>, StoreError> {
        let kept = self.kv.range(HEARD, &end_of(HEARD)).await?;
        let mut latest = std::collections::HashMap::new();
        for value in kept.values {
            let heard: std::collections::BTreeMap<String, u64> = serde_json::from_slice(&value)?;
            for (queue_id, at_ms) in heard {
                let kept: &mut u64 = latest.entry(queue_id).or_default();
                *kept = (*kept).max(at_ms);
            }
        }
        Ok(latest)
    }

    /// Keeps what queue `queue_id`'s stray node reported of itself.
    pub async fn put_stray<T: serde::Serialize>(
        &self,
        queue_id: &str,
        reported: &T,
    ) -> Result<(), StoreError> {
        let key = format!("{STRAYS}{queue_id}");
        self.put_value(&key, serde_json::to_vec(reported)?).await
    }

    /// What queue `queue_id`'s stray node last reported of itself, if it did.
    pub async fn stray<T: serde::de::DeserializeOwned>(
        &self,
        queue_id: &str,
    ) -> Result<Option<T>, StoreError> {
        match self.kv.get(&format!("{STRAYS}{queue_id}")).await? {
            Some(stored) => Ok(Some(serde_json::from_slice(&stored.value)?)),
            None => Ok(None),
        }
    }

    /// What every stray node reported of itself (adopted ones' too: the store deletes
    /// nothing).
    pub async fn strays<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<T>, StoreError> {
        let kept = self.kv.range(STRAYS, &end_of(STRAYS)).await?;
        let read = kept
            .values
            .iter()
            .map(|value| serde_json::from_slice(value));
        Ok(read.collect::<Result<_, _>>()?)
    }

    /// Keeps what a replica says its DNS serves.
    pub async fn put_served(
        &self,
        served: &crate::model::served::Served,
    ) -> Result<(), StoreError> {
        let key = format!("{SERVED}{}", served.replica);
        self.put_value(&key, serde_json::to_vec(served)?).await
    }

    /// What each replica said its DNS serves.
    pub async fn served(&self) -> Result<Vec<crate::model::served::Served>, StoreError> {
        let kept = self.kv.range(SERVED, &end_of(SERVED)).await?;
        let read = kept
            .values
            .iter()
            .map(|value| serde_json::from_slice(value));
        Ok(read.collect::<Result<_, _>>()?)
    }

    /// Puts `value` at `key` whatever was there.
    pub(super) async fn put_value(&self, key: &str, value: Vec<u8>) -> Result<(), StoreError> {
        loop {
            let old = self.kv.get(key).await?;
            let expected = old.as_ref().map(|stored| &stored.version);
            let fence = self.fence.as_ref();
            if self.kv.swap(key, expected, value.clone(), fence).await? {
                return Ok(());
            }
        }
    }

    /// Every record of one queue of one kind, oldest first, as stored.
    pub async fn reports_of(
        &self,
        queue_id: &str,
        kind: Report,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.reports_in(queue_id, kind, 0..u64::MAX).await
    }

    /// One queue's records of one kind whose time is in `times`, oldest first, as stored: a
    /// range of keys, so years of history are not read for one day.
    pub async fn reports_in(
        &self,
        queue_id: &str,
        kind: Report,
        times: std::ops::Range<u64>,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let start = report_key(kind, queue_id, times.start);
        let end = report_key(kind, queue_id, times.end);
        Ok(self.kv.range(&start, &end).await?.values)
    }

    /// One queue's records of one kind whose time is in `times`, oldest first, with their
    /// times (None for one that does not read).
    pub async fn reports_timed(
        &self,
        queue_id: &str,
        kind: Report,
        times: std::ops::Range<u64>,
    ) -> Result<Vec<(Option<u64>, Vec<u8>)>, StoreError> {
        let start = report_key(kind, queue_id, times.start);
        let end = report_key(kind, queue_id, times.end);
        #[derive(serde::Deserialize)]
        struct Timed {
            time: u64,
        }
        let time_of = |stored: &[u8]| -> Option<u64> {
            match serde_json::from_slice::<Timed>(stored) {
                Ok(timed) => Some(timed.time),
                // A line, as kept before reports were structured: its time comes first.
                Err(_) => std::str::from_utf8(stored)
                    .ok()?
                    .split(',')
                    .next()?
                    .parse()
                    .ok(),
            }
        };
        let listed = self.kv.range(&start, &end).await?;
        let timed = listed
            .values
            .into_iter()
            .map(|value| (time_of(&value), value));
        Ok(timed.collect())
    }

    /// The record of one queue of one kind last before `time`, if there is one.
    pub async fn report_before(
        &self,
        queue_id: &str,
        kind: Report,
        time: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let start = report_key(kind, queue_id, 0);
        let end = report_key(kind, queue_id, time);
        self.kv.range_last(&start, &end).await
    }

    /// Replaces one queue's records of one kind whose time is in `times` by `records` (time,
    /// JSON), in one write (`rollup.rs`).
    pub async fn replace_reports(
        &self,
        queue_id: &str,
        kind: Report,
        times: std::ops::Range<u64>,
        records: Vec<(u64, Vec<u8>)>,
    ) -> Result<(), StoreError> {
        let start = report_key(kind, queue_id, times.start);
        let end = report_key(kind, queue_id, times.end);
        let entries = records
            .into_iter()
            .map(|(time, record)| (report_key(kind, queue_id, time), record))
            .collect();
        self.kv
            .replace_range(&start, &end, entries, self.fence.as_ref())
            .await
    }

    /// Whether the store holds nothing yet (a restore goes only into such a one).
    pub async fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.kv.dump().await?.is_empty())
    }

    /// Every key and value, for a backup: all but the leader's, which belongs to a lease
    /// (restored, it would outlive every lease and no replica would ever lead again).
    pub async fn dump(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut entries = self.kv.dump().await?;
        // The leader's goes with its lease; the serial base with this store's revisions, and
        // the reserve with the serials this store's zone served: a restore sets both anew.
        // What replicas heard, and what their DNS serves, is news only for seconds.
        entries.retain(|(key, _)| {
            ![LEADER, SERIAL_BASE, SERIAL_RESERVED].contains(&key.as_str())
                && !key.starts_with(HEARD)
                && !key.starts_with(SERVED)
        });
        Ok(entries)
    }

    /// Puts a backup's entries into this store, which must be empty, and marks it
    /// [`Store::restored`] (when the backup was made); its zone's serials go on past
    /// `zone_serial`, the backup's zone's, and past now.
    pub async fn restore(
        &self,
        mut entries: Vec<(String, Vec<u8>)>,
        made_at: u64,
        zone_serial: u64,
    ) -> Result<usize, StoreError> {
        if !self.is_empty().await? {
            return Err(StoreError::NotEmpty);
        }
        let set_anew = [LEADER, RESTORED, SERIAL_BASE, SERIAL_RESERVED];
        entries.retain(|(key, _)| !set_anew.contains(&key.as_str()));
        let count = entries.len();
        // The mark first: a restore cut short leaves a store that is marked, so no control
        // plane started on it takes the nodes of queues it lacks for leftovers.
        let base = crate::unix_now().max(zone_serial + 1).to_string();
        // Both kinds of zone serial go on past the backup's zone's: on revisions (etcd) from
        // the base, on a zone's own serials (sled) past the reserve.
        let marker = vec![
            (RESTORED.into(), made_at.to_string().into_bytes()),
            (SERIAL_BASE.into(), base.clone().into_bytes()),
            (SERIAL_RESERVED.into(), base.into_bytes()),
        ];
        self.kv.put_absent(marker).await?;
        self.kv.put_absent(entries).await?;
        self.changed.anything_changed();
        Ok(count)
    }
}

/// What the zone is built from.
pub struct ZoneInputs {
    pub queues: Vec<Queue>,
    pub challenges: Vec<(String, String)>,
    /// The zone's serial when the store has revisions (etcd): [`SERIAL_BASE`] plus the latest
    /// revision that changed any of them, so every replica reading the same state serves the
    /// same serial. `None` on sled: the zone counts its own.
    pub serial: Option<u64>,
}

/// `usage/QUEUE-ID/TIME` or `stats/…`, the time as 20 digits so that keys sort by time.
fn report_key(kind: Report, queue_id: &str, time: u64) -> String {
    let kind = match kind {
        Report::Usage => "usage",
        Report::Stats => "stats",
    };
    format!("{kind}/{queue_id}/{time:020}")
}

/// The first key after every key starting with `prefix`.
fn end_of(prefix: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("not empty") += 1;
    String::from_utf8(end).expect("ASCII prefixes")
}
