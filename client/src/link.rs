//! One logged-in connection: a reader task and a writer task, with replies matched to their
//! requests by `context`, so that any number of requests can be in flight at once.
//!
//! Every request gets a number of its own as its `context`; the queue copies it into the
//! reply. Frames without one of ours (deliveries, notices, live-stats pushes) go to the
//! connection's owner. When the connection ends, every request still waiting is answered
//! with the same [`Error::Closed`], and only then does the owner's channel end: whoever reads
//! it has seen every reply of the connection by then.
//!
//! The largest frame a connection sends is fixed at its login: by default the login asks for
//! the queue's `max-ws-msg-len` (`"limits":true`) and the reply's `maxwsmsglen` is it.

use crate::endpoint::{Endpoint, FrameLimit};
use crate::error::{code_of, Error, Result};
use crate::message::MessageId;
use crate::transport::{self, Socket};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use qe_shared::settings::Setting;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;
use yawc::close::CloseCode;
use yawc::frame::{Frame, OpCode};

/// A JSON object from the queue.
pub(crate) type Fields = Map<String, Value>;

/// How long the reader waits for the queue to close after the client has: the close frame is
/// answered at once by a live queue.
const CLOSING_GRACE: Duration = Duration::from_secs(2);

/// A handle on one connection; clones share it. When the last one is dropped, the connection
/// is closed (a close frame, 1000).
#[derive(Clone)]
pub(crate) struct Link {
    /// Frames to send, in order; the writer task sends them.
    out: mpsc::UnboundedSender<Frame>,
    shared: Arc<Shared>,
}

/// What the handles and the reader task share.
struct Shared {
    state: Mutex<State>,
    /// The next request's `context`.
    next_context: AtomicU64,
    /// The largest frame to send (learned at the login, or the endpoint's); `None`: any.
    max_frame_bytes: Option<usize>,
}

#[derive(Default)]
struct State {
    /// Requests sent and not yet answered, by context.
    waiting: HashMap<u64, Waiter>,
    /// Why the connection ended, once it has.
    ended: Option<Error>,
}

struct Waiter {
    reply: oneshot::Sender<Result<Fields>>,
    /// A place in a publisher's window, given back with the reply.
    _permit: Option<OwnedSemaphorePermit>,
}

impl Shared {
    /// The connection is over: every request still waiting gets `error`.
    fn end(&self, error: Error) {
        let waiting = {
            let mut state = self.state.lock().expect("link state");
            state.ended.get_or_insert(error.clone());
            std::mem::take(&mut state.waiting)
        };
        for (_, waiter) in waiting {
            let _ = waiter.reply.send(Err(error.clone()));
        }
    }

    /// Hands a reply to its request; `None` if `context` is none of ours.
    fn answer(&self, context: u64, fields: Fields) -> Option<Fields> {
        let waiter = self
            .state
            .lock()
            .expect("link state")
            .waiting
            .remove(&context);
        match waiter {
            Some(waiter) => {
                let _ = waiter.reply.send(Ok(fields));
                None
            }
            None => Some(fields),
        }
    }
}

