//! What a frame means: first the login, then the requests of the role it chose.
//!
//! The connection layer hands each data frame to [`login`] and then to [`Session::handle`],
//! and gets back a [`Response`]: the reply to send and whether the connection goes on.
//! Close codes are the connection layer's business; this layer only says how to end.

mod admin;
mod login;
mod publisher;
pub mod reply;
pub mod request;
mod subscriber;

pub use login::login;
pub use reply::Reply;

use admin::Admin;
use bytes::Bytes;
use publisher::Publisher;
use subscriber::{CopySubscriber, Subscriber};
use tokio::sync::mpsc::UnboundedReceiver;

/// A data frame from the client.
pub enum Data {
    /// A text frame; the connection layer has checked it is UTF-8.
    Text(Bytes),
    Binary(Bytes),
}

impl Data {
    pub fn text(payload: Bytes) -> Data {
        debug_assert!(std::str::from_utf8(&payload).is_ok());
        Data::Text(payload)
    }
}

/// Reads a text payload the connection layer checked.
fn as_str(payload: &Bytes) -> &str {
    std::str::from_utf8(payload).expect("the connection layer checks text frames are UTF-8")
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
    pub reply: Reply,
    pub then: Then,
}

impl Response {
    pub fn reply(reply: Reply) -> Response {
        Response {
            reply,
            then: Then::Continue,
        }
    }

    pub fn abort(reply: Reply) -> Response {
        Response {
            reply,
            then: Then::Abort,
        }
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
    pub async fn handle(&mut self, data: Data) -> Response {
        match self {
            Session::Publisher(publisher) => Response::reply(publisher.handle(data).await),
            Session::Subscriber(subscriber) => subscriber.handle(data).await,
            Session::CopySubscriber(subscriber) => subscriber.handle(data),
            Session::Admin(admin) => admin.handle(data),
        }
    }

    /// Frames the queue sends on its own (deliveries, notices), for the roles that get them.
    pub fn frames(&mut self) -> Option<&mut UnboundedReceiver<Bytes>> {
        match self {
            Session::Subscriber(subscriber) => Some(&mut subscriber.frames),
            Session::CopySubscriber(subscriber) => Some(&mut subscriber.frames),
            Session::Publisher(_) | Session::Admin(_) => None,
        }
    }
}
