//! The control plane's SQS endpoint (docs/sqs.md, *The account's endpoint*), from outside: the
//! real control plane with the local provider, an account and its SQS keys made through the
//! API, then `tests/interop/sqs_account.py` drives it with boto3, the AWS CLI and an SDK of
//! the query protocol; the API then shows what SQS made (names, tags), and the audit what
//! it changed.

use qe_tests::{python, workspace, ControlPlane};
use serde_json::{json, Value};

/// An account, and an SQS key of each role of it made by the operator: the script's setup.
async fn account_with_keys(cp: &ControlPlane, prefix: &str) -> (String, Value) {
    let (status, account) = cp
        .call("POST", "/v1/accounts", Some(r#"{"name":"SQS user"}"#))
        .await;
    assert_eq!(status, 201, "{account}");
    let account = account["id"].as_str().unwrap().to_string();
    let path = format!("/v1/accounts/{account}/sqs-keys");
    let mut keys = serde_json::Map::new();
    let mut endpoint = Value::Null;
    for role in ["admin", "publisher"] {
        let body = json!({ "role": role }).to_string();
        let (status, made) = cp.call("POST", &path, Some(&body)).await;
        assert_eq!(status, 201, "{made}");
        let key_id = made["access_key_id"].as_str().unwrap();
        assert!(key_id.starts_with("QE") && key_id.len() == 20, "{key_id}");
        keys.insert(role.into(), json!([key_id, made["secret"]]));
        endpoint = made["endpoint"].clone();
    }
    assert_eq!(
        endpoint,
        format!("http://{}", cp.addr),
        "the API's own port"
    );
    let (status, listed) = cp.call("GET", &path, None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["keys"].as_array().unwrap().len(), 2, "{listed}");
    assert!(!listed.to_string().contains("secret"), "{listed}");
    let setup = json!({ "endpoint": endpoint, "keys": keys, "prefix": prefix });
    (account, setup)
}

/// Runs `tests/interop/sqs_account.py PHASE` with `python`; its output, or a panic.
async fn run(python: &std::path::Path, phase: &str, setup: &Value, cp: &ControlPlane) -> String {
    let script = workspace().join("tests/interop/sqs_account.py");
    run_script(python, &script, &[phase], setup, cp).await
}

/// Runs `interpreter SCRIPT ARGS` with the setup in `QE_SQS`; its output, or a panic with
/// its output and the control plane's log.
async fn run_script(
    interpreter: &std::path::Path,
    script: &std::path::Path,
    args: &[&str],
    setup: &Value,
    cp: &ControlPlane,
) -> String {
    let env = [("QE_SQS", setup.to_string())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let within = std::time::Duration::from_secs(300);
    qe_tests::run_checked(interpreter, script, args, &env, within, &cp.log_text()).await
}

#[tokio::test]
async fn boto3_and_the_aws_cli_make_use_tag_list_and_delete_queues_through_the_endpoint() {
    let cp = ControlPlane::start();
    let (account, setup) = account_with_keys(&cp, "app").await;
    let output = run(&python(), "boto3", &setup, &cp).await;
    let made: Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    let id = made["queue_id"].as_str().unwrap();

    // The API shows what SQS made: its name, its tags, its account.
    let (status, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(status, 200, "{queue}");
    assert_eq!(queue["name"], "app-orders", "{queue}");
    assert_eq!(queue["tags"], json!({"team": "orders"}), "{queue}");
    assert_eq!(queue["account"], account.as_str(), "{queue}");
    assert_eq!(queue["status"], "running", "{queue}");

    run(&python(), "cli", &setup, &cp).await;

    // Each change SQS made is audited, with the key that made it.
    let actions = cp.audit_actions().await;
    for action in [
        "account.sqs-key.create",
        "sqs.CreateQueue",
        "sqs.TagQueue",
        "sqs.UntagQueue",
        "sqs.DeleteQueue",
    ] {
        assert!(
            actions.iter().any(|a| a == action),
            "{action} in {actions:?}"
        );
    }

    // A revoked key is refused at once by the control plane.
    let admin_key = setup["keys"]["admin"][0].as_str().unwrap();
    let path = format!("/v1/accounts/{account}/sqs-keys/{admin_key}");
    let (status, revoked) = cp.call("DELETE", &path, None).await;
    assert_eq!(status, 200, "{revoked}");
    assert_eq!(
        revoked["applied"], true,
        "every queue's node took it: {revoked}"
    );
}

/// An SDK from before AWS moved SQS to its JSON protocol (boto3 1.26, `.venv-sqs-query`):
/// the account's actions in forms and XML, and a queue's handed on to its node.
#[tokio::test]
async fn an_sdk_of_the_query_protocol_makes_and_deletes_queues_too() {
    let python = workspace().join(".venv-sqs-query/bin/python");
    assert!(
        python.exists(),
        "{} is missing: the README's test command makes it",
        python.display()
    );
    let cp = ControlPlane::start();
    let (_, setup) = account_with_keys(&cp, "old").await;
    run(&python, "query", &setup, &cp).await;
}

/// The AWS SDK for JavaScript v3 (`@aws-sdk/client-sqs`, tests/interop/node):
/// `tests/interop/node/sqs_account.mjs` makes, uses, tags, lists and deletes queues, with the
/// endpoint given in code (everything through the control plane) and given by
/// `AWS_ENDPOINT_URL_SQS` (the SDK's default: queue actions at the queue's URL, its node).
#[tokio::test]
async fn the_javascript_sdk_makes_uses_tags_lists_and_deletes_queues_through_the_endpoint() {
    let sdk = workspace().join("tests/interop/node/node_modules/@aws-sdk/client-sqs");
    assert!(
        sdk.exists(),
        "{} is missing: `npm ci` in tests/interop/node installs it",
        sdk.display()
    );
    let cp = ControlPlane::start();
    let (account, setup) = account_with_keys(&cp, "js").await;
    let script = workspace().join("tests/interop/node/sqs_account.mjs");
    let output = run_script(std::path::Path::new("node"), &script, &[], &setup, &cp).await;
    let checks = output
        .lines()
        .filter(|line| line.starts_with("ok "))
        .count();
    assert_eq!(checks, 13, "{output}");
    let made: Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    let id = made["queue_id"].as_str().unwrap();

    // The API shows what the SDK made, and the tags it left.
    let (status, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(status, 200, "{queue}");
    assert_eq!(queue["name"], "js-orders", "{queue}");
    assert_eq!(queue["tags"], json!({"team": "orders"}), "{queue}");
    assert_eq!(queue["account"], account.as_str(), "{queue}");
    assert_eq!(queue["status"], "running", "{queue}");
}

/// Dead letters sent to another queue of the account (`dead_letter_checks` in the script):
/// `RedrivePolicy` naming it at `CreateQueue` and by `SetQueueAttributes` at a queue's node,
/// its `RedriveAllowPolicy` obeyed, each dead letter arriving once with its attributes, and
/// `ListDeadLetterSourceQueues` naming the sources.
#[tokio::test]
async fn dead_letters_go_to_another_queue_of_the_account_that_allows_it() {
    let cp = ControlPlane::start();
    let (_, setup) = account_with_keys(&cp, "dl").await;
    let output = run(&python(), "dead-letters", &setup, &cp).await;
    assert_eq!(
        output.lines().filter(|l| l.starts_with("ok ")).count(),
        6,
        "{output}"
    );
}

/// A FIFO queue made through the endpoint, driven by boto3 with concurrent senders (each
/// sending every message twice) and receivers: no duplicate, one of a group out at a time,
/// each group in order (`fifo_checks` in the script).
/// Halfway, with messages received and not deleted, the queue's node is killed -9 (the
/// control plane starts it again); the rest comes after, in order (`fifo-after-restart`).
#[tokio::test]
async fn a_fifo_queue_keeps_each_group_in_order_and_each_message_once() {
    let cp = ControlPlane::start();
    let (_, mut setup) = account_with_keys(&cp, "ff").await;
    let output = run(&python(), "fifo", &setup, &cp).await;
    assert_eq!(output.lines().filter(|l| l.starts_with("ok ")).count(), 2);
    let state: Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    let id = state["url"].as_str().unwrap().rsplit('/').next().unwrap();
    let pid = qe_tests::process_naming(&cp.node_bootstrap(id)).expect("the node runs");
    qe_tests::signal(pid, libc::SIGKILL);
    setup["fifo"] = state;
    let script = workspace().join("tests/interop/sqs_account.py");
    let env = [
        ("QE_SQS", setup.to_string()),
        ("QE_FIFO", setup["fifo"].to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let within = std::time::Duration::from_secs(300);
    let args = ["fifo-after-restart"];
    let (python, log) = (python(), cp.log_text());
    let output = qe_tests::run_checked(&python, &script, &args, &env, within, &log).await;
    assert!(output.contains("after a kill -9 in the middle"), "{output}");
}
