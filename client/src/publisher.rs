//! Publishers: pipelined publishes on one connection, each reply matched to its message by
//! `context`.

use crate::endpoint::{Credentials, Endpoint, Kind};
use crate::error::{Error, Result};
use crate::link::{Fields, Link, Redial, Reply};
use crate::message::{Message, MessageId};
use qe_shared::protocol::Role;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::Semaphore;

/// How many publishes may wait for their replies at once, unless the builder says otherwise.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// A publisher on a distribute queue: each message is stored until a subscriber acknowledges
/// it, and each publish is answered with the message's id.
///
/// Cheap to clone; clones share the connection, so many tasks can publish at once. Many
/// publishes can be in flight on the one connection ([`Publisher::send`],
/// [`Publisher::publish_all`]), up to a window (1024 unless
/// [`PublisherBuilder::max_in_flight`] says otherwise).
///
/// If the connection drops, publishes in flight fail with [`Error::Closed`] (each may or may
/// not have been published) and the next publish connects again.
///
/// ```no_run
/// use qe_client::{Credentials, Durability, Endpoint, Message, Publisher};
///
/// # async fn run() -> qe_client::Result<()> {
/// let endpoint = Endpoint::new("wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/")?;
/// let login = Credentials::new("PUBLISHER-NAME", "PUBLISHER-PASSWORD");
/// let publisher = Publisher::connect(&endpoint, login).await?;
///
/// // One publish, awaited.
/// let id = publisher.publish(Message::text("Hello")).await?;
/// println!("published {id}");
///
/// // Many in flight at once; the results come back in the messages' order.
/// let orders = (0..100).map(|n| {
///     Message::text(format!("order {n}"))
///         .durability(Durability::Immediate)
///         .publisher_key(format!("order-{n}"))
/// });
/// for result in publisher.publish_all(orders).await {
///     println!("{:?}", result?);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Publisher {
    core: Arc<Core>,
}

/// A publisher on the copy type of the queue: every subscriber connected at that moment gets
/// the message, nothing is stored, and the reply says how many subscribers got it.
///
/// ```no_run
/// use qe_client::{CopyPublisher, Credentials, Endpoint, Message};
///
/// # async fn run() -> qe_client::Result<()> {
/// let endpoint = Endpoint::new("wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/")?;
/// let login = Credentials::new("PUBLISHER-NAME", "PUBLISHER-PASSWORD");
/// let publisher = CopyPublisher::connect(&endpoint, login).await?;
/// let subscribers = publisher.publish(Message::text("price: 12.5")).await?;
/// println!("{subscribers} subscribers got it");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct CopyPublisher {
    core: Arc<Core>,
}

/// What both kinds of publisher are.
struct Core {
    connection: Redial,
    /// A place per publish waiting for its reply.
    window: Arc<Semaphore>,
    kind: Kind,
}

/// How a publisher connects: its window and whether it reconnects.
///
/// ```no_run
/// # async fn run() -> qe_client::Result<()> {
/// # let endpoint = qe_client::Endpoint::new("ws://127.0.0.1:8080/")?;
/// # let login = qe_client::Credentials::new("PUBLISHER-NAME", "PUBLISHER-PASSWORD");
/// let publisher = qe_client::Publisher::builder(&endpoint, login)
///     .max_in_flight(64)
///     .reconnect(false)
///     .connect()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PublisherBuilder {
    endpoint: Endpoint,
    credentials: Credentials,
    max_in_flight: usize,
    reconnect: bool,
}

impl PublisherBuilder {
    /// How many publishes may wait for their replies at once (at least 1; 1024 unless
    /// given). [`Publisher::send`] waits for room.
    pub fn max_in_flight(mut self, publishes: usize) -> PublisherBuilder {
        self.max_in_flight = publishes.max(1);
        self
    }

    /// Whether a publish after a dropped connection connects again (yes unless given).
    pub fn reconnect(mut self, reconnect: bool) -> PublisherBuilder {
        self.reconnect = reconnect;
        self
    }

    /// Connects to the distribute queue and logs in.
    pub async fn connect(self) -> Result<Publisher> {
        Ok(Publisher {
            core: Arc::new(self.open(Kind::Distribute).await?),
        })
    }

    /// Connects to the copy queue and logs in.
    pub async fn connect_copy(self) -> Result<CopyPublisher> {
        Ok(CopyPublisher {
            core: Arc::new(self.open(Kind::Copy).await?),
        })
    }

