//! `purge` and `redrive`, the node's commands beyond the manual, with the real binary: counts,
//! notices, durability across `kill -9`, one log record per purge, and a redrive cut short by
//! a kill that leaves every message in exactly one place.

use futures::SinkExt;
use qe_tests::{assert_failure, Client, Node};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Record kinds of the message log (`dataplane/src/store/log/record.rs`).
const MESSAGE: u8 = 1;
/// A message in the dead letter queue with when it went there: what `movetodlq` writes.
const MESSAGE_DEAD: u8 = 9;
const REMOVED: u8 = 2;
const REMOVED_FROM: u8 = 4;
const PURGED: u8 = 5;
const REDRIVEN: u8 = 6;

async fn live_stats(admin: &mut Client) -> String {
    let reply = admin.success(json!({"cmd": "getlivestats"})).await;
    reply["csv"].as_str().unwrap().to_string()
}

async fn publish(publisher: &mut Client, request: Value) -> String {
    let reply = publisher.success(request).await;
    reply["id"].as_str().unwrap().to_string()
}

async fn memory_used(admin: &mut Client) -> u64 {
    let reply = admin.success(json!({"cmd": "getcfg"})).await;
    let csv = reply["csv"].as_str().unwrap();
    let line = csv
        .lines()
        .find(|l| l.starts_with("messages-memory-used,"))
        .unwrap();
    line.rsplit(',').next().unwrap().parse().unwrap()
}

/// Sends every request without waiting, then reads one reply each: many requests in about
/// the time of one round trip each on the node's side only.
async fn pipelined(client: &mut Client, requests: impl IntoIterator<Item = Value>) -> Vec<Value> {
    let mut sent = 0;
    for request in requests {
        let frame = Message::text(request.to_string());
        client.socket().feed(frame).await.unwrap();
        sent += 1;
    }
    client.socket().flush().await.unwrap();
    let mut replies = Vec::with_capacity(sent);
    for _ in 0..sent {
        let reply = client.recv().await;
        assert_eq!(reply["status"], "Success.", "{reply}");
        replies.push(reply);
    }
    replies
}

/// Every id of the queue (`getmsgs`) or the dead letter queue (`getdlqmsgs`), page by page.
async fn all_ids(admin: &mut Client, cmd: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut after = String::new();
    loop {
        let reply = admin
            .success(json!({"cmd": cmd, "after": after, "count": 1600}))
            .await;
        let csv = reply["csv"].as_str().unwrap();
        let page: Vec<String> = csv
            .lines()
            .map(|l| l.split(',').next().unwrap().to_string())
            .collect();
        let Some(last) = page.last() else {
            return ids;
        };
        after = last.clone();
        ids.extend(page);
    }
}

/// The message log's segment files, oldest first.
fn segments(node: &Node) -> Vec<PathBuf> {
    let dir = node.data_dir.path().join("messages");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
}

/// The kinds and lengths of the sound records at the start of `bytes`
/// (`[len: u32 LE][crc: u32 LE][kind: u8][payload]`), up to the zeros that follow the last one
/// or a record torn by a kill. A segment is preallocated in zeros, so a write cut short leaves
/// a length that fits with zeros where its end should be: only the checksum tells it from a
/// record, as it does for the node's recovery, which cuts it off.
fn records(bytes: &[u8]) -> Vec<(u8, usize)> {
    let mut found = Vec::new();
    let mut offset = 0;
    while offset + 9 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap()) as usize;
        if len == 0 || offset + 8 + len > bytes.len() {
            break;
        }
        let crc = u32::from_le_bytes(bytes[offset + 4..offset + 8].try_into().unwrap());
        if crc32c::crc32c(&bytes[offset + 8..offset + 8 + len]) != crc {
            break;
        }
        found.push((bytes[offset + 8], 8 + len));
        offset += 8 + len;
    }
    found
}

fn records_in(path: &Path) -> Vec<(u8, usize)> {
    records(&std::fs::read(path).unwrap())
}

fn count(records: &[(u8, usize)], kind: u8) -> usize {
    records.iter().filter(|(k, _)| *k == kind).count()
}

/// A record in the log's own framing, for the reader's test below.
fn framed(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![kind];
    body.extend_from_slice(payload);
    let mut record = (body.len() as u32).to_le_bytes().to_vec();
    record.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    record.extend_from_slice(&body);
    record
}

