//! An administrator: watches the queue, manages its messages and settings.
//!
//! Beyond the manual, two commands manage messages in bulk (README, "Beyond the manual"):
//! - `{"cmd":"purge","scope":"waiting"|"delayed"|"dlq"|"all"}` removes what the scope names
//!   (`all`: waiting, held, delayed and dead-lettered; holders get `{"deleted":true,..}`) and
//!   replies `{"status":"Success.","purged":N}`. A scope that is missing or not one of these
//!   gets 400.
//! - `{"cmd":"redrive"}` moves every dead-lettered message back to the back of the queue,
//!   `"ids":[..]` the ones listed, `"count":N` up to N, oldest id first; it replies
//!   `{"status":"Success.","redriven":N}`. `ids` that is not a non-empty list of ids, or names
//!   one that is not in the dead letter queue, gets 301 and moves nothing; a `count` that is
//!   not a whole number from 1 to `MAX_REDRIVE_COUNT` gets 412; both `ids` and `count` get 400.
//!   A log that can no longer make a change durable gets 502, and nothing moves.
//!
//! Both wait for the durability their messages need, as `delmsg` does: 507 (with the count)
//! if it cannot be reached; the change was made.
//!
//! `{"cmd":"getlogrounds"}` tells how long the message log's writes and syncs have taken
//! since start, for the bench: `{"status":"Success.","write":[..],"sync":[..]}`, where the
//! k-th count is of rounds under 2^k microseconds (the last also counts longer ones).

use super::publisher::Publisher;
use super::request::{self, whole_number, Fields, Parsed};
use super::{Data, Reply, Response};
use crate::engine::outbox::{outbox, Outbox};
use crate::engine::{
    Anchor, Dead, DeadReason, Frames, Message, MessageId, Queue, Redrive, Refused, Scope,
};
use crate::history;
use crate::state::Node;
use crate::store::Receipt;
use qe_shared::console_token::Rights;
use qe_shared::protocol::QueueType;
use qe_shared::settings::{fixed, ReadOnlySetting, Setting};
use qe_shared::Code;
use serde_json::Value;
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The longest page of `getmsgs` and `getdlqmsgs`.
const MAX_PAGE: u64 = 1600;
/// The largest `count` of a `redrive`: max-messages is never more.
const MAX_REDRIVE_COUNT: u64 = 1_000_000;
/// `getlivestats` pushes: 0 stops them, else every 30 to 900 seconds.
const PUSH_PERIOD_SECS: std::ops::RangeInclusive<u64> = 30..=900;

pub struct Admin {
    node: Arc<Node>,
    /// `addmsg` publishes as a distribute publisher would.
    publisher: Publisher,
    /// Where `getlivestats` pushes go, and their receiving end until the connection takes it.
    outbox: Outbox,
    pub frames: Option<Frames>,
    /// The task that pushes live stats, while a subscription is active.
    pushes: Option<JoinHandle<()>>,
    /// `Read` for a read-only console login: a change command gets 400, as one it does not know.
    rights: Rights,
}

/// What a read-only console login may use: the commands that change nothing.
const READ_COMMANDS: [&str; 9] = [
    "getlogrounds",
    "getmsgs",
    "getmsg",
    "getdlqmsgs",
    "getdlqmsg",
    "getcfg",
    "getlivestats",
    "getstats",
    "getusage",
];

/// Which of the two queues a command looks at.
#[derive(Clone, Copy)]
enum Shelf {
    Queue,
    DeadLetter,
}

impl Admin {
    pub fn new(node: &Arc<Node>) -> Admin {
        Admin::with_rights(node, Rights::Write)
    }

    /// An administrator with `rights` (a console login's; a password login has all).
    pub fn with_rights(node: &Arc<Node>, rights: Rights) -> Admin {
        let (outbox, frames) = outbox(node.write_limit());
        Admin {
            node: node.clone(),
            publisher: Publisher::new(node.clone(), QueueType::Distribute),
            outbox,
            frames: Some(frames),
            pushes: None,
            rights,
        }
    }

