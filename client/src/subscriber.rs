//! Subscribers on a distribute queue: a stream of deliveries and notices, acks and nacks, and
//! a session that survives dropped connections.
//!
//! One task owns the session: the connection, the session id, the messages held, the acks in
//! flight. The [`Subscriber`] (a stream of [`Event`]s) and its [`SubscriberHandle`]s talk to it
//! through channels. [`Subscriber::handle_each`] reads that stream for the application: a
//! handler per message, then its ack.
//!
//! # Reconnection, exactly
//!
//! When the connection drops, the task (see [`Reconnect`]):
//! 1. tells the application ([`Event::Disconnected`]);
//! 2. if the session has received a message (else the queue saved nothing), resumes it: it
//!    logs in with the latest `sessionid`, `"replay":true` and its capacity, retrying 109 a
//!    few times and other transient failures until the saved-session time is up. The queue
//!    then sends again every message the session holds; those the application has already
//!    seen are recognised by id and not shown again, and those the connection lost on the way
//!    (written by the queue, never read) arrive now. Acks and nacks that were not answered
//!    are sent again; one the queue answers 301 then had counted before the drop, and is
//!    answered `Ok`. [`Event::Reconnected`] says `resumed: true`: the application sees each
//!    message once.
//! 3. if the session cannot be resumed, logs in afresh with its capacity. What the old session
//!    held goes back to the queue, to this subscriber or another: [`Event::Reconnected`] says
//!    `resumed: false` and lists those messages (`released`); they may be delivered again.
//!    Acks of them fail with [`Error::SessionEnded`] (nothing is sent).

use crate::endpoint::{Credentials, Endpoint, Kind};
use crate::error::{Error, Result};
use crate::link::{Fields, Link};
use crate::message::{Body, MessageId};
use crate::reconnect::Reconnect;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use qe_shared::protocol::Role;
use qe_shared::settings::Setting;
use qe_shared::Code;
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// How many finished message ids a session remembers, to recognise a resend of one whose ack
/// raced a resume.
const RETIRED_IDS: usize = 4096;

/// What a subscriber's stream yields.
///
/// ```no_run
/// # async fn run(mut subscriber: qe_client::Subscriber) -> qe_client::Result<()> {
/// use futures::StreamExt;
/// use qe_client::Event;
/// while let Some(event) = subscriber.next().await {
///     match event? {
///         Event::Message(delivery) => delivery.ack().await?,
///         Event::Deleted(id) | Event::MovedToDlq(id) => println!("stop working on {id}"),
///         Event::Disconnected { error } => println!("reconnecting after {error}"),
///         Event::Reconnected { resumed: true, .. } => println!("resumed"),
///         Event::Reconnected { released, .. } => println!("may come again: {released:?}"),
///         _ => {}
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Event {
    /// A message, to acknowledge ([`Delivery::ack`]) or reject ([`Delivery::nack`]).
    Message(Delivery),
    /// An administrator deleted a message this subscriber holds: stop working on it, and do
    /// not acknowledge it (an ack would get 301).
    Deleted(MessageId),
    /// An administrator moved a message this subscriber holds to the dead letter queue: stop
    /// working on it, and do not acknowledge it.
    MovedToDlq(MessageId),
    /// The connection dropped; the subscriber is reconnecting (see [`Reconnect`]). Acks sent
    /// meanwhile wait for the new connection.
    Disconnected {
        /// Why it dropped.
        error: Error,
    },
    /// The subscriber is connected again.
    Reconnected {
        /// `true`: the session was resumed. It kept its messages and its place in the line,
        /// and every message arrives once (the queue's resends of messages already delivered
        /// are not shown again).
        ///
        /// `false`: a new session. The messages in `released` went back to the queue and may
        /// be delivered again, to this subscriber or another; acks of their old deliveries fail
        /// with [`Error::SessionEnded`]. Stop working on them, or make the work idempotent.
        resumed: bool,
        /// The messages the old session held that it gave up (empty when resumed), in id
        /// order.
        released: Vec<MessageId>,
    },
}

/// One message delivered to this subscriber, held until it is acknowledged or rejected.
///
/// ```no_run
/// # async fn handle(delivery: qe_client::Delivery) -> qe_client::Result<()> {
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
/// match delivery.json::<Order>() {
///     Ok(order) => {
///         println!("order {} (key {:?}, received at {})", order.id,
///             delivery.publisher_key(), delivery.received_at());
///         delivery.ack().await?;
///     }
///     // Not an order: to the dead letter queue, for an administrator to look at.
///     Err(_) => delivery.nack().await?,
/// }
/// # Ok(())
/// # }
/// ```
pub struct Delivery {
    id: MessageId,
    body: Body,
    publisher_key: Option<String>,
    received_at: u64,
    /// The session (counted from 0 at connect) it was delivered in.
    session: u64,
    handle: SubscriberHandle,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("id", &self.id)
            .field("body", &self.body)
            .field("publisher_key", &self.publisher_key)
            .field("received_at", &self.received_at)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// The message's id (ids sort in time order).
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// Its content; a binary body is already decoded from base64.
    pub fn body(&self) -> &Body {
        &self.body
    }

