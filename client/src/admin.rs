//! Administrators: every admin command of the manual, typed, with streams that page through
//! the queue and the dead letter queue.

use crate::endpoint::{Credentials, Endpoint, Kind};
use crate::error::{Error, Result};
use crate::link::{Fields, Redial};
use crate::message::{Body, Durability, Message, MessageId};
use base64::Engine;
use futures::{Stream, TryStreamExt};
use qe_shared::calendar::days_in_month;
use qe_shared::protocol::Role;
use qe_shared::settings::Setting;
use qe_shared::Code;
use serde_json::Value;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// The longest page `getmsgs` and `getdlqmsgs` give.
pub const MAX_PAGE: u32 = 1600;

/// An administrator's connection to a distribute queue.
///
/// Cheap to clone; clones share the connection, and commands from many tasks are in flight at
/// once (each reply is matched to its command). If the connection drops, commands in flight
/// fail with [`Error::Closed`] and the next one connects again.
///
/// ```no_run
/// use futures::TryStreamExt;
/// use qe_client::{Admin, Credentials, Endpoint};
///
/// # async fn run() -> qe_client::Result<()> {
/// let endpoint = Endpoint::new("wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/")?;
/// let admin = Admin::connect(&endpoint, Credentials::new("ADMIN-NAME", "ADMIN-PASSWORD")).await?;
/// let stats = admin.live_stats().await?;
/// println!("{} messages, {} in the dead letter queue", stats.messages, stats.dead_letter);
///
/// // Every message in the queue, a page of 1600 at a time.
/// let mut messages = std::pin::pin!(admin.all_messages());
/// while let Some(message) = messages.try_next().await? {
///     println!("{} {} bytes", message.id, message.len);
/// }
///
/// // Put the dead letter queue back (the manual's three steps each).
/// let dead: Vec<_> = admin.all_dlq_messages().try_collect().await?;
/// for message in dead {
///     admin.requeue_dlq_message(&message.id).await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Admin {
    core: Arc<Core>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("url", &self.core.connection.url())
            .finish_non_exhaustive()
    }
}

struct Core {
    connection: Redial,
    /// Where `getlivestats` pushes go while a subscription is active.
    pushes: Pushes,
}

type Pushes = Arc<Mutex<PushState>>;

/// The live-stats subscription, which belongs to one connection.
#[derive(Default)]
struct PushState {
    /// Counts the connections made (the latest is the one commands go on).
    connection: u64,
    /// Where the pushes of that connection go.
    sink: Option<(u64, mpsc::UnboundedSender<Result<LiveStats>>)>,
}

impl PushState {
    fn sink_of(&self, connection: u64) -> Option<mpsc::UnboundedSender<Result<LiveStats>>> {
        match &self.sink {
            Some((of, sink)) if *of == connection => Some(sink.clone()),
            _ => None,
        }
    }

    fn take(&mut self, connection: u64) -> Option<mpsc::UnboundedSender<Result<LiveStats>>> {
        match &self.sink {
            Some((of, _)) if *of == connection => self.sink.take().map(|(_, sink)| sink),
            _ => None,
        }
    }
}

/// The nine counters of `getlivestats` (and of each `getstats` record), in the manual's order.
///
/// ```
/// let stats: qe_client::LiveStats = "10,0,1,0,1,3,0,1,9".parse()?;
/// assert_eq!((stats.messages, stats.unacknowledged, stats.durable), (10, 3, 9));
/// # Ok::<(), qe_client::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LiveStats {
    /// Every message the queue holds: waiting, held, delayed, and in the dead letter queue.
    pub messages: u64,
    /// Open publisher connections (both queue types).
    pub publishers: u64,
    /// Open subscriber connections (both queue types).
    pub subscribers: u64,
    /// Saved sessions not connected.
    pub saved_subscribers: u64,
    /// Open administrator connections.
    pub administrators: u64,
    /// Messages held by subscribers, not yet acknowledged.
    pub unacknowledged: u64,
    /// Messages in the dead letter queue.
    pub dead_letter: u64,
    /// Messages waiting for their delay.
    pub delayed: u64,
    /// Messages with durability 1 or 2 (the dead letter queue's too).
    pub durable: u64,
}

impl FromStr for LiveStats {
    type Err = Error;

    /// The nine comma-separated counters, as `csv` carries them.
    fn from_str(csv: &str) -> Result<LiveStats> {
        let numbers = numbers(csv.trim(), 9)?;
        Ok(LiveStats::from_columns(&numbers))
    }
}

impl LiveStats {
    fn from_columns(n: &[u64]) -> LiveStats {
        LiveStats {
            messages: n[0],
            publishers: n[1],
            subscribers: n[2],
            saved_subscribers: n[3],
            administrators: n[4],
            unacknowledged: n[5],
            dead_letter: n[6],
            delayed: n[7],
            durable: n[8],
        }
    }
}

/// `count` comma-separated numbers.
fn numbers(line: &str, count: usize) -> Result<Vec<u64>> {
    let numbers: Vec<u64> = line
        .split(',')
        .map(|n| n.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| Error::protocol(format!("not {count} numbers: {line:?}")))?;
    match numbers.len() == count {
        true => Ok(numbers),
        false => Err(Error::protocol(format!("not {count} numbers: {line:?}"))),
    }
}

