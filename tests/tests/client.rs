//! The Rust client library (`client/`, crate `qe-client`) against the real node: pipelined
//! publishing, every refusal as its typed error, subscribers that resume (or start afresh)
//! while a TCP proxy cuts their connection mid-stream, admin paging over thousands of
//! messages, the copy queue, TLS with compression, and the control plane's API.

use futures::{StreamExt, TryStreamExt};
use qe_client::{
    Admin, Body, Code, ControlPlane, CopyEvent, CopyPublisher, CopySubscriber, Credentials, Day,
    Delivery, Durability, Endpoint, Error, Event, Message, MessageId, Page, Publisher, Reconnect,
    Setting, Subscriber,
};
use qe_tests::{test_ca, Node, ADMIN, PROMPT, PUBLISHER, SUBSCRIBER};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

fn login((name, password): (&str, &str)) -> Credentials {
    Credentials::new(name, password)
}

fn endpoint(url: &str) -> Endpoint {
    Endpoint::new(url).unwrap()
}

/// The subscriber's next event; fails the test if none comes promptly or the stream fails.
async fn next_event(subscriber: &mut Subscriber) -> Event {
    tokio::time::timeout(PROMPT, subscriber.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("no error")
}

/// `future`'s output; fails the test if it does not come promptly.
async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(PROMPT, future)
        .await
        .expect("done in time")
}

/// The next delivery, skipping nothing: anything else fails the test.
async fn next_delivery(subscriber: &mut Subscriber) -> Delivery {
    match next_event(subscriber).await {
        Event::Message(delivery) => delivery,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

fn code_of<T: std::fmt::Debug>(result: Result<T, Error>) -> (Code, bool) {
    match result {
        Err(Error::Refused { code, .. }) => (code, true),
        Err(Error::Invalid { code, .. }) => (code, false),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Refused by the queue with `code`.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: Result<T, Error>, code: Code) {
    assert_eq!(code_of(result), (code, true));
}

/// Refused by the client, before sending, with `code`.
#[track_caller]
fn invalid<T: std::fmt::Debug>(result: Result<T, Error>, code: Code) {
    assert_eq!(code_of(result), (code, false));
}

/// A TCP proxy in front of a node, whose connections the test can cut (both sockets
/// dropped at once, as a network failure would), whose upstream it can move, and which can
/// lose the node's bytes on the way (read from the node, never passed on).
struct Proxy {
    addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    /// Each connection, and whether it loses what the node sends (read, dropped, and kept in
    /// `lost`).
    pipes: Arc<Mutex<Vec<Pipe>>>,
    /// The bytes lost so far.
    lost: watch::Sender<Vec<u8>>,
    accept: JoinHandle<()>,
}

/// A proxied connection's task, and whether it loses what the node sends.
type Pipe = (AbortHandle, Arc<AtomicBool>);

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let upstream = Arc::new(Mutex::new(upstream));
        let pipes = Arc::new(Mutex::new(Vec::new()));
        let lost = watch::Sender::new(Vec::new());
        let accept = tokio::spawn({
            let (upstream, pipes, lost) = (upstream.clone(), pipes.clone(), lost.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let target = *upstream.lock().unwrap();
                    let losing = Arc::new(AtomicBool::new(false));
                    let (flag, lost) = (losing.clone(), lost.clone());
                    let pipe = tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(target).await {
                            pipe(client, server, flag, lost).await;
                        }
                    });
                    pipes.lock().unwrap().push((pipe.abort_handle(), losing));
                }
            }
        });
        Proxy {
            addr,
            upstream,
            pipes,
            lost,
            accept,
        }
    }

    fn url(&self) -> String {
        format!("ws://{}/", self.addr)
    }

    /// Cuts every connection made so far; new ones go through.
    fn cut(&self) {
        for (pipe, _) in self.pipes.lock().unwrap().drain(..) {
            pipe.abort();
        }
    }

    fn point_at(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
    }

    /// From now on, what the node sends on the connections made so far is lost on the way
    /// (what the client sends still goes through).
    fn lose_what_the_node_sends(&self) {
        for (_, losing) in self.pipes.lock().unwrap().iter() {
            losing.store(true, Ordering::SeqCst);
        }
    }

    /// Waits until `count` deliveries (frames with a body) were lost.
    async fn lost_deliveries(&self, count: usize) {
        let bodies = |bytes: &Vec<u8>| bytes.windows(6).filter(|w| w == b"\"body\"").count();
        let mut lost = self.lost.subscribe();
        tokio::time::timeout(PROMPT, lost.wait_for(|bytes| bodies(bytes) >= count))
            .await
            .expect("the node sent them")
            .unwrap();
    }
}

