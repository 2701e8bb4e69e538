//! What every connection of the node shares, and how the node starts from its data directory.
//!
//! The data directory holds `messages/` (the message log) and `meta/` (sled: settings and
//! history, synced by `store::meta::MetaDisk`).

use crate::admission::{Admission, Budgets};
use crate::auth::Logins;
use crate::config::Config;
use crate::config::Keepalive;
use crate::engine::{CopyQueue, Limits, Queue};
use crate::history::{History, Totals, UsageLabels};
use crate::limits::{raise_descriptor_limit, usable_memory, NodeLimits};
use crate::store::data_dir;
use crate::store::log::{self, LogOptions, LogStore};
use crate::store::meta::SaveError;
use crate::store::Meta;
use crate::store::StorageMeter;
use crate::traffic::Traffic;
use qe_shared::node_channel::LiveStats;
use qe_shared::protocol::Role;
use qe_shared::settings::{fixed, Setting, Settings, Tier};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub struct Node {
    /// Who may hold a connection: `max-tasks` logged in, and a budget before the login.
    pub admission: Arc<Admission>,
    /// The distribute queue.
    pub queue: Queue,
    /// The copy queue type at the same address.
    pub copy: Arc<CopyQueue>,
    /// The three logins; a rotation replaces them while connections go on.
    logins: RwLock<Logins>,
    /// The SQS face's access keys (docs/sqs.md): its logins. Each shared, as every SQS
    /// request looks its key up.
    sqs_keys: RwLock<Vec<Arc<crate::auth::SqsKey>>>,
    /// Where its dead letters go and who may send it theirs (SQS's redrive, kept by the
    /// control plane): the dead letter forwarder watches it.
    redrive: tokio::sync::watch::Sender<qe_shared::node_channel::DesiredRedrive>,
    pub tier: Tier,
    pub limits: NodeLimits,
    /// Where the settings are kept across restarts.
    pub meta: Meta,
    /// When idle connections are pinged and silent ones dropped.
    pub keepalive: Keepalive,
    /// How long a fragmented message has to arrive whole (`message-timeout-secs`).
    pub message_timeout: Duration,
    /// The writable settings; `setcfg` changes them while connections read them.
    settings: RwLock<Settings>,
    /// Open connections by role, for `getlivestats`.
    pub presence: Arc<Presence>,
    /// How much the node logs (`RUST_LOG`), shown by `getcfg`.
    pub log_level: String,
    /// Stats and usage records.
    pub history: History,
    /// What usage is billed under.
    pub usage_labels: UsageLabels,
    /// Bytes on the sockets.
    pub traffic: Arc<Traffic>,
    /// Bytes of the message log.
    pub storage: StorageMeter,
    /// What the web console's admin logins are checked with.
    pub console: crate::auth::console::ConsoleTokens,
    /// The queue's standby's key and the log it is shipped; None: no standby.
    pub standby: Option<crate::replication::Standby>,
    /// Told when the node is to stop and be started again: its config holds what it takes
    /// only at start (`node::Running::until_stopped` stops it, exiting with
    /// [`crate::node::START_AGAIN_EXIT`]).
    pub start_again: tokio::sync::Notify,
}

/// Counts of open connections by role. [`Presence::enter`] counts one until dropped.
#[derive(Default)]
pub struct Presence {
    counts: [AtomicUsize; 3],
}

impl Presence {
    pub fn enter(self: &Arc<Self>, role: Role) -> Present {
        self.counts[role as usize].fetch_add(1, Ordering::Relaxed);
        Present {
            presence: self.clone(),
            role,
        }
    }

    pub fn count(&self, role: Role) -> usize {
        self.counts[role as usize].load(Ordering::Relaxed)
    }
}

/// One open connection counted under its role.
pub struct Present {
    presence: Arc<Presence>,
    role: Role,
}

