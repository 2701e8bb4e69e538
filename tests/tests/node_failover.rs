//! A node knows every replica of its control plane and fails over between them: when the
//! replica it watches its config at dies mid-watch, the watch goes on at the next one with the
//! same `?after=`, and its reports follow it there.
//!
//! The replicas are fakes, a few lines of hyper each, that answer the node-channel routes and
//! tell the test every request they get. One is killed by dropping its listener and every
//! connection at once, as a replica that dies would.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use qe_shared::node_channel::{
    Bootstrap, DesiredConfig, LoginHash, Logins, NodeReport, NodeTls, ReportReceipt,
};
use qe_shared::password::PasswordHash;
use qe_shared::settings::Tier;
use qe_tests::{dataplane_binary, signal, PROMPT};
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;

/// The version of the config the replicas hold.
const VERSION: u64 = 7;
/// The node's credential: sent on every request, never logged.
const TOKEN: &str = "the-node-token-3f9a1c";

/// One request a fake replica got.
#[derive(Debug)]
struct Seen {
    method: Method,
    /// Path and query (`/v1/nodes/q/config?after=7`).
    target: String,
    /// It carried the node's credential.
    authorized: bool,
    body: Bytes,
}

impl Seen {
    /// A report, read.
    fn report(&self) -> Option<NodeReport> {
        let reports = self.method == Method::POST && self.target == "/v1/nodes/q/reports";
        reports.then(|| serde_json::from_slice(&self.body).expect("a report"))
    }
}

/// A fake control plane replica on `127.0.0.1:0`, serving the config at [`VERSION`].
struct FakeReplica {
    url: String,
    /// Every request it gets, as it gets it.
    seen: mpsc::UnboundedReceiver<Seen>,
    /// The accept loop, which owns the listener and every connection: aborted, all close.
    serving: tokio::task::JoinHandle<()>,
}

impl FakeReplica {
    async fn start() -> FakeReplica {
        FakeReplica::start_with(None).await
    }

    /// One whose watch past [`VERSION`] answers `later` (else it is held open).
    async fn start_with(later: Option<DesiredConfig>) -> FakeReplica {
        FakeReplica::serving(Fake {
            first: desired(),
            later,
            refuses_standby: false,
        })
        .await
    }

    /// One that answers as `fake` says.
    async fn serving(fake: Fake) -> FakeReplica {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tell, seen) = mpsc::unbounded_channel();
        let serving = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (tell, fake) = (tell.clone(), fake.clone());
                let service = hyper::service::service_fn(move |request| {
                    answer(request, tell.clone(), fake.clone())
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                connections.spawn(connection);
            }
        });
        FakeReplica { url, seen, serving }
    }

    /// The next request `wanted` holds for, and those it got before it; fails after
    /// [`PROMPT`].
    async fn next(&mut self, what: &str, wanted: impl Fn(&Seen) -> bool) -> (Seen, Vec<Seen>) {
        let mut before = vec![];
        let found = tokio::time::timeout(PROMPT, async {
            loop {
                let seen = self.seen.recv().await.expect("the replica serves");
                if wanted(&seen) {
                    return seen;
                }
                before.push(seen);
            }
        })
        .await;
        match found {
            Ok(seen) => (seen, before),
            Err(_) => panic!("{} never got {what}; it got {before:#?}", self.url),
        }
    }

    /// Dies: the listener closes and every connection with it (a held watch breaks).
    async fn kill(self) {
        self.serving.abort();
        assert!(self.serving.await.unwrap_err().is_cancelled());
    }
}

/// The node-channel routes as a control plane answers them: the config, or a watch held open
/// while nothing changes (until the replica dies); `applied` and reports taken.
/// What a fake replica serves: its config, a later one for a watch past it, and whether it
/// refuses a report with a standby's numbers (as a control plane from before them does).
#[derive(Clone)]
struct Fake {
    first: DesiredConfig,
    later: Option<DesiredConfig>,
    refuses_standby: bool,
}

