//! The zone `q.CLUSTER.DOMAIN`: SOA and NS, and for each live queue, at the addresses its
//! provider placed it at, an AAAA record always and an A record only when it has IPv4 (the
//! manual's *The address*). Unknown names get NXDOMAIN. While an ACME order is pending, its
//! DNS-01 values are TXT records at `_acme-challenge.q.CLUSTER.DOMAIN`.
//!
//! The zone is rebuilt whole from the queues' records on every change and swapped in, with the
//! SOA serial moving forward; a query reads whichever zone is current.

use super::DnsError;
use crate::model::queue::Queue;
use hickory_server::net::runtime::TokioRuntimeProvider;
use hickory_server::proto::rr::rdata::{A, AAAA, NS, SOA, TXT};
use hickory_server::proto::rr::{LowerName, Name, RData, Record};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneType};
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

/// How long resolvers may keep the zone's own records (SOA, NS) and a name it does not have.
const TTL: u32 = 60;
/// How long resolvers may keep a queue's addresses: seconds, so that clients that reconnect by
/// name find a node placed anew (a promoted standby, a replacement) within seconds.
const QUEUE_TTL: u32 = 5;
/// Serials of its own a zone reserves in the store at a time, so that it writes the store once
/// in this many changes or seconds, not at each.
const SERIALS_RESERVED_AT_ONCE: u32 = 3600;

/// Who the zone says serves it (its NS record, and its SOA's primary).
#[derive(Debug, Clone)]
pub enum Nameserver {
    /// `ns.q.CLUSTER.DOMAIN` at this address, answered by the zone itself (local use).
    InZone(IpAddr),
    /// The names the parent zone delegates to (`dns_names`: one per control-plane replica
    /// and outside secondary), with their glue there: the zone names the servers the parent
    /// names, so resolvers that trust the zone's own NS agree. The first is the SOA's
    /// primary. At least one.
    Named(Vec<String>),
}

/// The zone as served now; [`Zone::update`] swaps in a new one.
pub struct Zone {
    origin: Name,
    nameserver: Nameserver,
    current: RwLock<Arc<Catalog>>,
    /// What the zone is built from; either changing rebuilds it.
    contents: std::sync::Mutex<Contents>,
    /// Held by a refresh from its read to its install.
    refreshing: tokio::sync::Mutex<()>,
    /// The records as last built, for zone transfers; watched for NOTIFY, which is told only
    /// when the serial moves.
    published: tokio::sync::watch::Sender<Snapshot>,
}

/// The zone's records as one build made them: what a transfer sends, what NOTIFY announces.
#[derive(Clone)]
pub(super) struct Snapshot {
    /// The SOA's serial, which names this version of the zone.
    pub(super) serial: u32,
    /// The SOA first ([`Zone::soa`]), then [`Zone::others`].
    records: Arc<[Record]>,
}

impl Snapshot {
    pub(super) fn soa(&self) -> &Record {
        &self.records[0]
    }

    /// Every record but the SOA.
    pub(super) fn others(&self) -> &[Record] {
        &self.records[1..]
    }
}

#[derive(Default)]
struct Contents {
    serial: u32,
    queues: Vec<Queue>,
    /// DNS-01 values of the pending ACME orders: (the name ordered, the value). Orders for
    /// several queues may be pending at once.
    challenges: Vec<(String, String)>,
    /// The store's revision of the above, when it has revisions: the serial then.
    revision: Option<u32>,
    /// Without revisions: the serials up to this are reserved in the store (`None` before
    /// the store was read), so none served can be lower than one served before a restart.
    reserved: Option<u32>,
}

impl Contents {
    /// The serial of its own the zone's next build takes (if anything changed): seconds since
    /// 1970, or one more than the last if that is not ahead.
    fn next_own_serial(&self) -> u32 {
        (crate::unix_now() as u32).max(self.serial + 1)
    }
}

impl Zone {
    /// The zone `q.CLUSTER.DOMAIN.`, empty of queues, served by `nameserver`.
    pub fn new(cluster: &str, domain: &str, nameserver: Nameserver) -> Result<Arc<Zone>, DnsError> {
        let text = format!("q.{cluster}.{domain}.");
        let origin = Name::from_str(&text).map_err(|_| DnsError::Name(text))?;
        if let Nameserver::Named(names) = &nameserver {
            if names.is_empty() {
                return Err(DnsError::NoNameserver);
            }
            for name in names {
                fqdn(name).map_err(|_| DnsError::Name(name.clone()))?;
            }
        }
        // Replaced by the first build below, before anyone can look.
        let empty = Snapshot {
            serial: 0,
            records: Arc::new([]),
        };
        let zone = Arc::new(Zone {
            origin,
            nameserver,
            current: RwLock::new(Arc::new(Catalog::new())),
            contents: std::sync::Mutex::default(),
            refreshing: tokio::sync::Mutex::default(),
            published: tokio::sync::watch::Sender::new(empty),
        });
        zone.update(&[]);
        Ok(zone)
    }

