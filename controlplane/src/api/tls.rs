//! The API over HTTPS (`[api_tls]`): a listener that hands axum connections once their TLS
//! handshake is done, TLS 1.2 and 1.3 only (rustls, ring). Handshakes run on tasks of their
//! own, so a slow or silent client never holds up the next one; they are capped, in all and
//! per source address, and timed, so that clients without a token cannot spend the API's
//! memory or descriptors on handshakes that never finish. The certificate is
//! [`qe_tls::Certificate`], as the nodes serve theirs: read again on SIGHUP or when its files
//! change; new connections get it, open ones go on.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has for its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// Handshakes under way at most; past this, connections wait in the kernel's backlog.
const HANDSHAKES_AT_MOST: usize = 512;
/// Handshakes under way at most from one address; past this, its next connection is closed
/// at once, so one source cannot take every slot.
const HANDSHAKES_PER_SOURCE: usize = 16;

pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    /// Handshakes under way; each ends with its peer and a connection, or with nothing when
    /// it failed.
    handshakes: JoinSet<(SocketAddr, Option<TlsStream<TcpStream>>)>,
    /// Handshakes under way by source address.
    per_source: std::collections::HashMap<std::net::IpAddr, usize>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> TlsListener {
        TlsListener {
            tcp,
            acceptor,
            handshakes: JoinSet::new(),
            per_source: std::collections::HashMap::new(),
        }
    }

    /// Starts the handshake of `tcp` from `peer`, unless its source has too many under way.
    fn start_handshake(&mut self, tcp: TcpStream, peer: SocketAddr) {
        let under_way = self.per_source.entry(source_of(peer.ip())).or_default();
        if *under_way >= HANDSHAKES_PER_SOURCE {
            tracing::debug!(%peer, "too many handshakes from one address: closed");
            return;
        }
        *under_way += 1;
        let acceptor = self.acceptor.clone();
        self.handshakes.spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await;
            (peer, handshake.ok().and_then(Result::ok))
        });
    }

    fn handshake_ended(&mut self, peer: SocketAddr) {
        if let std::collections::hash_map::Entry::Occupied(mut entry) =
            self.per_source.entry(source_of(peer.ip()))
        {
            *entry.get_mut() -= 1;
            if *entry.get() == 0 {
                entry.remove();
            }
        }
    }
}

/// Where a connection comes from, as the per-source cap counts: an IPv4 address, or an IPv6
/// /64 (one host may use any address of its /64).
fn source_of(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip.to_canonical() {
        std::net::IpAddr::V6(v6) => {
            let network = v6.to_bits() & (u128::MAX << 64);
            std::net::IpAddr::V6(std::net::Ipv6Addr::from_bits(network))
        }
        v4 => v4,
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let room = self.handshakes.len() < HANDSHAKES_AT_MOST;
            tokio::select! {
                accepted = self.tcp.accept(), if room => match accepted {
                    Ok((tcp, peer)) => self.start_handshake(tcp, peer),
                    Err(error) => {
                        // Out of file descriptors and the like: wait a moment rather than spin.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = self.handshakes.join_next() => {
                    // A panic aborts the process, so every task ends with its peer.
                    let Ok((peer, connection)) = done else { continue };
                    self.handshake_ended(peer);
                    if let Some(connection) = connection {
                        return (connection, peer);
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}
