//! The control plane keeps its conventions under bad input (issue 15): every error is the
//! README's JSON, labels cannot break a record or a CSV row, nothing without a token costs
//! much, and its state is handled with care. Real binaries on loopback.

use qe_tests::disks::FailingSyncs;
use qe_tests::{
    http, http_response, http_text, https, roots_from_pem, run_python, ControlPlane, PROMPT,
};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

const LOCAL_QUEUE: &str = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;

/// A raw request's status, its headers (names in lower case) and its body as JSON.
async fn raw(addr: SocketAddr, request: &str) -> (u16, Vec<(String, String)>, Value) {
    let response = http_response(addr, request).await;
    let (head, body) = response.split_once("\r\n\r\n").expect("a whole response");
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let body = serde_json::from_str(body).unwrap_or_else(|_| json!({ "not json": body }));
    (status, headers, body)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The API's stable error codes, as its OpenAPI document lists them.
async fn documented_codes(cp: &ControlPlane) -> Vec<String> {
    let (status, document) = http(cp.addr, "GET", "/openapi.json", None, None).await;
    assert_eq!(status, 200);
    let codes = &document["components"]["schemas"]["Error"]["properties"]["error"]["properties"]
        ["code"]["enum"];
    codes
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect()
}

fn assert_error(body: &Value, code: &str, codes: &[String]) {
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    assert!(codes.iter().any(|c| c == code), "{code} is documented");
}

#[tokio::test]
async fn every_error_the_router_and_extractors_give_is_the_readmes_json() {
    let cp = ControlPlane::start();
    let codes = documented_codes(&cp).await;
    let token = &cp.token;
    let request = |method: &str, path: &str, extra: &str| {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: cp\r\nAuthorization: Bearer {token}\r\n{extra}\
             Connection: close\r\n\r\n"
        )
    };

    // A path that is not UTF-8: 400, in JSON.
    let (status, headers, body) = raw(cp.addr, &request("GET", "/v1/queues/%ff%fe", "")).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert_error(&body, "bad_request", &codes);

    // A method the route does not take: 405, with the ones it does in `Allow`.
    for (method, path, allowed) in [
        ("PUT", "/v1/queues", "GET,HEAD,POST"),
        ("PATCH", "/v1/queues", "GET,HEAD,POST"),
        ("GET", "/v1/certificate/renew", "POST"),
        ("POST", "/v1/queues/abc", "GET,HEAD,DELETE"),
    ] {
        let extra = "Content-Length: 0\r\n";
        let (status, headers, body) = raw(cp.addr, &request(method, path, extra)).await;
        assert_eq!(status, 405, "{method} {path}: {body}");
        assert_error(&body, "method_not_allowed", &codes);
        let mut allow: Vec<&str> = header(&headers, "allow")
            .unwrap_or_else(|| panic!("{method} {path}: no Allow"))
            .split(',')
            .map(str::trim)
            .collect();
        allow.sort();
        let mut expected: Vec<&str> = allowed.split(',').collect();
        expected.sort();
        assert_eq!(allow, expected, "{method} {path}");
    }

    // No such route: 404.
    let (status, _, body) = raw(cp.addr, &request("GET", "/nothing/here", "")).await;
    assert_eq!(status, 404);
    assert_error(&body, "not_found", &codes);

    // A query that does not read: 400.
    let (status, _, body) = raw(cp.addr, &request("GET", "/v1/usage?from=1&bogus=2", "")).await;
    assert_eq!(status, 400);
    assert_error(&body, "bad_request", &codes);

    // A body that is not declared JSON: 415; one too large: 413; one that is not JSON: 400.
    let plain = "Content-Type: text/plain\r\nContent-Length: 2\r\n";
    let (status, _, body) = raw(cp.addr, &(request("POST", "/v1/queues", plain) + "{}")).await;
    assert_eq!(status, 415, "{body}");
    assert_error(&body, "unsupported_media_type", &codes);
    let large = format!("{{\"tier\":\"{}\"}}", "x".repeat(200 * 1024));
    let (status, body) = http(cp.addr, "POST", "/v1/queues", Some(token), Some(&large)).await;
    assert_eq!(status, 413, "{body}");
    assert_error(&body, "payload_too_large", &codes);
    let (status, body) = http(cp.addr, "POST", "/v1/queues", Some(token), Some("{nope")).await;
    assert_eq!(status, 400, "{body}");
    assert_error(&body, "bad_request", &codes);
}

