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

use crate::engine::outbox::Overflow;
use crate::engine::{Frames, Outbound};
use crate::fragments::Assembly;
use crate::node::Node;
use crate::session::{self, Data, Reply, Session, Then};
use bytes::Bytes;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, SinkExt, StreamExt};
use qe_shared::settings::Setting;
use std::net::Shutdown;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{timeout, timeout_at, Instant};
use yawc::close::CloseCode;
use yawc::frame::{Frame, OpCode};
use yawc::{HttpStream, WebSocket, WebSocketError};

type Socket = WebSocket<HttpStream>;

/// How long a closing connection may take to send its last frames or read the client's.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// A second handle on the TCP socket, to half-close it beneath the HTTP and WebSocket layers.
pub struct Closer(socket2::Socket);

impl Closer {
    pub fn new(tcp: &TcpStream) -> std::io::Result<Closer> {
        socket2::SockRef::from(tcp).try_clone().map(Closer)
    }

    fn shutdown_write(&self) {
        let _ = self.0.shutdown(Shutdown::Write);
    }
}

/// What the client did next.
enum Incoming {
    Data(Data),
    /// It closed the connection, broke the protocol, or went away.
    Gone,
}

/// Runs a connection from its first frame to its end.
pub async fn run(
    mut socket: Socket,
    closer: Closer,
    node: Arc<Node>,
    login_deadline: Instant,
    assembly: Arc<Assembly>,
) {
    let mut last_heard = Instant::now();
    let login = timeout_at(
        login_deadline,
        next_data(&mut socket, &mut last_heard, &node, &assembly),
    )
    .await;
    let Ok(Incoming::Data(login)) = login else {
        return;
    };
    if sent_during_login(&mut socket) {
        return;
    }
    let outcome = session::login(login, &node).await;
    // Checked again before the reply: a frame that came while the login was being handled
    // ends the connection unanswered, and dropping the new session undoes the login.
    if sent_during_login(&mut socket) {
        return;
    }
    let (mut session, present) = match outcome {
        Ok((session, reply)) => {
            // Counted before the reply, so a client that has its reply is in the live stats.
            let present = node.presence.enter(session.role());
            if send(&mut socket, &reply).await.is_err() {
                return; // dropping the session undoes the login
            }
            (session, present)
        }
        Err(reply) => {
            if send(&mut socket, &reply).await.is_ok() {
                abort(socket, closer).await;
            }
            return;
        }
    };
    let mut frames = session.take_frames();
    let ended = serve(&mut socket, &mut session, &mut frames, &node, &assembly).await;
    // No longer an open connection, before the session's end is made known.
    drop(present);
    // Only a logout ends a session for good; any other end is a drop.
    session.end(ended == Ended::Logout, frames);
    match ended {
        Ended::Logout => close_normally(socket).await,
        Ended::Abort => abort(socket, closer).await,
        Ended::Gone => {}
    }
}

/// How often an idle connection is pinged, and how long a peer may stay silent (no frame,
/// not even a pong) before it counts as gone: a peer that vanished without a FIN is noticed
/// within `silence_limit` plus one `ping_every`. TCP keepalive (set at accept) backs this up.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    pub ping_every: Duration,
    pub silence_limit: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            ping_every: Duration::from_secs(15),
            silence_limit: Duration::from_secs(45),
        }
    }
}

/// How the logged-in part of a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The subscriber logged out; its reply is sent: close with 1000.
    Logout,
    /// A reply that ends the connection is sent: close with no close frame.
    Abort,
    /// The client closed, broke the protocol, went silent or away.
    Gone,
}

/// Replies that may wait for the disk on one connection; past this the connection stops
/// reading until one is sent, so a client cannot queue unbounded work.
const MAX_WAITING_REPLIES: usize = 4096;

/// The logged-in part. Requests take effect in the order they arrive; their replies wait for
/// their changes' durability side by side and go out in that same order, while the queue's
/// deliveries keep flowing. A reply that ends the connection stops the reading.
async fn serve(
    socket: &mut Socket,
    session: &mut Session,
    frames: &mut Option<Frames>,
    node: &Node,
    assembly: &Assembly,
) -> Ended {
    let keepalive = &node.keepalive;
    let overflow = frames.as_ref().map(Frames::overflow);
    let mut replies = FuturesOrdered::new();
    let mut reading = true;
    let mut last_heard = Instant::now();
    let mut ping =
        tokio::time::interval_at(Instant::now() + keepalive.ping_every, keepalive.ping_every);
    loop {
        tokio::select! {
            incoming = next_data(socket, &mut last_heard, node, assembly), if reading && replies.len() < MAX_WAITING_REPLIES => {
                let Incoming::Data(data) = incoming else { return Ended::Gone };
                let response = session.handle(data);
                reading = response.then == Then::Continue;
                replies.push_back(response.settle());
            }
            Some((reply, then)) = replies.next(), if !replies.is_empty() => {
                if send(socket, &reply).await.is_err() {
                    return Ended::Gone;
                }
                match then {
                    Then::Continue => {}
                    Then::Logout => return Ended::Logout,
                    Then::Abort => return Ended::Abort,
                }
            }
            Some(outbound) = next_outbound(frames) => {
                if send_outbound(socket, outbound, frames).await.is_err() {
                    return Ended::Gone;
                }
            }
            _ = overflowed(&overflow) => {
                tracing::info!("dropping a client that reads too slowly");
                return Ended::Gone;
            }
            _ = assembly.overdue(node.message_timeout) => {
                let closing = Frame::close(CloseCode::Policy, "message not whole in time");
                let _ = socket.send(closing).await;
                drain(socket).await;
                return Ended::Gone;
            }
            _ = ping.tick() => {
                if last_heard.elapsed() >= keepalive.silence_limit {
                    tracing::info!(silent_for = ?last_heard.elapsed(), "dropping a silent peer");
                    return Ended::Gone;
                }
                if socket.send(Frame::ping(Bytes::new())).await.is_err() {
                    return Ended::Gone;
                }
            }
        }
    }
}

