//! Redis Streams (`redis-server` 7.0 from Debian, crate `redis` on tokio).
//!
//! A publish is an XADD, each publisher keeping a window of them outstanding on its
//! connection (pipelined). The subscribers are consumers of one group: each reads with
//! XREADGROUP BLOCK, COUNT its capacity, and acks every entry with its own XACK, sent in one
//! pipeline with the next read. Durability: 0 no AOF; 1 AOF with `appendfsync everysec`
//! (Redis writes the AOF before it replies, so a reply survives a process kill); 2
//! `appendfsync always` (synced before the reply). RDB snapshots are off throughout.

use super::closed_loop::{self, Inbox, Lane, Measured, Published};
use super::server::{free_port, pinned, Probe, Server};
use super::Settings;
use crate::workload::Workload;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::TcpSettings;
use redis::streams::StreamReadReply;
use redis::{AsyncConnectionConfig, IntoConnectionInfo};
use std::time::Duration;

const STREAM: &str = "bench";
const GROUP: &str = "workers";

/// Entries a stream keeps (XADD MAXLEN ~): acked entries stay in a stream until trimmed,
/// and a queue that never trims grows without end. The undelivered entries are always the
/// newest, and at most publishers × window (1,024 in W5) of them exist, so trimming to this
/// never drops one.
const KEEP: usize = 10_000;

/// How long a subscriber's XREADGROUP blocks before it asks again.
const BLOCK_MS: usize = 1_000;

pub async fn run(
    settings: &Settings,
    workload: Workload,
    size: usize,
    durability: u8,
) -> Result<Measured, &'static str> {
    let server = start(settings, durability).await;
    let port = server.port;
    let mut connection = connect(port).await;
    let _: () = redis::cmd("XGROUP")
        .arg(&["CREATE", STREAM, GROUP, "0", "MKSTREAM"][..])
        .query_async(&mut connection)
        .await
        .expect("the consumer group");
    Ok(closed_loop::run(
        &server,
        workload,
        size,
        settings.time,
        move |inbox, capacity| subscriber(port, inbox, capacity),
        move |lane| publisher(port, lane),
    )
    .await)
}

async fn start(settings: &Settings, durability: u8) -> Server {
    let dir = tempfile::tempdir_in(&settings.data_root).unwrap();
    let port = free_port();
    let aof = match durability {
        0 => "appendonly no",
        1 => "appendonly yes\nappendfsync everysec",
        _ => "appendonly yes\nappendfsync always",
    };
    let config = format!(
        "bind 127.0.0.1\nport {port}\ndir {}\nsave \"\"\n{aof}\nprotected-mode no\ndaemonize no\n",
        dir.path().display()
    );
    let config_file = dir.path().join("redis.conf");
    std::fs::write(&config_file, config).unwrap();
    let mut command = pinned(settings.server_cpu, "redis-server");
    command.arg(&config_file);
    // PING answers +PONG only once the server is loaded and serving.
    let probe = Probe {
        send: b"PING\r\n",
        expect: b"+PONG",
    };
    Server::start(command, dir, port, probe, Vec::new()).await
}

async fn connect(port: u16) -> MultiplexedConnection {
    let address = format!("redis://127.0.0.1:{port}/").into_connection_info();
    // Without TCP_NODELAY (redis-rs' default, unlike the other clients here) Nagle holds a
    // pipelined request back until the previous one is acknowledged.
    let address = address
        .unwrap()
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    let client = redis::Client::open(address).unwrap();
    // A blocked XREADGROUP answers late by design; the default 500 ms would cut it off.
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect to redis-server")
}

async fn publisher(port: u16, lane: Lane) -> Published {
    let connection = connect(port).await;
    closed_loop::publish(lane, |body| {
        let mut connection = connection.clone();
        async move {
            let _: String = redis::cmd("XADD")
                .arg(STREAM)
                .arg(&["MAXLEN", "~"][..])
                .arg(KEEP)
                .arg("*")
                .arg("body")
                .arg(&body[..])
                .query_async(&mut connection)
                .await
                .expect("XADD");
        }
    })
    .await
}

async fn subscriber(port: u16, mut inbox: Inbox, capacity: usize) -> Inbox {
    let mut connection = connect(port).await;
    let consumer = format!("subscriber-{}", inbox.subscriber);
    let mut unacked: Vec<String> = Vec::new();
    loop {
        let mut pipeline = redis::pipe();
        for id in unacked.drain(..) {
            pipeline.cmd("XACK").arg(STREAM).arg(GROUP).arg(id).ignore();
        }
        pipeline
            .cmd("XREADGROUP")
            .arg(&["GROUP", GROUP, &consumer, "COUNT"][..])
            .arg(capacity)
            .arg("BLOCK")
            .arg(BLOCK_MS)
            .arg(&["STREAMS", STREAM, ">"][..]);
        let read = pipeline.query_async::<(Option<StreamReadReply>,)>(&mut connection);
        let (reply,) = tokio::select! {
            reply = read => reply.expect("XREADGROUP"),
            _ = inbox.stopped() => return inbox,
        };
        for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
            let body: Vec<u8> = entry.get("body").expect("a body field");
            inbox.deliver(&body);
            unacked.push(entry.id);
        }
    }
}
