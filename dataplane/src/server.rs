//! Accepts TCP connections and turns them into WebSocket connections.
//!
//! A connection that [`Admission`] does not let in (every `max-tasks` slot is taken, or the
//! pre-login budget, or its source's share of it) is closed right after accept, with nothing
//! sent. The rest get one HTTP exchange: a WebSocket upgrade on `/` (with permessage-deflate
//! when the client offers it), or `400` for anything else. The login deadline
//! (`no-reply-timeout-secs`) runs from accept, so a client that never upgrades is dropped in
//! time too.

use crate::admission::PreLogin;
use crate::connection::{self, Closer, Connection};
use crate::fragments::{Assembly, FragmentWatch};
use crate::state::Node;
use crate::traffic::Counted;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderName, CONNECTION, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION, UPGRADE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use qe_shared::settings::Setting;
use rustls::ServerConfig;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::{timeout_at, Instant};
use yawc::{DeflatePool, HttpStream, Options, UpgradeFut, WebSocket};

/// The most of an HTTP request hyper buffers before the upgrade (hyper's least).
const HTTP_BUFFER_BYTES: usize = 8192;

pub struct Server {
    /// One per address, all on one port.
    listeners: Vec<TcpListener>,
    node: Arc<Node>,
    /// `None` serves plain ws://.
    tls: Option<Arc<ServerConfig>>,
    /// Every connection's WebSocket settings.
    options: Options,
}

/// A connection's byte stream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Server {
    /// Listens on every address in `addrs` (at least one). A port 0 is the port the first
    /// address got, so a name's A and AAAA records can share one port.
    pub async fn bind(
        addrs: &[SocketAddr],
        node: Arc<Node>,
        tls: Option<Arc<ServerConfig>>,
    ) -> std::io::Result<Server> {
        let (first, rest) = addrs.split_first().expect("at least one address");
        let mut listeners = vec![listen(*first)?];
        let port = listeners[0].local_addr()?.port();
        for addr in rest {
            let mut addr = *addr;
            if addr.port() == 0 {
                addr.set_port(port);
            }
            listeners.push(listen(addr)?);
        }
        Ok(Server {
            listeners,
            node,
            tls,
            options: websocket_options(),
        })
    }

    /// Where it listens, the first address first.
    pub fn local_addrs(&self) -> std::io::Result<Vec<SocketAddr>> {
        self.listeners.iter().map(TcpListener::local_addr).collect()
    }

    /// Serves until the process ends.
    pub async fn run(self) {
        tokio::spawn(self.node.queue.clone().run_timers());
        let accepting = self.listeners.into_iter().map(|listener| {
            let setup = Setup {
                node: self.node.clone(),
                tls: self.tls.clone(),
                options: self.options.clone(),
            };
            accept_each(listener, setup)
        });
        futures::future::join_all(accepting).await;
    }
}

/// What every connection is served with.
#[derive(Clone)]
struct Setup {
    node: Arc<Node>,
    tls: Option<Arc<ServerConfig>>,
    options: Options,
}

/// Accepts from `listener` for good; each connection admitted is served.
async fn accept_each(listener: TcpListener, setup: Setup) {
    loop {
        let (tcp, peer) = qe_serve::accept_retrying(&listener).await;
        match setup.node.admission.admit(peer.ip()) {
            Some(admitted) => {
                let source = qe_serve::source_of(peer.ip());
                tokio::spawn(serve(tcp, setup.clone(), admitted, source));
            }
            None => drop(tcp),
        }
    }
}

