//! What nodes report and what the control plane makes of it, with the real binaries: usage
//! records through a delete and through an outage of the control plane, stats by day, bills.

use qe_tests::{
    http, http_text, login_with, node_of, process_naming, signal, today, ControlPlane, PROMPT,
};
use serde_json::json;

const PRICES: &str = "[prices]\nnetwork_out_gb = 0.09\nnetwork_in_gb = 0.02\n\
                      instance_hour = { \"local/local\" = 0.5 }\n";

#[tokio::test]
async fn a_deleted_queue_reports_its_last_usage_and_the_bill_counts_the_bytes_moved() {
    let cp = ControlPlane::start_with(PRICES);
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let logins = &queue["logins"];
    let mut subscriber = login_with(
        node,
        &logins["subscriber"],
        "subscriber",
        json!({"capacity": 20}),
    )
    .await;
    let mut publisher = login_with(node, &logins["publisher"], "publisher", json!({})).await;
    let text = "x".repeat(50_000);
    for _ in 0..20 {
        let reply = publisher.request(json!({"body": text})).await;
        assert_eq!(reply["status"], "Success.", "{reply}");
    }
    for _ in 0..20 {
        assert_eq!(subscriber.recv().await["body"], text.as_str());
    }

    let (status, _) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(status, 200);
    // The node made its last record when it stopped, and reported it before it went.
    let today = today();
    let path = format!("/v1/usage?from={today}&to={today}&queue={id}");
    let (status, usage) = cp.call("GET", &path, None).await;
    assert_eq!(status, 200, "{usage}");
    let records = usage["usage"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{usage}");
    let record = &records[0];
    let (sent, received) = (
        record["network_sent"].as_u64().unwrap(),
        record["network_received"].as_u64().unwrap(),
    );
    assert!(
        received > 20 * 50_000,
        "the published bodies came in: {record}"
    );
    assert!(sent > 20 * 50_000, "the deliveries went out: {record}");
    assert_eq!(record["queue"], id);
    let (_, csv) = http_text(
        cp.addr,
        "GET",
        &format!("{path}&format=csv"),
        Some(&cp.token),
        None,
    )
    .await;
    let csv_lines: Vec<&str> = csv.lines().collect();
    assert_eq!(csv_lines.len(), 2, "{csv}");
    assert!(csv_lines[1].starts_with(&format!("{id},")), "{csv}");

    let month = &today[..7];
    let (status, bill) = cp
        .call("GET", &format!("/v1/bills?month={month}&queue={id}"), None)
        .await;
    assert_eq!(status, 200, "{bill}");
    let line = |item: &str| {
        bill["lines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|line| line["item"] == item)
            .unwrap_or_else(|| panic!("no {item} in {bill}"))
            .clone()
    };
    let out = line("network out");
    let gb = |bytes: u64| (bytes as f64 / 1e9 * 1e6).round() / 1e6;
    assert_eq!(out["quantity"].as_f64(), Some(gb(sent)), "{bill}");
    let priced = (gb(sent) * 0.09 * 1e6).round() / 1e6;
    assert_eq!(out["amount"].as_f64(), Some(priced), "{bill}");
    assert_eq!(line("network in")["quantity"].as_f64(), Some(gb(received)));
    assert_eq!(line("instance local in local")["unit_price"], 0.5);

    for bad in [
        "/v1/usage?from=2026-13-01&to=2026-12-01",
        "/v1/usage?to=2026-11-31",
        "/v1/usage?from=2026-11-01&to=2026-11-02&format=xml",
        "/v1/bills?month=November",
    ] {
        let (status, error) = cp.call("GET", bad, None).await;
        assert_eq!(
            (status, error["error"]["code"].as_str()),
            (400, Some("bad_request")),
            "{bad}"
        );
    }
    let (status, _) = cp
        .call("GET", "/v1/bills?month=2026-11&queue=nosuchqueue", None)
        .await;
    assert_eq!(status, 404);
    // Without dates: this month so far, and this month's bill.
    let (status, this_month) = cp.call("GET", "/v1/usage", None).await;
    assert_eq!(status, 200, "{this_month}");
    assert_eq!(
        this_month["usage"], usage["usage"],
        "today's record is this month's"
    );
    let (status, this_bill) = cp.call("GET", "/v1/bills", None).await;
    assert_eq!(
        (status, this_bill["month"].as_str()),
        (200, Some(month)),
        "{this_bill}"
    );
}

#[tokio::test]
async fn records_made_while_the_control_plane_is_down_arrive_after_it_returns_once_each() {
    let mut cp = ControlPlane::start();
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let (id, node) = (
        queue["id"].as_str().unwrap().to_string(),
        queue["node"].as_str().unwrap().to_string(),
    );
    let mut publisher =
        login_with(&node, &queue["logins"]["publisher"], "publisher", json!({})).await;
    let reply = publisher.request(json!({"body": "counted"})).await;
    assert_eq!(reply["status"], "Success.");

    // The control plane goes; the node stops meanwhile, making its last record, which it
    // cannot hand over. It stays in the node's history.
    cp.kill();
    let config = cp.node_dir(&id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");
    signal(pid, libc::SIGTERM);
    let deadline = std::time::Instant::now() + PROMPT;
    while process_naming(&config) == Some(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // Back, it starts the node again, which reports what it kept.
    let cp = cp.start_again();
    cp.wait_for_log("a node report was kept", 1);
    let path = format!("/v1/usage?from=1970-01-01&to=2999-12-31&queue={id}");
    let (_, usage) = cp.call("GET", &path, None).await;
    let records = usage["usage"].as_array().unwrap().clone();
    assert_eq!(records.len(), 1, "{usage}");
    assert!(records[0]["network_received"].as_u64().unwrap() > 0);

    // Sent again (a reply lost on the way), it is still one record.
    let table = cp.node_config(&id);
    let token = table["node_token"].as_str().unwrap();
    let (_, csv) = http_text(
        cp.addr,
        "GET",
        &format!("{path}&format=csv"),
        Some(&cp.token),
        None,
    )
    .await;
    assert_eq!(csv.lines().count(), 2, "{csv}");
    let (_, usage) = cp.call("GET", &path, None).await;
    let mut record = usage["usage"][0].clone();
    record.as_object_mut().unwrap().remove("queue");
    let report = json!({ "usage": [record] }).to_string();
    let reports = format!("/v1/nodes/{id}/reports");
    let (status, receipt) = http(cp.addr, "POST", &reports, Some(token), Some(&report)).await;
    assert_eq!(status, 200);
    assert_eq!(
        receipt,
        json!({"usage": {"new": 0, "already_kept": 1}, "stats": {"new": 0, "already_kept": 0}}),
        "the receipt says it was kept already"
    );
    let (_, usage) = cp.call("GET", &path, None).await;
    assert_eq!(usage["usage"].as_array().unwrap().len(), 1, "{usage}");

    // A node's token is its own queue's only; the operator's is not a node's.
    let (status, _) = http(
        cp.addr,
        "POST",
        "/v1/nodes/otherqueue/reports",
        Some(token),
        Some(&report),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = http(cp.addr, "POST", &reports, Some(&cp.token), Some(&report)).await;
    assert_eq!(status, 401);
    let bad = json!({"usage": [{"time": 1}]}).to_string();
    let (status, _) = http(cp.addr, "POST", &reports, Some(token), Some(&bad)).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn the_stats_nodes_report_are_served_by_day_as_json_and_csv() {
    let cp = ControlPlane::start();
    let queue = cp
        .create_queue(r#"{"tier":"devtest","region":"local","instance_type":"local"}"#)
        .await;
    let id = queue["id"].as_str().unwrap();
    let table = cp.node_config(id);
    let token = table["node_token"].as_str().unwrap();
    // 2026-11-09 00:05 and 2026-11-10 00:05 UTC, in the manual's getstats form.
    let stats = |time: u64, counters: [u64; 9]| {
        let mut record = json!({ "time": time });
        let names = [
            "messages",
            "publishers",
            "subscribers",
            "saved_subscribers",
            "administrators",
            "unacknowledged",
            "dead_letter",
            "delayed",
            "durable",
        ];
        for (name, count) in names.iter().zip(counters) {
            record[*name] = json!(count);
        }
        record
    };
    let report = json!({"stats": [
        stats(1794182700, [10, 0, 1, 0, 1, 3, 0, 1, 9]),
        stats(1794269100, [1, 2, 3, 4, 5, 6, 7, 8, 9]),
    ]});
    let path = format!("/v1/nodes/{id}/reports");
    let (status, _) = http(
        cp.addr,
        "POST",
        &path,
        Some(token),
        Some(&report.to_string()),
    )
    .await;
    assert_eq!(status, 200);

    let (status, stats) = cp
        .call("GET", "/v1/stats?from=2026-11-09&to=2026-11-09", None)
        .await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(
        stats["stats"],
        json!([{"queue": id, "time": 1794182700u64, "messages": 10, "publishers": 0,
            "subscribers": 1, "saved_subscribers": 0, "administrators": 1,
            "unacknowledged": 3, "dead_letter": 0, "delayed": 1, "durable": 9}])
    );
    let both = format!("/v1/stats?from=2026-11-09&to=2026-11-10&queue={id}&format=csv");
    let (status, csv) = http_text(cp.addr, "GET", &both, Some(&cp.token), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        csv,
        format!(
            "queue,time,messages,publishers,subscribers,saved_subscribers,administrators,\
             unacknowledged,dead_letter,delayed,durable,published,delivered\r\n\
             {id},1794182700,10,0,1,0,1,3,0,1,9,,\r\n{id},1794269100,1,2,3,4,5,6,7,8,9,,\r\n"
        )
    );
    let (status, _) = cp
        .call("GET", "/v1/stats?from=2026-11-09&to=nope", None)
        .await;
    assert_eq!(status, 400);
    let (status, _) = cp
        .call(
            "GET",
            "/v1/stats?from=2026-11-09&to=2026-11-09&queue=none",
            None,
        )
        .await;
    assert_eq!(status, 404);
    let bad = json!({"stats": [{"time": 1794182700u64, "messages": 1}]}).to_string();
    let (status, _) = http(cp.addr, "POST", &path, Some(token), Some(&bad)).await;
    assert_eq!(status, 400, "a stats line has a time and nine counters");
}

/// `usage_record_secs` (what `controlplane dev` sets, to 60): a running queue's traffic is in
/// a usage record, and so in its bill, within that time, with the queue still running.
#[tokio::test]
async fn with_usage_record_secs_a_running_queues_traffic_is_billed_soon_after_it() {
    let cp = ControlPlane::start_with(&format!("usage_record_secs = 1\n{PRICES}"));
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let (id, node) = (queue["id"].as_str().unwrap(), node_of(&queue));
    let mut publisher =
        login_with(node, &queue["logins"]["publisher"], "publisher", json!({})).await;
    let text = "y".repeat(10_000);
    let reply = publisher.request(json!({"body": text})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let today = today();
    let path = format!("/v1/usage?from={today}&to={today}&queue={id}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, usage) = cp.call("GET", &path, None).await;
        assert_eq!(status, 200, "{usage}");
        let received: u64 = usage["usage"]
            .as_array()
            .unwrap()
            .iter()
            .map(|record| record["network_received"].as_u64().unwrap())
            .sum();
        if received > 10_000 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no usage record with the publish: {usage}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (_, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(queue["status"], "running", "billed while it runs");
    let (status, bill) = cp.call("GET", &format!("/v1/bills?queue={id}"), None).await;
    assert_eq!(status, 200, "{bill}");
    let network_in = bill["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|line| line["item"] == "network in")
        .unwrap_or_else(|| panic!("a network-in line: {bill}"));
    assert!(network_in["quantity"].as_f64().unwrap() > 0.0, "{bill}");
    assert!(bill["total"].as_f64().unwrap() > 0.0, "{bill}");
}

/// Each stats record carries the messages published and delivered in its interval (beyond
/// the manual's nine columns, which `getstats` keeps): what a real node counted reaches
/// `/v1/stats`, as JSON and as CSV. `stats_record_secs` (dev sets 60) makes a record a second.
#[tokio::test]
async fn stats_records_count_the_messages_published_and_delivered_in_their_interval() {
    let cp = ControlPlane::start_with("stats_record_secs = 1\n");
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let (id, node, logins) = (
        queue["id"].as_str().unwrap(),
        node_of(&queue),
        &queue["logins"],
    );
    let capacity = json!({"capacity": 2});
    let mut subscriber = login_with(node, &logins["subscriber"], "subscriber", capacity).await;
    let mut publisher = login_with(node, &logins["publisher"], "publisher", json!({})).await;
    for n in 0..3 {
        let reply = publisher.request(json!({"body": format!("m{n}")})).await;
        assert_eq!(reply["status"], "Success.", "{reply}");
    }
    // Capacity 2: two of the three are delivered (and held, not acked).
    for _ in 0..2 {
        assert!(subscriber.recv().await["id"].is_string());
    }
    let today = today();
    let path = format!("/v1/stats?from={today}&to={today}&queue={id}");
    let sum = |stats: &serde_json::Value, key: &str| -> u64 {
        let records = stats["stats"].as_array().unwrap();
        records.iter().filter_map(|r| r[key].as_u64()).sum()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let stats = loop {
        let (status, stats) = cp.call("GET", &path, None).await;
        assert_eq!(status, 200, "{stats}");
        if sum(&stats, "published") == 3 && sum(&stats, "delivered") == 2 {
            break stats;
        }
        assert!(
            sum(&stats, "published") <= 3 && sum(&stats, "delivered") <= 2,
            "counted twice: {stats}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no stats record with the flow: {stats}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let records = stats["stats"].as_array().unwrap();
    assert!(records.iter().all(|r| r["published"].is_u64()), "{stats}");
    let csv_path = format!("{path}&format=csv");
    let (status, csv) = http_text(cp.addr, "GET", &csv_path, Some(&cp.token), None).await;
    assert_eq!(status, 200, "{csv}");
    let header = csv.lines().next().unwrap();
    assert!(header.ends_with(",durable,published,delivered"), "{header}");
    let published: u64 = csv
        .lines()
        .skip(1)
        .map(|line| line.split(',').nth(11).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(published, 3, "{csv}");
    // The node's own getstats keeps the manual's nine columns.
    let mut admin = login_with(node, &logins["admin"], "admin", json!({})).await;
    let (year, month, day) = qe_shared::calendar::civil_from_days(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            / 86_400,
    );
    let reply = admin
        .request(
            json!({"cmd": "getstats", "average": false, "year": year, "month": month, "day": day}),
        )
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    for line in reply["csv"].as_str().unwrap().lines() {
        assert_eq!(line.split(',').count(), 10, "{line}");
    }
}

/// Records made while the control plane is down outlive a kill -9 of the node: each is on
/// the disk (synced) before the node counts it as made. Started again by the control plane
/// once it is back, the node reports every record it had shown, each once.
#[tokio::test]
async fn records_made_while_the_control_plane_is_down_outlive_a_kill_of_the_node() {
    let mut cp = ControlPlane::start_with(&format!("usage_record_secs = 1\n{PRICES}"));
    let body = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;
    let queue = cp.create_queue(body).await;
    let (id, node) = (queue["id"].as_str().unwrap().to_string(), node_of(&queue));
    let mut admin = login_with(node, &queue["logins"]["admin"], "admin", json!({})).await;
    cp.kill();

    // Three records made while it is down, as the node's own `getusage` shows them.
    let day: Vec<u64> = today().split('-').map(|p| p.parse().unwrap()).collect();
    let ask =
        json!({"cmd": "getusage", "year": day[0], "month": day[1], "day": day[2], "totals": false});
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let made = loop {
        let reply = admin.request(ask.clone()).await;
        assert_eq!(reply["status"], "Success.", "{reply}");
        let times = qe_tests::record_times(&reply);
        if times.len() >= 3 {
            break times;
        }
        assert!(std::time::Instant::now() < deadline, "no records: {reply}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let config = cp.node_dir(&id).join("bootstrap.toml");
    let pid = process_naming(&config).expect("the node runs");
    signal(pid, libc::SIGKILL);
    while process_naming(&config) == Some(pid) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    let cp = cp.start_again();
    let path = format!("/v1/usage?from=1970-01-01&to=2999-12-31&queue={id}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (status, usage) = cp.call("GET", &path, None).await;
        assert_eq!(status, 200, "{usage}");
        let mut kept: Vec<u64> = usage["usage"]
            .as_array()
            .unwrap()
            .iter()
            .map(|record| record["time"].as_u64().unwrap())
            .collect();
        let count = kept.len();
        kept.sort();
        kept.dedup();
        assert_eq!(kept.len(), count, "each record once: {usage}");
        if made.iter().all(|time| kept.contains(time)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "records made before the kill are missing: made {made:?}, kept {kept:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