impl Drop for Present {
    fn drop(&mut self) {
        self.presence.counts[self.role as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the message log: {0}")]
    Log(#[from] std::io::Error),
    #[error("the settings store: {0}")]
    Meta(#[from] sled::Error),
    #[error("the history: {0}")]
    History(#[from] crate::history::HistoryError),
    #[error("the damaged records' dead-letter entries could not be synced")]
    Damaged,
    #[error("{0}")]
    Epoch(#[from] crate::replication::epoch::EpochError),
}

impl Node {
    /// Opens the data directory, reads back the queue, and gets ready to serve.
    pub async fn open(config: &Config) -> Result<Arc<Node>, StartError> {
        let limits = NodeLimits::derive(
            usable_memory(),
            raise_descriptor_limit(),
            config.tier,
            config.max_messages,
            config.max_messages_memory,
        );
        let meta = Meta::open(&config.data_dir.join(data_dir::META))?;
        let settings = meta.settings(config.tier);

        let log_dir = config.data_dir.join(data_dir::MESSAGES);
        let options = LogOptions {
            segment_bytes: config
                .log_segment_bytes
                .unwrap_or(LogOptions::default().segment_bytes),
            compaction: !config.no_compaction,
        };
        let (store, mut recovered) = LogStore::open(&log_dir, options)?;
        let storage = store.meter();
        let standby = match config.replication_key.clone() {
            Some(key) => {
                let epoch = crate::replication::epoch::start_primary(&log_dir, config.epoch)?;
                let receipt_key = config.data_dir.join(data_dir::SQS_RECEIPT_KEY);
                let shipping = store.shipping();
                Some(crate::replication::Standby::new(
                    key,
                    shipping,
                    meta.clone(),
                    receipt_key,
                    epoch,
                    log_dir.clone(),
                ))
            }
            None => None,
        };
        let queue = Queue::new(
            Box::new(store),
            Limits {
                max_messages: limits.max_messages,
                max_memory: limits.max_messages_memory,
            },
        );
        let restored = recovered.messages.len();
        queue.set_rules(delivery_rules(&settings));
        let damaged = std::mem::take(&mut recovered.damaged);
        // A promoted standby's copy carries its primary's sessions, saved from now.
        let saved_for = settings.get(Setting::SavedSessionTimeoutSecs) * 1000;
        let carried = crate::replication::holds::take(&config.data_dir, saved_for)?;
        let carried_holds = carried.as_ref().map_or(0, |c| c.holds.len());
        queue.restore(recovered, carried);
        for region in &damaged {
            let (id, receipt) = queue.add_damaged(&region.bytes);
            tracing::warn!(%id, segment = region.segment, offset = region.offset,
                len = region.bytes.len(), "a damaged record went to the dead letter queue");
            receipt.wait().await.map_err(|_| StartError::Damaged)?;
        }
        let repairs = log::repair(&log_dir, &damaged)?;
        if let Some(standby) = &standby {
            standby.shipping.repaired(repairs);
            standby.shipping.require_standby();
        }
        tracing::info!(
            restored,
            damaged = damaged.len(),
            carried_holds = carried_holds,
            "queue read back"
        );

        let history = History::open(meta.disk(), crate::engine::now_ms() / 1000)?;
        Ok(Arc::new(Node {
            admission: Admission::new(Budgets::for_max_tasks(limits.max_tasks)),
            queue,
            copy: Arc::default(),
            logins: RwLock::new(config.logins.clone()),
            sqs_keys: RwLock::new(
                config
                    .sqs
                    .as_ref()
                    .map(|sqs| sqs.keys.iter().cloned().map(Arc::new).collect())
                    .unwrap_or_default(),
            ),
            redrive: tokio::sync::watch::Sender::new(Default::default()),
            tier: config.tier,
            limits,
            meta,
            keepalive: config.keepalive,
            message_timeout: config.message_timeout,
            settings: RwLock::new(settings),
            presence: Arc::default(),
            log_level: std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            history,
            usage_labels: config.usage_labels.clone(),
            traffic: Arc::default(),
            storage,
            console: crate::auth::console::ConsoleTokens::new(
                config
                    .report_to
                    .as_ref()
                    .map(|to| (to.queue_id.clone(), to.token.clone())),
            ),
            standby,
            start_again: tokio::sync::Notify::new(),
        }))
    }

    pub fn settings(&self) -> Settings {
        self.settings
            .read()
            .expect("the settings lock is never poisoned")
            .clone()
    }

    /// Saves `changes` and applies them to every connection at once. A save that failed
    /// changes nothing; one that was not synced still applies (the manual's 506).
    pub fn change_settings(&self, changes: &[(Setting, u64)]) -> Result<(), SaveError> {
        // Nothing to change (SetQueueAttributes of values as they are): no write, and the
        // time they last changed stays.
        let now = self.settings();
        if changes
            .iter()
            .all(|&(setting, value)| now.get(setting) == value)
        {
            return Ok(());
        }
        let saved = self.meta.save(changes, crate::engine::now_ms() / 1000);
        if saved != Err(SaveError::NotSaved) {
            if let Some(standby) = &self.standby {
                standby.settings_saved.send_modify(|version| *version += 1);
            }
            let mut settings = self
                .settings
                .write()
                .expect("the settings lock is never poisoned");
            for &(setting, value) in changes {
                settings.set(setting, value);
            }
            self.queue.set_rules(delivery_rules(&settings));
        }
        saved
    }

    /// Takes the settings a new queue starts with (SQS's `CreateQueue` attributes, in its
    /// desired config) when no setting was ever saved here; saved, they are never taken
    /// again. A name or value the table refuses is an error (nothing taken).
    pub fn take_initial_settings(
        &self,
        initial: &std::collections::BTreeMap<String, u64>,
    ) -> Result<(), String> {
        if self.meta.settings_changed_at().is_some() {
            return Ok(());
        }
        let mut changes = Vec::with_capacity(initial.len());
        for (name, &value) in initial {
            let setting = Setting::parse(name)
                .filter(|setting| setting.accepts(value))
                .ok_or_else(|| format!("initial setting {name}={value} is not one to take"))?;
            changes.push((setting, value));
        }
        if changes.is_empty() {
            return Ok(());
        }
        self.change_settings(&changes).map_err(|e| e.to_string())
    }

    /// Whether `username` and `password` are `role`'s login now.
    pub fn verify(&self, role: Role, username: &str, password: &str) -> bool {
        let logins = self.logins.read().expect("never poisoned");
        logins.verify(role, username, password)
    }

    /// New logins, for new logins from now on; open connections go on.
    pub fn replace_logins(&self, logins: Logins) {
        *self.logins.write().expect("never poisoned") = logins;
    }

    /// New SQS keys, from the next SQS request on (a key made, or one revoked).
    pub fn replace_sqs_keys(&self, keys: Vec<crate::auth::SqsKey>) {
        let keys = keys.into_iter().map(Arc::new).collect();
        *self.sqs_keys.write().expect("never poisoned") = keys;
    }

    /// Takes the redrive the control plane sent (None: the queue's own dead letter queue).
    pub fn set_redrive(&self, redrive: Option<qe_shared::node_channel::DesiredRedrive>) {
        self.redrive.send_if_modified(|held| {
            let redrive = redrive.unwrap_or_default();
            let changed = *held != redrive;
            *held = redrive;
            changed
        });
    }

    /// The redrive now.
    pub fn redrive_now(&self) -> qe_shared::node_channel::DesiredRedrive {
        self.redrive.borrow().clone()
    }

    /// The redrive now, and every change after.
    pub fn redrive(&self) -> tokio::sync::watch::Receiver<qe_shared::node_channel::DesiredRedrive> {
        self.redrive.subscribe()
    }

    /// The SQS key with this access key id, if the queue has it.
    pub fn sqs_key(&self, access_key_id: &str) -> Option<Arc<crate::auth::SqsKey>> {
        let keys = self.sqs_keys.read().expect("never poisoned");
        keys.iter()
            .find(|key| key.access_key_id == access_key_id)
            .cloned()
    }

    /// The nine columns of `getlivestats`: messages, publishers, subscribers, saved
    /// subscribers, administrators, unacknowledged, dead letter, delayed, durable.
    pub fn live_stats_csv(&self) -> String {
        let counts = self.queue.counts();
        let presence = &self.presence;
        format!(
            "{},{},{},{},{},{},{},{},{}",
            counts.messages,
            presence.count(Role::Publisher),
            presence.count(Role::Subscriber),
            counts.saved_sessions,
            presence.count(Role::Admin),
            counts.unacknowledged,
            counts.dead_letter,
            counts.delayed,
            counts.durable
        )
    }

    /// The numbers the control plane's `/metrics` shows for this queue now (without the
    /// certificate, which the server holds).
    pub fn live_stats(&self) -> LiveStats {
        let snapshot = self.queue.snapshot();
        let counts = snapshot.counts;
        let totals = snapshot.totals;
        let connections = |role: Role| self.presence.count(role) as u64;
        LiveStats {
            waiting: counts.waiting as u64,
            delayed: counts.delayed as u64,
            held: counts.unacknowledged as u64,
            dead_letter: counts.dead_letter as u64,
            durable: counts.durable as u64,
            publishers: connections(Role::Publisher),
            subscribers: connections(Role::Subscriber),
            admins: connections(Role::Admin),
            saved_sessions: counts.saved_sessions as u64,
            published: totals.published,
            delivered: totals.delivered,
            acked: totals.acked,
            nacked: totals.nacked,
            network_received: self.traffic.received(),
            network_sent: self.traffic.sent(),
            messages_memory_used: snapshot.memory_used,
            max_messages: self.limits.max_messages,
            max_messages_memory: self.limits.max_messages_memory,
            standby: self.standby.as_ref().map(|standby| standby.lag()),
            certificate_expires: None,
            log_lines_dropped: qe_shared::logging::dropped_lines(),
        }
    }

    /// The growing byte totals usage records are cut from.
    pub fn totals(&self) -> Totals {
        Totals {
            network_sent: self.traffic.sent(),
            network_received: self.traffic.received(),
            storage_written: self.storage.written(),
            storage_read: self.storage.read(),
        }
    }

    /// The most bytes that may wait to be sent to one connection (`max-write-queue-bytes`).
    pub fn write_limit(&self) -> usize {
        fixed::max_write_queue_bytes(self.tier) as usize
    }

    /// The message log's size on disk now.
    pub fn storage_held(&self) -> u64 {
        self.storage.held()
    }

    pub fn setting(&self, setting: Setting) -> u64 {
        self.settings
            .read()
            .expect("the settings lock is never poisoned")
            .get(setting)
    }
}

/// The engine's delivery rules, from the settings that give them.
fn delivery_rules(settings: &Settings) -> crate::engine::Rules {
    crate::engine::Rules {
        max_receive_count: settings.get(Setting::MaxReceiveCount) as u32,
        retention_secs: settings.get(Setting::MessageRetentionSecs),
    }
}
