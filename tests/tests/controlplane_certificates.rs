//! The control plane's DNS and certificates, with the real binaries: the zone follows the
//! queues, each queue's node gets its own certificate by DNS-01 (Pebble), the opt-in cluster
//! wildcard, and a TLS node that starts while its control plane is down.

use controlplane::pebble::Pebble;
use qe_tests::{dig, http, roots_from_pem, wait_until_applied, Client, ControlPlane, Dig};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

#[tokio::test]
async fn the_dns_answers_for_queues_aaaa_always_a_with_ipv4_and_nxdomain_after_delete() {
    let cp = ControlPlane::start_with("dns_listen = \"127.0.0.1:0\"\n");
    let dns = cp.dns.expect("a DNS server");
    let create = |ipv4: bool| {
        format!(r#"{{"tier":"devtest","region":"local","instance_type":"local","ipv4":{ipv4}}}"#)
    };
    let with_ipv4 = cp.create_queue(&create(true)).await;
    let v6_only = cp.create_queue(&create(false)).await;
    let host = |queue: &serde_json::Value| queue["host"].as_str().unwrap().to_string();
    // A queue's records live 5 s in a resolver: its name moves within seconds (a standby
    // promoted, a node replaced).
    let answer = |status: &str, answers: &[&str]| Dig {
        status: status.into(),
        authoritative: true,
        answers: answers.iter().map(|a| a.to_string()).collect(),
        ttls: answers.iter().map(|_| 5).collect(),
    };

    assert_eq!(
        with_ipv4["addresses"],
        json!({"v6": "::1", "v4": "127.0.0.1"})
    );
    assert_eq!(v6_only["addresses"], json!({"v6": "::1", "v4": null}));
    for tcp in [false, true] {
        let asked = dig(dns, &host(&with_ipv4), "AAAA", tcp);
        assert_eq!(asked, answer("NOERROR", &["::1"]), "tcp {tcp}");
        let asked = dig(dns, &host(&with_ipv4), "A", tcp);
        assert_eq!(asked, answer("NOERROR", &["127.0.0.1"]), "tcp {tcp}");
        let asked = dig(dns, &host(&v6_only), "AAAA", tcp);
        assert_eq!(asked, answer("NOERROR", &["::1"]), "tcp {tcp}");
        let asked = dig(dns, &host(&v6_only), "A", tcp);
        assert_eq!(asked, answer("NOERROR", &[]), "no A without IPv4");
    }
    let unknown = dig(dns, "nosuchqueue.q.test.thequeueexpert.com", "AAAA", false);
    assert_eq!(unknown.status, "NXDOMAIN");
    let outside = dig(dns, "example.com", "A", false);
    assert_eq!(outside.status, "REFUSED", "not our zone: {outside:?}");
    let serial = |tcp: bool| -> u32 {
        let soa = dig(dns, "q.test.thequeueexpert.com", "SOA", tcp);
        soa.soa_serial().unwrap()
    };
    let serial_before = serial(false);

    let id = with_ipv4["id"].as_str().unwrap();
    cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    for tcp in [false, true] {
        let gone = dig(dns, &host(&with_ipv4), "AAAA", tcp);
        assert_eq!(gone.status, "NXDOMAIN", "tcp {tcp}");
    }
    let serial_after = serial(true);
    assert!(
        serial_after > serial_before,
        "{serial_before} → {serial_after}"
    );
}

#[tokio::test]
async fn each_queue_gets_its_own_certificate_by_dns_01_from_its_nodes_csr_and_renews_it() {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dns: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let pebble_dir = tempfile::tempdir().unwrap();
    let pebble = Pebble::start(dns, pebble_dir.path()).await.unwrap();
    let pebble_root = pebble.issuing_root().await.unwrap();
    let config = format!(
        "dns_listen = \"{dns}\"\n[acme]\ndirectory = \"{}\"\nca_root = {:?}\n",
        pebble.directory, pebble.listener_ca
    );
    let cp = ControlPlane::start_with(&config);

    let body = r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":true}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap();
    let table = cp.node_config(id);
    let token = table["node_token"].as_str().unwrap();
    // No certificate with a key is handed out: each node made its own key and sent a CSR.
    let path = format!("/v1/nodes/{id}/certificate");
    let (status, _) = http(cp.addr, "GET", &path, Some(&cp.token), None).await;
    assert_eq!(status, 401, "the operator's token is not a node's");
    let (status, none) = http(cp.addr, "GET", &path, Some(token), None).await;
    assert_eq!(status, 404, "{none}");
    let key = cp.node_dir(id).join("data/tls/own-key.pem");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "the key stays on the node, readable by it alone"
    );
    // A CSR for another queue's name is refused, with this node's credential.
    let other_key = rcgen::KeyPair::generate().unwrap();
    let other_csr = rcgen::CertificateParams::new(vec![format!("other.q.test.thequeueexpert.com")])
        .unwrap()
        .serialize_request(&other_key)
        .unwrap()
        .pem()
        .unwrap();
    let request = json!({"csr_pem": other_csr}).to_string();
    let (status, refused) = http(cp.addr, "POST", &path, Some(token), Some(&request)).await;
    assert_eq!(status, 400, "{refused}");
    // Its own name again, so soon and unasked: the CA's limits are not the node's to spend.
    let again = rcgen::CertificateParams::new(vec![queue["host"].as_str().unwrap().to_string()])
        .unwrap()
        .serialize_request(&other_key)
        .unwrap()
        .pem()
        .unwrap();
    let request = json!({"csr_pem": again}).to_string();
    let (status, refused) = http(cp.addr, "POST", &path, Some(token), Some(&request)).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (429, Some("too_many_requests")),
        "{refused}"
    );

    // The served chain verifies against Pebble's issuing root for this queue's name only.
    let host = queue["host"].as_str().unwrap().to_string();
    let at = node_at_v6(&queue);
    let leaf = CertificateDer::from(served_leaf(at, &host, &pebble_root).await);
    let roots = roots_from_pem(&pebble_root);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
    let chain = served_chain(at, &host, &pebble_root).await;
    let name = ServerName::try_from(host.clone()).unwrap();
    verifier
        .verify_server_cert(&leaf, &chain[1..], &name, &[], UnixTime::now())
        .expect("a chain for the queue's name");
    let other = ServerName::try_from("other.q.test.thequeueexpert.com").unwrap();
    assert!(
        verifier
            .verify_server_cert(&leaf, &chain[1..], &other, &[], UnixTime::now())
            .is_err(),
        "not a wildcard: no other queue's name"
    );

    // The node serves wss:// by name with it: resolve the name through our DNS, connect to
    // what it says, verify against Pebble's root, publish and subscribe.
    let url = queue["node"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("wss://{}:", queue["host"].as_str().unwrap())),
        "{url}"
    );
    let port = node_at_v6(&queue).port();
    let host = queue["host"].as_str().unwrap();
    let ip: std::net::IpAddr = dig(dns, host, "AAAA", false).answers[0].parse().unwrap();
    let at = std::net::SocketAddr::new(ip, port);
    let trusted = roots_from_pem(&pebble_root);
    let logins = &queue["logins"];
    let mut subscriber = Client::connect_tls_at(url, at, trusted.clone()).await;
    let reply = subscriber
        .request(json!({"username": logins["subscriber"]["username"],
            "password": logins["subscriber"]["password"], "role": "subscriber",
            "queuetype": "distribute", "capacity": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let mut publisher = Client::connect_tls_at(url, at, trusted).await;
    let reply = publisher
        .request(json!({"username": logins["publisher"]["username"],
            "password": logins["publisher"]["password"], "role": "publisher",
            "queuetype": "distribute"}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    publisher
        .request(json!({"body": "over wss, by name"}))
        .await;
    assert_eq!(subscriber.recv().await["body"], "over wss, by name");

    // A forced renewal: the node serves the new certificate to new connections, and the open
    // ones go on.
    let before = served_leaf(at, host, &pebble_root).await;
    let (status, _) = cp.call("POST", "/v1/certificate/renew", None).await;
    assert_eq!(status, 202);
    wait_until_applied(&cp, id).await;
    let after = served_leaf(at, host, &pebble_root).await;
    assert_ne!(before, after, "a new certificate");
    let reply = publisher
        .request(json!({"body": "after the renewal"}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    assert_eq!(subscriber.recv().await["body"], "after the renewal");

    // The audit log: the operator asked for the renewal; the node's certificates were issued
    // to its CSRs, twice.
    let (_, audit) = cp.call("GET", "/v1/audit", None).await;
    let entries = audit["entries"].as_array().unwrap();
    let count = |actor: &Value, action: &str| {
        entries
            .iter()
            .filter(|e| &e["actor"] == actor && e["action"] == action && e["result"] == "ok")
            .count()
    };
    let by_node = json!({"kind": "node", "queue": id});
    assert_eq!(count(&by_node, "certificate.issue"), 2, "{audit}");
    let by_operator = json!({"kind": "operator"});
    assert_eq!(count(&by_operator, "certificate.renew"), 1, "{audit}");
}

/// Where a local queue's node listens on ::1 (its `node` URL's port).
fn node_at_v6(queue: &Value) -> std::net::SocketAddr {
    let url = queue["node"].as_str().unwrap();
    let port = url.rsplit(':').next().unwrap().trim_end_matches('/');
    std::net::SocketAddr::new("::1".parse().unwrap(), port.parse().unwrap())
}

/// The leaf certificate a TLS server at `at` presents for `host`, verified against `root`.
async fn served_leaf(at: std::net::SocketAddr, host: &str, root: &str) -> Vec<u8> {
    served_chain(at, host, root).await[0].to_vec()
}

/// The chain a TLS server at `at` presents for `host`, verified against `root`.
async fn served_chain(
    at: std::net::SocketAddr,
    host: &str,
    root: &str,
) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    let connector = tokio_rustls::TlsConnector::from(qe_tls::client_config(roots_from_pem(root)));
    let tcp = tokio::net::TcpStream::connect(at).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    let chain = tls.get_ref().1.peer_certificates().unwrap();
    chain.iter().map(|der| der.clone().into_owned()).collect()
}

#[tokio::test]
async fn the_opt_in_cluster_wildcard_is_fetched_whole_by_nodes_and_renewed_on_demand() {
    use rustls::pki_types::pem::PemObject;
    let cp = ControlPlane::start_with("local_ca = true\nwildcard_certificate = true\n");
    cp.wait_for_log("certificate issued", 1);
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap();
    let token = cp.node_config(id)["node_token"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/nodes/{id}/certificate");
    let (status, issued) = http(cp.addr, "GET", &path, Some(&token), None).await;
    assert_eq!(status, 200, "{issued}");
    assert!(issued["key_pem"].as_str().unwrap().contains("PRIVATE KEY"));
    // No CSRs in this mode: every node serves the one wildcard.
    let (status, _) = http(
        cp.addr,
        "POST",
        &path,
        Some(&token),
        Some(r#"{"csr_pem":"x"}"#),
    )
    .await;
    assert_eq!(status, 409);

    let root = std::fs::read_to_string(cp.dir.path().join("data/local-ca/ca.pem")).unwrap();
    let host = queue["host"].as_str().unwrap();
    let at = node_at_v6(&queue);
    let served = served_leaf(at, host, &root).await;
    let chain = issued["chain_pem"].as_str().unwrap().as_bytes();
    let wildcard = rustls::pki_types::CertificateDer::pem_slice_iter(chain)
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(served, wildcard.to_vec(), "the node serves the wildcard");

    // A forced renewal: a new wildcard, and every node fetches it (over the channel).
    let (status, _) = cp.call("POST", "/v1/certificate/renew", None).await;
    assert_eq!(status, 202);
    cp.wait_for_log("certificate issued", 2);
    wait_until_applied(&cp, id).await;
    let (_, config) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(config["config"]["version"], 2, "{config}");
    assert_ne!(
        served_leaf(at, host, &root).await,
        served,
        "a new certificate"
    );
    // The control plane issued the wildcard twice on its own account: when none was there,
    // and when the operator asked.
    let (_, audit) = cp.call("GET", "/v1/audit", None).await;
    let issued_by_control_plane = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["actor"]["kind"] == "control-plane" && e["action"] == "certificate.issue")
        .count();
    assert_eq!(issued_by_control_plane, 2, "{audit}");
}

#[tokio::test]
async fn a_tls_node_started_while_its_control_plane_is_down_serves_the_config_and_certificate_it_kept(
) {
    let mut cp = ControlPlane::start_with("local_ca = true\n");
    let queue = cp
        .create_queue(r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":true}"#)
        .await;
    let node_dir = cp.node_dir(queue["id"].as_str().unwrap());
    let root = std::fs::read_to_string(cp.dir.path().join("data/local-ca/ca.pem")).unwrap();
    cp.kill();

    // The same node, on a data directory that kept its config and certificate from an
    // earlier run.
    let kept = tempfile::tempdir().unwrap();
    std::fs::create_dir(kept.path().join("tls")).unwrap();
    for file in ["tls/own-cert.pem", "tls/own-key.pem", "desired-config.json"] {
        std::fs::copy(node_dir.join("data").join(file), kept.path().join(file)).unwrap();
    }
    let bootstrap = node_dir.join("bootstrap.toml").display().to_string();
    let cert = kept.path().join("tls/own-cert.pem").display().to_string();
    let key = kept.path().join("tls/own-key.pem").display().to_string();
    // The harness's logins and a free port; the bootstrap's control plane, queue and token.
    let flags = [
        "--bootstrap",
        &bootstrap,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    let node = qe_tests::Node::start_in(kept, &flags);
    node.wait_for_log("starting with the config kept from before");
    let host = queue["host"].as_str().unwrap();
    let url = format!("wss://{host}:{}/", node.addr.port());
    let mut publisher = Client::connect_tls_at(&url, node.addr, roots_from_pem(&root)).await;
    let (name, password) = qe_tests::PUBLISHER;
    let reply = publisher
        .request(
            json!({"username": name, "password": password, "role": "publisher",
            "queuetype": "distribute"}),
        )
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
}
