//! Queue names that resolve only through a DNS server of your own (the local `controlplane
//! dev`'s `*.q.dev.thequeueexpert.com`): one AAAA and one A query over UDP to that server, the
//! answers' addresses kept in that order (a queue always has IPv6; IPv4 only if it has one).

use crate::failure::Failure;
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RecordType};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::UdpSocket;

/// How long one query may take.
const QUERY_WITHIN: Duration = Duration::from_secs(3);

/// The addresses of `host` on `port`, as `server` answers for them.
pub async fn resolve(server: &str, host: &str, port: u16) -> Result<Vec<SocketAddr>, Failure> {
    let server: SocketAddr = server.parse().map_err(|_| {
        Failure::Usage(format!(
            "the profile's dns is {server:?}, not an IP:PORT (127.0.0.1:8053, say)"
        ))
    })?;
    let mut addrs = Vec::new();
    for kind in [RecordType::AAAA, RecordType::A] {
        for ip in query(server, host, kind).await? {
            addrs.push(SocketAddr::new(ip, port));
        }
    }
    if addrs.is_empty() {
        return Err(Failure::NotFound(format!(
            "{host} has no address at the DNS server {server}"
        )));
    }
    Ok(addrs)
}

async fn query(server: SocketAddr, host: &str, kind: RecordType) -> Result<Vec<IpAddr>, Failure> {
    let unavailable = |what: String| Failure::Unavailable(format!("DNS {server}: {what}"));
    let name = Name::from_ascii(format!("{}.", host.trim_end_matches('.')))
        .map_err(|e| Failure::Usage(format!("{host} is not a DNS name: {e}")))?;
    let mut request = Message::query();
    request.metadata.recursion_desired = true;
    request.add_query(Query::query(name, kind));
    let id = request.metadata.id;
    let bytes = request
        .to_vec()
        .map_err(|e| unavailable(format!("a query that does not encode: {e}")))?;
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("an address"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("an address"),
    };
    let socket = UdpSocket::bind(local)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    socket
        .connect(server)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    socket
        .send(&bytes)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let mut buffer = vec![0u8; 4096];
    let answer = loop {
        let n = tokio::time::timeout(QUERY_WITHIN, socket.recv(&mut buffer))
            .await
            .map_err(|_| unavailable(format!("no answer within {QUERY_WITHIN:?}")))?
            .map_err(|e| unavailable(e.to_string()))?;
        match Message::from_vec(&buffer[..n]) {
            // Another query's late answer, or noise: wait for ours.
            Ok(answer) if answer.metadata.id == id => break answer,
            _ => continue,
        }
    };
    Ok(answer
        .answers
        .iter()
        .filter(|record| record.record_type() == kind)
        .filter_map(|record| record.data.ip_addr())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny server that answers each query with one address of its type.
    #[tokio::test]
    async fn answers_are_read_in_order_aaaa_then_a() {
        use hickory_proto::rr::rdata::{A, AAAA};
        use hickory_proto::rr::{RData, Record};
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 4096];
            loop {
                let (n, from) = server.recv_from(&mut buffer).await.unwrap();
                let query = Message::from_vec(&buffer[..n]).unwrap();
                let mut answer = Message::response(query.metadata.id, query.metadata.op_code);
                let asked = query.queries[0].clone();
                let data = match asked.query_type() {
                    RecordType::AAAA => RData::AAAA(AAAA("::1".parse().unwrap())),
                    _ => RData::A(A("127.0.0.1".parse().unwrap())),
                };
                answer
                    .answers
                    .push(Record::from_rdata(asked.name().clone(), 60, data));
                answer.add_query(asked);
                server
                    .send_to(&answer.to_vec().unwrap(), from)
                    .await
                    .unwrap();
            }
        });
        let addrs = resolve(&addr.to_string(), "q1.q.dev.example.com", 8001)
            .await
            .unwrap();
        assert_eq!(
            addrs,
            vec![
                "[::1]:8001".parse::<SocketAddr>().unwrap(),
                "127.0.0.1:8001".parse().unwrap()
            ]
        );
    }
}