async fn answer(
    request: Request<Incoming>,
    tell: mpsc::UnboundedSender<Seen>,
    fake: Fake,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let method = request.method().clone();
    let target = request.uri().path_and_query().unwrap().to_string();
    let authorized = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .is_some_and(|value| value.as_bytes() == format!("Bearer {TOKEN}").as_bytes());
    let body = request.into_body().collect().await?.to_bytes();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let after = query
        .strip_prefix("after=")
        .map(|after| after.parse::<u64>().unwrap());
    let route = (method.clone(), path.to_string());
    let refused = fake.refuses_standby && body.windows(9).any(|w| w == b"\"standby\"");
    let _ = tell.send(Seen {
        method,
        target: target.clone(),
        authorized,
        body,
    });
    let json = |value: Vec<u8>| {
        Response::builder()
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(value)))
            .unwrap()
    };
    let answer = match (route.0, route.1.as_str()) {
        (Method::GET, "/v1/nodes/q/config") if after.is_some_and(|after| after >= VERSION) => {
            match fake.later.filter(|later| after < Some(later.version)) {
                Some(later) => json(serde_json::to_vec(&later).unwrap()),
                None => std::future::pending::<Response<Full<Bytes>>>().await,
            }
        }
        (Method::GET, "/v1/nodes/q/config") => json(serde_json::to_vec(&fake.first).unwrap()),
        (Method::POST, "/v1/nodes/q/applied" | "/v1/nodes/q/reports") if refused => {
            let mut response = Response::new(Full::default());
            *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
            response
        }
        (Method::POST, "/v1/nodes/q/applied") => Response::new(Full::default()),
        (Method::POST, "/v1/nodes/q/reports") => {
            json(serde_json::to_vec(&ReportReceipt::default()).unwrap())
        }
        _ => {
            let mut response = Response::new(Full::default());
            *response.status_mut() = StatusCode::NOT_FOUND;
            response
        }
    };
    Ok(answer)
}

/// The config the replicas hold: plain ws:// on a free port.
fn desired() -> DesiredConfig {
    let login = |name: &str| LoginHash {
        username: name.into(),
        password_hash: PasswordHash::new("a password").to_string(),
    };
    DesiredConfig {
        version: VERSION,
        tier: Tier::Devtest,
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        tls: NodeTls::None,
        logins: Logins {
            publisher: login("p"),
            subscriber: login("s"),
            admin: login("a"),
        },
        instance_type: "local".into(),
        region: "local".into(),
        ipv4: false,
        max_messages: None,
        max_messages_memory: None,
        node_token: None,
        live_stats_secs: None,
        usage_record_secs: None,
        stats_record_secs: None,
        sqs: None,
        build: None,
        initial_settings: None,
        redrive: None,
        replication: None,
    }
}

/// The bootstrap of queue `q`'s node with [`TOKEN`]: `preferred` first, and `replicas`.
fn bootstrap(preferred: &str, replicas: &[&str]) -> Bootstrap {
    Bootstrap {
        control_plane: preferred.to_string(),
        control_planes: replicas.iter().map(|url| url.to_string()).collect(),
        queue_id: "q".into(),
        node_token: TOKEN.into(),
        bootstrap_token: None,
        control_plane_ca_pem: None,
    }
}

/// Whether a request is `method` on `target`.
fn is(method: Method, target: String) -> impl Fn(&Seen) -> bool {
    move |seen| seen.method == method && seen.target == target
}

/// A node started from a bootstrap in `dir`; killed on drop, its log printed if the test
/// failed.
struct NodeProcess {
    child: tokio::process::Child,
    log: PathBuf,
}

