//! One WebSocket connection: the login, then frames in and out until it ends.
//!
//! This layer owns the close codes of the manual's table. For a frame yawc cannot read it
//! sends the code itself (1009 too big, 1007 bad UTF-8, 1011 a compressed message that cannot
//! be unpacked, 1002 any other protocol fault) and reads no further, so yawc's own close frame,
//! whose codes differ for some faults, is never flushed. A message over the current
//! `max-ws-msg-len` closes with 1009, one left unfinished past `message-timeout-secs` with
//! 1008, a logout with 1000; a client's own close is answered by yawc. A failed login, and text
//! that is not JSON from a subscriber or administrator, end with no close frame: the reply is
//! flushed, the socket half-closed, and what the client still sends is read for a moment, so
//! the kernel does not answer unread input with a reset that would destroy the reply.

use crate::admission::{self, PreLogin};
use crate::engine::outbox::Overflow;
use crate::engine::Frames;
use crate::fragments::Assembly;
use crate::session::{self, Data, Reply, Session, Then};
use crate::state::{Node, Present};
use crate::traffic::SocketWrites;
use bytes::Bytes;
use futures::{FutureExt, SinkExt};
use qe_shared::settings::Setting;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{timeout, timeout_at, Instant};
use yawc::close::CloseCode;
use yawc::frame::{Frame, OpCode};
use yawc::{HttpStream, WebSocket, WebSocketError};

type Socket = WebSocket<HttpStream>;

/// How long a closing connection may take to send its last frames or read the client's.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// The TCP socket beneath the HTTP and WebSocket layers, to half-close it there. It is the
/// socket's own descriptor, not a copy: the connection owns the socket for as long as it
/// holds this (a copy would cost each connection a second descriptor).
pub struct Closer(RawFd);

impl Closer {
    pub fn new(tcp: &TcpStream) -> Closer {
        Closer(tcp.as_raw_fd())
    }

    /// Half-closes the socket; only while the connection still owns it.
    fn shutdown_write(&self, _socket: &Socket) {
        // SAFETY: `_socket` owns the stream whose descriptor this is, so it is open.
        let fd = unsafe { BorrowedFd::borrow_raw(self.0) };
        let _ = socket2::SockRef::from(&fd).shutdown(std::net::Shutdown::Write);
    }
}

/// What a connection brings from accept and upgrade.
pub struct Connection {
    pub closer: Closer,
    /// When the login must have come (`no-reply-timeout-secs` after accept).
    pub login_deadline: Instant,
    /// What the watch beneath yawc sees of the byte stream.
    pub assembly: Arc<Assembly>,
    /// Bytes its socket has taken.
    pub writes: SocketWrites,
    /// Its slot until the login.
    pub admitted: PreLogin,
    /// Where it comes from (`qe_serve::source_of`): the log lines it causes count there.
    pub source: std::net::IpAddr,
}

/// Runs a connection from its first frame to its end.
pub async fn run(mut socket: Box<Socket>, connection: Connection, node: Arc<Node>) {
    let Connection {
        closer,
        login_deadline,
        assembly,
        writes,
        admitted,
        source,
    } = connection;
    // The login and the close are boxed: inline, their futures would make every connection's
    // task as big as the biggest of them (4 KiB) for as long as it is open, not only while
    // they run.
    let login = log_in(
        &mut socket,
        admitted,
        login_deadline,
        &assembly,
        &closer,
        &node,
    );
    let Some(LoggedIn {
        mut session,
        present,
        slot: _slot,
    }) = Box::pin(login).await
    else {
        return;
    };
    let mut frames = session.take_frames();
    let ended = serve(
        &mut socket,
        &mut session,
        &mut frames,
        &node,
        &assembly,
        &writes,
        source,
    )
    .await;
    // No longer an open connection, before the session's end is made known.
    drop(present);
    // Only a logout ends a session for good; any other end is a drop.
    session.end(ended == Ended::Logout, frames);
    Box::pin(close(&mut socket, ended, &closer)).await;
}