    /// Rebuilds the zone with `queues`; the serial moves forward.
    pub fn update(&self, queues: &[Queue]) {
        self.rebuild(|contents| contents.queues = queues.to_vec());
    }

    /// Rebuilds the zone from the store as it is now: the queues' records and the pending
    /// DNS-01 values (kept in the store so that every replica serves them). Refreshes are
    /// one at a time, read and install, so two never install an older read over a newer
    /// one (a deleted queue's name coming back). With etcd the serial is the store's latest
    /// revision of what the zone is built from: every replica serves the same serial for
    /// the same zone.
    pub async fn refresh(
        &self,
        store: &crate::store::Store,
    ) -> Result<(), crate::store::StoreError> {
        let _one_at_a_time = self.refreshing.lock().await;
        let inputs = store.zone_inputs().await?;
        if inputs.serial.is_none() {
            self.reserve_own_serials(store).await?;
        }
        self.rebuild(|contents| {
            contents.queues = inputs.queues;
            contents.challenges = inputs.challenges;
            // RFC 1982 serials wrap: the low 32 bits move forward with the whole.
            contents.revision = inputs.serial.map(|serial| serial as u32);
        });
        Ok(())
    }

    /// One control plane (no revisions): makes sure the next build's serial is reserved in
    /// the store before it is served. The first time, it starts past what the store says was
    /// reserved: a restart after a burst of changes (serials ahead of the clock) would
    /// otherwise serve a lower serial than before, and a secondary holding the higher one
    /// would ignore every change until the clock caught up (issue 28). Called by a refresh,
    /// which holds `refreshing`: no other build runs between this and its own.
    async fn reserve_own_serials(
        &self,
        store: &crate::store::Store,
    ) -> Result<(), crate::store::StoreError> {
        let reserved = self.contents.lock().expect("never poisoned").reserved;
        let reserved = match reserved {
            Some(reserved) => reserved,
            None => {
                let kept = store.zone_serial_reserved().await?;
                let mut contents = self.contents.lock().expect("never poisoned");
                // Served before the restart, maybe: the next build goes past it.
                contents.serial = contents.serial.max(kept);
                contents.reserved = Some(kept);
                kept
            }
        };
        let next = self
            .contents
            .lock()
            .expect("never poisoned")
            .next_own_serial();
        if next > reserved {
            // A second may pass before the build: reserve ahead of it.
            let up_to = next.saturating_add(SERIALS_RESERVED_AT_ONCE);
            store.reserve_zone_serial(up_to).await?;
            self.contents.lock().expect("never poisoned").reserved = Some(up_to);
        }
        Ok(())
    }

    /// The DNS-01 values it serves now (the name ordered, the value).
    pub fn challenges(&self) -> Vec<(String, String)> {
        self.contents
            .lock()
            .expect("never poisoned")
            .challenges
            .clone()
    }

    /// Changes at every build of the zone.
    pub(super) fn builds(&self) -> tokio::sync::watch::Receiver<Snapshot> {
        self.published.subscribe()
    }

