//! Accounts with the real binaries: two customers with keys of their own, who each see only
//! their own queues, usage, stats, bills and audit entries; read-only, revoked and expired
//! keys; per-account limits; the operator's view of all; invoices recomputed from the usage
//! records and the prices.

use qe_tests::{http, http_text, login_with, node_of, today, ControlPlane};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PRICES: &str = "[prices]\nnetwork_out_gb = 0.09\nnetwork_in_gb = 0.02\n\
                      instance_hour = { \"local/local\" = 0.5 }\n";
const QUEUE: &str = r#"{"tier":"standard","region":"local","instance_type":"local"}"#;

/// One caller of the API: a token and the control plane it talks to.
struct Caller<'a> {
    cp: &'a ControlPlane,
    token: String,
}

impl Caller<'_> {
    async fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        http(self.cp.addr, method, path, Some(&self.token), body).await
    }

    async fn get(&self, path: &str) -> Value {
        let (status, reply) = self.call("GET", path, None).await;
        assert_eq!(status, 200, "GET {path}: {reply}");
        reply
    }

    /// The ids of the queues it sees.
    async fn queue_ids(&self) -> Vec<String> {
        let reply = self.get("/v1/queues").await;
        let mut ids: Vec<String> = reply["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    }
}

fn assert_refused(reply: &(u16, Value), status: u16, code: &str) {
    assert_eq!(
        (reply.0, reply.1["error"]["code"].as_str()),
        (status, Some(code)),
        "{}",
        reply.1
    );
}

/// Makes an account (as the operator) and a full key for it; returns its id and the key.
async fn account_with_key<'a>(cp: &'a ControlPlane, body: Value) -> (String, Caller<'a>) {
    let (status, account) = cp
        .call("POST", "/v1/accounts", Some(&body.to_string()))
        .await;
    assert_eq!(status, 201, "{account}");
    let id = account["id"].as_str().unwrap().to_string();
    let path = format!("/v1/accounts/{id}/keys");
    let (status, key) = cp.call("POST", &path, Some(r#"{"scope":"full"}"#)).await;
    assert_eq!(status, 201, "{key}");
    let token = key["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("qek_"), "{key}");
    (id, Caller { cp, token })
}

/// Creates a queue with `caller`'s key and waits for it to run.
async fn queue_of(caller: &Caller<'_>) -> Value {
    let (status, created) = caller.call("POST", "/v1/queues", Some(QUEUE)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let mut queue = caller
        .get(&format!("/v1/queues/{id}?until=running&within=60"))
        .await;
    assert_eq!(queue["status"], "running", "{queue}");
    queue["logins"] = created["logins"].clone();
    queue
}

/// Publishes one message to `queue` and has it delivered and acked, so that it has usage.
async fn some_traffic(queue: &Value) {
    let (node, logins) = (node_of(queue), &queue["logins"]);
    let capacity = json!({"capacity": 1});
    let mut subscriber = login_with(node, &logins["subscriber"], "subscriber", capacity).await;
    let mut publisher = login_with(node, &logins["publisher"], "publisher", json!({})).await;
    let reply = publisher.request(json!({"body": "x".repeat(10_000)})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let message = subscriber.recv().await;
    let ack = subscriber
        .request(json!({"id": message["id"], "ack": 1}))
        .await;
    assert_eq!(ack["status"], "Success.", "{ack}");
}

fn ids_in(rows: &Value, key: &str) -> Vec<String> {
    let mut ids: Vec<String> = rows[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["queue"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

fn round6(value: f64) -> f64 {
    (value * 1e6).round() / 1e6
}

#[tokio::test]
async fn each_account_sees_only_its_own_and_every_change_is_audited() {
    let cp = ControlPlane::start_with(PRICES);
    let operator = Caller {
        cp: &cp,
        token: cp.token.clone(),
    };
    let alpha_limits = json!({"max_queues": 1, "tiers": ["standard"]});
    let (alpha, alpha_key) =
        account_with_key(&cp, json!({"name": "Alpha", "limits": alpha_limits})).await;
    let (beta, beta_key) = account_with_key(&cp, json!({"name": "Beta"})).await;
    assert_ne!(alpha, beta);

    // An account makes keys of its own; a read-only one reads and changes nothing.
    let path = format!("/v1/accounts/{beta}/keys");
    let (status, read_only) = beta_key
        .call(
            "POST",
            &path,
            Some(r#"{"scope":"read-only","name":"dashboards"}"#),
        )
        .await;
    assert_eq!(status, 201, "{read_only}");
    let beta_reader = Caller {
        cp: &cp,
        token: read_only["token"].as_str().unwrap().to_string(),
    };
    let (_, keys) = beta_key.call("GET", &path, None).await;
    assert_eq!(keys["keys"].as_array().unwrap().len(), 2, "{keys}");
    assert!(
        !keys.to_string().contains(secret_of(&beta_reader.token)),
        "no secret is listed: {keys}"
    );

    // Queues, within the limits.
    let alpha_queue = queue_of(&alpha_key).await;
    let alpha_id = alpha_queue["id"].as_str().unwrap().to_string();
    let beta_queue = queue_of(&beta_key).await;
    let beta_id = beta_queue["id"].as_str().unwrap().to_string();
    let full = alpha_key.call("POST", "/v1/queues", Some(QUEUE)).await;
    assert_refused(&full, 403, "limit_reached");
    let devtest = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let tier = beta_key.call("POST", "/v1/queues", Some(devtest)).await;
    assert_eq!(tier.0, 201, "Beta may have devtest queues: {}", tier.1);
    let beta_devtest = tier.1["id"].as_str().unwrap().to_string();
    let (status, _) = operator
        .call(
            "PATCH",
            &format!("/v1/accounts/{alpha}"),
            Some(r#"{"limits":{"max_queues":5,"tiers":["standard"]}}"#),
        )
        .await;
    assert_eq!(status, 200);
    let wrong_tier = alpha_key.call("POST", "/v1/queues", Some(devtest)).await;
    assert_refused(&wrong_tier, 403, "limit_reached");
    let elsewhere = json!({"tier": "standard", "region": "local", "instance_type": "local",
                           "account": beta});
    let other = alpha_key
        .call("POST", "/v1/queues", Some(&elsewhere.to_string()))
        .await;
    assert_refused(&other, 404, "not_found");

    // Each sees its own; another's is not there; the operator sees all.
    assert_eq!(alpha_key.queue_ids().await, vec![alpha_id.clone()]);
    let mut betas = vec![beta_id.clone(), beta_devtest.clone()];
    betas.sort();
    assert_eq!(beta_key.queue_ids().await, betas);
    assert_eq!(beta_reader.queue_ids().await, betas);
    let all = operator.queue_ids().await;
    for id in [&alpha_id, &beta_id, &beta_devtest] {
        assert!(all.contains(id), "{all:?}");
    }
    for (method, path) in [
        ("GET", format!("/v1/queues/{beta_id}")),
        ("DELETE", format!("/v1/queues/{beta_id}")),
        ("POST", format!("/v1/queues/{beta_id}/logins/admin/rotate")),
    ] {
        let reply = alpha_key.call(method, &path, None).await;
        assert_refused(&reply, 404, "not_found");
    }
    for path in [
        format!("/v1/accounts/{beta}"),
        format!("/v1/accounts/{beta}/keys"),
    ] {
        assert_refused(&alpha_key.call("GET", &path, None).await, 404, "not_found");
    }
    let own = alpha_key.get("/v1/account").await;
    assert_eq!(
        (own["id"].as_str(), own["name"].as_str()),
        (Some(&*alpha), Some("Alpha"))
    );
    for (method, path) in [
        ("GET", "/v1/accounts"),
        ("POST", "/v1/accounts"),
        ("GET", "/metrics"),
        ("GET", "/v1/backup"),
        ("POST", "/v1/certificate/renew"),
    ] {
        let reply = alpha_key.call(method, path, Some(r#"{"name":"x"}"#)).await;
        assert_refused(&reply, 403, "forbidden");
    }
    for (method, path) in [
        ("POST", "/v1/queues".to_string()),
        ("DELETE", format!("/v1/queues/{beta_id}")),
        (
            "POST",
            format!("/v1/queues/{beta_id}/logins/publisher/rotate"),
        ),
        ("POST", format!("/v1/accounts/{beta}/keys")),
    ] {
        let reply = beta_reader.call(method, &path, Some(QUEUE)).await;
        assert_refused(&reply, 403, "forbidden");
    }
    let rotated = beta_key
        .call(
            "POST",
            &format!("/v1/queues/{beta_id}/logins/admin/rotate"),
            None,
        )
        .await;
    assert_eq!(rotated.0, 200, "{}", rotated.1);

    // A revoked key and an expired one are refused, as a wrong one is.
    let path = format!("/v1/accounts/{alpha}/keys");
    let (_, short) = alpha_key
        .call(
            "POST",
            &path,
            Some(r#"{"scope":"full","expires_in_secs":1}"#),
        )
        .await;
    let short = Caller {
        cp: &cp,
        token: short["token"].as_str().unwrap().to_string(),
    };
    let (_, doomed) = alpha_key
        .call("POST", &path, Some(r#"{"scope":"full"}"#))
        .await;
    let doomed_id = doomed["id"].as_str().unwrap().to_string();
    let doomed = Caller {
        cp: &cp,
        token: doomed["token"].as_str().unwrap().to_string(),
    };
    assert_eq!(doomed.call("GET", "/v1/queues", None).await.0, 200);
    let revoke = format!("/v1/accounts/{alpha}/keys/{doomed_id}");
    let (status, revoked) = alpha_key.call("DELETE", &revoke, None).await;
    assert_eq!(status, 200, "{revoked}");
    assert!(revoked["revoked"].is_u64(), "{revoked}");
    assert_refused(
        &doomed.call("GET", "/v1/queues", None).await,
        401,
        "unauthorized",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while short.call("GET", "/v1/queues", None).await.0 == 200 {
        assert!(
            Instant::now() < deadline,
            "a key past its expiry still works"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_refused(
        &short.call("GET", "/v1/queues", None).await,
        401,
        "unauthorized",
    );
    let forged = format!("{}x", &alpha_key.token);
    let forged = Caller {
        cp: &cp,
        token: forged,
    };
    assert_refused(
        &forged.call("GET", "/v1/queues", None).await,
        401,
        "unauthorized",
    );

    // Traffic, then each queue deleted: its node reports its last usage record as it goes.
    some_traffic(&alpha_queue).await;
    some_traffic(&beta_queue).await;
    for (caller, id) in [
        (&alpha_key, &alpha_id),
        (&beta_key, &beta_id),
        (&beta_key, &beta_devtest),
    ] {
        let (status, gone) = caller
            .call("DELETE", &format!("/v1/queues/{id}"), None)
            .await;
        assert_eq!(status, 200, "{gone}");
    }

    // Usage and stats: each account its own; the operator all.
    let today = today();
    let usage = format!("/v1/usage?from={today}&to={today}");
    assert_eq!(
        ids_in(&alpha_key.get(&usage).await, "usage"),
        vec![alpha_id.clone()]
    );
    assert_eq!(ids_in(&beta_key.get(&usage).await, "usage"), betas);
    let everyone = ids_in(&operator.get(&usage).await, "usage");
    assert!(
        everyone.contains(&alpha_id) && everyone.contains(&beta_id),
        "{everyone:?}"
    );
    let of_beta = operator.get(&format!("{usage}&account={beta}")).await;
    assert_eq!(ids_in(&of_beta, "usage"), betas);
    let refused = alpha_key
        .call("GET", &format!("{usage}&account={beta}"), None)
        .await;
    assert_refused(&refused, 404, "not_found");
    let refused = alpha_key
        .call("GET", &format!("{usage}&queue={beta_id}"), None)
        .await;
    assert_refused(&refused, 404, "not_found");
    let stats = format!("/v1/stats?from={today}&to={today}");
    for row in alpha_key.get(&stats).await["stats"].as_array().unwrap() {
        assert_eq!(row["queue"], alpha_id.as_str(), "{row}");
    }

    // Each account's invoice: its queues' lines, recomputed here from its usage records and
    // the prices, each queue's total and the sum.
    let month = &today[..7];
    for (caller, account, queues) in [
        (&alpha_key, &alpha, vec![alpha_id.clone()]),
        (&beta_key, &beta, betas.clone()),
    ] {
        let bill = caller.get(&format!("/v1/bills?month={month}")).await;
        assert_eq!(bill["account"], account.as_str(), "{bill}");
        let records = caller.get(&usage).await;
        check_invoice(&bill, &records, &queues);
        let by_operator = operator
            .get(&format!("/v1/bills?month={month}&account={account}"))
            .await;
        assert_eq!(by_operator, bill);
        let invoices = operator.get(&format!("/v1/invoices?month={month}")).await;
        let invoice = invoices["invoices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|invoice| invoice["account"] == account.as_str())
            .unwrap_or_else(|| panic!("no invoice of {account}: {invoices}"));
        assert_eq!(invoice["lines"], bill["lines"]);
        assert_eq!(invoice["total"], bill["total"]);
        let own = caller.get(&format!("/v1/invoices?month={month}")).await;
        assert_eq!(own["invoices"].as_array().unwrap().len(), 1, "{own}");
    }
    let (_, csv) = http_text(
        cp.addr,
        "GET",
        &format!("/v1/invoices?month={month}&format=csv"),
        Some(&cp.token),
        None,
    )
    .await;
    let header = csv.lines().next().unwrap();
    assert_eq!(header, "account,queue,item,quantity,unit,unit_price,amount");
    assert!(
        csv.lines()
            .any(|line| line.starts_with(&format!("{alpha},{alpha_id},"))),
        "{csv}"
    );

    // The audit log: every change above, by who made it; each account sees its own only.
    let alpha_audit = audit_of(&alpha_key, "").await;
    let alpha_key_id = key_id(&alpha_key.token);
    let expect = |entries: &[Value], actor: Value, action: &str, target: &str, result: &str| {
        assert!(
            entries.iter().any(|entry| entry["actor"] == actor
                && entry["action"] == action
                && entry["target"] == target
                && entry["result"] == result),
            "no {action} of {target} ({result}) by {actor} in {entries:#?}"
        );
    };
    let by_alpha = json!({"kind": "account", "account": alpha, "key": alpha_key_id});
    let by_operator = json!({"kind": "operator"});
    expect(
        &alpha_audit,
        by_operator.clone(),
        "account.create",
        &alpha,
        "ok",
    );
    expect(
        &alpha_audit,
        by_operator.clone(),
        "account.change",
        &alpha,
        "ok",
    );
    expect(
        &alpha_audit,
        by_alpha.clone(),
        "queue.create",
        &alpha_id,
        "ok",
    );
    expect(
        &alpha_audit,
        by_alpha.clone(),
        "key.revoke",
        &doomed_id,
        "ok",
    );
    expect(
        &alpha_audit,
        by_alpha.clone(),
        "queue.delete",
        &alpha_id,
        "ok",
    );
    for entry in &alpha_audit {
        assert_eq!(entry["account"], alpha.as_str(), "only Alpha's: {entry}");
    }
    let beta_audit = audit_of(&beta_key, "").await;
    // Refusals (Alpha's create over its limit and delete of Beta's queue, Beta's reader's
    // create) are counted, not kept: a caller refused in a loop does not grow the store.
    let mut kept = alpha_audit.iter().chain(&beta_audit);
    assert!(
        kept.all(|entry| entry["result"] != "refused"),
        "{alpha_audit:?}"
    );
    let (_, metrics) = http_text(cp.addr, "GET", "/metrics", Some(&cp.token), None).await;
    let refused: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("qe_api_refused_changes_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(refused >= 3, "{refused}");
    let by_beta = json!({"kind": "account", "account": beta, "key": key_id(&beta_key.token)});
    expect(&beta_audit, by_beta, "queue.login.rotate", &beta_id, "ok");
    assert!(beta_audit
        .iter()
        .all(|entry| entry["account"] == beta.as_str()));
    let refused = alpha_key
        .call("GET", &format!("/v1/audit?account={beta}"), None)
        .await;
    assert_refused(&refused, 404, "not_found");
    // The operator sees all of it, and one account's entries as that account does.
    let every = audit_of(&operator, "").await;
    assert!(every.len() >= alpha_audit.len() + beta_audit.len());
    expect(&every, by_operator, "account.create", &beta, "ok");
    assert_eq!(
        audit_of(&operator, &format!("&account={alpha}")).await,
        alpha_audit
    );
    // A time window.
    let first = alpha_audit[0]["time_ms"].as_u64().unwrap() / 1000;
    let before_it = audit_of(&alpha_key, &format!("&until={first}")).await;
    assert!(before_it.is_empty(), "{before_it:?}");
}

/// The secret in a token `qek_KEYID_SECRET` (its alphabet has `_` too).
fn secret_of(token: &str) -> &str {
    let id = key_id(token);
    &token["qek_".len() + id.len() + 1..]
}

/// The key id in a token `qek_KEYID_SECRET`.
fn key_id(token: &str) -> String {
    token.split('_').nth(1).unwrap().to_string()
}

/// Every audit entry `caller` sees, read two at a time (the pages must join up exactly).
async fn audit_of(caller: &Caller<'_>, filter: &str) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut after = String::new();
    loop {
        let page = caller
            .get(&format!("/v1/audit?limit=2{filter}{after}"))
            .await;
        entries.extend(page["entries"].as_array().unwrap().iter().cloned());
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    let whole = caller.get(&format!("/v1/audit?limit=1000{filter}")).await;
    assert_eq!(
        whole["entries"].as_array().unwrap(),
        &entries,
        "pages join up"
    );
    entries
}

/// `bill`'s network lines are what `records` (the account's usage) price to, each queue's
/// total is its lines' sum, and the total is every line's.
fn check_invoice(bill: &Value, records: &Value, queues: &[String]) {
    let lines = bill["lines"].as_array().unwrap();
    for queue in queues {
        let of_queue: Vec<&Value> = lines
            .iter()
            .filter(|l| l["queue"] == queue.as_str())
            .collect();
        let bytes = |field: &str| -> u64 {
            records["usage"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["queue"] == queue.as_str())
                .map(|r| r[field].as_u64().unwrap())
                .sum()
        };
        for (item, field, price) in [
            ("network out", "network_sent", 0.09),
            ("network in", "network_received", 0.02),
        ] {
            let gb = round6(bytes(field) as f64 / 1e9);
            if gb == 0.0 {
                continue;
            }
            let line = of_queue
                .iter()
                .find(|l| l["item"] == item)
                .unwrap_or_else(|| panic!("no {item} of {queue} in {bill}"));
            assert_eq!(line["quantity"].as_f64(), Some(gb), "{bill}");
            assert_eq!(line["amount"].as_f64(), Some(round6(gb * price)), "{bill}");
        }
        let sum: f64 = of_queue.iter().map(|l| l["amount"].as_f64().unwrap()).sum();
        let shown = bill["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == queue.as_str())
            .map(|q| q["total"].as_f64().unwrap());
        match of_queue.is_empty() {
            true => assert_eq!(shown, None, "{bill}"),
            false => assert_eq!(shown, Some(round6(sum)), "{bill}"),
        }
    }
    assert!(
        lines
            .iter()
            .all(|l| queues.iter().any(|q| l["queue"] == q.as_str())),
        "{bill}"
    );
    let total: f64 = lines.iter().map(|l| l["amount"].as_f64().unwrap()).sum();
    assert_eq!(bill["total"].as_f64(), Some(round6(total)), "{bill}");
}

#[tokio::test]
async fn creates_at_once_never_pass_an_accounts_limit() {
    let cp = ControlPlane::start();
    let limits = json!({"max_queues": 2, "tiers": ["devtest"]});
    let (_, key) = account_with_key(&cp, json!({"name": "Racer", "limits": limits})).await;
    let devtest = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;
    let creates = (0..6).map(|_| key.call("POST", "/v1/queues", Some(devtest)));
    let replies = futures::future::join_all(creates).await;
    let made = replies.iter().filter(|(status, _)| *status == 201).count();
    assert_eq!(made, 2, "{replies:?}");
    for reply in replies.iter().filter(|(status, _)| *status != 201) {
        assert_refused(reply, 403, "limit_reached");
    }
    // A deleted queue gives its place back.
    let id = replies.iter().find(|(s, _)| *s == 201).unwrap().1["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _) = key.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(status, 200);
    assert_eq!(key.call("POST", "/v1/queues", Some(devtest)).await.0, 201);
    assert_refused(
        &key.call("POST", "/v1/queues", Some(devtest)).await,
        403,
        "limit_reached",
    );
}

/// An account's limits keep it from costing the others: its API keys (`max_api_keys`, the
/// revoked ones let go when a new key needs the place) and SQS keys (`max_sqs_keys`), its
/// keys' requests per second (past them `429 too_many_requests`, while another account's key
/// goes on), and console sign-ins per source (past ten a minute, `429`).
#[tokio::test]
async fn an_accounts_limits_keep_it_from_costing_the_others() {
    let cp = ControlPlane::start();
    let limits = json!({"max_api_keys": 2, "api_requests_per_second": 2, "max_sqs_keys": 1});
    let (small, small_key) =
        account_with_key(&cp, json!({"name": "Small", "limits": limits})).await;
    let (_, other_key) = account_with_key(&cp, json!({"name": "Other"})).await;

    // Two keys at most (the first is one of them); a revoked one gives its place back.
    let keys = format!("/v1/accounts/{small}/keys");
    let (status, second) = cp.call("POST", &keys, Some(r#"{"scope":"full"}"#)).await;
    assert_eq!(status, 201, "{second}");
    let third = cp.call("POST", &keys, Some(r#"{"scope":"full"}"#)).await;
    assert_refused(&third, 403, "limit_reached");
    let second_id = second["id"].as_str().unwrap();
    let (status, _) = cp
        .call("DELETE", &format!("{keys}/{second_id}"), None)
        .await;
    assert_eq!(status, 200);
    let (status, third) = cp.call("POST", &keys, Some(r#"{"scope":"full"}"#)).await;
    assert_eq!(status, 201, "{third}");
    let listed = cp.call("GET", &keys, None).await.1;
    let listed = listed["keys"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 2, "the revoked one is gone: {listed:?}");

    // One SQS key at most; another account may still make its own.
    let sqs_keys = format!("/v1/accounts/{small}/sqs-keys");
    let publisher = Some(r#"{"role":"publisher"}"#);
    let (status, made) = cp.call("POST", &sqs_keys, publisher).await;
    assert_eq!(status, 201, "{made}");
    assert_refused(
        &cp.call("POST", &sqs_keys, publisher).await,
        403,
        "limit_reached",
    );
    let (status, shown) = cp.call("GET", &format!("/v1/accounts/{small}"), None).await;
    assert_eq!(
        (status, &shown["limits"]["max_sqs_keys"]),
        (200, &json!(1)),
        "{shown}"
    );

    // Two requests a second, four at once: a burst of ten sees 429s, another account none.
    let mut refused = 0;
    for _ in 0..10 {
        let reply = small_key.call("GET", "/v1/queues", None).await;
        match reply.0 {
            200 => {}
            _ => {
                assert_refused(&reply, 429, "too_many_requests");
                refused += 1;
            }
        }
        let (status, _) = other_key.call("GET", "/v1/queues", None).await;
        assert_eq!(status, 200, "another account's key is not held back");
    }
    assert!(refused >= 5, "{refused} of 10 refused");

    // Console sign-ins: ten a minute from one source, then 429 (a right token too).
    let wrong = json!({"token": "qek_AAAAAAAAAAAAAAAA_wrong"}).to_string();
    for _ in 0..10 {
        let (status, _) = http(cp.addr, "POST", "/console/session", None, Some(&wrong)).await;
        assert_eq!(status, 401);
    }
    let right = json!({"token": other_key.token}).to_string();
    let reply = http(cp.addr, "POST", "/console/session", None, Some(&right)).await;
    assert_refused(&reply, 429, "too_many_requests");
}

/// The audit log keeps its newest entries: each account's to its `max_audit_entries` (the
/// entries go from the whole log too, so one busy account does not push the others' out),
/// and `audit_keep_entries` in all; the oldest past them go when the leading replica looks
/// (at its start, then hourly).
#[tokio::test]
async fn the_audit_log_keeps_its_newest_entries_in_all_and_per_account() {
    let cp = ControlPlane::start();
    let (busy, busy_key) = account_with_key(&cp, json!({"name": "Busy"})).await;
    let (quiet, quiet_key) = account_with_key(&cp, json!({"name": "Quiet"})).await;
    for (account, key) in [(&busy, &busy_key), (&quiet, &quiet_key)] {
        let sqs_keys = format!("/v1/accounts/{account}/sqs-keys");
        for _ in 0..6 {
            let made = key
                .call("POST", &sqs_keys, Some(r#"{"role":"publisher"}"#))
                .await;
            assert_eq!(made.0, 201, "{}", made.1);
        }
    }
    let operator = Caller {
        cp: &cp,
        token: cp.token.clone(),
    };
    // Read before any limit is set: the control plane looks at its start, maybe later than
    // these reads.
    let before = audit_of(&operator, "").await;
    let busy_before = audit_of(&operator, &format!("&account={busy}")).await;
    assert!(busy_before.len() >= 8 && before.len() > 8, "{before:#?}");
    // Busy keeps 3 from now: its change of limits (audited too) and the 2 before it.
    let limits = json!({"limits": {"max_audit_entries": 3}}).to_string();
    let changed = operator
        .call("PATCH", &format!("/v1/accounts/{busy}"), Some(&limits))
        .await;
    assert_eq!(changed.0, 200, "{}", changed.1);
    drop((busy_key, quiet_key, operator));

    let cp = cp.restart_with("audit_keep_entries = 8\n");
    let operator = Caller {
        cp: &cp,
        token: cp.token.clone(),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // One page each (the look may be under way: pages read across it would not join up).
    let whole = |filter: String| {
        let operator = &operator;
        async move {
            let page = operator.get(&format!("/v1/audit?limit=1000{filter}")).await;
            page["entries"].as_array().unwrap().clone()
        }
    };
    loop {
        let all = whole(String::new()).await;
        let of_busy = whole(format!("&account={busy}")).await;
        let change = all.iter().find(|entry| entry["action"] == "account.change");
        if let Some(change) = change {
            // Busy's 3 newest; of what is left, the 8 newest in all (some of Quiet's go too,
            // and Busy sees those of its 3 still in the log).
            let busy_kept = [
                &busy_before[busy_before.len() - 2..],
                std::slice::from_ref(change),
            ]
            .concat();
            let left: Vec<Value> = before
                .iter()
                .filter(|entry| entry["account"] != busy.as_str() || busy_kept.contains(entry))
                .chain([change])
                .cloned()
                .collect();
            let expected = left[left.len() - 8..].to_vec();
            let busy_sees: Vec<Value> = busy_kept
                .into_iter()
                .filter(|entry| expected.contains(entry))
                .collect();
            if all == expected && of_busy == busy_sees {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kept {all:#?}\nof Busy {of_busy:#?}\nbefore {before:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
