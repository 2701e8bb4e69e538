//! When the disk fails: a failed sync is final (the node refuses durable messages until it
//! restarts, and never answers Success for a change it could not sync); a full disk keeps the
//! changes it could not write in memory, bounded by max-messages-memory, and writes them when
//! room comes back; a file system gone read-only gets 507, never a false Success; compaction
//! that cannot remove a segment keeps it, so no acknowledged message comes back. Real faults:
//! a FUSE layer whose syncs fail, a full tmpfs, ext4's own read-only error path, and an
//! immutable file (see `qe_tests::disks`). They need root, as CI has.

use qe_tests::disks::{data_dir_on, Ext4Image, FailingSyncs, SmallTmpfs};
use qe_tests::{Client, Node};
use serde_json::{json, Value};

async fn publish(publisher: &mut Client, body: &str, durability: u8) -> Value {
    publisher
        .request(json!({"body": body, "durability": durability}))
        .await
}

fn code(reply: &Value) -> u64 {
    match reply["status"].as_str() {
        Some("Success.") => 0,
        _ => reply["code"].as_u64().unwrap_or_else(|| panic!("{reply}")),
    }
}

/// The bodies of the messages the node holds, from an administrator's `getmsgs`.
async fn bodies(node: &Node) -> Vec<String> {
    let (mut admin, _) = node.login("admin", "distribute", json!({})).await;
    let page = admin
        .request(json!({"cmd": "getmsgs", "after": "", "count": 1600}))
        .await;
    let mut bodies = Vec::new();
    for line in page["csv"].as_str().unwrap().lines() {
        let id = line.split(',').next().unwrap();
        let shown = admin.request(json!({"cmd": "getmsg", "id": id})).await;
        bodies.push(shown["msg"]["body"].as_str().unwrap().to_string());
    }
    bodies
}

/// What the messages the node holds count against max-messages-memory by themselves: each
/// frame's length (the `getmsgs` column) and the fixed overhead the README gives.
async fn messages_cost(admin: &mut Client) -> u64 {
    let page = admin
        .request(json!({"cmd": "getmsgs", "after": "", "count": 1600}))
        .await;
    let lengths = page["csv"].as_str().unwrap().lines();
    lengths
        .map(|line| line.split(',').nth(1).unwrap().parse::<u64>().unwrap() + 220)
        .sum()
}

/// `messages-memory-used`, from `getcfg`.
async fn memory_used(admin: &mut Client) -> u64 {
    let config = admin.request(json!({"cmd": "getcfg"})).await;
    let csv = config["csv"].as_str().unwrap().to_string();
    let line = csv
        .lines()
        .find(|l| l.starts_with("messages-memory-used,"))
        .unwrap();
    line.rsplit(',').next().unwrap().parse().unwrap()
}

/// The fault layer itself: a held disk holds writes and syncs only. Opening and reading a file
/// while another write waits must not queue behind it (FUSE sends every open to the daemon, so
/// a daemon that serves one call at a time fails this), or the tests that assert "reads still
/// answer while the disk is held" would hang on the tool, not on the code under test.
#[test]
fn a_held_disk_holds_writes_only_and_still_serves_reads() {
    let disk = FailingSyncs::mount();
    let readable = disk.dir().join("readable");
    std::fs::write(&readable, "before the hold").unwrap();
    let held = disk.hold();
    let writing = disk.dir().join("writing");
    let writer = std::thread::spawn(move || std::fs::write(writing, "while held"));
    disk.wait_for_held();
    let (read_tx, read) = std::sync::mpsc::channel();
    std::thread::spawn(move || read_tx.send(std::fs::read_to_string(&readable)));
    let contents = read
        .recv_timeout(qe_tests::PROMPT)
        .expect("a read answers while a write is held")
        .unwrap();
    assert_eq!(contents, "before the hold");
    assert!(!writer.is_finished(), "the write waits for the disk");
    drop(held);
    writer.join().unwrap().unwrap();
}

