//! NOTIFY (RFC 1996): each time the zone's serial moves, the secondaries in `dns_notify` are
//! told over UDP, so they fetch the zone now rather than at their next refresh (the SOA asks
//! for one an hour). We are the primary: NOTIFY sent to us is not ours to act on.
//!
//! One task per secondary. It sends a NOTIFY (opcode NOTIFY, AA, the zone's SOA as the
//! question and, as RFC 1996 §3.7 allows, the new SOA as the answer) and sends it again, after
//! waiting twice as long each time, until a response comes back or its tries are spent
//! ([`Schedule`]). It then pauses before looking for the next change, so a burst of changes (a
//! batch of queues created) makes one more NOTIFY, with the latest serial, not one per change.
//!
//! With a TSIG key (`[dns_tsig]`), each NOTIFY is signed with it and only a response signed
//! with it counts: any other is passed over as a stranger's datagram would be.

use super::tsig::{self, TsigKey};
use super::zone::{Snapshot, Zone};
use hickory_server::proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_server::proto::rr::{Record, RecordType};
use hickory_server::proto::serialize::binary::{BinDecodable, BinDecoder};
use hickory_server::proto::ProtoError;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout_at, Instant};

/// When NOTIFYs go to one secondary.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    /// NOTIFYs sent for one serial before giving up on the secondary until the next.
    tries: u32,
    /// How long the first waits for its response; each retry waits twice as long as the one
    /// before.
    first_wait: Duration,
    /// The least time between two serials' NOTIFYs: the changes within it go out together.
    pause: Duration,
}

impl Schedule {
    /// 5 tries, RFC 1996 §3.6's suggestion, over 1 + 2 + 4 + 8 + 16 s: long enough for a
    /// secondary that restarts (one missed refreshes anyway, at the SOA's refresh interval).
    /// A second between serials.
    pub(super) const DEFAULT: Schedule = Schedule {
        tries: 5,
        first_wait: Duration::from_secs(1),
        pause: Duration::from_secs(1),
    };
}

