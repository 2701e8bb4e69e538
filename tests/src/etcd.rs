//! A real etcd cluster on loopback (Debian's `etcd-server`, 3.4): one process per member, each
//! with its own data directory and ports, killed on drop (the log tails printed if the test
//! failed).
//!
//! Members start one after another. A new member first asks each peer whether it was
//! bootstrapped already; a peer whose port is bound but not serving yet holds that question for a
//! full second, where a port nobody has bound refuses it at once. So each member starts once the
//! one before it serves its peers, and three members are up in well under a second where they
//! would otherwise wait two seconds for each other.
//!
//! Ports are chosen by binding port 0 and letting go, so another test may take one before etcd
//! binds it: a member that exits while the cluster starts makes the whole cluster start again on
//! fresh ports.
//!
//! [`EtcdCluster::put`] and [`EtcdCluster::get`] speak to etcd's HTTP gateway (`/v3/kv/…`), for
//! tests that check what is stored, or whether a majority answers, without a client crate.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};
use serde_json::{json, Value};

/// The longest a cluster (or a restarted member) gets to come up.
const START_WITHIN: Duration = Duration::from_secs(20);

/// Warnings and errors only, to its log file. (3.4's default logger, capnslog, ignores
/// `--log-level`.)
const LOG_FLAGS: [&str; 6] = [
    "--logger",
    "zap",
    "--log-outputs",
    "stderr",
    "--log-level",
    "warn",
];

/// How many times a cluster is started on fresh ports when a member exits at start.
const ATTEMPTS: usize = 3;

/// How long one request to a member may take: long enough for a write on a loaded machine, short
/// enough that a cluster without a majority fails a test's request quickly (etcd itself waits
/// some 6 s before it says "request timed out").
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// Raft's timings, in milliseconds: half etcd's defaults (100 and 1000), so a lost leader is
/// replaced in well under a second; loopback answers a heartbeat in far less than 50 ms.
const HEARTBEAT_MS: &str = "50";
const ELECTION_MS: &str = "500";

/// How many lines of a member's log a failed test prints.
const LOG_TAIL: usize = 40;

/// A running etcd cluster; every member is killed on drop.
pub struct EtcdCluster {
    /// Each member's data directory (`m0/`, …) and log (`m0.log`, …); removed on drop.
    dir: tempfile::TempDir,
    /// `--initial-cluster-token`, unique per cluster, so members of two clusters that reach each
    /// other (a port reused) refuse each other.
    token: String,
    members: Vec<Member>,
}

/// One member: its name and ports stay across restarts, as its data directory does.
struct Member {
    /// `m0`, `m1`, …: its `--name`, the name of its data directory and of its log.
    name: String,
    /// Where it serves clients: gRPC, the HTTP gateway (`/v3/…`) and `/health`.
    client_port: u16,
    /// Where it serves its peers (raft).
    peer_port: u16,
    /// The process; `None` once killed.
    child: Option<Child>,
}

impl EtcdCluster {
    /// Starts `members` members (`m0`, `m1`, …) and returns once every one reports healthy.
    pub fn start(members: usize) -> EtcdCluster {
        assert!(members > 0, "a cluster has at least one member");
        let mut attempt = 1;
        loop {
            match EtcdCluster::try_start(members) {
                Ok(cluster) => return cluster,
                Err(exited) if attempt < ATTEMPTS => {
                    eprintln!("etcd: {exited}\n(starting the cluster again on fresh ports)");
                    attempt += 1;
                }
                Err(exited) => panic!("etcd: {exited}\n(after {ATTEMPTS} attempts)"),
            }
        }
    }

    /// A one-member cluster.
    pub fn single() -> EtcdCluster {
        EtcdCluster::start(1)
    }

    /// Each member's client URL (`http://127.0.0.1:PORT`), in member order, whether running or
    /// not.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Kills member `i` with SIGKILL and waits for it to be gone.
    pub fn kill(&mut self, i: usize) {
        let mut child = self.members[i]
            .child
            .take()
            .unwrap_or_else(|| panic!("m{i} was killed already"));
        child.kill().expect("SIGKILL to etcd");
        child.wait().expect("etcd's exit status");
    }