impl Link {
    /// Connects, sends the `login` (asking for the queue's limits when the endpoint learns
    /// them), and waits for its reply (nothing else may be sent before it). Returns the
    /// connection, the login's reply (checked: a failure is [`Error::Refused`]), and the frames
    /// that answer no request.
    pub(crate) async fn open(
        endpoint: &Endpoint,
        login: &Fields,
    ) -> Result<(Link, Fields, mpsc::UnboundedReceiver<Fields>)> {
        let timeout = endpoint.connect_timeout;
        let text = login_text(login, endpoint.frame_limit);
        // A publish in the login is held to the limit before it is sent, as every publish is.
        if let Some(limit) = login_limit(endpoint.frame_limit) {
            if text.len() > limit {
                let bytes = text.len();
                return Err(Error::TooLarge { bytes, limit });
            }
        }
        let (socket, reply) = tokio::time::timeout(timeout, log_in(endpoint, text))
            .await
            .map_err(|_| Error::Timeout(timeout))??;
        let (sink, stream) = socket.split();
        let (out, outgoing) = mpsc::unbounded_channel();
        let (frames, unsolicited) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            next_context: AtomicU64::new(1),
            max_frame_bytes: max_frame_bytes(endpoint.frame_limit, &reply),
        });
        let (written, writer_done) = oneshot::channel();
        let (read_all, reader_done) = oneshot::channel();
        tokio::spawn(write(sink, outgoing, reader_done, written));
        tokio::spawn(read(
            stream,
            Reader {
                shared: shared.clone(),
                pings: out.downgrade(),
                frames,
                ping_every: endpoint.ping_every,
                silence_limit: endpoint.silence_limit,
                done: read_all,
            },
            writer_done,
        ));
        Ok((Link { out, shared }, reply, unsolicited))
    }

    /// Sends a request whose text `write` makes from its context number; the reply arrives
    /// through the returned future. `permit` is held until the reply arrives.
    pub(crate) fn request(
        &self,
        write: impl FnOnce(u64) -> Result<String>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<Reply> {
        let context = self.shared.next_context.fetch_add(1, Ordering::Relaxed);
        let text = write(context)?;
        if let Some(limit) = self.shared.max_frame_bytes {
            if text.len() > limit {
                return Err(Error::TooLarge {
                    bytes: text.len(),
                    limit,
                });
            }
        }
        let (reply, answer) = oneshot::channel();
        {
            let mut state = self.shared.state.lock().expect("link state");
            if let Some(ended) = &state.ended {
                return Err(ended.clone());
            }
            let waiter = Waiter {
                reply,
                _permit: permit,
            };
            state.waiting.insert(context, waiter);
        }
        if self.out.send(Frame::text(text)).is_err() {
            // The writer is gone; the reader ends the link (and this request) shortly.
            let waiter = self
                .shared
                .state
                .lock()
                .expect("link state")
                .waiting
                .remove(&context);
            drop(waiter);
            return Err(self.ending().unwrap_or_else(closed_by_client));
        }
        Ok(Reply(answer))
    }

    /// A request of JSON fields, with our context added.
    pub(crate) fn request_fields(&self, mut fields: Fields) -> Result<Reply> {
        self.request(
            |context| {
                fields.insert("context".into(), Value::from(context));
                Ok(Value::Object(fields).to_string())
            },
            None,
        )
    }

    /// The largest frame this connection sends (`None`: any).
    pub(crate) fn max_frame_bytes(&self) -> Option<usize> {
        self.shared.max_frame_bytes
    }

    /// Whether the connection is still up (as far as the client knows).
    pub(crate) fn is_open(&self) -> bool {
        self.ending().is_none()
    }

    /// Why the connection ended, once it has.
    pub(crate) fn ending(&self) -> Option<Error> {
        self.shared.state.lock().expect("link state").ended.clone()
    }

    /// Requests sent and not yet answered.
    pub(crate) fn in_flight(&self) -> usize {
        self.shared.state.lock().expect("link state").waiting.len()
    }

    /// Closes the connection with a close frame (1000). For a subscriber this is a drop, not
    /// a logout: the session is saved by the manual's rules.
    pub(crate) fn close(&self) {
        let _ = self.out.send(Frame::close(CloseCode::Normal, b""));
    }
}

/// The reply to one request: the queue's fields on `"status":"Success."` (or `"Logout
/// Success."`), [`Error::Refused`] on a failure, [`Error::Closed`] if the connection ended
/// first.
pub(crate) struct Reply(oneshot::Receiver<Result<Fields>>);

impl Future for Reply {
    type Output = Result<Fields>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Fields>> {
        Pin::new(&mut self.0).poll(cx).map(|answer| match answer {
            Ok(Ok(fields)) => checked(fields),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(closed_by_client()),
        })
    }
}

/// A reply's fields if its status is a success; else the refusal it carries.
pub(crate) fn checked(fields: Fields) -> Result<Fields> {
    match fields.get("status").and_then(Value::as_str) {
        Some("Success." | "Logout Success.") => Ok(fields),
        Some("Failure.") => Err(refusal(&fields)),
        _ => Err(Error::protocol(format!(
            "a reply without a status: {}",
            Value::Object(fields)
        ))),
    }
}

