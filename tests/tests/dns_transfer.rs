//! Zone transfers, with the real binaries: Knot DNS as an outside secondary takes the control
//! plane's zone by AXFR, answers as the control plane does, and follows a change after the
//! control plane's NOTIFY; a transfer from a source outside `dns_transfer_allow` is REFUSED.
//! With a TSIG key (`[dns_tsig]`), Knot signs its transfers and takes only signed NOTIFYs, and
//! checks the signature of every message of a transfer that takes many.

use qe_tests::knot::Knot;
use qe_tests::{dig, ControlPlane};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

/// The zone of a control plane with `cluster = "test"` and the default domain.
const ZONE: &str = "q.test.thequeueexpert.com";

const CREATE: &str = r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":true}"#;

/// A TSIG key as `keymgr -t transfer.test. hmac-sha256` makes one: 32 random bytes in base64.
const KEY_NAME: &str = "transfer.test.";
const SECRET: &str = "Vq8c5yq0Hk0Wf7mJ3nR9tL2xA6pE1sD4gB8uZ0cK3yM=";

/// How long a secondary gets to catch up: a NOTIFY, an SOA query and a transfer on loopback
/// take milliseconds; without NOTIFY it would wait for the SOA's refresh, an hour.
const CATCH_UP: Duration = Duration::from_secs(20);

#[tokio::test]
async fn knot_takes_the_zone_by_axfr_and_follows_it_after_notify() {
    let knot_addr = controlplane::dns::free_addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .await
        .unwrap();
    let cp = ControlPlane::start_with(&format!(
        "dns_listen = \"127.0.0.1:0\"\n\
         dns_names = [\"ns1.example.net\", \"ns2.example.net\"]\n\
         dns_transfer_allow = [\"127.0.0.1/32\"]\n\
         dns_notify = [\"{knot_addr}\"]\n"
    ));
    let primary = cp.dns.expect("a DNS server");
    let existing = cp.create_queue(CREATE).await;

    let knot = Knot::secondary(ZONE, primary, knot_addr);
    let from_us = format!("remote {}@{}", primary.ip(), primary.port());
    knot.wait_for_log(&format!("AXFR, incoming, {from_us}, finished"), 1);
    eventually("knot serves our serial", || {
        serial(knot.addr) == Some(serial(primary).unwrap())
    })
    .await;
    let existing = host_of(&existing);
    for kind in ["AAAA", "A"] {
        let ours = dig(primary, &existing, kind, false);
        assert_eq!(ours.answers.len(), 1, "{ours:?}");
        assert_eq!(dig(knot.addr, &existing, kind, false), ours, "{kind}");
    }
    let mut servers = dig(knot.addr, ZONE, "NS", false).answers;
    servers.sort();
    assert_eq!(servers, ["ns1.example.net.", "ns2.example.net."]);
    let soa = &dig(knot.addr, ZONE, "SOA", false).answers[0];
    let primary_first = soa.starts_with("ns1.example.net. ");
    assert!(primary_first, "the SOA names the first: {soa}");

    let notified = knot.log().matches("notify, incoming").count();
    let added = host_of(&cp.create_queue(CREATE).await);
    let ours = dig(primary, &added, "AAAA", false);
    assert_eq!(ours.answers, ["::1"]);
    eventually("knot answers for the new queue", || {
        dig(knot.addr, &added, "AAAA", false) == ours
    })
    .await;
    // Told, not polled: the SOA's refresh is an hour away. It asked for the changes since
    // its serial (IXFR) and took the whole zone we sent instead.
    knot.wait_for_log("notify, incoming", notified + 1);
    knot.wait_for_log(
        &format!("IXFR, incoming, {from_us}, receiving AXFR-style IXFR"),
        1,
    );
    eventually("knot serves our latest serial", || {
        serial(knot.addr) == Some(serial(primary).unwrap())
    })
    .await;
}

#[tokio::test]
async fn a_transfer_is_given_to_allowed_sources_only_and_never_over_udp() {
    let cp = ControlPlane::start_with(
        "dns_listen = \"127.0.0.1:0\"\ndns_transfer_allow = [\"127.0.0.1/32\"]\n",
    );
    let dns = cp.dns.expect("a DNS server");
    cp.create_queue(CREATE).await;
    let soa = dig(dns, ZONE, "SOA", false).answers[0].clone();
    let allowed = records(&transfer(dns, "AXFR", "127.0.0.1"));
    assert_eq!(allowed.first(), Some(&soa), "{allowed:?}");
    assert_eq!(allowed.last(), Some(&soa), "{allowed:?}");
    let has = |data: &str| allowed.iter().any(|record| record == data);
    assert!(has("::1") && has("127.0.0.1"), "the queue's: {allowed:?}");
    let ixfr = records(&transfer(dns, "IXFR=1", "127.0.0.1"));
    assert_eq!(ixfr, allowed, "IXFR in AXFR form");

    let refused = transfer(dns, "AXFR", "127.0.0.2");
    assert!(refused.contains("Transfer failed"), "{refused}");
    assert!(records(&refused).is_empty(), "{refused}");
    // dig says no more; kdig gives the response's code, on stderr.
    let port = dns.port().to_string();
    let refused = kdig(&["-b", "127.0.0.2", "-p", &port, ZONE, "AXFR", "+tcp"], dns);
    assert!(refused.1.contains("REFUSED"), "{refused:?}");

    // Over UDP: an IXFR gets the SOA alone, which says to ask over TCP (RFC 1995 §2).
    let (ixfr, _) = kdig(&["-p", &port, ZONE, "IXFR=1", "+notcp"], dns);
    assert!(ixfr.contains("(1 messages, 1 records)"), "{ixfr}");
    assert!(ixfr.contains("\tSOA\t"), "{ixfr}");
    // An AXFR, a truncated answer (the tools only ever send one over TCP).
    assert_eq!(axfr_over_udp(dns).await, (true, 0), "(TC, answers)");
}