#[tokio::test]
async fn a_failed_sync_is_final_and_durable_messages_are_refused_until_a_restart() {
    let disk = FailingSyncs::mount();
    let (data, _meta) = data_dir_on(disk.dir());
    let node = Node::start_in(data, &[]);
    let mut publisher = node.publisher().await;
    assert_eq!(code(&publish(&mut publisher, "synced", 2).await), 0);

    disk.fail_syncs();
    let lost = publish(&mut publisher, "not synced", 2).await;
    assert_eq!(code(&lost), 507, "made, but it may not survive: {lost}");
    assert!(
        lost["id"].is_string(),
        "507 names the message it made: {lost}"
    );
    for durability in [1, 2] {
        let refused = publish(&mut publisher, "refused", durability).await;
        assert_eq!(code(&refused), 502, "{refused}");
    }
    node.wait_for_log("a sync of the message log failed");
    assert_eq!(code(&publish(&mut publisher, "in memory", 0).await), 0);
    // A sync that works again changes nothing: the pages it failed to write may be gone.
    disk.heal();
    assert_eq!(code(&publish(&mut publisher, "refused", 1).await), 502);

    // Every message made is served; an ack of a durable one cannot be made safe.
    let (mut subscriber, _) = node.subscriber(10).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(subscriber.recv().await);
    }
    let mut bodies_got: Vec<&str> = got.iter().map(|d| d["body"].as_str().unwrap()).collect();
    bodies_got.sort();
    assert_eq!(bodies_got, ["in memory", "not synced", "synced"]);
    let synced = got.iter().find(|d| d["body"] == "synced").unwrap();
    let ack = subscriber
        .request(json!({"id": synced["id"], "ack": 1}))
        .await;
    assert_eq!(code(&ack), 507, "{ack}");
    // Its retry is not told it is done either: the message is no longer held (301), and
    // comes back after the restart below.
    let again = subscriber
        .request(json!({"id": synced["id"], "ack": 1}))
        .await;
    assert_eq!(code(&again), 301, "{again}");

    // After a restart the node reads back what the disk has, and takes durable messages.
    let node = node.restart(&[]);
    assert!(bodies(&node).await.contains(&"synced".to_string()));
    assert!(!bodies(&node).await.contains(&"refused".to_string()));
    let mut publisher = node.publisher().await;
    assert_eq!(code(&publish(&mut publisher, "after", 2).await), 0);
}

#[tokio::test]
async fn a_full_disk_keeps_what_it_cannot_write_bounded_and_writes_it_when_room_comes_back() {
    let disk = SmallTmpfs::mount(16);
    let (data, _meta) = data_dir_on(disk.dir());
    // Small segments, so that the disk is soon asked for a new one; little message memory,
    // so that the bound is soon reached.
    let flags = [
        "--log-segment-bytes",
        "65536",
        "--max-messages-memory",
        "1000000",
    ];
    let node = Node::start_in(data, &flags);
    let mut publisher = node.publisher().await;
    let (mut admin, _) = node.login("admin", "distribute", json!({})).await;
    assert_eq!(code(&publish(&mut publisher, "before", 1).await), 0);
    disk.fill();

    let body = "f".repeat(1000);
    let mut kept = Vec::new();
    let mut saw_507 = false;
    let refused = loop {
        let reply = publish(&mut publisher, &body, 1).await;
        match code(&reply) {
            0 => kept.push(reply["id"].clone()),
            507 => {
                saw_507 = true;
                kept.push(reply["id"].clone());
            }
            _ => break reply,
        }
        assert!(kept.len() < 2000, "the bound holds");
    };
    assert!(saw_507, "writes that failed are answered 507");
    assert_eq!(code(&refused), 211, "{refused}");
    let used = memory_used(&mut admin).await;
    let messages = messages_cost(&mut admin).await;
    assert!(used <= 1_000_000, "bounded: {used}");
    assert!(
        used > messages + 100_000,
        "the records the disk did not take count too: {used} used, {messages} by the messages"
    );

    disk.empty();
    node.wait_for_log("the message log is written again");
    assert_eq!(code(&publish(&mut publisher, "after", 1).await), 0);
    // What was kept in memory is on the disk now: a killed node reads it all back.
    let node = node.restart(&["--log-segment-bytes", "65536"]);
    let back = bodies(&node).await;
    assert_eq!(back.len(), kept.len() + 2, "before, the kept ones, after");
    assert!(back.contains(&"before".to_string()) && back.contains(&"after".to_string()));
}

