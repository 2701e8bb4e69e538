//! The administrator's commands, with the real binary.

use futures::{SinkExt, StreamExt};
use qe_tests::{assert_failure, Client, Ending, Node};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

async fn admin(node: &Node) -> Client {
    node.login("admin", "distribute", json!({})).await.0
}

async fn command(admin: &mut Client, request: Value) -> Value {
    admin.request(request).await
}

async fn live_stats(admin: &mut Client) -> String {
    let reply = command(admin, json!({"cmd": "getlivestats"})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    reply["csv"].as_str().unwrap().to_string()
}

async fn publish(publisher: &mut Client, request: Value) -> String {
    let reply = publisher.request(request).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    reply["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn getlivestats_counts_follow_the_queue() {
    let node = Node::start();
    let mut admin = admin(&node).await;
    // messages, publishers, subscribers, saved, administrators, unacked, dead, delayed, durable
    assert_eq!(live_stats(&mut admin).await, "0,0,0,0,1,0,0,0,0");
    let mut publisher = node.publisher().await;
    let _copy = node.login("subscriber", "copy", json!({})).await;
    let (mut subscriber, session) = node.subscriber(1).await;
    assert_eq!(live_stats(&mut admin).await, "0,1,2,0,1,0,0,0,0");

    let m1 = publish(&mut publisher, json!({"body": "m1"})).await;
    publish(&mut publisher, json!({"body": "m2", "durability": 0})).await;
    publish(&mut publisher, json!({"body": "m3", "delay": 3600})).await;
    assert_eq!(subscriber.recv().await["id"], m1);
    assert_eq!(live_stats(&mut admin).await, "3,1,2,0,1,1,0,1,2");

    subscriber.send_json(&json!({"id": m1, "ack": 0})).await;
    let mut frames = [subscriber.recv().await, subscriber.recv().await];
    frames.sort_by_key(|f| f.get("status").is_some());
    assert_eq!(frames[0]["body"], "m2", "the nack made room for m2");
    assert_eq!(live_stats(&mut admin).await, "3,1,2,0,1,1,1,1,2");

    drop(subscriber);
    node.wait_for_log(&format!("session={session}"));
    assert_eq!(live_stats(&mut admin).await, "3,1,1,1,1,1,1,1,2");
}

#[tokio::test]
async fn getlivestats_pushes_and_their_codes() {
    let node = Node::start();
    let mut admin = admin(&node).await;
    for bad in [json!(29), json!(901), json!("30"), json!(30.0), json!(-1)] {
        let reply = command(&mut admin, json!({"cmd": "getlivestats", "subscribe": bad})).await;
        assert_failure(&reply, 401);
    }
    let reply = command(&mut admin, json!({"cmd": "getlivestats", "subscribe": 0})).await;
    assert_failure(&reply, 403);
    let reply = command(
        &mut admin,
        json!({"cmd": "getlivestats", "subscribe": 30, "context": 1}),
    )
    .await;
    assert_eq!(reply["status"], "Success.");
    assert_eq!(reply["context"], 1);
    let reply = command(&mut admin, json!({"cmd": "getlivestats", "subscribe": 60})).await;
    assert_failure(&reply, 402);
    // The first push comes 30 s after the subscription.
    let push = admin
        .recv_within(Duration::from_secs(45))
        .await
        .expect("a push");
    assert_eq!(push["cmd"], "getlivestats");
    assert_eq!(push["csv"], "0,0,0,0,1,0,0,0,0");
    let reply = command(&mut admin, json!({"cmd": "getlivestats", "subscribe": 0})).await;
    assert_eq!(reply["status"], "Success.");
    let reply = command(&mut admin, json!({"cmd": "getlivestats", "subscribe": 0})).await;
    assert_failure(&reply, 403);
}

fn ids(csv: &str) -> Vec<String> {
    csv.lines()
        .map(|l| l.split(',').next().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn getmsgs_pages_forwards_and_backwards() {
    let node = Node::start();
    let mut publisher = node.publisher().await;
    // 3,000 messages, pipelined.
    for n in 0..3000 {
        publisher
            .socket()
            .feed(Message::text(json!({"body": n.to_string()}).to_string()))
            .await
            .unwrap();
    }
    publisher.socket().flush().await.unwrap();
    let mut published = Vec::new();
    while published.len() < 3000 {
        let reply: Value = serde_json::from_str(
            publisher
                .socket()
                .next()
                .await
                .unwrap()
                .unwrap()
                .to_text()
                .unwrap(),
        )
        .unwrap();
        published.push(reply["id"].as_str().unwrap().to_string());
    }
    let mut admin = admin(&node).await;

    let first = command(
        &mut admin,
        json!({"cmd": "getmsgs", "after": "", "count": 1600}),
    )
    .await;
    let mut forwards = ids(first["csv"].as_str().unwrap());
    let rest = command(
        &mut admin,
        json!({"cmd": "getmsgs", "after": forwards.last().unwrap(), "count": 1600}),
    )
    .await;
    forwards.extend(ids(rest["csv"].as_str().unwrap()));
    assert_eq!(forwards, published);

    let last = command(
        &mut admin,
        json!({"cmd": "getmsgs", "before": "", "count": 1000}),
    )
    .await;
    let mut backwards = ids(last["csv"].as_str().unwrap());
    while backwards.len() < 3000 {
        let page = command(
            &mut admin,
            json!({"cmd": "getmsgs", "before": backwards[0], "count": 1000}),
        )
        .await;
        let mut earlier = ids(page["csv"].as_str().unwrap());
        earlier.extend(backwards);
        backwards = earlier;
    }
    assert_eq!(backwards, published, "before-pages are ascending too");

    let line = first["csv"]
        .as_str()
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    let columns: Vec<&str> = line.split(',').collect();
    let frame_of_0 = format!(
        r#"{{"id":"{}","type":1,"body":"0","recdat":1234567890}}"#,
        published[0]
    );
    let body0 = frame_of_0.len();
    assert_eq!(columns[1], body0.to_string(), "len is the frame's length");
    assert_eq!(&columns[2..5], ["0", "1", "1"], "delay, durability, type");

    for (request, code) in [
        (json!({"cmd": "getmsgs", "count": 5}), 409),
        (
            json!({"cmd": "getmsgs", "after": "", "before": "", "count": 5}),
            409,
        ),
        (json!({"cmd": "getmsgs", "before": 5, "count": 5}), 410),
        (json!({"cmd": "getmsgs", "before": "nope", "count": 5}), 410),
        (json!({"cmd": "getmsgs", "after": "nope", "count": 5}), 411),
        (json!({"cmd": "getmsgs", "after": ""}), 412),
        (json!({"cmd": "getmsgs", "after": "", "count": 0}), 412),
        (json!({"cmd": "getmsgs", "after": "", "count": 1601}), 412),
        (json!({"cmd": "getmsgs", "after": "", "count": "5"}), 412),
        (
            json!({"cmd": "getdlqmsgs", "after": "", "count": 1601}),
            412,
        ),
    ] {
        assert_failure(&command(&mut admin, request).await, code);
    }
    let empty = command(
        &mut admin,
        json!({"cmd": "getdlqmsgs", "after": "", "count": 5}),
    )
    .await;
    assert_eq!(empty["csv"], "");
}

#[tokio::test]
async fn getmsg_shows_a_message_unchanged() {
    let node = Node::start();
    let mut publisher = node.publisher().await;
    let id = publish(
        &mut publisher,
        json!({"body": "hello", "delay": 60, "durability": 2, "publisherkey": "k-1"}),
    )
    .await;
    let mut admin = admin(&node).await;
    let reply = command(
        &mut admin,
        json!({"cmd": "getmsg", "id": id, "context": "c"}),
    )
    .await;
    assert_eq!(reply["status"], "Success.");
    assert_eq!(reply["id"], id.as_str());
    assert_eq!(reply["msg"]["body"], "hello");
    assert_eq!(reply["msg"]["publisherkey"], "k-1");
    assert_eq!(reply["msg"]["id"], id.as_str());
    assert_eq!(reply["len"], reply["msg"].to_string().len());
    assert_eq!(
        (reply["delay"].clone(), reply["durability"].clone()),
        (json!(60), json!(2))
    );
    assert_eq!(reply["context"], "c");
    for bad in [
        json!({"cmd": "getmsg"}),
        json!({"cmd": "getmsg", "id": "x"}),
        json!({"cmd": "getmsg", "id": 1}),
    ] {
        assert_failure(&command(&mut admin, bad).await, 301);
    }
    let unknown = "01a1c09f-62da-7000-a30b-0817c9a42e3f";
    assert_failure(
        &command(&mut admin, json!({"cmd": "getmsg", "id": unknown})).await,
        301,
    );
    assert_failure(
        &command(&mut admin, json!({"cmd": "getdlqmsg", "id": id})).await,
        301,
    );
}

#[tokio::test]
async fn an_admin_deletes_and_moves_messages_and_the_holder_is_told() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let held = publish(&mut publisher, json!({"body": "held"})).await;
    let waiting = publish(&mut publisher, json!({"body": "waiting"})).await;
    assert_eq!(subscriber.recv().await["id"], held);
    let mut admin = admin(&node).await;

    let reply = command(&mut admin, json!({"cmd": "delmsg", "id": held})).await;
    assert_eq!(reply["status"], "Success.");
    assert_eq!(
        subscriber.recv().await,
        json!({"deleted": true, "id": held})
    );
    // Its slot is free at once: the waiting message follows; an ack of the deleted one is 301.
    assert_eq!(subscriber.recv().await["id"], waiting);
    assert_failure(
        &subscriber.request(json!({"id": held, "ack": 1})).await,
        301,
    );

    let reply = command(&mut admin, json!({"cmd": "movetodlq", "id": waiting})).await;
    assert_eq!(reply["status"], "Success.");
    assert_eq!(
        subscriber.recv().await,
        json!({"movedtodlq": true, "id": waiting})
    );
    let dead = command(&mut admin, json!({"cmd": "getdlqmsg", "id": waiting})).await;
    assert_eq!(dead["msg"]["body"], "waiting");
    assert_failure(
        &command(&mut admin, json!({"cmd": "getmsg", "id": waiting})).await,
        301,
    );

    let fleeting = publish(&mut publisher, json!({"body": "d0", "durability": 0})).await;
    assert_failure(
        &command(&mut admin, json!({"cmd": "movetodlq", "id": fleeting})).await,
        413,
    );
    let delayed = publish(&mut publisher, json!({"body": "later", "delay": 3600})).await;
    assert_eq!(
        command(&mut admin, json!({"cmd": "delmsg", "id": delayed})).await["status"],
        "Success."
    );
    for cmd in ["delmsg", "movetodlq", "deldlqmsg"] {
        let unknown = "01a1c09f-62da-7000-a30b-0817c9a42e3f";
        assert_failure(
            &command(&mut admin, json!({"cmd": cmd, "id": unknown})).await,
            301,
        );
    }
    assert_failure(
        &command(&mut admin, json!({"cmd": "deldlqmsg", "id": fleeting})).await,
        301,
    );
    assert_eq!(
        command(&mut admin, json!({"cmd": "deldlqmsg", "id": waiting})).await["status"],
        "Success."
    );
    assert_eq!(
        live_stats(&mut admin).await.split(',').next(),
        Some("1"),
        "only d0 is left"
    );
}

#[tokio::test]
async fn a_dead_letter_is_put_back_with_three_commands() {
    let node = Node::start();
    let (mut subscriber, _) = node.subscriber(1).await;
    let mut publisher = node.publisher().await;
    let rejected = publish(&mut publisher, json!({"body": "aGVsbG8=", "type": 2})).await;
    subscriber.recv().await;
    subscriber.request(json!({"id": rejected, "ack": 0})).await;
    let mut admin = admin(&node).await;

    let dead = command(&mut admin, json!({"cmd": "getdlqmsg", "id": rejected})).await;
    let (body, body_type) = (dead["msg"]["body"].clone(), dead["msg"]["type"].clone());
    let added = command(
        &mut admin,
        json!({"cmd": "addmsg", "body": body, "type": body_type}),
    )
    .await;
    assert_eq!(added["status"], "Success.");
    assert_ne!(added["id"], rejected.as_str(), "it gets a new id");
    assert_eq!(
        command(&mut admin, json!({"cmd": "deldlqmsg", "id": rejected})).await["status"],
        "Success."
    );
    let again = subscriber.recv().await;
    assert_eq!(
        (&again["id"], &again["body"], &again["type"]),
        (&added["id"], &json!("aGVsbG8="), &json!(2))
    );
    let list = command(
        &mut admin,
        json!({"cmd": "getdlqmsgs", "after": "", "count": 10}),
    )
    .await;
    assert_eq!(list["csv"], "");
    assert_failure(
        &command(
            &mut admin,
            json!({"cmd": "addmsg", "body": "x", "delay": -1}),
        )
        .await,
        203,
    );
}

#[tokio::test]
async fn getcfg_and_setcfg_all_or_nothing_and_kept_across_a_kill() {
    let mut node = Node::start();
    let mut admin = admin(&node).await;
    let reply = command(&mut admin, json!({"cmd": "getcfg"})).await;
    let lines: Vec<&str> = reply["csv"].as_str().unwrap().lines().collect();
    let names: Vec<&str> = lines.iter().map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(
        names,
        [
            "max-ws-msg-len",
            "max-subscriber-capacity",
            "saved-session-timeout-secs",
            "no-reply-timeout-secs",
            "stats-frequency-secs",
            "stats-retention-period-yrs",
            "usage-frequency-secs",
            "usage-retention-period-yrs",
            "max-receive-count",
            "message-retention-secs",
            "visibility-timeout-secs",
            "delay-secs",
            "receive-wait-secs",
            "fifo-queue",
            "content-based-deduplication",
            "max-tasks",
            "max-messages",
            "max-messages-memory",
            "messages-memory-used",
            "max-write-queue-bytes",
            "message-timeout-secs",
            "log-level",
        ]
    );
    assert_eq!(lines[0], "max-ws-msg-len,w,65536");
    assert_eq!(lines[2], "saved-session-timeout-secs,w,10");
    assert_eq!(lines[8], "max-receive-count,w,0");
    assert_eq!(lines[9], "message-retention-secs,w,0");
    assert_eq!(lines[10], "visibility-timeout-secs,w,30");
    assert_eq!(lines[11], "delay-secs,w,0");
    assert_eq!(lines[12], "receive-wait-secs,w,0");
    assert_eq!(lines[13], "fifo-queue,w,0");
    assert_eq!(lines[19], "max-write-queue-bytes,r,4194304");

    let cases = [
        (json!({"cmd": "setcfg", "max-subscriber-capacity": 0}), 414),
        (
            json!({"cmd": "setcfg", "max-subscriber-capacity": "5"}),
            414,
        ),
        (json!({"cmd": "setcfg", "max-tasks": 5}), 415),
        (json!({"cmd": "setcfg", "no-such-setting": 5}), 416),
        (json!({"cmd": "setcfg"}), 416),
        (
            json!({"cmd": "setcfg", "max-subscriber-capacity": 5, "max-tasks": 5}),
            415,
        ),
        (
            json!({"cmd": "setcfg", "max-subscriber-capacity": 5, "saved-session-timeout-secs": 9}),
            414,
        ),
    ];
    for (request, code) in cases {
        assert_failure(&command(&mut admin, request).await, code);
    }
    let reply = command(
        &mut admin,
        json!({"cmd": "setcfg", "max-subscriber-capacity": 0}),
    )
    .await;
    assert_eq!(
        reply["reason"],
        "Invalid max-subscriber-capacity. Must be between 1 and 1024."
    );
    let reply = command(&mut admin, json!({"cmd": "setcfg", "max-tasks": 5})).await;
    assert_eq!(reply["reason"], "Read only parameter max-tasks specified.");
    let unchanged = command(&mut admin, json!({"cmd": "getcfg"})).await;
    assert!(
        unchanged["csv"]
            .as_str()
            .unwrap()
            .contains("max-subscriber-capacity,w,1024\n"),
        "all or nothing"
    );

    let reply = command(
        &mut admin,
        json!({"cmd": "setcfg", "max-subscriber-capacity": 5, "saved-session-timeout-secs": 60}),
    )
    .await;
    assert_eq!(reply["status"], "Success.");
    // At once, for new requests.
    let mut client = Client::connect(&node).await;
    let login = qe_tests::login_request("subscriber", "distribute", json!({"capacity": 6}));
    assert_failure(&client.request(login).await, 300);

    node.kill();
    let node = node.restart(&[]);
    let mut admin = self::admin(&node).await;
    let kept = command(&mut admin, json!({"cmd": "getcfg"})).await;
    let csv = kept["csv"].as_str().unwrap();
    assert!(
        csv.contains("max-subscriber-capacity,w,5\n")
            && csv.contains("saved-session-timeout-secs,w,60\n"),
        "{csv}"
    );
}

#[tokio::test]
async fn an_unknown_command_is_400_and_text_that_is_not_json_closes() {
    let node = Node::start();
    let mut admin = admin(&node).await;
    for request in [
        json!({"cmd": "purge"}),
        json!({"nocmd": 1}),
        json!({"cmd": 5}),
    ] {
        assert_failure(&command(&mut admin, request).await, 400);
    }
    admin.send_text("getcfg").await;
    assert_failure(&admin.recv().await, 100);
    assert_eq!(admin.ending().await, Ending::NoCloseFrame);
}

#[tokio::test]
async fn getstats_and_getusage_check_the_day_and_the_flag() {
    let node = Node::start();
    let mut admin = admin(&node).await;
    // The node's first day, as a 407 for an older day names it.
    let old_day = json!({"cmd": "getstats", "year": 2020, "month": 1, "day": 1, "average": false});
    let refused = command(&mut admin, old_day).await;
    assert_failure(&refused, 407);
    let reason = refused["reason"].as_str().unwrap();
    let first = reason
        .strip_prefix("Invalid date, don't have data before ")
        .and_then(|r| r.strip_suffix('.'))
        .unwrap_or_else(|| panic!("{reason}"));
    let parts: Vec<u64> = first.split('-').map(|p| p.parse().unwrap()).collect();
    let today = (parts[0], parts[1], parts[2]);
    for (cmd, flag) in [("getstats", "average"), ("getusage", "totals")] {
        let (y, m, d) = today;
        let request = |fields: Value| {
            let mut request = json!({"cmd": cmd, "year": y, "month": m, "day": d, flag: false});
            for (key, value) in fields.as_object().unwrap() {
                if value.is_null() {
                    request.as_object_mut().unwrap().remove(key);
                } else {
                    request[key] = value.clone();
                }
            }
            request
        };
        for (fields, code) in [
            (json!({"year": null}), 404),
            (json!({"year": "2026"}), 404),
            (json!({"month": 13}), 405),
            (json!({"month": null}), 405),
            (json!({"day": 32}), 406),
            (json!({"month": 2, "day": 30}), 406),
            (json!({flag: null}), 408),
            (json!({flag: "yes"}), 408),
            (json!({"year": 2020, "month": 1, "day": 1}), 407),
        ] {
            assert_failure(&command(&mut admin, request(fields)).await, code);
        }
        // The day before the first is refused, the first is served.
        let (py, pm, pd) = if d > 1 {
            (y, m, d - 1)
        } else if m > 1 {
            (y, m - 1, 28)
        } else {
            (y - 1, 12, 31)
        };
        let previous = command(
            &mut admin,
            request(json!({"year": py, "month": pm, "day": pd})),
        )
        .await;
        assert_failure(&previous, 407);
        // Today: the records so far (none yet: the first comes at the next 5 minutes).
        for summary in [false, true] {
            let reply = command(&mut admin, request(json!({flag: summary}))).await;
            assert_eq!(reply["status"], "Success.", "{reply}");
            assert_eq!(reply["csv"], "");
        }
    }
}

#[tokio::test]
async fn settings_the_full_disk_cannot_take_get_506_or_505_as_they_applied_or_not() {
    let data_dir = tempfile::tempdir().unwrap();
    let meta = qe_tests::Tmpfs::mount(&data_dir.path().join("meta"), "4m");
    let node = Node::start_in(data_dir, &[]);
    let mut admin = admin(&node).await;
    let capacity = |reply: Value| {
        let csv = reply["csv"].as_str().unwrap().to_string();
        csv.lines().nth(1).unwrap().to_string()
    };
    meta.fill();
    // A change that still fits in what the store's file holds already is saved (Success:
    // it is on the disk). The first that needs more of the full disk is saved where the disk
    // could not sync it: it applies, and says so (506). Unless the settings store already
    // failed on a write of its own (the history's): then nothing is saved, and nothing
    // changes (505).
    let (mut value, mut last_saved) = (5, 1024);
    let reply = loop {
        let change = json!({"cmd": "setcfg", "max-subscriber-capacity": value});
        let reply = command(&mut admin, change).await;
        if reply["status"] != "Success." {
            break reply;
        }
        assert!(value < 1000, "a full disk took {value} changes");
        (last_saved, value) = (value, value + 1);
    };
    let (code, expected) = match reply["code"].as_u64() {
        Some(506) => (506, format!("max-subscriber-capacity,w,{value}")),
        Some(505) => (505, format!("max-subscriber-capacity,w,{last_saved}")),
        _ => panic!("a full disk, and {reply}"),
    };
    assert_failure(&reply, code);
    let settings = command(&mut admin, json!({"cmd": "getcfg"})).await;
    assert_eq!(capacity(settings), expected);
    // The settings store has failed since: nothing is saved, and nothing changes.
    let reply = command(
        &mut admin,
        json!({"cmd": "setcfg", "max-subscriber-capacity": 1001}),
    )
    .await;
    assert_failure(&reply, 505);
    let settings = command(&mut admin, json!({"cmd": "getcfg"})).await;
    assert_eq!(capacity(settings), expected);
}
