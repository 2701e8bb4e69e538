//! The web console in a real browser: headless Chromium, driven by Playwright for Python (sync
//! API, `tests/console/drive.py`), against the real control plane and a real node. One control
//! plane, one browser session: sign-in (a wrong key refused, an account's key seeing only its
//! queues), the live numbers once the node reports, Refresh keeping them visible, create with
//! the logins shown once, delete with a confirmation, another account's queue not found, the
//! queue page's tabs, the SQS tab (a key made with its secret shown once, taken by the node
//! through boto3, revoked with a confirmation and then refused, an API error shown), CSRF
//! (plain HTTP with the browser's cookie), the phone-sized screen, sign-out, a read-only key,
//! and no console errors.
//!
//! Chromium comes from Debian (`scripts/test` installs it) and Playwright launches it by its
//! path: Playwright's own browser downloads (`playwright install`) are never used. Playwright
//! is in `.venv` (`scripts/test` installs it too; its wheel brings the driver it talks to the
//! browser through). A missing browser fails the test, unless
//! `QE_CONSOLE_SKIP_WITHOUT_BROWSER=1` says to skip then. `QE_CONSOLE_SCREENSHOTS=DIR` (relative
//! to the workspace's root) saves a screenshot of each page the browser visits.

use qe_tests::{http, login_with, python, workspace, ControlPlane};
use serde_json::{json, Value};
use std::path::PathBuf;

/// Nodes report every second, so the numbers show at once.
const CONFIG: &str = "live_stats_secs = 1\n";

/// What the test publishes to the account's queue before the browser looks.
const PUBLISHED: u64 = 2;

const QUEUE: &str = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;

/// The first of `names` on the PATH.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Makes an account (as the operator) and a key of `scope` for it; returns its id and key.
async fn account_with_key(cp: &ControlPlane, name: &str, scope: &str) -> (String, String) {
    let body = json!({ "name": name }).to_string();
    let (status, account) = cp.call("POST", "/v1/accounts", Some(&body)).await;
    assert_eq!(status, 201, "{account}");
    let id = account["id"].as_str().unwrap().to_string();
    let key = key_for(cp, &id, scope).await;
    (id, key)
}

async fn key_for(cp: &ControlPlane, account: &str, scope: &str) -> String {
    let path = format!("/v1/accounts/{account}/keys");
    let body = json!({ "scope": scope }).to_string();
    let (status, key) = cp.call("POST", &path, Some(&body)).await;
    assert_eq!(status, 201, "{key}");
    key["token"].as_str().unwrap().to_string()
}

