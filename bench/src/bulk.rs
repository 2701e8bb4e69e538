//! `bench bulk`: what the node's bulk commands beyond the manual cost with many stored
//! messages: `redrive` of a whole dead letter queue, `purge` of the whole queue, a `purge` of a
//! few beside many (it must cost the few), and the restart after each (the log then holds one
//! record per redriven message and one record for the purge).

use crate::client::{next_text, Socket};
use crate::node::{admin_login, Node, NodeConfig};
use crate::workload::store;
use futures::{SinkExt, StreamExt};
use std::time::{Duration, Instant};
use yawc::frame::Frame;

/// Requests an administrator keeps in flight while it moves messages one by one.
const WINDOW: usize = 256;

pub async fn bulk(config: &NodeConfig, messages: usize) {
    let dir = tempfile::tempdir_in(&config.data_root).unwrap();
    let node = Node::start(config, dir.path());
    let ids = store(config, &node.url(), messages).await;
    println!("stored {} messages of 100 B at durability 1", ids.len());
    let mut admin = admin_login(&config.wire, &node.url()).await;

    let moves = ids
        .iter()
        .map(|id| format!(r#"{{"cmd":"movetodlq","id":"{id}"}}"#));
    let (time, cpu) = costs(&node, pipelined(&mut admin, moves)).await;
    report("movetodlq, one request each", ids.len(), time, cpu);

    let few = store(config, &node.url(), 10).await.len();
    let (reply, time, cpu) =
        command(&node, &mut admin, r#"{"cmd":"purge","scope":"waiting"}"#).await;
    assert!(reply.contains(&format!(r#""purged":{few}"#)), "{reply}");
    report(
        "purge of 10 waiting beside the dead letter queue",
        few,
        time,
        cpu,
    );

    let (reply, time, cpu) = command(&node, &mut admin, r#"{"cmd":"redrive"}"#).await;
    assert!(
        reply.contains(&format!(r#""redriven":{}"#, ids.len())),
        "{reply}"
    );
    report(
        "redrive of the whole dead letter queue",
        ids.len(),
        time,
        cpu,
    );

    drop(admin);
    node.kill();
    let node = Node::start(config, dir.path());
    println!(
        "after SIGKILL, restart to serving: {:.2}s",
        node.startup.as_secs_f64()
    );
    let mut admin = admin_login(&config.wire, &node.url()).await;

    let disk_before = disk(dir.path());
    let (reply, time, cpu) =
        command(&node, &mut admin, r#"{"cmd":"purge","scope":"waiting"}"#).await;
    assert!(
        reply.contains(&format!(r#""purged":{}"#, ids.len())),
        "{reply}"
    );
    report("purge of every waiting message", ids.len(), time, cpu);
    println!(
        "the purge's log record: {} KB ({:.1} B/message)",
        (disk(dir.path()) - disk_before) >> 10,
        (disk(dir.path()) - disk_before) as f64 / ids.len() as f64
    );
    drop(admin);
    node.kill();
    let node = Node::start(config, dir.path());
    println!(
        "after SIGKILL, restart to serving: {:.2}s",
        node.startup.as_secs_f64()
    );
    node.kill();
}

/// How long `work` took, and the node's CPU time meanwhile.
async fn costs<T>(node: &Node, work: impl std::future::Future<Output = T>) -> (Duration, Duration) {
    let (started, cpu) = (Instant::now(), node.cpu_time());
    work.await;
    (started.elapsed(), node.cpu_time() - cpu)
}

/// Sends one request and waits for its reply: the reply, the time and the node's CPU time.
async fn command(node: &Node, admin: &mut Socket, request: &str) -> (String, Duration, Duration) {
    let (started, cpu) = (Instant::now(), node.cpu_time());
    admin.send(Frame::text(request.to_string())).await.unwrap();
    let reply = next_text(admin).await.expect("a reply");
    let costs = (started.elapsed(), node.cpu_time() - cpu);
    assert!(reply.contains("Success."), "{request}: {reply}");
    (reply, costs.0, costs.1)
}

/// Sends every request with at most `WINDOW` unanswered, each of which must succeed.
async fn pipelined(admin: &mut Socket, requests: impl Iterator<Item = String>) {
    let (mut sink, mut stream) = admin.split();
    let mut unanswered = 0;
    for request in requests {
        if unanswered == WINDOW {
            sink.flush().await.unwrap();
            while unanswered > WINDOW / 2 {
                let reply = next_text(&mut stream).await.expect("a reply");
                assert!(reply.contains("Success."), "{reply}");
                unanswered -= 1;
            }
        }
        sink.feed(Frame::text(request)).await.unwrap();
        unanswered += 1;
    }
    sink.flush().await.unwrap();
    for _ in 0..unanswered {
        let reply = next_text(&mut stream).await.expect("a reply");
        assert!(reply.contains("Success."), "{reply}");
    }
}

fn report(what: &str, messages: usize, time: Duration, cpu: Duration) {
    println!(
        "{what}: {messages} in {:.3}s, node CPU {:.3}s ({:.2} µs/message)",
        time.as_secs_f64(),
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / messages as f64
    );
}

/// Bytes of the message log's segment files as written (not their preallocated size: the
/// segments are made full of zeros ahead of use, so their length says nothing).
fn disk(data_dir: &std::path::Path) -> u64 {
    std::fs::read_dir(data_dir.join("messages"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| written_bytes(&std::fs::read(p).unwrap()))
        .sum()
}

/// Where the written part of a segment ends: records are `[len: u32 LE][crc][kind][payload]`,
/// and only zeros follow the last one.
fn written_bytes(segment: &[u8]) -> u64 {
    let mut offset = 0;
    while offset + 8 <= segment.len() {
        let len = u32::from_le_bytes(segment[offset..offset + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        offset += 8 + len;
    }
    offset as u64
}