    /// Its content, taken.
    pub fn into_body(self) -> Body {
        self.body
    }

    /// Its text, if it is a text message.
    pub fn text(&self) -> Option<&str> {
        self.body.as_text()
    }

    /// Its body read as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        self.body.json()
    }

    /// The publisher's label, if it gave one.
    pub fn publisher_key(&self) -> Option<&str> {
        self.publisher_key.as_deref()
    }

    /// When the queue received it, in seconds since 1970 (UTC): the manual's `recdat`.
    pub fn received_at(&self) -> u64 {
        self.received_at
    }

    /// Acknowledges it: done, the queue removes it. Waits for the queue's answer (across a
    /// reconnection if need be).
    pub async fn ack(&self) -> Result<()> {
        self.handle
            .finish(self.id.clone(), true, Some(self.session))
            .await
    }

    /// Rejects it: it moves to the dead letter queue and is not delivered again. A message
    /// with durability 0 cannot be rejected (305): acknowledge it instead.
    pub async fn nack(&self) -> Result<()> {
        self.handle
            .finish(self.id.clone(), false, Some(self.session))
            .await
    }

    /// A handle on the subscriber that received it.
    pub fn subscriber(&self) -> &SubscriberHandle {
        &self.handle
    }
}

/// What a handler given to [`Subscriber::handle_each`] decided about a message: the
/// subscriber acknowledges or rejects it accordingly, once the handler has returned.
///
/// There is no "try again later": a message the subscriber neither acknowledges nor rejects
/// stays held by its session, and goes back to the queue only when the session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Handled: acknowledge it, and the queue removes it.
    Ack,
    /// Never to be handled (a poison message): reject it (a nack). It moves to the dead letter
    /// queue **for good**, is not delivered again, and waits there for an administrator
    /// (who can put it back). Only what the handler decides is rejected, never a failure of
    /// its own: a handler that cannot handle a message *now* should wait and try again, or
    /// stop the process and let the message come again.
    ///
    /// A message with durability 0 cannot go to the dead letter queue (305): it is
    /// acknowledged instead, as the manual advises, and a warning logged.
    Reject,
}

/// A subscriber on a distribute queue: a [`Stream`] of [`Event`]s.
///
/// It stands in the queue's line with a capacity: the number of messages it can hold before
/// it acknowledges them. If the connection drops it reconnects and resumes its session
/// ([`Reconnect`]); the stream says so. The stream ends (`None`) after a logout, or after an
/// `Err` when the subscriber cannot go on (a refused login, reconnection turned off).
///
/// Dropping it closes the connection without a logout: the queue keeps the session for its
/// saved-session time, then gives what it held to others. [`Subscriber::logout`] gives them
/// back at once.
///
/// The simplest worker is [`Subscriber::handle_each`]: it calls a handler with each message and
/// acknowledges the message once the handler has returned (delivery is at least once; see
/// there). The stream is for everything else: several messages handled at once, the
/// reconnection events, acks sent from other tasks.
///
/// ```no_run
/// use futures::StreamExt;
/// use qe_client::{Credentials, Endpoint, Event, Subscriber};
///
/// # async fn run() -> qe_client::Result<()> {
/// let endpoint = Endpoint::new("wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/")?;
/// let login = Credentials::new("SUBSCRIBER-NAME", "SUBSCRIBER-PASSWORD");
/// let mut subscriber = Subscriber::connect(&endpoint, login, 10).await?;
/// while let Some(event) = subscriber.next().await {
///     match event? {
///         Event::Message(delivery) => {
///             println!("received {:?}", delivery.text());
///             delivery.ack().await?;
///         }
///         Event::Reconnected { resumed: false, released } => {
///             println!("a new session; these may come again: {released:?}");
///         }
///         other => println!("{other:?}"),
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Subscriber {
    events: mpsc::UnboundedReceiver<Result<Event>>,
    handle: SubscriberHandle,
    /// Dropping it stops the session's task.
    _stop: oneshot::Sender<()>,
    /// An `Err` was yielded: the stream is over.
    ended: bool,
}

/// A cheap, cloneable handle on a [`Subscriber`], for acknowledging from other tasks.
///
/// ```no_run
/// # async fn run(mut subscriber: qe_client::Subscriber) -> qe_client::Result<()> {
/// use futures::StreamExt;
/// use qe_client::Event;
/// let acks = subscriber.handle();
/// while let Some(Ok(Event::Message(delivery))) = subscriber.next().await {
///     let acks = acks.clone();
///     tokio::spawn(async move {
///         // ... work on it ...
///         acks.ack(delivery.id()).await
///     });
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SubscriberHandle {
    commands: mpsc::UnboundedSender<Command>,
    status: Arc<Status>,
}

impl std::fmt::Debug for SubscriberHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberHandle")
            .field("session_id", &self.session_id())
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