/// A client logged in and answered.
struct LoggedIn {
    session: Session,
    /// Counted among the open connections while held.
    present: Present,
    /// Its slot among max-tasks while held.
    slot: admission::Session,
}

/// Reads the login (due by `login_deadline`) and answers it: `Some` once the client is logged
/// in; `None` when the connection ended (refused, too slow, gone, or its login failed).
async fn log_in(
    socket: &mut Socket,
    admitted: PreLogin,
    login_deadline: Instant,
    assembly: &Assembly,
    closer: &Closer,
    node: &Arc<Node>,
) -> Option<LoggedIn> {
    let login = timeout_at(login_deadline, login_frame(socket, node, assembly)).await;
    let Ok(Ok(login)) = login else {
        if let Ok(Err(Ended::Refused(code, reason))) = login {
            refuse(socket, code, reason).await;
        }
        return None;
    };
    // Inflated, a compressed login is held to the pre-login budget too: bigger than it, its
    // bytes come from the shared pool now, or it is refused as too big for the node now.
    if !assembly.hold_for_login(login.len()) {
        drop(login);
        let reason = "login too big for now".into();
        refuse(socket, CloseCode::Size, reason).await;
        return None;
    }
    if sent_during_login(socket) {
        return None;
    }
    // Boxed, so a connection waiting for its login holds no room for it.
    let outcome = Box::pin(session::login(login, node)).await;
    // Checked again before the reply: a frame that came while the login was being handled
    // ends the connection unanswered, and dropping the new session undoes the login.
    if sent_during_login(socket) {
        return None;
    }
    match outcome {
        Ok((session, reply)) => {
            // A slot among max-tasks, or the connection closes as one that finds them all
            // taken does (dropping the session undoes the login).
            let slot = admitted.logged_in()?;
            assembly.logged_in();
            // Counted before the reply, so a client that has its reply is in the live stats.
            let present = node.presence.enter(session.role());
            // On a failed send, dropping the session undoes the login.
            send(socket, &reply).await.ok()?;
            Some(LoggedIn {
                session,
                present,
                slot,
            })
        }
        Err(reply) => {
            if send(socket, &reply).await.is_ok() {
                abort(socket, closer).await;
            }
            None
        }
    }
}

/// Ends a connection whose logged-in part `ended` as that end asks.
async fn close(socket: &mut Socket, ended: Ended, closer: &Closer) {
    match ended {
        Ended::Logout => close_normally(socket).await,
        Ended::Abort => abort(socket, closer).await,
        Ended::ClosedByClient => {
            // yawc has queued the answer (the client's code echoed); one more read sends it.
            let _ = timeout(DRAIN_TIME, socket.next_frame()).await;
        }
        Ended::Refused(code, reason) => refuse(socket, code, reason).await,
        Ended::Gone => {}
    }
}

/// The login: the first text or binary message (pings and pongs are skipped).
async fn login_frame(socket: &mut Socket, node: &Node, assembly: &Assembly) -> Result<Data, Ended> {
    loop {
        let frame = match socket.next_frame().await {
            Ok(frame) => frame,
            Err(error) => return Err(read_failure(&error, assembly)),
        };
        if is_too_big(&frame, node) {
            return Err(Ended::Refused(CloseCode::Size, "message too big".into()));
        }
        match frame.opcode() {
            OpCode::Text => return text_message(frame.into_payload()),
            OpCode::Binary => return Ok(Data::Binary(frame.into_payload())),
            OpCode::Close => {
                let _ = timeout(DRAIN_TIME, socket.next_frame()).await;
                return Err(Ended::ClosedByClient);
            }
            OpCode::Ping | OpCode::Pong | OpCode::Continuation => continue,
        }
    }
}

/// How the logged-in part of a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    /// The subscriber logged out; its reply is sent: close with 1000.
    Logout,
    /// A reply that ends the connection is sent: close with no close frame.
    Abort,
    /// The client sent a close frame; yawc has queued the answer.
    ClosedByClient,
    /// The client broke a rule of the wire: close with this code and reason.
    Refused(CloseCode, String),
    /// The client went silent or away, or reads too slowly.
    Gone,
}