#[test]
fn the_segment_reader_stops_at_a_record_torn_by_a_kill() {
    let mut segment = framed(REDRIVEN, &[7; 16]);
    segment.extend(framed(REDRIVEN, &[8; 16]));
    let whole = segment.len();
    segment.extend(framed(REDRIVEN, &[9; 16]));
    // The kill cut the third record's write short: its length fits, zeros stand for its end.
    segment[whole + 20..].fill(0);
    segment.resize(4096, 0);
    assert_eq!(records(&segment), vec![(REDRIVEN, 25), (REDRIVEN, 25)]);
}

#[tokio::test]
async fn a_purge_counts_each_scope_and_tells_holders_of_what_it_takes() {
    let node = Node::start();
    let mut admin = node.admin().await;
    let mut publisher = node.publisher().await;
    let (mut subscriber, _) = node.subscriber(2).await;
    let held = [
        publish(&mut publisher, json!({"body": "h1"})).await,
        publish(&mut publisher, json!({"body": "h2"})).await,
    ];
    for id in &held {
        assert_eq!(subscriber.recv().await["id"], *id);
    }
    for body in ["w1", "w2"] {
        publish(&mut publisher, json!({ "body": body })).await;
    }
    publish(&mut publisher, json!({"body": "w0", "durability": 0})).await;
    for body in ["d1", "d2"] {
        publish(&mut publisher, json!({"body": body, "delay": 3600})).await;
    }
    for body in ["x1", "x2"] {
        let id = publish(&mut publisher, json!({ "body": body })).await;
        admin.success(json!({"cmd": "movetodlq", "id": id})).await;
    }
    // messages, publishers, subscribers, saved, administrators, unacked, dead, delayed, durable
    assert_eq!(live_stats(&mut admin).await, "9,1,1,0,1,2,2,2,8");

    for (scope, purged, stats) in [
        ("waiting", 3, "6,1,1,0,1,2,2,2,6"),
        ("waiting", 0, "6,1,1,0,1,2,2,2,6"),
        ("delayed", 2, "4,1,1,0,1,2,2,0,4"),
        ("dlq", 2, "2,1,1,0,1,2,0,0,2"),
    ] {
        let reply = admin
            .success(json!({"cmd": "purge", "scope": scope, "context": 7}))
            .await;
        assert_eq!(
            reply,
            json!({"status": "Success.", "purged": purged, "context": 7})
        );
        assert_eq!(live_stats(&mut admin).await, stats, "after {scope}");
    }
    publish(&mut publisher, json!({"body": "w3"})).await;
    let reply = admin.success(json!({"cmd": "purge", "scope": "all"})).await;
    assert_eq!(reply["purged"], 3, "all takes the held messages too");
    let mut told: Vec<Value> = vec![subscriber.recv().await, subscriber.recv().await];
    told.sort_by_key(|n| n["id"].as_str().unwrap().to_string());
    assert_eq!(
        told,
        held.iter()
            .map(|id| json!({"deleted": true, "id": id}))
            .collect::<Vec<_>>()
    );
    assert_eq!(live_stats(&mut admin).await, "0,1,1,0,1,0,0,0,0");
    assert_eq!(memory_used(&mut admin).await, 0);
    // The holder's slots are free at once.
    let next = publish(&mut publisher, json!({"body": "next"})).await;
    assert_eq!(subscriber.recv().await["id"], next);

    for bad in [
        json!({"cmd": "purge"}),
        json!({"cmd": "purge", "scope": "held"}),
        json!({"cmd": "purge", "scope": 1}),
    ] {
        assert_failure(&admin.request(bad).await, 400);
    }
    assert_eq!(
        live_stats(&mut admin).await,
        "1,1,1,0,1,1,0,0,1",
        "failures change nothing"
    );
}

