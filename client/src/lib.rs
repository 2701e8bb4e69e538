//! The Rust client of **The Queue Expert**, a managed message queue: a subscriber keeps one
//! WebSocket open and every message is pushed to it the moment it arrives.
//!
//! ```toml
//! [dependencies]
//! qe-client = "0.1"
//! tokio = { version = "1", features = ["full"] }
//! futures = "0.3"
//! ```
//!
//! A queue has one address and three logins (publisher, subscriber, administrator), which the
//! control plane shows when it makes the queue. This crate speaks the whole protocol of the
//! user manual over `ws://` or `wss://` (rustls; permessage-deflate on request):
//!
//! | Type | What it does |
//! |---|---|
//! | [`Endpoint`] | where the queue is: URL, TLS roots, compression, timeouts, the largest frame ([`FrameLimit`], learned from the queue) |
//! | [`Publisher`] | publishes [`Message`]s, many in flight at once, each answered with its [`MessageId`] |
//! | [`Subscriber`] | [`handle_each`](Subscriber::handle_each) message then acknowledge it; or a [`Stream`](futures::Stream) of [`Event`]s: deliveries to [`ack`](Delivery::ack) or [`nack`](Delivery::nack), notices, reconnections; resumes its session after a drop |
//! | [`Admin`] | every admin command, typed, with streams that page through the queue and the dead letter queue |
//! | [`CopyPublisher`], [`CopySubscriber`] | the copy type of the queue: fan-out, nothing stored |
//! | [`ControlPlane`] | the control plane's HTTP API: queues, logins, usage, stats, bills |
//! | [`Error`] | every failure: the queue's refusals carry the manual's [`Code`] |
//!
//! # A worker
//!
//! ```no_run
//! use qe_client::{Credentials, Endpoint, Message, Publisher, Subscriber, Verdict};
//!
//! #[tokio::main]
//! async fn main() -> qe_client::Result<()> {
//!     let endpoint = Endpoint::new("wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/")?;
//!
//!     let publisher = Publisher::connect(&endpoint, Credentials::new("PUBLISHER-NAME", "PUBLISHER-PASSWORD")).await?;
//!     let id = publisher.publish(Message::text("Order 1234 is ready").delay_secs(5)).await?;
//!     println!("published {id}");
//!
//!     let login = Credentials::new("SUBSCRIBER-NAME", "SUBSCRIBER-PASSWORD");
//!     let mut subscriber = Subscriber::connect(&endpoint, login, 10).await?;
//!     // Each message is acknowledged once its handler has returned: at least once.
//!     subscriber
//!         .handle_each(|delivery| async move {
//!             println!("working on {:?}", delivery.text());
//!             Verdict::Ack
//!         })
//!         .await
//! }
//! ```
//!
//! # What delivery promises, and what this client adds
//!
//! The queue delivers **at least once**. This client narrows that where the protocol allows:
//! when a subscriber's connection drops it resumes its session (with `"replay":true`) and
//! drops the queue's resends of messages it already delivered, so within a resumed session
//! each message reaches the application once, and none is lost on the way. Only when the
//! session cannot be resumed does it start a new one, and then it says which messages may
//! come again ([`Event::Reconnected`] with `resumed: false`). See [`Subscriber`] and
//! [`Reconnect`].
//!
//! So handle a message first and acknowledge it after: a process that stops between the two
//! gets the message again (at least once), while one that acknowledges first and stops before
//! handling it has lost it. When the node restarts and cannot resume the session, an ack of a
//! message delivered before fails with [`Error::SessionEnded`]: nothing was lost, the message
//! comes again, and the usual answer is to go on (`qe tail` does; tested through three
//! SIGKILLs of the node in `tests/tests/client.rs`).
//!
//! [`Subscriber::handle_each`] is that order, written once: it calls your handler with each
//! message, acknowledges it when the handler returns (or rejects it to the dead letter queue
//! if the handler's [`Verdict`] says so), and goes on through reconnections and
//! `SessionEnded`. A handler may therefore see a message more than once, never zero times:
//! make it idempotent (tested with a SIGKILL of the node mid-handler in
//! `tests/tests/client_limits.rs`).
//!
//! # The largest frame
//!
//! The queue closes a connection (1009) that sends a frame over its `max-ws-msg-len` (65,536
//! bytes unless an administrator set it between 1,024 and 1,048,576). Each connection this
//! client opens learns that limit at its login, and refuses a bigger request with
//! [`Error::TooLarge`] before sending it; see [`FrameLimit`] to fix it instead, or to send any
//! size.
//!
//! # Errors
//!
//! A request the queue refuses is [`Error::Refused`] with the manual's failure code
//! ([`Code`]) and reason; a request the client can tell is wrong (a delay over two days, a
//! bad publisher key, a page of 2000) is [`Error::Invalid`] with the code the queue would have
//! given, and is not sent. Connections that end are [`Error::Closed`] with the WebSocket close
//! code, if the queue sent one.
//!
//! # Modules
//!
//! - `endpoint`, `transport`: the address and how it is reached (TCP, TLS, a read buffer,
//!   yawc's WebSocket client).
//! - `link`: one logged-in connection, a reader and a writer task, replies matched to
//!   requests by `context`.
//! - `message`, `publisher`, `subscriber`, `copy_subscriber`, [`admin`]: the three roles.
//! - [`control_plane`]: the HTTP API.
#![warn(missing_docs)]

pub mod admin;
pub mod control_plane;
mod copy_subscriber;
mod endpoint;
mod error;
mod id;
mod link;
mod message;
mod publisher;
mod reconnect;
mod subscriber;
mod transport;

pub use admin::{Admin, Day, LiveStats, Page};
pub use control_plane::ControlPlane;
pub use copy_subscriber::{CopyEvent, CopyMessage, CopySubscriber};
pub use endpoint::{Credentials, Endpoint, FrameLimit};
pub use error::{Error, Result};
pub use message::{Body, Durability, Message, MessageId};
pub use publisher::{
    CopyPublisher, PendingReply, Publisher, PublisherBuilder, DEFAULT_MAX_IN_FLIGHT,
};
pub use qe_shared::protocol::Role;
pub use qe_shared::settings::Setting;
pub use qe_shared::Code;
pub use reconnect::Reconnect;
pub use subscriber::{Delivery, Event, Subscriber, SubscriberBuilder, SubscriberHandle, Verdict};
