//! A queue on an "EC2 instance" booted for real: the control plane launches it in moto (EC2's
//! emulator), and the test boots the user data moto was given in a network namespace of its
//! own (`tests/instance/boot.py`) at the address EC2 gave it, from moto's ULA subnet. The node
//! downloads the `dataplane` from the control plane, pulls its config, gets a certificate of its
//! own from the local CA, and reports usage; a client outside the namespace resolves the queue's
//! name through our DNS and connects over wss:// checking the certificate for that name.
//! Killing the instance has the reconciler replace it, and the durability-2 messages on its
//! volume come back; deleting the queue terminates it and the last usage record arrives.

use qe_ec2::aws_sdk_ec2::types::InstanceStateName;
use qe_ec2::Ec2;
use qe_tests::cloud::*;
use qe_tests::instance::HostAddress;
use qe_tests::moto::{self, describe_instance, describe_volume};
use qe_tests::sqs::{self, SqsEndpoint};
use qe_tests::{dig, https, Client};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The queue's bootstrap token in `instance`'s user data, presented as instance `as_instance`
/// to `POST /v1/nodes/{id}/bootstrap`: the status.
async fn present_bootstrap(
    api: &Api,
    ec2: &Ec2,
    id: &str,
    instance: &str,
    as_instance: &str,
) -> u16 {
    let bootstrap = bootstrap_in(&user_data(ec2, instance).await);
    let token = bootstrap["bootstrap_token"].as_str().unwrap();
    let body = json!({ "instance_id": as_instance }).to_string();
    let path = format!("/v1/nodes/{id}/bootstrap");
    let roots = api.roots.clone();
    https(api.at, roots, "POST", &path, Some(token), Some(&body))
        .await
        .0
}

