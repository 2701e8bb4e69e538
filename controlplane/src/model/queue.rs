//! A queue as the control plane knows it, and the making of a new one.

use qe_shared::node_channel::{DesiredConfig, LoginHash, Logins, NodeTls};
use qe_shared::password::PasswordHash;
use qe_shared::protocol::Role;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

pub use qe_shared::settings::Tier;

/// Where a queue is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Provisioning,
    Running,
    Failed,
    Deleting,
    Deleted,
}

impl Status {
    /// Whether its node is to run (and its name to resolve).
    pub fn is_live(self) -> bool {
        matches!(self, Status::Provisioning | Status::Running)
    }
}

/// A login as the control plane keeps it: the password only as a hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredLogin {
    pub username: String,
    pub password_hash: String,
}

/// A queue's record, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Queue {
    /// A DNS label: lowercase letters and digits.
    pub id: String,
    pub tier: Tier,
    pub region: String,
    pub instance_type: String,
    pub ipv4: bool,
    pub status: Status,
    /// Where its node listens, once it runs.
    pub node: Option<String>,
    /// The addresses its name resolves to, as its provider placed it.
    #[serde(default)]
    pub addresses: Option<Addresses>,
    /// When it was made, in seconds since 1970: its first usage period starts here.
    #[serde(default)]
    pub created: u64,
    pub publisher: StoredLogin,
    pub subscriber: StoredLogin,
    pub admin: StoredLogin,
    /// The version of what its node should be ([`DesiredConfig`]); up with every change.
    #[serde(default = "first_version")]
    pub config_version: u64,
    /// The version its node last said it serves.
    #[serde(default)]
    pub applied_version: u64,
    /// Which of its node credentials is valid: a rotation moves it on (`nodes.rs`).
    #[serde(default)]
    pub node_credential: u64,
    /// A node credential being rotated in: valid too, until the node uses it.
    #[serde(default)]
    pub next_node_credential: Option<u64>,
    /// The same for the credential of its second machine ([`Slot::Second`], `replicas: 2`):
    /// `node_credential` and `next_node_credential` are the first's. Each slot's is retired
    /// when that machine uses the new one, so a standby that was down during a rotation is
    /// not locked out by its node.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub second_credential: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_second_credential: Option<u64>,
    /// Goes up to have its node get a new certificate now (a forced renewal).
    #[serde(default)]
    pub certificate_generation: u64,
    /// Which CA issued its node's certificate last ([`crate::certificates::Issuer::name`]).
    #[serde(default)]
    pub certificate_issuer: Option<String>,
    /// When its node's certificate was issued last, and for which generation.
    #[serde(default)]
    pub certificate_issued: Option<(u64, u64)>,
    /// What its provider made for it (instance, volume, process ...), by kind.
    #[serde(default)]
    pub resources: std::collections::BTreeMap<String, String>,
    /// When its node said, stopping, that it had reported its last records.
    #[serde(default)]
    pub last_report: Option<u64>,
    /// When it was asked to be deleted, in seconds since 1970: its data is kept for its last
    /// report from then for at most `delete_keeps_data_secs` (`reconciler.rs`).
    #[serde(default)]
    pub deleting_since: Option<u64>,
    /// The account it belongs to ([`crate::model::account`]); `None` for a queue the operator
    /// made for no account (and for every queue made before there were accounts).
    #[serde(default)]
    pub account: Option<String>,
    /// Its SQS access keys (docs/sqs.md), revoked ones too (they are not used again). Their
    /// secrets are not kept: each is derived from the cluster's node secret when needed
    /// ([`crate::nodes::NodeTokens::sqs_secret`]).
    #[serde(default)]
    pub sqs_keys: Vec<SqsKeyRecord>,
    /// Why it failed (`failed`: it was not running within `provision_within_secs`, or its
    /// provider refused it for good), and when, in seconds since 1970: its data is kept from
    /// then for `delete_keeps_data_secs`, then removed (`reconciler.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// When the newest bootstrap token its instances exchanged was issued, in milliseconds
    /// since 1970 (`api/bootstrap.rs`): that one and every older one are spent.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bootstrap_spent_ms: u64,
    /// The same for its second machine's bootstrap tokens (their own label): the two
    /// machines boot in either order.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub second_bootstrap_spent_ms: u64,
    /// The build its node said it runs, last time it confirmed a config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_build: Option<qe_shared::node_channel::NodeBuild>,
    /// The build its node is to run (`rollout.rs`); None: the one it was started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_build: Option<qe_shared::node_channel::DesiredBuild>,
    /// A build its node said it will not run, and why (the last one it said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_build: Option<qe_shared::node_channel::RefusedBuild>,
    /// Its name within its account, as SQS names queues (`QueueName`, [`check_name`]);
    /// None: its id is its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its tags (SQS's `TagQueue`, or the API's create), key → value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The SQS attributes it was made with (`CreateQueue`), as asked: a second
    /// `CreateQueue` of its name with others is refused (`QueueAlreadyExists`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sqs_attributes: BTreeMap<String, String>,
    /// The settings its node starts with ([`DesiredConfig::initial_settings`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub initial_settings: BTreeMap<String, u64>,
    /// Whether its node takes a build in its config (it said so when it last confirmed one):
    /// a node from before rolling upgrades is told none, and a rollout leaves it out.
    #[serde(default, skip_serializing_if = "is_false")]
    pub node_accepts_builds: bool,
    /// Whether its node takes initial settings in its config (it said so when it last
    /// confirmed one); until then they are left out.
    #[serde(default, skip_serializing_if = "is_false")]
    pub node_takes_initial_settings: bool,
    /// The queue of its account its dead letters are sent to (SQS's `RedrivePolicy` naming
    /// another queue, `redrive.rs`); None: they stay in its own dead letter queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_target: Option<String>,
    /// The queues whose dead letters are sent here (each one's `dead_letter_target` is this
    /// queue): each has a publisher key of this queue's SQS face.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub dead_letter_sources: BTreeSet<String>,
    /// Its `RedriveAllowPolicy` (JSON text, checked); None: every queue of its account may
    /// send it dead letters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive_allow_policy: Option<String>,
    /// Whether its node takes its redrive in its config (it said so when it last confirmed
    /// one); until then it is left out.
    #[serde(default, skip_serializing_if = "is_false")]
    pub node_takes_redrive: bool,
    /// Nodes that hold its messages: 1, or 2 with a standby ([`NewQueue::replicas`]).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub replicas: u8,
    /// Whether its node said, when it last confirmed a config, that it runs with a standby;
    /// None: it said nothing (a build from before standbys, or none confirmed yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_standby: Option<bool>,
    /// Moved on each time its standby's copy is promoted (`DesiredReplication::epoch`): its
    /// node serves at this epoch, its standby follows no node at a lower one. 0: never.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
    /// Which of its two machines serves (`replicas: 2` on a provider that places the standby
    /// on a machine of its own): the first until a promotion moves it to the other.
    #[serde(default, skip_serializing_if = "Slot::is_first")]
    pub serving: Slot,
    /// Whether its node's last live report said its standby was in sync: a silent node's
    /// standby is promoted only then (one still catching up from nothing holds little).
    #[serde(default, skip_serializing_if = "is_false")]
    pub standby_in_sync: bool,
    /// Since when its node's live reports have said no standby is attached to it (ms since
    /// 1970), kept when that changes; None while one is (or its node says nothing of it). A
    /// standby absent for the silence limit is replaced (`reconciler.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby_absent_since_ms: Option<u64>,
}

