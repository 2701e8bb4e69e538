//! Every queue's numbers in the control plane's `/metrics`, with the real binaries: a node's
//! live report shows the numbers its own `getlivestats` and `getcfg` give, labelled with its
//! queue and account, and they are gone once the queue is deleted; a TLS node reports its
//! certificate's expiry; the alerting rules and the dashboard in infra/ name only metrics the
//! scrape has. Each scrape is read by Prometheus's own text-format parser (Python's
//! `prometheus_client`); nodes report every second here (`live_stats_secs = 1`), and the
//! tests poll the scrape until it shows what they wait for, with a deadline.

use qe_tests::{http_text, login_with, node_of, run_python, workspace, Client, ControlPlane};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Nodes report every second: a change shows within a second or two.
const CONFIG: &str = "live_stats_secs = 1\n";

/// How long a test waits for the scrape to show something.
const WITHIN: Duration = Duration::from_secs(30);

/// Reads a scrape (the file named first) with `prometheus_client`'s parser; prints every
/// family and sample as JSON.
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
families, samples = [], []
for family in text_string_to_metric_families(open(sys.argv[1]).read()):
    families.append({"name": family.name, "type": family.type})
    for sample in family.samples:
        samples.append({"name": sample.name, "labels": sample.labels, "value": sample.value})
print(json.dumps({"families": families, "samples": samples}))
"#;

/// Reads Prometheus rule files (YAML) and prints every rule as JSON.
const RULES: &str = r#"
import json, sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
print(json.dumps([rule for group in rules["groups"] for rule in group["rules"]]))
"#;

struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// One scrape as the parser read it.
struct Scrape {
    /// Each family's name with its type; a counter's name without `_total`, as the parser
    /// gives it.
    families: Vec<(String, String)>,
    samples: Vec<Sample>,
}

impl Scrape {
    /// `/metrics` now, parsed.
    async fn of(cp: &ControlPlane) -> Scrape {
        let token = Some(cp.token.as_str());
        let (status, text) = http_text(cp.addr, "GET", "/metrics", token, None).await;
        assert_eq!(status, 200, "{text}");
        let dir = tempfile::tempdir().unwrap();
        let (script, scrape) = (dir.path().join("parse.py"), dir.path().join("scrape"));
        std::fs::write(&script, PARSE).unwrap();
        std::fs::write(&scrape, &text).unwrap();
        let parsed: Value =
            serde_json::from_str(&run_python(&script, &[scrape.display().to_string()]).await)
                .unwrap();
        let text_of = |value: &Value| value.as_str().unwrap().to_string();
        let families = parsed["families"].as_array().unwrap().iter();
        let samples = parsed["samples"].as_array().unwrap().iter();
        Scrape {
            families: families
                .map(|f| (text_of(&f["name"]), text_of(&f["type"])))
                .collect(),
            samples: samples
                .map(|s| Sample {
                    name: text_of(&s["name"]),
                    labels: serde_json::from_value(s["labels"].clone()).unwrap(),
                    value: s["value"].as_f64().unwrap(),
                })
                .collect(),
        }
    }

    /// Queue `id`'s samples.
    fn of_queue<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        let of = move |s: &&Sample| s.labels.get("queue").is_some_and(|queue| queue == id);
        self.samples.iter().filter(of)
    }

    /// The value of `name` for queue `id` with `extra` labels, if there is that series.
    fn value(&self, id: &str, name: &str, extra: &[(&str, &str)]) -> Option<f64> {
        let matches = |s: &&Sample| {
            s.name == name
                && extra
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
        };
        self.of_queue(id).find(matches).map(|s| s.value)
    }

    /// Every metric name a query may use: each sample's, each family's, and a counter
    /// family's with `_total`.
    fn names(&self) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self.samples.iter().map(|s| s.name.clone()).collect();
        for (name, kind) in &self.families {
            names.insert(name.clone());
            if kind == "counter" {
                names.insert(format!("{name}_total"));
            }
        }
        names
    }
}