/// One line of `getstats`: a time and the nine counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsRecord {
    /// When it was recorded, in seconds since 1970 (UTC).
    pub time: u64,
    /// The counters then (averages, for a day's one line of averages).
    pub stats: LiveStats,
}

/// One line of `getusage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRecord {
    /// The end of the record's period, in seconds since 1970 (UTC).
    pub time: u64,
    /// Network bytes sent (on the socket, after TLS and compression).
    pub network_sent: u64,
    /// Network bytes received.
    pub network_received: u64,
    /// Bytes written to the message store.
    pub storage_written: u64,
    /// Bytes read from the message store.
    pub storage_read: u64,
    /// Bytes held on disk (the period's average).
    pub storage_held: u64,
    /// The machine's instance type.
    pub instance_type: String,
    /// Its region.
    pub region: String,
    /// Whether the queue has an IPv4 address.
    pub ipv4: bool,
}

impl FromStr for UsageRecord {
    type Err = Error;

    fn from_str(line: &str) -> Result<UsageRecord> {
        let fields: Vec<&str> = line.trim().split(',').collect();
        let bad = || Error::protocol(format!("a usage line that does not read: {line:?}"));
        let [time, sent, received, written, read, held, instance_type, region, ipv4] = fields[..]
        else {
            return Err(bad());
        };
        let number = |text: &str| text.parse::<u64>().map_err(|_| bad());
        Ok(UsageRecord {
            time: number(time)?,
            network_sent: number(sent)?,
            network_received: number(received)?,
            storage_written: number(written)?,
            storage_read: number(read)?,
            storage_held: number(held)?,
            instance_type: instance_type.to_string(),
            region: region.to_string(),
            ipv4: ipv4 == "1",
        })
    }
}

/// A day of the calendar (UTC), for `getstats` and `getusage`.
///
/// ```no_run
/// # async fn run(admin: qe_client::Admin) -> qe_client::Result<()> {
/// use qe_client::Day;
/// for record in admin.stats(Day::new(2026, 11, 9)).await? {
///     println!("{}: {} messages", record.time, record.stats.messages);
/// }
/// let today = admin.usage_totals(Day::today()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Day {
    /// The year.
    pub year: u32,
    /// The month, 1 to 12.
    pub month: u32,
    /// The day of the month, from 1.
    pub day: u32,
}

impl Day {
    /// A day; checked when used (405 for a month, 406 for a day that does not exist).
    pub fn new(year: u32, month: u32, day: u32) -> Day {
        Day { year, month, day }
    }

    /// Today, in UTC.
    pub fn today() -> Day {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (year, month, day) = qe_shared::calendar::civil_from_days(secs / 86_400);
        Day::new(year as u32, month as u32, day as u32)
    }

    fn fields(&self) -> Result<Fields> {
        if !(1..=12).contains(&self.month) {
            return Err(Error::invalid(Code::InvalidMonth));
        }
        let last = days_in_month(u64::from(self.year), u64::from(self.month));
        if !(1..=last).contains(&u64::from(self.day)) {
            return Err(Error::invalid(Code::InvalidDay));
        }
        let mut fields = Fields::new();
        fields.insert("year".into(), self.year.into());
        fields.insert("month".into(), self.month.into());
        fields.insert("day".into(), self.day.into());
        Ok(fields)
    }
}

/// A page of `getmsgs` or `getdlqmsgs`: `count` (1 to 1600) messages after or before an id,
/// in ascending id order either way.
///
/// ```no_run
/// # async fn run(admin: qe_client::Admin) -> qe_client::Result<()> {
/// use qe_client::Page;
/// let first = admin.messages(Page::first(20)).await?;
/// if let Some(last) = first.last() {
///     let next = admin.messages(Page::after(&last.id, 20)).await?;
/// }
/// let newest = admin.dlq_messages(Page::last(20)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    anchor: Anchor,
    count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Anchor {
    /// After this id; `None` from the start.
    After(Option<MessageId>),
    /// Before this id; `None` from the end.
    Before(Option<MessageId>),
}

impl Page {
    /// The first `count` messages.
    pub fn first(count: u32) -> Page {
        Page {
            anchor: Anchor::After(None),
            count,
        }
    }

    /// The `count` messages after `id`.
    pub fn after(id: &MessageId, count: u32) -> Page {
        Page {
            anchor: Anchor::After(Some(id.clone())),
            count,
        }
    }

    /// The last `count` messages.
    pub fn last(count: u32) -> Page {
        Page {
            anchor: Anchor::Before(None),
            count,
        }
    }

    /// The `count` messages just before `id`.
    pub fn before(id: &MessageId, count: u32) -> Page {
        Page {
            anchor: Anchor::Before(Some(id.clone())),
            count,
        }
    }

    fn fields(&self, cmd: &str) -> Result<Fields> {
        if !(1..=MAX_PAGE).contains(&self.count) {
            return Err(Error::invalid(Code::InvalidCount));
        }
        let (name, id) = match &self.anchor {
            Anchor::After(id) => ("after", id),
            Anchor::Before(id) => ("before", id),
        };
        let mut fields = command(cmd);
        let id = id.as_ref().map_or("", MessageId::as_str);
        fields.insert(name.into(), id.into());
        fields.insert("count".into(), self.count.into());
        Ok(fields)
    }
}

