//! What a frame means: first the login, then the requests of the role it chose.
//!
//! The connection layer hands each data frame to [`login`] and then to [`Session::handle`],
//! and gets back a [`Response`]: the reply to send, what must be durable before it is true,
//! and whether the connection goes on. `handle` is synchronous: each request takes effect at
//! once, in order, and only its reply waits for the disk, so a connection never stops reading
//! (or receiving deliveries) while its changes are synced. Close codes are the connection
//! layer's business; this layer only says how to end.

mod admin;
pub mod flat;
mod login;
mod publisher;
pub mod reply;
pub mod request;
mod subscriber;
pub mod typed_reading;

pub use login::{login, LoginForm};
pub use publisher::{read_message, read_typed};
pub use reply::Reply;
pub use subscriber::{read_ack_typed, AckRequest};

use crate::engine::{Frames, MessageId, Refused};
use crate::store::Receipt;
use admin::Admin;
use bytes::Bytes;
use publisher::Publisher;
use qe_shared::protocol::Role;
use qe_shared::Code;
use subscriber::{CopySubscriber, Subscriber};

/// A data frame from the client.
pub enum Data {
    Text(Text),
    Binary(Bytes),
}

impl Data {
    /// A text frame's payload: `None` if it is not UTF-8 (close code 1007, which the
    /// connection sends).
    pub fn text(payload: Bytes) -> Option<Data> {
        Text::checked(payload).map(Data::Text)
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Data::Text(text) => text.0.len(),
            Data::Binary(payload) => payload.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A text message, checked to be UTF-8 once, when it was made. yawc's own check is off
/// (`server::websocket_options`): with both, every message was checked twice, which was
/// about 1.7% of the node's instructions per message at 16 × 16.
pub struct Text(Bytes);

impl Text {
    pub fn checked(payload: Bytes) -> Option<Text> {
        std::str::from_utf8(&payload)
            .is_ok()
            .then_some(Text(payload))
    }

    pub fn as_str(&self) -> &str {
        // SAFETY: `checked` is the only way to make a `Text`, and it found the bytes UTF-8;
        // the bytes of a `Bytes` never change.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }
}

/// How the connection goes on after a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    Continue,
    /// The subscriber logged out: close with code 1000.
    Logout,
    /// Close the connection with no close frame (a failed login; text that is not JSON from
    /// a subscriber or administrator).
    Abort,
}

/// The answer to one frame.
pub struct Response {
    reply: Reply,
    /// A change the reply speaks of, and the failure to turn the reply into if the change
    /// cannot be made as durable as promised (507).
    durability: Option<(Receipt, Code)>,
    pub then: Then,
}

impl Response {
    pub fn reply(reply: Reply) -> Response {
        Response {
            reply,
            durability: None,
            then: Then::Continue,
        }
    }

    pub fn abort(reply: Reply) -> Response {
        Response {
            then: Then::Abort,
            ..Response::reply(reply)
        }
    }

    /// The answer to a change to message `id`: Success with the id once the change is as
    /// durable as promised, else 507 with the id (the change was made; do not repeat it), or
    /// the queue's refusal.
    pub fn changed(changed: Result<(MessageId, Receipt), Refused>) -> Response {
        match changed {
            Ok((id, receipt)) => Response {
                durability: Some((receipt, Code::SyncFailed)),
                ..Response::reply(Reply::success().with_id(id))
            },
            Err(refused) => Response::reply(Reply::failure(refused.code())),
        }
    }

    /// `reply` to a change that `receipt` makes durable; if it cannot be made as durable as
    /// promised, the same reply as 507 (the change was made; do not repeat it).
    pub fn durable(reply: Reply, receipt: Receipt) -> Response {
        Response {
            durability: Some((receipt, Code::SyncFailed)),
            ..Response::reply(reply)
        }
    }

    /// Attaches the request's context to whichever reply is sent.
    pub fn context(self, context: Option<impl Into<reply::Context>>) -> Response {
        Response {
            reply: self.reply.context(context),
            ..self
        }
    }

    /// Whether the reply waits for nothing: then [`Response::into_ready`] gives it at once,
    /// else [`Response::settle`] waits for it.
    pub fn is_ready(&self) -> bool {
        // A change kept in memory only is as durable as promised at once.
        matches!(self.durability, None | Some((Receipt::Done, _)))
    }

    /// The reply to send and what follows, of a response that [`Response::is_ready`].
    pub fn into_ready(self) -> (Reply, Then) {
        debug_assert!(self.is_ready());
        (self.reply, self.then)
    }

    /// Waits for the durability, then gives the reply to send and what follows.
    pub async fn settle(self) -> (Reply, Then) {
        let reply = match self.durability {
            None => self.reply,
            Some((receipt, failure)) => match receipt.wait().await {
                Ok(()) => self.reply,
                // The same reply (its id, its context) as a failure: built only when needed.
                Err(_) => self.reply.into_failure(failure),
            },
        };
        (reply, self.then)
    }
}

/// A logged-in connection, by role and queue type.
pub enum Session {
    /// Either queue type.
    Publisher(Publisher),
    /// A distribute subscriber, standing in the line.
    Subscriber(Subscriber),
    CopySubscriber(CopySubscriber),
    Admin(Admin),
}

impl Session {
    /// The connection ended, by a logout or not (a drop); `frames` is what `take_frames` gave.
    pub fn end(self, logged_out: bool, frames: Option<Frames>) {
        if let Session::Subscriber(subscriber) = self {
            subscriber.end(logged_out, frames);
        }
    }

    pub fn handle(&mut self, data: Data) -> Response {
        match self {
            Session::Publisher(publisher) => publisher.handle(data),
            Session::Subscriber(subscriber) => subscriber.handle(data),
            Session::CopySubscriber(subscriber) => subscriber.handle(data),
            Session::Admin(admin) => admin.handle(data),
        }
    }

    /// The connection has written enough to have room in its outbox again, after the queue
    /// found none: a subscriber gets what waits for it.
    pub fn outbox_drained(&self) {
        if let Session::Subscriber(subscriber) = self {
            subscriber.drained();
        }
    }

    /// Frames the queue sends on its own (deliveries, notices), for the roles that get them.
    /// The connection takes them once, to send them while replies wait.
    pub fn take_frames(&mut self) -> Option<Frames> {
        match self {
            Session::Subscriber(subscriber) => subscriber.frames.take(),
            Session::CopySubscriber(subscriber) => subscriber.frames.take(),
            Session::Admin(admin) => admin.frames.take(),
            Session::Publisher(_) => None,
        }
    }

    /// The role the connection logged in as.
    pub fn role(&self) -> Role {
        match self {
            Session::Publisher(_) => Role::Publisher,
            Session::Subscriber(_) | Session::CopySubscriber(_) => Role::Subscriber,
            Session::Admin(_) => Role::Admin,
        }
    }
}