/// Which of a queue's two machines an instance, its credential and its bootstrap token are
/// for (`replicas: 2`). Each keeps its slot for life; which one serves is
/// [`Queue::serving`], and moves with a promotion. A queue's node token is the first's
/// (`QUEUE-ID/N`), the second's has its own label (`crate::nodes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Slot {
    /// The machine a queue starts with.
    #[default]
    First,
    /// The one placed beside it for its standby.
    Second,
}

impl Queue {
    /// The credential number of its machine in `slot`, and one being rotated in.
    pub fn credential_of(&self, slot: Slot) -> (u64, Option<u64>) {
        match slot {
            Slot::First => (self.node_credential, self.next_node_credential),
            Slot::Second => (self.second_credential, self.next_second_credential),
        }
    }

    /// Its machine in `slot` used credential `credential`: if that is the one being rotated
    /// in, it becomes the slot's, and the old one is retired.
    pub fn credential_used(&mut self, slot: Slot, credential: u64) {
        let (current, next) = self.credentials_mut(slot);
        if *next == Some(credential) {
            *current = credential;
            *next = None;
        }
    }

    /// Its machine in `slot` presented `credential`, later than the slot's (taken after the
    /// backup a restored store came from): the slot's from now on, nothing being rotated in.
    pub fn credential_taken_after_a_backup(&mut self, slot: Slot, credential: u64) {
        let (current, next) = self.credentials_mut(slot);
        if *current < credential {
            *current = credential;
            *next = None;
        }
    }

