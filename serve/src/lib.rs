//! HTTP/1.1 as the ports of both planes serve it (the control plane's API, a node's SQS
//! face), so that nobody can lock a port up without credentials. A node's WebSocket port
//! keeps the manual's admission (`dataplane/src/admission.rs`: `max-tasks`, a pre-login
//! budget, the login deadline from accept) and takes from here the accept that backs off and
//! what counts as one source ([`accept_retrying`], [`source_of`]). What a port served here
//! gets:
//!
//! - a request's whole head (line and headers) must arrive within [`Limits::head_within_secs`]
//!   of when the server starts waiting for it, which also closes a kept-alive connection left
//!   idle that long ([`http1`]);
//! - at most [`Limits::connections`] connections at once (past that, new ones wait in the
//!   kernel's backlog) and at most [`Limits::per_source`] from one source (an IPv4 address,
//!   or an IPv6 /64): one past it is closed at once ([`Gate`]);
//! - bodies being read take room from a budget of [`Limits::body_bytes`] first, and wait
//!   (not fail) while it is full, each within [`Limits::body_within_secs`] ([`Gate::body_room`]);
//! - a reply given before the request's body was read says `Connection: close` (hyper then
//!   closes the connection after it), so a keep-alive client's next request never goes to a
//!   connection about to be reset ([`track_body`], [`close_unless_read`]);
//! - an accept that fails (out of descriptors) is retried after a pause, never at once
//!   ([`accept`]).

use hyper_util::rt::TokioTimer;
use qe_shared::backoff::Backoff;
use serde::Deserialize;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The limits of one port; each is a setting (the control plane's `[http]`, the node's
/// `[sqs_http]`) with the defaults below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Seconds a request's whole head may take, and a kept-alive connection may sit idle.
    pub head_within_secs: u64,
    /// Connections open at once.
    pub connections: usize,
    /// Connections open at once from one source.
    pub per_source: usize,
    /// Bytes of request bodies being read at once, over all connections.
    pub body_bytes: usize,
    /// Seconds a request's body may take to arrive once its reading starts.
    pub body_within_secs: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            head_within_secs: 20,
            connections: 4096,
            // An eighth of the port: one source (the control plane handing SQS requests on,
            // a NAT in front of a fleet) may be busy, and it takes eight to fill the port.
            per_source: 512,
            body_bytes: 64 << 20,
            body_within_secs: 60,
        }
    }
}

impl Limits {
    pub fn head_within(&self) -> Duration {
        Duration::from_secs(self.head_within_secs)
    }

    pub fn body_within(&self) -> Duration {
        Duration::from_secs(self.body_within_secs)
    }
}

/// How much of a connection's input is buffered at most (hyper's default is about 400 KiB):
/// a request head is far smaller, and bodies are read as they are taken.
const READ_BUFFER_AT_MOST: usize = 64 * 1024;

/// hyper's HTTP/1.1 with `limits`' head time, and a bounded read buffer.
pub fn http1(limits: &Limits) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_within())
        .max_buf_size(READ_BUFFER_AT_MOST);
    builder
}

/// A timer kept due within a second on the runtime for as long as this lives: a server
/// whose runtime has no other timer holds one while it serves (a node's SQS face).
///
/// Why: hyper arms a connection's head timer ([`http1`]) again for each request it waits
/// for, and tokio wakes its I/O driver (an eventfd write, then one more `epoll_wait` of the
/// runtime) whenever a timer is armed earlier than the driver's next wake-up, or while the
/// driver waits with no timer at all. On a port whose only timers were the head timers,
/// that was once a request (the SQS face, `bench/sqs/syscalls_per_action.py`: a send took 1.0
/// eventfd write and 3 `epoll_wait`s). With a timer always due within a second, a head
/// timer, seconds away, is never the earliest, and the driver is left asleep.
pub struct NearTimer(tokio::task::JoinHandle<()>);

impl NearTimer {
    /// Starts the ticking task on the runtime this runs in.
    pub fn start() -> NearTimer {
        NearTimer(tokio::spawn(async {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
            }
        }))
    }
}

impl Drop for NearTimer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Who may hold a connection of one port, and how many body bytes are read at once.
pub struct Gate {
    limits: Limits,
    places: Arc<Semaphore>,
    sources: Mutex<HashMap<IpAddr, usize>>,
    body_budget: Arc<Semaphore>,
}

/// A connection's place at its port: given back when dropped.
pub struct Place {
    gate: Arc<Gate>,
    source: IpAddr,
    _place: OwnedSemaphorePermit,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut sources = self.gate.sources.lock().expect("never poisoned");
        if let Some(count) = sources.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                sources.remove(&self.source);
            }
        }
    }
}