/// One line of `getmsgs` / `getdlqmsgs`.
///
/// ```
/// let line: qe_client::admin::MessageSummary =
///     "01a1c09f-62da-7000-a30b-0817c9a42e3f,89,0,1,1,1794233033".parse()?;
/// assert_eq!((line.len, line.durability), (89, qe_client::Durability::Eventual));
/// # Ok::<(), qe_client::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageSummary {
    /// The message's id.
    pub id: MessageId,
    /// The length of the frame a subscriber receives for it, in bytes.
    pub len: u64,
    /// The delay the publisher asked for, in seconds.
    pub delay_secs: u64,
    /// Its durability.
    pub durability: Durability,
    /// Whether it is binary (`"type":2`).
    pub binary: bool,
    /// When the queue received it, in seconds since 1970 (UTC).
    pub received_at: u64,
    /// When it went to the dead letter queue, in seconds since 1970 (a `getdlqmsgs` line;
    /// `None` in a `getmsgs` one, from a node that keeps no time, or for a message
    /// dead-lettered before its node did).
    pub dead_lettered_at: Option<u64>,
    /// Why it is in the dead letter queue (a `getdlqmsgs` line; `None` from a node that
    /// does not say): as [`StoredMessage::dead_reason`].
    pub dead_reason: Option<String>,
}

impl FromStr for MessageSummary {
    type Err = Error;

    /// The manual's six columns, or with a node's `dlqinfo` (README, "The dead letter
    /// queue") two more: when it was dead-lettered (empty when unknown) and why.
    fn from_str(line: &str) -> Result<MessageSummary> {
        let bad = || Error::protocol(format!("a message line that does not read: {line:?}"));
        let columns: Vec<&str> = line.trim().split(',').collect();
        let (id, numbered, dead) = match columns.len() {
            6 => (columns[0], &columns[1..6], None),
            8 => (columns[0], &columns[1..6], Some((columns[6], columns[7]))),
            _ => return Err(bad()),
        };
        let n = numbers(&numbered.join(","), 5).map_err(|_| bad())?;
        let dead_lettered_at = match dead {
            Some((at, _)) if !at.is_empty() => Some(at.parse::<u64>().map_err(|_| bad())?),
            _ => None,
        };
        let dead_reason = dead
            .map(|(_, reason)| reason.to_string())
            .filter(|reason| !reason.is_empty());
        Ok(MessageSummary {
            id: MessageId::from(id),
            len: n[0],
            delay_secs: n[1],
            durability: Durability::from_number(n[2]).ok_or_else(bad)?,
            binary: n[3] == 2,
            received_at: n[4],
            dead_lettered_at,
            dead_reason,
        })
    }
}

/// One message as `getmsg` / `getdlqmsg` show it, content and all.
///
/// ```no_run
/// # async fn run(admin: qe_client::Admin, id: qe_client::MessageId) -> qe_client::Result<()> {
/// use qe_client::admin::Content;
/// match admin.dlq_message(&id).await?.content {
///     Content::Message { body, .. } => println!("{:?}", body.as_text()),
///     Content::Damaged { file } => println!("damaged on disk ({:?} bytes)", file.map(|f| f.len())),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// Its id.
    pub id: MessageId,
    /// The length of the frame a subscriber receives for it, in bytes.
    pub len: u64,
    /// The delay the publisher asked for, in seconds.
    pub delay_secs: u64,
    /// Its durability.
    pub durability: Durability,
    /// What it holds.
    pub content: Content,
    /// Why it is in the dead letter queue (`getdlqmsg` only): `rejected` (a subscriber's nack,
    /// or an administrator's `movetodlq`), `max-receive-count` (its last allowed delivery
    /// failed) or `damaged` (its record did not read back from the disk).
    pub dead_reason: Option<String>,
    /// When it went to the dead letter queue, in seconds since 1970 (`getdlqmsg` only; `None`
    /// when the node does not know: a message dead-lettered by an older node).
    pub dead_lettered_at: Option<u64>,
}

/// A stored message's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// The message as a subscriber would receive it.
    Message {
        /// Its body, decoded.
        body: Body,
        /// The publisher's label, if it gave one.
        publisher_key: Option<String>,
        /// When the queue received it, in seconds since 1970 (UTC).
        received_at: u64,
    },
    /// Its file was damaged on the disk, so the queue moved it to the dead letter queue.
    Damaged {
        /// The whole file, unless it was too big to show.
        file: Option<Vec<u8>>,
    },
}

impl StoredMessage {
    /// A `getmsg` reply, or with `dead` a `getdlqmsg` one.
    fn read(reply: &Fields, dead: bool) -> Result<StoredMessage> {
        let bad = || Error::protocol(format!("a getmsg reply that does not read: {reply:?}"));
        let number = |name: &str| reply.get(name).and_then(Value::as_u64);
        let msg = reply
            .get("msg")
            .and_then(Value::as_object)
            .ok_or_else(bad)?;
        let id = msg
            .get("id")
            .or_else(|| reply.get("id"))
            .and_then(Value::as_str)
            .ok_or_else(bad)?;
        let content = match msg.get("damaged").and_then(Value::as_bool) {
            Some(true) => Content::Damaged {
                file: msg
                    .get("file")
                    .and_then(Value::as_str)
                    .and_then(|file| base64::engine::general_purpose::STANDARD.decode(file).ok()),
            },
            _ => {
                let message_type = msg.get("type").and_then(Value::as_u64).unwrap_or(1);
                let body = msg.get("body").and_then(Value::as_str).ok_or_else(bad)?;
                Content::Message {
                    body: Body::from_wire(message_type, body)?,
                    publisher_key: msg
                        .get("publisherkey")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    received_at: msg.get("recdat").and_then(Value::as_u64).unwrap_or(0),
                }
            }
        };
        // The queue names the reason when it is not a rejection (README, "Delivery rules").
        let dead_reason = dead.then(|| match (&content, reply.get("dlqreason")) {
            (Content::Damaged { .. }, _) => "damaged".to_string(),
            (_, Some(Value::String(reason))) => reason.clone(),
            _ => "rejected".to_string(),
        });
        Ok(StoredMessage {
            id: MessageId::from(id),
            len: number("len").unwrap_or(0),
            delay_secs: number("delay").unwrap_or(0),
            durability: number("durability")
                .and_then(Durability::from_number)
                .unwrap_or_default(),
            content,
            dead_reason,
            dead_lettered_at: dead.then(|| number("dlqdat")).flatten(),
        })
    }
}