    /// The credential of its machine in `slot`, and one being rotated in, to change.
    fn credentials_mut(&mut self, slot: Slot) -> (&mut u64, &mut Option<u64>) {
        match slot {
            Slot::First => (&mut self.node_credential, &mut self.next_node_credential),
            Slot::Second => (
                &mut self.second_credential,
                &mut self.next_second_credential,
            ),
        }
    }

    /// Starts a rotation of its credentials (each slot's it has): the new numbers are valid
    /// beside the old until each machine uses its own. Returns the serving machine's new one.
    pub fn rotate_credentials(&mut self) -> u64 {
        let next = self
            .next_node_credential
            .unwrap_or(self.node_credential + 1);
        self.next_node_credential = Some(next);
        if self.replicas == 2 {
            let second = self
                .next_second_credential
                .unwrap_or(self.second_credential + 1);
            self.next_second_credential = Some(second);
        }
        self.config_version += 1;
        self.credential_of(self.serving).1.expect("just set")
    }
}

impl Slot {
    fn is_first(&self) -> bool {
        *self == Slot::First
    }

    /// The other machine's.
    pub fn other(self) -> Slot {
        match self {
            Slot::First => Slot::Second,
            Slot::Second => Slot::First,
        }
    }
}

fn one() -> u8 {
    1
}

fn is_one(value: &u8) -> bool {
    *value == 1
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Why and when a queue failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub reason: String,
    pub since: u64,
    /// Whether its data is removed (its time was up).
    #[serde(default)]
    pub data_removed: bool,
}

/// One SQS access key of a queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SqsKeyRecord {
    pub access_key_id: String,
    /// `publisher`, `subscriber` or `admin`.
    pub role: String,
    /// When it was made, in seconds since 1970.
    pub created: u64,
    #[serde(default)]
    pub revoked: bool,
}

/// The most SQS keys a queue (or an account) holds; revoked ones are let go when a new key
/// needs their place.
pub const MAX_SQS_KEYS: usize = 32;

fn first_version() -> u64 {
    1
}

impl Queue {
    /// Whether its node serves a version older than the one desired.
    pub fn change_pending(&self) -> bool {
        self.applied_version < self.config_version
    }

    /// What its node should be now: `listen` and `tls` are the provider's and the
    /// certificate issuer's choice.
    pub fn desired_config(&self, listen: Vec<std::net::SocketAddr>, tls: NodeTls) -> DesiredConfig {
        let login = |login: &StoredLogin| LoginHash {
            username: login.username.clone(),
            password_hash: login.password_hash.clone(),
        };
        DesiredConfig {
            version: self.config_version,
            tier: self.tier,
            listen,
            tls,
            logins: Logins {
                publisher: login(&self.publisher),
                subscriber: login(&self.subscriber),
                admin: login(&self.admin),
            },
            instance_type: self.instance_type.clone(),
            region: self.region.clone(),
            ipv4: self.ipv4,
            max_messages: None,
            max_messages_memory: None,
            node_token: None,
            live_stats_secs: None,
            usage_record_secs: None,
            stats_record_secs: None,
            sqs: None,
            build: self
                .desired_build
                .clone()
                .filter(|_| self.node_accepts_builds),
            initial_settings: Some(self.initial_settings.clone())
                .filter(|settings| !settings.is_empty() && self.node_takes_initial_settings),
            // Needs the target's record: `api::nodes::desired_config` adds it.
            redrive: None,
            // Needs the node secret, and the node to say it takes it: added there too.
            replication: None,
        }
    }
}