/// Replies that may wait for the disk on one connection; past this the connection stops
/// reading until one is sent, so a client cannot queue unbounded work (nor, by never reading
/// its replies, unbounded replies).
const MAX_WAITING_REPLIES: usize = 4096;

/// The logged-in part. Requests take effect in the order they arrive; their replies wait for
/// their changes' durability and go out in that same order, while the queue's deliveries keep
/// flowing. Reading and writing go on side by side in one task: everything readable is
/// handled, then everything ready to go out is written with one flush, so a client that reads
/// slowly still has its acks read, and a reply never waits behind a delivery that waits for
/// the client. A reply that ends the connection stops the reading.
async fn serve(
    socket: &mut Socket,
    session: &mut Session,
    frames: &mut Option<Frames>,
    node: &Node,
    assembly: &Assembly,
    writes: &SocketWrites,
    source: std::net::IpAddr,
) -> Ended {
    let overflow = frames.as_ref().map(Frames::overflow);
    let mut link = Link::new(socket, frames.as_mut(), node, assembly, writes, source);
    let mut replies = VecDeque::new();
    let mut reading = true;
    let overdue = assembly.overdue(node.message_timeout);
    let overflowed = overflowed(&overflow);
    tokio::pin!(overdue, overflowed);
    poll_fn(|cx| {
        // A new poll of the task: a burst of frames that waited for it has had its turn.
        link.next_poll();
        loop {
            if overdue.as_mut().poll(cx).is_ready() {
                let reason = "message not whole in time".into();
                return Poll::Ready(Ended::Refused(CloseCode::Policy, reason));
            }
            if overflowed.as_mut().poll(cx).is_ready() {
                link.log_drop("dropping a client that reads too slowly");
                return Poll::Ready(Ended::Gone);
            }
            if let Poll::Ready(ended) = link.poll_keepalive(cx) {
                return Poll::Ready(ended);
            }
            let mut busy = false;
            while reading && replies.len() < MAX_WAITING_REPLIES {
                match link.poll_data(cx, node) {
                    Poll::Ready(Ok(data)) => {
                        let response = session.handle(data);
                        reading = response.then == Then::Continue;
                        replies.push_back(match response.is_ready() {
                            true => Settling::Ready(Some(response.into_ready())),
                            false => Settling::Waiting(Box::pin(response.settle())),
                        });
                        busy = true;
                    }
                    Poll::Ready(Err(ended)) => return Poll::Ready(ended),
                    Poll::Pending => break,
                }
            }
            link.note_heard();
            match link.poll_write(cx, &mut replies) {
                Poll::Ready(Ok(written)) => {
                    if written.outbox_has_room {
                        session.outbox_drained();
                    }
                    match written.then {
                        Then::Continue => {}
                        Then::Logout => return Poll::Ready(Ended::Logout),
                        Then::Abort => return Poll::Ready(Ended::Abort),
                    }
                    busy |= written.any;
                }
                Poll::Ready(Err(())) => return Poll::Ready(Ended::Gone),
                Poll::Pending => {}
            }
            if !busy {
                return Poll::Pending;
            }
        }
    })
    .await
}

/// The socket side of a logged-in connection: what it has fed to the socket and not yet
/// flushed, and the timers that watch the peer.
struct Link<'a> {
    socket: &'a mut Socket,
    /// What the byte stream's watch saw (a reserved opcode).
    assembly: &'a Assembly,
    /// The queue's frames for this connection, for the roles that get them.
    frames: Option<&'a mut Frames>,
    /// Frames were fed since the last flush finished.
    unflushed: bool,
    /// A reply that ends the connection was fed: it ends once that is flushed.
    ending: Then,
    /// When a frame was last heard: taken once for all the frames one round of reading
    /// finds (the clock costs more than a small frame's parsing, and the silence limit is
    /// counted in seconds).
    last_heard: Instant,
    /// A frame was heard since `last_heard` was taken.
    heard: bool,
    ping: tokio::time::Interval,
    ping_due: bool,
    silence_limit: Duration,
    /// Bytes the socket has taken, to tell a stalled client from a slow one.
    writes: &'a SocketWrites,
    stall: Pin<Box<tokio::time::Sleep>>,
    stall_limit: Duration,
    /// Bytes the socket had taken when the stall timer was last set.
    stall_mark: Option<u64>,
    /// Where the client comes from: the lines its dropping writes count there.
    source: std::net::IpAddr,
}

