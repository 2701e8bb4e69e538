//! The zone `q.CLUSTER.DOMAIN`: SOA and NS, and for each live queue, at the addresses its
//! provider placed it at, an AAAA record always and an A record only when it has IPv4 (the
//! manual's *The address*). Unknown names get NXDOMAIN. While an ACME order is pending, its
//! DNS-01 values are TXT records at `_acme-challenge.q.CLUSTER.DOMAIN`.
//!
//! The zone is rebuilt whole from the queues' records on every change and swapped in, with the
//! SOA serial moving forward; a query reads whichever zone is current.

use super::DnsError;
use crate::queues::Queue;
use hickory_server::net::runtime::TokioRuntimeProvider;
use hickory_server::proto::rr::rdata::{A, AAAA, NS, SOA, TXT};
use hickory_server::proto::rr::{LowerName, Name, RData, Record};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneType};
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

/// How long resolvers may keep an answer: short, since queues come and go.
const TTL: u32 = 60;

/// Who the zone says serves it (its NS record, and its SOA's primary).
#[derive(Debug, Clone)]
pub enum Nameserver {
    /// `ns.q.CLUSTER.DOMAIN` at this address, answered by the zone itself (local use).
    InZone(IpAddr),
    /// The name the parent zone delegates to (`dns_name`), with its glue there: the zone
    /// names the server the parent names, so resolvers that trust the zone's own NS agree.
    Named(String),
}

/// The zone as served now; [`Zone::update`] swaps in a new one.
pub struct Zone {
    origin: Name,
    nameserver: Nameserver,
    current: RwLock<Arc<Catalog>>,
    /// What the zone is built from; either changing rebuilds it.
    contents: std::sync::Mutex<Contents>,
}

#[derive(Default)]
struct Contents {
    serial: u32,
    queues: Vec<Queue>,
    /// DNS-01 values of the pending ACME orders: (the name ordered, the value). Orders for
    /// several queues may be pending at once.
    challenges: Vec<(String, String)>,
}

impl Zone {
    /// The zone `q.CLUSTER.DOMAIN.`, empty of queues, served by `nameserver`.
    pub fn new(cluster: &str, domain: &str, nameserver: Nameserver) -> Result<Arc<Zone>, DnsError> {
        let text = format!("q.{cluster}.{domain}.");
        let origin = Name::from_str(&text).map_err(|_| DnsError::Name(text))?;
        if let Nameserver::Named(name) = &nameserver {
            let fqdn = format!("{}.", name.trim_end_matches('.'));
            Name::from_str(&fqdn).map_err(|_| DnsError::Name(name.clone()))?;
        }
        let zone = Arc::new(Zone {
            origin,
            nameserver,
            current: RwLock::new(Arc::new(Catalog::new())),
            contents: std::sync::Mutex::default(),
        });
        zone.update(&[]);
        Ok(zone)
    }

    /// Rebuilds the zone with `queues`; the serial moves forward.
    pub fn update(&self, queues: &[Queue]) {
        self.rebuild(|contents| contents.queues = queues.to_vec());
    }

    /// Rebuilds the zone from the queues' records as they are now. The records are read
    /// under the zone's lock, so two refreshes never install an older read over a newer one
    /// (a deleted queue's name coming back).
    pub fn refresh(&self, store: &crate::store::Store) -> Result<(), crate::store::StoreError> {
        let mut read = Ok(());
        self.rebuild(|contents| match store.list() {
            Ok(queues) => contents.queues = queues,
            Err(error) => read = Err(error),
        });
        read
    }

    /// Publishes the DNS-01 values of a pending ACME order: (the name ordered, the value).
    pub fn add_challenges(&self, values: &[(String, String)]) {
        self.rebuild(|contents| contents.challenges.extend_from_slice(values));
    }

    /// Withdraws an order's values once it is over.
    pub fn remove_challenges(&self, values: &[(String, String)]) {
        self.rebuild(|contents| contents.challenges.retain(|value| !values.contains(value)));
    }

    fn rebuild(&self, change: impl FnOnce(&mut Contents)) {
        let mut contents = self.contents.lock().expect("never poisoned");
        change(&mut contents);
        // Seconds since 1970, or one more than last time if that is not ahead.
        let now = crate::unix_now() as u32;
        contents.serial = now.max(contents.serial + 1);
        let serial = contents.serial;
        let mut handler = InMemoryZoneHandler::<TokioRuntimeProvider>::empty(
            self.origin.clone(),
            ZoneType::Primary,
            AxfrPolicy::Deny,
        );
        for record in self.records(&contents, serial) {
            handler.upsert_mut(record, serial);
        }
        let mut catalog = Catalog::new();
        catalog.upsert(LowerName::new(&self.origin), vec![Arc::new(handler)]);
        // Swapped while the contents are locked, so zones are installed in serial order.
        *self.current.write().expect("never poisoned") = Arc::new(catalog);
    }

