//! The control plane's DNS under abuse, with the real binary: TCP connections past the caps are
//! closed at once, idle ones after the idle timeout, and a UDP flood from one source is mostly
//! dropped (some answers slipped truncated) while other sources, TCP and the API are served.
//!
//! Sources are loopback addresses (127.0.0.0/8 all reach the server on Linux). The server caps
//! TCP connections per address, but its rate limits count networks (IPv4 /24s), so sources
//! meant to have budgets of their own differ in their third byte.

use qe_tests::{http, ControlPlane, PROMPT};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UdpSocket};
use tokio::time::timeout;

const DNS: &str = "dns_listen = \"127.0.0.1:0\"\n";

/// The zone of a control plane with `cluster = "test"` and the default domain.
const ZONE: &str = "q.test.thequeueexpert.com";

/// DNS TCP connections the server keeps open from one address, and in all.
const PER_SOURCE: usize = 16;
const IN_ALL: usize = 256;

/// The budget the server gives one source network: a burst of 100 answers, then 100 a second.
const BURST: f64 = 100.0;
const RATE: f64 = 100.0;

/// The server's idle timeout is 5 s; a connection still open this long after it was left idle
/// was never going to be closed.
const IDLE_BOUND: Duration = Duration::from_secs(30);

/// A query for the zone's SOA with `id`: one question, recursion not desired, no EDNS.
fn query(id: u16) -> Vec<u8> {
    let mut message = id.to_be_bytes().to_vec();
    message.extend([0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in ZONE.split('.') {
        message.push(label.len() as u8);
        message.extend(label.as_bytes());
    }
    message.extend([0, 0, 6, 0, 1]);
    message
}

/// [`query`] as sent over TCP, after its length in two bytes.
fn framed(id: u16) -> Vec<u8> {
    let message = query(id);
    let mut framed = (message.len() as u16).to_be_bytes().to_vec();
    framed.extend(message);
    framed
}

/// What a response's header says.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reply {
    id: u16,
    truncated: bool,
    rcode: u8,
    answers: u16,
}

impl Reply {
    fn read(bytes: &[u8]) -> Reply {
        assert!(bytes.len() >= 12, "a header: {bytes:?}");
        Reply {
            id: u16::from_be_bytes([bytes[0], bytes[1]]),
            truncated: bytes[2] & 0x02 != 0,
            rcode: bytes[3] & 0x0f,
            answers: u16::from_be_bytes([bytes[6], bytes[7]]),
        }
    }

    /// The zone's SOA, whole.
    fn is_answer(&self) -> bool {
        self.rcode == 0 && !self.truncated && self.answers == 1
    }

    /// Slipped: truncated and empty, to make a resolver ask again over TCP.
    fn is_slip(&self) -> bool {
        self.truncated && self.answers == 0
    }
}

/// What came of a query over TCP.
#[derive(Debug, PartialEq)]
enum Outcome {
    Answered(Reply),
    /// The server closed the connection without answering.
    Closed,
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

async fn connect_from(source: &str, dns: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(ip(source), 0)).unwrap();
    socket.connect(dns).await.unwrap()
}

/// Asks over `stream`; a connection the server closes (or resets) answers `Closed`.
async fn ask_tcp(stream: &mut TcpStream, id: u16) -> Outcome {
    let exchange = async {
        stream.write_all(&framed(id)).await?;
        let mut length = [0; 2];
        stream.read_exact(&mut length).await?;
        let mut reply = vec![0; u16::from_be_bytes(length).into()];
        stream.read_exact(&mut reply).await?;
        io::Result::Ok(Reply::read(&reply))
    };
    match timeout(PROMPT, exchange)
        .await
        .expect("an answer or a close")
    {
        Ok(reply) => Outcome::Answered(reply),
        Err(error) if closed(&error) => Outcome::Closed,
        Err(error) => panic!("{error}"),
    }
}

fn closed(error: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        error.kind(),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted
    )
}

