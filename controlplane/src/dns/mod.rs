//! The authoritative DNS for `q.CLUSTER.DOMAIN`, on UDP and TCP at one address. It answers
//! anyone without credentials, in the process that also serves the operator's API, so every
//! way in is bounded: a flood from one source slows that source only.
//!
//! - [`zone`]: the records, rebuilt whole from the queues' records on every change.
//! - [`answer`]: one query's bytes in, its response's bytes out, through hickory's catalog
//!   (or, for a zone transfer, [`transfer`]).
//! - [`limits`]: each source network's budget of responses (RRL-style token buckets, slip).
//! - [`udp`]: the datagram listener; over its budget a source's queries are dropped or
//!   answered truncated.
//! - [`tcp`]: the stream listener, with caps on connections in all and per source, and an
//!   idle timeout and a lifetime for each.
//! - [`tally`]: counts the limits hit, logged once per interval, never once per packet.
//! - [`transfer`]: zone transfers (AXFR, and IXFR as AXFR) over TCP to the secondaries in
//!   `dns_transfer_allow`, in messages under 64 KiB.
//! - [`notify`]: tells the secondaries in `dns_notify` each time the serial moves (NOTIFY).
//! - [`tsig`]: signs what passes between us and the secondaries with a shared key, and checks
//!   what they sign (`[dns_tsig]`).
//! - [`served`]: which DNS-01 values each replica serves, so that a CA is told to validate
//!   only once all do.
//!
//! hickory's own `Server` is not used: its TCP listener has no connection cap, its UDP one
//! answers everything, and it logs every request.

mod answer;
mod limits;
mod notify;
pub mod served;
mod tally;
mod tcp;
mod transfer;
mod tsig;
mod udp;
mod zone;

pub use transfer::{Cidr, CidrError};
pub use tsig::{TsigKey, TsigKeyError};
pub use zone::{Nameserver, Zone};

use answer::Answerer;
use limits::{RateTable, Verdict};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use tally::{Limit, Tally};

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("{0:?} is not a DNS name")]
    Name(String),
    #[error("the zone needs a name server's name")]
    NoNameserver,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The secondaries outside the control plane that keep copies of the zone.
#[derive(Debug, Clone, Default)]
pub struct Secondaries {
    /// The sources zone transfers go to (`dns_transfer_allow`); none when empty.
    pub allow: Vec<Cidr>,
    /// Where a NOTIFY goes each time the serial moves (`dns_notify`).
    pub notify: Vec<SocketAddr>,
    /// The key transfers must be signed with, and NOTIFYs are (`[dns_tsig]`).
    pub key: Option<TsigKey>,
}

/// Serves `zone` on UDP and TCP at `addr` until the process ends, with transfers to and
/// NOTIFY for `secondaries`; returns the bound address.
pub async fn serve(
    zone: Arc<Zone>,
    addr: SocketAddr,
    secondaries: Secondaries,
) -> Result<SocketAddr, DnsError> {
    let (udp, tcp) = bind(addr).await?;
    let bound = udp.local_addr()?;
    if let Err(error) = udp::enlarge_receive_buffer(&udp) {
        tracing::warn!(%error, "the DNS socket keeps its default receive buffer");
    }
    let key = secondaries.key;
    notify::spawn(
        &zone,
        secondaries.notify,
        key.clone(),
        notify::Schedule::DEFAULT,
    );
    let service = Arc::new(Service::new(zone, secondaries.allow, key));
    tokio::spawn(udp::run(udp, service.clone()));
    tokio::spawn(tcp::run(tcp, service.clone(), tcp::Bounds::DEFAULT));
    tokio::spawn(tally::report(service));
    Ok(bound)
}

/// What the UDP and TCP listeners share.
struct Service {
    /// Answers from whichever zone is current.
    answerer: Answerer,
    /// Each source network's budget of responses, UDP and TCP alike. A std mutex: it is held
    /// for one bucket's arithmetic, never across an `.await`.
    rates: Mutex<RateTable>,
    /// The limits hit since the last log line.
    tally: Tally,
}

impl Service {
    fn new(zone: Arc<Zone>, transfers_to: Vec<Cidr>, key: Option<tsig::TsigKey>) -> Service {
        Service {
            answerer: Answerer::new(zone, transfers_to, key),
            rates: Mutex::default(),
            tally: Tally::default(),
        }
    }

    /// Whether a UDP query from `ip` is answered, answered truncated or dropped.
    fn udp_verdict(&self, ip: IpAddr) -> Verdict {
        self.with_rates(|rates, now| rates.udp(ip, now))
    }

    /// Charges a TCP query from `ip` to its source's budget and waits until the budget covers
    /// it. TCP is slowed, not refused: its source address is proven, and it is where a slipped
    /// UDP answer sends a real resolver.
    async fn pace_tcp(&self, ip: IpAddr) {
        let wait = self.with_rates(|rates, now| rates.tcp(ip, now));
        if !wait.is_zero() {
            self.tally.hit(Limit::TcpPaced);
            tokio::time::sleep(wait).await;
        }
    }

    fn with_rates<T>(&self, decide: impl FnOnce(&mut RateTable, std::time::Instant) -> T) -> T {
        // Tokio's clock, so that tests that pause time pause the buckets' refill too.
        let now = tokio::time::Instant::now().into_std();
        let mut rates = self.rates.lock().expect("never poisoned");
        let decided = decide(&mut rates, now);
        self.tally.add(Limit::SourceEvicted, rates.take_evicted());
        decided
    }
}

/// A UDP socket and a TCP listener on one address, so one address answers both. Port 0 picks
/// a port free for both.
async fn bind(
    addr: SocketAddr,
) -> std::io::Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let mut tries = 0;
    loop {
        let udp = tokio::net::UdpSocket::bind(addr).await?;
        let port = udp.local_addr()?.port();
        match tokio::net::TcpListener::bind((addr.ip(), port)).await {
            Ok(tcp) => return Ok((udp, tcp)),
            // Taken on TCP only: another port, if it was ours to pick.
            Err(_) if addr.port() == 0 && tries < 20 => tries += 1,
            Err(error) => return Err(error),
        }
    }
}

/// An address on `ip` whose port is free on both UDP and TCP now (for a CA that must be told
/// where our DNS answers before it starts).
pub async fn free_addr(ip: std::net::IpAddr) -> std::io::Result<SocketAddr> {
    let (udp, _tcp) = bind(SocketAddr::new(ip, 0)).await?;
    udp.local_addr()
}