    /// Starts member `i`, killed or exited, again on its data directory and ports; returns once it serves its
    /// peers. It answers clients only once a majority of the cluster runs.
    pub fn restart(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let exited = child.try_wait().expect("etcd's status");
            assert!(exited.is_some(), "m{i} is running");
        }
        let mut log = self.open_log(i);
        writeln!(log, "--- restarted ---").expect("etcd's log");
        self.spawn(i, "existing");
        if let Err(exited) = self.wait_serving_peers(i, Instant::now() + START_WITHIN) {
            panic!("etcd: {exited}");
        }
    }

    /// Whether member `i`'s process runs (it was not killed and has not exited).
    pub fn is_alive(&mut self, i: usize) -> bool {
        match &mut self.members[i].child {
            Some(child) => child.try_wait().expect("etcd's status").is_none(),
            None => false,
        }
    }

    /// The member that says it leads (of two that say so, the one of the later term: an old
    /// leader cut off from the rest believes it for up to an election timeout); `None` when no
    /// running member does.
    pub fn leader(&self) -> Option<usize> {
        let mut leader: Option<(u64, usize)> = None;
        for (i, member) in self.members.iter().enumerate() {
            if member.child.is_none() {
                continue;
            }
            let Ok(status) = self.gateway(i, "/v3/maintenance/status", json!({})) else {
                continue;
            };
            // Ids are uint64s, which the gateway writes as strings; a member that knows no
            // leader leaves `leader` out.
            let own = status["header"]["member_id"].as_str();
            if own.is_none() || status["leader"].as_str() != own {
                continue;
            }
            let term = status["raftTerm"]
                .as_str()
                .and_then(|term| term.parse().ok())
                .unwrap_or(0);
            if leader.is_none_or(|(newest, _)| term > newest) {
                leader = Some((term, i));
            }
        }
        leader.map(|(_, i)| i)
    }

    /// Puts `key` = `value` through member `i`'s HTTP gateway, waiting at most
    /// [`REQUEST_TIMEOUT`]; the error says what etcd answered, or that it did not.
    pub fn put(&self, i: usize, key: &str, value: &str) -> Result<(), String> {
        let body = json!({ "key": BASE64.encode(key), "value": BASE64.encode(value) });
        self.gateway(i, "/v3/kv/put", body).map(|_| ())
    }

    /// The value of `key` read through member `i` (a linearizable read: it needs a majority),
    /// waiting at most [`REQUEST_TIMEOUT`]; `None` if there is no such key.
    pub fn get(&self, i: usize, key: &str) -> Result<Option<String>, String> {
        let reply = self.gateway(i, "/v3/kv/range", json!({ "key": BASE64.encode(key) }))?;
        // The gateway leaves out an empty `kvs`.
        let Some(value) = reply["kvs"][0]["value"].as_str() else {
            return Ok(None);
        };
        let value = BASE64
            .decode(value)
            .map_err(|err| format!("{value}: {err}"))?;
        String::from_utf8(value)
            .map(Some)
            .map_err(|err| format!("a value that is not UTF-8: {err}"))
    }

    /// One call of member `i`'s HTTP gateway (`/v3/…`, gRPC as JSON); `Err` unless it answers
    /// 200 within [`REQUEST_TIMEOUT`].
    fn gateway(&self, i: usize, path: &str, body: Value) -> Result<Value, String> {
        let port = self.members[i].client_port;
        match call(port, "POST", path, &body.to_string(), REQUEST_TIMEOUT)? {
            (200, reply) => Ok(reply),
            (status, reply) => Err(format!("{path} through m{i}: {status} {reply}")),
        }
    }

    /// Chooses the ports, then starts the members one by one (see the module's map); `Err` says
    /// which member exited at start, with its log.
    fn try_start(count: usize) -> Result<EtcdCluster, String> {
        let ports = free_ports(2 * count);
        let members = (0..count)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                child: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            dir: tempfile::tempdir().expect("a directory for etcd"),
            token: format!("qe-{}", uuid::Uuid::now_v7()),
            members,
        };
        let deadline = Instant::now() + START_WITHIN;
        for i in 0..count {
            cluster.spawn(i, "new");
            cluster.wait_serving_peers(i, deadline)?;
        }
        for i in 0..count {
            cluster.wait_healthy(i, deadline)?;
        }
        Ok(cluster)
    }

    /// Starts member `i`'s process, with `--initial-cluster-state` `state` (`new` or `existing`;
    /// etcd reads it only while its data directory is empty).
    fn spawn(&mut self, i: usize, state: &str) {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let log = self.open_log(i);
        let member = &self.members[i];
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let child = Command::new("etcd")
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(self.dir.path().join(&member.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", HEARTBEAT_MS])
            .args(["--election-timeout", ELECTION_MS])
            .args(LOG_FLAGS)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd's log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| {
                panic!("cannot start etcd ({err}): run scripts/test, which installs etcd-server")
            });
        self.members[i].child = Some(child);
    }

    /// Waits until member `i` serves its peers: a request to a port that is bound but not
    /// serving yet is answered once it serves; one to a port not bound yet is refused at once.
    fn wait_serving_peers(&mut self, i: usize, deadline: Instant) -> Result<(), String> {
        let port = self.members[i].peer_port;
        loop {
            self.check_running(i)?;
            if let Ok((200, _)) = call(port, "GET", "/version", "", REQUEST_TIMEOUT) {
                return Ok(());
            }
            self.check_deadline(i, deadline, "serve its peers");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until member `i` says `{"health":"true"}`: it has a leader and answers reads. Its
    /// client port serves nothing before it has joined, so each request is held until then.
    fn wait_healthy(&mut self, i: usize, deadline: Instant) -> Result<(), String> {
        let port = self.members[i].client_port;
        loop {
            for member in 0..self.members.len() {
                self.check_running(member)?;
            }
            if let Ok((200, health)) = call(port, "GET", "/health", "", REQUEST_TIMEOUT) {
                if health["health"] == "true" {
                    return Ok(());
                }
            }
            self.check_deadline(i, deadline, "report healthy");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `Err` with its log if member `i` has exited.
    fn check_running(&mut self, i: usize) -> Result<(), String> {
        let child = self.members[i].child.as_mut().expect("a started member");
        match child.try_wait().expect("etcd's status") {
            None => Ok(()),
            Some(status) => Err(format!(
                "m{i} exited ({status}); its log ends:\n{}",
                self.log_tail(i)
            )),
        }
    }

    fn check_deadline(&self, i: usize, deadline: Instant, what: &str) {
        // Dropping the cluster as this panics prints every member's log.
        assert!(
            Instant::now() < deadline,
            "etcd's m{i} did not {what} within {START_WITHIN:?}"
        );
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    /// Member `i`'s log, to append to: a restart keeps what was logged before it.
    fn open_log(&self, i: usize) -> File {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("etcd's log")
    }

    /// The last [`LOG_TAIL`] lines of member `i`'s log.
    fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            for i in 0..self.members.len() {
                eprintln!("--- etcd m{i}'s log ends ---\n{}", self.log_tail(i));
            }
        }
    }
}

/// `count` distinct free loopback ports: all held at once, so none is chosen twice.
pub fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free loopback port"))
        .collect();
    listeners
        .iter()
        .map(|listener| listener.local_addr().expect("its address").port())
        .collect()
}

/// One HTTP/1.0 request to `127.0.0.1:port`, all of it within `timeout`; the status and the body
/// as JSON (`Null` if it is not). HTTP/1.0, so the body is never chunked: it is as long as
/// `Content-Length` says, or ends with the connection. Once that many bytes are in, the answer is
/// read: etcd's peer port closes its connections seconds after the response.
pub fn call(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<(u16, Value), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let failed = |err: std::io::Error| format!("{method} {addr}{path}: {err}");
    let deadline = Instant::now() + timeout;
    let mut tcp = TcpStream::connect_timeout(&addr, timeout).map_err(failed)?;
    tcp.set_write_timeout(Some(timeout)).map_err(failed)?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).map_err(failed)?;
    let mut response = Vec::new();
    let mut buffer = [0u8; 4096];
    while !is_complete(&response) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "{method} {addr}{path}: no answer within {timeout:?}"
            ));
        }
        tcp.set_read_timeout(Some(left)).map_err(failed)?;
        match tcp.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buffer[..n]),
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(err) => return Err(failed(err)),
        }
    }
    let response = String::from_utf8_lossy(&response);
    let status = response
        .get(9..12)
        .and_then(|status| status.parse().ok())
        .ok_or_else(|| format!("{method} {addr}{path}: not an HTTP response: {response}"))?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// Whether `response` holds its head and as much body as its `Content-Length` says (without
