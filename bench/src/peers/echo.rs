//! The WebSocket echo limit: what one core can echo with the node's own transport (hyper's
//! HTTP upgrade, then yawc), nothing else. `bench echo-server` is the server, started pinned
//! to the server core; `limit` loads it from the bench's core.

use super::server::{free_port, pinned, Probe, Server};
use super::Settings;
use crate::client::Wire;
use bytes::Bytes;
use futures::{FutureExt, SinkExt, StreamExt};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::Instant;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use yawc::frame::{Frame, OpCode};
use yawc::{HttpStream, Options, UpgradeFut, WebSocket};

const CONNECTIONS: usize = 16;
const IN_FLIGHT: usize = 16;
const FRAME_BYTES: usize = 100;

/// ws://, uncompressed: the transport the peers' rows are measured on.
const PLAIN: Wire = Wire {
    tls: None,
    compress: false,
};

/// What the echo limit measured.
pub struct Echo {
    /// Frames echoed per second (each one sent, echoed and received).
    pub rate: f64,
    /// The echo server's CPU per echoed frame.
    pub cpu_us_per_frame: f64,
}

/// `bench echo-server`: echoes every text frame on `127.0.0.1:port` until killed.
pub async fn serve(port: u16) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .await
        .expect("the echo port");
    println!("listening on {}", listener.local_addr().unwrap());
    loop {
        let (tcp, _) = listener.accept().await.expect("accept");
        tokio::spawn(echo(tcp));
    }
}

async fn echo(tcp: TcpStream) {
    let _ = tcp.set_nodelay(true);
    let Some(mut socket) = upgrade(tcp).await else {
        return;
    };
    while let Some(first) = socket.next().await {
        // Echo every frame already here, then flush once (as the node answers a burst).
        let mut frame = first;
        loop {
            if frame.opcode() == OpCode::Text {
                let text = Frame::text(frame.into_payload());
                if socket.feed(text).await.is_err() {
                    return;
                }
            }
            match socket.next().now_or_never() {
                Some(Some(next)) => frame = next,
                Some(None) => return,
                None => break,
            }
        }
        if socket.flush().await.is_err() {
            return;
        }
    }
}

/// The connection's HTTP exchange, until it upgrades (as the node's `server::upgrade`).
async fn upgrade(tcp: TcpStream) -> Option<WebSocket<HttpStream>> {
    let (sender, receiver) = oneshot::channel::<UpgradeFut>();
    let sender = Mutex::new(Some(sender));
    let service = service_fn(|mut request: Request<Incoming>| {
        let response = match WebSocket::upgrade_with_options(&mut request, Options::default()) {
            Ok((response, upgrade)) => {
                if let Some(sender) = sender.lock().unwrap().take() {
                    let _ = sender.send(upgrade);
                }
                response
            }
            // Not an upgrade: the readiness probe.
            Err(_) => {
                let mut response = Response::new(Empty::<Bytes>::new());
                *response.status_mut() = StatusCode::BAD_REQUEST;
                response
            }
        };
        async move { Ok::<_, Infallible>(response) }
    });
    http1::Builder::new()
        .serve_connection(TokioIo::new(tcp), service)
        .with_upgrades()
        .await
        .ok()?;
    receiver.await.ok()?.await.ok()
}

/// Starts the echo server on the server core and runs 16 connections with 16 frames of
/// 100 B in flight each for `settings.time`.
pub async fn limit(settings: &Settings) -> Echo {
    let dir = tempfile::tempdir_in(&settings.data_root).unwrap();
    let port = free_port();
    let bench = std::env::current_exe().expect("the bench binary");
    let mut command = pinned(settings.server_cpu, bench.to_str().expect("a UTF-8 path"));
    command.args(["echo-server", "--port", &port.to_string()]);
    // hyper answers any HTTP request; a plain GET is refused with 400.
    let probe = Probe {
        send: b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
        expect: b"HTTP/1.1 ",
    };
    let server = Server::start(command, dir, port, probe, Vec::new()).await;
    let url = format!("ws://127.0.0.1:{port}/");
    let mut sockets = Vec::new();
    for _ in 0..CONNECTIONS {
        sockets.push(PLAIN.connect(&url).await);
    }
    let cpu_before = server.cpu_time();
    let started = Instant::now();
    let deadline = started + settings.time;
    let clients: Vec<_> = sockets
        .into_iter()
        .map(|socket| tokio::spawn(echo_client(socket, deadline)))
        .collect();
    let mut echoed = 0;
    for client in clients {
        echoed += client.await.expect("an echo client");
    }
    let elapsed = started.elapsed();
    let cpu = server.cpu_time() - cpu_before;
    Echo {
        rate: echoed as f64 / elapsed.as_secs_f64(),
        cpu_us_per_frame: cpu.as_secs_f64() * 1e6 / echoed as f64,
    }
}

/// Keeps `IN_FLIGHT` frames unanswered until `deadline`; returns the frames echoed.
async fn echo_client(socket: crate::client::Socket, deadline: Instant) -> usize {
    let (mut sink, mut stream) = socket.split();
    let text = Bytes::from("x".repeat(FRAME_BYTES));
    for _ in 0..IN_FLIGHT {
        sink.feed(Frame::text(text.clone())).await.unwrap();
    }
    sink.flush().await.unwrap();
    let (mut echoed, mut unanswered) = (0, IN_FLIGHT);
    while unanswered > 0 {
        let mut frame = stream.next().await;
        // Take every echo already here, and send their replacements with one flush.
        loop {
            let echo = frame.expect("the echo server is there");
            if echo.opcode() == OpCode::Text {
                echoed += 1;
                unanswered -= 1;
                if Instant::now() < deadline {
                    sink.feed(Frame::text(text.clone())).await.unwrap();
                    unanswered += 1;
                }
            }
            match stream.next().now_or_never() {
                Some(next) => frame = next,
                None => break,
            }
        }
        sink.flush().await.unwrap();
    }
    echoed
}