/// Creates a queue with `key` and waits until it runs; returns it with its logins.
async fn queue_of(cp: &ControlPlane, key: &str) -> Value {
    let (status, created) = http(cp.addr, "POST", "/v1/queues", Some(key), Some(QUEUE)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let mut queue = cp.wait_for_status(&id, "running").await;
    queue["logins"] = created["logins"].clone();
    queue
}

/// Records of the last hour for queue `id`, through its node's report route and token: three
/// stats records (depth 1, 3, 2; the last two with the messages published and delivered in
/// their interval, the first as from a node that did not count them) and two usage records.
async fn report_history(cp: &ControlPlane, id: &str) {
    let config = cp.node_config(id);
    let token = config["node_token"].as_str().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stats: Vec<Value> = [
        (1800, 1, None),
        (1200, 3, Some((7, 5))),
        (600, 2, Some((4, 6))),
    ]
    .iter()
    .map(|(ago, depth, flow)| {
        let mut record = json!({"time": now - ago, "messages": depth, "publishers": 1,
                "subscribers": 0, "saved_subscribers": 0, "administrators": 0,
                "unacknowledged": 0, "dead_letter": 0, "delayed": 0, "durable": 0});
        if let Some((published, delivered)) = flow {
            record["published"] = json!(published);
            record["delivered"] = json!(delivered);
        }
        record
    })
    .collect();
    let (_, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    let usage: Vec<Value> = [(1500, 1000), (900, 4000)]
        .iter()
        .map(|(ago, bytes)| {
            json!({"time": now - ago, "network_sent": bytes, "network_received": bytes / 2,
                "storage_written": 0, "storage_read": 0, "storage_held": 0,
                "instance_type": queue["instance_type"], "region": queue["region"], "ipv4": false})
        })
        .collect();
    let body = json!({ "stats": stats, "usage": usage }).to_string();
    let path = format!("/v1/nodes/{id}/reports");
    let (status, receipt) = http(cp.addr, "POST", &path, Some(token), Some(&body)).await;
    assert_eq!(status, 200, "{receipt}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_in_a_real_browser() {
    let Some(chromium) = on_path(&["chromium", "chromium-browser"]) else {
        if std::env::var("QE_CONSOLE_SKIP_WITHOUT_BROWSER").is_ok_and(|v| v == "1") {
            eprintln!(
                "\n!!!!!!!! SKIPPED: the console's browser test did not run: chromium is \
                 missing (QE_CONSOLE_SKIP_WITHOUT_BROWSER=1) !!!!!!!!\n"
            );
            return;
        }
        panic!(
            "chromium is needed (Debian: chromium; scripts/test installs it), or \
             QE_CONSOLE_SKIP_WITHOUT_BROWSER=1 to skip"
        );
    };
    let cp = ControlPlane::start_with(CONFIG);
    let (alpha, alpha_key) = account_with_key(&cp, "Alpha", "full").await;
    let reader_key = key_for(&cp, &alpha, "read-only").await;
    let (_, beta_key) = account_with_key(&cp, "Beta", "full").await;
    let (alpha_queue, beta_queue) =
        tokio::join!(queue_of(&cp, &alpha_key), queue_of(&cp, &beta_key));
    // Messages for the depth the browser must come to show.
    let node = alpha_queue["node"].as_str().unwrap();
    let login = &alpha_queue["logins"]["publisher"];
    let mut publisher = login_with(node, login, "publisher", json!({})).await;
    // First one binary message that a subscriber rejects (nack): the queue moves it to the
    // dead letter queue, where the DLQ tab must show it in hex and redrive it.
    let dead = publisher
        .request(json!({"body": "AAEC/w==", "type": 2}))
        .await;
    assert_eq!(dead["status"], "Success.", "{dead}");
    let login = &alpha_queue["logins"]["subscriber"];
    let mut subscriber = login_with(node, login, "subscriber", json!({"capacity": 1})).await;
    assert_eq!(subscriber.recv().await["id"], dead["id"]);
    let nacked = subscriber
        .request(json!({"id": dead["id"], "ack": 0}))
        .await;
    assert_eq!(nacked["status"], "Success.", "{nacked}");
    subscriber.request(json!({"logout": true})).await;
    for n in 0..PUBLISHED {
        let reply = publisher
            .request(json!({ "body": format!("message {n}") }))
            .await;
        assert_eq!(reply["status"], "Success.", "{reply}");
    }
    // A stats history for the Monitoring tab's plots, sent the way the node sends its records
    // (nodes record at most every 300 s, too slow to wait for).
    let id = alpha_queue["id"].as_str().unwrap();
    report_history(&cp, id).await;
    let setup = json!({
        "base": format!("http://{}", cp.addr),
        "chromium": chromium,
        "alpha_account": alpha,
        "alpha_key": alpha_key,
        "reader_key": reader_key,
        "alpha_queue": alpha_queue["id"],
        "beta_queue": beta_queue["id"],
        "published": PUBLISHED,
        "dead": dead["id"],
        "node": node,
        "qe": qe_tests::qe_binary(),
        "publisher": alpha_queue["logins"]["publisher"],
        "operator_token": cp.token,
    });
    let driver = workspace().join("tests/console/drive.py");
    let mut command = tokio::process::Command::new(python());
    command.arg(&driver).env("QE_CONSOLE", setup.to_string());
    let run = tokio::time::timeout(std::time::Duration::from_secs(120), command.output());
    let output = run
        .await
        .expect("the browser test ends")
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "the browser test failed:\n{stdout}\n{stderr}\ncontrol plane log:\n{}",
        cp.log_text()
    );
    assert!(stdout.contains("ok no console errors"), "{stdout}");
    assert!(
        stdout.contains("ok the operator publishes a build"),
        "{stdout}"
    );
    drop(publisher);
}

/// A console token for queue `id` asked for with `key`: the reply's status and body.
async fn console_token(cp: &ControlPlane, key: &str, id: &str) -> (u16, Value) {
    let path = format!("/v1/queues/{id}/console-token");
    let (status, reply) = http(cp.addr, "POST", &path, Some(key), Some("{}")).await;
    (status, reply)
}

/// Logs in to `url` with console token `token`: the login's reply, and the client.
async fn console_login(url: &str, token: &str) -> (Value, qe_tests::Client) {
    let mut client = qe_tests::Client::connect_url(url).await;
    let login = json!({"console_token": token, "role": "admin", "queuetype": "distribute"});
    let reply = client.request(login).await;
    (reply, client)
}

/// Console tokens at the protocol level, no browser: a full key's token changes the queue; a
/// read-only key's reads but every change is refused (400); a tampered token, one used twice,
/// one expired and one for another queue fail as a wrong password (107); another account's
/// queue has no token (404).
#[tokio::test(flavor = "multi_thread")]
async fn console_tokens_are_queue_scoped_single_use_and_carry_rights() {
    let cp = ControlPlane::start_with(CONFIG);
    let (alpha, full) = account_with_key(&cp, "Alpha", "full").await;
    let reader = key_for(&cp, &alpha, "read-only").await;
    let (_, beta_key) = account_with_key(&cp, "Beta", "full").await;
    let (queue, other) = tokio::join!(queue_of(&cp, &full), queue_of(&cp, &full));
    let id = queue["id"].as_str().unwrap();
    let url = queue["url"].as_str().unwrap();

    // A full key: write rights; the admin session changes the queue.
    let (status, granted) = console_token(&cp, &full, id).await;
    assert_eq!(status, 200, "{granted}");
    assert_eq!(granted["rights"], "write");
    assert_eq!(granted["url"], queue["url"]);
    let token = granted["token"].as_str().unwrap();
    let (reply, mut admin) = console_login(url, token).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let added = admin.request(json!({"cmd": "addmsg", "body": "hi"})).await;
    assert_eq!(added["status"], "Success.", "{added}");
    let message = added["id"].as_str().unwrap().to_string();

    // The same token again: refused as a wrong password.
    let (reply, _) = console_login(url, token).await;
    assert_eq!(reply["code"], 107, "used twice: {reply}");

    // A read-only key: read rights; reads work, every change is refused with 400.
    let (status, granted) = console_token(&cp, &reader, id).await;
    assert_eq!(status, 200, "{granted}");
    assert_eq!(granted["rights"], "read");
    let (reply, mut viewer) = console_login(url, granted["token"].as_str().unwrap()).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let listed = viewer
        .request(json!({"cmd": "getmsgs", "after": "", "count": 10}))
        .await;
    assert!(
        listed["csv"].as_str().unwrap().contains(&message),
        "{listed}"
    );
    for change in [
        json!({"cmd": "delmsg", "id": message}),
        json!({"cmd": "movetodlq", "id": message}),
        json!({"cmd": "addmsg", "body": "x"}),
        json!({"cmd": "purge", "scope": "all"}),
        json!({"cmd": "redrive"}),
        json!({"cmd": "setcfg", "saved-session-timeout-secs": 60}),
    ] {
        let reply = viewer.request(change.clone()).await;
        assert_eq!(reply["code"], 400, "{change}: {reply}");
    }
    let shown = viewer
        .request(json!({"cmd": "getmsg", "id": message}))
        .await;
    assert_eq!(shown["status"], "Success.", "still there: {shown}");

    // A tampered token (its rights raised, the MAC kept): refused.
    let (_, granted) = console_token(&cp, &reader, id).await;
    let (body, mac) = granted["token"].as_str().unwrap().split_once('.').unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut claims: Value = serde_json::from_slice(&b64.decode(body).unwrap()).unwrap();
    claims["r"] = json!("write");
    let forged = format!("{}.{mac}", b64.encode(claims.to_string()));
    let (reply, _) = console_login(url, &forged).await;
    assert_eq!(reply["code"], 107, "tampered: {reply}");

    // Expired, and for another queue: signed with this node's key, still refused.
    let node_token = cp.node_config(id)["node_token"]
        .as_str()
        .unwrap()
        .to_string();
    let sign = |q: &str, exp: u64| {
        let claims = qe_shared::console_token::Claims {
            q: q.into(),
            r: qe_shared::console_token::Rights::Write,
            exp,
            jti: qe_shared::console_token::new_jti(),
        };
        qe_shared::console_token::sign(&node_token, &claims)
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (reply, _) = console_login(url, &sign(id, now - 60)).await;
    assert_eq!(reply["code"], 107, "expired: {reply}");
    let other_id = other["id"].as_str().unwrap();
    let (reply, _) = console_login(url, &sign(other_id, now + 60)).await;
    assert_eq!(reply["code"], 107, "another queue's: {reply}");
    let (reply, _) = console_login(url, &sign(id, now + 60)).await;
    assert_eq!(
        reply["status"], "Success.",
        "the same, for this queue: {reply}"
    );
    // Another queue's token does not open this one either.
    let (_, granted) = console_token(&cp, &full, other_id).await;
    let (reply, _) = console_login(url, granted["token"].as_str().unwrap()).await;
    assert_eq!(reply["code"], 107, "{reply}");

    // Another account's key: the queue is not found.
    let (status, reply) = console_token(&cp, &beta_key, id).await;
    assert_eq!(status, 404, "{reply}");
}