#[tokio::test]
async fn a_file_system_gone_read_only_gets_507_and_never_a_false_success() {
    let disk = Ext4Image::new(64);
    let (data, _meta) = data_dir_on(disk.dir());
    let node = Node::start_in(data, &[]);
    let mut publisher = node.publisher().await;
    assert_eq!(code(&publish(&mut publisher, "before", 2).await), 0);

    disk.go_read_only();
    for durability in [2, 1] {
        let reply = publish(&mut publisher, "while read-only", durability).await;
        assert!(
            matches!(code(&reply), 507 | 502),
            "not Success for a change the disk did not take: {reply}"
        );
    }
    assert_eq!(code(&publish(&mut publisher, "in memory", 0).await), 0);

    let node = {
        // The node is killed before the disk is repaired: the data directory moves on with it.
        let mut node = node;
        node.kill();
        disk.repair();
        node.restart(&[])
    };
    assert!(bodies(&node).await.contains(&"before".to_string()));
}

/// Runs `chattr FLAGS PATH` (an immutable file cannot be removed, even by root).
fn chattr(flags: &str, path: &std::path::Path) {
    let status = std::process::Command::new("chattr")
        .arg(flags)
        .arg(path)
        .status()
        .expect("chattr (e2fsprogs)");
    assert!(status.success(), "chattr {flags} {}", path.display());
}

#[tokio::test]
async fn a_segment_compaction_cannot_remove_is_kept_so_no_acked_message_comes_back() {
    let segments = ["--log-segment-bytes", "65536"];
    let node = Node::start_with(&segments);
    let first_segment = node.data_dir.path().join("messages/00000001.log");
    let mut publisher = node.publisher().await;
    let (mut holder, _) = node.subscriber(1).await;
    let (mut worker, _) = node.subscriber(1024).await;
    let keep = publish(&mut publisher, "keep", 1).await;
    assert_eq!(holder.recv().await["id"], keep["id"]);
    // 80 messages of 1 kB, held: the first segment fills (still mostly live) and the log
    // goes on in a second one.
    let body = "w".repeat(1000);
    let mut held = Vec::new();
    for _ in 0..80 {
        let reply = publish(&mut publisher, &body, 1).await;
        assert_eq!(code(&reply), 0, "{reply}");
        held.push(worker.recv().await["id"].clone());
    }
    assert!(node.data_dir.path().join("messages/00000002.log").exists());
    chattr("+i", &first_segment);

    // Now the first segment is mostly dead: compaction copies "keep" out of it, and cannot
    // remove it.
    for id in &held {
        let ack = worker.request(json!({"id": id, "ack": 1})).await;
        assert_eq!(code(&ack), 0, "{ack}");
    }
    node.wait_for_log("removing a compacted segment failed");
    let ack = holder.request(json!({"id": keep["id"], "ack": 1})).await;
    assert_eq!(code(&ack), 0, "{ack}");
    let logout = holder.request(json!({"logout": true})).await;
    assert_eq!(logout["status"], "Logout Success.");
    // Churn enough for many segments to be compacted, if any could be.
    for _ in 0..600 {
        let reply = publish(&mut publisher, &body, 1).await;
        let delivery = worker.recv().await;
        assert_eq!(delivery["id"], reply["id"]);
        let ack = worker
            .request(json!({"id": delivery["id"], "ack": 1}))
            .await;
        assert_eq!(code(&ack), 0, "{ack}");
    }
    let mut node = node;
    node.kill();
    chattr("-i", &first_segment);
    let node = node.restart(&segments);
    assert!(
        bodies(&node).await.is_empty(),
        "every message was acked; none may come back"
    );
}

/// A node's flags for its SQS face on loopback, with an admin key.
const SQS_FLAGS: [&str; 4] = [
    "--sqs-listen",
    "127.0.0.1:0",
    "--sqs-key",
    "admin:AKIAFAULTADMIN:fault-secret",
];

