//! The SQS face with Amazon's Rust SDK (`aws-sdk-sqs`, through qe_tests::sqs) against the real
//! node: every action the boto3 test drives, the SDK's typed errors, the MD5s it returns
//! checked against this test's own, and both faces of one queue.

use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName,
    QueueAttributeName, SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;
use md5::{Digest, Md5};
use qe_tests::sqs::{client, delete, queue_attributes, receive, send, SqsEndpoint};
use qe_tests::{login_with, node_of, today, ControlPlane, Node};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The three roles' keys the node is started with.
const PUBLISHER: (&str, &str) = ("AKIARUSTPUBLISHER", "publisher-secret");
const SUBSCRIBER: (&str, &str) = ("AKIARUSTSUBSCRIBER", "subscriber-secret");
const ADMIN: (&str, &str) = ("AKIARUSTADMIN", "admin-secret");

/// The node's flags: its SQS face with the three keys.
fn sqs_flags() -> Vec<String> {
    let mut flags = vec!["--sqs-listen".to_string(), "127.0.0.1:0".to_string()];
    for (role, (id, secret)) in [
        ("publisher", PUBLISHER),
        ("subscriber", SUBSCRIBER),
        ("admin", ADMIN),
    ] {
        flags.extend(["--sqs-key".to_string(), format!("{role}:{id}:{secret}")]);
    }
    flags
}

/// A new node, or `node` started again on its data.
fn started_again(node: Option<Node>) -> Node {
    let flags = sqs_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    match node {
        None => Node::start_with(&flags),
        Some(node) => node.restart(&flags),
    }
}

fn started() -> Node {
    started_again(None)
}

/// The admin's client of `node`'s SQS face, and the queue's URL.
async fn admin_of(node: &Node) -> (Client, String) {
    let url = format!("http://{}", node.sqs_addr());
    let endpoint = SqsEndpoint {
        url: &url,
        ca_pem: None,
        resolve_to: None,
    };
    let admin = client(&endpoint, ADMIN.0, ADMIN.1);
    let queue = queue_url(&admin).await;
    (admin, queue)
}

/// The queue's URL, by GetQueueUrl.
async fn queue_url(sqs: &Client) -> String {
    qe_tests::sqs::lone_queue_url(sqs).await
}

fn md5_hex(data: &[u8]) -> String {
    qe_shared::hex(&Md5::digest(data))
}

/// MD5OfMessageAttributes, computed here as AWS documents it: for each name in order, the
/// name, the type and the value, each after its length (4 bytes, big-endian), the value
/// after a 1 (string) or a 2 (binary).
fn attributes_md5(attributes: &BTreeMap<String, MessageAttributeValue>) -> String {
    fn sized(bytes: &mut Vec<u8>, data: &[u8]) {
        bytes.extend((data.len() as u32).to_be_bytes());
        bytes.extend(data);
    }
    let mut bytes = Vec::new();
    for (name, value) in attributes {
        sized(&mut bytes, name.as_bytes());
        sized(&mut bytes, value.data_type().as_bytes());
        match (value.string_value(), value.binary_value()) {
            (Some(text), _) => {
                bytes.push(1);
                sized(&mut bytes, text.as_bytes());
            }
            (None, Some(blob)) => {
                bytes.push(2);
                sized(&mut bytes, blob.as_ref());
            }
            (None, None) => panic!("an attribute without a value"),
        }
    }
    md5_hex(&bytes)
}

fn attribute(data_type: &str, text: Option<&str>, binary: Option<&[u8]>) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type(data_type)
        .set_string_value(text.map(str::to_string))
        .set_binary_value(binary.map(Blob::new))
        .build()
        .unwrap()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test]