    fn records(&self, contents: &Contents, serial: u32) -> Vec<Record> {
        let ns = match &self.nameserver {
            Nameserver::InZone(_) => self.name("ns"),
            Nameserver::Named(name) => {
                let fqdn = format!("{}.", name.trim_end_matches('.'));
                Name::from_str(&fqdn).expect("checked in Zone::new")
            }
        };
        let soa = SOA::new(
            ns.clone(),
            self.name("hostmaster"),
            serial,
            3600,
            600,
            86_400,
            TTL,
        );
        let mut records = vec![
            Record::from_rdata(self.origin.clone(), TTL, RData::SOA(soa)),
            Record::from_rdata(self.origin.clone(), TTL, RData::NS(NS(ns.clone()))),
        ];
        if let Nameserver::InZone(ip) = self.nameserver {
            records.push(Record::from_rdata(ns, TTL, address(ip)));
        }
        let live = |queue: &&Queue| queue.status.is_live();
        for (ordered, value) in &contents.challenges {
            // RFC 8555 §8.4: `_acme-challenge.` before the name, a wildcard's `*.` left off.
            let ordered = ordered.trim_start_matches("*.");
            let Ok(name) = Name::from_str(&format!("_acme-challenge.{ordered}.")) else {
                continue;
            };
            if !self.origin.zone_of(&name) {
                continue;
            }
            let txt = RData::TXT(TXT::new(vec![value.clone()]));
            records.push(Record::from_rdata(name, 0, txt));
        }
        for queue in contents.queues.iter().filter(live) {
            // A queue's name resolves once its provider has placed it.
            let Some(addresses) = queue.addresses else {
                continue;
            };
            let name = self.name(&queue.id);
            let v6 = RData::AAAA(AAAA(addresses.v6));
            records.push(Record::from_rdata(name.clone(), TTL, v6));
            if let (true, Some(v4)) = (queue.ipv4, addresses.v4) {
                records.push(Record::from_rdata(name, TTL, RData::A(A(v4))));
            }
        }
        records
    }

    /// `QUEUE-ID.q.CLUSTER.DOMAIN`, a queue's host name.
    pub fn host_of(&self, queue_id: &str) -> String {
        self.name(queue_id)
            .to_string()
            .trim_end_matches('.')
            .to_string()
    }

    /// `*.q.CLUSTER.DOMAIN`, the name of the cluster's certificate.
    pub fn wildcard(&self) -> String {
        format!("*.{}", self.origin.to_string().trim_end_matches('.'))
    }

    /// The catalog of the zone current now; a query answered from it is not disturbed by an
    /// update swapping in the next.
    pub(super) fn catalog(&self) -> Arc<Catalog> {
        self.current.read().expect("never poisoned").clone()
    }

    fn name(&self, label: &str) -> Name {
        Name::from_str(label)
            .and_then(|label| label.append_domain(&self.origin))
            .expect("queue ids and our labels are DNS labels")
    }
}

