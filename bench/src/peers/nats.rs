//! NATS JetStream (`nats-server` 2.9 from Debian, client `async-nats`).
//!
//! One work-queue stream (a message is removed once acked): memory storage at durability 0,
//! file storage at 1. A publish is a JetStream publish awaiting its PubAck. The subscribers
//! share one durable pull consumer with explicit acks; each pulls batches of its capacity,
//! and the consumer lets subscribers × capacity messages wait for their acks.

use super::closed_loop::{self, Inbox, Lane, Measured, Published};
use super::server::{free_port, pinned, Probe, Server};
use super::Settings;
use crate::workload::Workload;
use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType};
use futures::StreamExt;

const STREAM: &str = "BENCH";
const SUBJECT: &str = "bench";
const CONSUMER: &str = "workers";

/// Why there is no durability 2.
pub const NO_SYNC: &str =
    "nats-server 2.9 has no fsync per publish (sync_interval: always came in 2.10)";

pub async fn run(
    settings: &Settings,
    workload: Workload,
    size: usize,
    durability: u8,
) -> Result<Measured, &'static str> {
    let storage = match durability {
        0 => StorageType::Memory,
        1 => StorageType::File,
        _ => return Err(NO_SYNC),
    };
    let server = start(settings).await;
    let port = server.port;
    prepare(port, storage, workload).await;
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

/// The server with JetStream on, on one Go thread (as the node and Erlang get one
/// scheduler): `GOMAXPROCS=1`.
async fn start(settings: &Settings) -> Server {
    let dir = tempfile::tempdir_in(&settings.data_root).unwrap();
    let port = free_port();
    let mut command = pinned(settings.server_cpu, "nats-server");
    command
        .args(["--addr", "127.0.0.1", "--port", &port.to_string()])
        .arg("--jetstream")
        .arg("--store_dir")
        .arg(dir.path().join("jetstream"))
        .env("GOMAXPROCS", "1");
    // A NATS server greets every connection with its INFO line.
    let probe = Probe {
        send: b"",
        expect: b"INFO ",
    };
    Server::start(command, dir, port, probe, Vec::new()).await
}

async fn connect(port: u16) -> async_nats::jetstream::Context {
    let client = async_nats::connect(format!("127.0.0.1:{port}"))
        .await
        .expect("connect to nats-server");
    async_nats::jetstream::new(client)
}

async fn prepare(port: u16, storage: StorageType, workload: Workload) {
    let jetstream = connect(port).await;
    let stream = jetstream
        .create_stream(stream::Config {
            name: STREAM.to_string(),
            subjects: vec![SUBJECT.to_string()],
            retention: RetentionPolicy::WorkQueue,
            storage,
            ..Default::default()
        })
        .await
        .expect("the stream");
    stream
        .create_consumer(pull::Config {
            durable_name: Some(CONSUMER.to_string()),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: (workload.subscribers * workload.capacity) as i64,
            ..Default::default()
        })
        .await
        .expect("the consumer");
}

async fn publisher(port: u16, lane: Lane) -> Published {
    let jetstream = connect(port).await;
    closed_loop::publish(lane, |body| {
        let jetstream = jetstream.clone();
        async move {
            let ack = jetstream.publish(SUBJECT, body).await.expect("publish");
            ack.await.expect("a PubAck");
        }
    })
    .await
}

async fn subscriber(port: u16, mut inbox: Inbox, capacity: usize) -> Inbox {
    let jetstream = connect(port).await;
    let stream = jetstream.get_stream(STREAM).await.expect("the stream");
    let consumer: PullConsumer = stream.get_consumer(CONSUMER).await.expect("the consumer");
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(capacity)
        .messages()
        .await
        .expect("pull");
    loop {
        let message = tokio::select! {
            message = messages.next() => message.expect("the pull goes on").expect("a message"),
            _ = inbox.stopped() => return inbox,
        };
        inbox.deliver(&message.payload);
        message.ack().await.expect("ack");
    }
}