/// Passes bytes both ways until either side ends (the node's are dropped while `losing`).
async fn pipe(
    client: TcpStream,
    server: TcpStream,
    losing: Arc<AtomicBool>,
    lost: watch::Sender<Vec<u8>>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = tokio::io::copy(&mut client_read, &mut server_write);
    let down = async {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = server_read.read(&mut buffer).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            match losing.load(Ordering::SeqCst) {
                true => lost.send_modify(|bytes| bytes.extend_from_slice(&buffer[..n])),
                false => client_write.write_all(&buffer[..n]).await?,
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Quick retries, for tests: the defaults wait up to seconds. 109 is retried for up to about
/// 3 s, in case a loaded machine is slow to see the old connection drop.
/// Publishes `m0`, `m1`, … at durability 2, pipelined; their ids, each confirmed.
async fn publish_durable(publisher: &Publisher, count: usize) -> Vec<MessageId> {
    let messages =
        (0..count).map(|n| Message::text(format!("m{n}")).durability(Durability::Immediate));
    let published = publisher.publish_all(messages).await;
    published.into_iter().map(Result::unwrap).collect()
}

fn quick_reconnect() -> Reconnect {
    Reconnect {
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(200),
        resume_attempts: 20,
        ..Reconnect::default()
    }
}

#[tokio::test]
async fn pipelined_publishes_are_each_matched_to_their_reply() {
    let node = Node::start();
    let endpoint = endpoint(&node.url());
    let publisher = Publisher::builder(&endpoint, login(PUBLISHER))
        .max_in_flight(256)
        .connect()
        .await
        .unwrap();
    let mut subscriber = Subscriber::connect(&endpoint, login(SUBSCRIBER), 1024)
        .await
        .unwrap();

    // Durability 2 waits for a sync and holds back the replies after it: many in flight.
    const COUNT: usize = 2000;
    let mut pending = Vec::new();
    let mut most_in_flight = 0;
    for i in 0..COUNT {
        let durability = match i % 4 {
            0 => Durability::Immediate,
            1 => Durability::None,
            _ => Durability::Eventual,
        };
        let message = Message::text(format!("m{i}")).durability(durability);
        pending.push(publisher.send(message).await.unwrap());
        most_in_flight = most_in_flight.max(publisher.in_flight());
    }
    assert!(
        (2..=256).contains(&most_in_flight),
        "pipelined within the window: {most_in_flight}"
    );
    let mut ids = Vec::new();
    for reply in pending {
        ids.push(reply.await.unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in publish order");
    assert_eq!(publisher.in_flight(), 0);

    // Each id is the one of the message it answered: the subscriber sees id and body.
    let mut bodies = HashMap::new();
    let mut acks = Vec::new();
    while bodies.len() < COUNT {
        let delivery = next_delivery(&mut subscriber).await;
        bodies.insert(delivery.id().clone(), delivery.text().unwrap().to_string());
        acks.push(tokio::spawn(async move { delivery.ack().await }));
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(bodies[id], format!("m{i}"), "{id}");
    }
    for ack in acks {
        within(ack).await.unwrap().unwrap();
    }

    // A batch, and the results in the messages' order, a refusal among them.
    let batch = vec![
        Message::text("a"),
        Message::text("b").delay_secs(172_801),
        Message::binary(vec![0, 159, 146, 150, 255]),
    ];
    let results = publisher.publish_all(batch).await;
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    invalid(results[1].clone(), Code::InvalidDelay);
    let a = next_delivery(&mut subscriber).await;
    let binary = next_delivery(&mut subscriber).await;
    assert_eq!(a.id(), results[0].as_ref().unwrap());
    assert_eq!(binary.body(), &Body::Binary(vec![0, 159, 146, 150, 255]));
    a.ack().await.unwrap();
    binary.ack().await.unwrap();

    // Logout waits for the ack in flight; then the stream ends.
    let last = publisher.publish(Message::text("last")).await.unwrap();
    let delivery = next_delivery(&mut subscriber).await;
    assert_eq!(delivery.id(), &last);
    let ack = tokio::spawn(async move { delivery.ack().await });
    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    within(subscriber.logout()).await.unwrap();
    within(ack).await.unwrap().unwrap();
    let stats = admin.live_stats().await.unwrap();
    assert_eq!((stats.messages, stats.subscribers), (0, 0), "{stats:?}");
}

#[tokio::test]
async fn every_refusal_surfaces_as_its_code() {
    let node = Node::start();
    let endpoint = endpoint(&node.url());
    let publisher = Publisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();

    // Caught by the client: nothing is sent.
    invalid(
        publisher
            .publish(Message::text("x").delay_secs(172_801))
            .await,
        Code::InvalidDelay,
    );
    invalid(
        publisher
            .publish(Message::text("x").publisher_key("has space"))
            .await,
        Code::InvalidPublisherKey,
    );
    invalid(
        publisher.publish(Message::base64("%%%")).await,
        Code::BodyNotBase64,
    );
    // The same, sent as they are: the queue's own answers.
    refused(
        publisher
            .publish(Message::text("x").delay_secs(172_801).unchecked())
            .await,
        Code::InvalidDelay,
    );
    refused(
        publisher
            .publish(Message::text("x").publisher_key("has space").unchecked())
            .await,
        Code::InvalidPublisherKey,
    );
    refused(
        publisher.publish(Message::base64("%%%").unchecked()).await,
        Code::BodyNotBase64,
    );
    let raw = |value: serde_json::Value| value.as_object().unwrap().clone();
    for (fields, code) in [
        (json!({"body": 12}), Code::InvalidBody),
        (json!({"body": "x", "type": 0}), Code::InvalidType),
        (
            json!({"body": "x", "durability": 3}),
            Code::InvalidDurability,
        ),
        (json!({"nobody": "x"}), Code::MissingBody),
    ] {
        refused(publisher.publish_raw(raw(fields)).await, code);
    }
    let reply = publisher
        .publish_raw(raw(json!({"body": "raw"})))
        .await
        .unwrap();
    assert_eq!(reply["status"], "Success.");

    // The copy queue refuses what only a distribute queue takes.
    let copy = CopyPublisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();
    let options = [
        (Message::text("x").delay_secs(5), Code::DelayOnCopy),
        (
            Message::text("x").durability(Durability::Immediate),
            Code::DurabilityOnCopy,
        ),
        (
            Message::text("x").publisher_key("k"),
            Code::PublisherKeyOnCopy,
        ),
    ];
    for (message, code) in options {
        invalid(copy.publish(message.clone()).await, code);
        refused(copy.publish(message.unchecked()).await, code);
    }

    // A frame over max-ws-msg-len: refused before sending, or (sent anyway) closed with 1009;
    // the next publish connects again.
    let big = Message::text("x".repeat(70_000));
    assert!(matches!(
        publisher.publish(big.clone()).await,
        Err(Error::TooLarge { limit: 65_536, .. })
    ));
    let unlimited = Publisher::connect(&endpoint.clone().max_frame_bytes(None), login(PUBLISHER))
        .await
        .unwrap();
    match unlimited.publish(big).await {
        Err(Error::Closed {
            close_code: Some(1009),
            ..
        }) => {}
        other => panic!("expected a close with 1009, got {other:?}"),
    }
    unlimited.publish(Message::text("again")).await.unwrap();

    // Logins.
    let wrong = Credentials::new(PUBLISHER.0, "wrong");
    refused(
        Publisher::connect(&endpoint, wrong).await,
        Code::AuthenticationFailed,
    );
    refused(
        Admin::connect(&endpoint, login(SUBSCRIBER)).await,
        Code::AuthenticationFailed,
    );
    invalid(
        Publisher::connect(&endpoint, Credentials::new("n".repeat(129), "p")).await,
        Code::InvalidUsername,
    );

    // Subscribers: 301, 305, 300.
    let mut subscriber = Subscriber::connect(&endpoint, login(SUBSCRIBER), 2)
        .await
        .unwrap();
    refused(
        subscriber
            .ack(&MessageId::from("01a1c09f-62da-7000-a30b-0817c9a42e3f"))
            .await,
        Code::InvalidMessageId,
    );
    let mut held = Vec::new();
    while held.len() < 2 {
        held.push(next_delivery(&mut subscriber).await);
    }
    let volatile = publisher
        .publish(Message::text("in memory").durability(Durability::None))
        .await
        .unwrap();
    for delivery in held {
        delivery.ack().await.unwrap();
    }
    let delivery = next_delivery(&mut subscriber).await;
    assert_eq!(delivery.id(), &volatile);
    refused(delivery.nack().await, Code::NackDurabilityZero);
    delivery.ack().await.unwrap();
    refused(delivery.ack().await, Code::InvalidMessageId);
    invalid(subscriber.set_capacity(0).await, Code::InvalidCapacity);
    invalid(subscriber.set_capacity(1025).await, Code::InvalidCapacity);
    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    admin
        .set_config(&[(Setting::MaxSubscriberCapacity, 5)])
        .await
        .unwrap();
    refused(subscriber.set_capacity(6).await, Code::InvalidCapacity);
    assert_eq!(
        subscriber.handle().capacity(),
        2,
        "the refused one is not kept"
    );
    subscriber.set_capacity(5).await.unwrap();

    // Administrators.
    let unknown = MessageId::from("01a1c09f-62da-7000-a30b-0817c9a42e3f");
    refused(admin.message(&unknown).await, Code::InvalidMessageId);
    refused(
        admin.delete_dlq_message(&unknown).await,
        Code::InvalidMessageId,
    );
    let volatile = admin
        .add_message(
            Message::text("volatile")
                .durability(Durability::None)
                .delay_secs(3600),
        )
        .await
        .unwrap();
    refused(admin.move_to_dlq(&volatile).await, Code::MoveDurabilityZero);
    invalid(admin.messages(Page::first(0)).await, Code::InvalidCount);
    invalid(admin.messages(Page::first(1601)).await, Code::InvalidCount);
    invalid(
        admin
            .set_config(&[(Setting::SavedSessionTimeoutSecs, 5)])
            .await,
        Code::SettingOutOfRange,
    );
    invalid(
        admin.subscribe_live_stats(Duration::from_secs(10)).await,
        Code::InvalidSubscriptionPeriod,
    );
    refused(admin.unsubscribe_live_stats().await, Code::NoSubscription);
    let mut pushes = admin
        .subscribe_live_stats(Duration::from_secs(30))
        .await
        .unwrap();
    let now = pushes.next().await.unwrap().unwrap();
    assert_eq!(now.administrators, 1, "{now:?}");
    refused(
        admin.subscribe_live_stats(Duration::from_secs(60)).await,
        Code::SubscriptionActive,
    );
    admin.unsubscribe_live_stats().await.unwrap();
    assert!(pushes.next().await.is_none(), "the pushes end");
    refused(
        admin.stats(Day::new(2000, 1, 1)).await,
        Code::DateBeforeData,
    );
    invalid(admin.stats(Day::new(2026, 2, 30)).await, Code::InvalidDay);
    invalid(admin.usage(Day::new(2026, 13, 1)).await, Code::InvalidMonth);
    admin.stats(Day::today()).await.unwrap();
    admin.usage_totals(Day::today()).await.unwrap();
}

#[tokio::test]
async fn a_full_queue_refuses_with_210_and_211() {
    let by_count = Node::start_with(&["--max-messages", "1"]);
    let publisher = Publisher::connect(&endpoint(&by_count.url()), login(PUBLISHER))
        .await
        .unwrap();
    publisher.publish(Message::text("one")).await.unwrap();
    let full = publisher.publish(Message::text("two")).await;
    assert!(full.as_ref().unwrap_err().is_transient(), "wait and retry");
    refused(full, Code::MessageCountExceeded);

    let by_memory = Node::start_with(&["--max-messages-memory", "1000"]);
    let publisher = Publisher::connect(&endpoint(&by_memory.url()), login(PUBLISHER))
        .await
        .unwrap();
    refused(
        publisher.publish(Message::text("m".repeat(900))).await,
        Code::MessageMemoryExceeded,
    );
    publisher.publish(Message::text("small")).await.unwrap();
}

#[tokio::test]
async fn a_subscriber_resumes_through_cut_connections_and_loses_nothing() {
    let node = Node::start();
    let proxy = Proxy::start(node.addr).await;
    let mut subscriber = Subscriber::builder(&endpoint(&proxy.url()), login(SUBSCRIBER))
        .capacity(20)
        .reconnect(quick_reconnect())
        .connect()
        .await
        .unwrap();
    let publisher = Publisher::connect(&endpoint(&node.url()), login(PUBLISHER))
        .await
        .unwrap();
    const COUNT: usize = 600;
    let published = tokio::spawn(async move {
        let messages = (0..COUNT).map(|i| Message::text(format!("m{i}")));
        let results = publisher.publish_all(messages).await;
        results
            .into_iter()
            .map(|r| r.unwrap())
            .collect::<HashSet<_>>()
    });

    // Acks go out ten at a time, so the subscriber holds unacknowledged messages (which the
    // resume's replay sends again) and has acks in flight when its connection is cut.
    let mut seen = HashSet::new();
    let mut batch = Vec::new();
    let mut acks = Vec::new();
    let (mut cuts, mut disconnects, mut resumes) = (vec![100, 250, 400], 0, 0);
    while seen.len() < COUNT {
        match next_event(&mut subscriber).await {
            Event::Message(delivery) => {
                assert!(
                    seen.insert(delivery.id().clone()),
                    "{} delivered twice within a resumed session",
                    delivery.id()
                );
                batch.push(delivery);
                if cuts.first() == Some(&seen.len()) {
                    cuts.remove(0);
                    proxy.cut();
                }
                if batch.len() == 10 {
                    for delivery in batch.drain(..) {
                        acks.push(tokio::spawn(async move { delivery.ack().await }));
                    }
                }
            }
            Event::Disconnected { .. } => disconnects += 1,
            Event::Reconnected { resumed, released } => {
                assert!(resumed, "resumed, not a new session: {released:?}");
                resumes += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(cuts.is_empty());
    assert_eq!((disconnects, resumes), (3, 3));
    assert_eq!(seen, published.await.unwrap(), "every message, once");
    for ack in acks {
        within(ack).await.unwrap().unwrap();
    }
    // Every ack counted, across the cuts: nothing is left in the queue.
    let admin = Admin::connect(&endpoint(&node.url()), login(ADMIN))
        .await
        .unwrap();
    let stats = admin.live_stats().await.unwrap();
    assert_eq!((stats.messages, stats.unacknowledged), (0, 0), "{stats:?}");
}

#[tokio::test]
async fn a_resume_brings_back_what_the_connection_lost_on_the_way() {
    let node = Node::start();
    let proxy = Proxy::start(node.addr).await;
    let mut subscriber = Subscriber::builder(&endpoint(&proxy.url()), login(SUBSCRIBER))
        .capacity(5)
        .reconnect(quick_reconnect())
        .connect()
        .await
        .unwrap();
    let publisher = Publisher::connect(&endpoint(&node.url()), login(PUBLISHER))
        .await
        .unwrap();
    publisher.publish(Message::text("first")).await.unwrap();
    next_delivery(&mut subscriber).await.ack().await.unwrap();

    // The node writes three deliveries to its socket; the network loses them. For the node
    // they were sent: only a resume with replay sends them again.
    proxy.lose_what_the_node_sends();
    let messages = (0..3).map(|i| Message::text(format!("lost {i}")));
    let mut ids: Vec<MessageId> = publisher
        .publish_all(messages)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    proxy.lost_deliveries(3).await;
    proxy.cut();
    assert!(matches!(
        next_event(&mut subscriber).await,
        Event::Disconnected { .. }
    ));
    assert!(matches!(
        next_event(&mut subscriber).await,
        Event::Reconnected { resumed: true, .. }
    ));
    let mut again = Vec::new();
    while again.len() < 3 {
        let delivery = next_delivery(&mut subscriber).await;
        again.push(delivery.id().clone());
        delivery.ack().await.unwrap();
    }
    again.sort();
    ids.sort();
    assert_eq!(again, ids);
}

#[tokio::test]
async fn a_silent_queue_is_noticed_by_its_heartbeat_and_the_session_resumed() {
    let node = Node::start();
    let proxy = Proxy::start(node.addr).await;
    let through =
        endpoint(&proxy.url()).heartbeat(Duration::from_millis(50), Duration::from_millis(200));
    let mut subscriber = Subscriber::builder(&through, login(SUBSCRIBER))
        .capacity(5)
        .reconnect(quick_reconnect())
        .connect()
        .await
        .unwrap();
    let publisher = Publisher::connect(&endpoint(&node.url()), login(PUBLISHER))
        .await
        .unwrap();
    publisher.publish(Message::text("held")).await.unwrap();
    let held = next_delivery(&mut subscriber).await;

    // Nothing reaches the client any more, not even pongs; the connection stays open.
    proxy.lose_what_the_node_sends();
    match next_event(&mut subscriber).await {
        Event::Disconnected {
            error: Error::Closed { reason, .. },
        } => assert!(reason.contains("not even a pong"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // The client's close frame still reached the node, which saved the session at once.
    assert!(matches!(
        next_event(&mut subscriber).await,
        Event::Reconnected { resumed: true, .. }
    ));
    // The replay of the held message is not shown again; its ack counts.
    let id = publisher.publish(Message::text("next")).await.unwrap();
    assert_eq!(next_delivery(&mut subscriber).await.id(), &id);
    held.ack().await.unwrap();
}

#[tokio::test]
async fn a_session_that_cannot_be_resumed_is_replaced_and_the_application_is_told() {
    let node = Node::start();
    let proxy = Proxy::start(node.addr).await;
    let policy = Reconnect {
        resume_attempts: 2,
        ..quick_reconnect()
    };
    let mut subscriber = Subscriber::builder(&endpoint(&proxy.url()), login(SUBSCRIBER))
        .capacity(5)
        .reconnect(policy)
        .connect()
        .await
        .unwrap();
    let publisher = Publisher::connect(&endpoint(&node.url()), login(PUBLISHER))
        .await
        .unwrap();
    let messages = (0..5).map(|i| Message::text(format!("m{i}")));
    let ids: Vec<MessageId> = publisher
        .publish_all(messages)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let mut old = Vec::new();
    while old.len() < 5 {
        old.push(next_delivery(&mut subscriber).await);
    }
    let first_session = subscriber.session_id();

    // A restart ends every session (the durable messages wait again): the resume gets 109.
    let node = node.restart(&[]);
    proxy.point_at(node.addr);
    proxy.cut();
    assert!(matches!(
        next_event(&mut subscriber).await,
        Event::Disconnected { .. }
    ));
    match next_event(&mut subscriber).await {
        Event::Reconnected { resumed, released } => {
            assert!(!resumed);
            assert_eq!(released, ids, "what the old session held, in id order");
        }
        other => panic!("{other:?}"),
    }
    assert_ne!(subscriber.session_id(), first_session);
    // The old deliveries' acks are not sent: the messages come again, in the new session.
    assert!(matches!(old[0].ack().await, Err(Error::SessionEnded)));
    let mut again = Vec::new();
    while again.len() < 5 {
        let delivery = next_delivery(&mut subscriber).await;
        again.push(delivery.id().clone());
        delivery.ack().await.unwrap();
    }
    again.sort();
    assert_eq!(again, ids);
}

#[tokio::test]
async fn a_subscriber_that_never_received_a_message_logs_in_afresh_at_once() {
    let node = Node::start();
    let proxy = Proxy::start(node.addr).await;
    let mut subscriber = Subscriber::builder(&endpoint(&proxy.url()), login(SUBSCRIBER))
        .reconnect(quick_reconnect())
        .connect()
        .await
        .unwrap();
    proxy.cut();
    assert!(matches!(
        next_event(&mut subscriber).await,
        Event::Disconnected { .. }
    ));
    match next_event(&mut subscriber).await {
        Event::Reconnected { resumed, released } => assert!(!resumed && released.is_empty()),
        other => panic!("{other:?}"),
    }
    let publisher = Publisher::connect(&endpoint(&node.url()), login(PUBLISHER))
        .await
        .unwrap();
    let id = publisher.publish(Message::text("after")).await.unwrap();
    assert_eq!(next_delivery(&mut subscriber).await.id(), &id);

    // Without reconnection, a cut ends the stream with the error.
    let mut once = Subscriber::builder(&endpoint(&proxy.url()), login(SUBSCRIBER))
        .reconnect(Reconnect::never())
        .connect()
        .await
        .unwrap();
    proxy.cut();
    let end = tokio::time::timeout(PROMPT, once.next()).await.unwrap();
    assert!(matches!(end, Some(Err(Error::Closed { .. }))), "{end:?}");
    assert!(once.next().await.is_none());
}

#[tokio::test]
async fn admin_pages_through_thousands_of_messages_and_the_dead_letter_queue() {
    let node = Node::start();
    let endpoint = endpoint(&node.url());
    let publisher = Publisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();
    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    let publish = |count: usize, durability: Durability| {
        let messages =
            (0..count).map(move |i| Message::text(format!("{i}")).durability(durability));
        let publisher = publisher.clone();
        async move {
            let results = publisher.publish_all(messages).await;
            results.into_iter().map(|r| r.unwrap()).collect::<Vec<_>>()
        }
    };
    let queued = publish(3000, Durability::None).await;

    let listed: Vec<MessageId> = admin
        .all_messages()
        .map_ok(|m| m.id)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed, queued, "two pages of 1600 at most");
    let listed: Vec<MessageId> = admin
        .all_messages_paged(false, 1000)
        .map_ok(|m| m.id)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed, queued, "three full pages, then an empty one");
    let ids = |page: Vec<qe_client::admin::MessageSummary>| {
        page.into_iter().map(|m| m.id).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(admin.messages(Page::last(5)).await.unwrap()),
        queued[2995..]
    );
    assert_eq!(
        ids(admin.messages(Page::before(&queued[10], 3)).await.unwrap()),
        queued[7..10]
    );
    assert_eq!(
        ids(admin
            .messages(Page::after(&queued[2990], 1600))
            .await
            .unwrap()),
        queued[2991..]
    );
    let first = admin.messages(Page::first(1)).await.unwrap().remove(0);
    assert_eq!(first.durability, Durability::None);
    assert!(!first.binary && first.len > 0);

    // Moved to the dead letter queue many at once, then paged through.
    let dead = publish(700, Durability::Eventual).await;
    let moves = dead.iter().map(|id| admin.move_to_dlq(id));
    for moved in futures::future::join_all(moves).await {
        moved.unwrap();
    }
    let listed: Vec<MessageId> = admin
        .all_messages_paged(true, 300)
        .map_ok(|m| m.id)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed, dead);
    let stats = admin.live_stats().await.unwrap();
    assert_eq!(
        (stats.messages, stats.dead_letter, stats.durable),
        (3700, 700, 700)
    );
    let deleted = queued[..500].iter().map(|id| admin.delete_message(id));
    for deleted in futures::future::join_all(deleted).await {
        deleted.unwrap();
    }
    assert_eq!(admin.live_stats().await.unwrap().messages, 3200);
}

#[tokio::test]
async fn admin_commands_reach_subscribers_and_the_dead_letter_queue_goes_back() {
    let node = Node::start();
    let endpoint = endpoint(&node.url());
    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    let mut subscriber = Subscriber::connect(&endpoint, login(SUBSCRIBER), 3)
        .await
        .unwrap();
    let message = Message::text("Order 1234 is ready")
        .durability(Durability::Immediate)
        .publisher_key("order-1234");
    let added = admin.add_message(message).await.unwrap();
    let delivery = next_delivery(&mut subscriber).await;
    assert_eq!(
        (delivery.id(), delivery.publisher_key()),
        (&added, Some("order-1234"))
    );
    assert!(delivery.received_at() > 1_700_000_000);
    let shown = admin.message(&added).await.unwrap();
    assert_eq!(shown.durability, Durability::Immediate);
    assert_eq!(
        shown.content,
        qe_client::admin::Content::Message {
            body: Body::Text("Order 1234 is ready".into()),
            publisher_key: Some("order-1234".into()),
            received_at: delivery.received_at(),
        }
    );

    // Taken away from the subscriber that holds it: a notice each.
    admin.move_to_dlq(&added).await.unwrap();
    assert!(matches!(next_event(&mut subscriber).await, Event::MovedToDlq(id) if id == added));
    refused(delivery.ack().await, Code::InvalidMessageId);
    let other = admin.add_message(Message::text("to delete")).await.unwrap();
    let _held = next_delivery(&mut subscriber).await;
    admin.delete_message(&other).await.unwrap();
    assert!(matches!(next_event(&mut subscriber).await, Event::Deleted(id) if id == other));

    // Back from the dead letter queue, with a new id.
    let dead = admin.dlq_message(&added).await.unwrap();
    assert_eq!(dead.id, added);
    let back = admin.requeue_dlq_message(&added).await.unwrap();
    assert!(back > added);
    refused(admin.dlq_message(&added).await, Code::InvalidMessageId);
    let delivery = next_delivery(&mut subscriber).await;
    assert_eq!(
        (delivery.id(), delivery.text(), delivery.publisher_key()),
        (&back, Some("Order 1234 is ready"), Some("order-1234"))
    );
    delivery.nack().await.unwrap();
    let stats = admin.live_stats().await.unwrap();
    assert_eq!((stats.messages, stats.dead_letter), (1, 1), "{stats:?}");

    // Settings.
    let settings = admin.config().await.unwrap();
    assert_eq!(settings.value(Setting::SavedSessionTimeoutSecs), Some(10));
    assert!(!settings.get("max-tasks").unwrap().writable);
    admin
        .set_config(&[
            (Setting::SavedSessionTimeoutSecs, 60),
            (Setting::MaxWsMsgLen, 2048),
        ])
        .await
        .unwrap();
    let settings = admin.config().await.unwrap();
    assert_eq!(settings.value(Setting::SavedSessionTimeoutSecs), Some(60));
    assert_eq!(settings.value(Setting::MaxWsMsgLen), Some(2048));
}

#[tokio::test]
async fn copy_queues_fan_out_and_publish_in_the_login() {
    let node = Node::start();
    let endpoint = endpoint(&node.url());
    let mut first = CopySubscriber::connect(&endpoint, login(SUBSCRIBER))
        .await
        .unwrap();
    let mut second = CopySubscriber::connect(&endpoint, login(SUBSCRIBER))
        .await
        .unwrap();
    let publisher = CopyPublisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();
    assert_eq!(
        publisher
            .publish(Message::text("price: 12.5"))
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        publisher
            .publish(Message::binary(vec![1, 2, 3]))
            .await
            .unwrap(),
        2
    );
    for subscriber in [&mut first, &mut second] {
        for body in [
            Body::Text("price: 12.5".into()),
            Body::Binary(vec![1, 2, 3]),
        ] {
            let event = tokio::time::timeout(PROMPT, subscriber.next())
                .await
                .unwrap();
            match event {
                Some(Ok(CopyEvent::Message(message))) => assert_eq!(message.body, body),
                other => panic!("{other:?}"),
            }
        }
    }

    // A short job: log in and publish with one request.
    let mut subscriber = Subscriber::connect(&endpoint, login(SUBSCRIBER), 1)
        .await
        .unwrap();
    let id = Publisher::publish_once(&endpoint, login(PUBLISHER), Message::text("in the login"))
        .await
        .unwrap();
    let delivery = next_delivery(&mut subscriber).await;
    assert_eq!(
        (delivery.id(), delivery.text()),
        (&id, Some("in the login"))
    );
    refused(
        Publisher::publish_once(
            &endpoint,
            login(PUBLISHER),
            Message::text("x").delay_secs(172_801).unchecked(),
        )
        .await,
        Code::InvalidDelay,
    );
}

#[tokio::test]
async fn wss_with_an_added_root_and_compression() {
    let ca = test_ca("qe-client test CA");
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, leaf.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let node = Node::start_with(&[
        "--tls-cert",
        cert_path.to_str().unwrap(),
        "--tls-key",
        key_path.to_str().unwrap(),
    ]);

    // Without the root, TLS fails.
    match Publisher::connect(&endpoint(&node.tls_url()), login(PUBLISHER)).await {
        Err(Error::Connect { reason, .. }) => assert!(reason.contains("TLS"), "{reason}"),
        other => panic!("expected a TLS failure, got {:?}", other.map(|_| ())),
    }
    let endpoint = endpoint(&node.tls_url())
        .add_root_certificates_pem(&ca.pem())
        .unwrap()
        .trust_only_added_roots()
        .compression(true);
    let publisher = Publisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();
    let mut subscriber = Subscriber::connect(&endpoint, login(SUBSCRIBER), 1)
        .await
        .unwrap();
    // Big enough to be compressed both ways (frames under 512 bytes are sent as they are).
    let text = "all work and no play ".repeat(200);
    let id = publisher
        .publish(Message::text(text.clone()))
        .await
        .unwrap();
    let delivery = next_delivery(&mut subscriber).await;
    assert_eq!((delivery.id(), delivery.text()), (&id, Some(text.as_str())));
    delivery.ack().await.unwrap();
}

#[tokio::test]
async fn the_control_plane_makes_a_queue_that_the_client_then_uses() {
    use qe_client::control_plane::{NewQueue, QueueStatus, RecordQuery, Tier};
    // Over HTTPS, with the API's own CA.
    let ca = test_ca("qe-client control plane CA");
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let files = tempfile::tempdir().unwrap();
    let path = |name: &str| files.path().join(name);
    std::fs::write(path("api.pem"), leaf.pem()).unwrap();
    std::fs::write(path("api-key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    // `ca`: the nodes trust it too, to fetch their config.
    let cp = qe_tests::ControlPlane::start_with(&format!(
        "[api_tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n",
        path("api.pem"),
        path("api-key.pem"),
        path("ca.pem"),
    ));
    let base = format!("https://{}/", cp.addr);
    match ControlPlane::new(&base, &cp.token).unwrap().queues().await {
        Err(Error::Http(_)) => {}
        other => panic!("a certificate of no public root is refused: {other:?}"),
    }
    let api = ControlPlane::builder(&base, &cp.token)
        .add_root_certificates_pem(&ca.pem())
        .unwrap()
        .build()
        .unwrap();
    let new = NewQueue::new(Tier::Devtest, "local", "local").ipv4(true);
    let created = api.create_queue(&new).await.unwrap();
    assert_eq!(created.queue.status, QueueStatus::Provisioning);
    let id = created.queue.id.clone();
    let queue = api
        .wait_for_queue(&id, QueueStatus::Running, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(queue.status, QueueStatus::Running);
    assert_eq!(api.queues().await.unwrap()[0].id, id);
    assert_eq!(api.queue(&id).await.unwrap().url, queue.url);

    let endpoint = endpoint(&queue.url);
    let publisher = Publisher::connect(&endpoint, created.logins.publisher.clone())
        .await
        .unwrap();
    publisher
        .publish(Message::text("through the API"))
        .await
        .unwrap();
    let rotated = api
        .rotate_login(&id, qe_client::Role::Publisher)
        .await
        .unwrap();
    assert!(rotated.applied);
    refused(
        Publisher::connect(&endpoint, created.logins.publisher.clone()).await,
        Code::AuthenticationFailed,
    );
    Publisher::connect(&endpoint, rotated.credentials())
        .await
        .unwrap();

    api.usage(&RecordQuery::default()).await.unwrap();
    api.stats(&RecordQuery::default()).await.unwrap();
    let bill = api.bill(None, Some(&id), None).await.unwrap();
    assert!(bill.total >= 0.0);
    let wrong = ControlPlane::builder(&base, "wrong")
        .add_root_certificates_pem(&ca.pem())
        .unwrap()
        .build()
        .unwrap();
    match wrong.queues().await {
        Err(Error::Api {
            status: 401, code, ..
        }) => assert_eq!(code, "unauthorized"),
        other => panic!("{other:?}"),
    }
    match api.queue("nosuchqueue0").await {
        Err(Error::Api { status: 404, .. }) => {}
        other => panic!("{other:?}"),
    }
    let deleted = api.delete_queue(&id).await.unwrap();
    assert_eq!(deleted.status, QueueStatus::Deleted);
}

/// Issue 32: a subscriber draining a backlog of durability-2 messages keeps going while the
/// node is killed (SIGKILL) three times and brought back by the control plane: every confirmed
/// message is delivered at least once, and an ack the restarted node can no longer take fails
/// with `SessionEnded` only (the message is delivered again), as the crate documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_carries_on_through_three_node_kills_and_gets_every_confirmed_message() {
    let cp = qe_tests::ControlPlane::start();
    let body = r#"{"tier":"devtest","region":"local","instance_type":"local","ipv4":false}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap().to_string();
    let url = queue["url"].as_str().unwrap().to_string();
    let credentials = |role: &str| {
        let login = &queue["logins"][role];
        Credentials::new(
            login["username"].as_str().unwrap(),
            login["password"].as_str().unwrap(),
        )
    };
    let endpoint = endpoint(&url);
    let publisher = Publisher::connect(&endpoint, credentials("publisher"))
        .await
        .unwrap();
    let confirmed: HashSet<MessageId> = publish_durable(&publisher, 3000)
        .await
        .into_iter()
        .collect();
    assert_eq!(confirmed.len(), 3000);

    let mut subscriber = Subscriber::builder(&endpoint, credentials("subscriber"))
        .capacity(1)
        .reconnect(quick_reconnect())
        .connect()
        .await
        .unwrap();
    let bootstrap = cp.node_dir(&id).join("bootstrap.toml");
    let mut pid = qe_tests::process_naming(&bootstrap).expect("the node runs");
    let (mut seen, mut delivered, mut acks_of_ended_sessions) = (HashSet::new(), 0, 0);
    let mut kills_at = vec![2000, 1000, 200];
    while seen.len() < confirmed.len() {
        let event = tokio::time::timeout(Duration::from_secs(60), subscriber.next())
            .await
            .unwrap_or_else(|_| panic!("stalled at {} of 3000", seen.len()))
            .expect("the stream goes on")
            .expect("no error from the stream");
        let Event::Message(delivery) = event else {
            continue;
        };
        assert!(confirmed.contains(delivery.id()));
        seen.insert(delivery.id().clone());
        delivered += 1;
        match delivery.ack().await {
            Ok(()) => {}
            Err(Error::SessionEnded) => acks_of_ended_sessions += 1,
            Err(other) => panic!("an ack failed otherwise: {other}"),
        }
        if kills_at.last() == Some(&seen.len()) {
            kills_at.pop();
            qe_tests::signal(pid, libc::SIGKILL);
            let deadline = std::time::Instant::now() + PROMPT;
            pid = loop {
                match qe_tests::process_naming(&bootstrap) {
                    Some(new) if new != pid => break new,
                    _ => assert!(std::time::Instant::now() < deadline, "no new node"),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
        }
    }
    assert!(kills_at.is_empty());
    println!(
        "{delivered} deliveries of 3000 messages ({} again); {acks_of_ended_sessions} acks of \
         ended sessions",
        delivered - 3000
    );
    subscriber.logout().await.unwrap();
}

/// Issue 35: a subscriber of a queue with a standby holds messages when its node's disk is
/// lost; the control plane starts the node again on the standby's copy, and the library
/// resumes the session there (`resumed: true`): what it held is its own still (its acks
/// succeed, nothing is shown twice) and the rest follows, every message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_keeps_its_session_through_a_promotion_of_the_standbys_copy() {
    let cp = qe_tests::ControlPlane::start_with("live_stats_secs = 1\nreconcile_every_secs = 1\n");
    let body = r#"{"tier":"standard","region":"local","instance_type":"local","replicas":2}"#;
    let queue = cp.create_queue(body).await;
    let id = queue["id"].as_str().unwrap().to_string();
    let path = format!("/v1/queues/{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let node_pid = loop {
        let (_, now) = cp.call("GET", &path, None).await;
        if now["live"]["standby"]["in_sync"] == true {
            break now["resources"]["process"].as_str().unwrap().to_string();
        }
        assert!(std::time::Instant::now() < deadline, "never in sync: {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let credentials = |role: &str| {
        let login = &queue["logins"][role];
        Credentials::new(
            login["username"].as_str().unwrap(),
            login["password"].as_str().unwrap(),
        )
    };
    let endpoint = endpoint(queue["url"].as_str().unwrap());
    let mut subscriber = Subscriber::builder(&endpoint, credentials("subscriber"))
        .capacity(4)
        .reconnect(quick_reconnect())
        .connect()
        .await
        .unwrap();
    let publisher = Publisher::connect(&endpoint, credentials("publisher"))
        .await
        .unwrap();
    let confirmed = publish_durable(&publisher, 10).await;
    let mut held = Vec::new();
    while held.len() < 4 {
        held.push(next_delivery(&mut subscriber).await);
    }

    // The disk goes, then the process.
    std::fs::remove_dir_all(cp.node_dir(&id).join("data")).unwrap();
    qe_tests::signal(node_pid.parse().unwrap(), libc::SIGKILL);
    assert!(matches!(
        next_event(&mut subscriber).await,
        Event::Disconnected { .. }
    ));
    let event = tokio::time::timeout(Duration::from_secs(60), subscriber.next()).await;
    match event.expect("reconnected in time").unwrap().unwrap() {
        Event::Reconnected { resumed, released } => {
            assert!(resumed, "its session, not a new one: {released:?}")
        }
        other => panic!("{other:?}"),
    }
    // Its acks are durability 2's (the messages' own): answered Success once the new standby
    // is in sync (until then 506, taken on one disk).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, now) = cp.call("GET", &path, None).await;
        let process = now["resources"]["process"].as_str().unwrap_or_default();
        if now["live"]["standby"]["in_sync"] == true && process != node_pid {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no standby again: {now}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut seen: Vec<MessageId> = held.iter().map(|d| d.id().clone()).collect();
    for delivery in held {
        delivery
            .ack()
            .await
            .expect("it holds it still, on the copy");
    }
    while seen.len() < confirmed.len() {
        let delivery = next_delivery(&mut subscriber).await;
        seen.push(delivery.id().clone());
        delivery.ack().await.unwrap();
    }
    assert_eq!(seen, confirmed, "every message once, in order");
    subscriber.logout().await.unwrap();
}
