//! `bench failover`: one control plane (the release binary, its own store, the local
//! provider) and one queue made with `replicas: 2`, publishers at durability 2 all along.
//! Each round, at a random moment, the node's disk is lost (its data directory removed) and
//! its process killed; the provider starts it again on its standby's copy (a promotion) and
//! a new standby follows. Measured per round: until a publisher is answered again (the queue
//! serves) and until durability 2 is Success again (on two disks). Subscribers hold what they
//! receive for a moment before they ack it, and after each loss resume their sessions on the
//! promoted copy. At the end every publish answered Success at durability 2 must have been
//! delivered, and none to a second subscriber while another held it. Exits 1 if one is lost
//! or was held by two at once. docs/resilience.md, *Failover to the standby*.

use crate::client::{next_text, Wire};
use futures::SinkExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use yawc::frame::Frame;

#[derive(clap::Args)]
pub struct Settings {
    /// The control plane binary (a release build).
    #[arg(long, default_value = "target/release/controlplane")]
    controlplane: String,
    /// Rounds: each loses the node's disk once.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Publishers, each with one durability-2 publish in flight.
    #[arg(long, default_value_t = 4)]
    publishers: usize,
    /// Subscribers all along, each holding up to 8 messages for `--hold-ms` before it acks.
    #[arg(long, default_value_t = 2)]
    subscribers: usize,
    /// How long a subscriber holds a message before it acks it.
    #[arg(long, default_value_t = 20)]
    hold_ms: u64,
}

/// Each subscriber's capacity.
const HOLDER_CAPACITY: u64 = 8;

const TOKEN: &str = "operator-token-for-the-failover-run";
const REPLICATED: &str =
    r#"{"tier":"standard","region":"local","instance_type":"local","replicas":2}"#;
/// The longest a round may take to recover before the run gives up.
const RECOVER_WITHIN: Duration = Duration::from_secs(60);

/// What the publishers saw, shared with the rounds.
#[derive(Default)]
struct Seen {
    /// Bodies answered Success at durability 2.
    acknowledged: Vec<String>,
    /// When the node's disk was lost last.
    lost: Option<Instant>,
    /// Since then: when a publisher was first answered (any status), and first answered
    /// Success, on a connection opened after the loss (a reply the killed node sent before it
    /// died is no sign of its return).
    answered: Option<Instant>,
    succeeded: Option<Instant>,
    /// Every delivery to a subscriber all along: the body, who, when, and when it sent its
    /// ack (None: it never did, its connection ended first).
    deliveries: Vec<Delivery>,
    /// Subscribers' logins after a cut: sessions resumed, and new ones (a resume refused).
    resumed: usize,
    new_sessions: usize,
}

struct Delivery {
    body: String,
    subscriber: usize,
    at: Instant,
    acked: Option<Instant>,
}

pub async fn failover(settings: &Settings, dataplane: &Path, data_root: &Path) -> bool {
    let dir = data_root.join("failover");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the run's directory");
    let controlplane = std::fs::canonicalize(&settings.controlplane)
        .unwrap_or_else(|e| panic!("{}: {e} (build it first)", settings.controlplane));
    let (mut child, api) = start_controlplane(&controlplane, dataplane, &dir);
    // reqwest is built without a crypto provider of its own (the workspace's choice).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let created = call(&http, api, "POST", "/v1/queues", Some(REPLICATED)).await;
    let id = created["id"].as_str().expect("an id").to_string();
    let queue = wait_for(&http, api, &id, |q| q["live"]["standby"]["in_sync"] == true).await;
    let url = queue["node"].as_str().expect("placed").to_string();
    let login = created["logins"]["publisher"].clone();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut publishers = Vec::new();
    for publisher in 0..settings.publishers {
        let (url, login, seen) = (url.clone(), login.clone(), seen.clone());
        publishers.push(tokio::spawn(publish(publisher, url, login, seen)));
    }
    let hold = Duration::from_millis(settings.hold_ms);
    for subscriber in 0..settings.subscribers {
        let (url, seen) = (url.clone(), seen.clone());
        let login = created["logins"]["subscriber"].clone();
        publishers.push(tokio::spawn(hold_and_ack(
            subscriber, url, login, hold, seen,
        )));
    }
    let node_dir = dir.join("data/nodes").join(&id);
    let mut serving = Vec::new();
    let mut on_two_disks = Vec::new();
    for round in 1..=settings.rounds {
        // A random moment in the next 0.5 to 2 s of publishing.
        let wait = 500 + u32::from_le_bytes(qe_shared::random::bytes()) % 1500;
        tokio::time::sleep(Duration::from_millis(wait.into())).await;
        let lost = lose_the_disk(&node_dir, &seen);
        let (answered, succeeded) = recovered(&seen, lost).await;
        serving.push(answered);
        on_two_disks.push(succeeded);
        println!(
            "round {round:2}: serving again after {:6.0} ms, durability 2 on two disks after {:6.0} ms",
            ms(answered),
            ms(succeeded)
        );
    }
    for publisher in publishers {
        publisher.abort();
    }
    let seen = std::mem::take(&mut *lock(&seen));
    let logins = &created["logins"];
    // What the subscribers held when they stopped waits for their sessions' time to run out.
    let delivered = drain(&url, &logins["publisher"], &logins["subscriber"]).await;
    let _ = child.kill();
    let _ = child.wait();
    stop_nodes(&node_dir);
    report(&serving, &on_two_disks, &seen, &delivered)
}