impl NodeProcess {
    fn start(dir: &Path, bootstrap: &Bootstrap) -> NodeProcess {
        let path = dir.join("bootstrap.toml");
        std::fs::write(&path, toml::to_string(bootstrap).unwrap()).unwrap();
        let log = dir.join("node.log");
        let child = tokio::process::Command::new(dataplane_binary())
            .arg("--bootstrap")
            .arg(&path)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("start dataplane");
        NodeProcess { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits, at most [`PROMPT`], for the node to stop by itself.
    async fn stop(&mut self) {
        signal(self.child.id().expect("running"), libc::SIGTERM);
        let status = tokio::time::timeout(PROMPT, self.child.wait())
            .await
            .expect("it stops on SIGTERM")
            .unwrap();
        assert_eq!(status.code(), Some(0), "{status:?}");
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- dataplane log ---\n{}", self.log());
        }
    }
}

#[tokio::test]
async fn a_watch_that_breaks_goes_on_at_the_next_replica_and_reports_follow() {
    let mut first = FakeReplica::start().await;
    let mut second = FakeReplica::start().await;
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = bootstrap(&first.url, &[&first.url, &second.url]);
    let mut node = NodeProcess::start(dir.path(), &bootstrap);

    // The preferred replica first: the config, the version applied, then a watch past it.
    let (config, _) = first
        .next("the config", is(Method::GET, "/v1/nodes/q/config".into()))
        .await;
    assert!(config.authorized);
    let (applied, _) = first
        .next("applied", is(Method::POST, "/v1/nodes/q/applied".into()))
        .await;
    let applied: serde_json::Value = serde_json::from_slice(&applied.body).unwrap();
    assert_eq!(applied["version"], VERSION, "{applied}");
    assert_eq!(applied["build"]["version"], env!("CARGO_PKG_VERSION"));
    let watch = format!("/v1/nodes/q/config?after={VERSION}");
    first.next("a watch", is(Method::GET, watch.clone())).await;

    // It dies mid-watch: the watch goes on at the next replica, past the same version, and
    // nothing is asked again (no config from scratch, no second `applied`).
    let first_url = first.url.clone();
    first.kill().await;
    let (resumed, before) = second
        .next("the watch", |seen| seen.report().is_none())
        .await;
    assert_eq!(
        (resumed.method.clone(), resumed.target.as_str()),
        (Method::GET, watch.as_str()),
        "the watch, resumed: {resumed:?}"
    );
    assert!(resumed.authorized);
    assert!(
        before.iter().all(|seen| seen.report().is_some()),
        "{before:#?}"
    );

    // Its reports go there too: the last usage record, then the last report, as it stops.
    node.stop().await;
    let (last, reports) = second
        .next("the last report", |seen| {
            seen.report().is_some_and(|report| report.last)
        })
        .await;
    assert!(last.authorized);
    let usage: usize = reports
        .iter()
        .filter_map(Seen::report)
        .map(|report| report.usage.len())
        .sum();
    assert!(usage >= 1, "the last usage record: {reports:#?}");
    assert!(
        reports.iter().all(|seen| seen.report().is_some()),
        "{reports:#?}"
    );

    // One switch, said once (the channel and the reporter share where they are), and the
    // credential nowhere in the log.
    let log = node.log();
    let switches: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("failing over"))
        .collect();
    assert_eq!(switches.len(), 1, "{log}");
    assert!(
        switches[0].contains(&first_url) && switches[0].contains(&second.url),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "{log}");
}

/// A node whose first config came without the standby's key (from a control plane that did
/// not send it) says it runs without a standby; when a later config has the key, which is
/// taken at start, it stops cleanly to be started again with it, rather than go on answering
/// durability 2 on one disk.
#[tokio::test]
async fn a_node_given_a_standby_after_it_started_stops_to_take_it() {
    let mut later = desired();
    later.version = VERSION + 1;
    later.replication = Some(qe_shared::node_channel::DesiredReplication {
        key_hash: PasswordHash::new("a replication key").to_string(),
        epoch: None,
        step_down_after_ms: None,
        follow: None,
    });
    let mut replica = FakeReplica::start_with(Some(later)).await;
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = bootstrap(&replica.url, &[]);
    let mut node = NodeProcess::start(dir.path(), &bootstrap);
    let (applied, _) = replica
        .next("applied", is(Method::POST, "/v1/nodes/q/applied".into()))
        .await;
    let applied: serde_json::Value = serde_json::from_slice(&applied.body).unwrap();
    assert_eq!(applied["standby"], false, "{applied}");
    let status = tokio::time::timeout(PROMPT, node.child.wait())
        .await
        .expect("it stops by itself")
        .unwrap();
    // Not 0: a systemd unit with `Restart=on-failure` starts it again.
    assert_eq!(status.code(), Some(75), "{status:?}");
    assert!(
        node.log().contains("started without one: stopping"),
        "{}",
        node.log()
    );
}