/// One setting as `getcfg` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingValue {
    /// Its name (`max-ws-msg-len`, ...).
    pub name: String,
    /// Whether `setcfg` can change it.
    pub writable: bool,
    /// Its value, as text (`log-level` is not a number).
    pub value: String,
}

/// Every setting, as `getcfg` shows them: writable ones, then read-only ones.
///
/// ```no_run
/// # async fn run(admin: qe_client::Admin) -> qe_client::Result<()> {
/// use qe_client::Setting;
/// let settings = admin.config().await?;
/// println!("sessions are kept {:?} s", settings.value(Setting::SavedSessionTimeoutSecs));
/// println!("at most {:?} messages", settings.number("max-messages"));
/// admin.set_config(&[(Setting::SavedSessionTimeoutSecs, 60)]).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings(pub Vec<SettingValue>);

impl Settings {
    /// The setting with this name.
    pub fn get(&self, name: &str) -> Option<&SettingValue> {
        self.0.iter().find(|setting| setting.name == name)
    }

    /// A setting's value as a number.
    pub fn number(&self, name: &str) -> Option<u64> {
        self.get(name)?.value.parse().ok()
    }

    /// A writable setting's value.
    pub fn value(&self, setting: Setting) -> Option<u64> {
        self.number(setting.name())
    }
}

impl FromStr for Settings {
    type Err = Error;

    fn from_str(csv: &str) -> Result<Settings> {
        let settings = csv
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let mut fields = line.splitn(3, ',');
                match (fields.next(), fields.next(), fields.next()) {
                    (Some(name), Some(flag @ ("r" | "w")), Some(value)) => Ok(SettingValue {
                        name: name.to_string(),
                        writable: flag == "w",
                        value: value.to_string(),
                    }),
                    _ => Err(Error::protocol(format!(
                        "a getcfg line that does not read: {line:?}"
                    ))),
                }
            })
            .collect::<Result<_>>()?;
        Ok(Settings(settings))
    }
}

/// `getlivestats` pushes: first the counters of the subscribing reply, then one every period,
/// until [`Admin::unsubscribe_live_stats`] (the stream then ends) or the connection closes
/// (an [`Error::Closed`], then the end).
///
/// ```no_run
/// # async fn run(admin: qe_client::Admin) -> qe_client::Result<()> {
/// use futures::StreamExt;
/// use std::time::Duration;
/// let mut pushes = admin.subscribe_live_stats(Duration::from_secs(30)).await?;
/// while let Some(stats) = pushes.next().await {
///     println!("{} waiting or held", stats?.messages);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LiveStatsStream {
    pushes: mpsc::UnboundedReceiver<Result<LiveStats>>,
    ended: bool,
}

impl Stream for LiveStatsStream {
    type Item = Result<LiveStats>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let next = self.pushes.poll_recv(cx);
        if let Poll::Ready(Some(Err(_))) = &next {
            self.ended = true;
        }
        next
    }
}

/// What [`Admin::purge`] empties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeScope {
    /// The messages waiting for a subscriber.
    Waiting,
    /// The messages waiting for their delay.
    Delayed,
    /// The dead letter queue.
    DeadLetter,
    /// Everything: waiting, held (their holders get a notice), delayed and dead-lettered.
    All,
}

impl PurgeScope {
    /// The `scope` on the wire.
    pub fn name(self) -> &'static str {
        match self {
            PurgeScope::Waiting => "waiting",
            PurgeScope::Delayed => "delayed",
            PurgeScope::DeadLetter => "dlq",
            PurgeScope::All => "all",
        }
    }
}

/// The largest `count` [`Admin::redrive`] takes (the node's limit: max-messages is never
/// more).
pub const MAX_REDRIVE_COUNT: u64 = 1_000_000;

/// Which dead-lettered messages [`Admin::redrive`] moves back to the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redrive {
    /// Every one.
    All,
    /// These (all or none: 301 if one is not in the dead letter queue).
    Ids(Vec<MessageId>),
    /// Up to this many, oldest id first (1 to [`MAX_REDRIVE_COUNT`]).
    Oldest(u64),
}