fn address(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
        IpAddr::V4(v4) => RData::A(A(v4)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::serve;
    use crate::queues::Status;
    use hickory_server::proto::op::{Message, Query, ResponseCode};
    use hickory_server::proto::rr::RecordType;
    use std::net::SocketAddr;
    use std::time::Duration;

    async fn ask(server: SocketAddr, name: &str, kind: RecordType) -> (ResponseCode, Vec<String>) {
        let mut query = Message::query();
        query.add_query(Query::query(Name::from_str(name).unwrap(), kind));
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket
            .send_to(&query.to_vec().unwrap(), server)
            .await
            .unwrap();
        let mut reply = vec![0; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), socket.recv(&mut reply))
            .await
            .unwrap()
            .unwrap();
        let reply = Message::from_vec(&reply[..n]).unwrap();
        let answers = reply.answers.iter().map(|r| r.data.to_string()).collect();
        (reply.metadata.response_code, answers)
    }

    #[tokio::test]
    async fn a_queue_resolves_to_where_its_provider_placed_it_once_placed() {
        use crate::queues::{create, Addresses, NewQueue, Tier};
        let zone = Zone::new(
            "c",
            "example.test",
            Nameserver::InZone("127.0.0.1".parse().unwrap()),
        )
        .unwrap();
        let server = serve(zone.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let new = |ipv4| NewQueue {
            tier: Tier::Devtest,
            region: "r".into(),
            instance_type: "t".into(),
            ipv4,
        };
        let (mut placed, _) = create(new(true));
        placed.status = Status::Running;
        placed.addresses = Some(Addresses {
            v6: "2001:db8::7".parse().unwrap(),
            v4: Some("192.0.2.7".parse().unwrap()),
        });
        let (mut v6_only, _) = create(new(false));
        v6_only.status = Status::Running;
        v6_only.addresses = placed.addresses;
        let (unplaced, _) = create(new(true));
        zone.update(&[placed.clone(), v6_only.clone(), unplaced.clone()]);
        let host = |queue: &Queue| format!("{}.", zone.host_of(&queue.id));
        assert_eq!(
            ask(server, &host(&placed), RecordType::AAAA).await,
            (ResponseCode::NoError, vec!["2001:db8::7".into()])
        );
        assert_eq!(
            ask(server, &host(&placed), RecordType::A).await,
            (ResponseCode::NoError, vec!["192.0.2.7".into()])
        );
        assert_eq!(
            ask(server, &host(&v6_only), RecordType::A).await,
            (ResponseCode::NoError, vec![]),
            "no A without IPv4, whatever the provider says"
        );
        assert_eq!(
            ask(server, &host(&unplaced), RecordType::AAAA).await.0,
            ResponseCode::NXDomain
        );
        assert_eq!(
            ask(server, "ns.q.c.example.test.", RecordType::A).await,
            (ResponseCode::NoError, vec!["127.0.0.1".into()])
        );
    }

    #[tokio::test]
    async fn acme_challenges_are_txt_records_while_the_order_is_pending() {
        let zone = Zone::new(
            "c",
            "example.test",
            Nameserver::InZone("::1".parse().unwrap()),
        )
        .unwrap();
        let server = serve(zone.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let name = "_acme-challenge.q.c.example.test.";
        assert_eq!(
            ask(server, name, RecordType::TXT).await.0,
            ResponseCode::NXDomain
        );
        let wildcard = [
            ("*.q.c.example.test".to_string(), "value-one".to_string()),
            ("*.q.c.example.test".to_string(), "value-two".to_string()),
        ];
        let queue = [(
            "abc.q.c.example.test".to_string(),
            "value-three".to_string(),
        )];
        zone.add_challenges(&wildcard);
        zone.add_challenges(&queue);
        assert_eq!(
            ask(
                server,
                "_acme-challenge.abc.q.c.example.test.",
                RecordType::TXT
            )
            .await,
            (ResponseCode::NoError, vec!["value-three".into()])
        );
        let (code, mut values) = ask(server, name, RecordType::TXT).await;
        values.sort();
        assert_eq!(
            (code, values),
            (
                ResponseCode::NoError,
                vec!["value-one".into(), "value-two".into()]
            )
        );
        zone.remove_challenges(&wildcard);
        assert_eq!(
            ask(server, name, RecordType::TXT).await.0,
            ResponseCode::NXDomain
        );
        zone.remove_challenges(&queue);
        assert_eq!(
            ask(
                server,
                "_acme-challenge.abc.q.c.example.test.",
                RecordType::TXT
            )
            .await
            .0,
            ResponseCode::NXDomain
        );
        let (code, ns) = ask(server, "q.c.example.test.", RecordType::NS).await;
        assert_eq!(
            (code, ns),
            (ResponseCode::NoError, vec!["ns.q.c.example.test.".into()])
        );
    }

    #[tokio::test]
    async fn a_delegated_zone_names_the_server_its_parent_names() {
        let named = Nameserver::Named("ns1.c.example.test".into());
        let zone = Zone::new("c", "example.test", named).unwrap();
        let server = serve(zone.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let (code, ns) = ask(server, "q.c.example.test.", RecordType::NS).await;
        assert_eq!(
            (code, ns),
            (ResponseCode::NoError, vec!["ns1.c.example.test.".into()])
        );
        let (code, _) = ask(server, "ns.q.c.example.test.", RecordType::A).await;
        assert_eq!(
            code,
            ResponseCode::NXDomain,
            "no server of its own in the zone"
        );
        let bad = Nameserver::Named("not a name..".into());
        assert!(Zone::new("c", "example.test", bad).is_err());
    }
}