/// one, only the connection's end tells).
fn is_complete(response: &[u8]) -> bool {
    let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&response[..end]);
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        if !name.eq_ignore_ascii_case("content-length") {
            return None;
        }
        value.trim().parse::<usize>().ok()
    });
    length.is_some_and(|length| response.len() - (end + 4) >= length)
}

/// A one-member etcd that serves its clients over TLS only and asks each for a certificate
/// signed by its CA (`--client-cert-auth`); its health is on a plain metrics port. Killed on
/// drop.
pub struct TlsEtcd {
    child: Child,
    /// Its data, its log, the CA and the client's certificate and key.
    pub dir: tempfile::TempDir,
    /// `https://127.0.0.1:PORT`.
    pub endpoint: String,
    pub ca_file: PathBuf,
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
}

impl TlsEtcd {
    pub fn start() -> TlsEtcd {
        let dir = tempfile::tempdir().expect("a directory for etcd");
        let path = |name: &str| dir.path().join(name);
        let ca = crate::test_ca("etcd CA for tests");
        let issue = |names: Vec<String>, cert: &str, key: &str| {
            let pair = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(names).unwrap();
            params.extended_key_usages = vec![
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let made = params.signed_by(&pair, &ca).unwrap();
            std::fs::write(path(cert), made.pem()).unwrap();
            std::fs::write(path(key), pair.serialize_pem()).unwrap();
        };
        std::fs::write(path("ca.pem"), ca.pem()).unwrap();
        issue(
            vec!["127.0.0.1".into(), "localhost".into()],
            "server.pem",
            "server-key.pem",
        );
        issue(vec!["controlplane".into()], "client.pem", "client-key.pem");
        let ports = free_ports(3);
        let endpoint = format!("https://127.0.0.1:{}", ports[0]);
        let peer = format!("http://127.0.0.1:{}", ports[1]);
        let metrics = format!("http://127.0.0.1:{}", ports[2]);
        let log = File::create(path("etcd.log")).expect("etcd's log");
        let child = Command::new("etcd")
            .args(["--name", "tls", "--data-dir"])
            .arg(path("data"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("tls={peer}")])
            .args(["--listen-metrics-urls", &metrics])
            .arg("--cert-file")
            .arg(path("server.pem"))
            .arg("--key-file")
            .arg(path("server-key.pem"))
            .arg("--trusted-ca-file")
            .arg(path("ca.pem"))
            .arg("--client-cert-auth")
            .args(LOG_FLAGS)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd's log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start etcd ({err}): run scripts/test"));
        let etcd = TlsEtcd {
            child,
            endpoint,
            ca_file: path("ca.pem"),
            client_cert_file: path("client.pem"),
            client_key_file: path("client-key.pem"),
            dir,
        };
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if let Ok((200, health)) = call(ports[2], "GET", "/health", "", REQUEST_TIMEOUT) {
                if health["health"] == "true" {
                    return etcd;
                }
            }
            let log = std::fs::read_to_string(etcd.dir.path().join("etcd.log")).unwrap_or_default();
            assert!(
                Instant::now() < deadline,
                "etcd over TLS never became healthy:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The control plane's `[store]` for it: with the client's certificate, or without.
    pub fn store_config(&self, with_client_certificate: bool) -> String {
        let mut config = format!(
            "[store]\nkind = \"etcd\"\nendpoints = [{:?}]\nca_file = {:?}\n",
            self.endpoint, self.ca_file
        );
        if with_client_certificate {
            config.push_str(&format!(
                "cert_file = {:?}\nkey_file = {:?}\n",
                self.client_cert_file, self.client_key_file
            ));
        }
        config
    }
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