impl Redrive {
    fn fields(&self) -> Result<Fields> {
        let mut fields = command("redrive");
        match self {
            Redrive::All => {}
            Redrive::Ids(ids) if ids.is_empty() => {
                return Err(Error::invalid_because(
                    Code::InvalidMessageId,
                    "no message ids to redrive",
                ))
            }
            Redrive::Ids(ids) => {
                let ids: Vec<Value> = ids.iter().map(|id| id.as_str().into()).collect();
                fields.insert("ids".into(), ids.into());
            }
            Redrive::Oldest(count) if !(1..=MAX_REDRIVE_COUNT).contains(count) => {
                return Err(Error::invalid_because(
                    Code::InvalidCount,
                    format!(
                        "Invalid message count. Count must be a value between 1 and \
                         {MAX_REDRIVE_COUNT} (both inclusive)."
                    ),
                ))
            }
            Redrive::Oldest(count) => {
                fields.insert("count".into(), (*count).into());
            }
        }
        Ok(fields)
    }
}

/// The number a bulk command's reply gives under `name`.
fn count_in(reply: &Fields, name: &str) -> Result<u64> {
    reply
        .get(name)
        .and_then(Value::as_u64)
        .ok_or_else(|| Error::protocol(format!("a reply without {name}")))
}

/// A command's fields.
fn command(cmd: &str) -> Fields {
    let mut fields = Fields::new();
    fields.insert("cmd".into(), cmd.into());
    fields
}

fn with_id(cmd: &str, id: &MessageId) -> Fields {
    let mut fields = command(cmd);
    fields.insert("id".into(), id.as_str().into());
    fields
}

fn csv(reply: &Fields) -> Result<&str> {
    reply
        .get("csv")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::protocol("a reply without csv"))
}

fn lines<T: FromStr<Err = Error>>(csv: &str) -> Result<Vec<T>> {
    csv.lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::parse)
        .collect()
}

impl FromStr for StatsRecord {
    type Err = Error;

    fn from_str(line: &str) -> Result<StatsRecord> {
        let n = numbers(line.trim(), 10)?;
        Ok(StatsRecord {
            time: n[0],
            stats: LiveStats::from_columns(&n[1..]),
        })
    }
}

/// Hands `getlivestats` pushes (the frames that answer no command) to the subscription of
/// the connection they came on.
fn forward_pushes(pushes: Pushes) -> crate::link::OnOpen {
    Box::new(move |mut frames: mpsc::UnboundedReceiver<Fields>| {
        let pushes = pushes.clone();
        let connection = {
            let mut state = pushes.lock().expect("pushes");
            state.connection += 1;
            state.connection
        };
        tokio::spawn(async move {
            while let Some(frame) = frames.recv().await {
                let is_push = frame.get("cmd").and_then(Value::as_str) == Some("getlivestats");
                let sink = pushes.lock().expect("pushes").sink_of(connection);
                match (is_push, sink) {
                    (true, Some(sink)) => {
                        let _ = sink.send(csv(&frame).and_then(str::parse));
                    }
                    _ => {
                        let frame = Value::Object(frame);
                        tracing::debug!(%frame, "ignored a frame from the queue");
                    }
                }
            }
            // The connection ended, and its subscription with it.
            if let Some(sink) = pushes.lock().expect("pushes").take(connection) {
                let _ = sink.send(Err(Error::Closed {
                    close_code: None,
                    reason: "the connection ended, and its live-stats subscription".into(),
                }));
            }
        });
    })
}

impl Admin {
    /// Connects to the queue at `endpoint` and logs in as its administrator (a distribute
    /// queue: 108 otherwise). Reconnects on the next command after a drop.
    pub async fn connect(endpoint: &Endpoint, credentials: Credentials) -> Result<Admin> {
        Admin::connect_with(endpoint, credentials, true).await
    }

    /// Connects and logs in; `reconnect` says whether a command after a drop connects again.
    pub async fn connect_with(
        endpoint: &Endpoint,
        credentials: Credentials,
        reconnect: bool,
    ) -> Result<Admin> {
        credentials.check()?;
        let login = credentials.login(Role::Admin, Kind::Distribute);
        let pushes = Pushes::default();
        let on_open = forward_pushes(pushes.clone());
        let (connection, _) = Redial::open(endpoint, login, reconnect, on_open).await?;
        Ok(Admin {
            core: Arc::new(Core { connection, pushes }),
        })
    }

    /// Sends a command of exactly these fields (a `context` is added) and returns the reply's
    /// fields: for commands or fields this library does not know yet.
    pub async fn command(&self, fields: Fields) -> Result<Fields> {
        let link = self.core.connection.link().await?;
        link.request_fields(fields)?.await
    }

    /// The largest frame (a command's JSON, an added message's body included) the connection
    /// there is now sends: the queue's `max-ws-msg-len` learned at its login, unless the
    /// [`Endpoint`] fixed one. `None`: any size is sent.
    pub fn max_frame_bytes(&self) -> Option<usize> {
        self.core.connection.current().max_frame_bytes()
    }

    /// `getlivestats`: the counters right now.
    pub async fn live_stats(&self) -> Result<LiveStats> {
        csv(&self.command(command("getlivestats")).await?)?.parse()
    }

    /// `getlivestats` with `subscribe`: the counters now, then pushed every `every` (30 s to
    /// 900 s, whole seconds). One subscription per connection (402 for a second).
    pub async fn subscribe_live_stats(&self, every: Duration) -> Result<LiveStatsStream> {
        let secs = every.as_secs();
        if !(30..=900).contains(&secs) || every.subsec_nanos() != 0 {
            return Err(Error::invalid(Code::InvalidSubscriptionPeriod));
        }
        let mut fields = command("getlivestats");
        fields.insert("subscribe".into(), secs.into());
        let reply = self.command(fields).await?;
        let first = csv(&reply)?.parse();
        let (sink, pushes) = mpsc::unbounded_channel();
        let _ = sink.send(first);
        let mut state = self.core.pushes.lock().expect("pushes");
        state.sink = Some((state.connection, sink));
        Ok(LiveStatsStream {
            pushes,
            ended: false,
        })
    }