#[tokio::test]
async fn a_label_that_could_break_a_record_is_refused_at_create() {
    let cp = ControlPlane::start();
    let codes = documented_codes(&cp).await;
    for (region, instance_type) in [
        ("eu,west-1", "local"),
        ("local", "t3 \"small\""),
        ("EU-WEST-1", "local"),
        ("local", "a\nb"),
        ("", "local"),
        ("local", &"a".repeat(64)),
    ] {
        let body = json!({"tier": "devtest", "region": region, "instance_type": instance_type});
        let (status, reply) = cp.call("POST", "/v1/queues", Some(&body.to_string())).await;
        assert_eq!(status, 400, "{region:?} {instance_type:?}: {reply}");
        assert_error(&reply, "bad_request", &codes);
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains("[a-z0-9][a-z0-9.-]{0,62}"), "{message}");
    }
    let (_, queues) = cp.call("GET", "/v1/queues", None).await;
    assert_eq!(queues["queues"], json!([]), "none was made");
}

/// Reads CSV with Python's own `csv` module: rows of fields.
async fn python_reads_csv(csv: &str) -> Vec<Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    let (data, script) = (dir.path().join("data.csv"), dir.path().join("read.py"));
    std::fs::write(&data, csv).unwrap();
    std::fs::write(
        &script,
        "import csv, json, sys\n\
         with open(sys.argv[1], newline='') as f:\n    print(json.dumps(list(csv.reader(f))))\n",
    )
    .unwrap();
    let out = run_python(&script, &[data.display().to_string()]).await;
    serde_json::from_str(&out).unwrap()
}

/// A usage record as a node reports it.
fn usage_record(time: u64, region: &str, instance_type: &str, ipv4: bool) -> Value {
    json!({"time": time, "network_sent": 1, "network_received": 2, "storage_written": 3,
        "storage_read": 4, "storage_held": 5, "instance_type": instance_type,
        "region": region, "ipv4": ipv4})
}

#[tokio::test]
async fn records_round_trip_through_json_and_csv_and_a_node_bills_under_its_own_labels_only() {
    let prices = "[prices]\ninstance_hour = { \"*\" = 0.5 }\n";
    let cp = ControlPlane::start_with(prices);
    let codes = documented_codes(&cp).await;
    let queue = cp.create_queue(LOCAL_QUEUE).await;
    let id = queue["id"].as_str().unwrap();
    let table = cp.node_config(id);
    let node_token = table["node_token"].as_str().unwrap();
    let reports = format!("/v1/nodes/{id}/reports");
    let report = |body: Value| {
        let (addr, token, path) = (cp.addr, node_token.to_string(), reports.clone());
        async move { http(addr, "POST", &path, Some(&token), Some(&body.to_string())).await }
    };
    let now = 1_794_182_400; // 2026-11-09
                             // Records, and a line as a node of the release before sends it.
    let usage: Vec<Value> = (0..3)
        .map(|n| usage_record(now + n, "local", "local", false))
        .chain([json!(format!("{},7,8,9,10,11,local,local,0", now + 3))])
        .collect();
    let (status, receipt) = report(json!({ "usage": usage })).await;
    assert_eq!(status, 200, "{receipt}");
    assert_eq!(receipt["usage"], json!({"new": 4, "already_kept": 0}));
    // Sent again (its reply lost), each is kept once, and the receipt says so.
    let (_, receipt) = report(json!({ "usage": usage })).await;
    assert_eq!(receipt["usage"], json!({"new": 0, "already_kept": 4}));
    // A node may not bill itself under labels that are not its queue's (priced otherwise,
    // or at nothing): the report is refused whole.
    let other = [
        usage_record(now + 10, "local", "local", false),
        usage_record(now + 11, "eu-west-1", "local", false),
    ];
    let (status, body) = report(json!({ "usage": other })).await;
    assert_eq!(status, 400, "{body}");
    assert_error(&body, "bad_request", &codes);

    let path = format!("/v1/usage?from=2026-11-09&to=2026-11-09&queue={id}");
    let (status, json_rows) = cp.call("GET", &path, None).await;
    assert_eq!(status, 200);
    let json_rows = json_rows["usage"].as_array().unwrap().clone();
    assert_eq!(
        json_rows.len(),
        4,
        "nothing of the refused report: {json_rows:?}"
    );
    let (_, csv) = http_text(
        cp.addr,
        "GET",
        &format!("{path}&format=csv"),
        Some(&cp.token),
        None,
    )
    .await;
    let rows = python_reads_csv(&csv).await;
    let columns = &rows[0];
    assert_eq!(
        rows.len(),
        1 + json_rows.len(),
        "one row per record: {csv:?}"
    );
    for (row, record) in rows[1..].iter().zip(&json_rows) {
        for (column, field) in columns.iter().zip(row) {
            let expected = match &record[column] {
                Value::String(text) => text.clone(),
                Value::Bool(ipv4) => (*ipv4 as u8).to_string(),
                other => other.to_string(),
            };
            assert_eq!(field, &expected, "{column}");
        }
    }

    // The bill's CSV reads back as its JSON, and every line multiplies out as shown.
    let (status, bill) = cp
        .call("GET", &format!("/v1/bills?month=2026-11&queue={id}"), None)
        .await;
    assert_eq!(status, 200, "{bill}");
    let lines = bill["lines"].as_array().unwrap();
    let path = format!("/v1/bills?month=2026-11&queue={id}&format=csv");
    let (_, csv) = http_text(cp.addr, "GET", &path, Some(&cp.token), None).await;
    let rows = python_reads_csv(&csv).await;
    assert_eq!(rows.len(), 1 + lines.len(), "{csv:?}");
    for (row, line) in rows[1..].iter().zip(lines) {
        assert_eq!(row[0], line["queue"].as_str().unwrap());
        assert_eq!(row[1], line["item"].as_str().unwrap());
        let number = |n: usize| row[n].parse::<f64>().unwrap();
        assert_eq!(number(2), line["quantity"].as_f64().unwrap());
        assert_eq!(number(5), line["amount"].as_f64().unwrap());
        let product = (number(2) * number(4) * 1e6).round() / 1e6;
        assert_eq!(product, number(5), "{row:?}");
    }

    // A node's whole batch (500 records, well over the 64 KiB other routes take) is taken;
    // a body over the reports' 1 MiB is refused in JSON.
    let batch = |count: u64| -> Vec<Value> {
        (0..count)
            .map(|n| usage_record(now + 1000 + n, "local", "local", false))
            .collect()
    };
    let (status, receipt) = report(json!({ "usage": batch(500) })).await;
    assert_eq!(status, 200, "{receipt}");
    assert_eq!(receipt["usage"]["new"], 500);
    let (status, body) = report(json!({ "usage": batch(8000) })).await;
    assert_eq!(status, 413, "{body}");
    assert_error(&body, "payload_too_large", &codes);
}