/// The audit's entries of `action` on queue `id`: their reasons.
async fn audited(api: &Api, id: &str, action: &str) -> Vec<String> {
    let (status, audit) = api.call("GET", "/v1/audit?limit=1000", None).await;
    assert_eq!(status, 200, "{audit}");
    let entries = audit["entries"].as_array().unwrap();
    entries
        .iter()
        .filter(|entry| entry["action"] == action && entry["target"] == id)
        .map(|entry| entry["reason"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn a_queue_on_an_instance_booted_in_a_namespace_serves_by_name_and_survives_the_instance() {
    let (moto, ec2, files, api) = cloud().await;
    let dns = api.cp.dns.expect("a DNS server");
    let root = std::fs::read_to_string(api.cp.dir.path().join("data/local-ca/ca.pem")).unwrap();

    let asked = Instant::now();
    let body = format!(
        r#"{{"tier":"devtest","region":"{REGION}","instance_type":"t3.small","ipv4":false}}"#
    );
    let (status, created) = api.call("POST", "/v1/queues", Some(&body)).await;
    assert_eq!(
        (status, created["status"].as_str()),
        (201, Some("provisioning"))
    );
    let id = created["id"].as_str().unwrap().to_string();
    let logins = created["logins"].clone();
    let queue = api.placed(&id, None).await;
    let first = boot(&ec2, &queue, "qe1", files.path()).await;
    let (status, running) = api
        .call(
            "GET",
            &format!("/v1/queues/{id}?until=running&within=60"),
            None,
        )
        .await;
    assert_eq!(
        (status, running["status"].as_str()),
        (200, Some("running")),
        "{running}"
    );

    // Its user data holds no node token, only a bootstrap token, which its first boot traded
    // for the node token as the instance; used, it is worth nothing, also to the instance.
    let instance = queue["resources"]["instance"].as_str().unwrap();
    let bootstrap = bootstrap_in(&user_data(&ec2, instance).await);
    assert!(!bootstrap.contains_key("node_token"), "{bootstrap:?}");
    let exchanged = audited(&api, &id, "node.bootstrap").await;
    assert_eq!(exchanged, vec![format!("instance {instance}")]);
    let replayed = present_bootstrap(&api, &ec2, &id, instance, instance).await;
    assert_eq!(replayed, 401, "a bootstrap token is good once");
    let refused = audited(&api, &id, "node.bootstrap-refused").await;
    assert_eq!(
        refused,
        vec![format!(
            "the bootstrap token was used already (instance {instance})"
        )]
    );

    // By name, through our DNS, over wss:// with its own certificate.
    let host = queue["host"].as_str().unwrap().to_string();
    let v6 = queue["addresses"]["v6"].as_str().unwrap().to_string();
    assert_eq!(dig(dns, &host, "AAAA", false).answers, vec![v6.clone()]);
    assert_eq!(dig(dns, &host, "A", false).status, "NOERROR");
    assert!(
        dig(dns, &host, "A", false).answers.is_empty(),
        "no IPv4 asked"
    );
    let mut subscriber = logged_in(dns, &host, &root, &logins, "subscriber").await;
    let mut publisher = logged_in(dns, &host, &root, &logins, "publisher").await;
    let reply = publisher
        .request(json!({"body": "first", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let delivered = subscriber.recv().await;
    assert_eq!(delivered["body"], "first");
    eprintln!(
        "from POST /v1/queues to a message through the queue by name: {:.1} s",
        asked.elapsed().as_secs_f64()
    );
    subscriber
        .request(json!({"id": delivered["id"], "ack": 1}))
        .await;
    subscriber.request(json!({"logout": true})).await;
    // The SQS face, on its own port with the same certificate: a key from the control plane,
    // given to the node over the channel; Amazon's Rust SDK at the queue's name.
    let key = api.admin_sqs_key(&id).await;
    let endpoint = key["endpoint"].as_str().unwrap();
    assert_eq!(endpoint, format!("https://{host}:9443"));
    let sdk = sqs::client(
        &SqsEndpoint {
            url: endpoint,
            ca_pem: Some(&root),
            resolve_to: Some(v6.parse().unwrap()),
        },
        key["access_key_id"].as_str().unwrap(),
        key["secret"].as_str().unwrap(),
    );
    let queue_url = key["queue_url"].as_str().unwrap();
    let sent = sqs::send(&sdk, queue_url, "over SQS").await;
    let got = sqs::receive(&sdk, queue_url, 1, 10).await;
    let [message] = got.as_slice() else {
        panic!("the SQS message: {got:?}");
    };
    assert_eq!(message.message_id(), sent.message_id());
    sqs::delete(&sdk, queue_url, message).await;

    // One that waits on the volume.
    let reply = publisher
        .request(json!({"body": "kept", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    // A rotation is confirmed over the channel: the node serves the new password at once.
    let (status, rotated) = api
        .call(
            "POST",
            &format!("/v1/queues/{id}/logins/publisher/rotate"),
            None,
        )
        .await;
    assert_eq!(
        (status, &rotated["applied"]),
        (200, &json!(true)),
        "{rotated}"
    );
    let mut with_old = connect(dns, &host, &root).await;
    let reply = login(&mut with_old, &logins["publisher"], "publisher", json!({})).await;
    assert_eq!(reply["code"], 107, "the old password is refused");

    // The instance is lost: killed, and gone from EC2. The reconciler launches a replacement
    // with the same volume; booted, it serves the message the first one acknowledged.
    let lost = queue["resources"]["instance"].as_str().unwrap().to_string();
    drop(first);
    let client = ec2.client(REGION).unwrap();
    client
        .terminate_instances()
        .instance_ids(&lost)
        .send()
        .await
        .unwrap();
    let replaced = api.placed(&id, Some(&lost)).await;
    assert_eq!(
        replaced["resources"]["volume"],
        queue["resources"]["volume"]
    );
    // Its bootstrap token is good for it only: presented as the lost instance, refused (and
    // not spent: the replacement then boots with it).
    let replacement = replaced["resources"]["instance"].as_str().unwrap();
    let stolen = present_bootstrap(&api, &ec2, &id, replacement, &lost).await;
    assert_eq!(stolen, 401, "another instance's bootstrap token");
    let refused = audited(&api, &id, "node.bootstrap-refused").await;
    assert_eq!(
        refused.last().unwrap(),
        &format!("the bootstrap token was presented by another instance (instance {lost})")
    );
    let second = boot(&ec2, &replaced, "qe2", files.path()).await;
    second.wait_for_node_log("listening on");
    let v6 = replaced["addresses"]["v6"].as_str().unwrap().to_string();
    assert_eq!(dig(dns, &host, "AAAA", false).answers, vec![v6]);
    let mut subscriber = logged_in(dns, &host, &root, &logins, "subscriber").await;
    let delivered = subscriber.recv().await;
    assert_eq!(
        delivered["body"], "kept",
        "durability 2 outlived its instance"
    );
    subscriber
        .request(json!({"id": delivered["id"], "ack": 1}))
        .await;
    subscriber.request(json!({"logout": true})).await;

    // The instance goes silent: its network is lost, and it runs on reaching nobody. Once
    // it has not been heard from for three live-report intervals, the control plane
    // terminates it, forces its volume off, and launches a replacement, which serves what
    // the silent one acknowledged.
    let mut logins = logins;
    logins["publisher"] = rotated.clone();
    let mut publisher = logged_in(dns, &host, &root, &logins, "publisher").await;
    let reply = publisher
        .request(json!({"body": "kept through the silence", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let silent = replaced["resources"]["instance"]
        .as_str()
        .unwrap()
        .to_string();
    second.lose_network();
    let replaced = api.placed(&id, Some(&silent)).await;
    let described = describe_instance(client, &silent).await;
    assert_eq!(
        described.state().unwrap().name(),
        Some(&InstanceStateName::Terminated),
        "fenced before it was replaced"
    );
    drop(second);
    let second = boot(&ec2, &replaced, "qe3", files.path()).await;
    second.wait_for_node_log("listening on");
    let mut subscriber = logged_in(dns, &host, &root, &logins, "subscriber").await;
    let delivered = subscriber.recv().await;
    assert_eq!(delivered["body"], "kept through the silence");
    subscriber
        .request(json!({"id": delivered["id"], "ack": 1}))
        .await;
    subscriber.request(json!({"logout": true})).await;
    let (_, audit) = api.call("GET", "/v1/audit", None).await;
    let replacements = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|entry| entry["action"] == "node.replace" && entry["target"] == id.as_str())
        .count();
    assert_eq!(replacements, 1, "{audit}");
    // EC2 was asked whether it was bringing the instance back (it was not: running, checks
    // ok), and answered.
    let log = api.cp.log_text();
    assert!(
        log.contains("its node is not heard from: replacing it"),
        "{log}"
    );
    assert!(
        !log.contains("whether its instance recovers could not be read"),
        "{log}"
    );

    // Deleted: EC2 terminates the instance, which shuts down: its node reports its last
    // records, then the volume is deleted.
    let instance = replaced["resources"]["instance"]
        .as_str()
        .unwrap()
        .to_string();
    let volume = replaced["resources"]["volume"]
        .as_str()
        .unwrap()
        .to_string();
    let deleting = {
        let (at, roots, token) = (api.at, api.roots.clone(), api.cp.token.clone());
        let path = format!("/v1/queues/{id}");
        tokio::spawn(async move { https(at, roots, "DELETE", &path, Some(&token), None).await })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let described = describe_instance(client, &instance).await;
        if described.state().unwrap().name() == Some(&InstanceStateName::Terminated) {
            break;
        }
        assert!(Instant::now() < deadline, "never terminated");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let said = tokio::task::spawn_blocking(move || second.terminate())
        .await
        .unwrap();
    assert_eq!(said, "stopped status=0", "a clean stop");
    let (status, deleted) = deleting.await.unwrap();
    assert_eq!(
        (status, deleted["status"].as_str()),
        (200, Some("deleted")),
        "{deleted}"
    );
    assert!(
        describe_volume(client, &volume).await.is_none(),
        "the volume is deleted"
    );
    let (_, usage) = api.call("GET", &qe_tests::all_usage_of(&id), None).await;
    let records = usage["usage"].as_array().unwrap();
    assert!(!records.is_empty(), "{usage}");
    let sent: u64 = records
        .iter()
        .map(|r| r["network_sent"].as_u64().unwrap())
        .sum();
    assert!(sent > 0, "the bytes the nodes sent are counted: {usage}");

    // Issue 28: a queue deleted while its node cannot report (its network lost) keeps its
    // volume; an instance booted on it only hands the records over, then powers off, and
    // only then is the volume deleted.
    let (_, created) = api.call("POST", "/v1/queues", Some(&body)).await;
    let id = created["id"].as_str().unwrap().to_string();
    let queue = api.placed(&id, None).await;
    let cut_off = boot(&ec2, &queue, "qe4", files.path()).await;
    let path = format!("/v1/queues/{id}?until=running&within=60");
    let (_, running) = api.call("GET", &path, None).await;
    assert_eq!(running["status"], "running", "{running}");
    let host = queue["host"].as_str().unwrap().to_string();
    let mut publisher = logged_in(dns, &host, &root, &created["logins"], "publisher").await;
    let reply = publisher
        .request(json!({"body": "counted", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    cut_off.lose_network();
    let (status, _) = api.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert!(status == 200 || status == 202, "{status}");
    let served_on = queue["resources"]["instance"].as_str().unwrap().to_string();
    let volume = queue["resources"]["volume"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while describe_instance(client, &served_on)
        .await
        .state()
        .unwrap()
        .name()
        != Some(&InstanceStateName::Terminated)
    {
        assert!(Instant::now() < deadline, "never terminated");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::spawn_blocking(move || cut_off.terminate())
        .await
        .unwrap();
    let hand_over = loop {
        let instances = ec2.instances_of(REGION, &id).await.unwrap();
        let launched = instances
            .into_iter()
            .find(|i| i.id != served_on && i.state == "running" && i.ipv6.is_some());
        if let Some(instance) = launched {
            break instance;
        }
        assert!(Instant::now() < deadline, "no hand-over instance");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let placed = json!({
        "resources": {"instance": hand_over.id, "volume": volume},
        "addresses": {"v6": hand_over.ipv6.unwrap().to_string()},
    });
    let handing = boot(&ec2, &placed, "qe5", files.path()).await;
    let node_log = files.path().join("qe5/node.log");
    let said = tokio::task::spawn_blocking(move || handing.wait_for_exit())
        .await
        .unwrap();
    assert_eq!(
        said, "exited status=0",
        "it only hands over, then powers off"
    );
    let log = std::fs::read_to_string(node_log).unwrap();
    assert!(log.contains("the last usage record was reported"), "{log}");
    let path = format!("/v1/queues/{id}?until=deleted&within=60");
    let (_, deleted) = api.call("GET", &path, None).await;
    assert_eq!(deleted["status"], "deleted", "{deleted}");
    assert!(
        describe_volume(client, &volume).await.is_none(),
        "then the volume is deleted"
    );
    let terminated = describe_instance(client, &hand_over.id).await;
    assert_eq!(
        terminated.state().unwrap().name(),
        Some(&InstanceStateName::Terminated)
    );
    let (_, usage) = api.call("GET", &qe_tests::all_usage_of(&id), None).await;
    assert!(!usage["usage"].as_array().unwrap().is_empty(), "{usage}");
    let log = api.cp.log_text();
    assert!(
        log.contains("launched an instance to hand over its last records"),
        "{log}"
    );
    drop(moto);
}

/// Every message `subscriber` is given, each acked, until none comes for 2 s: their bodies.
async fn acked_until_quiet(subscriber: &mut Client) -> Vec<String> {
    let mut delivered = Vec::new();
    while let Some(frame) = subscriber.recv_within(Duration::from_secs(2)).await {
        if let Some(body) = frame["body"].as_str() {
            delivered.push(body.to_string());
            subscriber
                .send_json(&json!({"id": frame["id"], "ack": 1}))
                .await;
        }
    }
    delivered
}

/// What `GET /v1/backup` gives now.
async fn backup_of(api: &Api) -> String {
    let token = Some(api.cp.token.as_str());
    let (status, backup) =
        qe_tests::https_text(api.at, api.roots.clone(), "GET", "/v1/backup", token, None).await;
    assert_eq!(status, 200, "{backup}");
    backup
}

/// The control plane's state lost and restored from `backup` (`controlplane restore`, as
/// docs/deploy.md tells), and the control plane started again on it: it has seen a node of a
/// queue it does not know.
fn restored_from(api: Api, files: &std::path::Path, backup: &str) -> Api {
    let Api { mut cp, at, roots } = api;
    cp.kill();
    std::fs::remove_dir_all(cp.dir.path().join("data/state")).unwrap();
    std::fs::remove_file(cp.dir.path().join("data/node-secret")).unwrap();
    std::fs::write(files.join("backup"), backup).unwrap();
    let restored = std::process::Command::new(qe_tests::controlplane_binary())
        .args(["restore", "--config"])
        .arg(cp.dir.path().join("controlplane.toml"))
        .arg("--from")
        .arg(files.join("backup"))
        .output()
        .unwrap();
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    let api = Api {
        cp: cp.restart(),
        at,
        roots,
    };
    api.cp
        .wait_for_log("created after the backup it was restored from", 1);
    api
}

/// Queue `id` adopted (`POST /v1/strays/{id}/adopt`) once its node has reported itself and
/// it is listed as the one adoptable stray: the queue as adopted.
async fn adopt_once_reported(api: &Api, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, strays) = api.call("GET", "/v1/strays", None).await;
        assert_eq!(status, 200, "{strays}");
        if strays["strays"] == json!([{"id": id, "adoptable": true}]) {
            break;
        }
        assert!(Instant::now() < deadline, "never adoptable: {strays}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, adopted) = api
        .call("POST", &format!("/v1/strays/{id}/adopt"), None)
        .await;
    assert_eq!(status, 201, "{adopted}");
    adopted
}

/// Issue 28: after a restore from a backup made before a queue was, its instance runs on,
/// unknown to the store. Its node, refused, reports the config it kept; the queue is then
/// listed as an adoptable stray and adopted: the same instance serves it by name, with its
/// logins and its durable message, and its node takes a fresh credential.
#[tokio::test]
async fn an_instance_made_after_the_backup_is_adopted_from_what_its_node_reports() {
    let (moto, ec2, files, api) = cloud().await;
    let dns = api.cp.dns.expect("a DNS server");
    let root = std::fs::read_to_string(api.cp.dir.path().join("data/local-ca/ca.pem")).unwrap();
    let backup = backup_of(&api).await;

    let body = format!(r#"{{"tier":"devtest","region":"{REGION}","instance_type":"t3.small"}}"#);
    let (_, created) = api.call("POST", "/v1/queues", Some(&body)).await;
    let id = created["id"].as_str().unwrap().to_string();
    let logins = created["logins"].clone();
    let queue = api.placed(&id, None).await;
    let instance = boot(&ec2, &queue, "qs1", files.path()).await;
    let path = format!("/v1/queues/{id}?until=running&within=60");
    let (_, running) = api.call("GET", &path, None).await;
    assert_eq!(running["status"], "running", "{running}");
    let host = queue["host"].as_str().unwrap().to_string();
    let mut publisher = logged_in(dns, &host, &root, &logins, "publisher").await;
    let reply = publisher
        .request(json!({"body": "made after the backup", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");

    // The control plane's state is lost and restored from the backup.
    let api = restored_from(api, files.path(), &backup);
    let dns = api.cp.dns.expect("a DNS server");

    // Its node reports itself; the queue is then adoptable (an instance's config is on its
    // volume: nothing else could tell it).
    let adopted = adopt_once_reported(&api, &id).await;
    assert_eq!(adopted["serving"], "first", "{adopted}");
    let (_, running) = api.call("GET", &path, None).await;
    assert_eq!(running["status"], "running", "{running}");
    assert_eq!(
        running["resources"]["instance"], queue["resources"]["instance"],
        "the same instance"
    );
    let mut subscriber = logged_in(dns, &host, &root, &logins, "subscriber").await;
    let delivered = subscriber.recv().await;
    assert_eq!(delivered["body"], "made after the backup");
    // Its node took the fresh credential: its next change is confirmed.
    let rotate = format!("/v1/queues/{id}/logins/admin/rotate");
    let (status, rotated) = api.call("POST", &rotate, None).await;
    assert_eq!(status, 200, "{rotated}");
    let (status, again) = api
        .call("POST", &format!("/v1/strays/{id}/adopt"), None)
        .await;
    assert_eq!(status, 409, "{again}");
    drop(instance);
    drop(moto);
}

/// Issue 35: a replicated queue made after the backup, whose standby's machine was promoted
/// before the store was restored. Its node is now the second slot's machine, which presents
/// that slot's credential: it reports itself, and is adopted as the machine that serves, at
/// the epoch it serves at. It serves by name with its durable messages and takes a fresh
/// credential; a new standby is placed on the lost node's volume, follows it, and durability
/// 2 is on two disks again.
#[tokio::test]
async fn a_promoted_standby_of_a_queue_made_after_the_backup_is_adopted_as_its_node() {
    let _control_plane = HostAddress::keep(control_plane_v6(4));
    let (moto, ec2, files, api) = cloud_reached_at(control_plane_v6(4)).await;
    let backup = backup_of(&api).await;
    let mut machines = two_machines(&api, &ec2, files.path(), ["qa1", "qa2"]).await;
    let reply = machines
        .publisher
        .request(json!({"body": "made after the backup", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let (id, logins, host, queue) = (machines.id, machines.logins, machines.host, machines.queue);
    let first_volume = queue["resources"]["volume"].clone();
    let standby_instance = queue["resources"]["standby_instance"].as_str().unwrap();
    drop((machines.node, machines.publisher));
    let standby = machines.standby;
    let promoted = api
        .until(&id, |queue| {
            queue["resources"]["instance"] == standby_instance
        })
        .await;
    assert_eq!(promoted["serving"], "second", "{promoted}");
    // Its machine has taken the promotion: it serves as the node, and the config it keeps names
    // no node to follow. (Restored before that, it is still a standby, whose report is refused:
    // listed, not adoptable.)
    standby.wait_for_node_log("listening on");

    let api = restored_from(api, files.path(), &backup);
    let adopted = adopt_once_reported(&api, &id).await;
    let serving = (adopted["serving"].as_str(), adopted["epoch"].as_u64());
    assert_eq!(serving, (Some("second"), Some(1)), "{adopted}");
    assert_eq!(adopted["replicas"], 2, "{adopted}");
    let running = api
        .until(&id, |queue| {
            queue["status"] == "running" && queue["resources"]["instance"] == standby_instance
        })
        .await;
    let dns = api.cp.dns.expect("a DNS server");
    let root = std::fs::read_to_string(api.cp.dir.path().join("data/local-ca/ca.pem")).unwrap();
    let mut subscriber = logged_in(dns, &host, &root, &logins, "subscriber").await;
    // (What the 507 while the standby caught up kept comes first: `two_machines`.)
    let delivered = acked_until_quiet(&mut subscriber).await;
    assert!(
        delivered.iter().any(|body| body == "made after the backup"),
        "{delivered:?} on {running}"
    );
    // Its node took the fresh credential of its slot: its next change is confirmed.
    let rotate = format!("/v1/queues/{id}/logins/admin/rotate");
    let (status, rotated) = api.call("POST", &rotate, None).await;
    assert_eq!(status, 200, "{rotated}");
    // A standby follows it again, on the first slot's volume (the lost node's copy).
    let queue = api
        .until(&id, |queue| {
            let placed = queue["resources"]["standby_instance"].as_str();
            placed.is_some() && placed != Some(standby_instance)
        })
        .await;
    assert_eq!(queue["resources"]["standby_volume"], first_volume);
    let new_standby = boot_standby(&ec2, &queue, "qa3", "qa2", files.path()).await;
    new_standby.wait_for_node_log("caught up with the primary");
    let mut publisher = logged_in(dns, &host, &root, &logins, "publisher").await;
    on_two_disks(&mut publisher, "two disks again").await;
    drop((standby, new_standby, moto));
}

/// Rolling upgrades on instances (docs/deploy.md §14): a new build published with `qe` and
/// rolled across two queues' instances, a canary first; each node fetches it from the control
/// plane over its channel, checks it, and execs it as the same process, with its volume's
/// messages. A build for another CPU is refused by the canary's node, which serves on, and
/// the roll halts there.
#[tokio::test]
async fn a_build_rolls_across_instances_and_one_for_another_cpu_halts_at_its_canary() {
    let (_moto, ec2, files, api) = cloud().await;
    let dns = api.cp.dns.expect("a DNS server");
    let root = std::fs::read_to_string(api.cp.dir.path().join("data/local-ca/ca.pem")).unwrap();
    let body = format!(r#"{{"tier":"devtest","region":"{REGION}","instance_type":"t3.small"}}"#);
    let mut queues = Vec::new();
    let mut instances = Vec::new();
    for name in ["qeroll1", "qeroll2"] {
        let (status, created) = api.call("POST", "/v1/queues", Some(&body)).await;
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let queue = api.placed(&id, None).await;
        instances.push(boot(&ec2, &queue, name, files.path()).await);
        let path = format!("/v1/queues/{id}?until=running&within=60");
        let (_, running) = api.call("GET", &path, None).await;
        assert_eq!(running["status"], "running", "{running}");
        queues.push((id, created["logins"].clone(), running));
    }
    for (_, logins, queue) in &queues {
        let host = queue["host"].as_str().unwrap();
        let mut publisher = logged_in(dns, host, &root, logins, "publisher").await;
        let reply = publisher
            .request(json!({"body": "before the upgrade", "durability": 2}))
            .await;
        assert_eq!(reply["status"], "Success.", "{reply}");
    }
    let pid_file = |name: &str| files.path().join(name).join("node.pid");
    let pids: Vec<String> = ["qeroll1", "qeroll2"]
        .iter()
        .map(|name| std::fs::read_to_string(pid_file(name)).unwrap())
        .collect();

    let config = files.path().join("qe.toml");
    let api_url = format!("https://{}", api.at);
    let ca = files.path().join("ca.pem");
    let login = [
        "login",
        "--api",
        &api_url,
        "--ca",
        ca.to_str().unwrap(),
        "--token-stdin",
    ];
    let (code, out, err) = qe_tests::run_qe(&config, &login, &api.cp.token);
    assert_eq!(code, 0, "{out}{err}");
    let mut binary = std::fs::read(qe_tests::dataplane_binary()).unwrap();
    binary.extend_from_slice(b"\0the next build, for instances\0");
    let next = files.path().join("dataplane-next");
    std::fs::write(&next, &binary).unwrap();
    let published = qe_tests::qe_json(&config, 0, &["builds", "publish", next.to_str().unwrap()]);
    let good = published["sha256"].as_str().unwrap().to_string();
    let canary = queues[1].0.as_str();
    let start = qe_tests::rollout_start(&good, canary, "240");
    let rollout = qe_tests::qe_json(&config, 0, &start);
    assert_eq!(rollout["state"], "done", "{rollout}");
    for (n, (id, logins, queue)) in queues.iter().enumerate() {
        let step = &rollout["queues"][id];
        let took = step["upgraded_ms"].as_u64().unwrap() - step["told_ms"].as_u64().unwrap();
        println!("queue {id}: from being told the build to serving on it (fetched, checked, restarted) in {took} ms");
        let (_, now) = api.call("GET", &format!("/v1/queues/{id}"), None).await;
        assert_eq!(now["node_build"]["binary_sha256"], good.as_str(), "{now}");
        let pid = std::fs::read_to_string(pid_file(["qeroll1", "qeroll2"][n])).unwrap();
        assert_eq!(pid, pids[n], "the same process runs the new build");
        let host = queue["host"].as_str().unwrap();
        let mut subscriber = logged_in(dns, host, &root, logins, "subscriber").await;
        assert_eq!(subscriber.recv().await["body"], "before the upgrade");
    }

    // The same program marked as built for aarch64: published (it is an ELF binary of a CPU
    // nodes run on), refused by the canary's x86_64 node, which serves on.
    binary[18..20].copy_from_slice(&0xb7u16.to_le_bytes());
    let other_cpu = files.path().join("dataplane-aarch64");
    std::fs::write(&other_cpu, &binary).unwrap();
    let published = qe_tests::qe_json(
        &config,
        0,
        &["builds", "publish", other_cpu.to_str().unwrap()],
    );
    assert_eq!(published["architecture"], "aarch64");
    let wrong = published["sha256"].as_str().unwrap().to_string();
    let canary = queues[0].0.as_str();
    let start = [
        &["--json"][..],
        &qe_tests::rollout_start(&wrong, canary, "240"),
    ]
    .concat();
    let (code, out, err) = qe_tests::run_qe(&config, &start, "");
    assert_eq!(code, 3, "{out}{err}");
    let halted: Value = serde_json::from_str(&out).unwrap();
    let reason = halted["reason"].as_str().unwrap();
    assert!(reason.contains("not built for x86_64"), "{reason}");
    assert_eq!(halted["queues"][&queues[1].0]["step"], "waiting");
    let (_, canary_queue) = api.call("GET", &format!("/v1/queues/{canary}"), None).await;
    assert_eq!(canary_queue["node_build"]["binary_sha256"], good.as_str());
    let host = queues[0].2["host"].as_str().unwrap();
    let mut publisher = logged_in(dns, host, &root, &queues[0].1, "publisher").await;
    let reply = publisher.request(json!({"body": "after"})).await;
    assert_eq!(reply["status"], "Success.", "the canary serves on: {reply}");
    let id = halted["id"].as_str().unwrap();
    let rolled_back = qe_tests::qe_json(&config, 0, &["rollouts", "rollback", id]);
    assert_eq!(rolled_back["state"], "rolled-back");
    for instance in instances {
        instance.terminate();
    }
}

#[tokio::test]
async fn a_replicated_queue_gets_a_standby_instance_in_another_zone_that_follows_its_node() {
    let _control_plane = HostAddress::keep(control_plane_v6(1));
    let (moto, ec2, files, api) = cloud_reached_at(control_plane_v6(1)).await;
    let dns = api.cp.dns.expect("a DNS server");
    let root = std::fs::read_to_string(api.cp.dir.path().join("data/local-ca/ca.pem")).unwrap();
    let TwoMachines {
        id,
        logins,
        host,
        queue,
        node,
        standby,
        mut publisher,
    } = two_machines(&api, &ec2, files.path(), ["qr1", "qr2"]).await;
    let client = ec2.client(REGION).unwrap();
    let zone_of = |instance: &qe_ec2::aws_sdk_ec2::types::Instance| {
        instance
            .placement()
            .and_then(|p| p.availability_zone())
            .map(str::to_owned)
    };
    let node_instance = queue["resources"]["instance"].as_str().unwrap();
    let standby_instance = queue["resources"]["standby_instance"].as_str().unwrap();
    let node_zone = zone_of(&describe_instance(client, node_instance).await);
    let standby_zone = zone_of(&describe_instance(client, standby_instance).await);
    assert_eq!(node_zone.as_deref(), Some("us-east-1a"));
    assert_eq!(standby_zone.as_deref(), Some("us-east-1b"), "another zone");
    let standby_volume = queue["resources"]["standby_volume"].as_str().unwrap();
    let volume = moto::describe_volume(client, standby_volume).await.unwrap();
    assert_eq!(volume.availability_zone(), Some("us-east-1b"));
    let first_volume = queue["resources"]["volume"].clone();
    assert_ne!(standby_volume, first_volume.as_str().unwrap());
    // Its user data holds a bootstrap token of its own: never the node's credential, and
    // never the replication key (which its config gives it).
    let text = user_data(&ec2, standby_instance).await;
    let secret = std::fs::read(api.cp.dir.path().join("data/node-secret")).unwrap();
    let mac = qe_shared::hmac::hmac_sha256(&secret, format!("replication/{id}").as_bytes());
    let key = qe_shared::hex(&mac);
    assert!(!text.contains(&key), "the key is not in the user data");
    assert!(!bootstrap_in(&text).contains_key("node_token"));

    let exchanged = audited(&api, &id, "node.bootstrap").await;
    assert_eq!(
        exchanged,
        vec![
            format!("instance {node_instance}"),
            format!("instance {standby_instance}")
        ]
    );
    let status = present_bootstrap(&api, &ec2, &id, standby_instance, standby_instance).await;
    assert_eq!(status, 401, "its bootstrap token was spent");

    // The node's machine is lost: a subscriber holds 2 of the 5 messages published at
    // durability 2 when the node's namespace is killed, processes and network. Once the node
    // has not been heard from for the silence limit (3 s here), the control plane fences it
    // and promotes the standby's machine: the name moves there, and it serves on its copy.
    // What the 507s above kept goes first: the queue starts this part empty.
    let mut admin = connect(dns, &host, &root).await;
    let reply = login(&mut admin, &logins["admin"], "admin", json!({})).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let purged = admin
        .request(json!({"cmd": "purge", "scope": "waiting"}))
        .await;
    assert_eq!(purged["status"], "Success.", "{purged}");
    drop(admin);
    // An SQS receiver holds one more, received for 10 minutes by name on the node's machine:
    // its receipt handle must delete it on the standby's once that serves, and nobody else
    // gets it meanwhile.
    let key = api.admin_sqs_key(&id).await;
    let sqs_at = |address: &str| {
        let endpoint = SqsEndpoint {
            url: key["endpoint"].as_str().unwrap(),
            ca_pem: Some(&root),
            resolve_to: Some(address.parse().unwrap()),
        };
        let key_id = key["access_key_id"].as_str().unwrap();
        sqs::client(&endpoint, key_id, key["secret"].as_str().unwrap())
    };
    let queue_url = key["queue_url"].as_str().unwrap();
    let reply = publisher
        .request(json!({"body": "received over SQS", "durability": 2}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let on_the_node = sqs_at(queue["addresses"]["v6"].as_str().unwrap());
    let received = on_the_node
        .receive_message()
        .queue_url(queue_url)
        .visibility_timeout(600)
        .send()
        .await
        .unwrap();
    let [received] = received.messages() else {
        panic!("one message: {received:?}");
    };
    assert_eq!(received.body(), Some("received over SQS"));
    let handle = received.receipt_handle().unwrap().to_string();
    let mut holder = connect(dns, &host, &root).await;
    let capacity = json!({"capacity": 2});
    let reply = login(&mut holder, &logins["subscriber"], "subscriber", capacity).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let session = reply["sessionid"].clone();
    for n in 0..5 {
        let reply = publisher
            .request(json!({"body": format!("kept {n}"), "durability": 2}))
            .await;
        assert_eq!(reply["status"], "Success.", "{reply}");
    }
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(holder.recv().await["body"].as_str().unwrap().to_string());
    }
    let lost_at = Instant::now();
    drop(node);
    drop((holder, publisher));
    let deadline = Instant::now() + Duration::from_secs(60);
    let promoted = loop {
        let (_, queue) = api.call("GET", &format!("/v1/queues/{id}"), None).await;
        if queue["resources"]["instance"] == standby_instance {
            break queue;
        }
        assert!(Instant::now() < deadline, "never promoted: {queue}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let serving = (promoted["serving"].as_str(), promoted["epoch"].as_u64());
    assert_eq!(serving, (Some("second"), Some(1)), "{promoted}");
    let described = describe_instance(client, node_instance).await;
    assert_eq!(
        described.state().unwrap().name(),
        Some(&InstanceStateName::Terminated),
        "the lost node is fenced"
    );
    let moved_to = promoted["addresses"]["v6"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut publisher = loop {
        let moved = dig(dns, &host, "AAAA", false).answers == vec![moved_to.clone()];
        if let Some(mut publisher) = try_connect(dns, &host, &root).await.filter(|_| moved) {
            let login = login(&mut publisher, &logins["publisher"], "publisher", json!({}));
            if login.await["status"] == "Success." {
                break publisher;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the promoted machine never served by name:\n{}",
            standby.log("node.log")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "the node's machine lost: serving again by name on the standby's after {:.1} s \
         (silence limit 3 s)",
        lost_at.elapsed().as_secs_f64()
    );
    let reply = publisher
        .request(json!({"body": "after the promotion", "durability": 1}))
        .await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    // The holder resumes its session there: what it held comes to it again first, then the
    // rest; nothing acknowledged was lost, and each comes once.
    let mut holder = connect(dns, &host, &root).await;
    let resume = json!({"capacity": 2, "sessionid": session, "replay": true});
    let reply = login(&mut holder, &logins["subscriber"], "subscriber", resume).await;
    assert_eq!(reply["status"], "Success.", "{reply}");
    let mut delivered = Vec::new();
    for _ in 0..6 {
        // Acked without waiting for the reply (the next delivery may come before it).
        let (body, id) = holder.next_delivery().await;
        holder.send_json(&json!({"id": id, "ack": 1})).await;
        delivered.push(body);
    }
    assert_eq!(delivered[..2], held[..], "what it held, first");
    let mut expected: Vec<String> = (0..5).map(|n| format!("kept {n}")).collect();
    expected.push("after the promotion".into());
    delivered.sort();
    expected.sort();
    assert_eq!(delivered, expected);
    let replaced = audited(&api, &id, "node.replace").await;
    let said = "its standby's machine serves now, at epoch 1";
    assert!(replaced.iter().any(|r| r.contains(said)), "{replaced:?}");
    // The SQS receipt handle given by the lost machine is the message's current receive on
    // the promoted one (a handle that is not is refused MessageNotInflight), and deletes it
    // there; the message was delivered to nobody else meanwhile.
    assert!(!delivered.iter().any(|body| body == "received over SQS"));
    let on_the_promoted = sqs_at(&moved_to);
    let extend = || {
        on_the_promoted
            .change_message_visibility()
            .queue_url(queue_url)
            .receipt_handle(&handle)
            .visibility_timeout(600)
            .send()
    };
    let extended = extend().await;
    assert!(
        extended.is_ok(),
        "the handle is current there: {extended:?}"
    );

    // A new standby's machine is placed in the first slot, on the lost node's volume (that
    // copy rejoins as the standby of the promoted one): booted, durability 2 is on two disks
    // again.
    let deadline = Instant::now() + Duration::from_secs(60);
    let queue = loop {
        let (_, queue) = api.call("GET", &format!("/v1/queues/{id}"), None).await;
        let placed = queue["resources"]["standby_instance"].as_str();
        if placed.is_some() && placed != Some(standby_instance) {
            break queue;
        }
        assert!(Instant::now() < deadline, "no new standby placed: {queue}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(queue["resources"]["standby_volume"], first_volume);
    let node = standby;
    let standby = boot_standby(&ec2, &queue, "qr3", "qr2", files.path()).await;
    standby.wait_for_node_log("caught up with the primary");
    on_two_disks(&mut publisher, "two disks again").await;
    // Now that a delete is on two disks again (until then it is refused as not stored
    // durably), the handle deletes its message.
    let deleted = on_the_promoted
        .delete_message()
        .queue_url(queue_url)
        .receipt_handle(&handle)
        .send()
        .await;
    assert!(deleted.is_ok(), "{deleted:?}");
    let gone = extend().await.expect_err("deleted");
    assert!(
        format!("{gone:?}").contains("MessageNotInflight"),
        "{gone:?}"
    );
    let node_instance = queue["resources"]["instance"].as_str().unwrap();
    let standby_instance = queue["resources"]["standby_instance"].as_str().unwrap();
    let standby_volume = queue["resources"]["standby_volume"].as_str().unwrap();

    // Deleted: both instances terminated (each machine then stops what it runs: the node
    // with its last report), both volumes gone.
    let (status, _) = api.call("DELETE", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(status, 202);
    let deadline = Instant::now() + Duration::from_secs(60);
    for instance in [node_instance, standby_instance] {
        while describe_instance(client, instance)
            .await
            .state()
            .unwrap()
            .name()
            != Some(&InstanceStateName::Terminated)
        {
            assert!(Instant::now() < deadline, "{instance} never terminated");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let said = tokio::task::spawn_blocking(move || (node.terminate(), standby.terminate()))
        .await
        .unwrap();
    assert_eq!(said.0, "stopped status=0", "the node stops cleanly");
    let (status, deleted) = api
        .call(
            "GET",
            &format!("/v1/queues/{id}?until=deleted&within=60"),
            None,
        )
        .await;
    assert_eq!(
        (status, &deleted["status"]),
        (200, &json!("deleted")),
        "{deleted}"
    );
    for volume in [
        standby_volume,
        queue["resources"]["volume"].as_str().unwrap(),
    ] {
        assert!(
            describe_volume(client, volume).await.is_none(),
            "{volume} is kept"
        );
    }
    drop(moto);
}

/// A partition: the node's machine is cut off from the control plane but not from its clients
/// nor its standby. Once it has been silent for the silence limit, the control plane promotes
/// the standby's machine (the fence, EC2's termination, does not reach this emulated one: it
/// runs on). The cut-off node, still reached by its clients, refuses durable writes from then
/// on: durability 2 because its standby no longer syncs for it (507, or 502 once refused
/// outright), durability 1 and 0 because it has heard from neither the control plane nor a
/// standby for the silence limit (502: it may have been replaced). Everything it acknowledged at
/// durability 2 is served by the promoted machine.
#[tokio::test]
async fn a_node_cut_off_from_the_control_plane_refuses_writes_after_the_failover() {
    let _control_plane = HostAddress::keep(control_plane_v6(2));
    let (moto, ec2, files, api) = cloud_reached_at(control_plane_v6(2)).await;
    let dns = api.cp.dns.expect("a DNS server");
    let root = std::fs::read_to_string(api.cp.dir.path().join("data/local-ca/ca.pem")).unwrap();
    let TwoMachines {
        id,
        logins,
        host,
        queue,
        node,
        standby,
        mut publisher,
    } = two_machines(&api, &ec2, files.path(), ["qp1", "qp2"]).await;
    let mut acknowledged = Vec::new();
    for n in 0..3 {
        let body = format!("before {n}");
        let reply = publisher
            .request(json!({"body": body, "durability": 2}))
            .await;
        assert_eq!(reply["status"], "Success.", "{reply}");
        acknowledged.push(body);
    }
    node.cut_off_from(control_plane_v6(2));
    let standby_instance = queue["resources"]["standby_instance"].as_str().unwrap();
    let promoted = api
        .until(&id, |queue| {
            queue["resources"]["instance"] == standby_instance
        })
        .await;
    assert_eq!(promoted["epoch"], 1, "{promoted}");
    // Its clients still reach it (the publisher's connection is to it): durability 2 is
    // refused once the standby has stopped following it, which it does as soon as its config
    // names it the node. A publish answered Success before that was synced on the standby's
    // machine, and must be served there.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let body = format!("after the cut {}", acknowledged.len());
        let reply = publisher
            .request(json!({"body": body, "durability": 2}))
            .await;
        if reply["code"] == 507 || reply["code"] == 502 {
            break body;
        }
        assert_eq!(reply["status"], "Success.", "{reply}");
        acknowledged.push(body);
        assert!(
            Instant::now() < deadline,
            "still Success on the cut-off node"
        );
    };
    // Durability 1 too: written here alone, it would be lost to the promoted machine; and
    // durability 0, kept in memory here, which a second primary must not take either.
    for durability in [1, 0] {
        let body = format!("durability {durability} after the cut");
        let reply = publisher
            .request(json!({"body": body, "durability": durability}))
            .await;
        assert_eq!(reply["code"], 502, "{reply}");
    }
    assert!(
        node.log("node.log").contains("listening on"),
        "it runs on: {}",
        node.log("node.log")
    );
    // The promoted machine serves everything the cut-off node acknowledged.
    let moved_to = promoted["addresses"]["v6"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut subscriber = loop {
        let moved = dig(dns, &host, "AAAA", false).answers == vec![moved_to.clone()];
        if let Some(mut subscriber) = try_connect(dns, &host, &root).await.filter(|_| moved) {
            let capacity = json!({"capacity": 10});
            let login = login(
                &mut subscriber,
                &logins["subscriber"],
                "subscriber",
                capacity,
            );
            if login.await["status"] == "Success." {
                break subscriber;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the promoted machine never served: {}",
            standby.log("node.log")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let delivered = acked_until_quiet(&mut subscriber).await;
    for body in &acknowledged {
        assert!(delivered.contains(body), "{body} lost: {delivered:?}");
    }
    assert!(
        !delivered.contains(&refused),
        "what it refused is not on the promoted machine: {delivered:?}"
    );
    drop((node, standby, moto));
}

/// A standby's machine that runs but no longer follows (here its network is lost: EC2 still
/// says it runs, so it is not "gone") is replaced. Its node, whose pings it leaves
/// unanswered, drops it and reports it absent; once it has been absent for the silence limit
/// (3 s here), and not before its boot time since it was placed (30 s here), the control
/// plane terminates its instance and launches another in its slot, on its volume, which
/// catches up: durability 2 is on two disks again. The node serves throughout.
#[tokio::test]
async fn a_standby_instance_that_stops_following_is_replaced_on_its_volume() {
    let _control_plane = HostAddress::keep(control_plane_v6(3));
    let provider = "boot_within_secs = 30";
    let (moto, ec2, files, api) = cloud_reached_at_with(control_plane_v6(3), provider).await;
    let machines = two_machines(&api, &ec2, files.path(), ["qh1", "qh2"]).await;
    // (Logged in again at the end: a client left unread that long answers no ping.)
    drop(machines.publisher);
    let (id, queue, standby) = (machines.id, machines.queue, machines.standby);
    let client = ec2.client(REGION).unwrap();
    let hung = queue["resources"]["standby_instance"].as_str().unwrap();
    let volume = queue["resources"]["standby_volume"].clone();
    standby.lose_network();
    let cut_at = Instant::now();
    // At most its boot time and the limit after it was placed, or the limit after its node
    // noticed (5 s without a pong).
    let deadline = Instant::now() + Duration::from_secs(120);
    let replaced = loop {
        let (_, queue) = api.call("GET", &format!("/v1/queues/{id}"), None).await;
        let placed = queue["resources"]["standby_instance"].as_str();
        if placed.is_some_and(|placed| placed != hung) {
            break queue;
        }
        assert!(Instant::now() < deadline, "never replaced: {queue}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "the standby's machine cut off: replaced {:.1} s later",
        cut_at.elapsed().as_secs_f64()
    );
    let described = describe_instance(client, hung).await;
    assert_eq!(
        described.state().unwrap().name(),
        Some(&InstanceStateName::Terminated),
        "the hung standby is fenced"
    );
    assert_eq!(
        replaced["resources"]["standby_volume"], volume,
        "on its volume"
    );
    assert_eq!(
        replaced["resources"]["instance"],
        queue["resources"]["instance"]
    );
    assert_eq!(replaced["epoch"], queue["epoch"], "nothing was promoted");
    let reasons = audited(&api, &id, "standby.replace").await;
    let said = "its node has had no standby attached for more than 3 s";
    assert_eq!(reasons, vec![said.to_string()]);
    // EC2's termination has reached the emulated machine: only then is its volume booted
    // again, by the new instance.
    drop(standby);
    let standby = boot_standby(&ec2, &replaced, "qh3", "qh1", files.path()).await;
    standby.wait_for_node_log("caught up with the primary");
    let dns = api.cp.dns.expect("a DNS server");
    let root = std::fs::read_to_string(api.cp.dir.path().join("data/local-ca/ca.pem")).unwrap();
    let (host, logins) = (&machines.host, &machines.logins);
    let mut publisher = logged_in(dns, host, &root, logins, "publisher").await;
    on_two_disks(&mut publisher, "two disks again").await;
    drop((machines.node, standby, moto));
}