    async fn open(self, kind: Kind) -> Result<Core> {
        self.credentials.check()?;
        let login = self.credentials.login(Role::Publisher, kind);
        let ignore = Box::new(|_| {});
        let (connection, _) = Redial::open(&self.endpoint, login, self.reconnect, ignore).await?;
        Ok(Core {
            connection,
            window: Arc::new(Semaphore::new(self.max_in_flight)),
            kind,
        })
    }
}

impl Core {
    async fn send<T>(
        &self,
        message: Message,
        read: fn(Fields) -> Result<T>,
    ) -> Result<PendingReply<T>> {
        message.check(self.kind == Kind::Copy)?;
        let permit = self
            .window
            .clone()
            .acquire_owned()
            .await
            .expect("the window is never closed");
        let link = self.connection.link().await?;
        let reply = link.request(|context| message.to_request(context), Some(permit))?;
        Ok(PendingReply { reply, read })
    }

    async fn publish_all<T>(
        &self,
        messages: impl IntoIterator<Item = Message>,
        read: fn(Fields) -> Result<T>,
    ) -> Vec<Result<T>> {
        let mut pending = Vec::new();
        for message in messages {
            pending.push(self.send(message, read).await);
        }
        let mut results = Vec::with_capacity(pending.len());
        for reply in pending {
            results.push(match reply {
                Ok(reply) => reply.await,
                Err(error) => Err(error),
            });
        }
        results
    }

    async fn publish_raw(&self, fields: Fields) -> Result<Fields> {
        let link: Link = self.connection.link().await?;
        link.request_fields(fields)?.await
    }
}

impl Publisher {
    /// Connects to the distribute queue at `endpoint` and logs in as a publisher.
    pub async fn connect(endpoint: &Endpoint, credentials: Credentials) -> Result<Publisher> {
        Publisher::builder(endpoint, credentials).connect().await
    }

    /// A publisher with options of its own (window, reconnection).
    pub fn builder(endpoint: &Endpoint, credentials: Credentials) -> PublisherBuilder {
        PublisherBuilder {
            endpoint: endpoint.clone(),
            credentials,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            reconnect: true,
        }
    }

    /// Publishes one message and waits for its reply: the message's id.
    ///
    /// The message is checked first ([`Message::validate`]); a fault is an
    /// [`Error::Invalid`] and nothing is sent. The queue's refusals are [`Error::Refused`]
    /// with the manual's code: 210 and 211 when the queue is full, 507 (with the id) when the
    /// message was published but its sync failed.
    pub async fn publish(&self, message: Message) -> Result<MessageId> {
        self.send(message).await?.await
    }

    /// Sends one message without waiting for its reply: the returned future gives it. Waits
    /// only while the window is full. Messages sent one after another are published in that
    /// order.
    ///
    /// ```no_run
    /// # async fn run(publisher: qe_client::Publisher) -> qe_client::Result<()> {
    /// use qe_client::Message;
    /// let first = publisher.send(Message::text("one")).await?;
    /// let second = publisher.send(Message::text("two")).await?;
    /// // Both are in flight now.
    /// let (first, second) = (first.await?, second.await?);
    /// assert!(first < second, "ids sort in publish order");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn send(&self, message: Message) -> Result<PendingReply<MessageId>> {
        self.core.send(message, read_id).await
    }

    /// Publishes every message, many in flight at once, and returns each one's result in the
    /// messages' order. A message refused (by the client or the queue) does not stop the
    /// others.
    pub async fn publish_all(
        &self,
        messages: impl IntoIterator<Item = Message>,
    ) -> Vec<Result<MessageId>> {
        self.core.publish_all(messages, read_id).await
    }

    /// Sends a publish of exactly these fields (a `context` is added), unchecked, and returns
    /// the reply's fields: for fields this library does not know yet, and to see the queue's
    /// answer to a malformed request.
    pub async fn publish_raw(
        &self,
        fields: serde_json::Map<String, Value>,
    ) -> Result<serde_json::Map<String, Value>> {
        self.core.publish_raw(fields).await
    }

    /// Logs in and publishes with one request (the manual's "Publish in the login"), for a
    /// short job, then closes the connection. A login over the endpoint's fixed
    /// [`FrameLimit`](crate::FrameLimit) (or, learning, over the largest `max-ws-msg-len` a queue
    /// can have) is refused with [`Error::TooLarge`] before anything is sent.
    pub async fn publish_once(
        endpoint: &Endpoint,
        credentials: Credentials,
        message: Message,
    ) -> Result<MessageId> {
        credentials.check()?;
        message.validate()?;
        let mut login = credentials.login(Role::Publisher, Kind::Distribute);
        let Value::Object(fields) = serde_json::from_str(&message.to_request(0)?)? else {
            unreachable!("a publish is a JSON object");
        };
        for (name, value) in fields.into_iter().filter(|(name, _)| name != "context") {
            login.insert(name, value);
        }
        let (link, reply, _) = Link::open(endpoint, &login).await?;
        link.close();
        read_id(reply)
    }

    /// Publishes waiting for their replies now.
    pub fn in_flight(&self) -> usize {
        self.core.connection.current().in_flight()
    }

    /// The largest frame (a publish's JSON, body included) the connection there is now sends:
    /// the queue's `max-ws-msg-len` learned at its login, unless the [`Endpoint`] fixed one
    /// ([`FrameLimit`](crate::FrameLimit)). `None`: any size is sent. A bigger publish is
    /// refused with [`Error::TooLarge`] before it is sent.
    pub fn max_frame_bytes(&self) -> Option<usize> {
        self.core.connection.current().max_frame_bytes()
    }

    /// Closes the connection (publishes in flight fail with [`Error::Closed`]). Dropping the
    /// last clone does the same.
    pub fn close(&self) {
        self.core.connection.current().close();
    }
}