/// A failure reply as an error.
fn refusal(fields: &Fields) -> Error {
    let number = fields.get("code").and_then(Value::as_u64);
    let reason = fields
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    match number.and_then(code_of) {
        Some(code) => Error::Refused {
            code,
            reason,
            id: fields
                .get("id")
                .and_then(Value::as_str)
                .map(MessageId::from),
        },
        None => Error::protocol(format!(
            "a failure with an unknown code {number:?}: {reason}"
        )),
    }
}

fn closed_by_client() -> Error {
    Error::Closed {
        close_code: None,
        reason: "the client closed the connection".into(),
    }
}

/// The login as sent: with `"limits":true` when the limit is to be learned from the reply.
fn login_text(login: &Fields, limit: FrameLimit) -> String {
    let mut fields = login.clone();
    if limit == FrameLimit::Learned {
        fields.insert("limits".into(), Value::Bool(true));
    }
    Value::Object(fields).to_string()
}

/// The largest login a connection sends: the fixed limit, or, while the queue's is not
/// learned yet, the largest `max-ws-msg-len` a queue can have (a bigger login is closed with
/// 1009 by any node).
fn login_limit(limit: FrameLimit) -> Option<usize> {
    match limit {
        FrameLimit::Fixed(bytes) => Some(bytes),
        FrameLimit::Learned => Some(Setting::MaxWsMsgLen.range().1 as usize),
        FrameLimit::Unlimited => None,
    }
}

/// The largest frame a connection sends, given its login's `reply`. A node too old to know
/// `"limits"` says nothing (and a publish in the login is answered by the publish alone): the
/// queue's default then, which is what such a node has unless an administrator changed it.
fn max_frame_bytes(limit: FrameLimit, reply: &Fields) -> Option<usize> {
    match limit {
        FrameLimit::Fixed(bytes) => Some(bytes),
        FrameLimit::Unlimited => None,
        FrameLimit::Learned => match reply.get("maxwsmsglen") {
            None => Some(FrameLimit::DEFAULT_BYTES),
            Some(learned) => match learned.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(bytes) => Some(bytes),
                None => {
                    tracing::warn!(%learned, "a maxwsmsglen that is no size; the default is used");
                    Some(FrameLimit::DEFAULT_BYTES)
                }
            },
        },
    }
}

/// Connects, logs in and reads the login's reply.
async fn log_in(endpoint: &Endpoint, login: String) -> Result<(Socket, Fields)> {
    let mut socket = transport::connect(endpoint).await?;
    let lost = |reason: String| Error::Closed {
        close_code: None,
        reason,
    };
    socket
        .send(Frame::text(login))
        .await
        .map_err(|e| lost(format!("sending the login: {e}")))?;
    let mut close = None;
    loop {
        let Some(frame) = socket.next().await else {
            return Err(ended(
                close,
                "the connection ended before the login's reply",
            ));
        };
        match frame.opcode() {
            OpCode::Text => {
                let fields = parse(&frame)?;
                return Ok((socket, checked(fields)?));
            }
            OpCode::Close => close = Some(frame),
            _ => {}
        }
    }
}

/// The error for a connection that ended, with the close frame's code if one came.
fn ended(close: Option<Frame>, otherwise: &str) -> Error {
    match close {
        Some(frame) => Error::Closed {
            close_code: frame.close_code().map(u16::from),
            reason: frame
                .close_reason()
                .ok()
                .flatten()
                .filter(|r| !r.is_empty())
                .unwrap_or("the queue closed the connection")
                .to_string(),
        },
        None => Error::Closed {
            close_code: None,
            reason: otherwise.to_string(),
        },
    }
}

fn parse(frame: &Frame) -> Result<Fields> {
    let text = std::str::from_utf8(frame.payload())
        .map_err(|_| Error::protocol("a text frame that is not UTF-8"))?;
    match serde_json::from_str(text) {
        Ok(Value::Object(fields)) => Ok(fields),
        _ => Err(Error::protocol(format!(
            "a frame that is not a JSON object: {text}"
        ))),
    }
}

/// What the reader task needs besides the socket.
struct Reader {
    shared: Arc<Shared>,
    /// Where pings go out; weak, so that the writer ends when the last handle is dropped.
    pings: mpsc::WeakUnboundedSender<Frame>,
    /// Frames that answer no request.
    frames: mpsc::UnboundedSender<Fields>,
    ping_every: Duration,
    silence_limit: Duration,
    /// Tells the writer, when dropped, that reading is over.
    done: oneshot::Sender<()>,
}

