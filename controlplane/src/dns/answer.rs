//! One query's bytes in, its response's bytes out. The answer comes from hickory's catalog for
//! the zone current now, as hickory's own server would give it, except a zone transfer's, which
//! [`transfer`](super::transfer) gives; the listeners keep the sockets, so they decide what is
//! sent, when, and whether at all.

use super::transfer::{self, Cidr};
use super::tsig::{self, Checked, TsigKey};
use super::zone::Zone;
use hickory_server::net::runtime::TokioTime;
use hickory_server::net::xfer::Protocol;
use hickory_server::net::NetError;
use hickory_server::proto::op::{
    Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::Record;
use hickory_server::proto::serialize::binary::{
    BinDecodable, BinDecoder, BinEncodable, BinEncoder,
};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder, Queries};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tracing::instrument::WithSubscriber;

/// The biggest UDP response to a query without EDNS (RFC 1035 §4.2.1).
const PLAIN_UDP_SIZE: u16 = 512;

/// Answers from whichever zone is current.
pub(super) struct Answerer {
    zone: Arc<Zone>,
    /// The sources a zone transfer goes to.
    transfers_to: Vec<Cidr>,
    /// The key shared with the secondaries: with one, a transfer must also be signed with it,
    /// and every response to a request signed with it is signed.
    key: Option<TsigKey>,
}

impl Answerer {
    pub(super) fn new(zone: Arc<Zone>, transfers_to: Vec<Cidr>, key: Option<TsigKey>) -> Answerer {
        Answerer {
            zone,
            transfers_to,
            key,
        }
    }

    /// The response to the message `raw` from `src`, as the messages to send in order: one,
    /// or for a zone transfer over TCP as many as it takes; none for what gets none: a
    /// response (answering one could start a loop between two servers), or less than a
    /// header.
    pub(super) async fn answer(
        &self,
        raw: Vec<u8>,
        src: SocketAddr,
        protocol: Protocol,
    ) -> Vec<Vec<u8>> {
        let Some(header) = query_header(&raw) else {
            return Vec::new();
        };
        // RFC 9619: one question. hickory's reader reserves room for as many as the header
        // claims, up to 65535, before reading any.
        if header.counts.queries > 1 {
            return vec![error(&header, ResponseCode::FormErr, protocol)];
        }
        let (raw, mut signer) = match &self.key {
            None => (raw, None),
            Some(key) => match tsig::check(raw, key, crate::unix_now()) {
                Checked::Unsigned(raw) => (raw, None),
                Checked::Signed(raw, signer) => (raw, Some(signer)),
                Checked::Refused(response) => return vec![response],
                Checked::Unreadable => {
                    return vec![error(&header, ResponseCode::FormErr, protocol)]
                }
            },
        };
        let signed = signer.is_some();
        let mut responses = self.respond(raw, &header, src, protocol, signed).await;
        if let Some(signer) = &mut signer {
            responses
                .iter_mut()
                .for_each(|response| signer.sign(response));
        }
        responses
    }

    /// The responses to `raw` (whose `header` was read already), its TSIG (if it had one)
    /// checked and cut off: `signed` says whether it had.
    async fn respond(
        &self,
        raw: Vec<u8>,
        header: &Header,
        src: SocketAddr,
        protocol: Protocol,
        signed: bool,
    ) -> Vec<Vec<u8>> {
        let Ok(request) = Request::from_bytes(raw, src, protocol) else {
            return vec![error(header, ResponseCode::FormErr, protocol)];
        };
        if transfer::is_transfer(&request) {
            let zone = self.zone.snapshot();
            // The address, and the key when there is one.
            let permitted =
                transfer::allowed(&self.transfers_to, src.ip()) && (self.key.is_none() || signed);
            return transfer::respond(&request, &zone, permitted)
                .unwrap_or_else(|_| vec![server_failure(header.metadata.id).1]);
        }
        let sent = Collector::new(protocol);
        // hickory logs some queries one by one (each with DNSSEC OK, each with an EDNS version
        // it lacks): silenced here, or a flood of them would be a flood of log lines.
        self.zone
            .catalog()
            .handle_request::<_, TokioTime>(&request, sent.clone())
            .with_subscriber(tracing::Dispatch::none())
            .await;
        sent.take().into_iter().collect()
    }
}

