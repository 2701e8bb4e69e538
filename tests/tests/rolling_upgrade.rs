//! Rolling node upgrades (docs/deploy.md §14), as an operator runs them with `qe`, against the
//! real control plane and its local nodes: a new build published and rolled across three
//! queues in waves (a canary first) while a publisher on each queue keeps publishing durable
//! messages — the time each queue could not publish is printed; a build that does not start
//! halts the roll at its canary, which comes back on the build it ran; a rollback, and a
//! rollback to the installed build.

use futures::{SinkExt, StreamExt};
use qe_tests::{dataplane_binary, qe_json, rollout_start, run_qe as qe};
use qe_tests::{login_with, ControlPlane};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

const NEW_QUEUE: &str = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;

/// Queue `id` as the API shows it.
async fn queue(cp: &ControlPlane, id: &str) -> Value {
    let (status, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(status, 200, "{queue}");
    queue
}

/// Queue `id` once `test` holds of it (the API has no wait for builds: asked every 100 ms).
async fn queue_when(cp: &ControlPlane, id: &str, test: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let queue = queue(cp, id).await;
        if test(&queue) {
            return queue;
        }
        assert!(Instant::now() < deadline, "never: {queue}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn runs(queue: &Value) -> &str {
    queue["node_build"]["binary_sha256"].as_str().unwrap_or("")
}

fn pid_of(cp: &ControlPlane, id: &str) -> String {
    std::fs::read_to_string(cp.node_dir(id).join("node.pid")).unwrap()
}

/// What a publisher saw while a node was upgraded: how many durable publishes succeeded and
/// the longest time between two successes (the queue's unavailability).
struct Watched {
    published: u64,
    longest_gap: Duration,
}

/// Publishes durability-2 messages to the queue at `url` one at a time until `stop`,
/// connecting again (every 20 ms) whenever the connection ends.
async fn keep_publishing(
    url: String,
    login: Value,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Watched {
    let mut watched = Watched {
        published: 0,
        longest_gap: Duration::ZERO,
    };
    let mut last_success = Instant::now();
    while !*stop.borrow() {
        if let Ok(mut socket) = logged_in(&url, &login).await {
            loop {
                if *stop.borrow() {
                    return watched;
                }
                let body = format!("watch {}", watched.published);
                let request = json!({"body": body, "durability": 2}).to_string();
                if socket.send(Message::text(request)).await.is_err() {
                    break;
                }
                match socket.next().await {
                    Some(Ok(Message::Text(reply))) if reply.contains("Success.") => {
                        watched.published += 1;
                        let now = Instant::now();
                        watched.longest_gap = watched.longest_gap.max(now - last_success);
                        last_success = now;
                    }
                    _ => break,
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watched
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn logged_in(url: &str, login: &Value) -> Result<Socket, ()> {
    let (mut socket, _) = tokio_tungstenite::connect_async(url)
        .await
        .map_err(|_| ())?;
    let request = json!({
        "username": login["username"], "password": login["password"],
        "role": "publisher", "queuetype": "distribute",
    });
    socket
        .send(Message::text(request.to_string()))
        .await
        .map_err(|_| ())?;
    match socket.next().await {
        Some(Ok(Message::Text(reply))) if reply.contains("Success.") => Ok(socket),
        _ => Err(()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_build_rolls_across_queues_a_canary_that_fails_halts_it_and_rollbacks_restore() {
    let cp = ControlPlane::start();
    let mut queues = Vec::new();
    for _ in 0..3 {
        queues.push(cp.create_queue(NEW_QUEUE).await);
    }
    let ids: Vec<String> = queues
        .iter()
        .map(|q| q["id"].as_str().unwrap().to_string())
        .collect();
    // Each node says which build it runs: the installed one.
    let installed = runs(&queue_when(&cp, &ids[0], |q| !runs(q).is_empty()).await).to_string();
    // One durable message in each queue, to be there after every restart.
    for queue in &queues {
        let node = queue["node"].as_str().unwrap();
        let mut publisher =
            login_with(node, &queue["logins"]["publisher"], "publisher", json!({})).await;
        let reply = publisher
            .request(json!({"body": "before the upgrade", "durability": 2}))
            .await;
        assert_eq!(reply["status"], "Success.", "{reply}");
    }

    let files = tempfile::tempdir().unwrap();
    let config = files.path().join("qe.toml");
    let (code, out, err) = qe(
        &config,
        &[
            "login",
            "--api",
            &format!("http://{}", cp.addr),
            "--token-stdin",
        ],
        &cp.token,
    );
    assert_eq!(code, 0, "{out}{err}");

    // A new build: the installed binary with bytes of its own appended (another SHA-256, the
    // same program).
    let next = files.path().join("dataplane-next");
    let mut binary = std::fs::read(dataplane_binary()).unwrap();
    binary.extend_from_slice(b"\0the next build, for the rolling upgrade test\0");
    std::fs::write(&next, &binary).unwrap();
    let published = qe_json(
        &config,
        0,
        &[
            "builds",
            "publish",
            next.to_str().unwrap(),
            "--label",
            "next",
        ],
    );
    let good = published["sha256"].as_str().unwrap().to_string();
    assert_ne!(good, installed);
    assert_eq!(published["label"], "next");
    let listed = qe_json(&config, 0, &["builds", "list"]);
    assert_eq!(listed["installed"]["binary_sha256"], installed.as_str());

    // Rolled while each queue is being published to.
    let pids: Vec<String> = ids.iter().map(|id| pid_of(&cp, id)).collect();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let watchers: Vec<_> = queues
        .iter()
        .map(|queue| {
            let url = queue["node"].as_str().unwrap().to_string();
            let login = queue["logins"]["publisher"].clone();
            tokio::spawn(keep_publishing(url, login, stopping.clone()))
        })
        .collect();
    let canary = ids[1].as_str();
    let started = Instant::now();
    let rollout = qe_json(&config, 0, &rollout_start(&good, canary, "120"));
    let took = started.elapsed();
    stop.send(true).unwrap();
    assert_eq!(rollout["state"], "done", "{rollout}");
    let mut rest = vec![ids[0].clone(), ids[2].clone()];
    rest.sort();
    assert_eq!(
        rollout["waves"],
        json!([[canary], rest]),
        "the canary alone first"
    );
    for (n, watcher) in watchers.into_iter().enumerate() {
        let watched = watcher.await.unwrap();
        assert!(watched.published > 0);
        println!(
            "queue {}: {} durable publishes while rolling ({took:?} in all); could not publish \
             for at most {:?}",
            ids[n], watched.published, watched.longest_gap
        );
        // Every publish confirmed across the restart is there (a reply lost with its
        // connection may have made one more).
        let node = queues[n]["node"].as_str().unwrap();
        let mut admin = login_with(node, &queues[n]["logins"]["admin"], "admin", json!({})).await;
        let stats = admin.request(json!({"cmd": "getlivestats"})).await;
        let csv = stats["csv"].as_str().unwrap();
        let held: u64 = csv.split(',').next().unwrap().parse().unwrap();
        assert!(
            held > watched.published,
            "{held} held, {} confirmed",
            watched.published
        );
    }
    for (n, id) in ids.iter().enumerate() {
        let queue = queue(&cp, id).await;
        assert_eq!(runs(&queue), good, "{queue}");
        assert_eq!(queue["desired_build"]["binary_sha256"], good.as_str());
        // The same process (it exec'd the new build), with its data.
        assert_eq!(
            pid_of(&cp, id),
            pids[n],
            "queue {id}'s node was restarted from outside"
        );
        let node = queue["node"].as_str().unwrap();
        let login = &queues[n]["logins"]["subscriber"];
        let mut subscriber = login_with(node, login, "subscriber", json!({"capacity": 1})).await;
        let first = subscriber.recv().await;
        assert_eq!(first["body"], "before the upgrade", "{first}");
    }

    // A build that does not start (it exits at once): refused at the canary, which comes
    // back on the build it ran; the roll halts there and touches no other queue.
    let broken = files.path().join("dataplane-broken");
    std::fs::copy("/bin/false", &broken).unwrap();
    let bad = qe_json(&config, 0, &["builds", "publish", broken.to_str().unwrap()]);
    let bad = bad["sha256"].as_str().unwrap().to_string();
    let canary = ids[0].as_str();
    let (code, out, err) = qe(
        &config,
        &[&["--json"][..], &rollout_start(&bad, canary, "120")].concat(),
        "",
    );
    assert_eq!(code, 3, "a halted roll is refused: {out}{err}");
    let halted: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(halted["state"], "halted", "{halted}");
    let reason = halted["reason"].as_str().unwrap();
    assert!(
        reason.contains(canary) && reason.contains("did not stay up"),
        "{reason}"
    );
    assert_eq!(halted["queues"][canary]["step"], "refused");
    for id in &ids[1..] {
        assert_eq!(halted["queues"][id]["step"], "waiting", "{halted}");
        let queue = queue(&cp, id).await;
        assert_eq!(queue["desired_build"]["binary_sha256"], good.as_str());
        assert_eq!(runs(&queue), good);
    }
    let canary_queue = queue_when(&cp, canary, |q| runs(q) == good).await;
    assert_eq!(canary_queue["refused_build"]["binary_sha256"], bad.as_str());
    let token = Some(cp.token.as_str());
    let (_, metrics) = qe_tests::http_text(cp.addr, "GET", "/metrics", token, None).await;
    assert!(
        metrics.contains("qe_rollouts{state=\"halted\"} 1\n"),
        "{metrics}"
    );
    let halted_id = halted["id"].as_str().unwrap();
    // Another rollout waits for this one to be settled.
    let (code, _, err) = qe(&config, &["rollouts", "start", &installed], "");
    assert_eq!(code, 3, "{err}");
    let rolled_back = qe_json(&config, 0, &["rollouts", "rollback", halted_id]);
    assert_eq!(rolled_back["state"], "rolled-back", "{rolled_back}");
    let canary_queue = queue(&cp, canary).await;
    assert_eq!(
        canary_queue["desired_build"]["binary_sha256"],
        good.as_str()
    );

    // A queue made now is told the build the fleet was rolled to (the halted rollout, rolled
    // back, does not count), and runs it.
    let late = cp.create_queue(NEW_QUEUE).await;
    let late = late["id"].as_str().unwrap();
    let late_queue = queue_when(&cp, late, |q| runs(q) == good).await;
    assert_eq!(late_queue["desired_build"]["binary_sha256"], good.as_str());

    // The first rollout rolled back: every queue is told the installed build again, fetches
    // it from the control plane and restarts into it.
    let first = rollout["id"].as_str().unwrap();
    let back = qe_json(&config, 0, &["rollouts", "rollback", first]);
    assert_eq!(back["state"], "rolled-back", "{back}");
    for id in &ids {
        let queue = queue_when(&cp, id, |q| runs(q) == installed).await;
        assert_eq!(queue["desired_build"]["binary_sha256"], installed.as_str());
    }
    // The queue made after it was done too: told the fleet's build without it.
    let late_queue = queue_when(&cp, late, |q| runs(q) == installed).await;
    assert_eq!(
        late_queue["desired_build"]["binary_sha256"],
        installed.as_str()
    );
    // A node fetches only the build it is told to run (or the installed one).
    let token = cp.node_config(late)["node_token"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/nodes/{late}/builds/{good}");
    let (status, _) = qe_tests::http_text(cp.addr, "GET", &path, Some(&token), None).await;
    assert_eq!(status, 404, "a build this node is not told to run");
    // And a queue made after that starts from the installed build and is told none.
    let last = cp.create_queue(NEW_QUEUE).await;
    assert_eq!(last["desired_build"], Value::Null, "{last}");
    let listed = qe_json(&config, 0, &["rollouts", "list"]);
    let states: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["rolled-back", "rolled-back"]);
}
