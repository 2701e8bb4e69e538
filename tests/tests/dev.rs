//! `controlplane dev` runs the whole path on one machine: DNS on a loopback port, the cluster
//! certificate from Pebble (or, without it, a local CA), nodes on TLS, a demo queue. Real
//! clients follow what it prints: `dig` through its DNS, then wss:// by name.

use qe_tests::{
    controlplane_binary, dataplane_binary, dig, process_naming, roots_from_pem, run_python, signal,
    workspace, Client, PROMPT,
};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

/// A running `controlplane dev`.
struct Dev {
    child: Child,
    dir: PathBuf,
    /// What it printed, up to `(Ctrl-C stops everything.)`.
    banner: String,
    /// Its `demo.json`.
    demo: Value,
}

impl Dev {
    /// Starts `controlplane dev` in `dir` with `flags`; returns once it has said how to try it.
    fn start(dir: &Path, flags: &[&str]) -> Dev {
        Dev::start_with_path(dir, flags, &path_with_pebble())
    }

    /// The same, with `path` as its PATH.
    fn start_with_path(dir: &Path, flags: &[&str], path: &str) -> Dev {
        // dev runs the dataplane beside it: refused here if it is stale.
        let _ = dataplane_binary();
        let mut child = Command::new(controlplane_binary())
            .args([
                "dev",
                "--listen",
                "127.0.0.1:0",
                "--dns-listen",
                "127.0.0.1:0",
                "--dir",
            ])
            .arg(dir)
            .args(flags)
            .env("PATH", path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start controlplane dev");
        // Its log, kept to show when it fails.
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        let (lines, said) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let mut banner = String::new();
        loop {
            let line = said.recv_timeout(PROMPT * 6).unwrap_or_else(|_| {
                let log = log.lock().unwrap();
                panic!("controlplane dev stopped or hung after:\n{banner}\nits log:\n{log}")
            });
            banner += &line;
            banner += "\n";
            if line.contains("(Ctrl-C stops everything") {
                break;
            }
        }
        let demo = std::fs::read_to_string(dir.join("demo.json")).unwrap();
        Dev {
            child,
            dir: dir.to_path_buf(),
            banner,
            demo: serde_json::from_str(&demo).unwrap(),
        }
    }

    fn text(&self, key: &str) -> &str {
        self.demo[key].as_str().unwrap()
    }

    fn dns(&self) -> SocketAddr {
        self.text("dns").parse().unwrap()
    }

    fn node_port(&self) -> u16 {
        let node = self.text("node").trim_end_matches('/');
        node.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The addresses its DNS gives the demo queue's name (AAAA, then A), over UDP and TCP
    /// alike.
    fn resolve(&self) -> Vec<IpAddr> {
        let mut addresses = Vec::new();
        for kind in ["AAAA", "A"] {
            let udp = dig(self.dns(), self.text("host"), kind, false);
            let tcp = dig(self.dns(), self.text("host"), kind, true);
            assert_eq!(udp, tcp, "UDP and TCP agree");
            assert!(udp.authoritative, "{udp:?}");
            addresses.extend(udp.answers.iter().map(|a| a.parse::<IpAddr>().unwrap()));
        }
        addresses
    }

    /// Publishes and receives one message over wss:// by name, connected to `address`,
    /// trusting only the root it named.
    async fn round_trip(&self, address: IpAddr, body: &str) {
        let trust = std::fs::read_to_string(self.text("trust")).unwrap();
        let at = SocketAddr::new(address, self.node_port());
        let node = self.text("node");
        let logins = &self.demo["logins"];
        let login = |role: &str| {
            json!({"username": logins[role]["username"], "password": logins[role]["password"],
                "role": role, "queuetype": "distribute"})
        };
        let mut subscriber = Client::connect_tls_at(node, at, roots_from_pem(&trust)).await;
        let mut request = login("subscriber");
        request["capacity"] = json!(1);
        assert_eq!(subscriber.request(request).await["status"], "Success.");
        let mut publisher = Client::connect_tls_at(node, at, roots_from_pem(&trust)).await;
        assert_eq!(
            publisher.request(login("publisher")).await["status"],
            "Success."
        );
        let reply = publisher.request(json!({"body": body})).await;
        assert_eq!(reply["status"], "Success.", "{reply}");
        let delivery = subscriber.recv().await;
        assert_eq!(delivery["body"], body);
        // Acknowledged, so it is not delivered again after a restart.
        let ack = subscriber
            .request(json!({"id": delivery["id"], "ack": 1}))
            .await;
        assert_eq!(ack["status"], "Success.", "{ack}");
    }

    /// Stops it as Ctrl-C would; it must exit cleanly and leave no node or Pebble running.
    fn stop(mut self) {
        signal(self.child.id(), libc::SIGINT);
        let (exited, status) = mpsc::channel();
        let mut child = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap());
        std::thread::spawn(move || exited.send(child.wait().unwrap()));
        let status = status
            .recv_timeout(PROMPT * 3)
            .expect("dev stops on Ctrl-C");
        assert!(status.success(), "{status:?}");
        assert_eq!(process_naming(&self.dir.join("pebble/pebble.json")), None);
        for node in std::fs::read_dir(self.dir.join("nodes")).unwrap() {
            let node = node.unwrap().path();
            let config = node.join("bootstrap.toml");
            assert_eq!(process_naming(&config), None, "{}", config.display());
            // The nodes stopped before the API: their last usage records reached it.
            let log = std::fs::read_to_string(node.join("node.log")).unwrap();
            assert!(
                log.contains("the last usage record was reported"),
                "{}:\n{log}",
                node.display()
            );
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in [process_naming(&self.dir.join("pebble/pebble.json"))]
            .into_iter()
            .flatten()
        {
            signal(pid, libc::SIGKILL);
        }
        for node in std::fs::read_dir(self.dir.join("nodes"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Some(pid) = process_naming(&node.path().join("bootstrap.toml")) {
                signal(pid, libc::SIGKILL);
            }
        }
    }
}

/// The PATH, with Pebble's directory on it (the Debian package puts it in /usr/bin).
fn path_with_pebble() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    assert!(
        std::env::split_paths(&path).any(|dir| dir.join("pebble").is_file()),
        "pebble is not installed: ./scripts/test installs it"
    );
    path
}

#[tokio::test]
async fn dev_with_pebble_serves_the_demo_queue_by_name_over_wss_and_starts_again_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(dir.path(), &[]);
    assert!(
        dev.banner
            .contains("certificates by ACME (DNS-01) from Pebble"),
        "{}",
        dev.banner
    );
    assert!(dev
        .banner
        .contains(&format!("dig @127.0.0.1 -p {}", dev.dns().port())));
    assert!(dev
        .text("node")
        .starts_with(&format!("wss://{}:", dev.text("host"))));
    assert!(dev.text("host").ends_with(".q.dev.thequeueexpert.com"));
    // The demo account's key, printed, sees its demo queue and nothing else.
    let key = dev.text("account_key");
    assert!(dev.banner.contains(key), "{}", dev.banner);
    let api: SocketAddr = dev
        .text("api")
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let (status, queues) = qe_tests::http(api, "GET", "/v1/queues", Some(key), None).await;
    assert_eq!(status, 200, "{queues}");
    let ids: Vec<&Value> = queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| &q["id"])
        .collect();
    assert_eq!(ids, [dev.text("queue")], "{queues}");
    let addresses = dev.resolve();
    assert_eq!(
        addresses,
        [
            "::1".parse::<IpAddr>().unwrap(),
            "127.0.0.1".parse().unwrap()
        ]
    );
    // The node answers at both addresses its name has, with a certificate for that name.
    for address in &addresses {
        dev.round_trip(*address, &format!("to {address}")).await;
        let script = workspace().join("tests/interop/by_name.py");
        let demo = dev.dir.join("demo.json").display().to_string();
        let said = run_python(&script, &[demo, address.to_string()]).await;
        assert_eq!(said.trim(), format!("by name, to {address}"));
    }
    let first = dev.demo.clone();
    dev.stop();

