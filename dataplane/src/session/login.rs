//! The login: the first frame of every connection.
//!
//! Faults are found in the order DECISIONS.md sets: the form of each field first, lowest code
//! first; the password check (107) only once every field is well formed; the session lookup
//! (109) last.

use super::admin::Admin;
use super::publisher::{has_publish_fields, Publisher};
use super::request::{self, optional_number_in, Fields, Parsed};
use super::subscriber::{CopySubscriber, Subscriber};
use super::{Data, Reply, Session};
use crate::engine::SessionId;
use crate::state::Node;
use qe_shared::console_token::Rights;
use qe_shared::protocol::{QueueType, Role, MAX_CREDENTIAL_BYTES};
use qe_shared::settings::Setting;
use qe_shared::Code;
use serde_json::Value;
use std::sync::Arc;

/// A login whose fields are well formed.
pub struct LoginForm<'a> {
    username: &'a str,
    password: &'a str,
    role: Role,
    queue_type: QueueType,
    /// A distribute subscriber's capacity; `None` when resuming without one.
    capacity: Option<u64>,
    /// The session a distribute subscriber asks to resume.
    resume: Option<SessionId>,
    /// On a resume, send again every held message (else only those never sent).
    replay: bool,
}

/// Logs a connection in. `Ok` holds the session and its reply (for a publish in the login,
/// the publish's reply); `Err` holds the reply of a failed login, after which the connection
/// closes.
pub async fn login(data: Data, node: &Arc<Node>) -> Result<(Session, Reply), Reply> {
    let text = match &data {
        Data::Text(text) => text.as_str(),
        Data::Binary(_) => return Err(Reply::failure(Code::LoginNotText)),
    };
    let Parsed::Object(fields) = request::parse(text) else {
        return Err(Reply::failure(Code::InvalidJson));
    };
    let context = request::context(&fields).map_err(Reply::failure)?;
    let refuse = |code: Code| Reply::failure(code).context(context.clone());
    let success = || limits_asked(&fields, node, Reply::success()).context(context.clone());

    if fields.contains_key("console_token") {
        let rights = console_login(&fields, node).map_err(refuse)?;
        return Ok((Session::Admin(Admin::with_rights(node, rights)), success()));
    }
    let max_capacity = node.setting(Setting::MaxSubscriberCapacity);
    let form = LoginForm::read(&fields, max_capacity).map_err(refuse)?;
    if !node.verify(form.role, form.username, form.password) {
        return Err(refuse(Code::AuthenticationFailed));
    }

    match (form.role, form.queue_type) {
        (Role::Publisher, queue_type) => {
            let publisher = Publisher::new(node.clone(), queue_type).sent_by(form.username);
            let reply = if has_publish_fields(&fields) {
                publisher
                    .publish_fields(fields)
                    .context(context)
                    .settle()
                    .await
                    .0
            } else {
                success()
            };
            Ok((Session::Publisher(publisher), reply))
        }
        (Role::Subscriber, QueueType::Distribute) => {
            let subscriber = match form.resume {
                Some(old) => {
                    let resumed = Subscriber::resume(node, old, form.capacity, form.replay);
                    let (subscriber, heard) =
                        resumed.ok_or_else(|| refuse(Code::InvalidSessionId))?;
                    subscriber.once_heard(heard).await
                }
                None => {
                    let capacity = form.capacity.expect("a login without sessionid has one");
                    Subscriber::join(node, capacity)
                }
            };
            let reply = success().with("sessionid", subscriber.session_id().to_string());
            Ok((Session::Subscriber(subscriber), reply))
        }
        (Role::Subscriber, QueueType::Copy) => {
            let subscriber = CopySubscriber::join(node);
            Ok((Session::CopySubscriber(subscriber), success()))
        }
        (Role::Admin, QueueType::Distribute) => Ok((Session::Admin(Admin::new(node)), success())),
        // LoginForm::read refuses this already; answering beats a panic that stops the node.
        (Role::Admin, QueueType::Copy) => Err(refuse(Code::AdminNotOnCopy)),
    }
}