/// An SQS client of `node`'s SQS face, with the key of [`SQS_FLAGS`].
fn sqs_of(node: &Node) -> qe_tests::sqs::aws_sdk_sqs::Client {
    qe_tests::sqs::client_of(node, "AKIAFAULTADMIN", "fault-secret")
}

/// The SQS face on a file system gone read-only: a send, a delete, a purge and every entry
/// of a SendMessageBatch and a DeleteMessageBatch whose write failed are answered as failed
/// (`InternalFailure`, 500, which the SDKs retry), never as success, and so is the retry of
/// a failed delete; after a restart, what was answered as not deleted is still there.
#[tokio::test]
async fn sqs_changes_the_disk_did_not_take_are_answered_as_failed() {
    use qe_tests::sqs::aws_sdk_sqs::error::ProvideErrorMetadata;
    use qe_tests::sqs::receive;
    let disk = Ext4Image::new(64);
    let (data, _meta) = data_dir_on(disk.dir());
    let flags = SQS_FLAGS;
    let node = Node::start_in(data, &flags);
    let sqs = sqs_of(&node);
    let queue = qe_tests::sqs::lone_queue_url(&sqs).await;
    let send = |body: &str| {
        let sent = sqs.send_message().queue_url(&queue).message_body(body);
        sent.send()
    };
    // Synced (an SQS send's durability 1 does not outlive the file system's failure).
    let mut publisher = node.publisher().await;
    assert_eq!(code(&publish(&mut publisher, "before", 2).await), 0);
    assert_eq!(code(&publish(&mut publisher, "before, too", 2).await), 0);
    let held = receive(&sqs, &queue, 2, 1).await;
    assert_eq!(held.len(), 2);
    let handle = held[0].receipt_handle().unwrap().to_string();
    let other_handle = held[1].receipt_handle().unwrap().to_string();
    // The receive wrote the message's receive count (a new record of it) and asked for a
    // sync it does not wait on. Were the disk to fail before that sync ran (a loaded CI
    // machine), the sync's failure would refuse every durable change (503, the next test's
    // case) before this test's writes could fail. A durability-2 publish after it is
    // answered only once everything written before it is synced.
    assert_eq!(code(&publish(&mut publisher, "synced", 2).await), 0);

    disk.go_read_only();
    let failed_code = |error: &dyn ProvideErrorMetadata| error.code().map(str::to_string);
    let sent = send("while read-only").await.unwrap_err();
    let code = failed_code(sent.as_service_error().unwrap());
    assert_eq!(code.as_deref(), Some("InternalFailure"), "{sent:?}");
    assert_eq!(sent.raw_response().unwrap().status().as_u16(), 500);
    // Each one the disk does not take (it is kept in memory, and written when it can be).
    let again = send("again").await.unwrap_err();
    let code = failed_code(again.as_service_error().unwrap());
    assert_eq!(code.as_deref(), Some("InternalFailure"), "{again:?}");
    let deleted = sqs
        .delete_message()
        .queue_url(&queue)
        .receipt_handle(&handle)
        .send()
        .await
        .unwrap_err();
    let code = failed_code(deleted.as_service_error().unwrap());
    assert_eq!(code.as_deref(), Some("InternalFailure"), "{deleted:?}");
    // Its retry finds the message gone from the queue, by the delete the disk did not take:
    // answered as failed too, never as done (the message comes back after a restart).
    let retried = sqs
        .delete_message()
        .queue_url(&queue)
        .receipt_handle(&handle);
    let retried = retried.send().await.unwrap_err();
    let code = failed_code(retried.as_service_error().unwrap());
    assert_eq!(code.as_deref(), Some("InternalFailure"), "{retried:?}");
    // A batch's entries are waited for together (one write): each one the disk did not
    // take is answered as failed, never one of them as sent or deleted.
    let entry = |id: &str| {
        let entry = qe_tests::sqs::aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder();
        entry.id(id).message_body(id).build().unwrap()
    };
    let batch = sqs.send_message_batch().queue_url(&queue);
    let batch = batch
        .entries(entry("a"))
        .entries(entry("b"))
        .entries(entry("c"));
    let batch = batch.send().await.unwrap();
    assert!(batch.successful().is_empty(), "{batch:?}");
    let codes: Vec<&str> = batch.failed().iter().map(|f| f.code()).collect();
    assert_eq!(codes, ["InternalFailure"; 3], "{batch:?}");
    assert!(
        batch.failed().iter().all(|f| !f.sender_fault()),
        "{batch:?}"
    );
    let entry = qe_tests::sqs::aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder();
    let entry = entry.id("d").receipt_handle(&other_handle).build().unwrap();
    let deletes = sqs.delete_message_batch().queue_url(&queue).entries(entry);
    let deletes = deletes.send().await.unwrap();
    assert!(deletes.successful().is_empty(), "{deletes:?}");
    let codes: Vec<&str> = deletes.failed().iter().map(|f| f.code()).collect();
    assert_eq!(codes, ["InternalFailure"], "{deletes:?}");

    let node = {
        let mut node = node;
        node.kill();
        disk.repair();
        node.restart(&flags)
    };
    let sqs = sqs_of(&node);
    let back: Vec<String> = receive(&sqs, &queue, 10, 1)
        .await
        .iter()
        .map(|m| m.body().unwrap().to_string())
        .collect();
    assert!(back.contains(&"before".to_string()), "{back:?}");
    assert!(back.contains(&"before, too".to_string()), "{back:?}");
}