/// Whether the response to an AXFR sent over UDP to `server` is truncated, and its answers.
async fn axfr_over_udp(server: SocketAddr) -> (bool, u16) {
    let mut query = vec![0x12, 0x34, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in ZONE.split('.') {
        query.push(label.len() as u8);
        query.extend(label.as_bytes());
    }
    // The root, then type AXFR (252), class IN.
    query.extend([0, 0, 252, 0, 1]);
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(&query, server).await.unwrap();
    let mut response = [0; 512];
    let received = tokio::time::timeout(Duration::from_secs(10), socket.recv(&mut response));
    let length = received.await.expect("a response").unwrap();
    let response = &response[..length];
    assert!(
        length >= 12 && response[..2] == [0x12, 0x34],
        "{response:?}"
    );
    let truncated = response[2] & 0x02 != 0;
    (truncated, u16::from_be_bytes([response[6], response[7]]))
}

fn host_of(queue: &serde_json::Value) -> String {
    queue["host"].as_str().unwrap().to_string()
}

/// What `dig` prints of a transfer of the zone (`kind`: `AXFR`, or `IXFR=SERIAL`) from
/// `server`, asked from `source`.
fn transfer(server: SocketAddr, kind: &str, source: &str) -> String {
    let output = Command::new("dig")
        .args(["-b", source, &format!("@{}", server.ip())])
        .args(["-p", &server.port().to_string(), ZONE, kind])
        .args(["+noall", "+answer", "+time=5", "+tries=1"])
        .output()
        .expect("dig (apt-get install dnsutils; ./scripts/test does)");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "dig failed:\n{text}");
    text
}

/// The records' data (a SOA's fields, an address ...) in what dig printed, in order.
fn records(dig_said: &str) -> Vec<String> {
    let data = |line: &str| {
        line.split_whitespace()
            .skip(4)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let record = |line: &&str| !line.starts_with(';') && !line.trim().is_empty();
    dig_said.lines().filter(record).map(data).collect()
}

/// What Knot's `kdig` prints asking `server` with `args`: (stdout, stderr).
fn kdig(args: &[&str], server: SocketAddr) -> (String, String) {
    let output = Command::new("kdig")
        .arg(format!("@{}", server.ip()))
        .args(args)
        .output()
        .expect("kdig (apt-get install knot-dnsutils; ./scripts/test does)");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).to_string();
    (text(&output.stdout), text(&output.stderr))
}

/// The zone's SOA serial as `server` answers it, if it does.
fn serial(server: SocketAddr) -> Option<u32> {
    dig(server, ZONE, "SOA", false).soa_serial()
}