impl CopyPublisher {
    /// Connects to the copy queue at `endpoint` and logs in as a publisher.
    pub async fn connect(endpoint: &Endpoint, credentials: Credentials) -> Result<CopyPublisher> {
        Publisher::builder(endpoint, credentials)
            .connect_copy()
            .await
    }

    /// Publishes one message to every subscriber connected now; returns how many got it.
    /// Delay, durability and a publisher key are refused (207, 208, 209).
    pub async fn publish(&self, message: Message) -> Result<u64> {
        self.send(message).await?.await
    }

    /// Sends one message without waiting for its reply (see [`Publisher::send`]).
    pub async fn send(&self, message: Message) -> Result<PendingReply<u64>> {
        self.core.send(message, read_subscribers).await
    }

    /// Publishes every message, many in flight at once; each result in the messages' order.
    pub async fn publish_all(
        &self,
        messages: impl IntoIterator<Item = Message>,
    ) -> Vec<Result<u64>> {
        self.core.publish_all(messages, read_subscribers).await
    }

    /// Publishes waiting for their replies now.
    pub fn in_flight(&self) -> usize {
        self.core.connection.current().in_flight()
    }

    /// The largest frame the connection there is now sends (see
    /// [`Publisher::max_frame_bytes`]).
    pub fn max_frame_bytes(&self) -> Option<usize> {
        self.core.connection.current().max_frame_bytes()
    }

    /// Closes the connection.
    pub fn close(&self) {
        self.core.connection.current().close();
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("url", &self.core.connection.url())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for CopyPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyPublisher")
            .field("url", &self.core.connection.url())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

/// The reply to one publish, on its way: a future of the message's id (or, for a
/// [`CopyPublisher`], of how many subscribers got it).
///
/// ```no_run
/// # async fn run(publisher: qe_client::Publisher) -> qe_client::Result<()> {
/// use qe_client::Message;
/// let mut replies = Vec::new();
/// for n in 0..10 {
///     replies.push(publisher.send(Message::text(format!("{n}"))).await?);
/// }
/// for id in futures::future::try_join_all(replies).await? {
///     println!("{id}");
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "the reply says whether the message was published"]
pub struct PendingReply<T> {
    reply: Reply,
    read: fn(Fields) -> Result<T>,
}

impl<T> std::fmt::Debug for PendingReply<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingReply").finish_non_exhaustive()
    }
}

impl<T> Future for PendingReply<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let read = self.read;
        Pin::new(&mut self.reply)
            .poll(cx)
            .map(|reply| reply.and_then(read))
    }
}

fn read_id(reply: Fields) -> Result<MessageId> {
    match reply.get("id").and_then(Value::as_str) {
        Some(id) => Ok(MessageId::from(id)),
        None => Err(Error::protocol("a publish's reply without an id")),
    }
}

fn read_subscribers(reply: Fields) -> Result<u64> {
    reply
        .get("subscribers")
        .and_then(Value::as_u64)
        .ok_or_else(|| Error::protocol("a copy publish's reply without subscribers"))
}
