//! Subscribers: a distribute subscriber stands in the line and acks what it holds; a copy
//! subscriber only listens.

use super::flat::{self, Plain};
use super::reply::Context;
use super::request::{self, number_field, whole_number, Field, Fields, Parsed};
use super::{Data, Reply, Response, Then};
use crate::engine::{CopySubscription, Frames, MessageId, SessionId, Subscription};
use crate::state::Node;
use crate::store::Receipt;
use qe_shared::settings::Setting;
use qe_shared::Code;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

pub struct Subscriber {
    node: Arc<Node>,
    subscription: Subscription,
    /// Deliveries from the queue, until the connection takes them.
    pub frames: Option<Frames>,
}

/// What a distribute subscriber may send.
enum Request {
    Ack,
    Logout,
    Capacity,
}

impl Subscriber {
    pub fn join(node: &Arc<Node>, capacity: u64) -> Subscriber {
        let (subscription, frames) = node.queue.subscribe(capacity, node.write_limit());
        Subscriber {
            node: node.clone(),
            subscription,
            frames: Some(frames),
        }
    }

    /// Resumes the saved session `old`; `None` if it cannot be (the manual's 109). Its reply
    /// waits for the receipt: a queue's standby has heard the session's new id, so a
    /// subscriber never learns an id the promoted copy would not know.
    pub fn resume(
        node: &Arc<Node>,
        old: SessionId,
        capacity: Option<u64>,
        replay: bool,
    ) -> Option<(Subscriber, Receipt)> {
        let (subscription, frames, heard) =
            node.queue
                .resume(old, capacity, replay, node.write_limit())?;
        let subscriber = Subscriber {
            node: node.clone(),
            subscription,
            frames: Some(frames),
        };
        Some((subscriber, heard))
    }

    /// The resumed subscriber once `heard` (its resume's receipt) is. Dropped while it waits
    /// (the client went away before its reply), the session is saved again, as a drop after
    /// the reply would leave it: never ended with what it holds.
    pub async fn once_heard(self, heard: Receipt) -> Subscriber {
        struct Resuming(Option<Subscriber>);
        impl Drop for Resuming {
            fn drop(&mut self) {
                if let Some(mut subscriber) = self.0.take() {
                    let frames = subscriber.frames.take();
                    subscriber.end(false, frames);
                }
            }
        }
        let mut resuming = Resuming(Some(self));
        // A hold's receipt never fails: nothing is written.
        let _ = heard.wait().await;
        resuming.0.take().expect("taken only here")
    }

    pub fn session_id(&self) -> SessionId {
        self.subscription.session()
    }

    /// The connection ended: a logout ends the session now; anything else is a drop, after
    /// which the session is saved for `saved-session-timeout-secs` or ends by the manual's
    /// rules. `frames` is the outbox the connection took (what is left in it was never sent).
    pub fn end(self, logged_out: bool, frames: Option<Frames>) {
        match (logged_out, frames) {
            (false, Some(frames)) => {
                let secs = self.node.setting(Setting::SavedSessionTimeoutSecs);
                let max_saved = self.node.limits.max_tasks;
                self.subscription
                    .disconnect(frames, Duration::from_secs(secs), max_saved);
            }
            _ => self.subscription.logout(),
        }
    }

    /// Its connection has room for deliveries again.
    pub fn drained(&self) {
        self.subscription.drained();
    }

    pub fn handle(&mut self, data: Data) -> Response {
        if let Data::Text(text) = &data {
            if let Some(response) = self.ack_typed(text.as_str()) {
                return response;
            }
        }
        let fields = match &data {
            Data::Binary(_) => return Response::abort(Reply::failure(Code::InvalidJson)),
            Data::Text(text) => match request::parse(text.as_str()) {
                Parsed::Object(fields) => fields,
                Parsed::NotJson => return Response::abort(Reply::failure(Code::InvalidJson)),
                Parsed::OtherJson => {
                    return Response::reply(Reply::failure(Code::UnexpectedSubscriberMessage))
                }
            },
        };
        let context = match request::context(&fields) {
            Ok(context) => context,
            Err(code) => return Response::reply(Reply::failure(code)),
        };
        let response = match classify(&fields) {
            Some(Request::Ack) => {
                let id = fields.get("id").and_then(Value::as_str);
                self.ack(number_field(&fields, "ack"), id)
            }
            Some(Request::Capacity) => Response::reply(self.set_capacity(&fields)),
            Some(Request::Logout) => match fields["logout"] {
                Value::Bool(true) => Response {
                    then: Then::Logout,
                    ..Response::durable(Reply::logout(), self.subscription.leave_now())
                },
                _ => Response::reply(Reply::failure(Code::InvalidLogout)),
            },
            None => Response::reply(Reply::failure(Code::UnexpectedSubscriberMessage)),
        };
        response.context(context)
    }