    pub fn handle(&mut self, data: Data) -> Response {
        let fields = match &data {
            Data::Binary(_) => return Response::abort(Reply::failure(Code::InvalidJson)),
            Data::Text(text) => match request::parse(text.as_str()) {
                Parsed::NotJson => return Response::abort(Reply::failure(Code::InvalidJson)),
                Parsed::OtherJson => return Response::reply(Reply::failure(Code::InvalidCommand)),
                Parsed::Object(fields) => fields,
            },
        };
        let context = match request::context(&fields) {
            Ok(context) => context,
            Err(code) => return Response::reply(Reply::failure(code)),
        };
        let cmd = fields
            .get("cmd")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let refused = self.rights == Rights::Read && !READ_COMMANDS.contains(&cmd);
        let response = match cmd {
            _ if refused => Response::reply(Reply::failure(Code::InvalidCommand)),
            "getlivestats" => Response::reply(self.live_stats(&fields)),
            "getstats" => Response::reply(self.history(&fields, history::Kind::Stats)),
            "getusage" => Response::reply(self.history(&fields, history::Kind::Usage)),
            "getmsgs" => Response::reply(self.list(&fields, Shelf::Queue)),
            "getdlqmsgs" => Response::reply(self.list(&fields, Shelf::DeadLetter)),
            "getmsg" => Response::reply(self.show(&fields, Shelf::Queue)),
            "getdlqmsg" => Response::reply(self.show(&fields, Shelf::DeadLetter)),
            "addmsg" => self.publisher.publish_fields(fields),
            "delmsg" => self.change(&fields, |q, id| q.delete(id)),
            "movetodlq" => self.change(&fields, |q, id| q.move_to_dead_letter(id)),
            "deldlqmsg" => self.change(&fields, |q, id| q.delete_dead_letter(id)),
            "purge" => self.purge(&fields),
            "redrive" => self.redrive(&fields),
            "getcfg" => Response::reply(self.config()),
            "getlogrounds" => Response::reply(self.log_rounds()),
            "setcfg" => Response::reply(self.set_config(&fields)),
            _ => Response::reply(Reply::failure(Code::InvalidCommand)),
        };
        response.context(context)
    }

    /// `getlogrounds`: the log's writes and syncs by how long they took.
    fn log_rounds(&self) -> Reply {
        let rounds = self.node.storage.rounds();
        Reply::success()
            .with("write", rounds.write.counts().to_vec())
            .with("sync", rounds.sync.counts().to_vec())
    }

    /// `getlivestats`, and `subscribe` to have it pushed.
    fn live_stats(&mut self, fields: &Fields) -> Reply {
        let Some(period) = fields.get("subscribe") else {
            return Reply::success().with("csv", self.node.live_stats_csv());
        };
        let period = whole_number(period)
            .filter(|p| *p == 0 || PUSH_PERIOD_SECS.contains(p))
            .ok_or(Code::InvalidSubscriptionPeriod);
        match (period, self.pushes.is_some()) {
            (Err(code), _) => Reply::failure(code),
            (Ok(0), false) => Reply::failure(Code::NoSubscription),
            (Ok(0), true) => {
                self.stop_pushes();
                Reply::success()
            }
            (Ok(_), true) => Reply::failure(Code::SubscriptionActive),
            (Ok(secs), false) => {
                self.pushes = Some(tokio::spawn(push_live_stats(
                    self.node.clone(),
                    self.outbox.clone(),
                    Duration::from_secs(secs),
                )));
                Reply::success().with("csv", self.node.live_stats_csv())
            }
        }
    }