/// The SQS face when a sync fails (a FUSE layer whose syncs return EIO, the fsyncgate case):
/// once the node knows its log may have lost what it wrote, a send is refused
/// (`ServiceUnavailable`, 503, as the WebSocket face's 502) and a delete answered as failed
/// (`InternalFailure`, 500) until a restart, also after syncs work again: both are errors the
/// SDKs retry, never a false success.
#[tokio::test]
async fn sqs_answers_failed_after_a_failed_sync_and_does_not_trust_the_disk_again() {
    use qe_tests::sqs::aws_sdk_sqs::error::ProvideErrorMetadata;
    use qe_tests::sqs::receive;
    let disk = FailingSyncs::mount();
    let (data, _meta) = data_dir_on(disk.dir());
    let node = Node::start_in(data, &SQS_FLAGS);
    let sqs = sqs_of(&node);
    let queue = qe_tests::sqs::lone_queue_url(&sqs).await;
    let send = |body: &str| {
        sqs.send_message()
            .queue_url(&queue)
            .message_body(body)
            .send()
    };
    send("before").await.expect("a send while the disk works");
    let held = receive(&sqs, &queue, 1, 1).await;
    let handle = held[0].receipt_handle().unwrap().to_string();

    // A durable publish meets the failed sync: from then on the log is not trusted.
    disk.fail_syncs();
    let mut publisher = node.publisher().await;
    assert_eq!(code(&publish(&mut publisher, "not synced", 2).await), 507);
    let failed = |error: &dyn ProvideErrorMetadata| error.code().map(str::to_string);
    let sent = send("after the failure").await.unwrap_err();
    let service = sent.as_service_error().expect("an answer from the node");
    assert_eq!(
        failed(service).as_deref(),
        Some("ServiceUnavailable"),
        "{sent:?}"
    );
    assert_eq!(sent.raw_response().unwrap().status().as_u16(), 503);
    let delete = sqs
        .delete_message()
        .queue_url(&queue)
        .receipt_handle(&handle);
    let deleted = delete.send().await.unwrap_err();
    let service = deleted.as_service_error().expect("an answer from the node");
    assert_eq!(
        failed(service).as_deref(),
        Some("InternalFailure"),
        "{deleted:?}"
    );
    assert_eq!(deleted.raw_response().unwrap().status().as_u16(), 500);

    // Syncs that work again change nothing: what the failed one lost may be gone.
    disk.heal();
    let again = send("healed").await.unwrap_err();
    let service = again.as_service_error().expect("an answer from the node");
    assert_eq!(
        failed(service).as_deref(),
        Some("ServiceUnavailable"),
        "{again:?}"
    );
}