async fn the_rust_sdk_drives_every_action() {
    let node = started();
    let url = format!("http://{}", node.sqs_addr());
    let endpoint = SqsEndpoint {
        url: &url,
        ca_pem: None,
        resolve_to: None,
    };
    let admin = client(&endpoint, ADMIN.0, ADMIN.1);
    let publisher = client(&endpoint, PUBLISHER.0, PUBLISHER.1);
    let subscriber = client(&endpoint, SUBSCRIBER.0, SUBSCRIBER.1);

    // GetQueueUrl and ListQueues; another queue's name is the SDK's QueueDoesNotExist.
    let queue = queue_url(&admin).await;
    assert!(queue.ends_with("/queue"), "{queue}");
    let listed = admin.list_queues().send().await.unwrap();
    assert_eq!(listed.queue_urls(), std::slice::from_ref(&queue));
    let missing = admin
        .get_queue_url()
        .queue_name("other")
        .send()
        .await
        .unwrap_err();
    let missing = missing.into_service_error();
    assert!(missing.is_queue_does_not_exist(), "{missing:?}");

    // SendMessage with attributes of every type: the digests are AWS's.
    let attributes: BTreeMap<String, MessageAttributeValue> = [
        ("trace", attribute("String", Some("abc-123"), None)),
        ("count", attribute("Number", Some("42"), None)),
        ("blob", attribute("Binary", None, Some(&[0, 1, 0xfe, 0xff]))),
        ("kind", attribute("String.custom", Some("é ünïcode"), None)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect();
    let body = "Hello from the Rust SDK — ünïcode and \"quotes\"";
    let before_ms = unix_ms();
    let sent = publisher
        .send_message()
        .queue_url(&queue)
        .message_body(body)
        .set_message_attributes(Some(attributes.clone().into_iter().collect()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        sent.md5_of_message_body(),
        Some(md5_hex(body.as_bytes()).as_str())
    );
    assert_eq!(
        sent.md5_of_message_attributes(),
        Some(attributes_md5(&attributes).as_str())
    );

    // ReceiveMessage: the body, every attribute back as sent, the system attributes.
    let received = subscriber
        .receive_message()
        .queue_url(&queue)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .visibility_timeout(60)
        .send()
        .await
        .unwrap();
    let [message] = received.messages() else {
        panic!("one message: {received:?}");
    };
    assert_eq!(message.body(), Some(body));
    assert_eq!(message.message_id(), sent.message_id());
    assert_eq!(
        message.md5_of_body(),
        Some(md5_hex(body.as_bytes()).as_str())
    );
    let back: BTreeMap<String, MessageAttributeValue> = message
        .message_attributes()
        .unwrap()
        .iter()
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    assert_eq!(back, attributes);
    assert_eq!(
        message.md5_of_message_attributes(),
        Some(attributes_md5(&attributes).as_str())
    );
    let system = message.attributes().unwrap();
    assert_eq!(
        system
            .get(&MessageSystemAttributeName::ApproximateReceiveCount)
            .map(String::as_str),
        Some("1")
    );
    let sent_at: u64 = system[&MessageSystemAttributeName::SentTimestamp]
        .parse()
        .unwrap();
    assert!(
        sent_at + 1 >= before_ms && sent_at <= unix_ms(),
        "{sent_at}"
    );

    // Invisible while held; ChangeMessageVisibility to 0 brings it back, counted twice.
    let again = receive(&subscriber, &queue, 1, 0).await;
    assert!(again.is_empty(), "{again:?}");
    let handle = message.receipt_handle().unwrap();
    subscriber
        .change_message_visibility()
        .queue_url(&queue)
        .receipt_handle(handle)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    let again = subscriber
        .receive_message()
        .queue_url(&queue)
        .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
        .wait_time_seconds(5)
        .send()
        .await
        .unwrap();
    let [message] = again.messages() else {
        panic!("the message again: {again:?}");
    };
    let count =
        &message.attributes().unwrap()[&MessageSystemAttributeName::ApproximateReceiveCount];
    assert_eq!(count, "2");
    // The earlier receive's handle is no longer the message's: its visibility is refused.
    let stale = subscriber
        .change_message_visibility()
        .queue_url(&queue)
        .receipt_handle(handle)
        .visibility_timeout(10)
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(stale.is_message_not_inflight(), "{stale:?}");
    delete(&subscriber, &queue, message).await;
    let bad = subscriber
        .delete_message()
        .queue_url(&queue)
        .receipt_handle("nonsense")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(bad.is_receipt_handle_is_invalid(), "{bad:?}");

    // SendMessageBatch: an entry that fails does not stop the others.
    let entry = |id: &str, body: &str, delay: i32| {
        SendMessageBatchRequestEntry::builder()
            .id(id)
            .message_body(body)
            .delay_seconds(delay)
            .build()
            .unwrap()
    };
    let batch = publisher
        .send_message_batch()
        .queue_url(&queue)
        .entries(entry("a", "first", 0))
        .entries(entry("b", "too late", 901))
        .entries(entry("c", "third", 0))
        .send()
        .await
        .unwrap();
    let mut succeeded: Vec<&str> = batch.successful().iter().map(|s| s.id()).collect();
    succeeded.sort();
    assert_eq!(succeeded, ["a", "c"]);
    assert_eq!(batch.failed().len(), 1, "{batch:?}");
    assert_eq!(
        (
            batch.failed()[0].id(),
            batch.failed()[0].code(),
            batch.failed()[0].sender_fault()
        ),
        ("b", "InvalidParameterValue", true)
    );
    for success in batch.successful() {
        let body = if success.id() == "a" {
            "first"
        } else {
            "third"
        };
        assert_eq!(success.md5_of_message_body(), md5_hex(body.as_bytes()));
    }
    let twice = publisher
        .send_message_batch()
        .queue_url(&queue)
        .entries(entry("same", "x", 0))
        .entries(entry("same", "y", 0))
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(twice.is_batch_entry_ids_not_distinct(), "{twice:?}");

    // DeleteMessageBatch, with a handle that does not read.
    let both = receive(&subscriber, &queue, 10, 5).await;
    let mut bodies: Vec<&str> = both.iter().filter_map(|m| m.body()).collect();
    bodies.sort();
    assert_eq!(bodies, ["first", "third"]);
    let mut deletes = subscriber.delete_message_batch().queue_url(&queue);
    for (n, message) in both.iter().enumerate() {
        deletes = deletes.entries(
            DeleteMessageBatchRequestEntry::builder()
                .id(format!("d{n}"))
                .receipt_handle(message.receipt_handle().unwrap())
                .build()
                .unwrap(),
        );
    }
    let bad_entry = DeleteMessageBatchRequestEntry::builder()
        .id("bad")
        .receipt_handle("nonsense")
        .build()
        .unwrap();
    let deleted = deletes.entries(bad_entry).send().await.unwrap();
    assert_eq!(deleted.successful().len(), 2, "{deleted:?}");
    assert_eq!(
        (deleted.failed()[0].id(), deleted.failed()[0].code()),
        ("bad", "ReceiptHandleIsInvalid")
    );

    // Get/SetQueueAttributes: the node's settings; a value out of range is refused. The queue
    // was made when its node first started, and changed when its settings last were.
    let timestamp = |shown: &HashMap<QueueAttributeName, String>, name| -> u64 {
        shown[&name].parse().unwrap()
    };
    let before = queue_attributes(&admin, &queue).await;
    let created = timestamp(&before, QueueAttributeName::CreatedTimestamp);
    assert!(
        created <= unix_ms() / 1000 && created + 600 > unix_ms() / 1000,
        "{created}"
    );
    assert_eq!(
        timestamp(&before, QueueAttributeName::LastModifiedTimestamp),
        created,
        "never changed"
    );
    let changed_at = unix_ms() / 1000;
    admin
        .set_queue_attributes()
        .queue_url(&queue)
        .attributes(QueueAttributeName::VisibilityTimeout, "40")
        .send()
        .await
        .unwrap();
    let shown = queue_attributes(&admin, &queue).await;
    assert_eq!(shown[&QueueAttributeName::VisibilityTimeout], "40");
    assert_eq!(shown[&QueueAttributeName::ApproximateNumberOfMessages], "0");
    let modified = timestamp(&shown, QueueAttributeName::LastModifiedTimestamp);
    assert!(
        modified >= changed_at && modified <= unix_ms() / 1000,
        "{modified}"
    );
    assert_eq!(
        timestamp(&shown, QueueAttributeName::CreatedTimestamp),
        created
    );
    let refused = admin
        .set_queue_attributes()
        .queue_url(&queue)
        .attributes(QueueAttributeName::VisibilityTimeout, "43201")
        .send()
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some("InvalidAttributeValue"), "{refused:?}");

    // PurgeQueue empties it, as AWS's does: what waits and what is in flight.
    for body in ["to purge", "in flight"] {
        send(&publisher, &queue, body).await;
    }
    let in_flight = receive(&subscriber, &queue, 1, 0).await;
    assert_eq!(in_flight.len(), 1, "{in_flight:?}");
    admin.purge_queue().queue_url(&queue).send().await.unwrap();
    let shown = queue_attributes(&admin, &queue).await;
    for counted in [
        QueueAttributeName::ApproximateNumberOfMessages,
        QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
    ] {
        assert_eq!(shown[&counted], "0", "{counted:?}: {shown:?}");
    }
    let empty = receive(&subscriber, &queue, 10, 0).await;
    assert!(empty.is_empty(), "{empty:?}");

    // Signatures and roles: a wrong secret and a publisher's receive are refused.
    let forger = client(&endpoint, ADMIN.0, "not-the-secret");
    let forged = forger.list_queues().send().await.unwrap_err();
    assert_eq!(forged.code(), Some("SignatureDoesNotMatch"), "{forged:?}");
    let denied = publisher
        .receive_message()
        .queue_url(&queue)
        .send()
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Some("AccessDenied"), "{denied:?}");

    // One queue, two faces: a WebSocket publish is received over SQS; an SQS send is pushed
    // to a WebSocket subscriber, and while it holds it, an SQS receive does not see it.
    let mut websocket_publisher = node.publisher().await;
    let published = websocket_publisher
        .success(json!({"body": "from the WebSocket"}))
        .await;
    let got = receive(&subscriber, &queue, 1, 5).await;
    let [message] = got.as_slice() else {
        panic!("the WebSocket's message: {got:?}");
    };
    assert_eq!(
        (message.body(), message.message_id()),
        (Some("from the WebSocket"), published["id"].as_str())
    );
    delete(&subscriber, &queue, message).await;
    let (mut websocket_subscriber, _) = node.subscriber(1).await;
    let sent = send(&publisher, &queue, "from the Rust SDK").await;
    let pushed = websocket_subscriber
        .recv_within(Duration::from_secs(10))
        .await;
    let pushed = pushed.expect("the SQS message pushed");
    assert_eq!(
        (pushed["id"].as_str(), pushed["body"].as_str()),
        (sent.message_id(), Some("from the Rust SDK"))
    );
    let held = receive(&subscriber, &queue, 10, 0).await;
    assert!(held.is_empty(), "{held:?}");
    let acked = websocket_subscriber
        .success(json!({"id": pushed["id"], "ack": 1}))
        .await;
    assert_eq!(acked["status"], "Success.");
}

/// What the SQS face does is counted as the WebSocket's is: the live counters, the stats
/// history (published, delivered) and the usage records the bills are made of (the SQS
/// port's bytes, both ways). Nothing but SQS moves messages here.
/// A batch's entries are stored together (their records in one write, issue 34), and each
/// one answered as stored is: after a kill -9, every message a SendMessageBatch said it sent
/// comes back exactly once, and none a DeleteMessageBatch said it deleted does.
#[tokio::test]
async fn what_batches_answered_as_stored_outlives_a_kill_9() {
    let node = started();
    let (admin, queue) = admin_of(&node).await;
    let mut sent = Vec::new();
    for batch in 0..5 {
        let mut request = admin.send_message_batch().queue_url(&queue);
        for n in 0..10 {
            let body = format!("{batch}-{n}");
            let entry = SendMessageBatchRequestEntry::builder()
                .id(format!("e{n}"))
                .message_body(&body)
                .build()
                .unwrap();
            request = request.entries(entry);
            sent.push(body);
        }
        let answered = request.send().await.unwrap();
        assert!(answered.failed().is_empty(), "{answered:?}");
        assert_eq!(answered.successful().len(), 10, "{answered:?}");
    }

    let node = started_again(Some(node));
    let (admin, queue) = admin_of(&node).await;
    let mut received = Vec::new();
    while received.len() < sent.len() {
        let asked = admin.receive_message().queue_url(&queue);
        let asked = asked.max_number_of_messages(10).visibility_timeout(600);
        let got = asked.wait_time_seconds(2).send().await.unwrap();
        assert!(
            !got.messages().is_empty(),
            "{} of {} came back",
            received.len(),
            sent.len()
        );
        received.extend(got.messages().iter().cloned());
    }
    let mut bodies: Vec<&str> = received.iter().filter_map(|m| m.body()).collect();
    bodies.sort();
    let mut expected: Vec<&str> = sent.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(bodies, expected, "each sent message once");

    for (chunk, messages) in received[..20].chunks(10).enumerate() {
        let mut request = admin.delete_message_batch().queue_url(&queue);
        for (n, message) in messages.iter().enumerate() {
            let entry = DeleteMessageBatchRequestEntry::builder()
                .id(format!("d{chunk}-{n}"))
                .receipt_handle(message.receipt_handle().unwrap())
                .build()
                .unwrap();
            request = request.entries(entry);
        }
        let deleted = request.send().await.unwrap();
        assert!(deleted.failed().is_empty(), "{deleted:?}");
        assert_eq!(deleted.successful().len(), 10, "{deleted:?}");
    }
    let node = started_again(Some(node));
    let (admin, queue) = admin_of(&node).await;
    let shown = queue_attributes(&admin, &queue).await;
    let count = |name| shown[&name].parse::<u64>().unwrap();
    let visible = count(QueueAttributeName::ApproximateNumberOfMessages);
    let in_flight = count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible);
    assert_eq!(visible + in_flight, 30, "{shown:?}");
}