/// The response sent instead of an answer to a query over its source's budget: TC=1 and the
/// question alone, which tells a real resolver to ask again over TCP (RFC 1035 §4.2.1). `None`
/// for what is not a query with one question.
pub(super) fn truncated(raw: &[u8]) -> Option<Vec<u8>> {
    let mut decoder = BinDecoder::new(raw);
    let header = Header::read(&mut decoder).ok().filter(is_query)?;
    if header.counts.queries != 1 {
        return None;
    }
    let queries = Queries::read(&mut decoder, 1).ok()?;
    let mut response = MessageResponseBuilder::new(&queries, None)
        .error_msg(&header.metadata, ResponseCode::NoError);
    response.metadata_mut().truncation = true;
    Some(encode(response, Protocol::Udp).1)
}

fn query_header(raw: &[u8]) -> Option<Header> {
    Header::read(&mut BinDecoder::new(raw))
        .ok()
        .filter(is_query)
}

fn is_query(header: &Header) -> bool {
    header.metadata.message_type == MessageType::Query
}

/// An error response to a query hickory could not read: its header, no question.
fn error(header: &Header, code: ResponseCode, protocol: Protocol) -> Vec<u8> {
    let queries = Queries::read(&mut BinDecoder::new(&[]), 0).expect("no questions to read");
    let response = MessageResponseBuilder::new(&queries, None).error_msg(&header.metadata, code);
    encode(response, protocol).1
}

/// The response's bytes, cut to what the client can take over UDP (hickory sets TC when it
/// cuts). Should it fail to encode, SERVFAIL, as hickory's own server sends then.
fn encode<'a>(
    response: MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    protocol: Protocol,
) -> (ResponseInfo, Vec<u8>) {
    let id = response.metadata().id;
    let max = match protocol {
        Protocol::Udp => response.edns().map_or(PLAIN_UDP_SIZE, Edns::max_payload),
        _ => u16::MAX,
    };
    let mut bytes = Vec::with_capacity(PLAIN_UDP_SIZE as usize);
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_max_size(max);
    match response.destructive_emit(&mut encoder) {
        Ok(info) => (info, bytes),
        Err(_) => server_failure(id),
    }
}

fn server_failure(id: u16) -> (ResponseInfo, Vec<u8>) {
    let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
    metadata.response_code = ResponseCode::ServFail;
    let header = Header {
        metadata,
        counts: HeaderCounts::default(),
    };
    let mut bytes = Vec::with_capacity(12);
    header
        .emit(&mut BinEncoder::new(&mut bytes))
        .expect("a header fits");
    (ResponseInfo::from(header), bytes)
}

/// Keeps what the catalog sends, for the listener to send on.
#[derive(Clone)]
struct Collector {
    protocol: Protocol,
    /// The encoded response; the catalog sends one for each query (zone transfers, which send
    /// several, never reach it).
    sent: Arc<Mutex<Option<Vec<u8>>>>,
}

impl Collector {
    fn new(protocol: Protocol) -> Collector {
        Collector {
            protocol,
            sent: Arc::default(),
        }
    }

    fn take(&self) -> Option<Vec<u8>> {
        self.sent.lock().expect("never poisoned").take()
    }
}

#[async_trait::async_trait]
impl ResponseHandler for Collector {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let (info, bytes) = encode(response, self.protocol);
        *self.sent.lock().expect("never poisoned") = Some(bytes);
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::Nameserver;
    use hickory_server::proto::op::{Message, Query};
    use hickory_server::proto::rr::{Name, RecordType};
    use std::str::FromStr;

    fn query(name: &str) -> Message {
        let mut query = Message::query();
        query.metadata.id = 4242;
        query.add_query(Query::query(Name::from_str(name).unwrap(), RecordType::SOA));
        query
    }

    fn answerer() -> Answerer {
        let ns = Nameserver::InZone("127.0.0.1".parse().unwrap());
        let transfers_to = vec!["192.0.2.0/24".parse().unwrap()];
        Answerer::new(
            Zone::new("c", "example.test", ns).unwrap(),
            transfers_to,
            None,
        )
    }