    /// Stops the pushes (403 if none is active); the subscription's stream ends.
    pub async fn unsubscribe_live_stats(&self) -> Result<()> {
        let mut fields = command("getlivestats");
        fields.insert("subscribe".into(), 0.into());
        self.command(fields).await?;
        self.core.pushes.lock().expect("pushes").sink = None;
        Ok(())
    }

    async fn history(&self, cmd: &str, flag: &str, summary: bool, day: Day) -> Result<String> {
        let mut fields = day.fields()?;
        fields.insert("cmd".into(), cmd.into());
        fields.insert(flag.into(), summary.into());
        Ok(csv(&self.command(fields).await?)?.to_string())
    }

    /// `getstats` with `"average":false`: every record of one day (UTC). A day before the
    /// queue's first gets 407.
    pub async fn stats(&self, day: Day) -> Result<Vec<StatsRecord>> {
        lines(&self.history("getstats", "average", false, day).await?)
    }

    /// `getstats` with `"average":true`: the day's one line of averages (none for a day with
    /// no record yet).
    pub async fn stats_average(&self, day: Day) -> Result<Option<StatsRecord>> {
        let csv = self.history("getstats", "average", true, day).await?;
        Ok(lines(&csv)?.into_iter().next())
    }

    /// `getusage` with `"totals":false`: every usage record of one day (UTC).
    pub async fn usage(&self, day: Day) -> Result<Vec<UsageRecord>> {
        lines(&self.history("getusage", "totals", false, day).await?)
    }

    /// `getusage` with `"totals":true`: the day's bytes added up, its storage averaged.
    pub async fn usage_totals(&self, day: Day) -> Result<Option<UsageRecord>> {
        let csv = self.history("getusage", "totals", true, day).await?;
        Ok(lines(&csv)?.into_iter().next())
    }

    /// `getmsgs`: a page of the messages in the queue (waiting, held and delayed).
    pub async fn messages(&self, page: Page) -> Result<Vec<MessageSummary>> {
        lines(csv(&self.command(page.fields("getmsgs")?).await?)?)
    }

    /// `getdlqmsgs`: a page of the dead letter queue, each line with when and why its message
    /// went there (as far as the node says).
    pub async fn dlq_messages(&self, page: Page) -> Result<Vec<MessageSummary>> {
        let mut fields = page.fields("getdlqmsgs")?;
        fields.insert("dlqinfo".into(), true.into());
        lines(csv(&self.command(fields).await?)?)
    }