    /// `getstats` (stats, with `average`) / `getusage` (usage, with `totals`): one UTC day of
    /// records, or its one-line summary.
    fn history(&self, fields: &Fields, which: history::Kind) -> Reply {
        let day =
            match history::parse_day(fields.get("year"), fields.get("month"), fields.get("day")) {
                Ok(day) => day,
                Err(code) => return Reply::failure(code),
            };
        let flag = match which {
            history::Kind::Stats => "average",
            history::Kind::Usage => "totals",
        };
        let Some(summary) = fields.get(flag).and_then(Value::as_bool) else {
            return Reply::failure(Code::InvalidAverage);
        };
        let history = &self.node.history;
        if let Err(refused) = history.check_has_data(day) {
            let reason = refused
                .reason
                .unwrap_or_else(|| refused.code.reason().into());
            return Reply::failure_because(refused.code, reason);
        }
        let csv = match which {
            history::Kind::Stats => history.stats_of(day, summary),
            history::Kind::Usage => history.usage_of(day, summary),
        };
        match csv {
            Ok(csv) => Reply::success().with("csv", csv),
            Err(_) => Reply::failure(Code::DatabaseDown),
        }
    }

    fn stop_pushes(&mut self) {
        if let Some(pushes) = self.pushes.take() {
            pushes.abort();
        }
    }

    /// `getmsgs` / `getdlqmsgs`: a page, as `id,len,delay,durability,type,recdat` lines.
    /// Beyond the manual (README, "The dead letter queue"): `getdlqmsgs` with `"dlqinfo":true`
    /// adds two columns, when the message was dead-lettered (seconds since 1970; empty when
    /// unknown) and why, so that a listing shows both without a `getdlqmsg` per row.
    fn list(&self, fields: &Fields, shelf: Shelf) -> Reply {
        let anchor = match (fields.get("after"), fields.get("before")) {
            (Some(after), None) => anchor_id(after, Code::InvalidAfter).map(Anchor::After),
            (None, Some(before)) => anchor_id(before, Code::InvalidBefore).map(Anchor::Before),
            _ => Err(Code::BeforeOrAfter),
        };
        let count = fields
            .get("count")
            .and_then(whole_number)
            .filter(|c| (1..=MAX_PAGE).contains(c));
        let (anchor, count) = match (anchor, count) {
            (Err(code), _) => return Reply::failure(code),
            (Ok(_), None) => return Reply::failure(Code::InvalidCount),
            (Ok(anchor), Some(count)) => (anchor, count as usize),
        };
        let dead = matches!(shelf, Shelf::DeadLetter);
        let page = self.node.queue.page(dead, anchor, count);
        let with_deaths = dead && fields.get("dlqinfo") == Some(&Value::Bool(true));
        let deaths = match with_deaths {
            true => self.node.queue.deaths(page.iter().map(|(id, _)| *id)),
            false => Vec::new(),
        };
        let mut csv = String::new();
        for (row, (id, message)) in page.iter().enumerate() {
            let _ = write!(
                csv,
                "{},{},{},{},{},{}",
                id,
                message.frame.len(),
                message.delay_secs,
                message.durability as u8,
                message.body_type as u8,
                message.recdat
            );
            // A row whose message left the dead letter queue between the two locks has no
            // death: its columns stay empty.
            if let Some(death) = deaths.get(row) {
                let at = death.and_then(Dead::at_secs);
                let reason = match (death, message.is_damaged()) {
                    (None, _) => "",
                    (Some(_), true) => "damaged",
                    (Some(death), false) => death.reason.name(),
                };
                let at = at.map_or(String::new(), |secs| secs.to_string());
                let _ = write!(csv, ",{at},{reason}");
            }
            csv.push('\n');
        }
        Reply::success().with("csv", csv)
    }