    async fn ask(raw: Vec<u8>, protocol: Protocol) -> Option<Message> {
        let messages = ask_all(raw, protocol).await;
        assert!(messages.len() <= 1, "{messages:?}");
        messages.into_iter().next()
    }

    async fn ask_all(raw: Vec<u8>, protocol: Protocol) -> Vec<Message> {
        let src = "192.0.2.1:5353".parse().unwrap();
        let responses = answerer().answer(raw, src, protocol).await;
        let read = |response: Vec<u8>| Message::from_vec(&response).unwrap();
        responses.into_iter().map(read).collect()
    }

    #[tokio::test]
    async fn a_query_is_answered_from_the_zone() {
        let raw = query("q.c.example.test.").to_vec().unwrap();
        let response = ask(raw, Protocol::Udp).await.unwrap();
        assert_eq!(response.metadata.id, 4242);
        assert_eq!(response.metadata.response_code, ResponseCode::NoError);
        assert!(response.metadata.authoritative);
        assert_eq!(response.answers.len(), 1);
    }

    #[tokio::test]
    async fn a_zone_transfer_is_answered_soa_first_and_last_not_by_the_catalog() {
        let mut axfr = query("q.c.example.test.");
        axfr.queries[0].set_query_type(RecordType::AXFR);
        let messages = ask_all(axfr.to_vec().unwrap(), Protocol::Tcp).await;
        let answers: Vec<RecordType> = messages
            .iter()
            .flat_map(|message| &message.answers)
            .map(|record| record.record_type())
            .collect();
        let (soa, ns, a) = (RecordType::SOA, RecordType::NS, RecordType::A);
        assert_eq!(answers, [soa, ns, a, soa]);
        assert_eq!(messages[0].metadata.id, 4242);
    }

    #[tokio::test]
    async fn responses_and_scraps_get_nothing_and_unreadable_queries_get_formerr() {
        let mut response = query("q.c.example.test.");
        response.metadata.message_type = MessageType::Response;
        assert!(ask(response.to_vec().unwrap(), Protocol::Udp)
            .await
            .is_none());
        assert!(ask(vec![0; 11], Protocol::Tcp).await.is_none());

        let mut cut = query("q.c.example.test.").to_vec().unwrap();
        cut.truncate(cut.len() - 3);
        let response = ask(cut, Protocol::Tcp).await.unwrap();
        assert_eq!(response.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(response.metadata.id, 4242);

        let mut many = query("q.c.example.test.").to_vec().unwrap();
        many[4..6].copy_from_slice(&u16::MAX.to_be_bytes());
        let response = ask(many, Protocol::Udp).await.unwrap();
        assert_eq!(response.metadata.response_code, ResponseCode::FormErr);
    }

    #[tokio::test]
    async fn the_catalog_logs_nothing_per_query() {
        use tracing::instrument::WithSubscriber;
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Writer(sink.clone()))
            .finish();
        // hickory warns of each query with an EDNS version it lacks.
        let mut query = query("q.c.example.test.");
        let mut edns = Edns::new();
        edns.set_version(1);
        query.set_edns(edns);
        let raw = query.to_vec().unwrap();
        let asked = ask(raw, Protocol::Udp).with_subscriber(subscriber);
        let response = asked.await.unwrap();
        // BADVERS, 16, which reads as BADSIG (also 16) out of a TSIG's context.
        assert_eq!(u16::from(response.metadata.response_code), 16);
        let log = String::from_utf8(log.lock().unwrap().clone()).unwrap();
        assert_eq!(log, "");
    }

    struct Writer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Writer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_slipped_answer_is_truncated_and_holds_the_question_alone() {
        let raw = query("abc.q.c.example.test.").to_vec().unwrap();
        let slipped = Message::from_vec(&truncated(&raw).unwrap()).unwrap();
        assert_eq!(slipped.metadata.id, 4242);
        assert_eq!(slipped.metadata.message_type, MessageType::Response);
        assert!(slipped.metadata.truncation);
        assert_eq!(slipped.queries, query("abc.q.c.example.test.").queries);
        assert!(slipped.answers.is_empty());

        let mut response = query("abc.q.c.example.test.");
        response.metadata.message_type = MessageType::Response;
        assert!(truncated(&response.to_vec().unwrap()).is_none());
        assert!(truncated(&raw[..11]).is_none());
    }
}
