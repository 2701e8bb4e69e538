//! The SQS face (docs/sqs.md) with real AWS clients against the real node: boto3 for every
//! action and the AWS CLI for a round trip (tests/interop/sqs_boto3.py), both faces of one
//! queue, and a kill -9 with messages in flight. Amazon's Rust SDK has tests/sqs_rust_sdk.rs,
//! and a round trip over HTTPS here.

use qe_tests::sqs::{aws_sdk_sqs, client, delete, receive, send, SqsEndpoint};
use qe_tests::{python, workspace, ControlPlane, Node, ADMIN, PUBLISHER, SUBSCRIBER};
use serde_json::{json, Value};

/// The three roles' SQS keys the node is started with.
const KEYS: [(&str, &str, &str); 3] = [
    ("publisher", "AKIAQEPUBLISHER", "publisher-secret/+x"),
    ("subscriber", "AKIAQESUBSCRIBER", "subscriber-secret"),
    ("admin", "AKIAQEADMIN", "admin-secret"),
];

fn sqs_flags() -> Vec<String> {
    let mut flags = vec!["--sqs-listen".to_string(), "127.0.0.1:0".to_string()];
    for (role, id, secret) in KEYS {
        flags.push("--sqs-key".into());
        flags.push(format!("{role}:{id}:{secret}"));
    }
    flags
}

fn start(node: Option<Node>) -> Node {
    start_with(node, &[])
}

