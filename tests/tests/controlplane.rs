//! The control plane's API with the real binaries: a queue is created, its node runs and
//! serves the returned logins, and it is deleted; logins and node credentials rotate; nodes
//! are restarted and adopted; the API's metrics and document, and HTTPS. Usage and bills are
//! in controlplane_usage.rs, DNS and certificates in controlplane_certificates.rs.

use qe_tests::gate::Gate;
use qe_tests::{
    http, http_response, http_text, https, login_with, node_of, process_naming, roots_from_pem,
    signal, today, wait_until_applied, Client, ControlPlane, PROMPT,
};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;

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
    // Until it runs, the address it will have; then where its node serves.
    assert_eq!(
        created["url"],
        format!("wss://{id}.q.test.thequeueexpert.com/")
    );
    assert_eq!(queue["url"], queue["node"]);
    assert_eq!(
        queue["config"],
        json!({"version": 1, "applied": 1, "pending": false})
    );
    // Its node said which build it runs: this workspace's dataplane.
    use sha2::Digest;
    let binary = std::fs::read(qe_tests::dataplane_binary()).unwrap();
    let sha256 = qe_shared::hex(&sha2::Sha256::digest(&binary));
    assert_eq!(
        queue["node_build"],
        json!({"version": env!("CARGO_PKG_VERSION"), "binary_sha256": sha256})
    );
    let node = queue["node"].as_str().unwrap().to_string();
    let logins = &queue["logins"];
    assert!(
        logins["publisher"]["password"].as_str().unwrap().len() >= 22,
        "≥128 bits"
    );

    let mut subscriber = login_with(
        &node,
        &logins["subscriber"],
        "subscriber",
        json!({"capacity": 1}),
    )
    .await;
    let mut publisher = login_with(&node, &logins["publisher"], "publisher", json!({})).await;
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
    let queue = cp.create_queue(body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let old = queue["logins"]["publisher"].clone();
    let mut open = login_with(node, &old, "publisher", json!({})).await;

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
    login_with(node, &new, "publisher", json!({})).await;
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
    let queue = cp.create_queue(body).await;
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
            let mut client = login_with(node, &new, role, json!({"capacity": 1})).await;
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
    let queue = cp.create_queue(body).await;
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
    login_with(node, &admin, "admin", json!({})).await;

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
    let queue = cp.create_queue(body).await;
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
    login_with(node, &new, "admin", json!({})).await;
}

