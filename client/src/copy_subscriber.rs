//! Subscribers on the copy type of a queue: every message published while connected, no acks,
//! no sessions.

use crate::endpoint::{Credentials, Endpoint, Kind};
use crate::error::{Error, Result};
use crate::link::{Fields, Link};
use crate::message::Body;
use crate::reconnect::Reconnect;
use futures::Stream;
use qe_shared::protocol::Role;
use serde_json::Value;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::{mpsc, oneshot};

/// What a copy subscriber's stream yields (see [`CopySubscriber`] for a loop over them).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CopyEvent {
    /// A message published while this subscriber was connected.
    Message(CopyMessage),
    /// The connection dropped; messages published until [`CopyEvent::Reconnected`] are not
    /// received (a copy queue keeps nothing).
    Disconnected {
        /// Why it dropped.
        error: Error,
    },
    /// Connected again.
    Reconnected,
}

/// One message of a copy queue (it has no id: nothing is stored, nothing acknowledged).
#[derive(Debug, Clone, PartialEq)]
pub struct CopyMessage {
    /// Its content; a binary body is already decoded from base64.
    pub body: Body,
    /// When the queue received it, in seconds since 1970 (UTC).
    pub received_at: u64,
}

/// A subscriber on the copy type of a queue: a [`Stream`] of [`CopyEvent`]s. It receives each
/// message published while it is connected, and sends nothing. If the connection drops it
/// logs in again ([`Reconnect`]'s backoff; there is no session to resume).
///
/// ```no_run
/// use futures::StreamExt;
/// use qe_client::{CopyEvent, CopySubscriber, Credentials, Endpoint};
///
/// # async fn run() -> qe_client::Result<()> {
/// let endpoint = Endpoint::new("wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/")?;
/// let login = Credentials::new("SUBSCRIBER-NAME", "SUBSCRIBER-PASSWORD");
/// let mut prices = CopySubscriber::connect(&endpoint, login).await?;
/// while let Some(event) = prices.next().await {
///     if let CopyEvent::Message(message) = event? {
///         println!("{:?}", message.body.as_text());
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct CopySubscriber {
    events: mpsc::UnboundedReceiver<Result<CopyEvent>>,
    _stop: oneshot::Sender<()>,
    ended: bool,
}

impl CopySubscriber {
    /// Connects to the copy queue at `endpoint` and logs in, reconnecting by
    /// [`Reconnect::default`].
    pub async fn connect(endpoint: &Endpoint, credentials: Credentials) -> Result<CopySubscriber> {
        CopySubscriber::connect_with(endpoint, credentials, Reconnect::default()).await
    }

    /// Connects and logs in, reconnecting by `reconnect`.
    pub async fn connect_with(
        endpoint: &Endpoint,
        credentials: Credentials,
        reconnect: Reconnect,
    ) -> Result<CopySubscriber> {
        credentials.check()?;
        let login = credentials.login(Role::Subscriber, Kind::Copy);
        let (link, _, frames) = Link::open(endpoint, &login).await?;
        let (events, events_out) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel();
        let task = Listener {
            endpoint: endpoint.clone(),
            login,
            policy: reconnect,
            link,
            frames,
            events,
            stop: stopped,
        };
        tokio::spawn(task.run());
        Ok(CopySubscriber {
            events: events_out,
            _stop: stop,
            ended: false,
        })
    }
}

impl Stream for CopySubscriber {
    type Item = Result<CopyEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
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

/// The copy subscriber's task.
struct Listener {
    endpoint: Endpoint,
    login: Fields,
    policy: Reconnect,
    link: Link,
    frames: mpsc::UnboundedReceiver<Fields>,
    events: mpsc::UnboundedSender<Result<CopyEvent>>,
    stop: oneshot::Receiver<()>,
}

impl Listener {
    async fn run(mut self) {
        let failure = loop {
            tokio::select! {
                _ = &mut self.stop => {
                    self.link.close();
                    return;
                }
                frame = self.frames.recv() => match frame {
                    Some(fields) => self.on_frame(fields),
                    None => match self.reconnect().await {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(error) => break error,
                    },
                },
            }
        };
        let _ = self.events.send(Err(failure));
    }

    fn on_frame(&self, fields: Fields) {
        let message_type = fields.get("type").and_then(Value::as_u64).unwrap_or(1);
        let body = fields.get("body").and_then(Value::as_str);
        match body.map(|body| Body::from_wire(message_type, body)) {
            Some(Ok(body)) => {
                let received_at = fields.get("recdat").and_then(Value::as_u64).unwrap_or(0);
                let _ = self
                    .events
                    .send(Ok(CopyEvent::Message(CopyMessage { body, received_at })));
            }
            _ => {
                let frame = Value::Object(fields);
                tracing::warn!(%frame, "ignored a frame from the queue");
            }
        }
    }

    /// Logs in again; `Ok(false)` when the subscriber was dropped meanwhile.
    async fn reconnect(&mut self) -> Result<bool> {
        let cause = self.link.ending().unwrap_or_else(|| Error::Closed {
            close_code: None,
            reason: "the connection ended".into(),
        });
        if !self.policy.enabled {
            return Err(cause);
        }
        let _ = self
            .events
            .send(Ok(CopyEvent::Disconnected { error: cause }));
        let mut backoff = self.policy.backoff();
        loop {
            let attempt = tokio::select! {
                _ = &mut self.stop => return Ok(false),
                attempt = Link::open(&self.endpoint, &self.login) => attempt,
            };
            match attempt {
                Ok((link, _, frames)) => {
                    self.link = link;
                    self.frames = frames;
                    let _ = self.events.send(Ok(CopyEvent::Reconnected));
                    return Ok(true);
                }
                Err(error) if error.is_transient() => {
                    tracing::debug!(%error, "a login failed");
                }
                Err(error) => return Err(error),
            }
            tokio::select! {
                _ = &mut self.stop => return Ok(false),
                _ = tokio::time::sleep(backoff.next_wait()) => {}
            }
        }
    }
}