impl Queue {
    /// Queue `id`'s record rebuilt from the config its node last took (`desired`, version
    /// V): a queue made after the backup the store was restored from, adopted. Its node is
    /// the machine in `slot` (the second after its standby's machine was promoted), which
    /// serves at the epoch its config gave it; it presents credential `credential`, which the
    /// record rotates (the node takes the next one with version V + 1). What the node never
    /// had is not known: the queue belongs to no account, its SQS keys' creation times are
    /// now, and its other machine's credential is taken from the first it presents (a
    /// restored store takes later ones: `api/nodes.rs`).
    pub fn adopted(id: &str, desired: &DesiredConfig, slot: Slot, credential: u64) -> Queue {
        let login = |login: &LoginHash| StoredLogin {
            username: login.username.clone(),
            password_hash: login.password_hash.clone(),
        };
        let logins = &desired.logins;
        let asked = NewQueue {
            tier: desired.tier,
            region: desired.region.clone(),
            instance_type: desired.instance_type.clone(),
            ipv4: desired.ipv4,
            account: None,
            // A node that had a standby's key had a standby.
            replicas: desired.replication.is_some().then_some(2),
            ..Default::default()
        };
        let logins = [&logins.publisher, &logins.subscriber, &logins.admin].map(login);
        let mut queue = Queue::new(id.to_string(), asked, logins);
        queue.config_version = desired.version + 1;
        queue.applied_version = desired.version;
        queue.serving = slot;
        queue.epoch = desired
            .replication
            .as_ref()
            .and_then(|r| r.epoch)
            .unwrap_or(0);
        let (current, next) = queue.credentials_mut(slot);
        (*current, *next) = (credential, Some(credential + 1));
        let keys = desired.sqs.iter().flat_map(|sqs| &sqs.keys);
        queue.sqs_keys = keys
            .map(|key| SqsKeyRecord {
                access_key_id: key.access_key_id.clone(),
                role: key.role.clone(),
                created: queue.created,
                revoked: false,
            })
            .collect();
        queue
    }

    /// A new record of queue `id` as `new` asks, with its logins (publisher, subscriber,
    /// admin), made now: provisioning, at its first config version, its first credential.
    fn new(id: String, new: NewQueue, [publisher, subscriber, admin]: [StoredLogin; 3]) -> Queue {
        Queue {
            id,
            tier: new.tier,
            region: new.region,
            instance_type: new.instance_type,
            ipv4: new.ipv4,
            status: Status::Provisioning,
            node: None,
            addresses: None,
            created: crate::unix_now(),
            publisher,
            subscriber,
            admin,
            config_version: first_version(),
            applied_version: 0,
            node_credential: 0,
            next_node_credential: None,
            second_credential: 0,
            next_second_credential: None,
            certificate_generation: 0,
            certificate_issuer: None,
            certificate_issued: None,
            resources: Default::default(),
            last_report: None,
            deleting_since: None,
            account: new.account,
            sqs_keys: Vec::new(),
            failure: None,
            bootstrap_spent_ms: 0,
            second_bootstrap_spent_ms: 0,
            node_build: None,
            desired_build: None,
            refused_build: None,
            node_accepts_builds: false,
            node_takes_initial_settings: false,
            dead_letter_target: None,
            dead_letter_sources: BTreeSet::new(),
            redrive_allow_policy: None,
            node_takes_redrive: false,
            name: new.name,
            tags: new.tags,
            sqs_attributes: new.sqs_attributes,
            initial_settings: new.initial_settings,
            replicas: new.replicas.unwrap_or(1),
            node_standby: None,
            epoch: 0,
            serving: Slot::First,
            standby_in_sync: false,
            standby_absent_since_ms: None,
        }
    }