#[tokio::test]
async fn hostile_fields_survive_our_csv_as_pythons_csv_module_reads_them() {
    let rows: Vec<Vec<&str>> = vec![
        vec!["queue", "region", "instance_type"],
        vec!["q1", "eu,\"west\"\r\n1", "t3 \"small\", big"],
        vec!["q2", "line\nbreak", "comma,,"],
        vec!["q3", "\"", ","],
        vec!["q4", "", "plain"],
    ];
    let csv: String = rows
        .iter()
        .map(|row| controlplane::api::csv::row(row.iter().copied()))
        .collect();
    let read = python_reads_csv(&csv).await;
    assert_eq!(read, rows, "{csv:?}");
}

#[tokio::test]
async fn the_token_is_checked_before_a_body_is_read_and_methods_cannot_grow_the_metrics() {
    let cp = ControlPlane::start();
    let queue = cp.create_queue(LOCAL_QUEUE).await;
    let id = queue["id"].as_str().unwrap();
    // A request that says a large body follows, and sends none: refused at once for want of
    // a token, on an operator route and on a node route alike, never waited on.
    for path in ["/v1/queues".to_string(), format!("/v1/nodes/{id}/reports")] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: cp\r\nAuthorization: Bearer wrong\r\n\
             Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
        );
        let mut tcp = tokio::net::TcpStream::connect(cp.addr).await.unwrap();
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut head = vec![0u8; 12];
        tokio::time::timeout(PROMPT, tcp.read_exact(&mut head))
            .await
            .unwrap_or_else(|_| panic!("{path}: the API waited for the body"))
            .unwrap();
        assert_eq!(&head, b"HTTP/1.1 401", "{path}");
    }

    // Methods nobody uses count as `other`; unknown paths as `unmatched`.
    for n in 0..20 {
        let request =
            format!("FOO{n} /v1/queues/x{n} HTTP/1.1\r\nHost: cp\r\nConnection: close\r\n\r\n");
        http_response(cp.addr, &request).await;
        let request = format!("GET /random/{n} HTTP/1.1\r\nHost: cp\r\nConnection: close\r\n\r\n");
        http_response(cp.addr, &request).await;
    }
    let (_, metrics) = http_text(cp.addr, "GET", "/metrics", Some(&cp.token), None).await;
    assert!(!metrics.contains("FOO"), "{metrics}");
    assert!(!metrics.contains("/random/"), "{metrics}");
    assert!(metrics.contains("method=\"other\""), "{metrics}");
    let series = metrics
        .lines()
        .filter(|l| l.starts_with("qe_api_request_duration_seconds_count"))
        .count();
    assert!(
        series < 20,
        "{series} series for 40 odd requests:\n{metrics}"
    );
}

