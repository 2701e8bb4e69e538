//! The transport, in one place: TCP, TLS (rustls through `qe-tls`) for wss://, a read buffer,
//! and yawc's WebSocket client (the node's own library; it can compress).

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use url::Host;
use yawc::{MaybeTlsStream, Options};

/// A connection's bytes: TCP (or TLS over it) behind a read buffer.
///
/// yawc reads through tokio-util's `Framed`, which asks its buffer for one byte more than it
/// holds, and once the frames cut from that buffer are dropped, `bytes` grants exactly that: a
/// burst of small frames (a subscriber's deliveries, a pipelined publisher's replies) was then
/// read a few bytes per `recvfrom` (the bench measured it, `bench/src/client.rs`). The buffer
/// in front takes what the socket holds with one read and hands it out from memory.
pub(crate) type Stream = BufReader<MaybeTlsStream<TcpStream>>;

/// One WebSocket connection to a queue.
pub(crate) type Socket = yawc::WebSocket<Stream>;

/// The read buffer in front of each connection.
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// The largest frame accepted from the queue: an admin's `getmsg` of a message of the largest
/// `max-ws-msg-len` (1 MiB), with its escapes, fits.
const MAX_FRAME_READ: usize = 8 * 1024 * 1024;

/// Connects to the endpoint and upgrades to WebSocket (no login yet).
pub(crate) async fn connect(endpoint: &Endpoint) -> Result<Socket> {
    let url = &endpoint.url;
    let failed = |reason: String| Error::Connect {
        url: url.to_string(),
        reason,
    };
    let host = url.host().ok_or_else(|| failed("no host".into()))?;
    let port = url
        .port_or_known_default()
        .ok_or_else(|| failed("no port".into()))?;
    let addrs: Vec<SocketAddr> = match &host {
        // Given by the caller: the name is kept for TLS and the upgrade only.
        _ if !endpoint.connect_to.is_empty() => endpoint.connect_to.clone(),
        Host::Ipv4(ip) => vec![SocketAddr::new((*ip).into(), port)],
        Host::Ipv6(ip) => vec![SocketAddr::new((*ip).into(), port)],
        Host::Domain(name) => tokio::net::lookup_host((*name, port))
            .await
            .map_err(|e| failed(format!("cannot resolve {name}: {e}")))?
            .collect(),
    };
    let tcp = connect_any(&addrs)
        .await
        .map_err(|e| failed(e.to_string()))?;
    // Without it Nagle holds a small frame back while the previous one is unacknowledged.
    tcp.set_nodelay(true).map_err(|e| failed(e.to_string()))?;
    let io: MaybeTlsStream<TcpStream> = match url.scheme() {
        "wss" => {
            let name = match host {
                Host::Ipv4(ip) => ServerName::IpAddress(std::net::IpAddr::from(ip).into()),
                Host::Ipv6(ip) => ServerName::IpAddress(std::net::IpAddr::from(ip).into()),
                Host::Domain(name) => ServerName::try_from(name.to_string())
                    .map_err(|e| failed(format!("not a TLS name: {e}")))?,
            };
            let connector = TlsConnector::from(endpoint.tls());
            connector
                .connect(name, tcp)
                .await
                .map_err(|e| failed(format!("TLS: {e}")))?
                .into()
        }
        _ => tcp.into(),
    };
    let io = BufReader::with_capacity(READ_BUFFER_BYTES, io);
    yawc::WebSocket::handshake(url.clone(), io, options(endpoint))
        .await
        .map_err(|e| failed(format!("WebSocket upgrade: {e}")))
}

/// The first address that takes a TCP connection, in the order the resolver gave them.
async fn connect_any(addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(tcp) => return Ok(tcp),
            Err(error) => last = error,
        }
    }
    Err(last)
}

fn options(endpoint: &Endpoint) -> Options {
    let options = Options::default()
        .with_no_delay()
        .with_utf8()
        .with_max_payload_read(MAX_FRAME_READ)
        .with_max_read_buffer(2 * MAX_FRAME_READ);
    match endpoint.compression {
        true => options.with_balanced_compression(),
        false => options,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A name no resolver knows reaches the address given, and the upgrade still names it.
    #[tokio::test]
    async fn connect_to_skips_the_resolver_and_keeps_the_name() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buffer = [0u8; 1024];
            while !head.ends_with(b"\r\n\r\n") {
                let n = socket.read(&mut buffer).await.unwrap();
                assert!(n > 0, "the upgrade request, whole");
                head.extend_from_slice(&buffer[..n]);
            }
            String::from_utf8(head).unwrap()
            // Dropped: the upgrade fails, which is all the client side needs to see.
        });
        let url = format!("ws://queue.q.test.invalid:{}/", addr.port());
        let endpoint = Endpoint::new(&url).unwrap().connect_to(vec![addr]);
        let error = connect(&endpoint).await.err().expect("no WebSocket answer");
        let Error::Connect { reason, .. } = error else {
            panic!("a connect error, got {error:?}");
        };
        assert!(reason.starts_with("WebSocket upgrade"), "{reason}");
        let head = server.await.unwrap().to_ascii_lowercase();
        assert!(
            head.contains(&format!("host: queue.q.test.invalid:{}", addr.port())),
            "{head}"
        );

        // Without it, the name goes to the resolver, which does not know it.
        let plain = Endpoint::new(&url).unwrap();
        let Err(Error::Connect { reason, .. }) = connect(&plain).await else {
            panic!("an unknown name does not connect");
        };
        assert!(reason.starts_with("cannot resolve"), "{reason}");
    }
}
