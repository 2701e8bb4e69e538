//! Subscribers: a distribute subscriber stands in the line and acks what it holds; a copy
//! subscriber only listens.

use super::request::{self, whole_number, Fields, Parsed};
use super::{as_str, Data, Reply, Response, Then};
use crate::engine::{CopySubscription, MessageId, SessionId, Subscription};
use crate::node::Node;
use bytes::Bytes;
use qe_shared::settings::Setting;
use qe_shared::Code;
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

pub struct Subscriber {
    node: Arc<Node>,
    subscription: Subscription,
    /// Deliveries from the queue.
    pub frames: UnboundedReceiver<Bytes>,
}

/// What a distribute subscriber may send.
enum Request {
    Ack,
    Logout,
    Capacity,
}

impl Subscriber {
    pub fn join(node: &Arc<Node>, capacity: u64) -> Subscriber {
        let (subscription, frames) = node.queue.subscribe(capacity);
        Subscriber {
            node: node.clone(),
            subscription,
            frames,
        }
    }

    pub fn session_id(&self) -> SessionId {
        self.subscription.session()
    }

    pub async fn handle(&mut self, data: Data) -> Response {
        let fields = match &data {
            Data::Binary(_) => return Response::abort(Reply::failure(Code::InvalidJson)),
            Data::Text(payload) => match request::parse(as_str(payload)) {
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
        let (reply, then) = match classify(&fields) {
            Some(Request::Ack) => (self.ack(&fields).await, Then::Continue),
            Some(Request::Capacity) => (self.set_capacity(&fields), Then::Continue),
            Some(Request::Logout) => match fields["logout"] {
                Value::Bool(true) => (Reply::logout(), Then::Logout),
                _ => (Reply::failure(Code::InvalidLogout), Then::Continue),
            },
            None => (
                Reply::failure(Code::UnexpectedSubscriberMessage),
                Then::Continue,
            ),
        };
        Response {
            reply: reply.context(context),
            then,
        }
    }

    /// `{"id":..,"ack":1}` acknowledges; `"ack":0` rejects to the dead letter queue.
    async fn ack(&self, fields: &Fields) -> Reply {
        let Some(ack) = fields.get("ack").and_then(whole_number).filter(|a| *a <= 1) else {
            return Reply::failure(Code::InvalidAck);
        };
        let Some(id) = fields
            .get("id")
            .and_then(Value::as_str)
            .and_then(MessageId::parse)
        else {
            return Reply::failure(Code::InvalidMessageId);
        };
        let recorded = match ack {
            1 => self.subscription.ack(id),
            _ => self.subscription.nack(id),
        };
        match recorded {
            Ok(receipt) => match receipt.wait().await {
                Ok(()) => Reply::success().with("id", id.to_string()),
                Err(_) => Reply::failure(Code::SyncFailed).with("id", id.to_string()),
            },
            Err(refused) => Reply::failure(refused.code()),
        }
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
    pub frames: UnboundedReceiver<Bytes>,
}

impl CopySubscriber {
    pub fn join(node: &Arc<Node>) -> CopySubscriber {
        let (subscription, frames) = node.copy.subscribe();
        CopySubscriber {
            _subscription: subscription,
            frames,
        }
    }

    pub fn handle(&self, data: Data) -> Response {
        let fields = match &data {
            Data::Binary(_) => return Response::abort(Reply::failure(Code::InvalidJson)),
            Data::Text(payload) => match request::parse(as_str(payload)) {
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