/// Receives for ever, holding each message for `hold` before it acks it; after a cut,
/// resumes its session (with `replay`) or, if that is refused, logs in anew.
async fn hold_and_ack(
    subscriber: usize,
    url: String,
    login: Value,
    hold: Duration,
    seen: Arc<Mutex<Seen>>,
) {
    let wire = Wire {
        tls: None,
        compress: false,
    };
    let mut session: Option<String> = None;
    loop {
        let Ok(mut socket) = wire.try_connect(&url).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let mut request = json!({"username": login["username"], "password": login["password"],
            "role": "subscriber", "queuetype": "distribute", "capacity": HOLDER_CAPACITY});
        if let Some(session) = &session {
            request["sessionid"] = json!(session);
            request["replay"] = json!(true);
        }
        if socket.send(Frame::text(request.to_string())).await.is_err() {
            continue;
        }
        let Some(reply) = next_text(&mut socket).await else {
            continue;
        };
        let reply: Value = serde_json::from_str(&reply).unwrap_or_default();
        match (reply["status"] == "Success.", session.is_some()) {
            (true, true) => lock(&seen).resumed += 1,
            (false, true) => {
                // Refused (its time ran out, or it held nothing): a new session next.
                lock(&seen).new_sessions += 1;
                session = None;
                continue;
            }
            (true, false) => {}
            (false, false) => continue,
        }
        session = reply["sessionid"].as_str().map(str::to_string);
        // Held: (id, index in `deliveries`, when to ack).
        let mut held: std::collections::VecDeque<(Value, usize, Instant)> = Default::default();
        loop {
            let next_ack = held.front().map(|&(_, _, due)| due);
            let frame = match next_ack {
                Some(due) => tokio::time::timeout_at(due.into(), next_text(&mut socket)).await,
                None => Ok(next_text(&mut socket).await),
            };
            match frame {
                Err(_) => {
                    let (id, index, _) = held.pop_front().expect("one is due");
                    let ack = json!({"id": id, "ack": 1});
                    if socket.send(Frame::text(ack.to_string())).await.is_err() {
                        break;
                    }
                    lock(&seen).deliveries[index].acked = Some(Instant::now());
                }
                Ok(None) => break,
                Ok(Some(text)) => {
                    let frame: Value = serde_json::from_str(&text).unwrap_or_default();
                    let Some(body) = frame["body"].as_str() else {
                        continue; // an ack's reply
                    };
                    let mut seen = lock(&seen);
                    seen.deliveries.push(Delivery {
                        body: body.to_string(),
                        subscriber,
                        at: Instant::now(),
                        acked: None,
                    });
                    let index = seen.deliveries.len() - 1;
                    held.push_back((frame["id"].clone(), index, Instant::now() + hold));
                }
            }
        }
    }
}