/// What the handles can read without asking the task.
struct Status {
    session_id: Mutex<String>,
    capacity: AtomicU32,
}

enum Command {
    /// An ack (`true`) or a nack; `session` is the delivery's, if it came from one.
    Finish {
        id: MessageId,
        ack: bool,
        session: Option<u64>,
        reply: oneshot::Sender<Result<()>>,
    },
    Capacity {
        capacity: u32,
        reply: oneshot::Sender<Result<()>>,
    },
    Logout {
        reply: oneshot::Sender<Result<()>>,
    },
}

impl SubscriberHandle {
    /// Acknowledges the message with this id. Prefer [`Delivery::ack`]: it knows which
    /// session the delivery belongs to.
    pub async fn ack(&self, id: &MessageId) -> Result<()> {
        self.finish(id.clone(), true, None).await
    }

    /// Rejects the message with this id to the dead letter queue.
    pub async fn nack(&self, id: &MessageId) -> Result<()> {
        self.finish(id.clone(), false, None).await
    }

    /// Changes the capacity (1 to the queue's `max-subscriber-capacity`, 1024 at most). If it
    /// leaves room, waiting messages are sent at once. Kept across reconnections.
    pub async fn set_capacity(&self, capacity: u32) -> Result<()> {
        self.ask(|reply| Command::Capacity { capacity, reply })
            .await
    }

    /// The capacity asked for last.
    pub fn capacity(&self) -> u32 {
        self.status.capacity.load(Ordering::Relaxed)
    }

    /// The session's latest id (every login, resumes too, gives a new one).
    pub fn session_id(&self) -> String {
        self.status.session_id.lock().expect("status").clone()
    }

    async fn finish(&self, id: MessageId, ack: bool, session: Option<u64>) -> Result<()> {
        self.ask(|reply| Command::Finish {
            id,
            ack,
            session,
            reply,
        })
        .await
    }

    async fn ask(
        &self,
        command: impl FnOnce(oneshot::Sender<Result<()>>) -> Command,
    ) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(command(reply))
            .map_err(|_| subscriber_ended())?;
        answer.await.map_err(|_| subscriber_ended())?
    }
}

fn subscriber_ended() -> Error {
    Error::Closed {
        close_code: None,
        reason: "the subscriber has ended".into(),
    }
}

/// How a subscriber connects: capacity, reconnection, replay.
///
/// ```no_run
/// # async fn run() -> qe_client::Result<()> {
/// # let endpoint = qe_client::Endpoint::new("ws://127.0.0.1:8080/")?;
/// # let login = qe_client::Credentials::new("SUBSCRIBER-NAME", "SUBSCRIBER-PASSWORD");
/// use qe_client::{Reconnect, Subscriber};
/// use std::time::Duration;
/// let subscriber = Subscriber::builder(&endpoint, login)
///     .capacity(50)
///     .reconnect(Reconnect { saved_session_timeout: Duration::from_secs(60), ..Reconnect::default() })
///     .connect()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SubscriberBuilder {
    endpoint: Endpoint,
    credentials: Credentials,
    capacity: u32,
    reconnect: Reconnect,
    replay: bool,
}

impl SubscriberBuilder {
    /// How many messages it can hold before it acknowledges them (1 unless given).
    pub fn capacity(mut self, capacity: u32) -> SubscriberBuilder {
        self.capacity = capacity;
        self
    }

    /// How it reconnects ([`Reconnect::default`] unless given).
    pub fn reconnect(mut self, reconnect: Reconnect) -> SubscriberBuilder {
        self.reconnect = reconnect;
        self
    }

    /// Whether a resume asks the queue to send again every message the session holds
    /// (`"replay":true`, the default). The messages already delivered are recognised by id
    /// and not shown again either way; with replay, a message the queue wrote just before the
    /// drop but the connection lost on the way arrives too. Without it, such a message stays
    /// held by the session, unseen, until the session ends.
    pub fn replay(mut self, replay: bool) -> SubscriberBuilder {
        self.replay = replay;
        self
    }

    /// Connects and logs in.
    pub async fn connect(self) -> Result<Subscriber> {
        self.credentials.check()?;
        check_capacity(self.capacity)?;
        let login = login(&self.credentials, self.capacity, None, self.replay);
        let (link, reply, frames) = Link::open(&self.endpoint, &login).await?;
        let session_id = session_id(&reply)?;
        let (events, events_out) = mpsc::unbounded_channel();
        let (commands, commands_in) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel();
        let status = Arc::new(Status {
            session_id: Mutex::new(session_id.clone()),
            capacity: AtomicU32::new(self.capacity),
        });
        let handle = SubscriberHandle {
            commands,
            status: status.clone(),
        };
        let session = Session {
            endpoint: self.endpoint,
            credentials: self.credentials,
            policy: self.reconnect,
            replay: self.replay,
            link,
            frames,
            session_id,
            epoch: 0,
            received_any: false,
            capacity: self.capacity,
            confirmed_capacity: self.capacity,
            held: HashSet::new(),
            retired: Retired::default(),
            finishing: HashMap::new(),
            replies: FuturesUnordered::new(),
            capacity_waiting: Vec::new(),
            logout: None,
            done: false,
            events,
            commands: commands_in,
            stop: stopped,
            status,
            handle: handle.clone(),
        };
        tokio::spawn(session.run());
        Ok(Subscriber {
            events: events_out,
            handle,
            _stop: stop,
            ended: false,
        })
    }
}

