//! Real third-party clients: the manual's Python (package `websockets`) and Node.js (package
//! `ws`) programs, unchanged but for the address, and what each client sees of the queue's
//! close behaviour.

use qe_tests::{
    cases, node_program, python, run_node, run_python, workspace, Node, Running, MANUAL_ADDRESS,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

fn manual_program(name: &str) -> PathBuf {
    workspace().join("tests/interop/manual").join(name)
}

/// The manual's program `name`, pointed at `node`, as a file in the node's data directory.
fn program_for(node: &Node, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(manual_program(name)).unwrap();
    assert!(text.contains(MANUAL_ADDRESS));
    let path = node.data_dir.path().join(name);
    std::fs::write(&path, text.replace(MANUAL_ADDRESS, &node.url())).unwrap();
    path
}

/// The copies are the manual's programs: the same lines, once indentation (which the
/// manual's text format drops) is set aside.
#[test]
fn the_python_and_node_programs_are_the_manuals() {
    let manual =
        std::fs::read_to_string(workspace().join("../shared/spec/queue-expert-manual.txt"))
            .expect("the manual beside the repository");
    let manual_lines: Vec<&str> = manual.lines().collect();
    let programs = ["publisher.py", "subscriber.py", "admin.py"];
    for name in programs
        .into_iter()
        .chain(["publisher.mjs", "subscriber.mjs", "admin.mjs"])
    {
        let copy = std::fs::read_to_string(manual_program(name)).unwrap();
        let copy: Vec<&str> = copy
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let found = manual_lines
            .windows(copy.len())
            .any(|window| window.iter().map(|l| l.trim()).eq(copy.iter().copied()));
        assert!(
            found,
            "{name} is not, line for line, a program of the manual"
        );
    }
}

#[tokio::test]
async fn the_manuals_python_publisher_and_subscriber_work() {
    let node = Node::start();
    let published = run_python(&program_for(&node, "publisher.py"), &[]).await;
    let id = published
        .trim()
        .strip_prefix("Published. The message id is ")
        .unwrap_or_else(|| panic!("{published}"))
        .to_string();

    let mut subscriber = Running::start(&python(), &program_for(&node, "subscriber.py"));
    let line = subscriber.next_line().await;
    assert_eq!(line.as_deref(), Some("Received: Hello from Python"));

    // The program acked it: the message is gone. A second publish reaches the program too.
    let second = run_python(&program_for(&node, "publisher.py"), &[]).await;
    assert!(
        second.starts_with("Published. The message id is "),
        "{second}"
    );
    let line = subscriber.next_line().await;
    assert_eq!(line.as_deref(), Some("Received: Hello from Python"));
    drop(subscriber);
    // Until the node sees the drop, the killed program stands first in the line with room,
    // and a message sent now would wait in its saved session.
    node.wait_for_log("a subscriber's connection dropped");

    let (mut check, _) = node.subscriber(10).await;
    let mut publisher = node.publisher().await;
    publisher.request(json!({"body": "marker"})).await;
    let next = check.recv().await;
    assert_eq!(
        next["body"], "marker",
        "the acked messages ({id}) did not come back: {next}"
    );
}

#[tokio::test]
async fn the_manuals_python_publisher_reports_a_failed_login() {
    let node = Node::start();
    let script = program_for(&node, "publisher.py");
    let text = std::fs::read_to_string(&script).unwrap();
    std::fs::write(
        &script,
        text.replace("PUBLISHER-PASSWORD", "not-the-password"),
    )
    .unwrap();
    let output = run_python(&script, &[]).await;
    assert_eq!(
        output.trim(),
        "Failed: 107 Authentication failed. Invalid combination of username, password and role."
    );
}

#[tokio::test]
async fn python_sees_deflate_and_the_manuals_close_behaviour() {
    let node = Node::start_with(&["--message-timeout-secs", "1"]);
    let script = workspace().join("tests/interop/close_codes.py");
    let output = run_python(&script, &[node.url()]).await;
    let case = cases(&output);

    assert_eq!(
        case("extensions")["extensions"],
        json!(["permessage-deflate"])
    );

    let failed = case("failed_login");
    assert_eq!(
        failed["replies"][0]["code"], 107,
        "the reply arrives before the close"
    );
    assert_eq!(failed["code"], 1006, "no close frame");

    let logout = case("logout");
    assert_eq!(logout["replies"][1]["status"], "Logout Success.");
    assert_eq!(logout["code"], 1000);

    let not_json = case("not_json");
    assert_eq!(not_json["replies"][1]["code"], 100);
    assert_eq!(not_json["code"], 1006);

    assert_eq!(case("too_big")["code"], 1009);
    assert_the_broken_frame_codes(&case);
}

/// What a real client sees for each broken frame (`case` finds one by name).
fn assert_the_broken_frame_codes(case: &dyn Fn(&str) -> Value) {
    assert_eq!(case("invalid_utf8")["code"], 1007);
    assert_eq!(case("reserved_opcode")["code"], 1002);
    assert_eq!(case("broken_deflate")["code"], 1011);
    assert_eq!(case("unfinished")["code"], 1008);
}

/// A backlog more than twice max-write-queue-bytes (Dev/test: 1 MiB), read by a Python client
/// with permessage-deflate (which the node agrees to without context takeover).
#[tokio::test]
async fn a_python_subscriber_that_reads_gets_a_backlog_bigger_than_its_write_queue() {
    let node = Node::start_with(&["--tier", "devtest"]);
    let script = workspace().join("tests/interop/backlog.py");
    let output = run_python(&script, &[node.url(), "40".into(), "60000".into()]).await;
    let seen: Value = serde_json::from_str(output.trim()).unwrap_or_else(|_| panic!("{output}"));
    assert_eq!(seen["extensions"], json!(["permessage-deflate"]), "{seen}");
    assert_eq!(seen["received"], 40, "{seen}");
    assert_eq!(seen["whole_and_in_order"], true, "{seen}");
    assert_eq!(seen["closed"], Value::Null, "{seen}");
}

#[test]
fn python_has_websockets() {
    let status = Command::new(python())
        .args(["-c", "import websockets"])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn the_manuals_node_programs_work() {
    let node = Node::start();
    let published = run_node(
        &node_program(&node, "publisher.mjs", &node.url(), &[]),
        &[],
        &[],
    )
    .await;
    assert!(
        published.starts_with("Published. The message id is "),
        "{published}"
    );

    let program = node_program(&node, "subscriber.mjs", &node.url(), &[]);
    let mut subscriber = Running::start(Path::new("node"), &program);
    let line = subscriber.next_line().await;
    assert_eq!(line.as_deref(), Some("Received: Hello from Node.js"));
    drop(subscriber);

    let admin = run_node(
        &node_program(&node, "admin.mjs", &node.url(), &[]),
        &[],
        &[],
    )
    .await;
    assert!(admin.starts_with("Messages in the queue: "), "{admin}");

    let refused = node_program(
        &node,
        "publisher.mjs",
        &node.url(),
        &[("PUBLISHER-PASSWORD", "wrong")],
    );
    let refused = run_node(&refused, &[], &[]).await;
    assert_eq!(
        refused.trim(),
        "Failed: 107 Authentication failed. Invalid combination of username, password and role."
    );
}

#[tokio::test]
async fn node_sees_deflate_and_the_manuals_close_behaviour() {
    let node = Node::start_with(&["--message-timeout-secs", "1"]);
    let script = workspace().join("tests/interop/node/close_codes.mjs");
    let output = run_node(&script, &[node.url()], &[]).await;
    let case = cases(&output);
    let failed = case("failed_login");
    assert_eq!(
        (failed["replies"][0]["code"].clone(), failed["code"].clone()),
        (json!(107), json!(1006))
    );
    assert_eq!(failed["deflate"], true);
    let logout = case("logout");
    assert_eq!(
        (
            logout["replies"][1]["status"].clone(),
            logout["code"].clone()
        ),
        (json!("Logout Success."), json!(1000))
    );
    let not_json = case("not_json");
    assert_eq!(
        (
            not_json["replies"][1]["code"].clone(),
            not_json["code"].clone()
        ),
        (json!(100), json!(1006))
    );
    assert_eq!(case("too_big")["code"], 1009);
    assert_the_broken_frame_codes(&case);
}

/// Sessions carried to the standby, seen by a real client (Python websockets): it holds 3
/// durability-2 messages on a primary with a standby and leaves without a logout; both nodes
/// are killed and a node started on the standby's copy (a promotion); the client resumes its
/// session there with `replay` and gets the 3 again, and its acks succeed: it holds them.
#[tokio::test]
async fn a_python_subscriber_resumes_its_session_on_a_promoted_standbys_copy() {
    use qe_tests::standby::{wait_in_sync, Standby, KEY};
    let mut primary = Node::start_with(&["--replication-key", KEY]);
    let standby = Standby::start(&primary, KEY);
    wait_in_sync(&primary, 1);
    let mut publisher = primary.publisher().await;
    for n in 0..3 {
        let reply = publisher
            .request(json!({"body": format!("held {n}"), "durability": 2}))
            .await;
        assert_eq!(reply["status"], "Success.", "{reply}");
    }
    let script = workspace().join("tests/interop/resume.py");
    let output = run_python(&script, &["hold".into(), primary.url(), "3".into()]).await;
    let held: Value = serde_json::from_str(output.trim()).unwrap_or_else(|_| panic!("{output}"));
    assert_eq!(
        held["bodies"],
        json!(["held 0", "held 1", "held 2"]),
        "{held}"
    );
    // Synced on the standby after the holds were shipped, so the standby has them too.
    let reply = publisher
        .request(json!({"body": "after", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    primary.kill();
    let mut standby = standby;
    standby.kill();

    let promoted = Node::start_in(standby.into_data_dir(), &[]);
    let session = held["session"].as_str().unwrap().to_string();
    let args = ["resume".into(), promoted.url(), session, "3".into()];
    let output = run_python(&script, &args).await;
    let resumed: Value = serde_json::from_str(output.trim()).unwrap_or_else(|_| panic!("{output}"));
    assert_eq!(resumed["resumed"], "Success.", "{resumed}");
    assert_eq!(resumed["bodies"], held["bodies"], "{resumed}");
    assert_eq!(
        resumed["acks"],
        json!(["Success.", "Success.", "Success."]),
        "{resumed}"
    );
}