/// The next text or binary message; pings are answered by yawc and skipped here. Any frame
/// at all, a pong included, moves `last_heard`. A message bigger than `max-ws-msg-len` (as it
/// is now) closes the connection with 1009; a broken frame with the manual's code for it.
async fn next_data(
    socket: &mut Socket,
    last_heard: &mut Instant,
    node: &Node,
    assembly: &Assembly,
) -> Incoming {
    loop {
        let frame = match socket.next_frame().await {
            Ok(frame) => frame,
            Err(error) => {
                let code = match assembly.violated() {
                    true => Some(CloseCode::Protocol),
                    false => close_code(&error),
                };
                if let Some(code) = code {
                    // Sent here rather than by yawc, whose codes differ from the manual's for
                    // some faults; yawc's own close frame is never flushed, as nothing more
                    // is read.
                    let _ = socket.send(Frame::close(code, error.to_string())).await;
                }
                return Incoming::Gone;
            }
        };
        *last_heard = Instant::now();
        let is_data = matches!(frame.opcode(), OpCode::Text | OpCode::Binary);
        if is_data && frame.payload().len() as u64 > node.setting(Setting::MaxWsMsgLen) {
            let _ = socket
                .send(Frame::close(CloseCode::Size, "message too big"))
                .await;
            drain(socket).await;
            return Incoming::Gone;
        }
        match frame.opcode() {
            OpCode::Text => return Incoming::Data(Data::text(frame.into_payload())),
            OpCode::Binary => return Incoming::Data(Data::Binary(frame.into_payload())),
            OpCode::Close => {
                // yawc has queued the answer (the client's code echoed); one more read sends it.
                let _ = timeout(DRAIN_TIME, socket.next_frame()).await;
                return Incoming::Gone;
            }
            OpCode::Ping | OpCode::Pong | OpCode::Continuation => continue,
        }
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

async fn next_outbound(frames: &mut Option<Frames>) -> Option<Outbound> {
    match frames {
        Some(frames) => frames.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves when the connection's outbox went over `max-write-queue-bytes`.
async fn overflowed(overflow: &Option<Overflow>) {
    match overflow {
        Some(overflow) => overflow.happened().await,
        None => std::future::pending().await,
    }
}

async fn send(socket: &mut Socket, reply: &Reply) -> Result<(), WebSocketError> {
    socket.send(Frame::text(reply.to_frame())).await
}

/// Sends `first` and every other frame already waiting, with one flush; gives up at once if
/// the outbox overflows meanwhile (the client is not reading).
async fn send_outbound(
    socket: &mut Socket,
    first: Outbound,
    frames: &mut Option<Frames>,
) -> Result<(), ()> {
    let Some(frames) = frames else {
        return Err(());
    };
    let overflow = frames.overflow();
    let write = async {
        let mut written = first.frame.len();
        socket.feed(Frame::text(first.frame)).await?;
        while let Some(outbound) = frames.try_recv() {
            written += outbound.frame.len();
            socket.feed(Frame::text(outbound.frame)).await?;
        }
        socket.flush().await?;
        frames.sent(written);
        Ok::<(), WebSocketError>(())
    };
    tokio::select! {
        written = write => written.map_err(|_| ()),
        _ = overflow.happened() => {
            tracing::info!("dropping a client that reads too slowly");
            Err(())
        }
    }
}

/// Closes with code 1000, then waits briefly for the client's answering close.
async fn close_normally(mut socket: Socket) {
    if socket.close().await.is_ok() {
        drain(&mut socket).await;
    }
}

/// Ends the connection with no close frame, after the reply is already flushed.
async fn abort(mut socket: Socket, closer: Closer) {
    closer.shutdown_write();
    drain(&mut socket).await;
}

/// Reads and drops what the client still sends, until it closes or `DRAIN_TIME` passes.
async fn drain(socket: &mut Socket) {
    let _ = timeout(DRAIN_TIME, async {
        while socket.next_frame().await.is_ok() {}
    })
    .await;
}