/// A node with a standby serves at the epoch its config gives, kept with its copy before it
/// serves; a later config that gives a higher one (a promoted copy started before its new
/// epoch was stored) is taken and kept while it serves; a lower one is not.
#[tokio::test]
async fn a_node_takes_a_higher_epoch_from_its_config_and_never_a_lower_one() {
    let replication = |epoch: u64| qe_shared::node_channel::DesiredReplication {
        key_hash: PasswordHash::new("a replication key").to_string(),
        epoch: Some(epoch),
        step_down_after_ms: None,
        follow: None,
    };
    let mut first = desired();
    first.replication = Some(replication(1));
    let mut later = first.clone();
    later.version = VERSION + 1;
    later.replication = Some(replication(3));
    let mut replica = FakeReplica::serving(Fake {
        first,
        later: Some(later),
        refuses_standby: false,
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &bootstrap(&replica.url, &[]));
    let applied_version = |version: u64| {
        move |seen: &Seen| {
            seen.target == "/v1/nodes/q/applied"
                && serde_json::from_slice::<serde_json::Value>(&seen.body)
                    .is_ok_and(|applied| applied["version"] == version)
        }
    };
    replica
        .next("the later config confirmed", applied_version(VERSION + 1))
        .await;
    let kept = || std::fs::read_to_string(dir.path().join("data/messages/epoch")).unwrap();
    assert_eq!(kept(), "3\n");
    let log = node.log();
    assert!(log.contains("the queue's epoch moved on"), "{log}");
    drop(node);
    // Started again from a config that gives a lower one: it keeps its own.
    let mut lower = desired();
    lower.version = VERSION + 2;
    lower.replication = Some(replication(2));
    let mut replica = FakeReplica::serving(Fake {
        first: lower,
        later: None,
        refuses_standby: false,
    })
    .await;
    let _node = NodeProcess::start(dir.path(), &bootstrap(&replica.url, &[]));
    replica
        .next("the lower config confirmed", applied_version(VERSION + 2))
        .await;
    assert_eq!(kept(), "3\n");
}

/// A node with a standby says so when it confirms a config and puts the standby's numbers in
/// its live reports; a control plane from before standbys refuses both (it reads them with
/// `deny_unknown_fields`), and would neither hear the config confirmed nor hear any live
/// numbers, and judge the node silent: the node sends both again at once without them, and
/// leaves the standby's numbers out from then on.
#[tokio::test]
async fn a_control_plane_from_before_standbys_still_hears_the_node() {
    let mut first = desired();
    first.replication = Some(qe_shared::node_channel::DesiredReplication {
        key_hash: PasswordHash::new("a replication key").to_string(),
        epoch: Some(4),
        step_down_after_ms: None,
        follow: None,
    });
    let mut replica = FakeReplica::serving(Fake {
        first,
        later: None,
        refuses_standby: true,
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = bootstrap(&replica.url, &[]);
    let _node = NodeProcess::start(dir.path(), &bootstrap);
    let live = |standby: bool| {
        move |seen: &Seen| {
            let live = seen.report().and_then(|report| report.live);
            live.is_some_and(|live| live.standby.is_some() == standby)
        }
    };
    let applied = |standby: bool| {
        move |seen: &Seen| {
            let said = seen.body.windows(9).any(|w| w == b"\"standby\"");
            seen.target == "/v1/nodes/q/applied" && said == standby
        }
    };
    // Everything it sent until both were sent again without the standby's.
    let mut seen = Vec::new();
    while !(seen.iter().any(applied(false)) && seen.iter().any(live(false))) {
        let (last, before) = replica
            .next("applied or live numbers without the standby's", |s| {
                applied(false)(s) || live(false)(s)
            })
            .await;
        seen.extend(before);
        seen.push(last);
    }
    assert!(seen.iter().any(applied(true)), "{seen:#?}");
    let refused = seen
        .iter()
        .find(|s| live(true)(s))
        .expect("live numbers with them");
    let report = refused.report().unwrap().live.unwrap();
    assert!(!report.standby.unwrap().in_sync, "no standby attached");
    // The epoch its config gave, kept with its copy before it served.
    let kept = std::fs::read_to_string(dir.path().join("data/messages/epoch")).unwrap();
    assert_eq!(kept, "4\n");
}