impl Subscriber {
    /// Connects to the distribute queue at `endpoint` and logs in with `capacity`.
    pub async fn connect(
        endpoint: &Endpoint,
        credentials: Credentials,
        capacity: u32,
    ) -> Result<Subscriber> {
        Subscriber::builder(endpoint, credentials)
            .capacity(capacity)
            .connect()
            .await
    }

    /// A subscriber with options of its own.
    pub fn builder(endpoint: &Endpoint, credentials: Credentials) -> SubscriberBuilder {
        SubscriberBuilder {
            endpoint: endpoint.clone(),
            credentials,
            capacity: 1,
            reconnect: Reconnect::default(),
            replay: true,
        }
    }

    /// A handle for acknowledging from elsewhere.
    pub fn handle(&self) -> SubscriberHandle {
        self.handle.clone()
    }

    /// Acknowledges the message with this id (see [`SubscriberHandle::ack`]).
    pub async fn ack(&self, id: &MessageId) -> Result<()> {
        self.handle.ack(id).await
    }

    /// Rejects the message with this id (see [`SubscriberHandle::nack`]).
    pub async fn nack(&self, id: &MessageId) -> Result<()> {
        self.handle.nack(id).await
    }

    /// Changes the capacity (see [`SubscriberHandle::set_capacity`]).
    pub async fn set_capacity(&self, capacity: u32) -> Result<()> {
        self.handle.set_capacity(capacity).await
    }

    /// The session's latest id.
    pub fn session_id(&self) -> String {
        self.handle.session_id()
    }