/// A listening socket on `addr`; on the IPv6 wildcard (`[::]`) it takes IPv4 too, whatever
/// the system's default.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// One connection, from accept to close; `admitted` is its slot until its login.
async fn serve(tcp: TcpStream, setup: Setup, admitted: PreLogin, source: IpAddr) {
    let Setup { node, tls, options } = setup;
    let login_time = Duration::from_secs(node.setting(Setting::NoReplyTimeoutSecs));
    let login_deadline = Instant::now() + login_time;
    let closer = Closer::new(&tcp);
    let _ = tcp.set_nodelay(true);
    // A peer that vanished without a FIN is noticed by the kernel too, after about 45 s.
    qe_serve::notice_dead_peers(&tcp);
    // Bytes are counted on the socket: under TLS, what the client is billed for.
    let (counted, writes) = Counted::new(tcp, node.traffic.clone());
    let io: Box<dyn Io> = match tls {
        None => Box::new(counted),
        // The handshake's and the upgrade's futures are boxed: inline they would make every
        // connection's task as big as they are (7 KiB) for as long as it is open. The stream
        // holds no buffer while the connection is idle (tokio-rustls' holds 4 KiB).
        Some(config) => {
            let handshake = qe_tls::server_stream::accept(config, counted);
            match timeout_at(login_deadline, Box::pin(handshake)).await {
                Ok(Ok(stream)) => Box::new(stream),
                // Not TLS 1.2 or 1.3 (plain HTTP, an old protocol), or too slow: refused.
                _ => return,
            }
        }
    };
    let assembly = Assembly::new(node.admission.big_logins.clone());
    let io = Box::new(FragmentWatch::new(io, assembly.clone()));
    let replicates = node.standby.is_some();
    let upgraded = timeout_at(login_deadline, Box::pin(upgrade(io, options, replicates))).await;
    let Ok(Some((websocket, route))) = upgraded else {
        return;
    };
    if route == Route::Replication {
        if let Some(standby) = &node.standby {
            let queue = &node.queue;
            crate::replication::primary::serve(websocket, standby, queue, admitted, login_deadline)
                .await;
        }
        return;
    }
    let connection = Connection {
        closer,
        login_deadline,
        assembly,
        writes,
        admitted,
        source,
    };
    connection::run(websocket, connection, node).await;
}

/// Where an upgrade leads: a client of the queue on `/`, or the queue's standby on
/// `/replicate` (only on a primary that has one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Queue,
    Replication,
}

/// The connection's upgrade future, and where it leads.
type Upgrading = (UpgradeFut, Route);

/// Answers the connection's HTTP requests until one upgrades to a WebSocket (`Some`) or the
/// client goes away (`None`). The WebSocket is boxed: it is passed down to the functions that
/// serve it, and each async function keeps its own copy of what it is passed (624 bytes of
/// every connection's task each time).
async fn upgrade(
    io: Box<dyn Io>,
    options: Options,
    replicates: bool,
) -> Option<(Box<WebSocket<HttpStream>>, Route)> {
    let (sender, receiver) = oneshot::channel();
    let sender = Mutex::new(Some(sender));
    let service = service_fn(|mut request: Request<Incoming>| {
        let response = respond(&mut request, &options, replicates, &sender);
        async move { Ok::<_, Infallible>(response) }
    });
    http1::Builder::new()
        // An upgrade request is well under 1 KiB; hyper would buffer 400 KiB of one.
        .max_buf_size(HTTP_BUFFER_BYTES)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await
        .ok()?;
    let (upgrade, route): Upgrading = receiver.await.ok()?;
    upgrade
        .await
        .ok()
        .map(|websocket| (Box::new(websocket), route))
}

fn respond(
    request: &mut Request<Incoming>,
    options: &Options,
    replicates: bool,
    sender: &Mutex<Option<oneshot::Sender<Upgrading>>>,
) -> Response<Full<Bytes>> {
    let Some(route) = websocket_upgrade(request, replicates) else {
        return bad_request();
    };
    if let Some(refusal) = refuse_handshake(request) {
        return refusal;
    }
    match WebSocket::upgrade_with_options(request, options.clone()) {
        Ok((response, upgrade)) => {
            if let Some(sender) = sender.lock().expect("never poisoned").take() {
                let _ = sender.send((upgrade, route));
            }
            response.map(|_| Full::default())
        }
        // Checked above; whatever else yawc finds wrong is the client's fault too.
        Err(_) => bad_request(),
    }
}