/// Asks over a new connection from `source`.
async fn ask_tcp_from(source: &str, dns: SocketAddr, id: u16) -> Outcome {
    ask_tcp(&mut connect_from(source, dns).await, id).await
}

fn assert_answered(outcome: Outcome, id: u16) {
    match outcome {
        Outcome::Answered(reply) => {
            assert!(reply.is_answer(), "{reply:?}");
            assert_eq!(reply.id, id);
        }
        Outcome::Closed => panic!("query {id} was not answered"),
    }
}

/// Waits until the server closes `stream` (bounded by `within`); panics if it sends anything.
async fn closed_by_server(stream: &mut TcpStream, within: Duration) {
    let mut byte = [0; 1];
    match timeout(within, stream.read(&mut byte)).await {
        Ok(Ok(0)) => {}
        Ok(Err(error)) if closed(&error) => {}
        Ok(other) => panic!("not closed: {other:?}"),
        Err(_) => panic!("still open after {within:?}"),
    }
}

/// Asks over UDP from `socket`, waiting for the reply with this `id`.
async fn ask_udp(socket: &UdpSocket, dns: SocketAddr, id: u16) -> Reply {
    socket.send_to(&query(id), dns).await.unwrap();
    let mut buffer = [0; 4096];
    loop {
        let received = timeout(PROMPT, socket.recv(&mut buffer)).await;
        let length = received.expect("a reply").unwrap();
        let reply = Reply::read(&buffer[..length]);
        if reply.id == id {
            return reply;
        }
    }
}

#[tokio::test]
async fn tcp_connections_from_one_address_past_its_cap_are_closed_at_once_others_served() {
    let cp = ControlPlane::start_with(DNS);
    let dns = cp.dns.expect("a DNS server");
    let mut held = Vec::new();
    for id in 0..PER_SOURCE as u16 {
        let mut stream = connect_from("127.0.1.1", dns).await;
        assert_answered(ask_tcp(&mut stream, id).await, id);
        held.push(stream);
    }

    let mut over = connect_from("127.0.1.1", dns).await;
    assert_eq!(ask_tcp(&mut over, 100).await, Outcome::Closed);
    // A neighbour (in the same /24) has places of its own.
    assert_answered(ask_tcp_from("127.0.1.2", dns, 101).await, 101);
    // Those it kept are served still.
    for (id, stream) in (200..).zip(held.iter_mut()) {
        assert_answered(ask_tcp(stream, id).await, id);
    }

    // A connection the client closes gives its place back.
    let mut leaving = held.pop().unwrap();
    leaving.shutdown().await.unwrap();
    closed_by_server(&mut leaving, PROMPT).await;
    // The server gives the place back before it closes its end.
    match ask_tcp_from("127.0.1.1", dns, 300).await {
        Outcome::Answered(reply) => assert!(reply.is_answer()),
        Outcome::Closed => panic!("the place was not given back"),
    }
}

#[tokio::test]
async fn tcp_connections_past_the_cap_in_all_are_closed_at_once_and_udp_is_still_served() {
    let cp = ControlPlane::start_with(DNS);
    let dns = cp.dns.expect("a DNS server");
    let mut held = Vec::new();
    for n in 0..IN_ALL {
        let source = format!("127.1.{}.1", n / PER_SOURCE);
        let mut stream = connect_from(&source, dns).await;
        let id = n as u16;
        assert_answered(ask_tcp(&mut stream, id).await, id);
        held.push(stream);
    }

    assert_eq!(ask_tcp_from("127.2.0.1", dns, 1000).await, Outcome::Closed);
    let udp = UdpSocket::bind("127.2.0.1:0").await.unwrap();
    assert!(ask_udp(&udp, dns, 1001).await.is_answer());
}

