//! The Rust client library against the real node, issue 32: a default [`Endpoint`] learns the
//! queue's `max-ws-msg-len` at every login (raised, lowered, changed between connections),
//! an explicit limit is kept whatever the queue says; and [`Subscriber::handle_each`] /
//! [`Subscriber::handle_next`] acknowledge a message only once its handler has returned, go on
//! through a SIGKILL of the node mid-handler (the message comes again: at least once), and
//! reject to the dead letter queue only on the handler's word.

use qe_client::{
    Admin, Credentials, Delivery, Durability, Endpoint, Error, Event, FrameLimit, LiveStats,
    Message, MessageId, Page, Publisher, Reconnect, Setting, Subscriber, Verdict,
};
use qe_tests::{Node, ADMIN, PROMPT, PUBLISHER, SUBSCRIBER};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

fn login((name, password): (&str, &str)) -> Credentials {
    Credentials::new(name, password)
}

/// The node's address with the library's defaults: nothing said about frame sizes.
fn endpoint(node: &Node) -> Endpoint {
    Endpoint::new(&node.url()).unwrap()
}

/// `future`'s output; fails the test if it does not come promptly.
async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(PROMPT, future)
        .await
        .expect("done in time")
}

/// Sets the queue's `max-ws-msg-len` as its administrator.
async fn set_max_ws_msg_len(admin: &Admin, bytes: u64) {
    admin
        .set_config(&[(Setting::MaxWsMsgLen, bytes)])
        .await
        .unwrap();
}

/// A text body of exactly `bytes` bytes, not all alike (so that a truncation shows).
fn body_of(bytes: usize) -> String {
    (0..bytes)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect()
}

/// The next delivery; fails the test on anything else.
async fn next_delivery(subscriber: &mut Subscriber) -> Delivery {
    use futures::StreamExt;
    match within(subscriber.next()).await {
        Some(Ok(Event::Message(delivery))) => delivery,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

#[track_caller]
fn assert_too_large<T: std::fmt::Debug>(result: Result<T, Error>, expected_limit: usize) {
    match result {
        Err(Error::TooLarge { limit, bytes }) => {
            assert_eq!(limit, expected_limit, "a frame of {bytes} bytes");
            assert!(bytes > limit);
        }
        other => panic!("expected TooLarge (limit {expected_limit}), got {other:?}"),
    }
}

#[track_caller]
fn assert_closed_with_1009<T: std::fmt::Debug>(result: Result<T, Error>) {
    match result {
        Err(Error::Closed {
            close_code: Some(1009),
            ..
        }) => {}
        other => panic!("expected a close with 1009, got {other:?}"),
    }
}

#[tokio::test]
async fn a_default_endpoint_learns_a_raised_limit_and_sends_a_bigger_message() {
    let node = Node::start();
    let endpoint = endpoint(&node);
    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    assert_eq!(admin.max_frame_bytes(), Some(65_536), "the queue's default");
    set_max_ws_msg_len(&admin, 131_072).await;

    let publisher = Publisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();
    assert_eq!(publisher.max_frame_bytes(), Some(131_072));
    let body = body_of(100_000);
    let id = publisher
        .publish(Message::text(body.clone()))
        .await
        .unwrap();

    let mut subscriber = Subscriber::connect(&endpoint, login(SUBSCRIBER), 1)
        .await
        .unwrap();
    let delivery = next_delivery(&mut subscriber).await;
    assert_eq!(delivery.id(), &id);
    assert_eq!(delivery.text(), Some(body.as_str()), "the body intact");
    delivery.ack().await.unwrap();
}

#[tokio::test]
async fn a_default_endpoint_learns_a_lowered_limit_and_refuses_before_sending() {
    let node = Node::start();
    let endpoint = endpoint(&node);
    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    set_max_ws_msg_len(&admin, 8192).await;

    // No reconnection: had the refused publish cost the connection, the next would fail.
    let publisher = Publisher::builder(&endpoint, login(PUBLISHER))
        .reconnect(false)
        .connect()
        .await
        .unwrap();
    assert_eq!(publisher.max_frame_bytes(), Some(8192));
    assert_too_large(
        publisher.publish(Message::text(body_of(10_000))).await,
        8192,
    );
    let small = publisher.publish(Message::text("small")).await.unwrap();

    let stats = admin.live_stats().await.unwrap();
    assert_eq!(
        (stats.messages, stats.publishers),
        (1, 1),
        "only the small one arrived, on the one connection: {stats:?}"
    );
    let listed = admin.messages(Page::first(10)).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, small);
}

#[tokio::test]
async fn a_publisher_learns_the_limit_again_when_it_reconnects() {
    let node = Node::start();
    let endpoint = endpoint(&node);
    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    set_max_ws_msg_len(&admin, 131_072).await;
    let publisher = Publisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();
    assert_eq!(publisher.max_frame_bytes(), Some(131_072));

    // Lowered under a connection that learned more: the queue closes it on a frame between
    // the two, and the next connection learns the new limit.
    set_max_ws_msg_len(&admin, 8192).await;
    let body = body_of(10_000);
    assert_closed_with_1009(publisher.publish(Message::text(body.clone())).await);
    assert_too_large(publisher.publish(Message::text(body)).await, 8192);
    assert_eq!(publisher.max_frame_bytes(), Some(8192));
    publisher.publish(Message::text("small")).await.unwrap();
}

#[tokio::test]
async fn an_explicit_limit_is_kept_whatever_the_queue_allows() {
    let node = Node::start();
    let admin = Admin::connect(&endpoint(&node), login(ADMIN))
        .await
        .unwrap();
    set_max_ws_msg_len(&admin, 131_072).await;
    let body = body_of(100_000);

    // Fixed at 65536: refused before sending, although the queue would take it.
    let fixed = endpoint(&node).max_frame_bytes(Some(65_536));
    let publisher = Publisher::connect(&fixed, login(PUBLISHER)).await.unwrap();
    assert_eq!(publisher.max_frame_bytes(), Some(65_536));
    assert_too_large(publisher.publish(Message::text(body.clone())).await, 65_536);
    let stats = admin.live_stats().await.unwrap();
    assert_eq!(stats.messages, 0, "nothing was sent: {stats:?}");

    // Fixed above what the queue takes: nothing learned, so the queue closes with 1009.
    set_max_ws_msg_len(&admin, 8192).await;
    let trusting = endpoint(&node).frame_limit(FrameLimit::Fixed(65_536));
    let publisher = Publisher::connect(&trusting, login(PUBLISHER))
        .await
        .unwrap();
    assert_eq!(publisher.max_frame_bytes(), Some(65_536));
    assert_closed_with_1009(publisher.publish(Message::text(body_of(10_000))).await);

    // No limit: sent whatever its size.
    set_max_ws_msg_len(&admin, 131_072).await;
    let unlimited = endpoint(&node).max_frame_bytes(None);
    let publisher = Publisher::connect(&unlimited, login(PUBLISHER))
        .await
        .unwrap();
    assert_eq!(publisher.max_frame_bytes(), None);
    publisher.publish(Message::text(body)).await.unwrap();
}

/// What a handler saw while it ran: the message, and the queue's view of it then.
#[derive(Debug)]
struct Seen {
    id: MessageId,
    /// The queue's counters, read from inside the handler.
    stats: LiveStats,
    /// Whether `getmsgs` listed the message, read from inside the handler.
    listed: bool,
}

/// A handler that records what the queue says of the message while it is being handled,
/// then gives `verdict`.
fn recording(
    admin: &Admin,
    seen: &mpsc::UnboundedSender<Seen>,
    verdict: Verdict,
) -> impl FnMut(Delivery) -> futures::future::BoxFuture<'static, Verdict> {
    let (admin, seen) = (admin.clone(), seen.clone());
    move |delivery: Delivery| {
        let (admin, seen) = (admin.clone(), seen.clone());
        Box::pin(async move {
            let stats = admin.live_stats().await.unwrap();
            let page = admin.messages(Page::first(100)).await.unwrap();
            let listed = page.iter().any(|m| &m.id == delivery.id());
            let id = delivery.id().clone();
            seen.send(Seen { id, stats, listed }).unwrap();
            verdict
        })
    }
}