#[tokio::test]
async fn a_damaged_node_secret_stops_the_control_plane_and_a_missing_one_is_made_once() {
    if qe_tests::on_etcd() {
        return eprintln!("sled's node-secret file: on etcd the secret is in the store");
    }
    let cp = ControlPlane::start();
    let secret = cp.dir.path().join("data/node-secret");
    let made = std::fs::read(&secret).unwrap();
    assert_eq!(made.len(), 32);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Made once: a restart reads it, never makes another.
    let cp = cp.restart();
    assert_eq!(std::fs::read(&secret).unwrap(), made, "the same secret");
    drop(cp);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("controlplane.toml");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("node-secret"), b"half a secret").unwrap();
    std::fs::write(
        &config,
        format!("data_dir = {data:?}\ntoken = \"t\"\nlisten = \"127.0.0.1:0\"\n"),
    )
    .unwrap();
    let output = tokio::time::timeout(
        PROMPT,
        tokio::process::Command::new(qe_tests::controlplane_binary())
            .args(["serve", "--config"])
            .arg(&config)
            .output(),
    )
    .await
    .expect("it stops by itself")
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let named = data.join("node-secret").display().to_string();
    assert!(
        stderr.contains(&named) && stderr.contains("damaged"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(data.join("node-secret")).unwrap(),
        b"half a secret",
        "never replaced"
    );
}

// Multi-threaded: the creates run while this thread waits for the disk to be held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_disk_delays_the_writes_only_never_the_api() {
    if qe_tests::on_etcd() {
        return eprintln!("sled's disk: on etcd the control plane writes to no disk of its own");
    }
    let disk = FailingSyncs::mount();
    let cp = ControlPlane::start_in(tempfile::tempdir_in(disk.dir()).unwrap(), "");
    let held = disk.hold();
    // More creates at once than the runtime has workers: each waits for its write and sync.
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let creates: Vec<_> = (0..2 * workers.max(2))
        .map(|_| {
            let (addr, token) = (cp.addr, cp.token.clone());
            tokio::spawn(async move {
                http(addr, "POST", "/v1/queues", Some(&token), Some(LOCAL_QUEUE)).await
            })
        })
        .collect();
    disk.wait_for_held();
    // While they wait, the API still answers.
    let health = tokio::time::timeout(PROMPT, http(cp.addr, "GET", "/healthz", None, None));
    let (status, _) = health
        .await
        .expect("the API answers while the disk is held");
    assert_eq!(status, 200);
    let (status, _) = tokio::time::timeout(PROMPT, cp.call("GET", "/v1/queues", None))
        .await
        .expect("reads answer while the disk is held");
    assert_eq!(status, 200);
    assert!(
        creates.iter().all(|create| !create.is_finished()),
        "the creates wait for their syncs"
    );
    drop(held);
    for create in creates {
        let (status, reply) = create.await.unwrap();
        assert_eq!(status, 201, "{reply}");
    }
}

#[tokio::test]
async fn tls_handshakes_are_capped_per_source_and_other_sources_are_served() {
    let ca = qe_tests::test_ca("control plane CA for tests");
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let files = tempfile::tempdir().unwrap();
    let path = |name: &str| files.path().join(name);
    std::fs::write(path("api.pem"), leaf.pem()).unwrap();
    std::fs::write(path("api-key.pem"), key.serialize_pem()).unwrap();
    let cp = ControlPlane::start_with(&format!(
        "[api_tls]\ncert = {:?}\nkey = {:?}\n",
        path("api.pem"),
        path("api-key.pem")
    ));
    // Connections from one address that never say hello: past 16 under way, the next ones
    // are closed at once, long before the 10 s a handshake may take.
    let mut silent = Vec::new();
    for _ in 0..40 {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.7:0".parse().unwrap()).unwrap();
        silent.push(socket.connect(cp.addr).await.unwrap());
    }
    let closed_at_once = silent.iter_mut().map(|tcp| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(3), tcp.read(&mut byte)).await;
        matches!(read, Ok(Ok(0)) | Ok(Err(_)))
    });
    let closed = futures::future::join_all(closed_at_once).await;
    assert_eq!(closed.iter().filter(|c| **c).count(), 40 - 16, "{closed:?}");
    // Another address is served meanwhile.
    let roots = roots_from_pem(&ca.pem());
    let (status, _) = https(cp.addr, roots, "GET", "/healthz", None, None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_client_that_drips_its_headers_is_closed() {
    let cp = ControlPlane::start();
    let mut tcp = tokio::net::TcpStream::connect(cp.addr).await.unwrap();
    tcp.write_all(b"GET /v1/queues HTTP/1.1\r\nHost: cp\r\n")
        .await
        .unwrap();
    // A header line a second, never the end of the head: the server closes the connection
    // once the head has taken its 20 s, without an answer.
    let dripping = async {
        let mut byte = [0u8; 1];
        loop {
            tokio::select! {
                read = tcp.read(&mut byte) => return read,
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if tcp.write_all(b"X-Slow: a\r\n").await.is_err() {
                        return Ok(0);
                    }
                }
            }
        }
    };
    let read = tokio::time::timeout(PROMPT * 4, dripping)
        .await
        .expect("closed within the head's time");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}