/// The settings and the stats and usage history (sled, beside the message log) meet the
/// same rule as the log: a change is answered as saved only once it is synced with a real
/// fsync (sled's own flush is `sync_file_range`, which a failing disk never reports: before
/// the fix this `setcfg` answered Success), and a failed sync is final until a restart. The
/// whole data directory sits on the failing disk here.
#[tokio::test]
async fn settings_and_history_records_are_answered_as_failed_once_their_sync_failed() {
    let disk = FailingSyncs::mount();
    let data = tempfile::tempdir_in(disk.dir()).unwrap();
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("node.toml");
    std::fs::write(&config, "stats_record_secs = 1\n").unwrap();
    let flags = ["--config", config.to_str().unwrap()];
    let node = Node::start_in(data, &flags);
    let mut admin = node.admin().await;
    let set = |secs: u64| json!({"cmd": "setcfg", "saved-session-timeout-secs": secs});
    admin.success(set(60)).await;
    let synced_record = stats_times(&mut admin, 1).await[0];

    disk.fail_syncs();
    let reply = admin.request(set(61)).await;
    assert_eq!(code(&reply), 506, "saved, but not synced: {reply}");
    node.wait_for_log("the settings and history store failed a sync");
    node.wait_for_log("recording stats failed");
    // A sync that works again changes nothing: what the failed one lost may be gone.
    disk.heal();
    let reply = admin.request(set(62)).await;
    assert_eq!(code(&reply), 506, "still not trusted: {reply}");
    drop(admin);

    // After a restart the node reads back what the disk has, and trusts it again.
    let node = node.restart(&flags);
    let mut admin = node.admin().await;
    let kept = stats_times(&mut admin, 1).await;
    assert!(kept.contains(&synced_record), "{kept:?}");
    let settings = admin.success(json!({"cmd": "getcfg"})).await;
    assert!(
        settings["csv"]
            .as_str()
            .unwrap()
            .lines()
            .any(|line| line.starts_with("saved-session-timeout-secs,w,6")),
        "{settings}"
    );
    admin.success(set(63)).await;
}

/// Today's stats records' times, once there are at least `count` (a record a second here).
async fn stats_times(admin: &mut Client, count: usize) -> Vec<u64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let (year, month, day) = qe_shared::calendar::civil_from_days(now / 86_400);
        let ask = json!({"cmd": "getstats", "average": false,
                         "year": year, "month": month, "day": day});
        let times = qe_tests::record_times(&admin.success(ask).await);
        if times.len() >= count {
            return times;
        }
        assert!(std::time::Instant::now() < deadline, "no stats records");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The control plane's own store (sled, on one host) keeps the same rule: an API write is
/// answered only once synced for real, and after a failed sync every write is answered as
/// failed (500), also once the disk works again, until a restart reads back what is there.
/// Before the fix a write on the failing disk answered 201.
#[tokio::test]
async fn the_control_planes_store_answers_writes_as_failed_once_a_sync_failed() {
    let disk = FailingSyncs::mount();
    let dir = tempfile::tempdir_in(disk.dir()).unwrap();
    let cp = qe_tests::ControlPlane::start_in(dir, "");
    let account = |name: &str| json!({ "name": name }).to_string();
    let (status, made) = cp
        .call("POST", "/v1/accounts", Some(&account("kept")))
        .await;
    assert_eq!(status, 201, "{made}");

    disk.fail_syncs();
    let (status, reply) = cp
        .call("POST", "/v1/accounts", Some(&account("lost")))
        .await;
    assert_eq!(status, 500, "may not last: {reply}");
    disk.heal();
    let (status, reply) = cp
        .call("POST", "/v1/accounts", Some(&account("still")))
        .await;
    assert_eq!(status, 500, "not trusted until a restart: {reply}");

    let cp = cp.restart();
    let (status, listed) = cp.call("GET", "/v1/accounts", None).await;
    assert_eq!(status, 200, "{listed}");
    assert!(listed.to_string().contains("\"kept\""), "{listed}");
    let (status, made) = cp
        .call("POST", "/v1/accounts", Some(&account("after")))
        .await;
    assert_eq!(status, 201, "{made}");
}
