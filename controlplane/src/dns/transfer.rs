//! Zone transfers to the secondaries an operator adds outside the control plane: AXFR
//! (RFC 5936), and IXFR (RFC 1995) answered with the whole zone in AXFR form, which RFC 1995
//! §4 allows a server to send instead of the differences (we keep no history of versions).
//! Only sources in `dns_transfer_allow` get one; the others get REFUSED.
//!
//! The access control is by source address (over TCP the handshake proves it) and, with
//! `[dns_tsig]`, by a key too: [`tsig`](super::tsig) checks the request's signature and signs
//! each message of the transfer.
//!
//! hickory's catalog answers AXFR itself in one message (its handler's `AxfrPolicy` is
//! all or nothing, and a zone of thousands of queues does not fit in 64 KiB), so transfers
//! never reach it: they are answered here from the zone's records as last built, SOA first,
//! then every other record, then the SOA again, over as many messages as it takes.

use super::zone::Snapshot;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{Message, Metadata, OpCode, Query, ResponseCode};
use hickory_server::proto::rr::{DNSClass, LowerName, RData, Record, RecordType};
use hickory_server::proto::serialize::binary::BinEncodable;
use hickory_server::proto::ProtoError;
use hickory_server::server::Request;
use std::net::IpAddr;
use std::str::FromStr;

/// The most a transfer's message holds, in bytes. Far under the 65535 a DNS message over TCP
/// can have, so a record never pushes one over; and small, so that each message is written
/// well within the connection's idle timeout even to a slow secondary.
pub(super) const MAX_MESSAGE: usize = 16 * 1024;

/// A DNS message's header, in bytes.
const HEADER: usize = 12;

/// A block of source addresses in CIDR notation: `192.0.2.0/24`, `2001:db8::/32`, or an
/// address alone for that address only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct Cidr {
    /// The block's first address: its bits past `length` are zero.
    network: IpAddr,
    /// How many leading bits an address shares with `network` to be in the block.
    length: u8,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("{0:?} is not an IP address, nor one with a prefix length (`192.0.2.0/24`)")]
    Address(String),
    #[error("{0:?}: the prefix length is not a number of bits the address has")]
    Length(String),
    #[error("{0:?} has bits set past its prefix length: the block starts at {1}")]
    HostBits(String, IpAddr),
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Cidr, CidrError> {
        let (address, length) = match text.split_once('/') {
            Some((address, length)) => (address, Some(length)),
            None => (text, None),
        };
        let network: IpAddr = address
            .parse()
            .map_err(|_| CidrError::Address(text.into()))?;
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let length = match length {
            None => bits,
            Some(length) => length
                .parse()
                .ok()
                .filter(|length| *length <= bits)
                .ok_or_else(|| CidrError::Length(text.into()))?,
        };
        let block = Cidr { network, length };
        let start = block.first_of(network);
        if start != network {
            return Err(CidrError::HostBits(text.into(), start));
        }
        Ok(block)
    }
}

impl TryFrom<String> for Cidr {
    type Error = CidrError;

    fn try_from(text: String) -> Result<Cidr, CidrError> {
        text.parse()
    }
}

impl Cidr {
    /// Whether `ip` is in the block. An IPv4 client reaching a dual-stack socket (as
    /// `::ffff:a.b.c.d`) counts as its IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.network.is_ipv4() && self.first_of(ip) == self.network
    }

    /// The first address of the block of `self.length` bits that `ip` is in.
    fn first_of(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.length));
                IpAddr::V4((v4.to_bits() & mask.unwrap_or(0)).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.length));
                IpAddr::V6((v6.to_bits() & mask.unwrap_or(0)).into())
            }
        }
    }
}

/// Whether a zone transfer may go to `ip`.
pub(super) fn allowed(allow: &[Cidr], ip: IpAddr) -> bool {
    allow.iter().any(|block| block.contains(ip))
}

/// Whether `request` asks for a zone transfer (AXFR or IXFR), which [`respond`] answers
/// rather than the catalog.
pub(super) fn is_transfer(request: &Request) -> bool {
    let asked = request.queries.queries();
    let transfer =
        |query: &Query| matches!(query.query_type(), RecordType::AXFR | RecordType::IXFR);
    request.metadata.op_code == OpCode::Query && asked.len() == 1 && transfer(asked[0].original())
}