    /// Whether its node serves what it was made with: its initial settings (if any) have
    /// reached it.
    pub fn settled(&self) -> bool {
        let given = self.initial_settings.is_empty() || self.node_takes_initial_settings;
        let redrive_given = !self.has_redrive() || self.node_takes_redrive;
        self.status == Status::Running && given && redrive_given && !self.change_pending()
    }

    /// Whether its dead letters go to another queue or it has a `RedriveAllowPolicy`: what
    /// its node's config carries (`DesiredConfig::redrive`).
    pub fn has_redrive(&self) -> bool {
        self.dead_letter_target.is_some() || self.redrive_allow_policy.is_some()
    }

    /// Its name as SQS shows it: its own, or its id.
    pub fn sqs_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

/// A local devtest queue `id` with `status`, for tests.
#[cfg(test)]
pub fn a_queue(id: &str, status: Status) -> Queue {
    let (mut queue, _) = create(NewQueue {
        tier: Tier::Devtest,
        region: "local".into(),
        instance_type: "local".into(),
        ipv4: false,
        account: None,
        ..Default::default()
    });
    queue.id = id.to_string();
    queue.status = status;
    queue
}

/// A queue's IP addresses: IPv6 always, IPv4 only when it has IPv4 (the manual's *The
/// address*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Addresses {
    pub v6: Ipv6Addr,
    pub v4: Option<Ipv4Addr>,
}

/// How the resources a provider made for a queue's standby are named (`standby_process`,
/// `standby_directory` ...).
pub const STANDBY_RESOURCE: &str = "standby_";

/// Where a provider runs a queue's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node's URL.
    pub node: String,
    pub addresses: Addresses,
    /// What the provider made for it, by kind (`instance`, `volume`, `process` ...).
    pub resources: std::collections::BTreeMap<String, String>,
    /// Why its provider had to restart a node that served (logged and audited); not part of
    /// the record.
    pub restarted_because: Option<&'static str>,
}

impl Placement {
    /// Whether `queue`'s record already says this.
    pub fn recorded_in(&self, queue: &Queue) -> bool {
        queue.node.as_ref() == Some(&self.node)
            && queue.addresses == Some(self.addresses)
            && queue.resources == self.resources
    }

    /// Whether `queue`'s record already says this of its node, whatever it says of its
    /// standby (resources named `standby_…`).
    pub fn node_recorded_in(&self, queue: &Queue) -> bool {
        let of_the_node = |resources: &BTreeMap<String, String>| {
            resources
                .iter()
                .filter(|(kind, _)| !kind.starts_with(STANDBY_RESOURCE))
                .map(|(kind, value)| (kind.clone(), value.clone()))
                .collect::<BTreeMap<_, _>>()
        };
        queue.node.as_ref() == Some(&self.node)
            && queue.addresses == Some(self.addresses)
            && of_the_node(&queue.resources) == of_the_node(&self.resources)
    }

    /// Writes what it says of the node into `queue`'s record, and keeps what the record says
    /// of the standby.
    pub fn record_node_in(&self, queue: &mut Queue) {
        let standby = queue
            .resources
            .iter()
            .filter(|(kind, _)| kind.starts_with(STANDBY_RESOURCE));
        let node = self
            .resources
            .iter()
            .filter(|(kind, _)| !kind.starts_with(STANDBY_RESOURCE));
        let resources = standby
            .chain(node)
            .map(|(kind, value)| (kind.clone(), value.clone()))
            .collect();
        let node_only = Placement {
            resources,
            ..self.clone()
        };
        node_only.record_in(queue);
    }

    /// Writes it into `queue`'s record.
    pub fn record_in(&self, queue: &mut Queue) {
        // Its standby follows the node where its config says (`api/nodes.rs`): a node placed
        // anew elsewhere is a new config for it.
        let moved =
            queue.node.as_ref() != Some(&self.node) || queue.addresses != Some(self.addresses);
        if queue.replicas == 2 && moved {
            queue.config_version += 1;
        }
        queue.node = Some(self.node.clone());
        queue.addresses = Some(self.addresses);
        queue.resources = self.resources.clone();
    }
}