#[tokio::test]
async fn sqs_traffic_is_counted_in_live_stats_history_and_billed_usage() {
    let cp = ControlPlane::start_with("usage_record_secs = 1\nstats_record_secs = 1\n");
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap();
    let path = format!("/v1/queues/{id}/sqs-keys");
    let (status, key) = cp.call("POST", &path, Some(r#"{"role":"admin"}"#)).await;
    assert_eq!(status, 201, "{key}");
    let endpoint = SqsEndpoint {
        url: key["endpoint"].as_str().unwrap(),
        ca_pem: None,
        resolve_to: None,
    };
    let sqs = client(
        &endpoint,
        key["access_key_id"].as_str().unwrap(),
        key["secret"].as_str().unwrap(),
    );
    let url = key["queue_url"].as_str().unwrap();
    let text = "z".repeat(10_000);
    for _ in 0..3 {
        send(&sqs, url, &text).await;
    }
    let mut received = 0;
    for _ in 0..10 {
        if received == 2 {
            break;
        }
        for message in receive(&sqs, url, 2 - received, 5).await {
            delete(&sqs, url, &message).await;
            received += 1;
        }
    }

    assert_eq!(received, 2, "two of the three received");

    // The usage records: at least the three bodies in, the two out.
    let today = today();
    let usage_path = format!("/v1/usage?from={today}&to={today}&queue={id}");
    let stats_path = format!("/v1/stats?from={today}&to={today}&queue={id}");
    let sum = |answer: &serde_json::Value, list: &str, key: &str| -> u64 {
        let records = answer[list].as_array().unwrap();
        records.iter().filter_map(|r| r[key].as_u64()).sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, usage) = cp.call("GET", &usage_path, None).await;
        let (_, stats) = cp.call("GET", &stats_path, None).await;
        let billed = sum(&usage, "usage", "network_received") > 30_000
            && sum(&usage, "usage", "network_sent") > 20_000;
        let flow = (
            sum(&stats, "stats", "published"),
            sum(&stats, "stats", "delivered"),
        );
        assert!(flow.0 <= 3 && flow.1 <= 2, "counted twice: {stats}");
        if billed && flow == (3, 2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the SQS traffic is not counted:\n{usage}\n{stats}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The live counters: the one message left, of three.
    let mut admin = login_with(
        node_of(&queue),
        &queue["logins"]["admin"],
        "admin",
        json!({}),
    )
    .await;
    let live = admin.success(json!({"cmd": "getlivestats"})).await;
    let messages = live["csv"].as_str().unwrap().split(',').next().unwrap();
    assert_eq!(messages, "1", "{live}");
}

/// `CreatedTimestamp` is when the queue's node first started and `LastModifiedTimestamp` when a
/// setting last changed (a SetQueueAttributes that changes nothing does not count); both are
/// kept across a restart. (A second is waited out, so that "now" would not pass for them.)
#[tokio::test]
async fn the_queues_timestamps_are_its_start_and_its_last_change_and_are_kept() {
    let node = started();
    let (admin, queue) = admin_of(&node).await;
    let timestamps = |shown: HashMap<QueueAttributeName, String>| -> (u64, u64) {
        let read = |name| shown[&name].parse::<u64>().unwrap();
        (
            read(QueueAttributeName::CreatedTimestamp),
            read(QueueAttributeName::LastModifiedTimestamp),
        )
    };
    let (created, modified) = timestamps(queue_attributes(&admin, &queue).await);
    assert_eq!(modified, created, "never changed");
    std::thread::sleep(Duration::from_millis(1100));
    let set = |name: QueueAttributeName, value: &str| {
        let change = admin.set_queue_attributes().queue_url(&queue);
        change.attributes(name, value).send()
    };
    set(QueueAttributeName::DelaySeconds, "0").await.unwrap();
    let (_, unchanged) = timestamps(queue_attributes(&admin, &queue).await);
    assert_eq!(unchanged, created, "a change of nothing");
    set(QueueAttributeName::VisibilityTimeout, "45")
        .await
        .unwrap();
    let (still_created, changed) = timestamps(queue_attributes(&admin, &queue).await);
    assert_eq!(still_created, created);
    assert!(changed > created, "{changed} > {created}");

    let node = started_again(Some(node));
    let (admin, queue) = admin_of(&node).await;
    let shown = queue_attributes(&admin, &queue).await;
    assert_eq!(shown[&QueueAttributeName::VisibilityTimeout], "45");
    assert_eq!(
        timestamps(shown),
        (created, changed),
        "kept across a restart"
    );
}

/// The control plane's account endpoint (docs/sqs.md, *The account's endpoint*) with the Rust
/// SDK, as an application written for SQS uses it: only its endpoint URL and an account's key
/// given. It makes queues (idempotently by name; other attributes are QueueAlreadyExists),
/// sends and receives through the endpoint from tasks sharing one client, lists by prefix in
/// pages, tags, and deletes; an unknown or deleted name is the SDK's typed QueueDoesNotExist.
#[tokio::test]
async fn the_rust_sdk_makes_uses_tags_lists_and_deletes_queues_through_the_control_plane() {
    use aws_sdk_sqs::config::Region;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    let cp = ControlPlane::start();
    let (status, account) = cp
        .call("POST", "/v1/accounts", Some(r#"{"name":"rust sdk"}"#))
        .await;
    assert_eq!(status, 201, "{account}");
    let account = account["id"].as_str().unwrap();
    let keys = format!("/v1/accounts/{account}/sqs-keys");
    let (status, key) = cp.call("POST", &keys, Some(r#"{"role":"admin"}"#)).await;
    assert_eq!(status, 201, "{key}");
    let endpoint_url = key["endpoint"].as_str().unwrap();
    assert_eq!(
        endpoint_url,
        format!("http://{}", cp.addr),
        "the API's port"
    );
    let endpoint = SqsEndpoint {
        url: endpoint_url,
        ca_pem: None,
        resolve_to: None,
    };
    let sqs = client(
        &endpoint,
        key["access_key_id"].as_str().unwrap(),
        key["secret"].as_str().unwrap(),
    );
    // Signed for the local provider's region: CreateQueue makes the queue in it.
    let config = sqs.config().to_builder().region(Region::new("local"));
    let sqs = Client::from_conf(config.build());

    // CreateQueue: two names with a common prefix and one without; each URL is its node's.
    let (orders, orders_eu, billing) = ("rs-orders", "rs-orders-eu", "rs-billing");
    let create = |name: &str, visibility: &str| {
        sqs.create_queue()
            .queue_name(name)
            .attributes(QueueAttributeName::VisibilityTimeout, visibility)
            .attributes(QueueAttributeName::MessageRetentionPeriod, "86400")
            .attributes(
                QueueAttributeName::RedrivePolicy,
                r#"{"maxReceiveCount":"3"}"#,
            )
    };
    let made = create(orders, "45")
        .tags("team", "payments")
        .send()
        .await
        .unwrap();
    let url = made.queue_url().unwrap().to_string();
    let mut urls = BTreeMap::from([(orders, url.clone())]);
    for name in [orders_eu, billing] {
        let made = sqs.create_queue().queue_name(name).send().await.unwrap();
        urls.insert(name, made.queue_url().unwrap().to_string());
    }
    for (name, made) in &urls {
        assert!(made.starts_with("http://127.0.0.1:"), "{name}: {made}");
        assert!(!made.starts_with(endpoint_url), "on its node: {made}");
        let id = made.rsplit('/').next().unwrap();
        let (status, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
        assert_eq!(status, 200, "{queue}");
        assert_eq!(
            (queue["name"].as_str(), queue["account"].as_str()),
            (Some(*name), Some(account)),
            "{queue}"
        );
    }
    let distinct: std::collections::BTreeSet<&String> = urls.values().collect();
    assert_eq!(distinct.len(), 3, "{urls:?}");

    // The same name and attributes: the same URL; other attributes: QueueAlreadyExists, typed.
    let again = create(orders, "45").send().await.unwrap();
    assert_eq!(again.queue_url(), Some(url.as_str()));
    let exists = create(orders, "46").send().await.unwrap_err();
    assert_eq!(exists.code(), Some("QueueAlreadyExists"), "{exists:?}");
    let exists = exists.into_service_error();
    assert!(exists.is_queue_name_exists(), "{exists:?}");

    // GetQueueUrl by name; an unknown name is the SDK's QueueDoesNotExist.
    let does_not_exist = |name: &'static str| {
        let asked = sqs.get_queue_url().queue_name(name).send();
        async move {
            let missing = asked.await.unwrap_err().into_service_error();
            assert!(missing.is_queue_does_not_exist(), "{name}: {missing:?}");
        }
    };
    for (name, made) in &urls {
        let got = sqs.get_queue_url().queue_name(*name).send().await.unwrap();
        assert_eq!(got.queue_url(), Some(made.as_str()));
    }
    does_not_exist("rs-none").await;

    // The attributes it was made with are its settings; messages of AWS's 256 KiB.
    let shown = queue_attributes(&sqs, &url).await;
    let attribute = |name: QueueAttributeName| shown.get(&name).map(String::as_str);
    assert_eq!(attribute(QueueAttributeName::VisibilityTimeout), Some("45"));
    assert_eq!(
        attribute(QueueAttributeName::MaximumMessageSize),
        Some("262144")
    );
    assert_eq!(
        attribute(QueueAttributeName::MessageRetentionPeriod),
        Some("86400")
    );

    // Twenty messages sent from four tasks sharing the client, through the endpoint, then
    // received and deleted by three: each exactly once, and none left.
    let started = std::time::Instant::now();
    let senders = (0..4).map(|task| {
        let (sqs, url) = (sqs.clone(), url.clone());
        tokio::spawn(async move {
            let mut sent = Vec::new();
            for n in 0..5 {
                let body = format!("order {task}-{n}");
                let id = send(&sqs, &url, &body)
                    .await
                    .message_id()
                    .unwrap()
                    .to_string();
                sent.push((id, body));
            }
            sent
        })
    });
    let mut sent: Vec<(String, String)> = Vec::new();
    for task in futures::future::join_all(senders).await {
        sent.extend(task.unwrap());
    }
    sent.sort();
    assert_eq!(sent.len(), 20);
    let received = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let receivers = (0..3).map(|_| {
        let (sqs, url) = (sqs.clone(), url.clone());
        let (received, count) = (received.clone(), count.clone());
        tokio::spawn(async move {
            while count.load(Ordering::SeqCst) < 20 && std::time::Instant::now() < deadline {
                for message in receive(&sqs, &url, 10, 1).await {
                    delete(&sqs, &url, &message).await;
                    let id = message.message_id().unwrap().to_string();
                    let body = message.body().unwrap().to_string();
                    received.lock().unwrap().push((id, body));
                    count.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    });
    for task in futures::future::join_all(receivers).await {
        task.unwrap();
    }
    let mut received = received.lock().unwrap().clone();
    received.sort();
    assert_eq!(received, sent, "each message once");
    let left = receive(&sqs, &url, 10, 1).await;
    assert!(left.is_empty(), "{left:?}");
    println!("20 sent, received and deleted in {:?}", started.elapsed());

    // ListQueues by prefix, in pages of one with NextToken: by name; the third is not in it.
    let mut pages = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = sqs
            .list_queues()
            .queue_name_prefix("rs-orders")
            .max_results(1)
            .set_next_token(token.clone())
            .send()
            .await
            .unwrap();
        pages.push(page.queue_urls().to_vec());
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            break;
        }
        assert!(pages.len() < 5, "{pages:?}");
    }
    assert_eq!(
        pages,
        [vec![url.clone()], vec![urls[orders_eu].clone()]],
        "by name"
    );
    let everything: Vec<String> = sqs
        .list_queues()
        .queue_name_prefix("rs-")
        .max_results(2)
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<String>, _>>()
        .await
        .unwrap();
    assert_eq!(
        everything,
        [urls[billing].as_str(), &url, &urls[orders_eu]],
        "by the SDK's paginator"
    );

    // Tags: kept from CreateQueue, added and replaced, removed.
    let tags = || async {
        let listed = sqs.list_queue_tags().queue_url(&url).send().await.unwrap();
        let tags = listed.tags().cloned().unwrap_or_default();
        tags.into_iter().collect::<BTreeMap<String, String>>()
    };
    let expected = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(tags().await, expected(&[("team", "payments")]));
    sqs.tag_queue()
        .queue_url(&url)
        .tags("env", "test")
        .tags("team", "orders")
        .send()
        .await
        .unwrap();
    assert_eq!(
        tags().await,
        expected(&[("env", "test"), ("team", "orders")])
    );
    sqs.untag_queue()
        .queue_url(&url)
        .tag_keys("env")
        .send()
        .await
        .unwrap();
    assert_eq!(tags().await, expected(&[("team", "orders")]));
    let id = url.rsplit('/').next().unwrap();
    let (_, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(queue["tags"], json!({"team": "orders"}), "{queue}");

    // DeleteQueue: its name is unknown, it is no longer listed, its URL is refused.
    sqs.delete_queue()
        .queue_url(&urls[orders_eu])
        .send()
        .await
        .unwrap();
    does_not_exist("rs-orders-eu").await;
    let listed = sqs
        .list_queues()
        .queue_name_prefix("rs-")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.queue_urls(), [urls[billing].as_str(), &url]);
    let gone = sqs
        .send_message()
        .queue_url(&urls[orders_eu])
        .message_body("too late")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(gone.is_queue_does_not_exist(), "{gone:?}");
}