/// The messages answering the transfer `request`, from the zone as `zone` has it.
/// `permitted` says whether its source may have the zone.
pub(super) fn respond(
    request: &Request,
    zone: &Snapshot,
    permitted: bool,
) -> Result<Vec<Vec<u8>>, ProtoError> {
    let query = request.queries.queries()[0].original();
    let mut metadata = Metadata::response_from_request(&request.metadata);
    if !permitted {
        metadata.response_code = ResponseCode::Refused;
        return Ok(vec![message(metadata, Some(query), []).to_vec()?]);
    }
    if !is_apex(query, zone) {
        // Not a zone of ours (RFC 5936 §2.2.1): a name inside it is no zone's apex.
        metadata.response_code = ResponseCode::NotAuth;
        return Ok(vec![message(metadata, Some(query), []).to_vec()?]);
    }
    metadata.authoritative = true;
    let over_udp = request.protocol() == Protocol::Udp;
    if query.query_type() == RecordType::IXFR && (over_udp || up_to_date(request, zone)) {
        // RFC 1995 §2: the current SOA alone tells a secondary over UDP to ask over TCP,
        // and one that is up to date that it is.
        return Ok(vec![
            message(metadata, Some(query), [zone.soa().clone()]).to_vec()?
        ]);
    }
    if over_udp {
        // AXFR over UDP is undefined (RFC 5936 §4.2): truncated, which says to ask over TCP.
        metadata.truncation = true;
        metadata.authoritative = false;
        return Ok(vec![message(metadata, Some(query), []).to_vec()?]);
    }
    messages(metadata, query, zone)
}

/// The zone in AXFR form: the SOA, every other record, the SOA again, in messages of at
/// most [`MAX_MESSAGE`] bytes. The first holds the question; RFC 5936 §2.2.2 lets the others
/// leave it out.
pub(super) fn messages(
    metadata: Metadata,
    query: &Query,
    zone: &Snapshot,
) -> Result<Vec<Vec<u8>>, ProtoError> {
    let soa = std::iter::once(zone.soa());
    let records = soa.clone().chain(zone.others()).chain(soa);
    let mut messages = Vec::new();
    let mut current = message(metadata, Some(query), []);
    let mut size = HEADER + query.to_bytes()?.len();
    for record in records {
        // Its size alone, with no earlier name to point to: in the message, where names
        // compress against the ones before, it takes no more.
        let record_size = record.to_bytes()?.len();
        if !current.answers.is_empty() && size + record_size > MAX_MESSAGE {
            messages.push(current.to_vec()?);
            current = message(metadata, None, []);
            size = HEADER;
        }
        current.add_answer(record.clone());
        size += record_size;
    }
    messages.push(current.to_vec()?);
    Ok(messages)
}

fn message(
    metadata: Metadata,
    query: Option<&Query>,
    answers: impl IntoIterator<Item = Record>,
) -> Message {
    let mut message = Message::response(metadata.id, metadata.op_code);
    message.metadata = metadata;
    message.queries.extend(query.cloned());
    message.add_answers(answers);
    message
}

/// Whether `query` names the zone itself, in its class.
fn is_apex(query: &Query, zone: &Snapshot) -> bool {
    let origin = LowerName::new(&zone.soa().name);
    query.query_class() == DNSClass::IN && LowerName::new(query.name()) == origin
}

/// Whether the IXFR `request` comes from a secondary whose serial (the SOA in its authority
/// section, RFC 1995 §3) is ours or later.
fn up_to_date(request: &Request, zone: &Snapshot) -> bool {
    let theirs = request
        .authorities
        .iter()
        .find_map(|record| match &record.data {
            RData::SOA(soa) => Some(soa.serial),
            _ => None,
        });
    theirs.is_some_and(|theirs| serial_at_least(theirs, zone.serial))
}

