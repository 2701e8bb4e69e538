//! DNS over TCP (RFC 1035 §4.2.2: each message after its length in two bytes, RFC 7766),
//! with the bounds hickory's own listener lacks: at most [`MAX_CONNECTIONS`] open in all and
//! [`MAX_CONNECTIONS_PER_SOURCE`] from one [`Host`], a connection past either closed at once
//! rather than queued; each closed when it sends no whole query within its idle timeout,
//! and in any case at the end of its lifetime, so one that drips queries cannot keep its place
//! for ever. A connection's queries are answered one at a time, in order. A zone transfer is
//! one query answered by many messages: each must be taken within the idle timeout, all of
//! them within the lifetime (a minute moves a zone of tens of thousands of queues).

use super::tally::Limit;
use super::Service;
use hickory_server::net::xfer::Protocol;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;

/// DNS connections open at once, in all. Resolvers use TCP rarely (a truncated answer, a
/// slipped one); the cap keeps connections, and their tasks and buffers, from crowding out
/// the API in the same process.
const MAX_CONNECTIONS: usize = 256;

/// DNS connections open at once from one [`Host`], so that one client cannot take every
/// place; a resolver needs one or two.
const MAX_CONNECTIONS_PER_SOURCE: usize = 16;

/// How long to wait before accepting again after accept failed (out of file descriptors,
/// say), so that the loop does not spin while it lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How long a connection is given for things that are up to its client.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// For each whole query, and for taking each response; bytes dripped do not count.
    pub(super) idle: Duration,
    /// From accept to close, however busy.
    pub(super) lifetime: Duration,
}

impl Bounds {
    /// 5 s idle, as hickory's listener has (RFC 7766 §6.2.3 leaves it to the server, and
    /// suggests seconds); a minute in all, many more queries than a resolver sends one server
    /// at a time.
    pub(super) const DEFAULT: Bounds = Bounds {
        idle: Duration::from_secs(5),
        lifetime: Duration::from_secs(60),
    };
}

/// Why a connection ended other than by its client closing it between two messages.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectionEnd {
    #[error("no whole query sent, or response taken, within the idle timeout")]
    Idle,
    #[error("open for its whole lifetime")]
    Lifetime,
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Accepts DNS connections on `listener` within the caps, for as long as the process runs.
pub(super) async fn run(listener: TcpListener, service: Arc<Service>, bounds: Bounds) {
    let slots = Arc::new(Slots::default());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                service.tally.hit(Limit::AcceptFailed);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let slot = match Slots::take(&slots, peer.ip()) {
            Ok(slot) => slot,
            Err(refused) => {
                service.tally.hit(refused);
                // Dropped, so closed now: a client waiting in a queue would hold a descriptor.
                drop(stream);
                continue;
            }
        };
        // Each response goes out whole in one write; Nagle would hold a pipelined second.
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            let ended = serve_connection(&mut stream, peer, &service, bounds).await;
            match ended {
                Err(ConnectionEnd::Idle) => service.tally.hit(Limit::TcpIdle),
                Err(ConnectionEnd::Lifetime) => service.tally.hit(Limit::TcpLifetime),
                Ok(()) | Err(ConnectionEnd::Io(_)) => {}
            }
            // The place first, then the connection: a client that sees its connection closed
            // finds the place free.
            drop(slot);
            drop(stream);
        });
    }
}

/// Answers the queries `peer` sends on `stream` until it closes or a bound ends it.
pub(super) async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: SocketAddr,
    service: &Service,
    bounds: Bounds,
) -> Result<(), ConnectionEnd> {
    let exchange = exchange(&mut stream, peer, service, bounds.idle);
    timeout(bounds.lifetime, exchange)
        .await
        .map_err(|_| ConnectionEnd::Lifetime)?
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
    service: &Service,
    idle: Duration,
) -> Result<(), ConnectionEnd> {
    loop {
        let read = timeout(idle, read_message(stream)).await;
        let Some(query) = read.map_err(|_| ConnectionEnd::Idle)?? else {
            return Ok(());
        };
        service.pace_tcp(peer.ip()).await;
        let answered = service.answerer.answer(query, peer, Protocol::Tcp).await;
        for response in answered {
            let written = timeout(idle, write_message(stream, &response)).await;
            written.map_err(|_| ConnectionEnd::Idle)??;
        }
    }
}

/// The next message, or `None` if the client closed the connection before it began.
async fn read_message<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<Option<Vec<u8>>> {
    let mut length = [0; 2];
    if stream.read(&mut length[..1]).await? == 0 {
        return Ok(None);
    }
    stream.read_exact(&mut length[1..]).await?;
    let mut message = vec![0; u16::from_be_bytes(length).into()];
    stream.read_exact(&mut message).await?;
    Ok(Some(message))
}

