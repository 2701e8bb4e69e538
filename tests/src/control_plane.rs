//! The control plane under test: [`ControlPlane`] starts the real binary with a config of
//! its own in a temporary directory, reads its addresses from stdout, and kills it (and the
//! nodes it started) when dropped; HTTP/1.1 requests written by hand, over TCP or TLS.

use crate::{controlplane_binary, dataplane_binary, process_naming, signal, Client, Log, PROMPT};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

pub struct ControlPlane {
    child: Child,
    pub addr: SocketAddr,
    /// Where its DNS server answers, when its config has `dns_listen`.
    pub dns: Option<SocketAddr>,
    pub token: String,
    pub dir: tempfile::TempDir,
    /// Everything it wrote to stderr.
    log: Arc<Log>,
    /// What its config file has beyond the basics.
    extra: String,
    /// Its etcd, when the tests run on etcd ([`STORE_VARIABLE`]).
    etcd: Option<Arc<crate::etcd::EtcdCluster>>,
}

/// `QE_TEST_STORE=etcd` runs every control plane a test starts on an etcd of its own (a real
/// one-member cluster) instead of sled: `scripts/test` runs the control-plane tests both ways.
pub const STORE_VARIABLE: &str = "QE_TEST_STORE";

/// Whether this run's control planes keep their state on etcd ([`STORE_VARIABLE`]): a test
/// of sled's own files (its node-secret file, its disk) has nothing to test then.
pub fn on_etcd() -> bool {
    std::env::var(STORE_VARIABLE).is_ok_and(|store| store == "etcd")
}

impl ControlPlane {
    pub fn start() -> ControlPlane {
        ControlPlane::start_with("")
    }

    /// With `extra` appended to its config file (a `[prices]` table, say).
    pub fn start_with(extra: &str) -> ControlPlane {
        ControlPlane::start_at(tempfile::tempdir().unwrap(), "127.0.0.1:0", extra, &[])
    }

    /// Listening at `listen` (not only loopback: give `[api_tls]` in `extra`).
    pub fn start_listening(listen: &str, extra: &str) -> ControlPlane {
        ControlPlane::start_at(tempfile::tempdir().unwrap(), listen, extra, &[])
    }

    /// With its config and data in `dir` (on a file system of a test's choosing).
    pub fn start_in(dir: tempfile::TempDir, extra: &str) -> ControlPlane {
        ControlPlane::start_at(dir, "127.0.0.1:0", extra, &[])
    }

    /// With flags after `serve --config FILE`.
    pub fn start_with_flags(flags: &[&str]) -> ControlPlane {
        ControlPlane::start_at(tempfile::tempdir().unwrap(), "127.0.0.1:0", "", flags)
    }

    /// Where queue `id`'s local node keeps its config, data and log.
    pub fn node_dir(&self, id: &str) -> PathBuf {
        self.dir.path().join("data/nodes").join(id)
    }

    /// The bootstrap the control plane wrote for queue `id`'s node (control plane, queue
    /// id, node token); the rest comes over the channel.
    pub fn node_config(&self, id: &str) -> toml::Table {
        let text = std::fs::read_to_string(self.node_bootstrap(id)).unwrap();
        text.parse().unwrap()
    }

    /// The bootstrap file of queue `id`'s node: its process names it.
    pub fn node_bootstrap(&self, id: &str) -> PathBuf {
        self.node_dir(id).join("bootstrap.toml")
    }

    /// Creates a queue with `body` (201, `provisioning` at once) and waits until it runs;
    /// returns the queue with the logins shown at creation.
    pub async fn create_queue(&self, body: &str) -> Value {
        let (status, created) = self.call("POST", "/v1/queues", Some(body)).await;
        assert_eq!(status, 201, "{created}");
        assert_eq!(created["status"], "provisioning", "{created}");
        let id = created["id"].as_str().unwrap();
        let mut queue = self.wait_for_status(id, "running").await;
        queue["logins"] = created["logins"].clone();
        queue
    }