#[tokio::test]
async fn a_purge_is_one_record_and_what_it_took_stays_gone_after_a_kill() {
    let node = Node::start();
    let mut admin = node.admin().await;
    let mut publisher = node.publisher().await;
    let requests = (0..40).map(|n| json!({"body": format!("m{n}"), "durability": 2}));
    pipelined(&mut publisher, requests).await;
    for body in ["x1", "x2"] {
        let id = publish(&mut publisher, json!({ "body": body })).await;
        admin.success(json!({"cmd": "movetodlq", "id": id})).await;
    }
    let reply = admin
        .success(json!({"cmd": "purge", "scope": "waiting"}))
        .await;
    assert_eq!(reply["purged"], 40);
    let mut node = node;
    node.kill();
    // A kill -9 keeps everything written: the log holds exactly one purge record, naming the
    // 40 messages (16 bytes each) and the one segment holding them, and no removal.
    let files = segments(&node);
    assert_eq!(files.len(), 1, "{files:?}");
    let written = records_in(&files[0]);
    assert_eq!(count(&written, MESSAGE), 42);
    assert_eq!(
        count(&written, MESSAGE_DEAD),
        2,
        "a move writes the message again"
    );
    assert_eq!(count(&written, REMOVED) + count(&written, REMOVED_FROM), 0);
    assert_eq!(count(&written, PURGED), 1);
    let purge_len = written.iter().find(|(k, _)| *k == PURGED).unwrap().1;
    assert_eq!(purge_len, 8 + 1 + 4 + 4 + 40 * 16);
    assert_eq!(written.len(), 45);

    let node = node.restart(&[]);
    let mut admin = node.admin().await;
    assert_eq!(live_stats(&mut admin).await, "2,0,0,0,1,0,2,0,2");
    assert!(all_ids(&mut admin, "getmsgs").await.is_empty());
    // And purged again after the restart: once is enough.
    let reply = admin.success(json!({"cmd": "purge", "scope": "all"})).await;
    assert_eq!(reply["purged"], 2);
    let node = node.restart(&[]);
    let mut admin = node.admin().await;
    assert_eq!(live_stats(&mut admin).await, "0,0,0,0,1,0,0,0,0");
}

#[tokio::test]
async fn a_redrive_keeps_each_message_and_puts_it_at_the_back() {
    let node = Node::start();
    let mut admin = node.admin().await;
    let mut publisher = node.publisher().await;
    let requests = [
        json!({"body": "text", "publisherkey": "k-1"}),
        json!({"body": "aGVsbG8=", "type": 2, "durability": 2}),
        json!({"body": "third"}),
        json!({"body": "fourth"}),
    ];
    let mut dead = Vec::new();
    for request in requests {
        let id = publish(&mut publisher, request).await;
        admin.success(json!({"cmd": "movetodlq", "id": id})).await;
        let shown = admin.success(json!({"cmd": "getdlqmsg", "id": id})).await;
        dead.push((id, shown["msg"].clone()));
    }
    let waiting = publish(&mut publisher, json!({"body": "waiting"})).await;
    let memory = memory_used(&mut admin).await;

    // Bad requests move nothing.
    let in_queue = waiting.clone();
    let fleeting = publish(&mut publisher, json!({"body": "fleeting", "durability": 0})).await;
    let failures = [
        (json!({"cmd": "redrive", "ids": dead[0].0}), 301),
        (json!({"cmd": "redrive", "ids": []}), 301),
        (
            json!({"cmd": "redrive", "ids": [dead[0].0, "not an id"]}),
            301,
        ),
        (json!({"cmd": "redrive", "ids": [dead[0].0, in_queue]}), 301),
        (json!({"cmd": "redrive", "ids": [fleeting]}), 301),
        (json!({"cmd": "redrive", "count": 0}), 412),
        (json!({"cmd": "redrive", "count": 1.5}), 412),
        (json!({"cmd": "redrive", "count": "1"}), 412),
        (json!({"cmd": "redrive", "count": 1_000_001}), 412),
        (
            json!({"cmd": "redrive", "count": 1, "ids": [dead[0].0]}),
            400,
        ),
    ];
    for (request, code) in failures {
        let reply = admin.request(request.clone()).await;
        assert_failure(&reply, code);
        assert!(reply.get("redriven").is_none(), "{request}: {reply}");
    }
    admin
        .success(json!({"cmd": "delmsg", "id": fleeting}))
        .await;
    assert_eq!(live_stats(&mut admin).await, "5,1,0,0,1,0,4,0,5");

    let by_ids = json!({"cmd": "redrive", "ids": [dead[1].0, dead[1].0], "context": "c"});
    let reply = admin.success(by_ids).await;
    assert_eq!(
        reply,
        json!({"status": "Success.", "redriven": 1, "context": "c"})
    );
    let reply = admin.success(json!({"cmd": "redrive", "count": 2})).await;
    assert_eq!(reply["redriven"], 2, "the two oldest left: text and third");
    let reply = admin.success(json!({"cmd": "redrive"})).await;
    assert_eq!(reply["redriven"], 1);
    let reply = admin.success(json!({"cmd": "redrive"})).await;
    assert_eq!(reply["redriven"], 0, "nothing left");
    assert_eq!(live_stats(&mut admin).await, "5,1,0,0,1,0,0,0,5");
    assert_eq!(
        memory_used(&mut admin).await,
        memory,
        "the same messages, the same memory"
    );

    // Each is back unchanged (id, type, body, publisher key, recdat), behind what waited.
    let (mut subscriber, _) = node.subscriber(5).await;
    let order = [&waiting, &dead[1].0, &dead[0].0, &dead[2].0, &dead[3].0];
    for id in order {
        let delivered = subscriber.recv().await;
        assert_eq!(delivered["id"], **id);
        if let Some((_, shown)) = dead.iter().find(|(d, _)| d == id) {
            assert_eq!(delivered, *shown);
        }
    }
    // Redriven messages ack (and nack) as any other.
    subscriber
        .send_json(&json!({"id": dead[1].0, "ack": 0}))
        .await;
    assert_eq!(subscriber.recv().await["status"], "Success.");
    assert_eq!(live_stats(&mut admin).await, "5,1,1,0,1,4,1,0,5");
}