/// Asks `done` every 50 ms until it holds, failing after [`CATCH_UP`].
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + CATCH_UP;
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn with_a_tsig_key_transfers_and_notify_are_signed_and_unsigned_transfers_refused() {
    let knot_addr = controlplane::dns::free_addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .await
        .unwrap();
    let secret_dir = tempfile::tempdir().unwrap();
    let secret_file = secret_dir.path().join("tsig.secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let cp = ControlPlane::start_with(&format!(
        "dns_listen = \"127.0.0.1:0\"\n\
         dns_transfer_allow = [\"127.0.0.1/32\"]\n\
         dns_notify = [\"{knot_addr}\"]\n\
         [dns_tsig]\nkey_name = \"{KEY_NAME}\"\nsecret_file = {secret_file:?}\n"
    ));
    let primary = cp.dns.expect("a DNS server");
    let existing = host_of(&cp.create_queue(CREATE).await);

    // Knot signs its SOA queries and its transfer with the key, and checks our answers' MACs:
    // it would refuse the zone if one were missing or wrong.
    let knot = Knot::signed_secondary(ZONE, primary, knot_addr, (KEY_NAME, SECRET));
    let from_us = format!("remote {}@{}", primary.ip(), primary.port());
    knot.wait_for_log(&format!("AXFR, incoming, {from_us}, finished"), 1);
    eventually("knot serves our serial", || {
        serial(knot.addr) == Some(serial(primary).unwrap())
    })
    .await;
    assert_eq!(
        dig(knot.addr, &existing, "AAAA", false),
        dig(primary, &existing, "AAAA", false)
    );

    // Knot's ACL takes a NOTIFY signed with the key only: it follows a change at once.
    let notified = knot.log().matches("notify, incoming").count();
    let added = host_of(&cp.create_queue(CREATE).await);
    let ours = dig(primary, &added, "AAAA", false);
    eventually("knot answers for the new queue", || {
        dig(knot.addr, &added, "AAAA", false) == ours
    })
    .await;
    knot.wait_for_log("notify, incoming", notified + 1);
    let log = knot.log();
    assert!(!log.contains("denied") && !log.contains("TSIG"), "{log}");

    // From the allowed address but without the key: REFUSED. With the key's name and another
    // secret, or another key: NOTAUTH, its TSIG saying why. With the key: the zone, signed
    // (kdig checks the MAC).
    let port = primary.port().to_string();
    let axfr = ["-p", &port, ZONE, "AXFR", "+tcp"];
    let unsigned = kdig(&axfr, primary);
    assert!(unsigned.1.contains("REFUSED"), "{unsigned:?}");
    let wrong_secret =
        format!("hmac-sha256:{KEY_NAME}:b3RoZXItc2VjcmV0LW9mLXRoaXJ0eS10d28tYnl0ZXM=");
    let bad_sig = kdig(&[&["-y", &wrong_secret][..], &axfr].concat(), primary);
    assert!(
        bad_sig.1.contains("replied with error 'BADSIG'"),
        "{bad_sig:?}"
    );
    let other_key = format!("hmac-sha256:other.test.:{SECRET}");
    let bad_key = kdig(&[&["-y", &other_key][..], &axfr].concat(), primary);
    assert!(
        bad_key.1.contains("replied with error 'BADKEY'"),
        "{bad_key:?}"
    );
    let right = format!("hmac-sha256:{KEY_NAME}:{SECRET}");
    let signed = kdig(&[&["-y", &right][..], &axfr].concat(), primary);
    assert!(
        signed.0.contains(&added) && signed.1.is_empty(),
        "{signed:?}"
    );
}

// Multi-threaded: the DNS server runs in this process while the test waits on Knot's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn knot_checks_the_chained_signature_of_every_message_of_a_large_transfer() {
    use controlplane::dns::{self, Nameserver, Secondaries, TsigKey, Zone};
    let ns = Nameserver::Named(vec!["ns1.example.net".into()]);
    let zone = Zone::new("test", "thequeueexpert.com", ns).unwrap();
    let queues: Vec<_> = (0..3000).map(placed).collect();
    zone.update(&queues);
    let knot_addr = dns::free_addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .await
        .unwrap();
    let secondaries = Secondaries {
        allow: vec!["127.0.0.1/32".parse().unwrap()],
        notify: vec![knot_addr],
        key: Some(TsigKey::new(KEY_NAME, SECRET).unwrap()),
    };
    let primary = dns::serve(zone, "127.0.0.1:0".parse().unwrap(), secondaries)
        .await
        .unwrap();

    let knot = Knot::signed_secondary(ZONE, primary, knot_addr, (KEY_NAME, SECRET));
    let from_us = format!("remote {}@{}", primary.ip(), primary.port());
    let log = knot.wait_for_log(&format!("AXFR, incoming, {from_us}, finished"), 1);
    let messages = log
        .lines()
        .find(|line| line.contains("AXFR, incoming") && line.contains("finished"))
        .and_then(|line| {
            line.split(", ")
                .find_map(|part| part.strip_suffix(" messages"))
        })
        .and_then(|count| count.parse::<usize>().ok())
        .expect("a count of messages");
    assert!(messages > 5, "a transfer of {messages} messages: {log}");
    let last = &queues[2999];
    let host = format!("{}.{ZONE}", last.id);
    eventually("knot answers for the last queue", || {
        dig(knot.addr, &host, "AAAA", false).answers == ["2001:db8::bb7"]
    })
    .await;
}

/// Queue `n` of a made-up zone, running at 2001:db8::`n` and 10.0.0.`n`.
fn placed(n: u32) -> controlplane::model::queue::Queue {
    use controlplane::model::queue::{create, Addresses, NewQueue, Status, Tier};
    let (mut queue, _) = create(NewQueue {
        tier: Tier::Devtest,
        region: "local".into(),
        instance_type: "local".into(),
        ipv4: true,
        ..Default::default()
    });
    queue.status = Status::Running;
    queue.addresses = Some(Addresses {
        v6: std::net::Ipv6Addr::from_bits(0x2001_0db8 << 96 | u128::from(n)),
        v4: Some(Ipv4Addr::from_bits(0x0a00_0000 | n)),
    });
    queue
}