#[tokio::test]
async fn a_node_that_dies_is_started_again_at_its_address_with_its_messages() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let logins = &queue["logins"];
    let mut publisher = login_with(node, &logins["publisher"], "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "outlives its node", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    let config = cp.node_dir(id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");
    signal(pid, libc::SIGKILL);
    cp.wait_for_log("a node was restarted", 1);

    assert_ne!(process_naming(&config), Some(pid), "a new process");
    let mut subscriber = login_with(
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
    let queue = cp.create_queue(body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let logins = &queue["logins"];
    let mut subscriber = login_with(
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
    let mut publisher = login_with(node, &logins["publisher"], "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "across the restart"}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    assert_eq!(subscriber.recv().await["body"], "across the restart");

    // The new control plane hears the adopted node: a rotation is confirmed.
    let path = format!("/v1/queues/{id}/logins/admin/rotate");
    let (status, new) = cp.call("POST", &path, None).await;
    assert_eq!(status, 200, "{new}");
    login_with(node, &new, "admin", json!({})).await;

    // And it supervises it: killed, it comes back.
    signal(pid, libc::SIGKILL);
    cp.wait_for_log("a node was restarted", 1);
    login_with(node, &new, "admin", json!({})).await;
}

/// Issue 28: a control plane started with a new node binary restarts the nodes it adopts
/// that run another one, and says why in its log and its audit; one of the same binary is
/// adopted as it runs.
#[tokio::test]
async fn an_adopted_node_of_another_binary_is_restarted_and_says_why() {
    let bin = tempfile::tempdir().unwrap();
    let dataplane = bin.path().join("dataplane");
    std::fs::copy(qe_tests::dataplane_binary(), &dataplane).unwrap();
    let cp = ControlPlane::start_with(&format!("dataplane = {dataplane:?}\n"));
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let config = cp.node_dir(id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");

    // A new binary is installed as `install` does: a new file renamed over the old one.
    let upgraded = bin.path().join("dataplane.new");
    std::fs::copy(qe_tests::dataplane_binary(), &upgraded).unwrap();
    std::fs::rename(&upgraded, &dataplane).unwrap();
    let cp = cp.restart();
    cp.wait_for_log("its binary is not the configured one", 1);
    cp.wait_for_log("its node was restarted", 1);
    let restarted = process_naming(&config).expect("the node runs");
    assert_ne!(restarted, pid, "started again from the new binary");
    let exe = std::fs::read_link(format!("/proc/{restarted}/exe")).unwrap();
    assert_eq!(exe, dataplane);
    let restarts = cp.audited("node.restart").await;
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(
        restarts[0]["reason"],
        "its binary is not the configured one"
    );
    let publisher = &queue["logins"]["publisher"];
    let mut publisher = login_with(node, publisher, "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "on the new binary"}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    // Started again on the same binary, it adopts the node as it runs.
    let cp = cp.restart();
    cp.wait_for_log("adopted a running node", 1);
    assert_eq!(process_naming(&config), Some(restarted), "the same process");
    assert_eq!(cp.audited("node.restart").await.len(), 1);
}

/// Issue 29: the operator's `[[allow]]` rules decide which instance types a new queue may
/// ask for; anything else is 400, naming what is allowed.
#[tokio::test]
async fn instance_types_are_allowed_by_the_operators_rules() {
    let rules = "[[allow]]\ntier = \"standard\"\ninstance_types = [\"local\"]\n\
                 [[allow]]\ntier = \"devtest\"\ninstance_types = [\"t4g.micro\"]\n";
    let cp = ControlPlane::start_with(rules);
    let (status, _) = cp
        .call(
            "POST",
            "/v1/queues",
            Some(r#"{"tier":"standard","region":"local","instance_type":"local"}"#),
        )
        .await;
    assert_eq!(status, 201);
    let devtest = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let (status, error) = cp.call("POST", "/v1/queues", Some(devtest)).await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(
        error["error"]["message"],
        "instance type \"local\" in region \"local\" is not allowed for a devtest queue; \
         allowed: t4g.micro"
    );
}

/// Issue 29: a new queue whose node never runs fails once `provision_within_secs` is up,
/// with the reason in its record, the log and the audit; deleted, it goes at once (its node
/// never ran, so there is no last record to wait for).
#[tokio::test]
async fn a_queue_not_running_in_time_fails_and_says_why() {
    let cp = ControlPlane::start_with(
        "dataplane = \"/bin/false\"\nprovision_within_secs = 2\nreconcile_every_secs = 1\n",
    );
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let (status, created) = cp.call("POST", "/v1/queues", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let failed = cp.wait_for_status(id, "failed").await;
    assert_eq!(
        failed["failure"]["reason"], "not running within 2 s",
        "{failed}"
    );
    assert!(failed["node"].is_null(), "{failed}");
    // Logged once recorded and audited (the audit comes after the status the wait above saw).
    cp.wait_for_log("the queue failed", 1);
    let audited = cp.audited("queue.fail").await;
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(audited[0]["reason"], "not running within 2 s");
    let token = Some(cp.token.as_str());
    let (_, metrics) = http_text(cp.addr, "GET", "/metrics", token, None).await;
    assert!(
        metrics.contains("qe_queues{status=\"failed\"} 1"),
        "{metrics}"
    );
    let (status, deleted) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(
        (status, deleted["status"].as_str()),
        (200, Some("deleted")),
        "{deleted}"
    );
}

#[tokio::test]
async fn health_metrics_and_the_openapi_document() {
    let cp = ControlPlane::start_with("metrics_token = \"read-the-metrics-only\"\n");
    let (status, health) = http(cp.addr, "GET", "/healthz", None, None).await;
    assert_eq!((status, health), (200, json!({"status": "ok"})));

    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap();
    cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    let (status, _) = http_text(cp.addr, "GET", "/metrics", None, None).await;
    assert_eq!(status, 401, "metrics need the operator's token");
    // Or the scraper's, which reads the metrics and nothing else.
    let scraper = Some("read-the-metrics-only");
    let (status, scraped) = http_text(cp.addr, "GET", "/metrics", scraper, None).await;
    assert_eq!(status, 200, "{scraped}");
    assert!(scraped.contains("qe_reconcile_errors_total"), "{scraped}");
    let (status, _) = http_text(cp.addr, "GET", "/v1/queues", scraper, None).await;
    assert_eq!(status, 401);
    let (status, _) = http_text(cp.addr, "GET", "/v1/backup", scraper, None).await;
    assert_eq!(status, 401);
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
        "/v1/invoices",
        "/v1/queues/{id}/console-token",
        "/v1/queues/{id}/sqs-keys",
        "/v1/queues/{id}/sqs-keys/{key}",
        "/v1/accounts/{id}/sqs-keys",
        "/v1/accounts/{id}/sqs-keys/{key}",
        "/",
        "/v1/audit",
        "/v1/accounts",
        "/v1/accounts/{id}",
        "/v1/account",
        "/v1/accounts/{id}/keys",
        "/v1/accounts/{id}/keys/{key}",
        "/v1/nodes/{id}/reports",
        "/v1/nodes/{id}/config",
        "/v1/nodes/{id}/applied",
        "/v1/nodes/{id}/stray",
        "/v1/nodes/{id}/bootstrap",
        "/v1/nodes/{id}/dataplane",
        "/v1/nodes/{id}/certificate",
        "/v1/certificate/renew",
        "/v1/backup",
        "/v1/strays",
        "/v1/strays/{id}/adopt",
        "/v1/builds",
        "/v1/rollouts",
        "/v1/rollouts/{id}",
        "/v1/rollouts/{id}/{action}",
        "/v1/nodes/{id}/builds/{sha256}",
        "/metrics",
        "/healthz",
        "/openapi.json",
        "/console/session",
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
                .replace("{role}", "admin")
                .replace("{key}", "nosuchkey")
                .replace("{action}", "halt")
                .replace("{sha256}", &"0".repeat(64));
            let (_, reply) = cp.call(&method.to_uppercase(), &concrete, Some("{}")).await;
            assert_ne!(
                reply["error"]["message"], "no such route",
                "{method} {path}"
            );
        }
    }
    // A store never restored has no strays: a node's report of one is refused.
    let (status, _) = cp
        .call("POST", "/v1/nodes/nosuchqueue/stray", Some("{}"))
        .await;
    assert_eq!(status, 401);
    let (status, reply) = cp.call("GET", "/v1/nothing", None).await;
    assert_eq!(
        (status, reply["error"]["message"].as_str()),
        (404, Some("no such route"))
    );
}

/// `YYYY-MM-DD` of a time in seconds since 1970 (UTC).
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
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap().to_string();
    let config = cp.node_dir(&id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");
    let old = cp.addr;
    let cp = cp.restart_elsewhere();
    assert_ne!(cp.addr, old);
    // A node reads its bootstrap once: it is started again from the new one.
    cp.wait_for_log("the control plane's replicas or root changed", 1);
    cp.wait_for_log("started a node", 1);
    let restarted = process_naming(&config).expect("the node runs");
    assert_ne!(restarted, pid, "started again for the new address");
    let bootstrap = cp.node_config(&id);
    assert_eq!(
        bootstrap["control_plane"].as_str(),
        Some(format!("http://{}", cp.addr).as_str())
    );
    // A restart the control plane made on its own says why, in the log and the audit.
    cp.wait_for_log("its node was restarted", 1);
    let restarts = cp.audited("node.restart").await;
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(restarts[0]["target"], id.as_str());
    assert_eq!(restarts[0]["actor"], json!({"kind": "control-plane"}));
    assert_eq!(
        restarts[0]["reason"],
        "the control plane's replicas or root changed"
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

/// The zone's SOA serial never goes back, across a kill -9 and a restart. With one control
/// plane the serial is the clock's seconds, or one more than the last when that is not ahead:
/// a burst of changes puts it ahead of the clock, and a restart that began from the clock
/// again served a lower serial (a secondary holding the higher one then ignores every change
/// until the clock catches up). With etcd it is the store's revision (and its base).
#[tokio::test]
async fn the_zone_serial_never_goes_back_across_a_restart() {
    let cp = ControlPlane::start_with("dns_listen = \"127.0.0.1:0\"\n");
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":true}"#;
    // A burst of zone changes: queues created and deleted one after another.
    for _ in 0..8 {
        let (status, created) = cp.call("POST", "/v1/queues", Some(body)).await;
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap();
        cp.wait_for_status(id, "running").await;
        let (status, deleting) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
        assert_eq!(status, 200, "{deleting}");
        cp.wait_for_status(id, "deleted").await;
    }
    let before = zone_serial(cp.dns.unwrap());
    let cp = cp.restart();
    let after = zone_serial(cp.dns.unwrap());
    eprintln!("zone serial {before} before the kill, {after} after the restart");
    assert!(
        after >= before,
        "the serial went back from {before} to {after}"
    );
}

/// The SOA serial of the control plane's zone (`cluster = "test"`, the default domain).
fn zone_serial(dns: std::net::SocketAddr) -> u32 {
    let soa = qe_tests::dig(dns, "q.test.thequeueexpert.com", "SOA", false);
    soa.soa_serial()
        .unwrap_or_else(|| panic!("no SOA: {soa:?}"))
}

/// A node that runs but is not heard from (here SIGSTOPped: a hung process) is fenced and
/// replaced on its data once it has been silent for `replace_silent_after_intervals` live
/// reports; one that reports is never replaced. The replacement is logged, audited and
/// counted. Before issue 28 a silent node stayed `running` for good, and so did its outage.
#[tokio::test]
async fn a_silent_node_is_replaced_and_serves_its_durable_messages() {
    let cp = ControlPlane::start_with(
        "live_stats_secs = 1\nreplace_silent_after_intervals = 3\nreconcile_every_secs = 1\n",
    );
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let logins = &queue["logins"];
    let mut publisher = login_with(node, &logins["publisher"], "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "outlives the silence", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    // Heard for longer than the limit (3 s) with the reconciler looking every second: left be.
    cp.wait_for_live_reports(6).await;
    assert!(!cp.log_text().contains("replacing it"), "{}", cp.log_text());

    let bootstrap = cp.node_bootstrap(id);
    let pid = process_naming(&bootstrap).expect("the node runs");
    signal(pid, libc::SIGSTOP);
    cp.wait_for_log("a silent node was replaced", 1);
    let replacement = process_naming(&bootstrap).expect("a node runs");
    assert_ne!(replacement, pid, "a new process; the silent one is gone");

    let mut subscriber = login_with(
        node,
        &logins["subscriber"],
        "subscriber",
        json!({"capacity": 1}),
    )
    .await;
    assert_eq!(subscriber.recv().await["body"], "outlives the silence");
    let (_, listed) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(listed["status"], "running", "{listed}");
    assert_eq!(listed["resources"]["process"], replacement.to_string());

    let replaced = cp.audited("node.replace").await;
    assert_eq!(replaced.len(), 1, "{replaced:?}");
    assert_eq!(replaced[0]["target"], id);
    assert_eq!(replaced[0]["actor"], json!({"kind": "control-plane"}));
    let reason = replaced[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("not heard from for more than"),
        "{reason}"
    );
    let token = Some(cp.token.as_str());
    let (_, metrics) = http_text(cp.addr, "GET", "/metrics", token, None).await;
    assert!(
        metrics.contains("\nqe_nodes_replaced_total 1\n"),
        "{metrics}"
    );
}

/// A queue deleted while its node cannot reach the control plane (here a gate in front of the
/// control plane, shut for the nodes only): the node cannot make its last report as it stops,
/// so its records wait in its data, which is kept. They are handed over from there once the
/// control plane can be reached again; only then is the data removed and the queue deleted,
/// its last usage record kept. (The data was removed 120 s later without it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_while_its_node_cannot_report_keeps_its_data_until_its_records_are_in() {
    let mut gate = Gate::open_new().await;
    let cp = ControlPlane::start_with(&format!("node_url = \"http://{}\"\n", gate.addr));
    gate.forward_to(cp.addr);
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap().to_string();
    let mut publisher = login_with(
        node_of(&queue),
        &queue["logins"]["publisher"],
        "publisher",
        json!({}),
    )
    .await;
    let reply = publisher.request(json!({"body": "billed"})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    gate.shut();
    let deleting = {
        let (addr, token, path) = (cp.addr, cp.token.clone(), format!("/v1/queues/{id}"));
        tokio::spawn(async move { http(addr, "DELETE", &path, Some(&token), None).await })
    };
    cp.wait_for_log("handing its records over from its data", 1);
    let node_log = std::fs::read_to_string(cp.node_dir(&id).join("node.log")).unwrap();
    assert!(
        node_log.contains("the last usage record could not be reported now"),
        "{node_log}"
    );
    assert!(cp.node_dir(&id).join("data").exists(), "the data is kept");
    let (_, now) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(now["status"], "deleting", "{now}");

    gate.reopen().await;
    let deleted = cp.wait_for_status(&id, "deleted").await;
    assert!(deleted["resources"].as_object().unwrap().is_empty());
    assert!(!cp.node_dir(&id).join("data").exists(), "then removed");
    let node_log = std::fs::read_to_string(cp.node_dir(&id).join("node.log")).unwrap();
    assert!(
        node_log.contains("the last usage record was reported"),
        "{node_log}"
    );
    let (_, usage) = cp.call("GET", &qe_tests::all_usage_of(&id), None).await;
    assert!(
        !usage["usage"].as_array().unwrap().is_empty(),
        "the last usage record is kept: {usage}"
    );
    let _ = deleting.await;
    assert!(!cp.log_text().contains("deleting its data without it"));
}

/// The data of a deleted queue whose records cannot be handed over is kept for at most
/// `delete_keeps_data_secs`, then removed without them (and the log says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_queue_s_data_is_kept_for_its_records_at_most_delete_keeps_data_secs() {
    let mut gate = Gate::open_new().await;
    let cp = ControlPlane::start_with(&format!(
        "node_url = \"http://{}\"\ndelete_keeps_data_secs = 8\n",
        gate.addr
    ));
    gate.forward_to(cp.addr);
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap().to_string();
    gate.shut();
    let (status, _) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert!(status == 200 || status == 202, "{status}");
    cp.wait_for_status(&id, "deleted").await;
    cp.wait_for_log(
        "its node's last report never came: deleting its data without it",
        1,
    );
    assert!(!cp.node_dir(&id).join("data").exists());
}

/// A node's port is chosen once and kept, and nothing holds it while the node is down: another
/// process may take it meanwhile (another control plane's node on this machine, as tests run
/// beside each other). The next start, which could not listen, gives the node a new port, and
/// the queue serves there with its messages.
#[tokio::test]
async fn a_node_whose_port_another_process_took_starts_on_a_new_one() {
    let mut cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap().to_string();
    let logins = &queue["logins"];
    let node = node_of(&queue).to_string();
    let mut publisher = login_with(&node, &logins["publisher"], "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "kept", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    drop(publisher);
    let config = cp.node_dir(&id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");
    cp.kill();
    signal(pid, libc::SIGKILL);
    // Taken as soon as the dying node lets it go (its files close after its command line
    // empties, so the bind is what says so).
    let port: u16 = node
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let deadline = std::time::Instant::now() + PROMPT;
    let _taken = loop {
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(listener) => break listener,
            Err(error) => assert!(std::time::Instant::now() < deadline, "{error}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };

    let cp = cp.start_again();
    cp.wait_for_log("another process has taken the node's port", 1);
    let deadline = std::time::Instant::now() + PROMPT;
    let moved = loop {
        let (_, now) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
        let now_at = now["node"].as_str().unwrap_or_default().to_string();
        if now["status"] == "running" && !now_at.is_empty() && now_at != node {
            break now_at;
        }
        assert!(std::time::Instant::now() < deadline, "not moved: {now}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let capacity = json!({"capacity": 1});
    let mut subscriber = login_with(&moved, &logins["subscriber"], "subscriber", capacity).await;
    assert_eq!(subscriber.recv().await["body"], "kept");
}