#[tokio::test]
async fn a_tcp_connection_sending_no_whole_query_is_closed_after_the_idle_timeout() {
    let cp = ControlPlane::start_with(DNS);
    let dns = cp.dns.expect("a DNS server");
    let mut idle = connect_from("127.0.1.1", dns).await;
    let mut dripping = connect_from("127.0.1.1", dns).await;
    let framed = framed(1);

    // One byte every half second: the whole query would take longer than the idle timeout.
    let drip = async {
        for (sent, byte) in framed.iter().enumerate() {
            if dripping.write_all(&[*byte]).await.is_err() {
                return sent;
            }
            let mut reply = [0; 1];
            match timeout(Duration::from_millis(500), dripping.read(&mut reply)).await {
                Err(_) => continue,
                Ok(Ok(0)) => return sent + 1,
                Ok(Err(error)) if closed(&error) => return sent + 1,
                Ok(other) => panic!("answered a query never finished: {other:?}"),
            }
        }
        framed.len()
    };
    let (sent, ()) = tokio::join!(drip, closed_by_server(&mut idle, IDLE_BOUND));
    assert!(sent < framed.len(), "closed only once the query was whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udp_flood_from_one_source_is_mostly_dropped_while_others_are_served() {
    const ROUNDS: u16 = 20;
    const PER_ROUND: u16 = 150;
    let cp = ControlPlane::start_with(DNS);
    let dns = cp.dns.expect("a DNS server");
    let flood = Arc::new(UdpSocket::bind("127.0.3.1:0").await.unwrap());
    let victim = UdpSocket::bind("127.0.4.1:0").await.unwrap();
    let flooded = Arc::new(AtomicBool::new(false));
    let replies = tokio::spawn(count_replies(flood.clone(), flooded.clone()));

    let start = Instant::now();
    let mut sent = 0u16;
    for round in 0..ROUNDS {
        // A round's flood, then a query from elsewhere behind it: the server has read the flood
        // when it answers, so its socket never holds more than a round.
        for _ in 0..PER_ROUND {
            flood.send_to(&query(sent), dns).await.unwrap();
            sent += 1;
        }
        let reply = ask_udp(&victim, dns, round).await;
        assert!(reply.is_answer(), "round {round}: {reply:?}");
        if round % 5 == 0 {
            let id = 10_000 + round;
            assert_answered(ask_tcp_from("127.0.5.1", dns, id).await, id);
            let (status, _) = http(cp.addr, "GET", "/healthz", None, None).await;
            assert_eq!(status, 200, "the API during the flood");
        }
    }
    let elapsed = start.elapsed();
    flooded.store(true, Ordering::Relaxed);
    let (answers, slips) = replies.await.unwrap();

    // The most a source's budget allows while the server read the flood (within `elapsed`),
    // and one for rounding.
    let allowed = BURST as usize + (RATE * elapsed.as_secs_f64()).ceil() as usize + 1;
    let sent = sent as usize;
    assert!(answers <= allowed, "{answers} answers to {sent} queries");
    assert!(slips > 0, "no query slipped");
    assert!(answers + slips < sent, "none dropped: {answers} + {slips}");

    let log = cp.wait_for_log("dns limits hit", 1);
    let lines = log.lines().filter(|line| line.contains("dns limits hit"));
    assert!(lines.count() < 5, "logged per interval:\n{log}");
    assert!(!log.contains("127.0.3.1"), "logged per packet:\n{log}");
}

/// Counts the replies `socket` gets, (whole answers, slips), until `done` is set and the replies
/// stop.
async fn count_replies(socket: Arc<UdpSocket>, done: Arc<AtomicBool>) -> (usize, usize) {
    let (mut answers, mut slips) = (0, 0);
    let mut buffer = [0; 4096];
    loop {
        match timeout(Duration::from_secs(1), socket.recv(&mut buffer)).await {
            Ok(received) => {
                let reply = Reply::read(&buffer[..received.unwrap()]);
                answers += usize::from(reply.is_answer());
                slips += usize::from(reply.is_slip());
            }
            Err(_) if done.load(Ordering::Relaxed) => return (answers, slips),
            Err(_) => {}
        }
    }
}