#[tokio::test]
async fn the_ack_goes_only_once_the_handler_has_returned() {
    let node = Node::start();
    let endpoint = endpoint(&node);
    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    let publisher = Publisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();
    let messages = ["first", "second"].map(Message::text);
    let ids: Vec<MessageId> = publisher
        .publish_all(messages)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let mut subscriber = Subscriber::connect(&endpoint, login(SUBSCRIBER), 1)
        .await
        .unwrap();

    let (seen, mut record) = mpsc::unbounded_channel();
    let handled = within(subscriber.handle_next(2, recording(&admin, &seen, Verdict::Ack))).await;
    assert_eq!(handled.unwrap(), 2);
    for id in &ids {
        let inside = record.try_recv().expect("the handler ran");
        assert_eq!(&inside.id, id);
        assert!(
            inside.listed,
            "still in the queue while handled: {inside:?}"
        );
        assert_eq!(
            inside.stats.unacknowledged, 1,
            "held, not yet acknowledged, while handled: {inside:?}"
        );
    }
    let stats = admin.live_stats().await.unwrap();
    assert_eq!(
        (stats.messages, stats.unacknowledged),
        (0, 0),
        "each acknowledged after its handler: {stats:?}"
    );
}

#[tokio::test]
async fn a_reject_goes_to_the_dead_letter_queue_and_a_deletion_does_not_stop_the_loop() {
    let node = Node::start();
    let endpoint = endpoint(&node);
    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    let publisher = Publisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();
    let mut subscriber = Subscriber::connect(&endpoint, login(SUBSCRIBER), 1)
        .await
        .unwrap();
    let (seen, mut record) = mpsc::unbounded_channel();

    // Rejected: to the dead letter queue, not delivered again.
    let poison = publisher.publish(Message::text("poison")).await.unwrap();
    let handled = subscriber.handle_next(1, recording(&admin, &seen, Verdict::Reject));
    assert_eq!(within(handled).await.unwrap(), 1);
    assert_eq!(record.try_recv().unwrap().id, poison);
    assert_eq!(admin.dlq_message(&poison).await.unwrap().id, poison);
    let stats = admin.live_stats().await.unwrap();
    assert_eq!(
        (stats.messages, stats.dead_letter, stats.unacknowledged),
        (1, 1, 0),
        "{stats:?}"
    );

    // Rejected, but durability 0 cannot go there (305): acknowledged instead, as the manual
    // advises.
    let volatile = Message::text("volatile").durability(Durability::None);
    let volatile = publisher.publish(volatile).await.unwrap();
    let handled = subscriber.handle_next(1, recording(&admin, &seen, Verdict::Reject));
    assert_eq!(within(handled).await.unwrap(), 1);
    assert_eq!(record.try_recv().unwrap().id, volatile);
    let stats = admin.live_stats().await.unwrap();
    assert_eq!((stats.messages, stats.dead_letter), (1, 1), "{stats:?}");

    // Deleted by an administrator while its handler runs: the ack is refused (301), its
    // notice skipped, and the next message is handled.
    let deleted = publisher.publish(Message::text("deleted")).await.unwrap();
    let next = publisher.publish(Message::text("next")).await.unwrap();
    let handler = {
        let (admin, seen) = (admin.clone(), seen.clone());
        move |delivery: Delivery| {
            let (admin, seen) = (admin.clone(), seen.clone());
            async move {
                if delivery.text() == Some("deleted") {
                    admin.delete_message(delivery.id()).await.unwrap();
                }
                let stats = admin.live_stats().await.unwrap();
                let id = delivery.id().clone();
                seen.send(Seen {
                    id,
                    stats,
                    listed: false,
                })
                .unwrap();
                Verdict::Ack
            }
        }
    };
    assert_eq!(within(subscriber.handle_next(2, handler)).await.unwrap(), 2);
    assert_eq!(record.try_recv().unwrap().id, deleted);
    assert_eq!(record.try_recv().unwrap().id, next);
    let stats = admin.live_stats().await.unwrap();
    assert_eq!(
        (stats.messages, stats.dead_letter, stats.unacknowledged),
        (1, 1, 0),
        "only the rejected one is left: {stats:?}"
    );
}