async fn write_message<S: AsyncWrite + Unpin>(stream: &mut S, message: &[u8]) -> io::Result<()> {
    let length = u16::try_from(message.len()).map_err(io::Error::other)?;
    let mut framed = Vec::with_capacity(2 + message.len());
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(message);
    stream.write_all(&framed).await?;
    stream.flush().await
}

/// Where a connection comes from, for the cap per source: an IPv4 address, or the /64 an IPv6
/// address is in (one host's share of a network), as the nodes count theirs. A TCP peer's
/// address is proven by the handshake, so unlike the rate limits this counts hosts, and a
/// host's neighbours behind the same /24 keep places of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Host {
    V4([u8; 4]),
    V6([u8; 8]),
}

impl Host {
    fn of(ip: IpAddr) -> Host {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Host::V4(v4.octets()),
            IpAddr::V6(v6) => Host::V6(v6.octets()[..8].try_into().expect("8 of 16 bytes")),
        }
    }
}

/// The connections open now, in all and by host.
#[derive(Default)]
struct Slots {
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    /// Only hosts with a connection open, so at most [`MAX_CONNECTIONS`] entries.
    by_host: HashMap<Host, usize>,
}

/// One open connection's place; dropping it gives the place back.
struct Slot {
    slots: Arc<Slots>,
    host: Host,
}

impl Slots {
    /// A place for a connection from `ip`, or which cap refuses it.
    fn take(slots: &Arc<Slots>, ip: IpAddr) -> Result<Slot, Limit> {
        let host = Host::of(ip);
        let mut open = slots.open.lock().expect("never poisoned");
        if open.total >= MAX_CONNECTIONS {
            return Err(Limit::TcpFull);
        }
        let from_host = open.by_host.entry(host).or_default();
        if *from_host >= MAX_CONNECTIONS_PER_SOURCE {
            return Err(Limit::TcpSourceFull);
        }
        *from_host += 1;
        open.total += 1;
        Ok(Slot {
            slots: slots.clone(),
            host,
        })
    }