    /// `getmsg` / `getdlqmsg`: one message as its subscriber would receive it.
    fn show(&self, fields: &Fields, shelf: Shelf) -> Reply {
        let Some(id) = message_id(fields) else {
            return Reply::failure(Code::InvalidMessageId);
        };
        let dead = matches!(shelf, Shelf::DeadLetter);
        let Some(message) = self.node.queue.get(id, dead) else {
            return Reply::failure(Code::InvalidMessageId);
        };
        let mut reply = shown(id, &message);
        if !dead {
            return reply;
        }
        // Beyond the manual (README, "The dead letter queue"): why it is dead-lettered, when
        // it is not a nack or a movetodlq (what the manual's replies never needed to say),
        // and when, if the node knows.
        let Some(death) = self.node.queue.deaths([id]).pop().flatten() else {
            return reply;
        };
        if death.reason != DeadReason::Rejected {
            reply = reply.with("dlqreason", death.reason.name());
        }
        if let Some(secs) = death.at_secs() {
            reply = reply.with("dlqdat", secs);
        }
        reply
    }

    /// `delmsg`, `movetodlq`, `deldlqmsg`: a change to one message, durable as the message is.
    fn change(
        &self,
        fields: &Fields,
        change: impl FnOnce(&Queue, MessageId) -> Result<Receipt, Refused>,
    ) -> Response {
        let Some(id) = message_id(fields) else {
            return Response::reply(Reply::failure(Code::InvalidMessageId));
        };
        let changed = change(&self.node.queue, id);
        Response::changed(changed.map(|receipt| (id, receipt)))
    }

    /// `purge`: empties the part of the queue `scope` names.
    fn purge(&self, fields: &Fields) -> Response {
        let scope = match fields.get("scope").and_then(Value::as_str) {
            Some("waiting") => Scope::Waiting,
            Some("delayed") => Scope::Delayed,
            Some("dlq") => Scope::DeadLetter,
            Some("all") => Scope::All,
            _ => return Response::reply(Reply::failure(Code::InvalidCommand)),
        };
        let (purged, receipt) = self.node.queue.purge(scope);
        Response::durable(Reply::success().with("purged", purged), receipt)
    }

    /// `redrive`: moves dead-lettered messages back to the queue: all, `ids`, or `count`.
    fn redrive(&self, fields: &Fields) -> Response {
        let ids: Vec<MessageId>;
        let which = match (fields.get("ids"), fields.get("count")) {
            (Some(_), Some(_)) => return Response::reply(Reply::failure(Code::InvalidCommand)),
            (None, None) => Redrive::All,
            (Some(list), None) => {
                let parsed = list
                    .as_array()
                    .filter(|list| !list.is_empty())
                    .and_then(|list| {
                        let id = |v: &Value| v.as_str().and_then(MessageId::parse);
                        list.iter().map(id).collect::<Option<Vec<_>>>()
                    });
                let Some(parsed) = parsed else {
                    return Response::reply(Reply::failure(Code::InvalidMessageId));
                };
                ids = parsed;
                Redrive::Ids(&ids)
            }
            (None, Some(count)) => {
                match whole_number(count).filter(|c| (1..=MAX_REDRIVE_COUNT).contains(c)) {
                    Some(count) => Redrive::Count(count as usize),
                    None => {
                        let reason = format!(
                            "Invalid message count. Count must be a value between 1 and \
                             {MAX_REDRIVE_COUNT} (both inclusive)."
                        );
                        return Response::reply(Reply::failure_because(Code::InvalidCount, reason));
                    }
                }
            }
        };
        match self.node.queue.redrive(which) {
            Ok((redriven, receipt)) => {
                Response::durable(Reply::success().with("redriven", redriven), receipt)
            }
            Err(refused) => Response::reply(Reply::failure(refused.code())),
        }
    }

    /// `getcfg`: every setting, `NAME,FLAG,VALUE` a line, writable ones first.
    fn config(&self) -> Reply {
        let settings = self.node.settings();
        let mut csv = String::new();
        for setting in Setting::ALL {
            let _ = writeln!(csv, "{},w,{}", setting.name(), settings.get(setting));
        }
        for setting in ReadOnlySetting::ALL {
            let _ = writeln!(csv, "{},r,{}", setting.name(), self.read_only(setting));
        }
        Reply::success().with("csv", csv)
    }