    /// Refreshes the zone at every change to what it is built from, here or on another
    /// replica, for the life of the process.
    pub async fn follow(self: Arc<Zone>, store: crate::store::Store) {
        let mut changes = store.changes();
        loop {
            changes.borrow_and_update();
            if let Err(error) = self.refresh(&store).await {
                tracing::warn!(%error, "the zone could not be refreshed; it serves what it had");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                continue;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Publishes DNS-01 values (the name ordered, the value) until the next refresh, which
    /// serves the store's (tests of the records alone).
    #[cfg(test)]
    pub fn add_challenges(&self, values: &[(String, String)]) {
        self.rebuild(|contents| contents.challenges.extend_from_slice(values));
    }

    #[cfg(test)]
    pub fn remove_challenges(&self, values: &[(String, String)]) {
        self.rebuild(|contents| contents.challenges.retain(|value| !values.contains(value)));
    }

    fn rebuild(&self, change: impl FnOnce(&mut Contents)) {
        let mut contents = self.contents.lock().expect("never poisoned");
        change(&mut contents);
        let others = self.others(&contents);
        let unchanged = || *self.published.borrow().others() == others[..];
        let served = self.published.borrow().serial;
        contents.serial = match contents.revision {
            Some(revision) => revision,
            // One control plane (no revisions): the records as they were (a queue's record
            // changed in nothing the zone shows) keep their serial, so secondaries are not
            // sent for a zone they have. (Not when the serial was raised past the one served,
            // as a restart does: see `reserve_own_serials`.)
            None if contents.serial != 0 && contents.serial == served && unchanged() => return,
            None => contents.next_own_serial(),
        };
        let serial = contents.serial;
        let mut handler = InMemoryZoneHandler::<TokioRuntimeProvider>::empty(
            self.origin.clone(),
            ZoneType::Primary,
            // Transfers never reach hickory: `transfer` answers them, split into messages
            // and for allowed sources only (hickory's catalog sends one message, to anyone
            // or no one). Should one reach it, it refuses.
            AxfrPolicy::Deny,
        );
        let mut records = vec![self.soa(serial)];
        records.extend(others);
        for record in records.iter().cloned() {
            handler.upsert_mut(record, serial);
        }
        let mut catalog = Catalog::new();
        catalog.upsert(LowerName::new(&self.origin), vec![Arc::new(handler)]);
        // Swapped while the contents are locked, so zones are installed in serial order.
        *self.current.write().expect("never poisoned") = Arc::new(catalog);
        self.publish(Snapshot {
            serial,
            records: records.into(),
        });
    }

    /// Watchers of the zone hear of a build only when its serial moved (with a store that
    /// has revisions, a refresh may find nothing new).
    fn publish(&self, snapshot: Snapshot) {
        self.published.send_if_modified(|published| {
            let moved = published.serial != snapshot.serial;
            *published = snapshot;
            moved
        });
    }

    /// The SOA of the zone at `serial` (a [`Snapshot`]'s first record: transfers count on it).
    fn soa(&self, serial: u32) -> Record {
        let soa = SOA::new(
            self.nameservers()[0].clone(),
            self.name("hostmaster"),
            serial,
            3600,
            600,
            86_400,
            TTL,
        );
        Record::from_rdata(self.origin.clone(), TTL, RData::SOA(soa))
    }

    /// Every record but the SOA, which the serial names.
    fn others(&self, contents: &Contents) -> Vec<Record> {
        let servers = self.nameservers();
        let mut records = Vec::new();
        for server in &servers {
            let ns = RData::NS(NS(server.clone()));
            records.push(Record::from_rdata(self.origin.clone(), TTL, ns));
        }
        if let Nameserver::InZone(ip) = self.nameserver {
            records.push(Record::from_rdata(self.name("ns"), TTL, address(ip)));
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
            records.push(Record::from_rdata(name.clone(), QUEUE_TTL, v6));
            if let (true, Some(v4)) = (queue.ipv4, addresses.v4) {
                records.push(Record::from_rdata(name, QUEUE_TTL, RData::A(A(v4))));
            }
        }
        records
    }

    /// The zone's name servers, the SOA's primary first.
    fn nameservers(&self) -> Vec<Name> {
        match &self.nameserver {
            Nameserver::InZone(_) => vec![self.name("ns")],
            Nameserver::Named(names) => names
                .iter()
                .map(|name| fqdn(name).expect("checked in Zone::new"))
                .collect(),
        }
    }

    /// The zone as last built.
    /// The SOA serial served now.
    pub fn serial(&self) -> u32 {
        self.published.borrow().serial
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        self.published.borrow().clone()
    }

    /// The zone as last built, marked changed each time its serial moves.
    pub(super) fn watch(&self) -> tokio::sync::watch::Receiver<Snapshot> {
        self.published.subscribe()
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

/// `name` as a fully qualified DNS name, whether or not it ends with a dot.
fn fqdn(name: &str) -> Result<Name, hickory_server::proto::ProtoError> {
    Name::from_str(&format!("{}.", name.trim_end_matches('.')))
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
    use crate::dns::{serve, Secondaries};
    use crate::model::queue::Status;
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
        use crate::model::queue::{create, Addresses, NewQueue, Tier};
        let zone = Zone::new(
            "c",
            "example.test",
            Nameserver::InZone("127.0.0.1".parse().unwrap()),
        )
        .unwrap();
        let secondaries = Secondaries::default();
        let server = serve(zone.clone(), "127.0.0.1:0".parse().unwrap(), secondaries)
            .await
            .unwrap();
        let new = |ipv4| NewQueue {
            tier: Tier::Devtest,
            region: "r".into(),
            instance_type: "t".into(),
            ipv4,
            account: None,
            ..Default::default()
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
        let secondaries = Secondaries::default();
        let server = serve(zone.clone(), "127.0.0.1:0".parse().unwrap(), secondaries)
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
    async fn a_delegated_zone_names_the_servers_its_parent_names() {
        let names = vec!["ns1.c.example.test".into(), "ns2.example.net.".into()];
        let zone = Zone::new("c", "example.test", Nameserver::Named(names)).unwrap();
        let secondaries = Secondaries::default();
        let server = serve(zone.clone(), "127.0.0.1:0".parse().unwrap(), secondaries)
            .await
            .unwrap();
        let (code, mut ns) = ask(server, "q.c.example.test.", RecordType::NS).await;
        ns.sort();
        assert_eq!(
            (code, ns),
            (
                ResponseCode::NoError,
                vec!["ns1.c.example.test.".into(), "ns2.example.net.".into()]
            )
        );
        let (_, soa) = ask(server, "q.c.example.test.", RecordType::SOA).await;
        assert!(soa[0].starts_with("ns1.c.example.test. "), "{soa:?}");
        let (code, _) = ask(server, "ns.q.c.example.test.", RecordType::A).await;
        assert_eq!(
            code,
            ResponseCode::NXDomain,
            "no server of its own in the zone"
        );
        let bad = Nameserver::Named(vec!["not a name..".into()]);
        assert!(Zone::new("c", "example.test", bad).is_err());
        let none = Nameserver::Named(vec![]);
        assert!(Zone::new("c", "example.test", none).is_err());
    }
}
