//! A cloud on this machine for queues on "EC2 instances": moto (EC2's emulator) with a
//! region's network, the control plane on it over HTTPS (its EC2 provider, the local CA, its
//! DNS), and the instances it launches booted in network namespaces of their own
//! ([`crate::instance`]) from the user data moto was given; clients reach a queue by its name
//! through the control plane's DNS, over wss:// with the local CA's root. Shared by
//! `tests/instance.rs` and `bench failover --instances`.

use crate::instance::Instance;
use crate::moto::{self, describe_instance, Moto};
use crate::{dig, https, roots_from_pem, Client, ControlPlane};
use qe_ec2::Ec2;
use serde_json::{json, Value};
use std::net::{Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

/// The region the cloud has, with its two zones' subnets (moto's network).
pub const REGION: &str = "us-east-1";

/// How often nodes report (live stats), and after how many silent intervals the control plane
/// fences a node and replaces it (or promotes its standby's machine): the silence limit is
/// their product. Short, so that a failover takes seconds.
pub const LIVE_STATS_SECS: u64 = 1;
pub const SILENT_AFTER_INTERVALS: u64 = 3;

/// How long a node may be unheard from before it is replaced (or its standby promoted).
pub fn silence_limit() -> Duration {
    Duration::from_secs(LIVE_STATS_SECS * SILENT_AFTER_INTERVALS)
}

/// The control plane over HTTPS on every address (the nodes reach it at the host end of their
/// link), and what the test needs to call it.
pub struct Api {
    pub cp: ControlPlane,
    /// Where the test calls it: loopback, the same port.
    pub at: SocketAddr,
    /// The roots its API certificate is checked against.
    pub roots: rustls::RootCertStore,
}

impl Api {
    /// One call with the operator's token: the status and the JSON body.
    pub async fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let token = Some(self.cp.token.as_str());
        https(self.at, self.roots.clone(), method, path, token, body).await
    }

    /// A new SQS key of queue `id`'s admin role, given to its node already (`applied`): its
    /// `endpoint`, `queue_url`, `access_key_id` and `secret`.
    pub async fn admin_sqs_key(&self, id: &str) -> Value {
        let path = format!("/v1/queues/{id}/sqs-keys");
        let (status, key) = self.call("POST", &path, Some(r#"{"role":"admin"}"#)).await;
        assert_eq!(
            (status, &key["applied"]),
            (201, &Value::Bool(true)),
            "{key}"
        );
        key
    }

    /// Queue `id` once `done` says so of it (within 60 s).
    pub async fn until(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, queue) = self.call("GET", &format!("/v1/queues/{id}"), None).await;
            if done(&queue) {
                return queue;
            }
            assert!(Instant::now() < deadline, "never so: {queue}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Queue `id` once the provider placed it on an instance other than `not`.
    pub async fn placed(&self, id: &str, not: Option<&str>) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, queue) = self.call("GET", &format!("/v1/queues/{id}"), None).await;
            let instance = queue["resources"]["instance"].as_str();
            if instance.is_some() && instance != not {
                return queue;
            }
            assert!(Instant::now() < deadline, "never placed: {queue}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// An API certificate for `host` (where the nodes reach it) and for loopback, from a CA of
/// the test's own, and the control plane's config for it, moto and the local CA, with
/// `provider` (lines) added to its `[provider]` section.
pub fn control_plane(
    moto: &Moto,
    ec2: &Ec2,
    dir: &std::path::Path,
    host: Ipv6Addr,
    provider: &str,
) -> Api {
    let ca = crate::test_ca("the control plane's CA");
    let key = rcgen::KeyPair::generate().unwrap();
    let names = vec![host.to_string(), "::1".to_string()];
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    std::fs::write(dir.join("api.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("api-key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let port = std::net::TcpListener::bind("[::]:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let region = &ec2.settings().regions[REGION];
    let config = format!(
        "node_url = \"https://[{host}]:{port}\"\nreconcile_every_secs = 1\nlocal_ca = true\n\
         live_stats_secs = {LIVE_STATS_SECS}\n\
         replace_silent_after_intervals = {SILENT_AFTER_INTERVALS}\n\
         dns_listen = \"127.0.0.1:0\"\n\
         [api_tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n\
         [provider]\nkind = \"ec2\"\nendpoint = \"{}\"\n{provider}\n\
         [provider.regions.{REGION}]\n\
         image_id = {:?}\nsubnet_id = {:?}\nsecurity_group_ids = [{:?}]\n\
         standby_subnet_id = {:?}\n",
        dir.join("api.pem"),
        dir.join("api-key.pem"),
        dir.join("ca.pem"),
        moto.endpoint,
        region.image_id,
        region.subnet_id,
        region.security_group_ids[0],
        region
            .standby_subnet_id
            .as_deref()
            .expect("moto's standby subnet"),
    );
    let cp = ControlPlane::start_listening(&format!("[::]:{port}"), &config);
    Api {
        at: SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port),
        roots: roots_from_pem(&ca.pem()),
        cp,
    }
}

/// Moto with a region's network, a directory for the instances' files, and the control plane
/// on them.
pub async fn cloud() -> (Moto, Ec2, tempfile::TempDir, Api) {
    cloud_reached_at(moto::HOST_V6.parse().unwrap()).await
}

/// As [`cloud`], with the nodes reaching the control plane at `host`.
pub async fn cloud_reached_at(host: Ipv6Addr) -> (Moto, Ec2, tempfile::TempDir, Api) {
    cloud_reached_at_with(host, "").await
}

/// As [`cloud_reached_at`], with `provider` (lines) added to the control plane's `[provider]`
/// section.
pub async fn cloud_reached_at_with(
    host: Ipv6Addr,
    provider: &str,
) -> (Moto, Ec2, tempfile::TempDir, Api) {
    moto::fake_credentials();
    let moto = Moto::start();
    let ec2 = moto::with_networks("test", &moto.endpoint, &[REGION]).await;
    let files = tempfile::tempdir().unwrap();
    let api = control_plane(&moto, &ec2, files.path(), host, provider);
    (moto, ec2, files, api)
}

/// Where the nodes of a replicated queue reach the control plane: an address of the host's
/// own outside the instances' subnets, reached by their default routes, one per test (each
/// test's is removed as it ends). It stays when an instance's link goes (the subnets' host
/// ends are only on those links), and an instance can be cut off from it alone
/// (`Instance::cut_off_from`), its clients kept.
pub fn control_plane_v6(test: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd71, 0x7e5e, 0, 0x200, 0, 0, 0, test)
}

/// A replicated queue on two machines, booted: its node's and its standby's instances, the
/// standby caught up and the record saying so.
pub struct TwoMachines {
    pub id: String,
    /// The logins shown when the queue was made (`publisher`, `subscriber`, `admin`).
    pub logins: Value,
    /// The queue's name, which the control plane's DNS answers for.
    pub host: String,
    /// The queue as the API showed it once both were placed.
    pub queue: Value,
    pub node: Instance,
    pub standby: Instance,
    /// Logged in by name, with a durability-2 publish answered Success (on both).
    pub publisher: Client,
}

/// Makes a replicated queue and boots its two machines as `names` (node, standby). Until the
/// standby's has caught up, durability 2 is answered 507, never Success on one disk.
pub async fn two_machines(
    api: &Api,
    ec2: &Ec2,
    files: &std::path::Path,
    names: [&str; 2],
) -> TwoMachines {
    let dns = api.cp.dns.expect("a DNS server");
    let root = std::fs::read_to_string(api.cp.dir.path().join("data/local-ca/ca.pem")).unwrap();
    let body = format!(
        r#"{{"tier":"standard","region":"{REGION}","instance_type":"t3.small","ipv4":false,"replicas":2}}"#
    );
    let (status, created) = api.call("POST", "/v1/queues", Some(&body)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let logins = created["logins"].clone();
    let queue = api.placed(&id, None).await;
    let node = boot(ec2, &queue, names[0], files).await;
    node.wait_for_node_log("listening on");
    // The standby is placed beside the node in the same pass, on an instance of its own.
    let queue = api
        .until(&id, |queue| {
            queue["resources"]["standby_instance"].is_string()
        })
        .await;
    let host = queue["host"].as_str().unwrap().to_string();
    let mut publisher = logged_in(dns, &host, &root, &logins, "publisher").await;
    let reply = publisher
        .request(json!({"body": "one disk", "durability": 2}))
        .await;
    assert_eq!(reply["code"], 507, "{reply}");
    let standby = boot_standby(ec2, &queue, names[1], names[0], files).await;
    standby.wait_for_node_log("caught up with the primary");
    // Now a durability-2 publish is synced on both, by name, over wss.
    on_two_disks(&mut publisher, "two disks").await;
    api.until(&id, |queue| {
        queue["live"]["standby"]["in_sync"] == true && queue["standby_in_sync"] == true
    })
    .await;
    TwoMachines {
        id,
        logins,
        host,
        queue,
        node,
        standby,
        publisher,
    }
}

/// Publishes `body` at durability 2 with `publisher` until it is answered Success (on two
/// disks), within 30 s; until then it must be answered 507 (on one disk only).
pub async fn on_two_disks(publisher: &mut Client, body: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = publisher
            .request(json!({"body": body, "durability": 2}))
            .await;
        if reply["status"] == "Success." {
            return;
        }
        assert_eq!(reply["code"], 507, "{reply}");
        assert!(Instant::now() < deadline, "never in sync: {reply}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The user data EC2 (moto) has for `instance`, decoded.
pub async fn user_data(ec2: &Ec2, instance: &str) -> String {
    moto::user_data(ec2.client(REGION).unwrap(), instance).await
}

/// The bootstrap file in `user_data` (TOML), as the instance gets it.
pub fn bootstrap_in(user_data: &str) -> toml::Table {
    use base64::Engine;
    let encoded = user_data
        .lines()
        .find_map(|line| line.trim().strip_prefix("content: \""))
        .expect("the bootstrap file")
        .trim_end_matches('"');
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    toml::from_str(std::str::from_utf8(&decoded).unwrap()).unwrap()
}

/// A sparse file standing for an EBS volume, kept across instances: made at the volume's
/// first boot; a volume booted before (a former node's) comes back with what it holds.
pub fn volume_file(dir: &std::path::Path, volume: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{volume}.img"));
    if !path.exists() {
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(256 << 20).unwrap();
    }
    path
}

/// Boots the instance the queue is placed on now, from the user data EC2 has for it.
pub async fn boot(ec2: &Ec2, queue: &Value, name: &str, dir: &std::path::Path) -> Instance {
    let instance = queue["resources"]["instance"].as_str().unwrap();
    let volume = queue["resources"]["volume"].as_str().unwrap();
    let v6: Ipv6Addr = queue["addresses"]["v6"].as_str().unwrap().parse().unwrap();
    let text = user_data(ec2, instance).await;
    let file = volume_file(dir, volume);
    let host = moto::HOST_V6.parse().unwrap();
    let state = dir.join(name);
    let (name, volume, instance) = (name.to_string(), volume.to_string(), instance.to_string());
    tokio::task::spawn_blocking(move || {
        Instance::boot(&name, &instance, &text, &volume, &file, v6, host, &state)
    })
    .await
    .unwrap()
}

/// Boots the queue's standby's instance, from the user data EC2 has for it, in its subnet,
/// linked to the node's instance (booted as `primary_name`): the two reach each other as two
/// instances of one VPC do.
pub async fn boot_standby(
    ec2: &Ec2,
    queue: &Value,
    name: &str,
    primary_name: &str,
    dir: &std::path::Path,
) -> Instance {
    let instance = queue["resources"]["standby_instance"].as_str().unwrap();
    let volume = queue["resources"]["standby_volume"].as_str().unwrap();
    let described = describe_instance(ec2.client(REGION).unwrap(), instance).await;
    let v6: Ipv6Addr = described.network_interfaces()[0].ipv6_addresses()[0]
        .ipv6_address()
        .unwrap()
        .parse()
        .unwrap();
    let primary: Ipv6Addr = queue["addresses"]["v6"].as_str().unwrap().parse().unwrap();
    let text = user_data(ec2, instance).await;
    let file = volume_file(dir, volume);
    // The host's end in the instance's own subnet (after a promotion, the new standby is in
    // the first subnet).
    let standby_subnet: Ipv6Addr = moto::STANDBY_HOST_V6.parse().unwrap();
    let host = match v6.segments()[..4] == standby_subnet.segments()[..4] {
        true => moto::STANDBY_HOST_V6,
        false => moto::HOST_V6,
    };
    let host = host.parse().unwrap();
    let state = dir.join(name);
    let (name, volume, instance) = (name.to_string(), volume.to_string(), instance.to_string());
    let primary_name = primary_name.to_string();
    tokio::task::spawn_blocking(move || {
        let peers = [(primary_name.as_str(), primary)];
        Instance::boot_beside(
            &name, &instance, &text, &volume, &file, v6, host, &state, &peers,
        )
    })
    .await
    .unwrap()
}

/// As [`connect`], or None while nothing serves there yet.
pub async fn try_connect(dns: SocketAddr, host: &str, root: &str) -> Option<Client> {
    let answers = dig(dns, host, "AAAA", false).answers;
    let ip: Ipv6Addr = answers.first()?.parse().ok()?;
    let url = format!("wss://{host}/");
    let at = SocketAddr::new(ip.into(), 443);
    Client::try_connect_tls_at(&url, at, roots_from_pem(root))
        .await
        .ok()
}

/// A client at the queue's name: resolved through our DNS (AAAA), connected over wss://,
/// the certificate checked for that name against `root`.
pub async fn connect(dns: SocketAddr, host: &str, root: &str) -> Client {
    let answers = dig(dns, host, "AAAA", false).answers;
    let ip: Ipv6Addr = answers[0].parse().unwrap();
    let url = format!("wss://{host}/");
    Client::connect_tls_at(&url, SocketAddr::new(ip.into(), 443), roots_from_pem(root)).await
}

/// A client at the queue's name, logged in as `role` (a subscriber with capacity 1).
pub async fn logged_in(
    dns: SocketAddr,
    host: &str,
    root: &str,
    logins: &Value,
    role: &str,
) -> Client {
    let mut client = connect(dns, host, root).await;
    let reply = login(&mut client, &logins[role], role, json!({"capacity": 1})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    client
}

/// Logs `client` in as `role` with `login` (the queue's username and password), `extra` added
/// to the request (a capacity, a session to resume): the reply.
pub async fn login(client: &mut Client, login: &Value, role: &str, extra: Value) -> Value {
    let mut request = json!({"username": login["username"], "password": login["password"],
        "role": role, "queuetype": "distribute"});
    for (key, value) in extra.as_object().unwrap() {
        request[key] = value.clone();
    }
    client.request(request).await
}