fn start_with(node: Option<Node>, extra: &[&str]) -> Node {
    let mut flags = sqs_flags();
    flags.extend(extra.iter().map(|flag| flag.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    match node {
        None => Node::start_with(&flags),
        Some(node) => node.restart(&flags),
    }
}

/// What the script needs: the SQS endpoint (from the node's log; by name over TLS, which
/// the test certificate is for), the keys, the WebSocket URL and logins.
fn setup(node: &Node, tls: bool) -> Value {
    let log = node.wait_for_log("sqs: serving on ");
    let addr = log
        .split("sqs: serving on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the SQS address in the log")
        .trim_matches('"');
    let keys: serde_json::Map<String, Value> = KEYS
        .iter()
        .map(|(role, id, secret)| (role.to_string(), json!([id, secret])))
        .collect();
    let port = addr.rsplit(':').next().unwrap();
    let endpoint = match tls {
        true => format!("https://localhost:{port}"),
        false => format!("http://{addr}"),
    };
    json!({
        "endpoint": endpoint,
        "keys": keys,
        "ws": node.url(),
        "logins": {
            "publisher": [PUBLISHER.0, PUBLISHER.1],
            "subscriber": [SUBSCRIBER.0, SUBSCRIBER.1],
            "admin": [ADMIN.0, ADMIN.1],
        },
    })
}

/// Runs the script's `phase` against `node`; its output, or a panic with it.
async fn run(node: &Node, phase: &str, extra_env: &[(&str, &str)]) -> String {
    let tls = extra_env.iter().any(|(name, _)| *name == "AWS_CA_BUNDLE");
    run_with(&setup(node, tls), phase, extra_env, &node.log()).await
}

async fn run_with(setup: &Value, phase: &str, extra_env: &[(&str, &str)], log: &str) -> String {
    let script = ("sqs_boto3.py", phase);
    run_script(&python(), script, setup, extra_env, log).await
}

/// Runs `tests/interop/SCRIPT PHASE` with `python` and the setup; its output, or a panic.
async fn run_script(
    python: &std::path::Path,
    (script, phase): (&str, &str),
    setup: &Value,
    extra_env: &[(&str, &str)],
    log: &str,
) -> String {
    let script = workspace().join("tests/interop").join(script);
    let setup = setup.to_string();
    let mut env = vec![("QE_SQS", setup.as_str())];
    env.extend_from_slice(extra_env);
    let within = std::time::Duration::from_secs(240);
    qe_tests::run_checked(python, &script, &[phase], &env, within, log).await
}

#[tokio::test]
async fn boto3_and_the_aws_cli_drive_every_action() {
    let node = start(None);
    let output = run(&node, "all", &[]).await;
    assert_eq!(output.lines().filter(|l| l.starts_with("ok ")).count(), 12);
}

/// An SDK from before AWS moved SQS to its JSON protocol (boto3 1.26, in the venv the
/// README's test command makes for it) is answered in the query protocol it speaks.
#[tokio::test]
async fn an_sdk_of_the_query_protocol_drives_the_actions_in_it() {
    let python = workspace().join(".venv-sqs-query/bin/python");
    assert!(
        python.exists(),
        "{} is missing: the README's test command installs it",
        python.display()
    );
    let node = start(None);
    let output = run_script(
        &python,
        ("sqs_query.py", "all"),
        &setup(&node, false),
        &[],
        &node.log(),
    )
    .await;
    assert!(output.contains("protocol query"), "{output}");
    assert_eq!(output.lines().filter(|l| l.starts_with("ok ")).count(), 6);
}

#[tokio::test]
async fn after_a_kill_messages_in_flight_are_visible_again_with_their_receive_counts() {
    let node = start(None);
    let output = run(&node, "inflight", &[]).await;
    let held = output
        .lines()
        .find(|line| line.starts_with('['))
        .expect("the held bodies")
        .to_string();
    let node = start(Some(node));
    run(&node, "after-restart", &[("QE_SQS_HELD", &held)]).await;
}

#[tokio::test]
async fn over_tls_the_sqs_face_serves_https_with_the_nodes_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = qe_tests::test_ca("SQS test CA");
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let leaf = params.signed_by(&key, &ca).unwrap();
    let (cert_path, key_path, ca_path) = (
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
        dir.path().join("ca.pem"),
    );
    std::fs::write(&cert_path, leaf.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let tls = [
        "--tls-cert",
        cert_path.to_str().unwrap(),
        "--tls-key",
        key_path.to_str().unwrap(),
    ];
    let node = start_with(None, &tls);
    run(
        &node,
        "https",
        &[("AWS_CA_BUNDLE", ca_path.to_str().unwrap())],
    )
    .await;
    // And Amazon's Rust SDK, trusting only the test's CA: a round trip.
    let url = setup(&node, true)["endpoint"].as_str().unwrap().to_string();
    let ca_pem = ca.pem();
    let endpoint = SqsEndpoint {
        url: &url,
        ca_pem: Some(&ca_pem),
        resolve_to: None,
    };
    let (_, id, secret) = KEYS[2];
    let sqs = client(&endpoint, id, secret);
    let queue = &qe_tests::sqs::lone_queue_url(&sqs).await;
    assert!(queue.starts_with("https://localhost:"), "{queue}");
    let sent = send(&sqs, queue, "over TLS").await;
    let got = receive(&sqs, queue, 1, 5).await;
    let [message] = got.as_slice() else {
        panic!("the message: {got:?}");
    };
    assert_eq!(message.message_id(), sent.message_id());
    delete(&sqs, queue, message).await;
    // A client that trusts another CA is refused the connection.
    let stranger = qe_tests::test_ca("another CA").pem();
    let untrusting = SqsEndpoint {
        url: &url,
        ca_pem: Some(&stranger),
        resolve_to: None,
    };
    let sqs = client(&untrusting, id, secret);
    let refused = sqs.list_queues().send().await.unwrap_err();
    assert!(
        matches!(refused, aws_sdk_sqs::error::SdkError::DispatchFailure(_)),
        "{refused:?}"
    );
}

/// Keys from the control plane: made per role (the secret shown once, never listed), given
/// to the node with its config, audited; a revoked one is refused by the node.
#[tokio::test]
async fn the_control_plane_issues_and_revokes_a_queues_sqs_keys() {
    let cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap();
    let path = format!("/v1/queues/{id}/sqs-keys");
    let mut keys = serde_json::Map::new();
    let mut endpoint = String::new();
    for role in ["publisher", "subscriber", "admin"] {
        let body = json!({ "role": role }).to_string();
        let (status, made) = cp.call("POST", &path, Some(&body)).await;
        assert_eq!(status, 201, "{made}");
        assert_eq!(made["role"], role);
        assert_eq!(made["applied"], true, "{made}");
        let key_id = made["access_key_id"].as_str().unwrap();
        assert!(key_id.starts_with("QE") && key_id.len() == 20, "{key_id}");
        keys.insert(role.into(), json!([key_id, made["secret"]]));
        endpoint = made["endpoint"].as_str().unwrap().to_string();
        assert_eq!(made["queue_url"], format!("{endpoint}/{id}"));
    }
    let (status, refused) = cp.call("POST", &path, Some(r#"{"role":"root"}"#)).await;
    assert_eq!(status, 400, "{refused}");
    let (status, listed) = cp.call("GET", &path, None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["keys"].as_array().unwrap().len(), 3);
    assert!(!listed.to_string().contains("secret"), "{listed}");
    let setup = json!({ "endpoint": endpoint, "keys": keys, "queue": id });
    run_with(&setup, "control-plane", &[], "").await;

    let subscriber = keys["subscriber"][0].as_str().unwrap();
    let (status, revoked) = cp
        .call("DELETE", &format!("{path}/{subscriber}"), None)
        .await;
    assert_eq!(
        (status, revoked["applied"].as_bool()),
        (200, Some(true)),
        "{revoked}"
    );
    run_with(&setup, "revoked", &[], "").await;
    let (status, again) = cp
        .call("DELETE", &format!("{path}/{subscriber}"), None)
        .await;
    assert_eq!(status, 404, "{again}");
    let actions = cp.audit_actions().await;
    assert_eq!(
        actions
            .iter()
            .filter(|a| *a == "queue.sqs-key.create")
            .count(),
        3,
        "three made (the refused one is counted, not kept): {actions:?}"
    );
    let revoked = actions.iter().any(|a| a == "queue.sqs-key.revoke");
    assert!(revoked, "{actions:?}");
}