/// Why a secondary was not told of a serial.
#[derive(Debug, thiserror::Error)]
enum NotifyError {
    #[error("no response to {0} NOTIFYs")]
    Unanswered(u32),
    #[error("the secondary answered {0}")]
    Refused(ResponseCode),
    #[error("the NOTIFY could not be encoded: {0}")]
    Encode(#[from] ProtoError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Tells each of `secondaries` of every new serial of `zone`, for as long as the process runs,
/// signing with `key` if there is one.
pub(super) fn spawn(
    zone: &Zone,
    secondaries: Vec<SocketAddr>,
    key: Option<TsigKey>,
    schedule: Schedule,
) {
    for secondary in secondaries {
        let told = Told {
            secondary,
            key: key.clone(),
            schedule,
        };
        tokio::spawn(keep_told(zone.watch(), told));
    }
}

/// One secondary, and how it is told.
struct Told {
    secondary: SocketAddr,
    key: Option<TsigKey>,
    schedule: Schedule,
}

/// Tells a secondary of the zone's serial now (after a restart it may hold an older one), then
/// of each one after it.
async fn keep_told(mut zone: watch::Receiver<Snapshot>, told: Told) {
    let Told {
        secondary,
        schedule,
        ..
    } = told;
    loop {
        let (soa, serial) = {
            let now = zone.borrow_and_update();
            (now.soa().clone(), now.serial)
        };
        match notify(&soa, &told).await {
            Ok(()) => tracing::info!(%secondary, serial, "NOTIFY answered"),
            Err(error) => tracing::warn!(%secondary, serial, %error, "NOTIFY failed"),
        }
        tokio::time::sleep(schedule.pause).await;
        if zone.changed().await.is_err() {
            return;
        }
    }
}

/// Sends the secondary a NOTIFY of `soa` until it answers, as many times as its schedule tries.
async fn notify(soa: &Record, told: &Told) -> Result<(), NotifyError> {
    let Told {
        secondary,
        key,
        schedule,
    } = told;
    let secondary = *secondary;
    let any: IpAddr = match secondary {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind((any, 0)).await?;
    // Connected: datagrams from anyone else are not received.
    socket.connect(secondary).await?;
    let id = u16::from_le_bytes(qe_shared::random::bytes());
    let mut message = notify_message(id, soa).to_vec()?;
    let signed = key.as_ref().map(|key| {
        (
            key,
            tsig::sign_request(&mut message, key, crate::unix_now()),
        )
    });
    let mut wait = schedule.first_wait;
    for _ in 0..schedule.tries {
        let deadline = Instant::now() + wait;
        // A failed send counts as a NOTIFY lost.
        let _ = socket.send(&message).await;
        let response = response_to(&socket, id, signed.as_ref().map(|(k, m)| (*k, &m[..])));
        match timeout_at(deadline, response).await {
            Ok(Ok(ResponseCode::NoError)) => return Ok(()),
            Ok(Ok(code)) => return Err(NotifyError::Refused(code)),
            // Nobody listening there yet (ICMP port unreachable): as good as no answer.
            Ok(Err(_)) => sleep_until(deadline).await,
            Err(_) => {}
        }
        wait *= 2;
    }
    Err(NotifyError::Unanswered(schedule.tries))
}

/// A NOTIFY for the zone whose SOA is `soa` (RFC 1996 §3.7).
fn notify_message(id: u16, soa: &Record) -> Message {
    let mut message = Message::new(id, MessageType::Query, OpCode::Notify);
    message.metadata.authoritative = true;
    message.add_query(Query::query(soa.name.clone(), RecordType::SOA));
    message.add_answer(soa.clone());
    message
}

/// The response code of the next NOTIFY response `id` that arrives on `socket`, signed with
/// the key against the request's MAC when `signed` gives them; other datagrams are passed over.
async fn response_to(
    socket: &UdpSocket,
    id: u16,
    signed: Option<(&TsigKey, &[u8])>,
) -> io::Result<ResponseCode> {
    // Room for a signed response with long names (a plain one is far under 512 bytes).
    let mut buffer = [0; 4096];
    loop {
        let length = socket.recv(&mut buffer).await?;
        let mut decoder = BinDecoder::new(&buffer[..length]);
        let Ok(header) = hickory_server::proto::op::Header::read(&mut decoder) else {
            continue;
        };
        let metadata = header.metadata;
        let ours = metadata.id == id && metadata.op_code == OpCode::Notify;
        let verified = signed.is_none_or(|(key, request_mac)| {
            tsig::verify_response(&buffer[..length], key, request_mac, crate::unix_now())
        });
        if ours && metadata.message_type == MessageType::Response && verified {
            return Ok(metadata.response_code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::Nameserver;
    use std::sync::Arc;

    /// Quick, for tests in real time: two tries, 100 then 200 ms.
    const QUICK: Schedule = Schedule {
        tries: 2,
        first_wait: Duration::from_millis(100),
        pause: Duration::from_millis(100),
    };

    /// Longer than anything [`QUICK`] waits for.
    const QUIET: Duration = Duration::from_millis(800);

    /// A change the zone shows (a DNS-01 value not served before): its serial moves.
    fn change(zone: &Zone) {
        static VALUES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let value = VALUES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        zone.add_challenges(&[("abc.q.c.example.test".into(), value.to_string())]);
    }

    fn zone() -> Arc<Zone> {
        let ns = Nameserver::Named(vec!["ns1.example.net".into()]);
        Zone::new("c", "example.test", ns).unwrap()
    }

    /// A secondary on loopback, which answers when the test says.
    struct Secondary {
        socket: UdpSocket,
    }

    impl Secondary {
        /// Listening, and told of `zone`'s serials.
        async fn start(zone: &Zone) -> Secondary {
            let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            spawn(zone, vec![socket.local_addr().unwrap()], None, QUICK);
            Secondary { socket }
        }

        /// The next NOTIFY, and where it came from.
        async fn receive(&self) -> (Message, SocketAddr) {
            let received = tokio::time::timeout(Duration::from_secs(10), self.next());
            received.await.expect("a NOTIFY")
        }

        /// Whether nothing comes for longer than a NOTIFY would take to.
        async fn is_quiet(&self) -> bool {
            tokio::time::timeout(QUIET, self.next()).await.is_err()
        }

        async fn next(&self) -> (Message, SocketAddr) {
            let mut buffer = [0; 512];
            let (length, from) = self.socket.recv_from(&mut buffer).await.unwrap();
            (Message::from_vec(&buffer[..length]).unwrap(), from)
        }

        async fn answer(&self, notify: &Message, from: SocketAddr, code: ResponseCode) {
            let mut response = Message::response(notify.metadata.id, OpCode::Notify);
            response.metadata.response_code = code;
            response.add_queries(notify.queries.clone());
            let bytes = response.to_vec().unwrap();
            self.socket.send_to(&bytes, from).await.unwrap();
        }
    }

    fn serial_of(notify: &Message) -> u32 {
        match &notify.answers[0].data {
            hickory_server::proto::rr::RData::SOA(soa) => soa.serial,
            other => panic!("a SOA, not {other}"),
        }
    }

    #[tokio::test]
    async fn a_notify_names_the_zone_and_is_sent_again_until_answered() {
        let zone = zone();
        let secondary = Secondary::start(&zone).await;
        let (first, from) = secondary.receive().await;
        assert_eq!(first.metadata.op_code, OpCode::Notify);
        assert_eq!(first.metadata.message_type, MessageType::Query);
        assert!(first.metadata.authoritative);
        assert_eq!(first.queries[0].name().to_string(), "q.c.example.test.");
        assert_eq!(first.queries[0].query_type(), RecordType::SOA);
        assert_eq!(serial_of(&first), zone.snapshot().serial);
        // Unanswered: sent again, the same.
        let (again, _) = secondary.receive().await;
        assert_eq!(again.metadata.id, first.metadata.id);
        secondary.answer(&again, from, ResponseCode::NoError).await;

        // Answered: nothing more until the serial moves.
        assert!(secondary.is_quiet().await, "no NOTIFY without a change");
        change(&zone);
        let (next, _) = secondary.receive().await;
        assert_eq!(serial_of(&next), zone.snapshot().serial);
    }

    #[tokio::test]
    async fn a_burst_of_changes_makes_one_notify_with_the_latest_serial() {
        let zone = zone();
        let secondary = Secondary::start(&zone).await;
        let (first, from) = secondary.receive().await;
        for _ in 0..50 {
            change(&zone);
        }
        secondary.answer(&first, from, ResponseCode::NoError).await;
        let (next, from) = secondary.receive().await;
        assert_eq!(serial_of(&next), zone.snapshot().serial, "the latest");
        secondary.answer(&next, from, ResponseCode::NoError).await;
        assert!(secondary.is_quiet().await, "one NOTIFY for the burst");
    }

    #[tokio::test]
    async fn a_secondary_that_never_answers_or_refuses_is_given_up_until_the_next_serial() {
        let zone = zone();
        let secondary = Secondary::start(&zone).await;
        for _ in 0..QUICK.tries {
            secondary.receive().await;
        }
        assert!(secondary.is_quiet().await, "given up after its tries");
        change(&zone);
        let (refused, from) = secondary.receive().await;
        secondary
            .answer(&refused, from, ResponseCode::Refused)
            .await;
        assert!(secondary.is_quiet().await, "a refusal is an answer");
    }

    #[tokio::test]
    async fn a_secondary_not_listening_yet_is_told_once_it_is() {
        // A port with nobody on it: the first NOTIFY meets ICMP port unreachable.
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        drop(socket);
        let zone = zone();
        spawn(&zone, vec![addr], None, QUICK);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let secondary = Secondary {
            socket: UdpSocket::bind(addr).await.unwrap(),
        };
        let (retry, _) = secondary.receive().await;
        assert_eq!(serial_of(&retry), zone.snapshot().serial);
    }
}
