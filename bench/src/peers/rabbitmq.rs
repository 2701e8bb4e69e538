//! RabbitMQ (`rabbitmq-server` 3.10 from Debian, client `lapin`).
//!
//! Every publisher's channel is in confirm mode, at every durability, so that a publish is
//! answered as it is by our node (a publish is "confirmed" once its basic.ack came).
//! Durability: 0 a classic queue, not durable, transient messages; 1 a durable classic
//! queue, persistent messages; 2 a quorum queue (it fsyncs its log before confirming).
//! Subscribers: `basic.qos` prefetch = capacity, manual ack of every delivery.
//!
//! The node runs on its own node name, ports and epmd, so a system instance that the Debian
//! package may have started neither answers nor interferes.

use super::closed_loop::{self, Inbox, Lane, Measured, Published};
use super::server::{free_port, pinned, wait_for_listener, Probe, Server};
use super::Settings;
use crate::workload::Workload;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::process::Stdio;

const QUEUE: &str = "bench";

/// Debian's start script itself, not /usr/sbin's wrapper (which switches to the rabbitmq
/// user and the system's directories).
const START_SCRIPT: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

/// One scheduler (and one dirty CPU scheduler), as the node and nats-server get one
/// thread; no binding of schedulers to cores (taskset already holds them), and no busy
/// waiting, which would count idle spinning as CPU spent on messages.
const ERLANG_ARGS: &str = "+S 1:1 +SDcpu 1:1 +sbt u +sbwt none +sbwtdcpu none +sbwtdio none";

pub async fn run(
    settings: &Settings,
    workload: Workload,
    size: usize,
    durability: u8,
) -> Result<Measured, &'static str> {
    let server = start(settings).await;
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", server.port);
    declare_queue(&url, durability).await;
    let (subscriber_url, publisher_url) = (url.clone(), url);
    Ok(closed_loop::run(
        &server,
        workload,
        size,
        settings.time,
        move |inbox, capacity| subscriber(subscriber_url.clone(), inbox, capacity),
        move |lane| publisher(publisher_url.clone(), durability, lane),
    )
    .await)
}

async fn start(settings: &Settings) -> Server {
    let dir = tempfile::tempdir_in(&settings.data_root).unwrap();
    let path = |name: &str| dir.path().join(name);
    let (port, distribution_port, epmd_port) = (free_port(), free_port(), free_port());
    std::fs::write(path("rabbitmq.conf"), "log.file.level = warning\n").unwrap();
    std::fs::write(path("enabled_plugins"), "[].\n").unwrap();
    // Read instead of /etc/rabbitmq/rabbitmq-env.conf.
    std::fs::write(path("rabbitmq-env.conf"), "").unwrap();
    // Our own epmd (Erlang's name server) on its own port, stopped with the node.
    let epmd = pinned(settings.server_cpu, "epmd")
        .args(["-port", &epmd_port.to_string(), "-address", "127.0.0.1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // It complains of every probe that connects and says nothing.
        .stderr(Stdio::null())
        .spawn()
        .expect("epmd (Erlang, with rabbitmq-server)");
    wait_for_listener(epmd_port).await;
    let mut command = pinned(settings.server_cpu, START_SCRIPT);
    command
        .env("RABBITMQ_NODENAME", format!("bench{port}@localhost"))
        .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
        .env("RABBITMQ_NODE_PORT", port.to_string())
        .env("RABBITMQ_DIST_PORT", distribution_port.to_string())
        .env("ERL_EPMD_PORT", epmd_port.to_string())
        .env("ERL_EPMD_ADDRESS", "127.0.0.1")
        .env("RABBITMQ_CONF_ENV_FILE", path("rabbitmq-env.conf"))
        .env("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf"))
        .env("RABBITMQ_ADVANCED_CONFIG_FILE", path("advanced.config"))
        .env("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins"))
        .env("RABBITMQ_MNESIA_BASE", path("mnesia"))
        .env("RABBITMQ_LOG_BASE", path("log"))
        .env("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", ERLANG_ARGS)
        // The Erlang cookie is made in $HOME.
        .env("HOME", dir.path());
    // The AMQP listener opens once the broker has booted; it answers the protocol header
    // with a method frame (type 1, connection.start).
    let probe = Probe {
        send: b"AMQP\x00\x00\x09\x01",
        expect: &[1],
    };
    let mut server = Server::start(command, dir, port, probe, vec![epmd]).await;
    server.measure_descendant("beam.smp");
    server
}

async fn channel(url: &str) -> (Connection, Channel) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to rabbitmq-server");
    let channel = connection.create_channel().await.expect("a channel");
    (connection, channel)
}

async fn declare_queue(url: &str, durability: u8) {
    let (connection, channel) = channel(url).await;
    let mut arguments = FieldTable::default();
    if durability == 2 {
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
    }
    let options = QueueDeclareOptions {
        durable: durability > 0,
        ..Default::default()
    };
    channel
        .queue_declare(QUEUE.into(), options, arguments)
        .await
        .expect("the queue");
    connection.close(0, "declared".into()).await.expect("close");
}

async fn publisher(url: String, durability: u8, lane: Lane) -> Published {
    let (connection, channel) = channel(&url).await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm mode");
    // 1 transient, 2 persistent (written to disk by a durable queue).
    let delivery_mode = if durability == 0 { 1 } else { 2 };
    let properties = BasicProperties::default().with_delivery_mode(delivery_mode);
    let published = closed_loop::publish(lane, |body| {
        let (channel, properties) = (channel.clone(), properties.clone());
        async move {
            let options = BasicPublishOptions::default();
            let confirm = channel
                .basic_publish("".into(), QUEUE.into(), options, &body, properties)
                .await
                .expect("publish");
            let confirmation = confirm.await.expect("a confirm");
            assert!(confirmation.is_ack(), "the broker refused a publish");
        }
    })
    .await;
    connection.close(0, "done".into()).await.expect("close");
    published
}

async fn subscriber(url: String, mut inbox: Inbox, capacity: usize) -> Inbox {
    let (connection, channel) = channel(&url).await;
    let prefetch = u16::try_from(capacity).expect("a capacity AMQP can prefetch");
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .expect("prefetch");
    let tag = format!("subscriber-{}", inbox.subscriber);
    let mut deliveries = channel
        .basic_consume(
            QUEUE.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    loop {
        let delivery = tokio::select! {
            delivery = deliveries.next() => delivery.expect("the consumer goes on").expect("a delivery"),
            _ = inbox.stopped() => break,
        };
        inbox.deliver(&delivery.data);
        delivery.ack(BasicAckOptions::default()).await.expect("ack");
    }
    let _ = connection.close(0, "done".into()).await;
    inbox
}