/// Beyond the manual (README, "Limits at login"): a login with `"limits":true` learns the
/// queue's `max-ws-msg-len` in its reply, so a client library sends what the queue takes
/// rather than assuming the default. Any other value of `limits` asks nothing; a publish in
/// the login answers with the publish's reply alone.
fn limits_asked(fields: &Fields, node: &Node, reply: Reply) -> Reply {
    match fields.get("limits") {
        Some(Value::Bool(true)) => reply.with("maxwsmsglen", node.setting(Setting::MaxWsMsgLen)),
        _ => reply,
    }
}

/// The rights of a console login (`console_token` instead of username and password;
/// [`crate::auth::console`]): its role and queue type are checked as any login's, then the token.
fn console_login(fields: &Fields, node: &Node) -> Result<Rights, Code> {
    let role = text(fields, "role")
        .and_then(Role::parse)
        .ok_or(Code::InvalidRole)?;
    let queue_type = text(fields, "queuetype")
        .and_then(QueueType::parse)
        .ok_or(Code::InvalidQueueType)?;
    match (role, queue_type) {
        (Role::Admin, QueueType::Copy) => Err(Code::AdminNotOnCopy),
        (Role::Admin, QueueType::Distribute) => text(fields, "console_token")
            .and_then(|token| node.console.take(token, crate::engine::now_ms() / 1000))
            .ok_or(Code::AuthenticationFailed),
        // A console token is for an administrator only.
        _ => Err(Code::AuthenticationFailed),
    }
}

impl<'a> LoginForm<'a> {
    /// Checks a login's fields in the order DECISIONS.md sets; `max_capacity` is the
    /// `max-subscriber-capacity` setting.
    pub fn read(fields: &'a Fields, max_capacity: u64) -> Result<LoginForm<'a>, Code> {
        let username = credential(fields, "username").ok_or(Code::InvalidUsername)?;
        let password = credential(fields, "password").ok_or(Code::InvalidPassword)?;
        let role = text(fields, "role")
            .and_then(Role::parse)
            .ok_or(Code::InvalidRole)?;
        let queue_type = text(fields, "queuetype")
            .and_then(QueueType::parse)
            .ok_or(Code::InvalidQueueType)?;
        let mut form = LoginForm {
            username,
            password,
            role,
            queue_type,
            capacity: None,
            resume: None,
            replay: false,
        };
        match (role, queue_type) {
            (Role::Admin, QueueType::Copy) => return Err(Code::AdminNotOnCopy),
            (Role::Subscriber, QueueType::Distribute) => {
                form.resume = match fields.get("sessionid") {
                    None => None,
                    Some(value) => Some(
                        value
                            .as_str()
                            .and_then(SessionId::parse)
                            .ok_or(Code::InvalidSessionId)?,
                    ),
                };
                form.replay = match fields.get("replay") {
                    None => false,
                    Some(Value::Bool(replay)) => *replay,
                    Some(_) => return Err(Code::InvalidReplay),
                };
                form.capacity = optional_number_in(
                    fields,
                    "capacity",
                    1..=max_capacity,
                    Code::InvalidCapacity,
                )?;
                if form.capacity.is_none() && form.resume.is_none() {
                    return Err(Code::InvalidCapacity);
                }
            }
            // A copy subscriber has no capacity, and a capacity given is ignored.
            _ => {}
        }
        Ok(form)
    }
}

fn text<'a>(fields: &'a Fields, key: &str) -> Option<&'a str> {
    fields.get(key).and_then(Value::as_str)
}

/// A username or password: a string of at most 128 bytes.
fn credential<'a>(fields: &'a Fields, key: &str) -> Option<&'a str> {
    text(fields, key).filter(|t| t.len() <= MAX_CREDENTIAL_BYTES)
}