    /// Logs out: first waits for the reply to every ack and nack sent (the manual: otherwise
    /// an ack's reply can be lost and its message delivered again), then `{"logout":true}`.
    /// The messages still held go to other subscribers at once.
    pub async fn logout(self) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.handle
            .commands
            .send(Command::Logout { reply })
            .map_err(|_| subscriber_ended())?;
        answer.await.map_err(|_| subscriber_ended())?
    }

    /// Handles every message, one at a time, until the subscriber cannot go on: calls
    /// `handler` with each delivery, and only once it has returned sends the ack (or, for
    /// [`Verdict::Reject`], the nack), and waits for the queue's answer before the next.
    ///
    /// **Delivery is at least once.** A message is acknowledged only after its handler
    /// returned, so a process that stops in between (or a node that restarts, so that the
    /// session cannot be resumed and the ack cannot be taken: [`Error::SessionEnded`]) gets
    /// the message again later, here or in another subscriber: the handler may see a message
    /// twice, never zero times. Make it idempotent (the message's [`id`](Delivery::id) stays
    /// the same), or check for what it has done before.
    ///
    /// The loop goes on through what is not the handler's business: a dropped connection and
    /// its resumption or replacement ([`Event::Disconnected`], [`Event::Reconnected`]), an ack
    /// that could not be taken because its session ended (the message comes again), and a
    /// message an administrator deleted or moved to the dead letter queue while its handler
    /// ran (the ack is refused with 301: the message is gone; its notice, which arrived
    /// meanwhile, is skipped). It returns the error that ends the subscriber (a login refused
    /// on reconnection, reconnection turned off, an ack refused otherwise); `Ok(())` only if
    /// the stream had ended already.
    ///
    /// The handler takes the delivery: it should not acknowledge or reject it itself (the
    /// verdict does). For several messages handled at once, read the stream instead and
    /// acknowledge from tasks ([`SubscriberHandle`]).
    ///
    /// ```no_run
    /// use qe_client::{Credentials, Endpoint, Subscriber, Verdict};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Order { id: u64 }
    ///
    /// # async fn ship(order: Order) {}
    /// # async fn run() -> qe_client::Result<()> {
    /// let endpoint = Endpoint::new("wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/")?;
    /// let login = Credentials::new("SUBSCRIBER-NAME", "SUBSCRIBER-PASSWORD");
    /// let mut subscriber = Subscriber::connect(&endpoint, login, 10).await?;
    /// subscriber
    ///     .handle_each(|delivery| async move {
    ///         match delivery.json::<Order>() {
    ///             Ok(order) => {
    ///                 ship(order).await; // acknowledged after this returns
    ///                 Verdict::Ack
    ///             }
    ///             // Not an order, and never will be: to the dead letter queue.
    ///             Err(_) => Verdict::Reject,
    ///         }
    ///     })
    ///     .await
    /// # }
    /// ```
    pub async fn handle_each<F, Fut>(&mut self, handler: F) -> Result<()>
    where
        F: FnMut(Delivery) -> Fut,
        Fut: Future<Output = Verdict>,
    {
        self.handle_next(usize::MAX, handler).await.map(|_| ())
    }

    /// Handles the next `count` messages as [`Subscriber::handle_each`] does, then returns how
    /// many it handled: `count`, or fewer if the stream ended first. A message that comes
    /// again (at least once) counts again. The subscriber goes on: the messages it holds
    /// beyond those stay held until handled or the session ends.
    pub async fn handle_next<F, Fut>(&mut self, count: usize, mut handler: F) -> Result<usize>
    where
        F: FnMut(Delivery) -> Fut,
        Fut: Future<Output = Verdict>,
    {
        let mut handled = 0;
        while handled < count {
            let delivery = match self.next().await {
                None => break,
                Some(Err(error)) => return Err(error),
                Some(Ok(Event::Message(delivery))) => delivery,
                Some(Ok(event)) => {
                    tracing::debug!(?event, "not a message: the handler goes on");
                    continue;
                }
            };
            let (id, session) = (delivery.id.clone(), delivery.session);
            let verdict = handler(delivery).await;
            handled += 1;
            let answer = self.settle(&id, session, verdict).await;
            if let Err(error) = answer {
                return Err(self.failure_or(error));
            }
        }
        Ok(handled)
    }

    /// Acknowledges or rejects a handled message as `verdict` says; `Err` only for what stops
    /// the handler's loop.
    async fn settle(&self, id: &MessageId, session: u64, verdict: Verdict) -> Result<()> {
        let ack = verdict == Verdict::Ack;
        let mut answer = self.handle.finish(id.clone(), ack, Some(session)).await;
        if let Err(Error::Refused {
            code: Code::NackDurabilityZero,
            ..
        }) = answer
        {
            tracing::warn!(%id, "rejected, but durability 0 cannot go to the dead letter queue: acknowledged");
            answer = self.handle.finish(id.clone(), true, Some(session)).await;
        }
        match answer {
            Ok(()) => Ok(()),
            // The node restarted, or the session could not be resumed: not lost, the queue
            // delivers the message again.
            Err(Error::SessionEnded) => {
                tracing::info!(%id, "its session ended before the ack: it comes again");
                Ok(())
            }
            // Not held any more: an administrator deleted it or moved it to the dead letter
            // queue while the handler ran.
            Err(Error::Refused {
                code: Code::InvalidMessageId,
                ..
            }) => {
                tracing::info!(%id, "taken away by an administrator while it was handled");
                Ok(())
            }
            // Done (acknowledged, or in the dead letter queue); only its sync failed, so it
            // may not survive a crash of the machine, and the message may come again.
            Err(
                error @ Error::Refused {
                    code: Code::SyncFailed,
                    ..
                },
            ) => {
                tracing::warn!(%id, %error, "done, but not synced");
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Why the subscriber ended, if it has (its stream's last item), rather than `error`, the
    /// ack's "the subscriber has ended": the session's task yields its failure before it drops
    /// the acks waiting, so the failure is in the channel by then.
    fn failure_or(&mut self, error: Error) -> Error {
        if !matches!(error, Error::Closed { .. }) {
            return error;
        }
        while let Ok(event) = self.events.try_recv() {
            if let Err(failure) = event {
                self.ended = true;
                return failure;
            }
        }
        error
    }
}

impl Stream for Subscriber {
    type Item = Result<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Event>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let next = self.events.poll_recv(cx);
        if let Poll::Ready(Some(Err(_))) = &next {
            self.ended = true;
        }
        next
    }
}

/// The largest capacity the manual allows.
fn check_capacity(capacity: u32) -> Result<()> {
    let (min, max) = Setting::MaxSubscriberCapacity.range();
    match (min..=max).contains(&u64::from(capacity)) {
        true => Ok(()),
        false => Err(Error::invalid_because(
            Code::InvalidCapacity,
            format!("Invalid capacity: {capacity} is not between {min} and {max}."),
        )),
    }
}

/// A subscriber's login: fresh, or resuming `session`.
fn login(credentials: &Credentials, capacity: u32, session: Option<&str>, replay: bool) -> Fields {
    let mut fields = credentials.login(Role::Subscriber, Kind::Distribute);
    fields.insert("capacity".into(), capacity.into());
    if let Some(session) = session {
        fields.insert("sessionid".into(), session.into());
        fields.insert("replay".into(), replay.into());
    }
    fields
}

fn session_id(reply: &Fields) -> Result<String> {
    reply
        .get("sessionid")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| Error::protocol("a subscriber's login reply without a sessionid"))
}

/// Ids of messages the session is done with, the latest few thousand.
#[derive(Default)]
struct Retired {
    order: VecDeque<MessageId>,
    ids: HashSet<MessageId>,
}

impl Retired {
    fn insert(&mut self, id: MessageId) {
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
            if self.order.len() > RETIRED_IDS {
                let oldest = self.order.pop_front().expect("one at least");
                self.ids.remove(&oldest);
            }
        }
    }

    fn contains(&self, id: &MessageId) -> bool {
        self.ids.contains(id)
    }

    fn clear(&mut self) {
        self.order.clear();
        self.ids.clear();
    }
}