/// The operator's request for a queue.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewQueue {
    pub tier: Tier,
    pub region: String,
    pub instance_type: String,
    #[serde(default)]
    pub ipv4: bool,
    /// The account it is for: the operator's choice (an account's key makes queues for
    /// its own account only).
    #[serde(default)]
    pub account: Option<String>,
    /// Its name within the account ([`check_name`]), unique there.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Made through SQS: the attributes asked for, and the settings they give.
    #[serde(skip)]
    pub sqs_attributes: BTreeMap<String, String>,
    #[serde(skip)]
    pub initial_settings: BTreeMap<String, u64>,
    /// 2: a standby node beside its node, which every durability-2 publish is synced on too
    /// (README, *A standby node*); 1 (the default): its node alone. The standard tier only.
    #[serde(default)]
    pub replicas: Option<u8>,
}

impl NewQueue {
    /// Refuses replicas other than 1 or 2, and a standby for a devtest queue.
    pub fn check_replicas(&self) -> Result<(), String> {
        match (self.replicas.unwrap_or(1), self.tier) {
            (1, _) | (2, Tier::Standard) => Ok(()),
            (2, Tier::Devtest) => {
                Err("a devtest queue has one replica: replicas 2 needs the standard tier".into())
            }
            (other, _) => Err(format!("replicas is 1 or 2, not {other}")),
        }
    }
}

/// SQS's rules for a queue name: 1 to 80 of `A-Za-z0-9_-`, and `.fifo` at the end only for
/// a FIFO queue.
pub fn check_name(name: &str) -> Result<(), String> {
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    let fine = !stem.is_empty()
        && name.len() <= 80
        && stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    match fine {
        true => Ok(()),
        false => Err(format!(
            "queue name {:?}: 1 to 80 characters of A-Z a-z 0-9 - _ (and .fifo at the end of a FIFO queue's)",
            name.chars().take(100).collect::<String>()
        )),
    }
}

/// SQS's rules for tags: at most 50, keys of 1 to 128 characters, values of at most 256,
/// no key starting with `aws:`.
pub fn check_tags(tags: &BTreeMap<String, String>) -> Result<(), String> {
    if tags.len() > MAX_TAGS {
        return Err(format!("a queue has at most {MAX_TAGS} tags"));
    }
    for (key, value) in tags {
        let key_fine = (1..=128).contains(&key.chars().count())
            && !key.to_ascii_lowercase().starts_with("aws:");
        if !key_fine || value.chars().count() > 256 {
            return Err(format!(
                "tag {:?}: a key of 1 to 128 characters not starting with aws:, a value of at most 256",
                key.chars().take(130).collect::<String>()
            ));
        }
    }
    Ok(())
}

/// The most tags a queue has (AWS's limit).
pub const MAX_TAGS: usize = 50;

/// A login as shown once, at creation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// The three logins as shown once, at creation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IssuedLogins {
    pub publisher: Credentials,
    pub subscriber: Credentials,
    pub admin: Credentials,
}

/// Makes a queue's record and its logins; the passwords leave only in the returned logins.
pub fn create(new: NewQueue) -> (Queue, IssuedLogins) {
    let id = qe_shared::random::label(12);
    let issue = |role: Role| {
        let credentials = Credentials {
            username: format!("{}-{}", role.name(), qe_shared::random::label(8)),
            password: qe_shared::random::text::<24>(),
        };
        let stored = StoredLogin {
            username: credentials.username.clone(),
            password_hash: PasswordHash::new(&credentials.password).to_string(),
        };
        (credentials, stored)
    };
    let (publisher, stored_publisher) = issue(Role::Publisher);
    let (subscriber, stored_subscriber) = issue(Role::Subscriber);
    let (admin, stored_admin) = issue(Role::Admin);
    let queue = Queue::new(id, new, [stored_publisher, stored_subscriber, stored_admin]);
    let logins = IssuedLogins {
        publisher,
        subscriber,
        admin,
    };
    (queue, logins)
}