    /// The actions of the audit log's latest entries, as the operator reads it.
    pub async fn audit_actions(&self) -> Vec<String> {
        let (status, audit) = self.call("GET", "/v1/audit", None).await;
        assert_eq!(status, 200, "{audit}");
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|entry| Some(entry["action"].as_str()?.to_string()))
            .collect()
    }

    /// Queue `id` once it has `status` (the API holds the request until then).
    pub async fn wait_for_status(&self, id: &str, status: &str) -> Value {
        let path = format!("/v1/queues/{id}?until={status}&within=60");
        let (code, queue) = self.call("GET", &path, None).await;
        assert_eq!(
            (code, queue["status"].as_str()),
            (200, Some(status)),
            "{queue}"
        );
        queue
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the control plane with SIGKILL, leaving its nodes.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a new control plane on the same directory and address (the nodes know it).
    pub fn start_again(self) -> ControlPlane {
        let listen = self.addr.to_string();
        self.start_again_at(&listen)
    }

    /// Kills the control plane, leaving its nodes, and starts a new one on the same directory
    /// at another address.
    pub fn restart_elsewhere(mut self) -> ControlPlane {
        self.kill();
        self.start_again_at("127.0.0.1:0")
    }

    fn start_again_at(mut self, listen: &str) -> ControlPlane {
        self.kill();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let extra = std::mem::take(&mut self.extra);
        let etcd = self.etcd.take();
        std::mem::forget(self);
        ControlPlane::start_on(dir, listen, &extra, &[], etcd)
    }

    /// Kills the control plane, leaving its nodes, and starts a new one in its place.
    pub fn restart(mut self) -> ControlPlane {
        self.kill();
        self.start_again()
    }

    /// As [`ControlPlane::restart`], with `extra` as its config's extra lines from now on.
    pub fn restart_with(mut self, extra: &str) -> ControlPlane {
        self.extra = extra.to_string();
        self.restart()
    }

    fn start_at(dir: tempfile::TempDir, listen: &str, extra: &str, flags: &[&str]) -> ControlPlane {
        // A test that chose its store keeps it.
        let etcd = (on_etcd() && !extra.contains("[store]"))
            .then(|| Arc::new(crate::etcd::EtcdCluster::single()));
        ControlPlane::start_on(dir, listen, extra, flags, etcd)
    }

    fn start_on(
        dir: tempfile::TempDir,
        listen: &str,
        extra: &str,
        flags: &[&str],
        etcd: Option<Arc<crate::etcd::EtcdCluster>>,
    ) -> ControlPlane {
        let token = "operator-token-for-tests".to_string();
        let store = match &etcd {
            Some(etcd) => format!(
                "\n[store]\nkind = \"etcd\"\nendpoints = [{:?}]\n",
                etcd.endpoint(0)
            ),
            None => String::new(),
        };
        // A test that names its own node binary keeps it.
        let dataplane = match extra.lines().any(|line| line.starts_with("dataplane =")) {
            true => String::new(),
            false => format!("dataplane = {:?}\n", dataplane_binary()),
        };
        let config = format!(
            "listen = \"{listen}\"\ndata_dir = {:?}\ntoken = \"{token}\"\ncluster = \"test\"\n\
             {dataplane}{extra}{store}",
            dir.path().join("data"),
        );
        std::fs::write(dir.path().join("controlplane.toml"), config).unwrap();
        let mut child = Command::new(controlplane_binary())
            .args(["serve", "--config"])
            .arg(dir.path().join("controlplane.toml"))
            .args(flags)
            .stdout(Stdio::piped())
            .env("RUST_LOG", crate::log_level())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start controlplane");
        let log = Log::follow(child.stderr.take().unwrap());
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut dns = None;
        let addr = loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).unwrap() == 0 {
                let _ = child.wait();
                panic!("controlplane exited before listening:\n{}", log.lock());
            }
            if let Some(addr) = line.trim().strip_prefix("dns on ") {
                dns = Some(addr.parse().expect("an address after `dns on`"));
            }
            if let Some(addr) = line.trim().strip_prefix("listening on ") {
                break addr.parse().expect("an address after `listening on`");
            }
        };
        std::thread::spawn(move || for _ in stdout.lines() {});
        ControlPlane {
            dns,
            child,
            addr,
            token,
            dir,
            log,
            extra: extra.to_string(),
            etcd,
        }
    }

    /// Its stderr as the test reads it (and may stop reading it).
    pub fn stderr(&self) -> &crate::Log {
        &self.log
    }

    /// Everything it logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().clone()
    }

    /// Waits until its log contains `needle` `times` times in all; returns the log.
    pub fn wait_for_log(&self, needle: &str, times: usize) -> String {
        let what = format!("{needle:?} {times} times");
        self.log
            .wait_until(&what, |text| text.matches(needle).count() >= times)
    }

    /// The audit entries of `action`, oldest first (the first page: up to 100).
    pub async fn audited(&self, action: &str) -> Vec<Value> {
        let (status, audit) = self.call("GET", "/v1/audit", None).await;
        assert_eq!(status, 200, "{audit}");
        let entries = audit["entries"].as_array().unwrap().iter();
        entries
            .filter(|entry| entry["action"] == action)
            .cloned()
            .collect()
    }

    /// The live reports it received from nodes so far (`qe_live_reports_total`).
    pub async fn live_reports(&self) -> u64 {
        let token = Some(self.token.as_str());
        let (_, metrics) = http_text(self.addr, "GET", "/metrics", token, None).await;
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("qe_live_reports_total "))
            .and_then(|count| count.parse().ok())
            .unwrap_or(0)
    }

    /// Waits until it has received `count` live reports from nodes (60 s at most).
    pub async fn wait_for_live_reports(&self, count: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.live_reports().await < count {
            assert!(std::time::Instant::now() < deadline, "{count} live reports");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// An API request with the operator's token; returns the status and the JSON body.
    pub async fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let token = self.token.clone();
        http(self.addr, method, path, Some(&token), body).await
    }
}