/// An ack or nack not yet answered.
struct Finishing {
    ack: bool,
    /// Who waits for the answer (the same id acked twice shares one request).
    waiters: Vec<oneshot::Sender<Result<()>>>,
    /// Handed to a connection: the queue may have seen it.
    sent: bool,
    /// Sent again after a resume, having been sent before: a 301 then means it had counted.
    resent: bool,
}

/// Which request a reply answers.
enum Tag {
    Finish(MessageId),
    Capacity(u32, oneshot::Sender<Result<()>>),
    Logout,
}

/// A logout asked for: sent once no ack waits.
struct Logout {
    reply: oneshot::Sender<Result<()>>,
    sent: bool,
}

/// The session's task.
struct Session {
    endpoint: Endpoint,
    credentials: Credentials,
    policy: Reconnect,
    replay: bool,
    link: Link,
    /// The connection's deliveries and notices; ends after its last reply.
    frames: mpsc::UnboundedReceiver<Fields>,
    /// The latest session id: the one a resume must give.
    session_id: String,
    /// Counts new sessions (resumes keep it).
    epoch: u64,
    /// Whether this session has received a message: only then does the queue save it.
    received_any: bool,
    /// The capacity asked for last; every login carries it.
    capacity: u32,
    /// The capacity the queue last accepted.
    confirmed_capacity: u32,
    /// Delivered to the application and not yet acked, nacked or taken away: a resend of one
    /// of these is not shown again.
    held: HashSet<MessageId>,
    retired: Retired,
    finishing: HashMap<MessageId, Finishing>,
    replies: FuturesUnordered<BoxFuture<'static, (Tag, Result<Fields>)>>,
    /// Capacity changes whose connection dropped before the reply; the next login carries the
    /// capacity, and answers them.
    capacity_waiting: Vec<oneshot::Sender<Result<()>>>,
    logout: Option<Logout>,
    /// Logged out: the task ends.
    done: bool,
    events: mpsc::UnboundedSender<Result<Event>>,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Ends when the [`Subscriber`] is dropped.
    stop: oneshot::Receiver<()>,
    status: Arc<Status>,
    /// Given to each delivery.
    handle: SubscriberHandle,
}

impl Session {
    async fn run(mut self) {
        let failure = loop {
            tokio::select! {
                _ = &mut self.stop => {
                    self.link.close();
                    return;
                }
                Some((tag, result)) = self.replies.next(), if !self.replies.is_empty() => {
                    self.on_reply(tag, result);
                }
                frame = self.frames.recv() => match frame {
                    Some(fields) => self.on_frame(fields),
                    None => {
                        if let Err(error) = self.reconnect().await {
                            break error;
                        }
                    }
                },
                Some(command) = self.commands.recv() => self.on_command(command),
            }
            if self.done {
                return;
            }
            self.maybe_log_out();
        };
        if let Some(logout) = self.logout.take() {
            let _ = logout.reply.send(Err(failure.clone()));
        }
        let _ = self.events.send(Err(failure));
    }

    fn emit(&self, event: Event) {
        let _ = self.events.send(Ok(event));
    }

    fn on_frame(&mut self, fields: Fields) {
        let id = fields
            .get("id")
            .and_then(Value::as_str)
            .map(MessageId::from);
        let flag = |name: &str| fields.get(name).and_then(Value::as_bool) == Some(true);
        match id {
            Some(_) if fields.contains_key("body") => self.on_delivery(&fields),
            Some(id) if flag("deleted") || flag("movedtodlq") => {
                self.held.remove(&id);
                self.retired.insert(id.clone());
                match flag("deleted") {
                    true => self.emit(Event::Deleted(id)),
                    false => self.emit(Event::MovedToDlq(id)),
                }
            }
            _ => {
                let frame = Value::Object(fields);
                tracing::warn!(%frame, "ignored a frame from the queue");
            }
        }
    }