impl Gate {
    pub fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            places: Arc::new(Semaphore::new(limits.connections.max(1))),
            sources: Mutex::new(HashMap::new()),
            body_budget: Arc::new(Semaphore::new(limits.body_bytes.max(1))),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Waits until a connection may be accepted (under the global cap).
    pub async fn room(self: &Arc<Self>) -> OwnedSemaphorePermit {
        self.places
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// The place of a connection accepted from `peer` with `room`, unless its source holds
    /// [`Limits::per_source`] already (it is then to be closed at once).
    pub fn admit(self: &Arc<Self>, room: OwnedSemaphorePermit, peer: IpAddr) -> Option<Place> {
        let source = source_of(peer);
        let mut sources = self.sources.lock().expect("never poisoned");
        let count = sources.entry(source).or_default();
        if *count >= self.limits.per_source {
            tracing::debug!(%peer, "too many connections from one source: closed");
            return None;
        }
        *count += 1;
        Some(Place {
            gate: self.clone(),
            source,
            _place: room,
        })
    }

    /// Room for a body of up to `bytes` to be read: waits while other bodies hold the budget
    /// (a body larger than the whole budget takes all of it).
    pub async fn body_room(&self, bytes: usize) -> OwnedSemaphorePermit {
        let wanted = bytes.clamp(1, self.limits.body_bytes.max(1));
        let wanted = u32::try_from(wanted).unwrap_or(u32::MAX);
        self.body_budget
            .clone()
            .acquire_many_owned(wanted)
            .await
            .expect("the semaphore is never closed")
    }
}

/// Where a connection comes from, as the per-source caps count: an IPv4 address, or an IPv6
/// /64 (one host may use any address of its /64).
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let network = v6.to_bits() & (u128::MAX << 64);
            IpAddr::V6(std::net::Ipv6Addr::from_bits(network))
        }
        v4 => v4,
    }
}

/// The pause after an accept that failed, doubled while they keep failing.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);
const ACCEPT_PAUSE_AT_MOST: Duration = Duration::from_secs(1);

/// The next connection on `listener` that `gate` lets in, with its place. An accept that
/// fails (out of descriptors, most likely) is retried after a pause that grows, so a full
/// descriptor table does not spin a core.
pub async fn accept(gate: &Arc<Gate>, listener: &TcpListener) -> (TcpStream, SocketAddr, Place) {
    loop {
        let room = gate.room().await;
        let (tcp, peer) = accept_retrying(listener).await;
        if let Some(place) = gate.admit(room, peer.ip()) {
            return (tcp, peer, place);
        }
    }
}

/// The next connection on `listener`. An accept that fails (out of descriptors, most likely)
/// is retried after a pause that grows, so a full descriptor table does not spin a core. (The
/// WebSocket port, whose admission is the manual's, accepts with this alone.)
pub async fn accept_retrying(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    let mut backoff = Backoff::new(ACCEPT_PAUSE, ACCEPT_PAUSE_AT_MOST);
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(error) => {
                let pause = backoff.next_wait();
                tracing::warn!(%error, retry_in = ?pause, "accepting a connection failed");
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Whether a request's body was read to its end (see [`track_body`]).
#[derive(Clone, Default)]
pub struct BodyRead(Arc<AtomicBool>);

impl BodyRead {
    pub fn done(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// `request` with its body watched, and what says whether it was read to its end. A request
/// that declares no body counts as read.
pub fn track_body<B: http_body::Body>(
    request: hyper::Request<B>,
) -> (hyper::Request<TrackedBody<B>>, BodyRead) {
    let read = BodyRead::default();
    let headers = request.headers();
    let declares_body = headers.contains_key(hyper::header::TRANSFER_ENCODING)
        || headers
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|length| length.trim() != "0");
    if !declares_body {
        read.0.store(true, Ordering::Relaxed);
    }
    let tracked = read.clone();
    let request = request.map(|inner| TrackedBody {
        inner,
        read: tracked,
    });
    (request, read)
}

/// Says `Connection: close` on `response` unless the request's body was read: hyper would
/// otherwise answer and then have to reset a connection with unread bytes in it, and the
/// client's next request on it (a POST it will not retry) would fail.
pub fn close_unless_read<B>(response: &mut hyper::Response<B>, read: &BodyRead) {
    if !read.done() {
        response.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
}

/// A request body that notes when it has been read to its end.
pub struct TrackedBody<B> {
    inner: B,
    read: BodyRead,
}

impl<B: http_body::Body + Unpin> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.0.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Has the kernel notice a peer that vanished without a FIN (its machine gone): keepalive
/// probes after 30 s idle, five seconds apart, the peer gone after three unanswered (about
/// 45 s), and data it never acknowledges errors the socket after a minute, not the kernel's
/// quarter of an hour of retransmissions. Best effort: a socket that refuses keeps its defaults.
pub fn notice_dead_peers(tcp: &TcpStream) {
    let probes = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    let socket = socket2::SockRef::from(tcp);
    let _ = socket.set_tcp_keepalive(&probes);
    let _ = socket.set_tcp_user_timeout(Some(Duration::from_secs(60)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_source_holds_at_most_its_share_and_gets_it_back() {
        let gate = Gate::new(Limits {
            per_source: 2,
            ..Limits::default()
        });
        let one: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        let first = gate.admit(gate.room().await, one).unwrap();
        let _second = gate.admit(gate.room().await, one).unwrap();
        assert!(gate.admit(gate.room().await, one).is_none(), "a third");
        assert!(
            gate.admit(gate.room().await, other).is_some(),
            "another source"
        );
        drop(first);
        assert!(
            gate.admit(gate.room().await, one).is_some(),
            "its place back"
        );
        // One IPv6 host is its /64.
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::ffff:2".parse().unwrap();
        assert_eq!(source_of(a), source_of(b));
    }

    #[tokio::test]
    async fn bodies_wait_for_room_in_the_budget() {
        let gate = Gate::new(Limits {
            body_bytes: 100,
            ..Limits::default()
        });
        let held = gate.body_room(80).await;
        let waiting = tokio::time::timeout(Duration::from_millis(20), gate.body_room(40));
        assert!(waiting.await.is_err(), "waits while the budget is held");
        drop(held);
        let _all = gate.body_room(1_000).await;
    }
}