/// Gives `role` of `queue` a new password; returns it (shown once) and keeps only its hash.
/// The node is to take it: the desired config moves to a new version.
pub fn rotate(queue: &mut Queue, role: Role) -> Credentials {
    queue.config_version += 1;
    let login = match role {
        Role::Publisher => &mut queue.publisher,
        Role::Subscriber => &mut queue.subscriber,
        Role::Admin => &mut queue.admin,
    };
    let password = qe_shared::random::text::<24>();
    login.password_hash = PasswordHash::new(&password).to_string();
    Credentials {
        username: login.username.clone(),
        password,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each machine's credential is rotated and retired on its own; the rotation is
    /// confirmed by the serving machine's, whichever slot that is.
    #[test]
    fn each_slot_retires_its_own_credential() {
        let mut queue = a_queue("slots", Status::Running);
        queue.replicas = 2;
        queue.serving = Slot::Second;
        assert_eq!(
            queue.rotate_credentials(),
            1,
            "the serving machine's new one"
        );
        assert_eq!(queue.credential_of(Slot::First), (0, Some(1)));
        assert_eq!(queue.credential_of(Slot::Second), (0, Some(1)));
        queue.credential_used(Slot::Second, 1);
        assert_eq!(queue.credential_of(Slot::Second), (1, None));
        assert_eq!(
            queue.credential_of(Slot::First),
            (0, Some(1)),
            "not the other's"
        );
        queue.credential_used(Slot::First, 0);
        assert_eq!(
            queue.credential_of(Slot::First),
            (0, Some(1)),
            "the old one retires nothing"
        );
        // A queue of one replica has no second credential to rotate.
        let mut alone = a_queue("alone", Status::Running);
        alone.rotate_credentials();
        assert_eq!(alone.credential_of(Slot::Second), (0, None));
        let text = serde_json::to_string(&alone).unwrap();
        assert!(
            !text.contains("second_credential"),
            "left out, as records from before: {text}"
        );
    }

    /// A queue adopted from the config its node kept: the machine in the slot whose
    /// credential the node presented serves, at the epoch its config gave it, and that
    /// credential is rotated; the other machine's is not known.
    #[test]
    fn an_adopted_queue_is_served_by_the_machine_that_reported_at_its_epoch() {
        let mut before = a_queue("made-after-the-backup", Status::Running);
        before.tier = Tier::Standard;
        let mut desired = before.desired_config(vec![], NodeTls::None);
        desired.replication = Some(qe_shared::node_channel::DesiredReplication {
            key_hash: "kept".into(),
            epoch: Some(3),
            step_down_after_ms: None,
            follow: None,
        });
        let adopted = Queue::adopted(&before.id, &desired, Slot::Second, 7);
        assert_eq!((adopted.replicas, adopted.serving), (2, Slot::Second));
        assert_eq!(adopted.epoch, 3);
        assert_eq!(adopted.credential_of(Slot::Second), (7, Some(8)));
        assert_eq!(adopted.credential_of(Slot::First), (0, None));
        assert_eq!(adopted.config_version, desired.version + 1);
        // A node of one replica, which never had an epoch: the first machine's, at 0.
        desired.replication = None;
        let alone = Queue::adopted(&before.id, &desired, Slot::First, 2);
        assert_eq!(
            (alone.replicas, alone.serving, alone.epoch),
            (1, Slot::First, 0)
        );
        assert_eq!(alone.credential_of(Slot::First), (2, Some(3)));
        // A restored store takes a later credential of either machine, never an earlier one.
        let mut queue = adopted;
        queue.credential_taken_after_a_backup(Slot::First, 5);
        assert_eq!(queue.credential_of(Slot::First), (5, None));
        queue.credential_taken_after_a_backup(Slot::Second, 6);
        assert_eq!(
            queue.credential_of(Slot::Second),
            (7, Some(8)),
            "earlier: kept"
        );
    }

    /// A node that has not said it takes initial settings (built before them, its config
    /// read with deny_unknown_fields) gets a config without the field, as before; one that
    /// said so gets them.
    #[test]
    fn initial_settings_go_only_to_a_node_that_takes_them() {
        let mut queue = a_queue("settings", Status::Running);
        queue
            .initial_settings
            .insert("max-ws-msg-len".into(), 262_144);
        let config = queue.desired_config(vec![], NodeTls::None);
        assert_eq!(config.initial_settings, None);
        let text = serde_json::to_string(&config).unwrap();
        assert!(!text.contains("initial_settings"), "{text}");
        queue.node_takes_initial_settings = true;
        let config = queue.desired_config(vec![], NodeTls::None);
        let given = config.initial_settings.unwrap();
        assert_eq!(given.get("max-ws-msg-len"), Some(&262_144));
    }

    #[test]
    fn replicas_are_1_or_2_and_a_standby_only_on_the_standard_tier() {
        let asked = |tier, replicas| NewQueue {
            tier,
            replicas,
            ..Default::default()
        };
        assert!(asked(Tier::Devtest, None).check_replicas().is_ok());
        assert!(asked(Tier::Standard, Some(2)).check_replicas().is_ok());
        assert!(asked(Tier::Devtest, Some(2)).check_replicas().is_err());
        assert!(asked(Tier::Standard, Some(0)).check_replicas().is_err());
        assert!(asked(Tier::Standard, Some(3)).check_replicas().is_err());
        // Kept as asked; a record from before replicas reads as one.
        let (queue, _) = create(asked(Tier::Standard, Some(2)));
        assert_eq!(queue.replicas, 2);
        let mut stored = serde_json::to_value(&queue).unwrap();
        assert_eq!(stored["replicas"], 2);
        stored.as_object_mut().unwrap().remove("replicas");
        let old: Queue = serde_json::from_value(stored).unwrap();
        assert_eq!(old.replicas, 1);
    }

    /// A standby started again (a new pid) is a change of the record, not a node placed
    /// anew: the node's silence is still judged.
    #[test]
    fn a_standbys_restart_is_not_the_nodes() {
        let mut queue = a_queue("placed", Status::Running);
        let resources = |node: &str, standby: &str| {
            BTreeMap::from([
                ("process".to_string(), node.to_string()),
                ("standby_process".to_string(), standby.to_string()),
            ])
        };
        let placement = |resources| Placement {
            node: "ws://127.0.0.1:1/".into(),
            addresses: Addresses {
                v6: Ipv6Addr::LOCALHOST,
                v4: None,
            },
            resources,
            restarted_because: None,
        };
        placement(resources("10", "20")).record_in(&mut queue);
        let standby_again = placement(resources("10", "21"));
        assert!(!standby_again.recorded_in(&queue));
        assert!(standby_again.node_recorded_in(&queue));
        let node_again = placement(resources("11", "20"));
        assert!(!node_again.node_recorded_in(&queue));

        // A node placed anew is recorded before its next standby: the record keeps the
        // standby it has until that one is placed.
        let mut moved = placement(resources("12", "22"));
        moved.node = "ws://127.0.0.1:2/".into();
        queue.replicas = 2;
        let version = queue.config_version;
        moved.record_node_in(&mut queue);
        assert!(moved.node_recorded_in(&queue));
        assert_eq!(queue.resources, resources("12", "20"));
        assert_eq!(
            queue.config_version,
            version + 1,
            "its standby follows anew"
        );
        moved.record_in(&mut queue);
        assert_eq!(queue.resources, resources("12", "22"));
        assert_eq!(
            queue.config_version,
            version + 1,
            "the node did not move again"
        );
    }

    #[test]
    fn a_new_queue_has_a_dns_safe_id_and_logins_kept_only_as_hashes() {
        let new = NewQueue {
            tier: Tier::Devtest,
            region: "local".into(),
            instance_type: "local".into(),
            ipv4: true,
            account: None,
            ..Default::default()
        };
        let (queue, logins) = create(new);
        assert_eq!(queue.id.len(), 12);
        assert!(queue
            .id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        assert!(queue.id.chars().next().unwrap().is_ascii_lowercase());
        assert_eq!(logins.admin.password.len(), 32, "192 bits");
        let stored = serde_json::to_string(&queue).unwrap();
        assert!(
            !stored.contains(&logins.publisher.password),
            "no password rests"
        );
        let hash = PasswordHash::parse(&queue.subscriber.password_hash).unwrap();
        assert!(hash.matches(&logins.subscriber.password));
        assert_ne!(logins.publisher.password, logins.subscriber.password);
    }
}