    #[cfg(test)]
    fn open(&self) -> (usize, usize) {
        let open = self.open.lock().expect("never poisoned");
        (open.total, open.by_host.len())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().expect("never poisoned");
        open.total -= 1;
        let from_host = open
            .by_host
            .get_mut(&self.host)
            .expect("a slot's host has a count");
        *from_host -= 1;
        if *from_host == 0 {
            open.by_host.remove(&self.host);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::limits::BURST;
    use crate::dns::{Nameserver, Zone};
    use std::time::Instant;
    use tokio::io::DuplexStream;

    fn service() -> Service {
        let ns = Nameserver::InZone("127.0.0.1".parse().unwrap());
        let transfers_to = vec!["192.0.2.0/24".parse().unwrap()];
        Service::new(
            Zone::new("c", "example.test", ns).unwrap(),
            transfers_to,
            None,
        )
    }

    /// A framed SOA query for the zone.
    fn query() -> Vec<u8> {
        use hickory_server::proto::op::{Message, Query};
        use hickory_server::proto::rr::{Name, RecordType};
        use std::str::FromStr;
        let mut query = Message::query();
        let name = Name::from_str("q.c.example.test.").unwrap();
        query.add_query(Query::query(name, RecordType::SOA));
        let message = query.to_vec().unwrap();
        let mut framed = (message.len() as u16).to_be_bytes().to_vec();
        framed.extend(message);
        framed
    }

    /// A connection served with `bounds` from `peer`; the client's end, and the server's task.
    fn connect(
        service: Arc<Service>,
        peer: &str,
        bounds: Bounds,
    ) -> (
        DuplexStream,
        tokio::task::JoinHandle<Result<(), ConnectionEnd>>,
    ) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let peer = peer.parse().unwrap();
        let served =
            tokio::spawn(async move { serve_connection(server, peer, &service, bounds).await });
        (client, served)
    }

    async fn ask(client: &mut DuplexStream) -> Vec<u8> {
        client.write_all(&query()).await.unwrap();
        read_message(client).await.unwrap().expect("an answer")
    }

    #[tokio::test]
    async fn queries_are_answered_in_order_until_the_client_closes() {
        let (mut client, served) = connect(Arc::new(service()), "192.0.2.1:1", Bounds::DEFAULT);
        let mut two = query();
        two.extend(query());
        client.write_all(&two).await.unwrap();
        for _ in 0..2 {
            let answer = read_message(&mut client).await.unwrap().unwrap();
            assert_eq!(answer[3] & 0x0f, 0, "NOERROR");
        }
        drop(client);
        served.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_zone_transfer_is_many_messages_then_the_connection_goes_on() {
        use crate::dns::transfer::{tests::zone, MAX_MESSAGE};
        use hickory_server::proto::rr::{Record, RecordType};
        let transfers_to = vec!["192.0.2.0/24".parse().unwrap()];
        let service = Arc::new(Service::new(zone(3000), transfers_to, None));
        let (mut client, _served) = connect(service, "192.0.2.1:1", Bounds::DEFAULT);
        let mut axfr = query();
        // The question's type, after the 2-byte length, the header and the name.
        let at = axfr.len() - 4;
        axfr[at..at + 2].copy_from_slice(&252u16.to_be_bytes());
        client.write_all(&axfr).await.unwrap();
        let mut messages = 0;
        let mut soas = 0;
        while soas < 2 {
            let message = read_message(&mut client).await.unwrap().unwrap();
            assert!(message.len() <= MAX_MESSAGE);
            let message = hickory_server::proto::op::Message::from_vec(&message).unwrap();
            let is_soa = |record: &&Record| record.record_type() == RecordType::SOA;
            soas += message.answers.iter().filter(is_soa).count();
            messages += 1;
        }
        assert!(messages > 1, "{messages} messages");
        let answer = ask(&mut client).await;
        assert_eq!(answer[3] & 0x0f, 0, "NOERROR after the transfer");
    }

    #[tokio::test]
    async fn a_connection_dripping_a_query_is_closed_after_the_idle_timeout() {
        let bounds = Bounds {
            idle: Duration::from_millis(200),
            lifetime: Duration::from_secs(60),
        };
        let (mut client, served) = connect(Arc::new(service()), "192.0.2.1:1", bounds);
        let start = Instant::now();
        // One byte every 20 ms, never the whole query.
        let query = query();
        let drip = async {
            for byte in query.iter().cycle() {
                if client.write_all(&[*byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let (ended, ()) = tokio::join!(served, drip);
        assert!(matches!(ended.unwrap(), Err(ConnectionEnd::Idle)));
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_busy_connection_is_closed_at_the_end_of_its_lifetime() {
        // The idle timeout longer than the lifetime: only the lifetime can end it.
        let bounds = Bounds {
            idle: Duration::from_secs(60),
            lifetime: Duration::from_millis(300),
        };
        let service = Arc::new(service());
        let (mut client, served) = connect(service, "192.0.2.1:1", bounds);
        let mut answered = 0;
        while client.write_all(&query()).await.is_ok() {
            match read_message(&mut client).await {
                Ok(Some(_)) => answered += 1,
                _ => break,
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(matches!(
            served.await.unwrap(),
            Err(ConnectionEnd::Lifetime)
        ));
        assert!(answered > 0);
    }

    #[tokio::test]
    async fn queries_past_the_budget_are_answered_late_not_refused() {
        let service = Arc::new(service());
        let peer = "192.0.2.1:1";
        // The source's budget spent, and a third of a second beyond it.
        let ip = peer.parse::<SocketAddr>().unwrap().ip();
        service.with_rates(|rates, now| {
            for _ in 0..BURST as usize + 30 {
                rates.tcp(ip, now);
            }
        });
        let (mut client, _served) = connect(service.clone(), peer, Bounds::DEFAULT);
        let answer = ask(&mut client).await;
        assert_eq!(answer[3] & 0x0f, 0, "NOERROR");
        let counts = service.tally.take();
        assert!(counts.contains("tcp_paced=1"), "{counts}");
    }

    #[test]
    fn connections_are_capped_in_all_and_per_host_and_give_their_place_back() {
        let slots = Arc::new(Slots::default());
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        let take = |text: &str| Slots::take(&slots, ip(text));
        let mine: Vec<Slot> = (0..MAX_CONNECTIONS_PER_SOURCE)
            .map(|_| take("192.0.2.1").unwrap())
            .collect();
        assert!(matches!(
            take("192.0.2.1").err(),
            Some(Limit::TcpSourceFull)
        ));
        assert!(matches!(
            take("::ffff:192.0.2.1").err(),
            Some(Limit::TcpSourceFull)
        ));
        let neighbour = take("192.0.2.2").unwrap();
        drop(mine);
        drop(neighbour);
        assert_eq!(slots.open(), (0, 0));

        let v6: Vec<Slot> = (0..MAX_CONNECTIONS_PER_SOURCE)
            .map(|n| take(&format!("2001:db8:0:1:{n:x}::1")).unwrap())
            .collect();
        assert!(matches!(
            take("2001:db8:0:1:ffff::1").err(),
            Some(Limit::TcpSourceFull)
        ));
        assert!(take("2001:db8:0:2::1").is_ok());
        drop(v6);

        let hosts = MAX_CONNECTIONS / MAX_CONNECTIONS_PER_SOURCE;
        let all: Vec<Slot> = (0..MAX_CONNECTIONS)
            .map(|n| take(&format!("10.0.0.{}", n % hosts)).unwrap())
            .collect();
        assert!(matches!(take("203.0.113.1").err(), Some(Limit::TcpFull)));
        drop(all);
        assert_eq!(slots.open(), (0, 0));
        assert!(take("203.0.113.1").is_ok());
    }
}