    fn on_delivery(&mut self, fields: &Fields) {
        let delivery = (|| {
            let id = fields.get("id").and_then(Value::as_str)?;
            let message_type = fields.get("type").and_then(Value::as_u64).unwrap_or(1);
            let body = fields.get("body").and_then(Value::as_str)?;
            Some((MessageId::from(id), Body::from_wire(message_type, body)))
        })();
        let Some((id, body)) = delivery else {
            let frame = Value::Object(fields.clone());
            tracing::warn!(%frame, "a delivery that does not read");
            return;
        };
        self.received_any = true;
        if self.held.contains(&id) || self.retired.contains(&id) {
            tracing::debug!(%id, "a resend of a message already delivered");
            return;
        }
        let body = match body {
            Ok(body) => body,
            Err(error) => {
                tracing::warn!(%id, %error, "a delivery whose body does not read");
                return;
            }
        };
        self.held.insert(id.clone());
        self.emit(Event::Message(Delivery {
            id,
            body,
            publisher_key: fields
                .get("publisherkey")
                .and_then(Value::as_str)
                .map(str::to_string),
            received_at: fields.get("recdat").and_then(Value::as_u64).unwrap_or(0),
            session: self.epoch,
            handle: self.handle.clone(),
        }));
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Finish {
                id,
                ack,
                session,
                reply,
            } => {
                if session.is_some_and(|session| session != self.epoch) {
                    let _ = reply.send(Err(Error::SessionEnded));
                    return;
                }
                if let Some(finishing) = self.finishing.get_mut(&id) {
                    finishing.waiters.push(reply);
                    return;
                }
                let finishing = Finishing {
                    ack,
                    waiters: vec![reply],
                    sent: false,
                    resent: false,
                };
                self.finishing.insert(id.clone(), finishing);
                self.send_finish(id);
            }
            Command::Capacity { capacity, reply } => {
                if let Err(error) = check_capacity(capacity) {
                    let _ = reply.send(Err(error));
                    return;
                }
                self.capacity = capacity;
                self.status.capacity.store(capacity, Ordering::Relaxed);
                let mut fields = Fields::new();
                fields.insert("capacity".into(), capacity.into());
                match self.link.request_fields(fields) {
                    Ok(answer) => self.replies.push(Box::pin(async move {
                        (Tag::Capacity(capacity, reply), answer.await)
                    })),
                    Err(Error::Closed { .. }) => self.capacity_waiting.push(reply),
                    Err(error) => {
                        let _ = reply.send(Err(error));
                    }
                }
            }
            Command::Logout { reply } => {
                self.logout = Some(Logout { reply, sent: false });
            }
        }
    }

    /// Sends the ack or nack of `id` on the connection there is now.
    fn send_finish(&mut self, id: MessageId) {
        let Some(finishing) = self.finishing.get_mut(&id) else {
            return;
        };
        let ack = u8::from(finishing.ack);
        let quoted = Value::from(id.as_str()).to_string();
        let request = self.link.request(
            |context| {
                Ok(format!(
                    r#"{{"id":{quoted},"ack":{ack},"context":{context}}}"#
                ))
            },
            None,
        );
        match request {
            Ok(answer) => {
                finishing.sent = true;
                self.replies
                    .push(Box::pin(async move { (Tag::Finish(id), answer.await) }));
            }
            // The drop is noticed next; it is sent after the resume.
            Err(Error::Closed { .. }) => {}
            Err(error) => self.answer(&id, Err(error)),
        }
    }

    fn on_reply(&mut self, tag: Tag, result: Result<Fields>) {
        match tag {
            Tag::Finish(id) => {
                let Some(finishing) = self.finishing.get(&id) else {
                    return;
                };
                match result {
                    // Sent again after the resume.
                    Err(Error::Closed { .. }) => {}
                    Ok(_) => self.finished(id, Ok(())),
                    // It had counted before the drop (or an administrator took the message):
                    // the session holds it no more either way.
                    Err(Error::Refused {
                        code: Code::InvalidMessageId,
                        ..
                    }) if finishing.resent => self.finished(id, Ok(())),
                    // Not held (301), or done but not synced (507): not held any more.
                    Err(
                        error @ Error::Refused {
                            code: Code::InvalidMessageId | Code::SyncFailed,
                            ..
                        },
                    ) => self.finished(id, Err(error)),
                    // Refused (305 …): still held.
                    Err(error) => self.answer(&id, Err(error)),
                }
            }
            Tag::Capacity(capacity, reply) => match result {
                Ok(_) => {
                    self.confirmed_capacity = capacity;
                    let _ = reply.send(Ok(()));
                }
                Err(Error::Closed { .. }) => self.capacity_waiting.push(reply),
                Err(error) => {
                    // The next login must not carry a capacity the queue refuses.
                    if self.capacity == capacity {
                        self.capacity = self.confirmed_capacity;
                        self.status.capacity.store(self.capacity, Ordering::Relaxed);
                    }
                    let _ = reply.send(Err(error));
                }
            },
            Tag::Logout => {
                let answer = result.map(|_| ());
                if let Some(logout) = self.logout.take() {
                    let _ = logout.reply.send(answer);
                }
                self.done = true;
            }
        }
    }

    /// The session is done with `id`: answered, no longer held.
    fn finished(&mut self, id: MessageId, answer: Result<()>) {
        self.held.remove(&id);
        self.retired.insert(id.clone());
        self.answer(&id, answer);
    }

    /// Answers whoever waits for the ack or nack of `id`.
    fn answer(&mut self, id: &MessageId, answer: Result<()>) {
        if let Some(finishing) = self.finishing.remove(id) {
            for waiter in finishing.waiters {
                let _ = waiter.send(answer.clone());
            }
        }
    }

    /// Sends the logout once every ack has its answer.
    fn maybe_log_out(&mut self) {
        let Some(logout) = &mut self.logout else {
            return;
        };
        if logout.sent || !self.finishing.is_empty() {
            return;
        }
        let mut fields = Fields::new();
        fields.insert("logout".into(), true.into());
        match self.link.request_fields(fields) {
            Ok(answer) => {
                logout.sent = true;
                self.replies
                    .push(Box::pin(async move { (Tag::Logout, answer.await) }));
            }
            // Sent after the reconnection.
            Err(Error::Closed { .. }) => {}
            Err(error) => {
                if let Some(logout) = self.logout.take() {
                    let _ = logout.reply.send(Err(error));
                }
            }
        }
    }

    /// The connection dropped: resume the session, or start a new one. `Err` ends the
    /// subscriber.
    async fn reconnect(&mut self) -> Result<()> {
        let cause = self.link.ending().unwrap_or_else(|| Error::Closed {
            close_code: None,
            reason: "the connection ended".into(),
        });
        // Every reply of the old connection is in (its frames end after them).
        while let Some((tag, result)) = self.replies.next().await {
            self.on_reply(tag, result);
        }
        if self.done {
            return Ok(());
        }
        if self.logout.as_ref().is_some_and(|logout| logout.sent) || !self.policy.enabled {
            return Err(cause);
        }
        tracing::info!(error = %cause, "the connection dropped; reconnecting");
        self.emit(Event::Disconnected {
            error: cause.clone(),
        });
        let mut backoff = self.policy.backoff();
        if self.received_any {
            let deadline = Instant::now() + self.policy.saved_session_timeout;
            let mut refusals = 0;
            loop {
                let login = login(
                    &self.credentials,
                    self.capacity,
                    Some(&self.session_id),
                    self.replay,
                );
                let attempt = tokio::select! {
                    _ = &mut self.stop => return Err(subscriber_ended()),
                    attempt = Link::open(&self.endpoint, &login) => attempt,
                };
                match attempt {
                    Ok((link, reply, frames)) => {
                        self.install(link, &reply, frames)?;
                        self.resumed();
                        tracing::info!("the session was resumed");
                        self.emit(Event::Reconnected {
                            resumed: true,
                            released: Vec::new(),
                        });
                        return Ok(());
                    }
                    Err(Error::Refused {
                        code: Code::InvalidSessionId,
                        ..
                    }) => {
                        refusals += 1;
                        if refusals >= self.policy.resume_attempts {
                            break;
                        }
                    }
                    Err(error) if error.is_transient() => {
                        tracing::debug!(%error, "a resume failed");
                    }
                    Err(error) => return Err(error),
                }
                let wait = backoff.next_wait();
                if Instant::now() + wait >= deadline {
                    break;
                }
                tokio::select! {
                    _ = &mut self.stop => return Err(subscriber_ended()),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
        let released = self.end_session();
        loop {
            let login = login(&self.credentials, self.capacity, None, self.replay);
            let attempt = tokio::select! {
                _ = &mut self.stop => return Err(subscriber_ended()),
                attempt = Link::open(&self.endpoint, &login) => attempt,
            };
            match attempt {
                Ok((link, reply, frames)) => {
                    self.install(link, &reply, frames)?;
                    for reply in self.capacity_waiting.drain(..) {
                        let _ = reply.send(Ok(()));
                    }
                    tracing::info!(released = released.len(), "logged in as a new session");
                    self.emit(Event::Reconnected {
                        resumed: false,
                        released,
                    });
                    return Ok(());
                }
                Err(error) if error.is_transient() => {
                    tracing::debug!(%error, "a login failed");
                }
                Err(error) => return Err(error),
            }
            tokio::select! {
                _ = &mut self.stop => return Err(subscriber_ended()),
                _ = tokio::time::sleep(backoff.next_wait()) => {}
            }
        }
    }

    /// A new connection, logged in.
    fn install(
        &mut self,
        link: Link,
        reply: &Fields,
        frames: mpsc::UnboundedReceiver<Fields>,
    ) -> Result<()> {
        self.session_id = session_id(reply)?;
        *self.status.session_id.lock().expect("status") = self.session_id.clone();
        self.confirmed_capacity = self.capacity;
        self.link = link;
        self.frames = frames;
        Ok(())
    }

    /// The session was resumed: the acks and the capacity change the drop cut off are sent
    /// again (the login carried the capacity).
    fn resumed(&mut self) {
        for finishing in self.finishing.values_mut() {
            finishing.resent |= finishing.sent;
            finishing.sent = false;
        }
        let ids: Vec<MessageId> = self.finishing.keys().cloned().collect();
        for id in ids {
            self.send_finish(id);
        }
        for reply in self.capacity_waiting.drain(..) {
            let _ = reply.send(Ok(()));
        }
    }

    /// The session could not be resumed: what it held is the queue's again. Returns those
    /// ids.
    fn end_session(&mut self) -> Vec<MessageId> {
        self.epoch += 1;
        self.received_any = false;
        self.retired.clear();
        let mut released: Vec<MessageId> = self.held.drain().collect();
        released.sort();
        for (_, finishing) in self.finishing.drain() {
            for waiter in finishing.waiters {
                let _ = waiter.send(Err(Error::SessionEnded));
            }
        }
        released
    }
}