#[tokio::test]
async fn a_kill_in_the_middle_of_a_large_redrive_leaves_each_message_in_exactly_one_place() {
    const MESSAGES: usize = 20_000;
    let node = Node::start();
    let mut admin = node.admin().await;
    let mut publisher = node.publisher().await;
    let requests = (0..MESSAGES).map(|n| json!({ "body": n.to_string() }));
    let published = pipelined(&mut publisher, requests).await;
    let ids: Vec<String> = published
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    let moves = ids.iter().map(|id| json!({"cmd": "movetodlq", "id": id}));
    pipelined(&mut admin, moves).await;
    assert_eq!(
        live_stats(&mut admin).await,
        format!("{MESSAGES},1,0,0,1,0,{MESSAGES},0,{MESSAGES}")
    );
    // A restart first, so the redrive's records start a segment of their own.
    drop((admin, publisher));
    let mut node = node.restart(&[]);
    let mut admin = node.admin().await;
    let old = segments(&node);
    let new_segments = |node: &Node| -> Vec<PathBuf> {
        let all = segments(node);
        all.into_iter().filter(|s| !old.contains(s)).collect()
    };

    admin.send_json(&json!({"cmd": "redrive"})).await;
    // Under way: the first redrive records are in the log. Kill then.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen == 0 {
        assert!(
            Instant::now() < deadline,
            "the redrive never reached the log"
        );
        for segment in new_segments(&node) {
            let mut head = vec![0u8; 1 << 20];
            let mut file = std::fs::File::open(&segment).unwrap();
            let read = std::io::Read::read(&mut file, &mut head).unwrap();
            head.truncate(read);
            seen += count(&records(&head), REDRIVEN);
        }
    }
    node.kill();
    let written: Vec<(u8, usize)> = new_segments(&node)
        .iter()
        .flat_map(|s| records_in(s))
        .collect();
    let redriven_at_kill = count(&written, REDRIVEN);
    eprintln!("killed with {seen} redrive records seen, {redriven_at_kill} written");
    assert!(redriven_at_kill <= MESSAGES);

    let node = node.restart(&[]);
    let mut admin = node.admin().await;
    let queued = all_ids(&mut admin, "getmsgs").await;
    let dead = all_ids(&mut admin, "getdlqmsgs").await;
    let queued_set: BTreeSet<&String> = queued.iter().collect();
    let dead_set: BTreeSet<&String> = dead.iter().collect();
    assert_eq!(
        queued.len(),
        redriven_at_kill,
        "each redrive record moved one message"
    );
    assert_eq!(
        queued_set.len() + dead_set.len(),
        MESSAGES,
        "never in both, never in neither"
    );
    assert!(queued_set.is_disjoint(&dead_set));
    let all: BTreeSet<&String> = queued_set.union(&dead_set).copied().collect();
    assert_eq!(all, ids.iter().collect());

    // The rest follows, and a subscriber gets a redriven message as published.
    let reply = admin.success(json!({"cmd": "redrive"})).await;
    assert_eq!(reply["redriven"], MESSAGES - redriven_at_kill);
    assert_eq!(
        live_stats(&mut admin).await,
        format!("{MESSAGES},0,0,0,1,0,0,0,{MESSAGES}")
    );
    let (mut subscriber, _) = node.subscriber(1).await;
    let first = subscriber.recv().await;
    let n: usize = first["body"].as_str().unwrap().parse().unwrap();
    assert_eq!(first["id"], ids[n]);
}