/// What one round of writing did.
struct Written {
    /// Something was fed or flushed.
    any: bool,
    /// The outbox has room again after the queue found none: it should send more.
    outbox_has_room: bool,
    /// A reply that ends the connection is on the socket.
    then: Then,
}

impl<'a> Link<'a> {
    fn new(
        socket: &'a mut Socket,
        frames: Option<&'a mut Frames>,
        node: &Node,
        assembly: &'a Assembly,
        writes: &'a SocketWrites,
        source: std::net::IpAddr,
    ) -> Link<'a> {
        let keepalive = &node.keepalive;
        Link {
            socket,
            assembly,
            frames,
            unflushed: false,
            ending: Then::Continue,
            last_heard: Instant::now(),
            heard: false,
            ping: tokio::time::interval_at(
                Instant::now() + keepalive.ping_every,
                keepalive.ping_every,
            ),
            ping_due: false,
            silence_limit: keepalive.silence_limit,
            writes,
            stall: Box::pin(tokio::time::sleep(keepalive.write_stall_limit)),
            stall_limit: keepalive.write_stall_limit,
            stall_mark: None,
            source,
        }
    }

    /// Logs `what` (the client is dropped, and why) while its source has lines left.
    fn log_drop(&self, what: &str) {
        if qe_shared::logging::client_line_allowed(self.source) {
            tracing::info!(silent_for = ?self.last_heard.elapsed(), "{what}");
        }
    }

    /// Tells the outbox's frames that the task is polled again (`Frames::next_poll`).
    fn next_poll(&mut self) {
        if let Some(frames) = self.frames.as_mut() {
            frames.next_poll();
        }
    }

    /// Takes the time of the frames read since the last time it was taken.
    fn note_heard(&mut self) {
        if std::mem::take(&mut self.heard) {
            self.last_heard = Instant::now();
        }
    }

    /// Pings an idle peer and drops a silent one; drops a client that has not read for the
    /// write-stall limit while its outbox is full.
    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> Poll<Ended> {
        while self.ping.poll_tick(cx).is_ready() {
            if self.last_heard.elapsed() >= self.silence_limit {
                self.log_drop("dropping a silent peer");
                return Poll::Ready(Ended::Gone);
            }
            self.ping_due = true;
        }
        if !self.unflushed {
            // The socket takes what it is given: nothing is stalled.
            self.stall_mark = None;
            return Poll::Pending;
        }
        loop {
            let written = self.writes.total();
            let Some(mark) = self.stall_mark else {
                self.stall_mark = Some(written);
                self.stall.as_mut().reset(Instant::now() + self.stall_limit);
                continue;
            };
            ready!(self.stall.as_mut().poll(cx));
            let at_limit = self.frames.as_ref().is_some_and(|f| f.at_limit());
            if written == mark && at_limit {
                self.log_drop("dropping a client that reads too slowly");
                return Poll::Ready(Ended::Gone);
            }
            // It took something, or has little waiting: watch the next period.
            self.stall_mark = None;
        }
    }

    /// The next text or binary message; pings are answered by yawc and skipped here. Any
    /// frame at all, a pong included, counts as hearing from the peer. A message bigger than
    /// `max-ws-msg-len` (as it is now) is refused with 1009, dropped before anything waits.
    fn poll_data(&mut self, cx: &mut Context<'_>, node: &Node) -> Poll<Result<Data, Ended>> {
        loop {
            let frame = match ready!(self.socket.poll_next_frame(cx)) {
                Ok(frame) => frame,
                Err(error) => return Poll::Ready(Err(read_failure(&error, self.assembly))),
            };
            self.heard = true;
            if is_too_big(&frame, node) {
                let reason = "message too big".into();
                return Poll::Ready(Err(Ended::Refused(CloseCode::Size, reason)));
            }
            match frame.opcode() {
                OpCode::Text => return Poll::Ready(text_message(frame.into_payload())),
                OpCode::Binary => return Poll::Ready(Ok(Data::Binary(frame.into_payload()))),
                OpCode::Close => return Poll::Ready(Err(Ended::ClosedByClient)),
                OpCode::Ping | OpCode::Pong | OpCode::Continuation => continue,
            }
        }
    }

    /// Feeds the socket every reply that is ready, in order, then the queue's frames, then a
    /// ping if one is due, and flushes them all at once. `Err` when the socket failed.
    fn poll_write<F>(
        &mut self,
        cx: &mut Context<'_>,
        replies: &mut VecDeque<Settling<F>>,
    ) -> Poll<Result<Written, ()>>
    where
        F: Future<Output = (Reply, Then)>,
    {
        let mut fed = false;
        // Only the first reply is polled: the others go out after it whatever their state,
        // and its wait (a write, a sync) covers theirs or is covered by it.
        while self.ending == Then::Continue && self.ready_to_feed(cx)? {
            let Some(first) = replies.front_mut() else {
                break;
            };
            let Poll::Ready((reply, then)) = first.poll(cx) else {
                break;
            };
            replies.pop_front();
            self.feed(Frame::text(reply.to_frame()))?;
            self.ending = then;
            fed = true;
        }
        while self.ending == Then::Continue && self.ready_to_feed(cx)? {
            let Some(frames) = self.frames.as_mut() else {
                break;
            };
            // With replies fed (or a flush under way) the frames go with them now; alone,
            // a burst's first frames wait a turn for the rest of it (`Frames::poll_next`).
            let Poll::Ready(frame) = frames.poll_next(cx, !self.unflushed) else {
                break;
            };
            self.feed(Frame::text(frame))?;
            fed = true;
        }
        if self.ping_due && self.ending == Then::Continue && self.ready_to_feed(cx)? {
            self.ping_due = false;
            self.feed(Frame::ping(Bytes::new()))?;
            fed = true;
        }
        if !self.unflushed {
            return Poll::Pending; // nothing was fed, and everything before is written
        }
        match self.socket.poll_flush_unpin(cx) {
            Poll::Ready(Ok(())) => {
                self.unflushed = false;
                let outbox_has_room = self.frames.as_mut().is_some_and(|f| f.written());
                Poll::Ready(Ok(Written {
                    any: true,
                    outbox_has_room,
                    then: self.ending,
                }))
            }
            Poll::Ready(Err(_)) => Poll::Ready(Err(())),
            Poll::Pending if fed => Poll::Ready(Ok(Written {
                any: true,
                outbox_has_room: false,
                then: Then::Continue,
            })),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Whether the socket takes another frame now (its buffer is below yawc's bound, or was
    /// just flushed).
    fn ready_to_feed(&mut self, cx: &mut Context<'_>) -> Result<bool, ()> {
        match self.socket.poll_ready_unpin(cx) {
            Poll::Ready(Ok(())) => Ok(true),
            Poll::Ready(Err(_)) => Err(()),
            Poll::Pending => {
                // poll_ready flushes when the buffer is full, so that flush is under way.
                self.unflushed = true;
                Ok(false)
            }
        }
    }

    fn feed(&mut self, frame: Frame) -> Result<(), ()> {
        self.unflushed = true;
        self.socket.start_send_unpin(frame).map_err(|_| ())
    }
}

/// A reply on its way out: ready at once, or waiting for its change's durability.
enum Settling<F> {
    Ready(Option<(Reply, Then)>),
    Waiting(Pin<Box<F>>),
}

impl<F: Future<Output = (Reply, Then)>> Settling<F> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<(Reply, Then)> {
        match self {
            Settling::Ready(ready) => Poll::Ready(ready.take().expect("polled once it is ready")),
            Settling::Waiting(waiting) => waiting.as_mut().poll(cx),
        }
    }
}

/// A text message, or close code 1007 if it is not UTF-8 (*Why a connection closed*). The
/// session's `Text` makes the one check; yawc's is off (`server::websocket_options`).
fn text_message(payload: Bytes) -> Result<Data, Ended> {
    Data::text(payload).ok_or_else(|| Ended::Refused(CloseCode::Invalid, "invalid UTF-8".into()))
}

/// Whether a data frame is bigger than `max-ws-msg-len` as it is now.
fn is_too_big(frame: &Frame, node: &Node) -> bool {
    matches!(frame.opcode(), OpCode::Text | OpCode::Binary)
        && frame.payload().len() as u64 > node.setting(Setting::MaxWsMsgLen)
}

/// How a connection whose frame yawc could not read ends: with the manual's close code
/// (*Why a connection closed*), or with none when the connection itself failed.
fn read_failure(error: &WebSocketError, assembly: &Assembly) -> Ended {
    let code = match (assembly.violated(), assembly.too_big()) {
        (true, _) => Some(CloseCode::Protocol),
        (_, true) => Some(CloseCode::Size),
        _ => close_code(error),
    };
    match code {
        // Sent by the connection rather than by yawc, whose codes differ from the manual's
        // for some faults.
        Some(code) => Ended::Refused(code, error.to_string()),
        None => Ended::Gone,
    }
}

/// The manual's close code for a frame yawc could not read (*Why a connection closed*);
/// `None` when the connection itself failed and no frame can be sent.
fn close_code(error: &WebSocketError) -> Option<CloseCode> {
    match error {
        WebSocketError::FrameTooLarge => Some(CloseCode::Size),
        WebSocketError::InvalidUTF8 => Some(CloseCode::Invalid),
        // yawc reports an inflate failure as invalid input.
        WebSocketError::IoError(io) if io.kind() == std::io::ErrorKind::InvalidInput => {
            Some(CloseCode::Error)
        }
        error if error.is_protocol_error() => Some(CloseCode::Protocol),
        _ => None,
    }
}

/// Whether the client sent a frame before it had the login's reply.
fn sent_during_login(socket: &mut Socket) -> bool {
    loop {
        match socket.next_frame().now_or_never() {
            None => return false,
            Some(Ok(frame)) if matches!(frame.opcode(), OpCode::Ping | OpCode::Pong) => continue,
            Some(_) => return true,
        }
    }
}

/// Resolves when the connection's outbox overflowed with frames that cannot wait.
async fn overflowed(overflow: &Option<Overflow>) {
    match overflow {
        Some(overflow) => overflow.happened().await,
        None => std::future::pending().await,
    }
}

async fn send(socket: &mut Socket, reply: &Reply) -> Result<(), WebSocketError> {
    socket.send(Frame::text(reply.to_frame())).await
}

/// Closes with `code`, then reads what the client still sends for a moment.
async fn refuse(socket: &mut Socket, code: CloseCode, reason: String) {
    let _ = socket.send(Frame::close(code, reason)).await;
    drain(socket).await;
}

/// Closes with code 1000, then waits briefly for the client's answering close.
async fn close_normally(socket: &mut Socket) {
    if socket.close().await.is_ok() {
        drain(socket).await;
    }
}

/// Ends the connection with no close frame, after the reply is already flushed.
async fn abort(socket: &mut Socket, closer: &Closer) {
    closer.shutdown_write(socket);
    drain(socket).await;
}

/// Reads and drops what the client still sends, until it closes or `DRAIN_TIME` passes.
async fn drain(socket: &mut Socket) {
    let _ = timeout(DRAIN_TIME, async {
        while socket.next_frame().await.is_ok() {}
    })
    .await;
}
