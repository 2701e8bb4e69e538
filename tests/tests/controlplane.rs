//! The control plane's API with the real binaries: a queue is created, its node runs and
//! serves the returned logins, and it is deleted.

use controlplane::pebble::Pebble;
use qe_tests::{
    dig, http, http_response, http_text, https, process_naming, roots_from_pem, signal, Client,
    ControlPlane, Dig, PROMPT,
};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

async fn login(url: &str, login: &Value, role: &str, extra: Value) -> Client {
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

/// Creates a queue with `body` and waits until it runs; returns it (id, node, logins…).
async fn create_queue(cp: &ControlPlane, body: &str) -> Value {
    cp.create_queue(body).await
}

fn node_of(queue: &Value) -> &str {
    queue["node"].as_str().unwrap()
}

#[tokio::test]
async fn a_created_queue_runs_serves_its_logins_and_is_deleted() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":true}"#;
    let (status, created) = cp.call("POST", "/v1/queues", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    // The reply comes at once; the reconciler provisions the node.
    assert_eq!(created["status"], "provisioning", "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let mut queue = cp.wait_for_status(&id, "running").await;
    queue["logins"] = created["logins"].clone();
    assert_eq!(queue["host"], format!("{id}.q.test.thequeueexpert.com"));
    assert_eq!(
        queue["url"],
        format!("wss://{id}.q.test.thequeueexpert.com/")
    );
    assert_eq!(
        queue["config"],
        json!({"version": 1, "applied": 1, "pending": false})
    );
    let node = queue["node"].as_str().unwrap().to_string();
    let logins = &queue["logins"];
    assert!(
        logins["publisher"]["password"].as_str().unwrap().len() >= 22,
        "≥128 bits"
    );

    let mut subscriber = login(
        &node,
        &logins["subscriber"],
        "subscriber",
        json!({"capacity": 1}),
    )
    .await;
    let mut publisher = login(&node, &logins["publisher"], "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "through the control plane"}))
        .await;
    assert_eq!(reply["status"], "Success.");
    let delivered = subscriber.recv().await;
    assert_eq!(delivered["body"], "through the control plane");
    // The logins are the queue's own: another role's password does not pass.
    let mut wrong = Client::connect_url(&node).await;
    let mixed = json!({"username": logins["admin"]["username"], "password": logins["publisher"]["password"],
        "role": "admin", "queuetype": "distribute"});
    assert_eq!(wrong.request(mixed).await["code"], 107);

    let (status, list) = cp.call("GET", "/v1/queues", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["queues"][0]["id"], id.as_str());
    assert!(
        !list.to_string().contains("password"),
        "passwords are shown once"
    );
    let (status, shown) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!((status, shown["status"].clone()), (200, json!("running")));

    let (status, deleted) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert_eq!((status, deleted["status"].clone()), (200, json!("deleted")));
    let gone = tokio::time::timeout(PROMPT, tokio_tungstenite::connect_async(node))
        .await
        .unwrap();
    assert!(gone.is_err(), "the node is stopped");
    let (_, kept) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(kept["status"], "deleted", "the record stays, for billing");
}

#[tokio::test]
async fn plain_http_off_loopback_is_refused_and_the_state_is_private() {
    let cp = ControlPlane::start();
    let mode = std::fs::metadata(cp.dir.path().join("data"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the state holds the node secret");

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("controlplane.toml");
    let text = format!(
        "listen = \"[::]:0\"\ndata_dir = {:?}\ntoken = \"t\"\n",
        dir.path().join("data")
    );
    std::fs::write(&config, text).unwrap();
    let refused = std::process::Command::new(qe_tests::controlplane_binary())
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("plain HTTP"), "{said}");
    assert!(
        !dir.path().join("data").exists(),
        "refused before anything is made"
    );
}

#[tokio::test]
async fn flags_win_over_the_config_file() {
    let cp = ControlPlane::start_with_flags(&["--cluster", "flagged", "--domain", "example.net"]);
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let (_, queue) = cp.call("POST", "/v1/queues", Some(body)).await;
    let id = queue["id"].as_str().unwrap();
    assert_eq!(queue["host"], format!("{id}.q.flagged.example.net"));
}

#[tokio::test]
async fn bad_requests_get_json_errors() {
    let cp = ControlPlane::start();
    let (status, error) = http(cp.addr, "GET", "/v1/queues", None, None).await;
    assert_eq!(
        (status, error["error"]["code"].clone()),
        (401, json!("unauthorized"))
    );
    let (status, _) = http(cp.addr, "GET", "/v1/queues", Some("wrong"), None).await;
    assert_eq!(status, 401);
    for body in [
        r#"{"tier":"devtest""#,
        r#"{"tier":"gold","region":"r","instance_type":"i"}"#,
        r#"{"tier":"devtest","region":"r","instance_type":"i","colour":"red"}"#,
    ] {
        let (status, error) = cp.call("POST", "/v1/queues", Some(body)).await;
        assert_eq!(
            (status, error["error"]["code"].clone()),
            (400, json!("bad_request")),
            "{body}"
        );
    }
    let (status, error) = cp.call("GET", "/v1/queues/nosuchqueue", None).await;
    assert_eq!(
        (status, error["error"]["code"].clone()),
        (404, json!("not_found"))
    );
    let (status, _) = cp.call("DELETE", "/v1/queues/nosuchqueue", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_401_challenges_for_a_bearer_token_and_the_scheme_is_case_insensitive() {
    let cp = ControlPlane::start();
    let get = |authorization: &str| {
        format!("GET /v1/queues HTTP/1.1\r\nHost: cp\r\n{authorization}Connection: close\r\n\r\n")
    };
    let challenge = |response: &str| {
        let head = response
            .split("\r\n\r\n")
            .next()
            .unwrap()
            .to_ascii_lowercase();
        let line = head.lines().find(|l| l.starts_with("www-authenticate:"));
        line.map(|l| l["www-authenticate:".len()..].trim().to_string())
    };
    // RFC 6750 §3: a request without a token gets the scheme alone...
    let none = http_response(cp.addr, &get("")).await;
    assert!(none.starts_with("HTTP/1.1 401"), "{none}");
    assert_eq!(challenge(&none).as_deref(), Some("bearer"), "{none}");
    // ...one with a wrong token is told why.
    for wrong in ["Bearer wrong", "Basic dXNlcjpwYXNz", "Bearer"] {
        let response = http_response(cp.addr, &get(&format!("Authorization: {wrong}\r\n"))).await;
        assert!(response.starts_with("HTTP/1.1 401"), "{wrong}: {response}");
        let expected = match wrong {
            "Bearer wrong" => r#"bearer error="invalid_token""#,
            _ => "bearer",
        };
        assert_eq!(challenge(&response).as_deref(), Some(expected), "{wrong}");
    }
    // RFC 7235 §2.1: the scheme's name is case-insensitive; one or more spaces end it.
    let token = &cp.token;
    for scheme in ["Bearer ", "bearer ", "BEARER ", "bEaReR   "] {
        let authorization = format!("Authorization: {scheme}{token}\r\n");
        let response = http_response(cp.addr, &get(&authorization)).await;
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "{scheme:?}: {response}"
        );
    }
}

#[tokio::test]
async fn a_rotated_password_replaces_the_old_one_and_open_connections_go_on() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let old = queue["logins"]["publisher"].clone();
    let mut open = login(node, &old, "publisher", json!({})).await;

    let (status, new) = cp
        .call(
            "POST",
            &format!("/v1/queues/{id}/logins/publisher/rotate"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{new}");
    assert_eq!(new["username"], old["username"]);
    assert_ne!(new["password"], old["password"]);

    let mut refused = Client::connect_url(node).await;
    let with_old = json!({"username": old["username"], "password": old["password"],
        "role": "publisher", "queuetype": "distribute"});
    assert_eq!(
        refused.request(with_old).await["code"],
        107,
        "the old password no longer works"
    );
    login(node, &new, "publisher", json!({})).await;
    let reply = open.request(json!({"body": "still connected"})).await;
    assert_eq!(
        reply["status"], "Success.",
        "the open connection is not cut"
    );

    let (status, _) = cp
        .call(
            "POST",
            &format!("/v1/queues/{id}/logins/owner/rotate"),
            None,
        )
        .await;
    assert_eq!(status, 404);
    cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    let (status, error) = cp
        .call(
            "POST",
            &format!("/v1/queues/{id}/logins/admin/rotate"),
            None,
        )
        .await;
    assert_eq!(
        (status, error["error"]["code"].clone()),
        (409, json!("conflict"))
    );
}

#[tokio::test]
async fn concurrent_rotations_of_all_three_roles_each_leave_exactly_the_new_password() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let mut current = queue["logins"].clone();
    let roles = ["publisher", "subscriber", "admin"];
    for round in 0..12 {
        let rotations = roles.map(|role| {
            let path = format!("/v1/queues/{id}/logins/{role}/rotate");
            let (addr, token) = (cp.addr, cp.token.clone());
            tokio::spawn(async move { http(addr, "POST", &path, Some(&token), None).await })
        });
        for (role, rotation) in roles.iter().zip(rotations) {
            let (status, new) = rotation.await.unwrap();
            assert_eq!(
                (status, &new["applied"]),
                (200, &json!(true)),
                "round {round}: {new}"
            );
            let old = std::mem::replace(&mut current[*role], new.clone());
            // The reply came once the node served it: at once, the new one logs in and the
            // old one is refused.
            let mut refused = Client::connect_url(node).await;
            let with_old = json!({"username": old["username"], "password": old["password"],
                "role": role, "queuetype": "distribute", "capacity": 1});
            assert_eq!(
                refused.request(with_old).await["code"],
                107,
                "round {round} {role}"
            );
            let mut client = login(node, &new, role, json!({"capacity": 1})).await;
            client.request(json!({"logout": true})).await;
        }
    }
    let (_, shown) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(
        shown["config"],
        json!({"version": 37, "applied": 37, "pending": false})
    );
}

#[tokio::test]
async fn a_node_credential_is_rotated_over_the_channel_and_the_old_one_stops_working() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let old = cp.node_config(id)["node_token"]
        .as_str()
        .unwrap()
        .to_string();
    let config = format!("/v1/nodes/{id}/config");
    let (status, _) = http(cp.addr, "GET", &config, Some(&old), None).await;
    assert_eq!(status, 200);

    let path = format!("/v1/queues/{id}/node-credential/rotate");
    let (status, rotated) = cp.call("POST", &path, None).await;
    assert_eq!((status, rotated), (200, json!({"applied": true})));
    // The node took the new one, kept it readable by itself alone, and used it: the old one
    // is refused from now on.
    let kept = cp.node_dir(id).join("data/node-token");
    let mode = std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let new = std::fs::read_to_string(&kept).unwrap();
    assert_ne!(new, old);
    let (status, _) = http(cp.addr, "GET", &config, Some(&old), None).await;
    assert_eq!(status, 401, "the old credential is retired");
    let (status, _) = http(cp.addr, "GET", &config, Some(&new), None).await;
    assert_eq!(status, 200);

    // The node goes on over the channel with it: a rotated login is confirmed.
    let login_path = format!("/v1/queues/{id}/logins/admin/rotate");
    let (status, admin) = cp.call("POST", &login_path, None).await;
    assert_eq!(status, 200, "{admin}");
    login(node, &admin, "admin", json!({})).await;

    // Deleted, its credential works no more.
    let (status, _) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(status, 200);
    let (status, _) = http(cp.addr, "GET", &config, Some(&new), None).await;
    assert_eq!(status, 401, "a deleted queue's node credential");
}

#[tokio::test]
async fn a_rotation_the_node_cannot_confirm_is_answered_202_and_shown_pending() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    // The node stops answering (and its supervisor cannot know: the process is there).
    let pid = process_naming(&cp.node_bootstrap(id)).expect("the node runs");
    signal(pid, libc::SIGSTOP);
    let path = format!("/v1/queues/{id}/logins/admin/rotate");
    let (status, new) = cp.call("POST", &path, None).await;
    assert_eq!((status, &new["applied"]), (202, &json!(false)), "{new}");
    let (_, shown) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(
        shown["config"],
        json!({"version": 2, "applied": 1, "pending": true})
    );
    // Back, it takes the change; the old password is refused, the new one works.
    signal(pid, libc::SIGCONT);
    wait_until_applied(&cp, id).await;
    login(node, &new, "admin", json!({})).await;
}

#[tokio::test]
async fn a_node_that_dies_is_started_again_at_its_address_with_its_messages() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let logins = &queue["logins"];
    let mut publisher = login(node, &logins["publisher"], "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "outlives its node", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    let config = cp.node_dir(id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");
    signal(pid, libc::SIGKILL);
    cp.wait_for_log("a node was restarted", 1);

    assert_ne!(process_naming(&config), Some(pid), "a new process");
    let mut subscriber = login(
        node,
        &logins["subscriber"],
        "subscriber",
        json!({"capacity": 1}),
    )
    .await;
    let delivered = subscriber.recv().await;
    assert_eq!(delivered["body"], "outlives its node");
    let (_, listed) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(listed["node"], node, "the same address");
}

#[tokio::test]
async fn a_restarted_control_plane_adopts_the_running_nodes_and_starts_none_twice() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let logins = &queue["logins"];
    let mut subscriber = login(
        node,
        &logins["subscriber"],
        "subscriber",
        json!({"capacity": 1}),
    )
    .await;
    let config = cp.node_dir(id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");

    let cp = cp.restart();
    cp.wait_for_log("adopted a running node", 1);
    assert_eq!(process_naming(&config), Some(pid), "the same process");
    let (_, listed) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(
        (listed["status"].as_str(), listed["node"].as_str()),
        (Some("running"), Some(node))
    );

    // The connection made before the restart was never cut.
    let mut publisher = login(node, &logins["publisher"], "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "across the restart"}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    assert_eq!(subscriber.recv().await["body"], "across the restart");

    // The new control plane hears the adopted node: a rotation is confirmed.
    let path = format!("/v1/queues/{id}/logins/admin/rotate");
    let (status, new) = cp.call("POST", &path, None).await;
    assert_eq!(status, 200, "{new}");
    login(node, &new, "admin", json!({})).await;

    // And it supervises it: killed, it comes back.
    signal(pid, libc::SIGKILL);
    cp.wait_for_log("a node was restarted", 1);
    login(node, &new, "admin", json!({})).await;
}

#[tokio::test]
async fn health_metrics_and_the_openapi_document() {
    let cp = ControlPlane::start();
    let (status, health) = http(cp.addr, "GET", "/healthz", None, None).await;
    assert_eq!((status, health), (200, json!({"status": "ok"})));

    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let id = queue["id"].as_str().unwrap();
    cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    let (status, _) = http_text(cp.addr, "GET", "/metrics", None, None).await;
    assert_eq!(status, 401, "metrics need the operator's token");
    let token = Some(cp.token.as_str());
    let (status, metrics) = http_text(cp.addr, "GET", "/metrics", token, None).await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("qe_queues{status=\"running\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("qe_queues{status=\"deleted\"} 0\n"),
        "{metrics}"
    );
    let created =
        r#"qe_api_request_duration_seconds_count{method="POST",route="/v1/queues",status="201"} 1"#;
    assert!(metrics.contains(created), "{metrics}");
    // Two: the wait for `running`, and the plain read.
    let got = r#"qe_api_request_duration_seconds_count{method="GET",route="/v1/queues/{id}",status="200"} 2"#;
    assert!(metrics.contains(got), "by route, never by id: {metrics}");

    // The document is served without a token and describes every route the API has; each
    // documented operation reaches a handler (never the unknown-route reply).
    let (status, document) = http(cp.addr, "GET", "/openapi.json", None, None).await;
    assert_eq!((status, document["openapi"].as_str()), (200, Some("3.1.0")));
    let paths = document["paths"].as_object().unwrap();
    let served = [
        "/v1/queues",
        "/v1/queues/{id}",
        "/v1/queues/{id}/logins/{role}/rotate",
        "/v1/queues/{id}/node-credential/rotate",
        "/v1/usage",
        "/v1/stats",
        "/v1/bills",
        "/v1/nodes/{id}/reports",
        "/v1/nodes/{id}/config",
        "/v1/nodes/{id}/applied",
        "/v1/nodes/{id}/dataplane",
        "/v1/nodes/{id}/certificate",
        "/v1/certificate/renew",
        "/metrics",
        "/healthz",
        "/openapi.json",
    ];
    let documented: Vec<&str> = paths.keys().map(String::as_str).collect();
    assert_eq!(documented.len(), served.len(), "{documented:?}");
    for (path, operations) in paths {
        assert!(served.contains(&path.as_str()), "{path}");
        for method in operations.as_object().unwrap().keys() {
            if method == "parameters" {
                continue;
            }
            let concrete = path
                .replace("{id}", "nosuchqueue")
                .replace("{role}", "admin");
            let (_, reply) = cp.call(&method.to_uppercase(), &concrete, Some("{}")).await;
            assert_ne!(
                reply["error"]["message"], "no such route",
                "{method} {path}"
            );
        }
    }
    let (status, reply) = cp.call("GET", "/v1/nothing", None).await;
    assert_eq!(
        (status, reply["error"]["message"].as_str()),
        (404, Some("no such route"))
    );
}

/// `YYYY-MM-DD` of a time in seconds since 1970 (UTC).
fn date_of(secs: u64) -> String {
    let (year, month, day) = qe_shared::calendar::civil_from_days(secs / 86_400);
    format!("{year:04}-{month:02}-{day:02}")
}

/// `YYYY-MM-DD` today (UTC).
fn today() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    date_of(now.unwrap().as_secs())
}

const PRICES: &str = "[prices]\nnetwork_out_gb = 0.09\nnetwork_in_gb = 0.02\n\
                      instance_hour = { \"local/local\" = 0.5 }\n";

#[tokio::test]
async fn a_deleted_queue_reports_its_last_usage_and_the_bill_counts_the_bytes_moved() {
    let cp = ControlPlane::start_with(PRICES);
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let logins = &queue["logins"];
    let mut subscriber = login(
        node,
        &logins["subscriber"],
        "subscriber",
        json!({"capacity": 20}),
    )
    .await;
    let mut publisher = login(node, &logins["publisher"], "publisher", json!({})).await;
    let text = "x".repeat(50_000);
    for _ in 0..20 {
        let reply = publisher.request(json!({"body": text})).await;
        assert_eq!(reply["status"], "Success.", "{reply}");
    }
    for _ in 0..20 {
        assert_eq!(subscriber.recv().await["body"], text.as_str());
    }

    let (status, _) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(status, 200);
    // The node made its last record when it stopped, and reported it before it went.
    let today = today();
    let path = format!("/v1/usage?from={today}&to={today}&queue={id}");
    let (status, usage) = cp.call("GET", &path, None).await;
    assert_eq!(status, 200, "{usage}");
    let records = usage["usage"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{usage}");
    let record = &records[0];
    let (sent, received) = (
        record["network_sent"].as_u64().unwrap(),
        record["network_received"].as_u64().unwrap(),
    );
    assert!(
        received > 20 * 50_000,
        "the published bodies came in: {record}"
    );
    assert!(sent > 20 * 50_000, "the deliveries went out: {record}");
    assert_eq!(record["queue"], id);
    let (_, csv) = http_text(
        cp.addr,
        "GET",
        &format!("{path}&format=csv"),
        Some(&cp.token),
        None,
    )
    .await;
    let csv_lines: Vec<&str> = csv.lines().collect();
    assert_eq!(csv_lines.len(), 2, "{csv}");
    assert!(csv_lines[1].starts_with(&format!("{id},")), "{csv}");

    let month = &today[..7];
    let (status, bill) = cp
        .call("GET", &format!("/v1/bills?month={month}&queue={id}"), None)
        .await;
    assert_eq!(status, 200, "{bill}");
    let line = |item: &str| {
        bill["lines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|line| line["item"] == item)
            .unwrap_or_else(|| panic!("no {item} in {bill}"))
            .clone()
    };
    let out = line("network out");
    let gb = |bytes: u64| (bytes as f64 / 1e9 * 1e6).round() / 1e6;
    assert_eq!(out["quantity"].as_f64(), Some(gb(sent)), "{bill}");
    let priced = (gb(sent) * 0.09 * 1e6).round() / 1e6;
    assert_eq!(out["amount"].as_f64(), Some(priced), "{bill}");
    assert_eq!(line("network in")["quantity"].as_f64(), Some(gb(received)));
    assert_eq!(line("instance local in local")["unit_price"], 0.5);

    for bad in [
        "/v1/usage?from=2026-13-01&to=2026-12-01",
        "/v1/usage?from=2026-11-01",
        "/v1/usage?from=2026-11-01&to=2026-11-02&format=xml",
        "/v1/bills?month=November",
    ] {
        let (status, error) = cp.call("GET", bad, None).await;
        assert_eq!(
            (status, error["error"]["code"].as_str()),
            (400, Some("bad_request")),
            "{bad}"
        );
    }
    let (status, _) = cp
        .call("GET", "/v1/bills?month=2026-11&queue=nosuchqueue", None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn records_made_while_the_control_plane_is_down_arrive_after_it_returns_once_each() {
    let mut cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let (id, node) = (
        queue["id"].as_str().unwrap().to_string(),
        queue["node"].as_str().unwrap().to_string(),
    );
    let mut publisher = login(&node, &queue["logins"]["publisher"], "publisher", json!({})).await;
    let reply = publisher.request(json!({"body": "counted"})).await;
    assert_eq!(reply["status"], "Success.");

    // The control plane goes; the node stops meanwhile, making its last record, which it
    // cannot hand over. It stays in the node's history.
    cp.kill();
    let config = cp.node_dir(&id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");
    signal(pid, libc::SIGTERM);
    let deadline = std::time::Instant::now() + PROMPT;
    while process_naming(&config) == Some(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // Back, it starts the node again, which reports what it kept.
    let cp = cp.start_again();
    cp.wait_for_log("a node report was kept", 1);
    let path = format!("/v1/usage?from=1970-01-01&to=2999-12-31&queue={id}");
    let (_, usage) = cp.call("GET", &path, None).await;
    let records = usage["usage"].as_array().unwrap().clone();
    assert_eq!(records.len(), 1, "{usage}");
    assert!(records[0]["network_received"].as_u64().unwrap() > 0);

    // Sent again (a reply lost on the way), it is still one record.
    let table = cp.node_config(&id);
    let token = table["node_token"].as_str().unwrap();
    let (_, csv) = http_text(
        cp.addr,
        "GET",
        &format!("{path}&format=csv"),
        Some(&cp.token),
        None,
    )
    .await;
    assert_eq!(csv.lines().count(), 2, "{csv}");
    let (_, usage) = cp.call("GET", &path, None).await;
    let mut record = usage["usage"][0].clone();
    record.as_object_mut().unwrap().remove("queue");
    let report = json!({ "usage": [record] }).to_string();
    let reports = format!("/v1/nodes/{id}/reports");
    let (status, receipt) = http(cp.addr, "POST", &reports, Some(token), Some(&report)).await;
    assert_eq!(status, 200);
    assert_eq!(
        receipt,
        json!({"usage": {"new": 0, "already_kept": 1}, "stats": {"new": 0, "already_kept": 0}}),
        "the receipt says it was kept already"
    );
    let (_, usage) = cp.call("GET", &path, None).await;
    assert_eq!(usage["usage"].as_array().unwrap().len(), 1, "{usage}");

    // A node's token is its own queue's only; the operator's is not a node's.
    let (status, _) = http(
        cp.addr,
        "POST",
        "/v1/nodes/otherqueue/reports",
        Some(token),
        Some(&report),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = http(cp.addr, "POST", &reports, Some(&cp.token), Some(&report)).await;
    assert_eq!(status, 401);
    let bad = json!({"usage": [{"time": 1}]}).to_string();
    let (status, _) = http(cp.addr, "POST", &reports, Some(token), Some(&bad)).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn the_dns_answers_for_queues_aaaa_always_a_with_ipv4_and_nxdomain_after_delete() {
    let cp = ControlPlane::start_with("dns_listen = \"127.0.0.1:0\"\n");
    let dns = cp.dns.expect("a DNS server");
    let create = |ipv4: bool| {
        format!(r#"{{"tier":"devtest","region":"local","instance_type":"local","ipv4":{ipv4}}}"#)
    };
    let with_ipv4 = create_queue(&cp, &create(true)).await;
    let v6_only = create_queue(&cp, &create(false)).await;
    let host = |queue: &serde_json::Value| queue["host"].as_str().unwrap().to_string();
    let answer = |status: &str, answers: &[&str]| Dig {
        status: status.into(),
        authoritative: true,
        answers: answers.iter().map(|a| a.to_string()).collect(),
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
        soa.answers[0]
            .split_whitespace()
            .nth(2)
            .unwrap()
            .parse()
            .unwrap()
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
    let queue = create_queue(&cp, body).await;
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

/// Waits until queue `id`'s node serves its desired config (a change confirmed over the
/// channel); the API shows it, so this asks it again while a change is pending.
async fn wait_until_applied(cp: &ControlPlane, id: &str) {
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

#[tokio::test]
async fn the_opt_in_cluster_wildcard_is_fetched_whole_by_nodes_and_renewed_on_demand() {
    use rustls::pki_types::pem::PemObject;
    let cp = ControlPlane::start_with("local_ca = true\nwildcard_certificate = true\n");
    cp.wait_for_log("certificate issued", 1);
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
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
}

#[tokio::test]
async fn a_tls_node_started_while_its_control_plane_is_down_serves_the_config_and_certificate_it_kept(
) {
    let mut cp = ControlPlane::start_with("local_ca = true\n");
    let queue = create_queue(
        &cp,
        r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":true}"#,
    )
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

#[tokio::test]
async fn the_stats_nodes_report_are_served_by_day_as_json_and_csv() {
    let cp = ControlPlane::start();
    let queue = create_queue(
        &cp,
        r#"{"tier":"devtest","region":"local","instance_type":"local"}"#,
    )
    .await;
    let id = queue["id"].as_str().unwrap();
    let table = cp.node_config(id);
    let token = table["node_token"].as_str().unwrap();
    // 2026-11-09 00:05 and 2026-11-10 00:05 UTC, in the manual's getstats form.
    let stats = |time: u64, counters: [u64; 9]| {
        let mut record = json!({ "time": time });
        let names = [
            "messages",
            "publishers",
            "subscribers",
            "saved_subscribers",
            "administrators",
            "unacknowledged",
            "dead_letter",
            "delayed",
            "durable",
        ];
        for (name, count) in names.iter().zip(counters) {
            record[*name] = json!(count);
        }
        record
    };
    let report = json!({"stats": [
        stats(1794182700, [10, 0, 1, 0, 1, 3, 0, 1, 9]),
        stats(1794269100, [1, 2, 3, 4, 5, 6, 7, 8, 9]),
    ]});
    let path = format!("/v1/nodes/{id}/reports");
    let (status, _) = http(
        cp.addr,
        "POST",
        &path,
        Some(token),
        Some(&report.to_string()),
    )
    .await;
    assert_eq!(status, 200);

    let (status, stats) = cp
        .call("GET", "/v1/stats?from=2026-11-09&to=2026-11-09", None)
        .await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(
        stats["stats"],
        json!([{"queue": id, "time": 1794182700u64, "messages": 10, "publishers": 0,
            "subscribers": 1, "saved_subscribers": 0, "administrators": 1,
            "unacknowledged": 3, "dead_letter": 0, "delayed": 1, "durable": 9}])
    );
    let both = format!("/v1/stats?from=2026-11-09&to=2026-11-10&queue={id}&format=csv");
    let (status, csv) = http_text(cp.addr, "GET", &both, Some(&cp.token), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        csv,
        format!(
            "queue,time,messages,publishers,subscribers,saved_subscribers,administrators,\
             unacknowledged,dead_letter,delayed,durable\r\n\
             {id},1794182700,10,0,1,0,1,3,0,1,9\r\n{id},1794269100,1,2,3,4,5,6,7,8,9\r\n"
        )
    );
    let (status, _) = cp
        .call("GET", "/v1/stats?from=2026-11-09&to=nope", None)
        .await;
    assert_eq!(status, 400);
    let (status, _) = cp
        .call(
            "GET",
            "/v1/stats?from=2026-11-09&to=2026-11-09&queue=none",
            None,
        )
        .await;
    assert_eq!(status, 404);
    let bad = json!({"stats": [{"time": 1794182700u64, "messages": 1}]}).to_string();
    let (status, _) = http(cp.addr, "POST", &path, Some(token), Some(&bad)).await;
    assert_eq!(status, 400, "a stats line has a time and nine counters");
}

#[tokio::test]
async fn over_https_the_api_serves_operators_and_nodes_and_plain_http_gets_nothing() {
    let ca = qe_tests::test_ca("control plane CA for tests");
    let key = rcgen::KeyPair::generate().unwrap();
    let names = vec!["127.0.0.1".to_string()];
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let files = tempfile::tempdir().unwrap();
    let path = |name: &str| files.path().join(name);
    std::fs::write(path("api.pem"), leaf.pem()).unwrap();
    std::fs::write(path("api-key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    let cp = ControlPlane::start_with(&format!(
        "[api_tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n",
        path("api.pem"),
        path("api-key.pem"),
        path("ca.pem")
    ));
    let roots = || roots_from_pem(&ca.pem());
    let token = Some(cp.token.as_str());

    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let (status, queue) = https(cp.addr, roots(), "POST", "/v1/queues", token, Some(body)).await;
    assert_eq!(status, 201, "{queue}");
    let id = queue["id"].as_str().unwrap();
    // Running: the node pulled its config over HTTPS, trusting the configured root.
    let until = format!("/v1/queues/{id}?until=running&within=60");
    let (status, running) = https(cp.addr, roots(), "GET", &until, token, None).await;
    assert_eq!(
        (status, running["status"].as_str()),
        (200, Some("running")),
        "{running}"
    );
    let table = cp.node_config(id);
    assert_eq!(
        table["control_plane"].as_str(),
        Some(format!("https://{}", cp.addr).as_str())
    );
    let (status, _) = https(cp.addr, roots(), "GET", "/v1/queues", None, None).await;
    assert_eq!(status, 401, "the token is still needed");

    // The node reports over HTTPS, trusting the configured root: its last record arrives
    // before the delete's reply.
    let delete = format!("/v1/queues/{id}");
    let (status, _) = https(cp.addr, roots(), "DELETE", &delete, token, None).await;
    assert_eq!(status, 200);
    let today = today();
    let usage = format!("/v1/usage?from={today}&to={today}&queue={id}");
    let (status, usage) = https(cp.addr, roots(), "GET", &usage, token, None).await;
    assert_eq!(status, 200);
    assert_eq!(usage["usage"].as_array().unwrap().len(), 1, "{usage}");

    // A renewed certificate in the same files: SIGHUP, and new connections get it.
    let renewed_key = rcgen::KeyPair::generate().unwrap();
    let renewed = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&renewed_key, &ca)
        .unwrap();
    std::fs::write(path("api.pem"), renewed.pem()).unwrap();
    std::fs::write(path("api-key.pem"), renewed_key.serialize_pem()).unwrap();
    signal(cp.pid(), libc::SIGHUP);
    cp.wait_for_log("TLS certificate loaded", 1);
    let connector = tokio_rustls::TlsConnector::from(qe_tls::client_config(roots()));
    let tcp = tokio::net::TcpStream::connect(cp.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(cp.addr.ip().into());
    let tls = connector.connect(name, tcp).await.unwrap();
    let served = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    assert_eq!(served, renewed.der().to_vec());
    let (status, _) = https(cp.addr, roots(), "GET", "/v1/queues", token, None).await;
    assert_eq!(status, 200);

    assert!(
        !qe_tests::answers_plain_http(cp.addr).await,
        "plain HTTP on the same port gets no HTTP reply"
    );
}

#[tokio::test]
async fn a_control_plane_back_at_another_address_restarts_its_nodes_to_report_there() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = create_queue(&cp, body).await;
    let id = queue["id"].as_str().unwrap().to_string();
    let config = cp.node_dir(&id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");
    let old = cp.addr;
    let cp = cp.restart_elsewhere();
    assert_ne!(cp.addr, old);
    // A node reads its bootstrap once: it is started again from the new one.
    cp.wait_for_log("restarting a node for the control plane's new address", 1);
    cp.wait_for_log("started a node", 1);
    let restarted = process_naming(&config).expect("the node runs");
    assert_ne!(restarted, pid, "started again for the new address");
    let bootstrap = cp.node_config(&id);
    assert_eq!(
        bootstrap["control_plane"].as_str(),
        Some(format!("http://{}", cp.addr).as_str())
    );

    // Deleting the queue stops the node. Its records reach this address: the one made when
    // it stopped for the restart (the old address was gone; it kept it and reported it from
    // its next run) and the last one (one record if both fall in the same second).
    let (status, _) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(status, 200);
    let today = today();
    let path = format!("/v1/usage?from={today}&to={today}&queue={id}");
    let (_, usage) = cp.call("GET", &path, None).await;
    assert!(!usage["usage"].as_array().unwrap().is_empty(), "{usage}");
    let log = std::fs::read_to_string(cp.node_dir(&id).join("node.log")).unwrap();
    assert!(log.contains("the last usage record was reported"), "{log}");
}