/// Publishes at durability 2 for ever, reconnecting as the node comes and goes.
async fn publish(publisher: usize, url: String, login: Value, seen: Arc<Mutex<Seen>>) {
    let wire = Wire {
        tls: None,
        compress: false,
    };
    let mut sequence = 0u64;
    loop {
        let connected = Instant::now();
        let Ok(mut socket) = wire.try_connect(&url).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let login = json!({"username": login["username"], "password": login["password"],
            "role": "publisher", "queuetype": "distribute"});
        if socket.send(Frame::text(login.to_string())).await.is_err() {
            continue;
        }
        match next_text(&mut socket).await {
            Some(reply) if reply.contains("Success.") => {}
            _ => continue,
        }
        loop {
            sequence += 1;
            let body = format!("p{publisher}-{sequence}");
            let request = json!({"body": body, "durability": 2});
            if socket.send(Frame::text(request.to_string())).await.is_err() {
                break;
            }
            let Some(reply) = next_text(&mut socket).await else {
                break;
            };
            let now = Instant::now();
            let success = reply.contains("Success.");
            let mut seen = lock(&seen);
            if seen.lost.is_some_and(|lost| connected > lost) {
                seen.answered.get_or_insert(now);
                if success {
                    seen.succeeded.get_or_insert(now);
                }
            }
            if success {
                seen.acknowledged.push(body);
            }
        }
    }
}

/// Removes the node's data directory, then kills its process; when.
fn lose_the_disk(node_dir: &Path, seen: &Mutex<Seen>) -> Instant {
    let pid: i32 = std::fs::read_to_string(node_dir.join("node.pid"))
        .expect("the node's pid file")
        .trim()
        .parse()
        .expect("a pid");
    std::fs::remove_dir_all(node_dir.join("data")).expect("the node's data directory");
    let lost = Instant::now();
    {
        let mut seen = lock(seen);
        seen.lost = Some(lost);
        seen.answered = None;
        seen.succeeded = None;
    }
    // SAFETY: kill takes a pid and a signal.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    lost
}