impl Drop for ControlPlane {
    /// Kills it and the nodes and standbys it leaves running (their command lines name their
    /// directories). A failing test shows how its control plane's log and each node's log end
    /// (the temporary directory is gone after).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let nodes = std::fs::read_dir(self.dir.path().join("data/nodes"));
        for node in nodes.into_iter().flatten().flatten() {
            let named = [
                node.path().join("bootstrap.toml"),
                node.path().join("standby/data"),
            ];
            for pid in named.iter().filter_map(|path| process_naming(path)) {
                signal(pid, libc::SIGKILL);
            }
            if std::thread::panicking() {
                show_node_log(&node.path());
            }
        }
        if std::thread::panicking() {
            let log = self.log.lock().clone();
            eprintln!("--- the control plane's log ends ---\n{}", tail(&log));
        }
    }
}

/// Prints how the log of the node in `dir` (a queue's directory) ends, for a failing test.
pub fn show_node_log(dir: &Path) {
    let log = std::fs::read_to_string(dir.join("node.log")).unwrap_or_default();
    let name = dir.file_name().unwrap_or_default();
    eprintln!("--- node {name:?}'s log ends ---\n{}", tail(&log));
}

/// The last lines of a log, enough to see why a test failed.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// A client logged in at `url` with a login the API gave (`{"username","password"}`) as
/// `role`, with `extra` fields in its login request.
pub async fn login_with(url: &str, login: &Value, role: &str, extra: Value) -> Client {
    let mut request = json!({
        "username": login["username"], "password": login["password"],
        "role": role, "queuetype": "distribute",
    });
    for (key, value) in extra.as_object().unwrap() {
        request[key] = value.clone();
    }
    let mut client = Client::connect_url(url).await;
    let reply = client.request(request).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    client
}

/// `YYYY-MM-DD` of a time in seconds since 1970 (UTC).
pub fn date_of(secs: u64) -> String {
    let (year, month, day) = qe_shared::calendar::civil_from_days(secs / 86_400);
    format!("{year:04}-{month:02}-{day:02}")
}

/// `YYYY-MM-DD` today (UTC).
pub fn today() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    date_of(now.unwrap().as_secs())
}

/// Waits until queue `id`'s node serves its desired config (a change confirmed over the
/// channel); the API shows it, so this asks it again while a change is pending.
pub async fn wait_until_applied(cp: &ControlPlane, id: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
        if queue["config"]["pending"] == false {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never applied: {queue}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Where a queue's node listens, as the API shows it.
pub fn node_of(queue: &Value) -> &str {
    queue["node"].as_str().unwrap()
}

/// One HTTP/1.1 request over a fresh connection; returns the status and the body as JSON.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let (status, body) = http_text(addr, method, path, token, body).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// One raw HTTP/1.1 request (it must ask for `Connection: close`) over a fresh connection;
/// returns the whole response, head and body, for tests that read headers.
pub async fn http_response(addr: SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(HELD_REQUEST, tcp.read_to_end(&mut response))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8(response).unwrap()
}

/// The API path of every usage record of queue `id`, whenever made.
pub fn all_usage_of(id: &str) -> String {
    format!("/v1/usage?from=1970-01-01&to=2999-12-31&queue={id}")
}

/// One HTTP/1.1 request over a fresh connection; returns the status and the body.
pub async fn http_text(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    exchange(tcp, method, path, token, body).await
}

/// One HTTPS request (TLS verified against `roots` for the address's IP) over a fresh
/// connection; returns the status and the body as JSON.
pub async fn https(
    addr: SocketAddr,
    roots: rustls::RootCertStore,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let (status, body) = https_text(addr, roots, method, path, token, body).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// [`https`], the body as it came.
pub async fn https_text(
    addr: SocketAddr,
    roots: rustls::RootCertStore,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let connector = tokio_rustls::TlsConnector::from(qe_tls::client_config(roots));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = connector.connect(name, tcp).await.unwrap();
    exchange(tls, method, path, token, body).await
}

/// Whether a plain HTTP request to `addr` gets an HTTP reply (a TLS-only port gives none).
pub async fn answers_plain_http(addr: SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(PROMPT, plain.read_to_end(&mut answer))
        .await
        .expect("an answer or a close");
    answer.starts_with(b"HTTP/")
}

/// The longest the API holds a request the tests make (`?until=…&within=60`).
const HELD_REQUEST: Duration = Duration::from_secs(70);

/// Sends one request on `stream` and reads the response to its end.
async fn exchange(
    mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.unwrap_or("");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: cp\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // A TLS peer may close without close_notify; what arrived is the response. The API may
    // hold a request (a wait for a status, a rotation's confirmation) for up to a minute.
    let _ = tokio::time::timeout(HELD_REQUEST, stream.read_to_end(&mut response))
        .await
        .unwrap();
    let response = String::from_utf8(response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    (status, body.to_string())
}