    /// An ack read typed, if it can be (see `request`).
    fn ack_typed(&self, text: &str) -> Option<Response> {
        let ack = read_ack_typed(text)?;
        Some(self.ack(ack.ack, ack.id).context(ack.context))
    }

    /// `{"id":..,"ack":1}` acknowledges; `"ack":0` rejects to the dead letter queue.
    fn ack(&self, ack: Field<u64>, id: Option<&str>) -> Response {
        let Field::Is(ack @ 0..=1) = ack else {
            return Response::reply(Reply::failure(Code::InvalidAck));
        };
        let Some(id) = id.and_then(MessageId::parse) else {
            return Response::reply(Reply::failure(Code::InvalidMessageId));
        };
        let recorded = match ack {
            1 => self.subscription.ack(id),
            _ => self.subscription.nack(id),
        };
        Response::changed(recorded.map(|receipt| (id, receipt)))
    }

    fn set_capacity(&self, fields: &Fields) -> Reply {
        let max = self.node.setting(Setting::MaxSubscriberCapacity);
        match whole_number(&fields["capacity"]).filter(|c| (1..=max).contains(c)) {
            Some(capacity) => {
                self.subscription.set_capacity(capacity);
                Reply::success()
            }
            None => Reply::failure(Code::InvalidCapacity),
        }
    }
}

/// An ack as read: its `ack` field, its id's text, the context to copy into the reply.
#[derive(Debug, PartialEq)]
pub struct AckRequest<'a> {
    pub ack: Field<u64>,
    pub id: Option<&'a str>,
    pub context: Option<Context>,
}

/// A request read typed (see `request`), if it can be and is an ack.
pub fn read_ack_typed(text: &str) -> Option<AckRequest<'_>> {
    if let Some(ack) = read_ack_flat(text) {
        return Some(ack);
    }
    let fields: AckFields = request::typed(text)?;
    let only_ack = fields.logout.is_absent() && fields.capacity.is_absent();
    if fields.ack.is_absent() || !only_ack {
        return None;
    }
    let id = match fields.id {
        Field::Is(id) => Some(id),
        _ => None,
    };
    Some(AckRequest {
        ack: fields.ack,
        id,
        context: request::typed_context(&fields.context)?,
    })
}

/// An ack of the usual shape, read by hand (see `flat`).
fn read_ack_flat(text: &str) -> Option<AckRequest<'_>> {
    let (mut id, mut ack, mut context) = (Field::Absent, Field::Absent, None);
    flat::read(text, |key, value| match (key, value) {
        ("id", Plain::Text(text)) => flat::set(&mut id, text),
        ("ack", Plain::Integer(n)) => flat::set(&mut ack, n.parse().ok()?),
        ("context", value) if context.is_none() => {
            context = Some(flat::context(value)?);
            Some(())
        }
        _ => None,
    })?;
    let id = match id {
        Field::Is(id) => Some(id),
        _ => None,
    };
    (!ack.is_absent()).then_some(AckRequest { ack, id, context })
}

/// An ack as sent, read typed (any other field: the general reading, as for a publish).
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct AckFields<'a> {
    #[serde(borrow)]
    id: Field<&'a str>,
    ack: Field<u64>,
    logout: Field<IgnoredAny>,
    capacity: Field<IgnoredAny>,
    #[serde(borrow)]
    context: Field<&'a RawValue>,
}

/// Which request this is: exactly one of `ack`, `logout` and `capacity` must be present.
fn classify(fields: &Fields) -> Option<Request> {
    let has = |key| fields.contains_key(key);
    match (has("ack"), has("logout"), has("capacity")) {
        (true, false, false) => Some(Request::Ack),
        (false, true, false) => Some(Request::Logout),
        (false, false, true) => Some(Request::Capacity),
        _ => None,
    }
}

/// A copy subscriber: it receives, and sends nothing after its login.
pub struct CopySubscriber {
    _subscription: CopySubscription,
    /// Copies from the queue, until the connection takes them.
    pub frames: Option<Frames>,
}

impl CopySubscriber {
    pub fn join(node: &Arc<Node>) -> CopySubscriber {
        let (subscription, frames) = node.copy.subscribe(node.write_limit());
        CopySubscriber {
            _subscription: subscription,
            frames: Some(frames),
        }
    }

    pub fn handle(&self, data: Data) -> Response {
        let fields = match &data {
            Data::Binary(_) => return Response::abort(Reply::failure(Code::InvalidJson)),
            Data::Text(text) => match request::parse(text.as_str()) {
                Parsed::NotJson => return Response::abort(Reply::failure(Code::InvalidJson)),
                Parsed::OtherJson => Fields::new(),
                Parsed::Object(fields) => fields,
            },
        };
        match request::context(&fields) {
            Ok(context) => {
                Response::reply(Reply::failure(Code::CopySubscriberSent).context(context))
            }
            Err(code) => Response::reply(Reply::failure(code)),
        }
    }
}