/// RFC 6455 §4.2.1–4.2.2 on the key and version of an upgrade: a version other than 13 is
/// answered `426` with the version the node speaks (a client may retry with it); a missing
/// version, or a key that is not the base64 of 16 bytes, is a malformed handshake: `400`.
fn refuse_handshake(request: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
    use base64::Engine;
    let headers = request.headers();
    let mut versions = headers.get_all(SEC_WEBSOCKET_VERSION).iter();
    match (versions.next(), versions.next()) {
        (Some(version), None) if version.as_bytes() == b"13" => {}
        (None, _) => return Some(bad_request()),
        _ => return Some(upgrade_required()),
    }
    let mut keys = headers.get_all(SEC_WEBSOCKET_KEY).iter();
    let key = match (keys.next(), keys.next()) {
        (Some(key), None) => base64::engine::general_purpose::STANDARD.decode(key.as_bytes()),
        _ => return Some(bad_request()),
    };
    match key {
        Ok(nonce) if nonce.len() == 16 => None,
        _ => Some(bad_request()),
    }
}

/// `426 Upgrade Required`, naming the one WebSocket version the node speaks.
fn upgrade_required() -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::UPGRADE_REQUIRED)
        .header(SEC_WEBSOCKET_VERSION, "13")
        .header(CONNECTION, "close")
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(
            b"This address speaks WebSocket version 13.\n",
        )))
        .expect("a static response is valid")
}

/// A GET on `/` (any query), or on `/replicate` where a standby is expected, asking to
/// upgrade to websocket: where it leads.
fn websocket_upgrade(request: &Request<Incoming>, replicates: bool) -> Option<Route> {
    let route = match request.uri().path() {
        "/" => Route::Queue,
        crate::replication::PATH if replicates => Route::Replication,
        _ => return None,
    };
    let upgrades = request.method() == Method::GET
        && header_has_token(request, &UPGRADE, "websocket")
        && header_has_token(request, &CONNECTION, "upgrade");
    upgrades.then_some(route)
}

fn header_has_token(request: &Request<Incoming>, name: &HeaderName, token: &str) -> bool {
    request.headers().get_all(name).iter().any(|value| {
        value
            .to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

fn bad_request() -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::BAD_REQUEST)
        .header(CONNECTION, "close")
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(
            b"This address speaks only WebSocket, on /.\n",
        )))
        .expect("a static response is valid")
}

/// Frames shorter than this are sent uncompressed.
const COMPRESS_FROM_BYTES: usize = 512;

/// What a connection's socket buffers start at (yawc grows them for a bigger frame, and gives
/// the growth back after it): an idle connection costs little more than these.
const SOCKET_BUFFER_BYTES: usize = 2048;

/// Idle deflate states kept for reuse: about as many as messages compressed or inflated at
/// one moment, which is the number of runtime threads, not of connections.
const DEFLATE_POOL: usize = 8;

/// The WebSocket settings every connection shares (cheap to clone: the pool is shared).
///
/// yawc bounds every message at the largest `max-ws-msg-len` there can be (after inflating,
/// so compressed bombs are bounded too); the connection holds each message to the setting's
/// current value, which `setcfg` may change while the connection is open.
///
/// permessage-deflate is agreed with no context takeover in either direction, whatever the
/// client offered (RFC 7692 §7.1.1 lets the server ask it): each message is compressed on its
/// own, so between messages a connection keeps no deflate state, and the states of the
/// messages being compressed or inflated at one moment come from a shared pool. A connection
/// that kept its own costs about 300 KiB of deflate state more; the price is a lower ratio
/// for messages that repeat the ones before them.
pub fn websocket_options() -> Options {
    // yawc's limits are exclusive.
    let limit = Setting::MaxWsMsgLen.range().1 as usize + 1;
    Options::default()
        .with_balanced_compression()
        .server_no_context_takeover()
        .client_no_context_takeover()
        .with_deflate_pool(DeflatePool::new(DEFLATE_POOL))
        // Below this a frame is sent uncompressed (RFC 7692 lets each message choose): for
        // short frames deflate costs far more CPU than the bytes it saves.
        .with_compression_threshold(COMPRESS_FROM_BYTES)
        .with_read_buffer_capacity(SOCKET_BUFFER_BYTES)
        .with_write_buffer_capacity(SOCKET_BUFFER_BYTES)
        // No `with_utf8`: the connection checks each text message itself, once
        // (`session::Text`), where yawc's check and the session's made two.
        .with_max_payload_read(limit)
        .with_max_read_buffer(limit)
        .with_no_delay()
}