/// How long after `lost` a publisher was answered again, and answered Success again.
async fn recovered(seen: &Mutex<Seen>, lost: Instant) -> (Duration, Duration) {
    let deadline = lost + RECOVER_WITHIN;
    loop {
        if let (Some(answered), Some(succeeded)) = {
            let seen = lock(seen);
            (seen.answered, seen.succeeded)
        } {
            return (answered - lost, succeeded - lost);
        }
        assert!(
            Instant::now() < deadline,
            "not recovered within {RECOVER_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every message waiting, received and acked, up to a marker published now; their bodies.
async fn drain(url: &str, publisher: &Value, subscriber: &Value) -> Vec<String> {
    let wire = Wire {
        tls: None,
        compress: false,
    };
    let login = |login: &Value, role: &str, extra: Value| {
        let mut request = json!({"username": login["username"], "password": login["password"],
            "role": role, "queuetype": "distribute"});
        for (key, value) in extra.as_object().expect("an object") {
            request[key] = value.clone();
        }
        request
    };
    let mut marker =
        crate::client::login(&wire, url, login(publisher, "publisher", json!({}))).await;
    let end = json!({"body": MARKER, "durability": 2});
    marker
        .send(Frame::text(end.to_string()))
        .await
        .expect("the marker sent");
    let reply = next_text(&mut marker).await.expect("the marker answered");
    assert!(reply.contains("Success."), "the marker: {reply}");
    let capacity = json!({"capacity": 256});
    let mut subscriber =
        crate::client::login(&wire, url, login(subscriber, "subscriber", capacity)).await;
    let mut delivered = Vec::new();
    loop {
        let text = next_text(&mut subscriber)
            .await
            .expect("the queue delivers");
        let frame: Value = serde_json::from_str(&text).expect("JSON");
        let Some(body) = frame["body"].as_str() else {
            continue;
        };
        let ack = json!({"id": frame["id"], "ack": 1});
        subscriber
            .send(Frame::text(ack.to_string()))
            .await
            .expect("an ack sent");
        if body == MARKER {
            return delivered;
        }
        delivered.push(body.to_string());
    }
}

/// Published after the rounds: everything before it is delivered before it.
const MARKER: &str = "end of the run";

/// Deliveries of one message to a subscriber while another held it: received by the other
/// before, and not acked by it until after.
fn held_by_two_at_once(deliveries: &[Delivery]) -> usize {
    let mut by_body: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for delivery in deliveries {
        by_body.entry(&delivery.body).or_default().push(delivery);
    }
    let mut twice = 0;
    for list in by_body.values() {
        for later in list {
            let held_then = |earlier: &&&Delivery| {
                earlier.subscriber != later.subscriber
                    && earlier.at <= later.at
                    && earlier.acked.is_none_or(|acked| acked > later.at)
            };
            twice += usize::from(list.iter().any(|e| held_then(&e)));
        }
    }
    twice
}

fn report(
    serving: &[Duration],
    on_two_disks: &[Duration],
    seen: &Seen,
    delivered: &[String],
) -> bool {
    let mut times: HashMap<&str, usize> = HashMap::new();
    let to_holders = seen.deliveries.iter().map(|d| d.body.as_str());
    for body in delivered.iter().map(String::as_str).chain(to_holders) {
        *times.entry(body).or_default() += 1;
    }
    let acknowledged = &seen.acknowledged;
    let lost = acknowledged
        .iter()
        .filter(|b| !times.contains_key(b.as_str()))
        .count();
    let again = times.values().filter(|&&n| n > 1).count();
    let two_at_once = held_by_two_at_once(&seen.deliveries);
    let summary = |what: &str, durations: &[Duration]| {
        let mut sorted = durations.to_vec();
        sorted.sort();
        if let (Some(worst), Some(median)) = (sorted.last(), sorted.get(sorted.len() / 2)) {
            println!(
                "{what}: median {:.0} ms, worst {:.0} ms",
                ms(*median),
                ms(*worst)
            );
        }
    };
    summary("serving again", serving);
    summary("durability 2 on two disks again", on_two_disks);
    println!(
        "acknowledged at durability 2: {}, delivered: {} to the subscribers and {} after the \
         rounds ({} distinct), lost: {lost}",
        acknowledged.len(),
        seen.deliveries.len(),
        delivered.len(),
        times.len()
    );
    println!(
        "subscribers: {} sessions resumed, {} new after a refused resume; messages delivered \
         more than once: {again}; held by two subscribers at once: {two_at_once}",
        seen.resumed, seen.new_sessions
    );
    lost == 0 && two_at_once == 0
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().expect("never poisoned")
}

/// The control plane on `dir`, its API on a free loopback port; and where it listens.
fn start_controlplane(binary: &Path, dataplane: &Path, dir: &Path) -> (Child, SocketAddr) {
    let config = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\ntoken = \"{TOKEN}\"\ncluster = \"bench\"\n\
         dataplane = {:?}\nlive_stats_secs = 1\nreconcile_every_secs = 1\n",
        dir.join("data"),
        dataplane,
    );
    let path = dir.join("controlplane.toml");
    std::fs::write(&path, config).expect("the config");
    let log = std::fs::File::create(dir.join("controlplane.log")).expect("its log");
    let mut child = Command::new(binary)
        .args(["serve", "--config"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start the control plane");
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines.next().expect("it listens").expect("a line");
        if let Some(addr) = line.strip_prefix("listening on ") {
            break addr.trim().parse().expect("an address");
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

/// The node and its standby, which outlive the control plane (as in production).
fn stop_nodes(node_dir: &Path) {
    let pid_files: [PathBuf; 2] = [
        node_dir.join("node.pid"),
        node_dir.join("standby/standby.pid"),
    ];
    for file in pid_files {
        if let Some(pid) = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            // SAFETY: kill takes a pid and a signal.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// One API call with the operator's token; its JSON body.
async fn call(
    http: &reqwest::Client,
    api: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Value {
    let url = format!("http://{api}{path}");
    let request = match method {
        "POST" => http.post(url).body(body.unwrap_or_default().to_string()),
        _ => http.get(url),
    };
    let response = request
        .bearer_auth(TOKEN)
        .header("Content-Type", "application/json")
        .send()
        .await
        .expect("the API answers");
    response.json().await.expect("JSON")
}

/// Queue `id` once `wanted` holds of it.
async fn wait_for(
    http: &reqwest::Client,
    api: SocketAddr,
    id: &str,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + RECOVER_WITHIN;
    loop {
        let queue = call(http, api, "GET", &format!("/v1/queues/{id}"), None).await;
        if wanted(&queue) {
            return queue;
        }
        assert!(
            Instant::now() < deadline,
            "the queue never got there: {queue}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