/// The scrape once `ready` holds for it; panics after [`WITHIN`].
async fn scrape_until(cp: &ControlPlane, what: &str, ready: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + WITHIN;
    loop {
        let scrape = Scrape::of(cp).await;
        if ready(&scrape) {
            return scrape;
        }
        assert!(Instant::now() < deadline, "the scrape never showed {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An admin's answer to `cmd`: its `csv`.
async fn admin_csv(admin: &mut Client, cmd: &str) -> String {
    let reply = admin.request(json!({"cmd": cmd})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    reply["csv"].as_str().unwrap().to_string()
}

/// Publishes `message`; the node takes it.
async fn publish(publisher: &mut Client, message: Value) {
    let reply = publisher.request(message).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
}

/// The subscriber's next frames until it has `deliveries` messages and `replies` replies;
/// returns the messages' ids (the two kinds may come in either order).
async fn receive(subscriber: &mut Client, deliveries: usize, replies: usize) -> Vec<String> {
    let (mut ids, mut answered) = (Vec::new(), 0);
    while ids.len() < deliveries || answered < replies {
        let frame = subscriber.recv().await;
        match frame.get("body") {
            Some(_) => ids.push(frame["id"].as_str().unwrap().to_string()),
            None => {
                assert_eq!(frame["status"], "Success.", "{frame}");
                answered += 1;
            }
        }
    }
    ids
}

#[tokio::test]
async fn a_queues_series_match_its_nodes_own_counters_and_go_when_it_is_deleted() {
    let cp = ControlPlane::start_with(CONFIG);
    let (status, account) = cp
        .call("POST", "/v1/accounts", Some(r#"{"name":"Metrics"}"#))
        .await;
    assert_eq!(status, 201, "{account}");
    let account = account["id"].as_str().unwrap();
    let body = json!({"tier": "devtest", "region": "local", "instance_type": "local",
        "account": account});
    let queue = cp.create_queue(&body.to_string()).await;
    let id = queue["id"].as_str().unwrap();
    let (url, logins) = (node_of(&queue), &queue["logins"]);

    // Six published (one delayed), four delivered, one acked, one nacked: one waits, two are
    // held, one is delayed and one is dead-lettered.
    let mut publisher = login_with(url, &logins["publisher"], "publisher", json!({})).await;
    let mut subscriber = login_with(
        url,
        &logins["subscriber"],
        "subscriber",
        json!({"capacity": 2}),
    )
    .await;
    for body in ["m1", "m2", "m3"] {
        publish(&mut publisher, json!({"body": body})).await;
    }
    publish(&mut publisher, json!({"body": "later", "delay": 600})).await;
    let first = receive(&mut subscriber, 2, 0).await;
    subscriber
        .send_json(&json!({"id": first[0], "ack": 1}))
        .await;
    receive(&mut subscriber, 1, 1).await;
    subscriber
        .send_json(&json!({"id": first[1], "ack": 0}))
        .await;
    receive(&mut subscriber, 0, 1).await;
    publish(&mut publisher, json!({"body": "m5"})).await;
    receive(&mut subscriber, 1, 0).await;
    publish(&mut publisher, json!({"body": "m6"})).await;
    let mut admin = login_with(url, &logins["admin"], "admin", json!({})).await;
    let live = admin_csv(&mut admin, "getlivestats").await;
    assert_eq!(live, "5,1,1,0,1,2,1,1,5", "the node's own count");
    let config = admin_csv(&mut admin, "getcfg").await;
    let setting = |name: &str| -> f64 {
        let line = config.lines().find(|l| l.starts_with(&format!("{name},")));
        line.unwrap().rsplit(',').next().unwrap().parse().unwrap()
    };

    // The queue is quiet now: its next report shows what the node says.
    let columns: Vec<f64> = live.split(',').map(|n| n.parse().unwrap()).collect();
    let shows_the_node = |scrape: &Scrape| {
        let number = |name: &str, extra: &[(&str, &str)]| scrape.value(id, name, extra);
        let state = |state: &str| number("qe_queue_messages", &[("state", state)]);
        let role = |role: &str| number("qe_queue_connections", &[("role", role)]);
        let states = ["waiting", "delayed", "held", "dead_letter"];
        let messages: Option<f64> = states.iter().map(|s| state(s)).sum();
        let shown = vec![
            messages,
            role("publisher"),
            role("subscriber"),
            number("qe_queue_saved_sessions", &[]),
            role("admin"),
            state("held"),
            state("dead_letter"),
            state("delayed"),
            number("qe_queue_durable_messages", &[]),
        ];
        shown == columns.iter().map(|n| Some(*n)).collect::<Vec<_>>()
            && number("qe_queue_acked_messages_total", &[]) == Some(1.0)
    };
    let scrape = scrape_until(&cp, "the node's getlivestats", shows_the_node).await;
    let number = |name: &str| scrape.value(id, name, &[]);
    assert_eq!(
        scrape.value(id, "qe_queue_messages", &[("state", "waiting")]),
        Some(1.0)
    );
    for (name, total) in [
        ("qe_queue_published_messages_total", 6.0),
        ("qe_queue_delivered_messages_total", 4.0),
        ("qe_queue_acked_messages_total", 1.0),
        ("qe_queue_nacked_messages_total", 1.0),
    ] {
        assert_eq!(number(name), Some(total), "{name}");
    }
    for (name, setting_name) in [
        ("qe_queue_messages_memory_bytes", "messages-memory-used"),
        ("qe_queue_max_messages", "max-messages"),
        ("qe_queue_max_messages_memory_bytes", "max-messages-memory"),
    ] {
        assert_eq!(number(name), Some(setting(setting_name)), "{name}");
    }
    assert!(number("qe_queue_messages_memory_bytes").unwrap() > 0.0);
    for name in [
        "qe_queue_network_received_bytes_total",
        "qe_queue_network_sent_bytes_total",
    ] {
        assert!(number(name).unwrap() > 0.0, "{name}");
    }
    let age = number("qe_queue_report_age_seconds").unwrap();
    assert!((0.0..30.0).contains(&age), "{age}");
    let info = scrape.value(id, "qe_queue_info", &[("tier", "devtest")]);
    assert_eq!(info, Some(1.0));
    assert_eq!(
        number("qe_queue_certificate_expiry_timestamp_seconds"),
        None,
        "a node without TLS has no certificate"
    );
    for sample in scrape.of_queue(id) {
        assert_eq!(sample.labels["account"], account, "{}", sample.name);
    }
    let received = scrape
        .samples
        .iter()
        .find(|s| s.name == "qe_live_reports_total");
    assert!(received.unwrap().value >= 1.0);

    // The queue's view has the same numbers (what `qe queues list --live` shows).
    let (_, view) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    let live = &view["live"];
    let shown: Vec<&Value> = ["waiting", "delayed", "held", "dead_letter"]
        .iter()
        .map(|key| &live[key])
        .collect();
    assert_eq!(
        shown,
        [&json!(1), &json!(1), &json!(2), &json!(1)],
        "{view}"
    );
    assert!(live["age_secs"].as_f64().unwrap() < 30.0, "{view}");

    // Deleted: not one series of it is left.
    let (status, deleted) = cp.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert_eq!((status, deleted["status"].as_str()), (200, Some("deleted")));
    let after = Scrape::of(&cp).await;
    assert_eq!(
        deleted["live"],
        Value::Null,
        "a deleted queue's numbers are not shown"
    );
    let left: Vec<&String> = after.of_queue(id).map(|s| &s.name).collect();
    assert!(left.is_empty(), "series of a deleted queue: {left:?}");
    let deleted_count = after.samples.iter().find(|s| {
        s.name == "qe_queues" && s.labels.get("status").map(String::as_str) == Some("deleted")
    });
    assert_eq!(deleted_count.unwrap().value, 1.0);
}

#[tokio::test]
async fn a_tls_node_reports_its_certificate_and_the_alerts_and_dashboard_name_served_metrics() {
    let cp = ControlPlane::start_with(&format!("{CONFIG}local_ca = true\n"));
    let queue = cp
        .create_queue(r#"{"tier":"devtest","region":"local","instance_type":"local"}"#)
        .await;
    let id = queue["id"].as_str().unwrap();
    let name = "qe_queue_certificate_expiry_timestamp_seconds";
    let reported = |scrape: &Scrape| scrape.value(id, name, &[]).is_some();
    let scrape = scrape_until(&cp, "the certificate's expiry", reported).await;
    let pem = std::fs::read_to_string(cp.node_dir(id).join("data/tls/own-cert.pem")).unwrap();
    let (_, not_after) = qe_tls::validity::validity_of_pem(&pem).unwrap();
    assert_eq!(scrape.value(id, name, &[]), Some(not_after as f64));
    assert_eq!(scrape.value(id, "qe_queue_info", &[]), Some(1.0));
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.labels.get("queue").map(String::as_str) == Some(id)
                && s.labels["account"].is_empty()),
        "a queue of no account is labelled account=\"\""
    );

    let served = scrape.names();
    let unknown = |expr: &str| -> Vec<String> {
        metric_names(expr)
            .into_iter()
            .filter(|name| !served.contains(name))
            .collect()
    };
    // Each alerting rule: a name, an expression of served metrics, a severity, a summary.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("rules.py");
    std::fs::write(&script, RULES).unwrap();
    let file = workspace().join("infra/prometheus/alerts.yml");
    let rules: Value =
        serde_json::from_str(&run_python(&script, &[file.display().to_string()]).await).unwrap();
    let rules = rules.as_array().unwrap();
    let mut alerted = BTreeSet::new();
    // The jobs of the scrape config the docs give: rules on `up` and etcd's metrics name them.
    let scrape_config = workspace().join("infra/prometheus/prometheus.example.yml");
    let scrape_config = std::fs::read_to_string(scrape_config).unwrap();
    for rule in rules {
        let (alert, expr) = (&rule["alert"], rule["expr"].as_str().unwrap());
        let job = expr
            .split("job=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        match job {
            Some(job) => assert!(
                scrape_config.contains(&format!("job_name: {job}\n")),
                "{alert}: job {job} is not scraped by prometheus.example.yml"
            ),
            None => assert!(!metric_names(expr).is_empty(), "{alert}: {expr}"),
        }
        assert_eq!(unknown(expr), Vec::<String>::new(), "{alert}: {expr}");
        assert!(rule["labels"]["severity"].is_string(), "{alert}");
        assert!(rule["annotations"]["summary"].is_string(), "{alert}");
        alerted.extend(metric_names(expr));
    }
    for watched in [
        "qe_queue_report_age_seconds",
        "qe_queue_messages",
        "qe_queue_max_messages",
        "qe_queue_max_messages_memory_bytes",
        "qe_queue_certificate_expiry_timestamp_seconds",
        "qe_queues_failed_total",
        "qe_queues",
        "qe_reconcile_errors_total",
        "qe_certificate_errors_total",
        "qe_api_certificate_expiry_timestamp_seconds",
        "qe_rollouts",
    ] {
        assert!(alerted.contains(watched), "no alert reads {watched}");
    }
    // And each rule does what its tests say (`promtool test rules`, Debian's `prometheus`,
    // which scripts/test installs).
    let rules_dir = workspace().join("infra/prometheus");
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts.test.yml"],
    ] {
        let ran = tokio::process::Command::new("promtool")
            .args(&args)
            .current_dir(&rules_dir)
            .output()
            .await
            .expect("promtool (Debian's prometheus package; scripts/test installs it)");
        let said = String::from_utf8_lossy(&ran.stdout).to_string()
            + &String::from_utf8_lossy(&ran.stderr);
        assert!(ran.status.success(), "promtool {}: {said}", args.join(" "));
    }

    // The dashboard: a queue and an account variable, and every query of served metrics.
    let file = workspace().join("infra/grafana/queue-expert.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let variables: Vec<&Value> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    for wanted in ["queue", "account"] {
        let variable = variables.iter().find(|v| v["name"] == wanted);
        let query = variable.unwrap()["query"]["query"].as_str().unwrap();
        assert_eq!(unknown(query), Vec::<String>::new(), "${wanted}: {query}");
    }
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 6);
    for panel in panels {
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            assert!(!metric_names(expr).is_empty(), "{}: {expr}", panel["title"]);
            assert_eq!(
                unknown(expr),
                Vec::<String>::new(),
                "{}: {expr}",
                panel["title"]
            );
        }
    }
}

/// The metric names a PromQL expression reads: its `qe_` identifiers.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(start) = rest.find("qe_") {
        let before = rest[..start].chars().next_back();
        let word: String = rest[start..].chars().take_while(|c| is_name(*c)).collect();
        rest = &rest[start + word.len()..];
        if !before.is_some_and(is_name) {
            names.insert(word);
        }
    }
    names
}