/// Quick retries, for tests; a restarted node knows no session, so two 109s are enough to
/// give up on resuming.
fn quick_reconnect() -> Reconnect {
    Reconnect {
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(200),
        resume_attempts: 2,
        ..Reconnect::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_cut_off_by_a_node_kill_gets_its_message_again_and_the_loop_goes_on() {
    let node = Node::start();
    let address = node.addr;
    let endpoint = endpoint(&node);
    let publisher = Publisher::connect(&endpoint, login(PUBLISHER))
        .await
        .unwrap();
    let message = Message::text("survives").durability(Durability::Immediate);
    let id = publisher.publish(message).await.unwrap();
    drop(publisher);

    // The first call blocks until told; every call says which message it got.
    let calls = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(Notify::new());
    let (entered, mut handling) = mpsc::unbounded_channel();
    let handler = {
        let (calls, release) = (calls.clone(), release.clone());
        move |delivery: Delivery| {
            let (calls, release, entered) = (calls.clone(), release.clone(), entered.clone());
            async move {
                entered.send(delivery.id().clone()).unwrap();
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    release.notified().await;
                }
                Verdict::Ack
            }
        }
    };
    let mut subscriber = Subscriber::builder(&endpoint, login(SUBSCRIBER))
        .reconnect(quick_reconnect())
        .connect()
        .await
        .unwrap();
    let worker = tokio::spawn(async move {
        let handled = subscriber.handle_next(2, handler).await;
        (subscriber, handled)
    });

    assert_eq!(within(handling.recv()).await.unwrap(), id);
    // SIGKILL mid-handler, then the same data directory on the same port: the session is
    // gone, the message waits again.
    let node = node.restart(&["--listen", &address.to_string()]);
    assert_eq!(node.addr, address);
    release.notify_one();

    // Its ack could not be taken (the session ended): delivered again, handled again.
    assert_eq!(within(handling.recv()).await.unwrap(), id, "at least once");
    let (subscriber, handled) = within(worker).await.unwrap();
    assert_eq!(handled.unwrap(), 2, "the loop went on through the kill");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let admin = Admin::connect(&endpoint, login(ADMIN)).await.unwrap();
    let stats = admin.live_stats().await.unwrap();
    assert_eq!(
        (stats.messages, stats.unacknowledged, stats.dead_letter),
        (0, 0, 0),
        "handled and acknowledged; nothing lost, nothing left: {stats:?}"
    );
    subscriber.logout().await.unwrap();
}