/// `a >= b` in serial number arithmetic (RFC 1982): serials wrap, so later is within half
/// the number space ahead.
fn serial_at_least(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) < 1 << 31
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::dns::{Nameserver, Zone};
    use crate::model::queue::{create, Addresses, NewQueue, Queue, Status, Tier};
    use hickory_server::proto::op::MessageType;
    use hickory_server::proto::rr::rdata::SOA;
    use hickory_server::proto::rr::Name;
    use std::net::SocketAddr;
    use std::sync::Arc;

    fn cidr(text: &str) -> Cidr {
        text.parse().unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn blocks_are_read_in_cidr_notation_and_hold_what_they_say() {
        let allow = [
            cidr("127.0.0.1/32"),
            cidr("10.1.0.0/16"),
            cidr("2001:db8::/32"),
        ];
        assert!(allowed(&allow, ip("127.0.0.1")));
        assert!(!allowed(&allow, ip("127.0.0.2")));
        assert!(allowed(&allow, ip("10.1.255.7")));
        assert!(!allowed(&allow, ip("10.2.0.1")));
        assert!(allowed(&allow, ip("2001:db8:ffff::1")));
        assert!(!allowed(&allow, ip("2001:db9::1")));
        assert!(
            allowed(&allow, ip("::ffff:10.1.0.9")),
            "IPv4 on a dual-stack socket"
        );
        assert!(!allowed(&allow, ip("::1")));
        assert!(!allowed(&[], ip("127.0.0.1")), "none without a list");

        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(
            !cidr("0.0.0.0/0").contains(ip("2001:db8::1")),
            "v4 blocks hold v4"
        );
        assert!(cidr("::/0").contains(ip("2001:db8::1")));
        assert_eq!(cidr("::1"), cidr("::1/128"), "an address alone");
        assert_eq!(
            "192.0.2.7/24".parse::<Cidr>(),
            Err(CidrError::HostBits("192.0.2.7/24".into(), ip("192.0.2.0")))
        );
        assert!(matches!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::Length(_))
        ));
        assert!(matches!(
            "10.0.0.0/x".parse::<Cidr>(),
            Err(CidrError::Length(_))
        ));
        assert!(matches!(
            "ns1/24".parse::<Cidr>(),
            Err(CidrError::Address(_))
        ));
    }

    /// A zone with `count` queues, each with an AAAA and an A record.
    pub(in crate::dns) fn zone(count: usize) -> Arc<Zone> {
        let ns = Nameserver::Named(vec!["ns1.example.net".into(), "ns2.example.net".into()]);
        let zone = Zone::new("c", "example.test", ns).unwrap();
        let queues: Vec<Queue> = (0..count).map(|n| placed(n as u32)).collect();
        zone.update(&queues);
        zone
    }

    fn placed(n: u32) -> Queue {
        let (mut queue, _) = create(NewQueue {
            tier: Tier::Devtest,
            region: "r".into(),
            instance_type: "t".into(),
            ipv4: true,
            account: None,
            ..Default::default()
        });
        queue.status = Status::Running;
        queue.addresses = Some(Addresses {
            v6: std::net::Ipv6Addr::from_bits(0x2001_0db8 << 96 | u128::from(n)),
            v4: Some(std::net::Ipv4Addr::from_bits(0x0a00_0000 | n)),
        });
        queue
    }

    /// A `kind` query for `name` from `src` over `protocol`, with `serial` as the secondary's
    /// SOA (IXFR).
    fn request(
        kind: RecordType,
        name: &str,
        src: &str,
        serial: Option<u32>,
        protocol: Protocol,
    ) -> Request {
        let mut query = Message::query();
        query.metadata.id = 777;
        let name = Name::from_str(name).unwrap();
        query.add_query(Query::query(name.clone(), kind));
        if let Some(serial) = serial {
            let soa = SOA::new(name.clone(), name.clone(), serial, 1, 1, 1, 1);
            query.add_authority(Record::from_rdata(name, 60, RData::SOA(soa)));
        }
        let src: SocketAddr = src.parse().unwrap();
        Request::from_bytes(query.to_vec().unwrap(), src, protocol).unwrap()
    }

    fn ask(zone: &Zone, request: &Request, allow: &[Cidr]) -> Vec<Message> {
        assert!(is_transfer(request));
        let permitted = allowed(allow, request.src().ip());
        let sent = respond(request, &zone.snapshot(), permitted).unwrap();
        sent.iter()
            .map(|bytes| Message::from_vec(bytes).unwrap())
            .collect()
    }

    const ORIGIN: &str = "q.c.example.test.";
    const SECONDARY: &str = "192.0.2.53:4000";

    #[test]
    fn a_large_zone_goes_in_several_messages_under_the_cap_soa_first_and_last() {
        let zone = zone(5000);
        let axfr = request(RecordType::AXFR, ORIGIN, SECONDARY, None, Protocol::Tcp);
        let raw = respond(&axfr, &zone.snapshot(), true).unwrap();
        assert!(raw.len() > 5, "{} messages", raw.len());
        assert!(raw.iter().all(|message| message.len() <= MAX_MESSAGE));
        let messages: Vec<Message> = raw.iter().map(|m| Message::from_vec(m).unwrap()).collect();
        for (n, message) in messages.iter().enumerate() {
            assert_eq!(message.metadata.id, 777);
            assert_eq!(message.metadata.message_type, MessageType::Response);
            assert!(message.metadata.authoritative);
            assert_eq!(message.metadata.response_code, ResponseCode::NoError);
            assert_eq!(
                message.queries.len(),
                usize::from(n == 0),
                "the question first only"
            );
        }
        let records: Vec<&Record> = messages.iter().flat_map(|m| &m.answers).collect();
        let kinds: Vec<RecordType> = records.iter().map(|r| r.record_type()).collect();
        assert_eq!(kinds[0], RecordType::SOA);
        assert_eq!(kinds[kinds.len() - 1], RecordType::SOA);
        assert_eq!(records[0], records[records.len() - 1]);
        let count = |kind| kinds.iter().filter(|k| **k == kind).count();
        assert_eq!((count(RecordType::SOA), count(RecordType::NS)), (2, 2));
        assert_eq!(
            (count(RecordType::AAAA), count(RecordType::A)),
            (5000, 5000)
        );
        // Every other record once, between the two SOAs.
        let between = texts(records[1..records.len() - 1].iter().copied());
        assert_eq!(between, texts(zone.snapshot().others().iter()));
    }

    /// The records as text, sorted.
    fn texts<'a>(records: impl Iterator<Item = &'a Record>) -> Vec<String> {
        let mut texts: Vec<String> = records.map(|record| record.to_string()).collect();
        texts.sort();
        texts
    }

    #[test]
    fn a_small_zone_goes_in_one_message_and_ixfr_gets_it_in_axfr_form() {
        let zone = zone(3);
        let allow = [cidr("192.0.2.53")];
        let old = zone.snapshot().serial.wrapping_sub(1);
        for ixfr_from in [None, Some(old)] {
            let kind = if ixfr_from.is_some() {
                RecordType::IXFR
            } else {
                RecordType::AXFR
            };
            let messages = ask(
                &zone,
                &request(kind, ORIGIN, SECONDARY, ixfr_from, Protocol::Tcp),
                &allow,
            );
            assert_eq!(messages.len(), 1);
            assert_eq!(messages[0].queries[0].query_type(), kind);
            // SOA, 2 NS, 3 AAAA, 3 A, SOA.
            assert_eq!(messages[0].answers.len(), 10, "{kind}");
        }
    }

    #[test]
    fn an_ixfr_from_a_secondary_up_to_date_or_over_udp_gets_the_soa_alone() {
        let zone = zone(3);
        let allow = [cidr("192.0.2.0/24")];
        let serial = zone.snapshot().serial;
        let cases = [
            (Some(serial), Protocol::Tcp),
            (Some(serial.wrapping_add(5)), Protocol::Tcp),
            (Some(serial - 1), Protocol::Udp),
        ];
        for (theirs, protocol) in cases {
            let ixfr = request(RecordType::IXFR, ORIGIN, SECONDARY, theirs, protocol);
            let messages = ask(&zone, &ixfr, &allow);
            assert_eq!(messages.len(), 1);
            assert!(messages[0].metadata.authoritative);
            let answers = &messages[0].answers;
            assert_eq!((answers.len(), &answers[0]), (1, zone.snapshot().soa()));
        }
    }

    #[test]
    fn axfr_over_udp_is_truncated_and_strangers_are_refused_before_anything() {
        let zone = zone(3);
        let allow = [cidr("192.0.2.0/24")];
        let udp = request(RecordType::AXFR, ORIGIN, SECONDARY, None, Protocol::Udp);
        let messages = ask(&zone, &udp, &allow);
        assert!(messages[0].metadata.truncation);
        assert!(messages[0].answers.is_empty());
        assert_eq!(messages[0].queries.len(), 1);

        for protocol in [Protocol::Tcp, Protocol::Udp] {
            for kind in [RecordType::AXFR, RecordType::IXFR] {
                let stranger = request(kind, ORIGIN, "198.51.100.1:4000", None, protocol);
                let messages = ask(&zone, &stranger, &allow);
                assert_eq!(messages.len(), 1);
                assert_eq!(messages[0].metadata.response_code, ResponseCode::Refused);
                assert!(messages[0].answers.is_empty());
                let nobody = ask(
                    &zone,
                    &request(kind, ORIGIN, SECONDARY, None, protocol),
                    &[],
                );
                assert_eq!(nobody[0].metadata.response_code, ResponseCode::Refused);
            }
        }
        let inside = request(
            RecordType::AXFR,
            "abc.q.c.example.test.",
            SECONDARY,
            None,
            Protocol::Tcp,
        );
        let messages = ask(&zone, &inside, &allow);
        assert_eq!(messages[0].metadata.response_code, ResponseCode::NotAuth);
        let upper = request(
            RecordType::AXFR,
            "Q.C.Example.TEST.",
            SECONDARY,
            None,
            Protocol::Tcp,
        );
        assert_eq!(
            ask(&zone, &upper, &allow)[0].answers.len(),
            10,
            "names are caseless"
        );
    }

    #[test]
    fn serials_compare_in_serial_number_arithmetic() {
        assert!(serial_at_least(5, 5));
        assert!(serial_at_least(6, 5));
        assert!(!serial_at_least(4, 5));
        assert!(serial_at_least(2, u32::MAX), "wrapped past zero");
        assert!(!serial_at_least(u32::MAX, 2));
    }
}
