//! The control plane's API with the real binaries: a queue is created, its node runs and
//! serves the returned logins, and it is deleted.

use qe_tests::{http, http_text, process_naming, signal, Client, ControlPlane, PROMPT};
use serde_json::{json, Value};

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

#[tokio::test]
async fn a_created_queue_runs_serves_its_logins_and_is_deleted() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":true}"#;
    let (status, queue) = cp.call("POST", "/v1/queues", Some(body)).await;
    assert_eq!(status, 201, "{queue}");
    let id = queue["id"].as_str().unwrap().to_string();
    assert_eq!(queue["host"], format!("{id}.q.test.thequeueexpert.com"));
    assert_eq!(
        queue["url"],
        format!("wss://{id}.q.test.thequeueexpert.com/")
    );
    assert_eq!(queue["status"], "running");
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
async fn a_rotated_password_replaces_the_old_one_and_open_connections_go_on() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let (_, queue) = cp.call("POST", "/v1/queues", Some(body)).await;
    let (id, node) = (
        queue["id"].as_str().unwrap(),
        queue["node"].as_str().unwrap(),
    );
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
async fn a_node_that_dies_is_started_again_at_its_address_with_its_messages() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let (_, queue) = cp.call("POST", "/v1/queues", Some(body)).await;
    let (id, node) = (
        queue["id"].as_str().unwrap(),
        queue["node"].as_str().unwrap(),
    );
    let logins = &queue["logins"];
    let mut publisher = login(node, &logins["publisher"], "publisher", json!({})).await;
    let reply = publisher
        .request(json!({"body": "outlives its node", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    let config = cp.dir.path().join("data/nodes").join(id).join("node.toml");
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
    let (_, queue) = cp.call("POST", "/v1/queues", Some(body)).await;
    let (id, node) = (
        queue["id"].as_str().unwrap(),
        queue["node"].as_str().unwrap(),
    );
    let logins = &queue["logins"];
    let mut subscriber = login(
        node,
        &logins["subscriber"],
        "subscriber",
        json!({"capacity": 1}),
    )
    .await;
    let config = cp.dir.path().join("data/nodes").join(id).join("node.toml");
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
    let (_, queue) = cp.call("POST", "/v1/queues", Some(body)).await;
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
    let got = r#"qe_api_request_duration_seconds_count{method="GET",route="/v1/queues/{id}",status="200"} 1"#;
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