    /// Every message in the queue, in id order, fetched a page of 1600 at a time as the
    /// stream is read (a message published meanwhile may or may not be in it).
    pub fn all_messages(&self) -> impl Stream<Item = Result<MessageSummary>> + Send + 'static {
        self.pages(false, MAX_PAGE)
    }

    /// Every message in the dead letter queue, in id order, a page of 1600 at a time.
    pub fn all_dlq_messages(&self) -> impl Stream<Item = Result<MessageSummary>> + Send + 'static {
        self.pages(true, MAX_PAGE)
    }

    /// Every message of the queue (`dlq: false`) or the dead letter queue, `page_size` (1 to
    /// 1600) at a time.
    pub fn all_messages_paged(
        &self,
        dlq: bool,
        page_size: u32,
    ) -> impl Stream<Item = Result<MessageSummary>> + Send + 'static {
        self.pages(dlq, page_size)
    }

    fn pages(
        &self,
        dlq: bool,
        page_size: u32,
    ) -> impl Stream<Item = Result<MessageSummary>> + Send + 'static {
        /// Where the next page starts; `None` once the last page was read.
        type Cursor = Option<Page>;
        let admin = self.clone();
        let start: Cursor = Some(Page::first(page_size));
        futures::stream::try_unfold(start, move |cursor: Cursor| {
            let admin = admin.clone();
            async move {
                let Some(page) = cursor else {
                    return Ok::<_, Error>(None);
                };
                let messages = match dlq {
                    true => admin.dlq_messages(page).await?,
                    false => admin.messages(page).await?,
                };
                // A short page is the last one.
                let next = match messages.len() < page_size as usize {
                    true => None,
                    false => messages.last().map(|last| Page::after(&last.id, page_size)),
                };
                let page = futures::stream::iter(messages.into_iter().map(Ok::<_, Error>));
                Ok(Some((page, next)))
            }
        })
        .try_flatten()
    }

    /// `getmsg`: one message of the queue, with its content; it is not changed.
    pub async fn message(&self, id: &MessageId) -> Result<StoredMessage> {
        StoredMessage::read(&self.command(with_id("getmsg", id)).await?, false)
    }

    /// `getdlqmsg`: one message of the dead letter queue.
    pub async fn dlq_message(&self, id: &MessageId) -> Result<StoredMessage> {
        StoredMessage::read(&self.command(with_id("getdlqmsg", id)).await?, true)
    }

    /// `addmsg`: publishes a message (the same fields and checks as a publish); its id.
    pub async fn add_message(&self, message: Message) -> Result<MessageId> {
        message.check(false)?;
        let link = self.core.connection.link().await?;
        let reply = link
            .request(|context| message.to_addmsg(context), None)?
            .await?;
        reply
            .get("id")
            .and_then(Value::as_str)
            .map(MessageId::from)
            .ok_or_else(|| Error::protocol("an addmsg reply without an id"))
    }

    /// `delmsg`: deletes a message that is waiting, held or delayed (its holder gets a
    /// notice). 301 if the queue has no such message.
    pub async fn delete_message(&self, id: &MessageId) -> Result<()> {
        self.command(with_id("delmsg", id)).await.map(drop)
    }

    /// `movetodlq`: moves a message to the dead letter queue (413 for durability 0).
    pub async fn move_to_dlq(&self, id: &MessageId) -> Result<()> {
        self.command(with_id("movetodlq", id)).await.map(drop)
    }

    /// `deldlqmsg`: deletes a message from the dead letter queue.
    pub async fn delete_dlq_message(&self, id: &MessageId) -> Result<()> {
        self.command(with_id("deldlqmsg", id)).await.map(drop)
    }

    /// Puts a message of the dead letter queue back in the queue, the manual's three steps:
    /// `getdlqmsg`, `addmsg` with the same body, type, publisher key and durability (it gets
    /// a new id, returned), then `deldlqmsg`. If this stops between the last two, the message
    /// is in both places, and nothing is lost.
    pub async fn requeue_dlq_message(&self, id: &MessageId) -> Result<MessageId> {
        let stored = self.dlq_message(id).await?;
        let Content::Message {
            body,
            publisher_key,
            ..
        } = stored.content
        else {
            return Err(Error::invalid_because(
                Code::InvalidBody,
                "a damaged message cannot be published again",
            ));
        };
        let mut message = Message::new(body).durability(stored.durability);
        if let Some(key) = publisher_key {
            message = message.publisher_key(key);
        }
        let new = self.add_message(message).await?;
        self.delete_dlq_message(id).await?;
        Ok(new)
    }

    /// `purge` (beyond the manual): removes every message `scope` names, at once; how many.
    ///
    /// A [`Code::SyncFailed`] (507) refusal means the messages were removed but the removal
    /// is not as durable as they were: do not purge again for it.
    ///
    /// ```no_run
    /// # async fn run(admin: qe_client::Admin) -> qe_client::Result<()> {
    /// use qe_client::admin::PurgeScope;
    /// let purged = admin.purge(PurgeScope::DeadLetter).await?;
    /// println!("{purged} dead letters gone");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn purge(&self, scope: PurgeScope) -> Result<u64> {
        let mut fields = command("purge");
        fields.insert("scope".into(), scope.name().into());
        count_in(&self.command(fields).await?, "purged")
    }

    /// `redrive` (beyond the manual): moves dead-lettered messages back to the back of the
    /// queue, keeping their ids, in one step (unlike [`Admin::requeue_dlq_message`]'s
    /// three); how many moved.
    ///
    /// [`Redrive::Ids`] moves all or none (301 if one is not in the dead letter queue). An
    /// empty list or a count outside 1 to [`MAX_REDRIVE_COUNT`] is refused before sending
    /// ([`Error::Invalid`], 301 and 412). A [`Code::SyncFailed`] (507) refusal means they
    /// moved, less durably than promised.
    ///
    /// ```no_run
    /// # async fn run(admin: qe_client::Admin) -> qe_client::Result<()> {
    /// use qe_client::admin::Redrive;
    /// let moved = admin.redrive(Redrive::Oldest(100)).await?;
    /// println!("{moved} back in the queue");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn redrive(&self, which: Redrive) -> Result<u64> {
        count_in(&self.command(which.fields()?).await?, "redriven")
    }

    /// `getcfg`: every setting with its value.
    pub async fn config(&self) -> Result<Settings> {
        csv(&self.command(command("getcfg")).await?)?.parse()
    }

    /// `setcfg`: changes these settings, all or none; the change applies at once and is kept
    /// after a restart. Each value is checked against its range first (414).
    pub async fn set_config(&self, changes: &[(Setting, u64)]) -> Result<()> {
        if changes.is_empty() {
            return Err(Error::invalid(Code::NoWritableSetting));
        }
        let mut fields = command("setcfg");
        for (setting, value) in changes {
            if !setting.accepts(*value) {
                let (min, max) = setting.range();
                return Err(Error::invalid_because(
                    Code::SettingOutOfRange,
                    format!(
                        "Invalid {}. Must be between {min} and {max}.",
                        setting.name()
                    ),
                ));
            }
            fields.insert(setting.name().into(), (*value).into());
        }
        self.command(fields).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manuals_csv_reads() {
        let stats: LiveStats = "10,0,1,0,1,3,0,1,9".parse().unwrap();
        assert_eq!(
            stats,
            LiveStats {
                messages: 10,
                publishers: 0,
                subscribers: 1,
                saved_subscribers: 0,
                administrators: 1,
                unacknowledged: 3,
                dead_letter: 0,
                delayed: 1,
                durable: 9,
            }
        );
        assert!("1,2,3".parse::<LiveStats>().is_err());
        let usage: Vec<UsageRecord> =
            lines("1794182400,0,0,0,0,4096,m4.xlarge,us-east-1,1\n").unwrap();
        assert_eq!(usage[0].storage_held, 4096);
        assert_eq!(usage[0].instance_type, "m4.xlarge");
        assert!(usage[0].ipv4);
        let messages: Vec<MessageSummary> =
            lines("01a1c09f-62da-7000-a30b-0817c9a42e3f,89,0,1,1,1794233033\n").unwrap();
        assert_eq!(
            messages[0],
            MessageSummary {
                id: MessageId::from("01a1c09f-62da-7000-a30b-0817c9a42e3f"),
                len: 89,
                delay_secs: 0,
                durability: Durability::Eventual,
                binary: false,
                received_at: 1_794_233_033,
                dead_lettered_at: None,
                dead_reason: None,
            }
        );
        // A getdlqmsgs line with the node's dlqinfo columns; the time may be unknown.
        let dead: Vec<MessageSummary> = lines(
            "01a1c09f-62da-7000-a30b-0817c9a42e3f,89,0,1,1,1794233033,1794233099,max-receive-count\n\
             01a1c09f-62da-7000-a30b-0817c9a42e40,89,0,1,1,1794233033,,rejected\n",
        )
        .unwrap();
        assert_eq!(dead[0].dead_lettered_at, Some(1_794_233_099));
        assert_eq!(dead[0].dead_reason.as_deref(), Some("max-receive-count"));
        assert_eq!(dead[1].dead_lettered_at, None);
        assert_eq!(dead[1].dead_reason.as_deref(), Some("rejected"));
        assert!(
            "01a1c09f-62da-7000-a30b-0817c9a42e3f,89,0,1,1,1794233033,x,rejected"
                .parse::<MessageSummary>()
                .is_err()
        );
        let settings: Settings = "max-ws-msg-len,w,65536\nlog-level,r,info\n"
            .parse()
            .unwrap();
        assert_eq!(settings.value(Setting::MaxWsMsgLen), Some(65_536));
        assert_eq!(settings.get("log-level").unwrap().value, "info");
        assert!(!settings.get("log-level").unwrap().writable);
    }

    #[test]
    fn pages_and_days_are_checked_before_sending() {
        let code = |r: Result<Fields>| r.unwrap_err().code();
        assert_eq!(
            code(Page::first(0).fields("getmsgs")),
            Some(Code::InvalidCount)
        );
        assert_eq!(
            code(Page::first(1601).fields("getmsgs")),
            Some(Code::InvalidCount)
        );
        let page = Page::first(1600).fields("getmsgs").unwrap();
        assert_eq!(
            Value::Object(page),
            serde_json::json!({"cmd": "getmsgs", "after": "", "count": 1600})
        );
        assert_eq!(
            code(Day::new(2026, 13, 1).fields()),
            Some(Code::InvalidMonth)
        );
        assert_eq!(code(Day::new(2026, 2, 29).fields()), Some(Code::InvalidDay));
        assert!(Day::new(2028, 2, 29).fields().is_ok());
    }

    #[test]
    fn redrives_are_checked_before_sending() {
        let code = |which: Redrive| which.fields().unwrap_err().code();
        assert_eq!(code(Redrive::Ids(Vec::new())), Some(Code::InvalidMessageId));
        assert_eq!(code(Redrive::Oldest(0)), Some(Code::InvalidCount));
        assert_eq!(
            code(Redrive::Oldest(MAX_REDRIVE_COUNT + 1)),
            Some(Code::InvalidCount)
        );
        let fields = |which: Redrive| Value::Object(which.fields().unwrap());
        assert_eq!(fields(Redrive::All), serde_json::json!({"cmd": "redrive"}));
        assert_eq!(
            fields(Redrive::Oldest(3)),
            serde_json::json!({"cmd": "redrive", "count": 3})
        );
        assert_eq!(
            fields(Redrive::Ids(vec![MessageId::from("a")])),
            serde_json::json!({"cmd": "redrive", "ids": ["a"]})
        );
    }

    #[test]
    fn a_stored_message_reads() {
        let reply = serde_json::json!({"status":"Success.","id":"01a1c09f-62da-7000-a30b-0817c9a42e3f",
            "msg":{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","type":1,"body":"hello","recdat":1794233033},
            "len":89,"delay":0,"durability":1});
        let Value::Object(reply) = reply else {
            unreachable!()
        };
        let stored = StoredMessage::read(&reply, false).unwrap();
        assert_eq!(stored.len, 89);
        assert_eq!(stored.dead_reason, None, "getmsg: not dead");
        let rejected = StoredMessage::read(&reply, true).unwrap();
        assert_eq!(rejected.dead_reason.as_deref(), Some("rejected"));
        let mut expired = reply.clone();
        expired.insert("dlqreason".into(), "max-receive-count".into());
        let expired = StoredMessage::read(&expired, true).unwrap();
        assert_eq!(expired.dead_reason.as_deref(), Some("max-receive-count"));
        assert_eq!(
            stored.content,
            Content::Message {
                body: Body::Text("hello".into()),
                publisher_key: None,
                received_at: 1_794_233_033
            }
        );
        let damaged =
            serde_json::json!({"status":"Success.","msg":{"id":"x","damaged":true,"file":"aGk="}});
        let Value::Object(damaged) = damaged else {
            unreachable!()
        };
        let damaged = StoredMessage::read(&damaged, true).unwrap();
        assert_eq!(
            damaged.content,
            Content::Damaged {
                file: Some(b"hi".to_vec())
            }
        );
        assert_eq!(damaged.dead_reason.as_deref(), Some("damaged"));
    }
}