    fn read_only(&self, setting: ReadOnlySetting) -> String {
        let limits = &self.node.limits;
        match setting {
            ReadOnlySetting::MaxTasks => limits.max_tasks.to_string(),
            ReadOnlySetting::MaxMessages => limits.max_messages.to_string(),
            ReadOnlySetting::MaxMessagesMemory => limits.max_messages_memory.to_string(),
            ReadOnlySetting::MessagesMemoryUsed => self.node.queue.memory_used().to_string(),
            ReadOnlySetting::MaxWriteQueueBytes => {
                fixed::max_write_queue_bytes(self.node.tier).to_string()
            }
            ReadOnlySetting::MessageTimeoutSecs => self.node.message_timeout.as_secs().to_string(),
            ReadOnlySetting::LogLevel => self.node.log_level.clone(),
        }
    }

    /// `setcfg`: all of the named settings change, or none does.
    fn set_config(&self, fields: &Fields) -> Reply {
        let mut changes = Vec::new();
        let mut faults = Vec::new();
        for (name, value) in fields
            .iter()
            .filter(|(k, _)| !["cmd", "context"].contains(&k.as_str()))
        {
            if let Some(setting) = Setting::parse(name) {
                match whole_number(value).filter(|v| setting.accepts(*v)) {
                    Some(value) => changes.push((setting, value)),
                    None => {
                        let (min, max) = setting.range();
                        let reason = format!("Invalid {name}. Must be between {min} and {max}.");
                        faults.push(Reply::failure_because(Code::SettingOutOfRange, reason));
                    }
                }
            } else if ReadOnlySetting::parse(name).is_some() {
                let reason = format!("Read only parameter {name} specified.");
                faults.push(Reply::failure_because(Code::SettingReadOnly, reason));
            } else {
                faults.push(Reply::failure(Code::NoWritableSetting));
            }
        }
        if changes.is_empty() && faults.is_empty() {
            return Reply::failure(Code::NoWritableSetting);
        }
        if let Some(fault) = faults.into_iter().min_by_key(|f| f.code()) {
            return fault;
        }
        // The save syncs (sled flush, then fsync): the runtime hands this thread's other work on while
        // it waits, and this connection's next request waits for the change, as it should.
        let node = &self.node;
        match qe_shared::files::on_disk(|| node.change_settings(&changes)) {
            Ok(()) => Reply::success(),
            Err(error) => Reply::failure(error.code()),
        }
    }
}

impl Drop for Admin {
    /// Pushes stop when the connection closes.
    fn drop(&mut self) {
        self.stop_pushes();
    }
}

async fn push_live_stats(node: Arc<Node>, outbox: Outbox, period: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        ticks.tick().await;
        let push = serde_json::json!({"cmd": "getlivestats", "csv": node.live_stats_csv()});
        if !outbox.send(push.to_string().into()) {
            return;
        }
    }
}

/// `after` / `before`: an id, or "" for the start / the end.
fn anchor_id(value: &Value, code: Code) -> Result<Option<MessageId>, Code> {
    match value.as_str() {
        Some("") => Ok(None),
        Some(text) => MessageId::parse(text).map(Some).ok_or(code),
        None => Err(code),
    }
}

fn message_id(fields: &Fields) -> Option<MessageId> {
    fields
        .get("id")
        .and_then(Value::as_str)
        .and_then(MessageId::parse)
}

/// `getmsg`'s reply: the message unchanged, its length, delay and durability.
fn shown(id: MessageId, message: &Message) -> Reply {
    let msg: Value = serde_json::from_slice(&message.frame).expect("frames are JSON objects");
    Reply::success()
        .with_id(id)
        .with("msg", msg)
        .with("len", message.frame.len())
        .with("delay", message.delay_secs)
        .with("durability", message.durability as u8)
}