    // A second run on the same directory carries on: the same token, account, key and demo
    // queue, whose node serves a certificate from the new Pebble's new root.
    let dev = Dev::start(dir.path(), &[]);
    for key in [
        "token",
        "account",
        "account_key",
        "queue",
        "host",
        "node",
        "logins",
    ] {
        assert_eq!(dev.demo[key], first[key], "{key}");
    }
    assert_ne!(dev.demo["trust"], Value::Null);
    assert_eq!(
        dev.resolve().len(),
        2,
        "the first queue's name still resolves"
    );
    dev.round_trip("::1".parse().unwrap(), "after a restart")
        .await;
    dev.stop();
}

#[tokio::test]
async fn dev_without_pebble_falls_back_to_a_local_ca_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(dir.path(), &["--no-pebble"]);
    assert!(
        dev.banner
            .contains("certificates from a self-signed local CA"),
        "{}",
        dev.banner
    );
    assert_eq!(
        Path::new(dev.text("trust")),
        dir.path().join("local-ca/ca.pem")
    );
    for address in dev.resolve() {
        dev.round_trip(address, &format!("to {address}")).await;
    }
    // A client that trusts only the usual roots refuses the node.
    let at = SocketAddr::new("::1".parse().unwrap(), dev.node_port());
    let tcp = tokio::net::TcpStream::connect(at).await.unwrap();
    let config = qe_tls::client_config(webpki_free_roots());
    let name = rustls::pki_types::ServerName::try_from(dev.text("host").to_string()).unwrap();
    let refused = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await;
    assert!(refused.is_err(), "a local CA is trusted by nobody else");
    dev.stop();
}

/// Roots that are not the local CA's (a throwaway CA of the tests).
fn webpki_free_roots() -> rustls::RootCertStore {
    roots_from_pem(&qe_tests::test_ca("not the local CA").pem())
}

#[tokio::test]
async fn dev_falls_back_to_the_local_ca_when_pebble_does_not_start_and_says_why() {
    // A `pebble` that exits at once, first on the PATH.
    let fake = tempfile::tempdir().unwrap();
    let script = fake.path().join("pebble");
    std::fs::write(&script, "#!/bin/sh\necho broken >&2\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        fake.path().display(),
        std::env::var("PATH").unwrap()
    );
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start_with_path(dir.path(), &[], &path);
    assert!(
        dev.banner
            .contains("certificates from a self-signed local CA: pebble exited before"),
        "{}",
        dev.banner
    );
    dev.round_trip("::1".parse().unwrap(), "without Pebble")
        .await;
    dev.stop();
}