/// Reads until the connection ends, then ends the link.
async fn read(
    mut stream: SplitStream<Socket>,
    reader: Reader,
    mut writer_done: oneshot::Receiver<()>,
) {
    let mut heard = Instant::now();
    let mut ticks = tokio::time::interval(reader.ping_every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut close = None;
    let mut closing_until: Option<Instant> = None;
    let ending = loop {
        let grace = async {
            match closing_until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            frame = stream.next() => {
                let Some(frame) = frame else {
                    break ended(close.take(), "the connection ended");
                };
                heard = Instant::now();
                match frame.opcode() {
                    OpCode::Text => match parse(&frame) {
                        Ok(fields) => dispatch(&reader, fields),
                        Err(error) => tracing::warn!(%error, "ignored a frame from the queue"),
                    },
                    OpCode::Close => close = Some(frame),
                    _ => {}
                }
            }
            _ = ticks.tick() => {
                let silent = heard.elapsed();
                if silent >= reader.silence_limit {
                    break Error::Closed {
                        close_code: None,
                        reason: format!("the queue sent nothing for {silent:?}, not even a pong"),
                    };
                }
                if silent >= reader.ping_every {
                    if let Some(out) = reader.pings.upgrade() {
                        let _ = out.send(Frame::ping(""));
                    }
                }
            }
            _ = &mut writer_done, if closing_until.is_none() => {
                // Every handle is gone (the writer sent a close frame) or a write failed:
                // the queue's answer ends the stream, or the grace does.
                closing_until = Some(Instant::now() + CLOSING_GRACE);
            }
            _ = grace => break closed_by_client(),
        }
    };
    reader.shared.end(ending);
    // Only now: the owner has every reply of this connection before its frames end.
    drop(reader.frames);
    drop(reader.done);
}

/// A frame from the queue: a reply to one of our requests, or something for the owner.
fn dispatch(reader: &Reader, fields: Fields) {
    let context = fields.get("context").and_then(Value::as_u64);
    let fields = match context {
        Some(context) => match reader.shared.answer(context, fields) {
            None => return,
            Some(fields) => fields,
        },
        None => fields,
    };
    let _ = reader.frames.send(fields);
}

/// Sends what the handles queue, flushing once per burst. After a close frame, once every
/// handle is gone (it sends one then), or once the reader has ended (it tries to send one),
/// it stops, and the connection's socket closes with it.
async fn write(
    mut sink: SplitSink<Socket, Frame>,
    mut outgoing: mpsc::UnboundedReceiver<Frame>,
    mut reader_done: oneshot::Receiver<()>,
    done: oneshot::Sender<()>,
) {
    loop {
        let first = tokio::select! {
            first = outgoing.recv() => first,
            _ = &mut reader_done => {
                // The queue closed, or went silent: say goodbye if it still listens, so that
                // it sees the drop now, not after its own timeouts.
                let close = sink.send(Frame::close(CloseCode::Normal, b""));
                let _ = tokio::time::timeout(CLOSING_GRACE, close).await;
                break;
            }
        };
        let Some(first) = first else {
            let _ = sink.send(Frame::close(CloseCode::Normal, b"")).await;
            break;
        };
        let mut closing = first.opcode() == OpCode::Close;
        let mut written = sink.feed(first).await.is_ok();
        while written && !closing {
            let Ok(frame) = outgoing.try_recv() else {
                break;
            };
            closing = frame.opcode() == OpCode::Close;
            written = sink.feed(frame).await.is_ok();
        }
        if !written || sink.flush().await.is_err() || closing {
            break;
        }
    }
    let _ = done.send(());
}

/// What is done with a new connection's frames that answer no request.
pub(crate) type OnOpen = Box<dyn Fn(mpsc::UnboundedReceiver<Fields>) + Send + Sync>;

/// A connection that a request opens again when it finds it closed (a publisher's, an
/// admin's): requests in flight when it dropped fail with [`Error::Closed`], later ones go on
/// a new connection.
pub(crate) struct Redial {
    endpoint: Endpoint,
    /// The login's fields (each connection asks for the queue's limits afresh).
    login: Fields,
    /// Whether to open it again at all.
    reconnect: bool,
    link: Mutex<Link>,
    /// One reconnection at a time; the others wait for it.
    dialing: tokio::sync::Mutex<()>,
    on_open: OnOpen,
}

impl Redial {
    /// Where it connects to, for `Debug`.
    pub(crate) fn url(&self) -> &str {
        self.endpoint.url.as_str()
    }

    /// Connects and logs in; returns the login's reply too.
    pub(crate) async fn open(
        endpoint: &Endpoint,
        login: Fields,
        reconnect: bool,
        on_open: OnOpen,
    ) -> Result<(Redial, Fields)> {
        let (link, reply, frames) = Link::open(endpoint, &login).await?;
        on_open(frames);
        let redial = Redial {
            endpoint: endpoint.clone(),
            login,
            reconnect,
            link: Mutex::new(link),
            dialing: tokio::sync::Mutex::new(()),
            on_open,
        };
        Ok((redial, reply))
    }

    /// The connection, opened again first if it closed (and reconnecting is on).
    pub(crate) async fn link(&self) -> Result<Link> {
        let link = self.current();
        if link.is_open() || !self.reconnect {
            return Ok(link);
        }
        let _dialing = self.dialing.lock().await;
        let link = self.current();
        if link.is_open() {
            return Ok(link);
        }
        tracing::debug!(url = %self.endpoint.url, "connecting again");
        let (link, _, frames) = Link::open(&self.endpoint, &self.login).await?;
        (self.on_open)(frames);
        *self.link.lock().expect("redial") = link.clone();
        Ok(link)
    }

    /// The connection as it is now.
    pub(crate) fn current(&self) -> Link {
        self.link.lock().expect("redial").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(value: Value) -> Fields {
        match value {
            Value::Object(fields) => fields,
            _ => unreachable!("an object"),
        }
    }

    #[test]
    fn only_a_login_that_learns_asks_for_the_limits() {
        let login = fields(json!({"username": "u", "password": "p", "role": "publisher"}));
        let asked = |limit| {
            let text = login_text(&login, limit);
            let sent: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(sent["username"], "u", "{text}");
            sent.get("limits").cloned()
        };
        assert_eq!(asked(FrameLimit::Learned), Some(Value::Bool(true)));
        assert_eq!(asked(FrameLimit::Fixed(65_536)), None);
        assert_eq!(asked(FrameLimit::Unlimited), None);
    }

    #[tokio::test]
    async fn a_login_over_the_limit_is_refused_before_anything_is_sent() {
        // Nothing listens there: an attempt to connect would fail otherwise.
        let endpoint = Endpoint::new("ws://127.0.0.1:9/")
            .unwrap()
            .frame_limit(FrameLimit::Fixed(200));
        let login = fields(json!({"username": "u", "password": "p", "body": "x".repeat(300)}));
        match Link::open(&endpoint, &login).await {
            Err(Error::TooLarge { bytes, limit }) => assert!(bytes > 300 && limit == 200),
            Err(other) => panic!("not refused as too large: {other}"),
            Ok(_) => panic!("a link opened to nothing"),
        }
        let unlimited = endpoint.frame_limit(FrameLimit::Unlimited);
        assert!(!matches!(
            Link::open(&unlimited, &login).await,
            Err(Error::TooLarge { .. })
        ));
        assert_eq!(
            login_limit(FrameLimit::Learned),
            Some(Setting::MaxWsMsgLen.range().1 as usize)
        );
    }

    #[test]
    fn the_limit_is_the_replys_or_else_the_default_unless_the_endpoint_fixes_one() {
        let told = fields(json!({"status": "Success.", "maxwsmsglen": 131_072}));
        let silent = fields(json!({"status": "Success."}));
        let garbled = fields(json!({"status": "Success.", "maxwsmsglen": "big"}));
        assert_eq!(max_frame_bytes(FrameLimit::Learned, &told), Some(131_072));
        assert_eq!(max_frame_bytes(FrameLimit::Learned, &silent), Some(65_536));
        assert_eq!(max_frame_bytes(FrameLimit::Learned, &garbled), Some(65_536));
        assert_eq!(max_frame_bytes(FrameLimit::Fixed(8192), &told), Some(8192));
        assert_eq!(max_frame_bytes(FrameLimit::Unlimited, &told), None);
    }
}
