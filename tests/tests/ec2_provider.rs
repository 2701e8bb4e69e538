//! The control plane with the EC2 provider, against moto (EC2's emulator, on loopback): what
//! it launches and makes is checked through EC2's own Describe calls. No node boots here (moto
//! launches nothing; `instance.rs` boots one in a network namespace): where a node would
//! speak, the test speaks for it with the credential its user data carries.

use base64::Engine;
use qe_ec2::aws_sdk_ec2::types::InstanceStateName;
use qe_ec2::{Ec2, Launch, CLUSTER_TAG, DATA_VOLUME, PURPOSE_TAG, QUEUE_TAG};
use qe_shared::node_channel::Bootstrap;
use qe_tests::moto::{self, describe_instance, describe_volume, Moto};
use qe_tests::{dig, http, ControlPlane};
use serde_json::{json, Value};
use sha2::Digest;
use std::time::{Duration, Instant};

const REGION: &str = "us-east-1";

fn unix_now() -> u64 {
    controlplane::unix_now()
}

/// Moto with a region's network, and the control plane's config for it.
async fn cloud() -> (Moto, Ec2, String) {
    moto::fake_credentials();
    let moto = Moto::start();
    let ec2 = moto::with_networks("test", &moto.endpoint, &[REGION]).await;
    let region = &ec2.settings().regions[REGION];
    let groups: Vec<String> = region
        .security_group_ids
        .iter()
        .map(|g| format!("{g:?}"))
        .collect();
    let config = format!(
        "reconcile_every_secs = 1\ndns_listen = \"127.0.0.1:0\"\n[provider]\nkind = \"ec2\"\n\
         endpoint = \"{}\"\n[provider.regions.{REGION}]\nimage_id = {:?}\nsubnet_id = {:?}\n\
         security_group_ids = [{}]\n",
        moto.endpoint,
        region.image_id,
        region.subnet_id,
        groups.join(", ")
    );
    (moto, ec2, config)
}

/// Queue `id` once the provider placed it on an instance other than `not`.
async fn placed(cp: &ControlPlane, id: &str, not: Option<&str>) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, queue) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
        let instance = queue["resources"]["instance"].as_str();
        if instance.is_some() && instance != not {
            return queue;
        }
        assert!(Instant::now() < deadline, "never placed: {queue}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn user_data(ec2: &Ec2, instance: &str) -> String {
    moto::user_data(ec2.client(REGION).unwrap(), instance).await
}

/// The value of the shell variable `name='…'` in the first-boot script.
fn script_value<'a>(user_data: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name}='");
    let line = user_data
        .lines()
        .find_map(|line| line.trim().strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in the user data"));
    line.trim_end_matches('\'')
}

/// The bootstrap the user data writes for the node.
fn bootstrap_of(user_data: &str) -> Bootstrap {
    let encoded = user_data
        .lines()
        .find_map(|line| line.trim().strip_prefix("content: \""))
        .unwrap()
        .trim_end_matches('"');
    let text = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    toml::from_str(std::str::from_utf8(&text).unwrap()).unwrap()
}

/// The node token of the instance whose user data is `user_data`, as its first boot gets it:
/// the bootstrap token in its user data traded as instance `instance`.
async fn exchanged(cp: &ControlPlane, user_data: &str, instance: &str) -> String {
    let bootstrap = bootstrap_of(user_data);
    assert!(
        bootstrap.node_token.is_empty(),
        "user data holds no node token"
    );
    let token = bootstrap.bootstrap_token.expect("a bootstrap token");
    let path = format!("/v1/nodes/{}/bootstrap", bootstrap.queue_id);
    let body = json!({ "instance_id": instance }).to_string();
    let (status, answer) = http(cp.addr, "POST", &path, Some(&token), Some(&body)).await;
    assert_eq!(status, 200, "{answer}");
    answer["node_token"].as_str().unwrap().to_string()
}

fn tag(tags: &[qe_ec2::aws_sdk_ec2::types::Tag], key: &str) -> Option<String> {
    tags.iter()
        .find(|tag| tag.key() == Some(key))
        .and_then(|tag| tag.value().map(str::to_string))
}

async fn state_of(ec2: &Ec2, instance: &str) -> InstanceStateName {
    let described = describe_instance(ec2.client(REGION).unwrap(), instance).await;
    described.state().unwrap().name().unwrap().clone()
}

/// Waits until `instance` is terminated in EC2.
async fn terminated(ec2: &Ec2, instance: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while state_of(ec2, instance).await != InstanceStateName::Terminated {
        assert!(Instant::now() < deadline, "{instance} was never terminated");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The body of `GET path` with `token`, as bytes (a binary).
async fn download(addr: std::net::SocketAddr, path: &str, token: &str) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: cp\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let end = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = std::str::from_utf8(&response[9..12])
        .unwrap()
        .parse()
        .unwrap();
    (status, response[end + 4..].to_vec())
}

/// The node's last report, as a node makes it when it stops: its records (given as
/// `getusage` lines), then `final`.
async fn last_report(cp: &ControlPlane, id: &str, token: &str, usage: &[String]) {
    let path = format!("/v1/nodes/{id}/reports");
    let usage: Vec<qe_shared::node_channel::UsageRecord> = usage
        .iter()
        .map(|line| qe_shared::node_channel::UsageRecord::from_line(line).unwrap())
        .collect();
    let body = json!({ "usage": usage }).to_string();
    let (status, reply) = http(cp.addr, "POST", &path, Some(token), Some(&body)).await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = http(
        cp.addr,
        "POST",
        &path,
        Some(token),
        Some(r#"{"final":true}"#),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
}

#[tokio::test]
async fn an_ec2_queue_is_launched_as_asked_and_its_volume_outlives_its_instance() {
    let (_moto, ec2, config) = cloud().await;
    let cp = ControlPlane::start_with(&config);
    let dns = cp.dns.expect("a DNS server");
    let body = format!(
        r#"{{"tier":"standard","region":"{REGION}","instance_type":"t3.small","ipv4":true}}"#
    );
    let (status, created) = cp.call("POST", "/v1/queues", Some(&body)).await;
    assert_eq!(
        (status, created["status"].as_str()),
        (201, Some("provisioning"))
    );
    let id = created["id"].as_str().unwrap().to_string();
    let queue = placed(&cp, &id, None).await;
    let instance = queue["resources"]["instance"].as_str().unwrap().to_string();
    let volume = queue["resources"]["volume"].as_str().unwrap().to_string();
    let client = ec2.client(REGION).unwrap();

    // Launched as the queue asked, where the region's settings say, tagged, IMDSv2 only.
    let described = describe_instance(client, &instance).await;
    assert_eq!(described.instance_type().unwrap().as_str(), "t3.small");
    assert_eq!(
        described.image_id(),
        Some(ec2.settings().regions[REGION].image_id.as_str())
    );
    assert_eq!(tag(described.tags(), CLUSTER_TAG).as_deref(), Some("test"));
    assert_eq!(
        tag(described.tags(), QUEUE_TAG).as_deref(),
        Some(id.as_str())
    );
    let tokens = described.metadata_options().unwrap().http_tokens().unwrap();
    assert_eq!(tokens.as_str(), "required");
    let public = described
        .public_ip_address()
        .expect("a public IPv4: the queue asked");
    let nic = &described.network_interfaces()[0];
    assert_eq!(nic.ipv6_addresses().len(), 1, "one IPv6 address");
    let v6 = nic.ipv6_addresses()[0].ipv6_address().unwrap().to_string();
    assert!(v6.starts_with("fd71:7e5e:0:100:"), "{v6}");
    assert_eq!(queue["addresses"], json!({"v6": v6, "v4": public}));

    // Its name resolves there, AAAA and A (resolved only: nothing connects to it).
    let host = queue["host"].as_str().unwrap();
    assert_eq!(dig(dns, host, "AAAA", false).answers, vec![v6.clone()]);
    assert_eq!(dig(dns, host, "A", false).answers, vec![public.to_string()]);

    // The user data is the rendered cloud-init: this queue, its volume, its bootstrap.
    let text = user_data(&ec2, &instance).await;
    assert!(text.starts_with("#cloud-config\n"));
    assert_eq!(script_value(&text, "QUEUE_ID"), id);
    assert_eq!(script_value(&text, "VOLUME_ID"), volume);
    assert!(!text.contains("{{"), "every placeholder filled");
    let bootstrap = bootstrap_of(&text);
    assert_eq!(bootstrap.queue_id, id);
    assert_eq!(bootstrap.control_plane, format!("http://{}", cp.addr));
    // Its bootstrap token, traded as the instance, gives the credential that opens the
    // channel: the node would listen on 443, everywhere.
    let token = exchanged(&cp, &text, &instance).await;
    let config_path = format!("/v1/nodes/{id}/config");
    let (status, desired) = http(cp.addr, "GET", &config_path, Some(&token), None).await;
    assert_eq!(
        (status, &desired["listen"]),
        (200, &json!(["[::]:443"])),
        "{desired}"
    );
    // And its SQS face on 9443 (no keys yet).
    assert_eq!(
        desired["sqs"],
        json!({"listen": ["[::]:9443"], "keys": []}),
        "{desired}"
    );
    // And fetches the binary the script checks.
    let (status, binary) = download(cp.addr, &format!("/v1/nodes/{id}/dataplane"), &token).await;
    assert_eq!(status, 200);
    let sha = sha2::Sha256::digest(&binary);
    let sha = qe_shared::hex(&sha);
    assert_eq!(script_value(&text, "DATAPLANE_SHA256"), sha);
    assert_eq!(binary, std::fs::read(qe_tests::dataplane_binary()).unwrap());
    let (status, _) = download(cp.addr, &format!("/v1/nodes/{id}/dataplane"), "nope").await;
    assert_eq!(status, 401);

    // The queue's volume, attached to it, tagged.
    let described = describe_volume(client, &volume).await.expect("the volume");
    assert_eq!(
        described.attachments()[0].instance_id(),
        Some(instance.as_str())
    );
    assert_eq!(
        tag(described.tags(), QUEUE_TAG).as_deref(),
        Some(id.as_str())
    );

    // The instance is lost: the reconciler replaces it, with the same volume.
    client
        .terminate_instances()
        .instance_ids(&instance)
        .send()
        .await
        .unwrap();
    let replaced = placed(&cp, &id, Some(&instance)).await;
    let second = replaced["resources"]["instance"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        replaced["resources"]["volume"],
        volume.as_str(),
        "the same volume"
    );
    let described = describe_volume(client, &volume).await.expect("the volume");
    assert_eq!(
        described.attachments()[0].instance_id(),
        Some(second.as_str())
    );
    let v6 = replaced["addresses"]["v6"].as_str().unwrap().to_string();
    assert_eq!(dig(dns, host, "AAAA", false).answers, vec![v6]);
    assert_eq!(
        script_value(&user_data(&ec2, &second).await, "VOLUME_ID"),
        volume
    );

    // Deleted: the instance is terminated, the node (here, the test) reports its last
    // records, then the volume goes and the queue is deleted.
    let deleting = {
        let (addr, token) = (cp.addr, cp.token.clone());
        let path = format!("/v1/queues/{id}");
        tokio::spawn(async move { http(addr, "DELETE", &path, Some(&token), None).await })
    };
    terminated(&ec2, &second).await;
    assert!(
        describe_volume(client, &volume).await.is_some(),
        "kept for the last report"
    );
    let line = format!("{},100,200,0,0,0,t3.small,{REGION},1", unix_now());
    last_report(&cp, &id, &token, &[line]).await;
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
    let (_, usage) = cp.call("GET", &qe_tests::all_usage_of(&id), None).await;
    assert_eq!(usage["usage"].as_array().unwrap().len(), 1, "{usage}");
    let (status, _) = http(cp.addr, "GET", &config_path, Some(&token), None).await;
    assert_eq!(status, 401, "a deleted queue's credential works no more");
}

#[tokio::test]
async fn killed_while_launching_or_deleting_the_control_plane_leaves_no_orphan_or_twin() {
    let (_moto, ec2, config) = cloud().await;
    let client = ec2.client(REGION).unwrap().clone();
    let mut cp = ControlPlane::start_with(&config);
    let body = format!(
        r#"{{"tier":"devtest","region":"{REGION}","instance_type":"t3.small","ipv4":false}}"#
    );
    // Killed right after the queue is recorded: wherever the launch was, after a restart it
    // has exactly one instance and one volume.
    let (_, created) = cp.call("POST", "/v1/queues", Some(&body)).await;
    let id = created["id"].as_str().unwrap().to_string();
    cp.kill();
    // Something of this cluster that belongs to no queue (a launch whose record was lost).
    let ghost = ec2
        .launch(&Launch {
            queue_id: "ghostqueue00",
            region: REGION,
            instance_type: "t3.small",
            ipv4: false,
            user_data: "#cloud-config\n",
            client_token: "ghostqueue00-first",
            slot: qe_ec2::Slot::First,
        })
        .await
        .unwrap();
    let ghost_volume = ec2.volume_for(REGION, "ghostqueue00").await.unwrap();
    let cp = cp.start_again();
    let queue = placed(&cp, &id, None).await;
    let live = |instances: &[qe_ec2::Instance], queue: &str| {
        instances
            .iter()
            .filter(|i| i.queue_id == queue && i.state != "terminated")
            .count()
    };
    terminated(&ec2, &ghost.id).await;
    assert!(
        describe_volume(&client, &ghost_volume.id).await.is_none(),
        "the orphan's volume"
    );
    assert_eq!(live(&ec2.instances().await.unwrap(), &id), 1, "no twin");
    let volumes = ec2.volumes().await.unwrap();
    assert_eq!(volumes.iter().filter(|v| v.queue_id == id).count(), 1);

    // Restarted again, it adopts the instance it has: nothing is launched anew.
    let instance = queue["resources"]["instance"].as_str().unwrap().to_string();
    let mut cp = cp.restart();
    let again = placed(&cp, &id, None).await;
    assert_eq!(again["resources"]["instance"], instance.as_str());
    assert_eq!(live(&ec2.instances().await.unwrap(), &id), 1);

    // Killed in the middle of a delete: the next one finishes it, after the last report (from
    // the node, with the credential its first boot got).
    let node_token = exchanged(&cp, &user_data(&ec2, &instance).await, &instance).await;
    let path = format!("/v1/queues/{id}");
    let (addr, token) = (cp.addr, cp.token.clone());
    let deleting =
        tokio::spawn(async move { http(addr, "DELETE", &path, Some(&token), None).await });
    terminated(&ec2, &instance).await;
    cp.kill();
    let _ = deleting.await;
    let cp = cp.start_again();
    let line = format!("{},0,0,0,0,0,t3.small,{REGION},0", unix_now());
    last_report(&cp, &id, &node_token, &[line]).await;
    let deleted = cp.wait_for_status(&id, "deleted").await;
    assert!(
        deleted["resources"].as_object().unwrap().is_empty(),
        "{deleted}"
    );
    let volumes = ec2.volumes().await.unwrap();
    assert_eq!(
        volumes.iter().filter(|v| v.queue_id == id).count(),
        0,
        "no orphan volume"
    );
    assert_eq!(
        live(&ec2.instances().await.unwrap(), &id),
        0,
        "no orphan instance"
    );
    let (_, usage) = cp.call("GET", &qe_tests::all_usage_of(&id), None).await;
    assert_eq!(
        usage["usage"].as_array().unwrap().len(),
        1,
        "the last record is kept"
    );
}

/// A second instance and a second data volume of a live queue (made by hand here, as a launch
/// that lost its token or a race would) are removed within a reconcile pass: the twin instance
/// terminated, the twin volume deleted, the queue's own left as they were. (The provider kept
/// whichever instance EC2 listed last and never looked at a second volume; a twin holding the
/// volume blocked every attach.)
#[tokio::test]
async fn a_twin_instance_and_a_twin_volume_of_a_live_queue_are_removed() {
    use qe_ec2::aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let (_moto, ec2, config) = cloud().await;
    let client = ec2.client(REGION).unwrap().clone();
    let cp = ControlPlane::start_with(&config);
    let body = format!(
        r#"{{"tier":"devtest","region":"{REGION}","instance_type":"t3.small","ipv4":false}}"#
    );
    let (_, created) = cp.call("POST", "/v1/queues", Some(&body)).await;
    let id = created["id"].as_str().unwrap().to_string();
    let queue = placed(&cp, &id, None).await;
    let instance = queue["resources"]["instance"].as_str().unwrap().to_string();
    let volume = queue["resources"]["volume"].as_str().unwrap().to_string();

    let twin = ec2
        .launch(&Launch {
            queue_id: &id,
            region: REGION,
            instance_type: "t3.small",
            ipv4: false,
            user_data: "#cloud-config\n",
            client_token: &format!("{id}-by-hand"),
            slot: qe_ec2::Slot::First,
        })
        .await
        .unwrap();
    let zone = describe_volume(&client, &volume)
        .await
        .unwrap()
        .availability_zone()
        .unwrap()
        .to_string();
    let tags = [
        (CLUSTER_TAG, "test"),
        (QUEUE_TAG, &id),
        (PURPOSE_TAG, DATA_VOLUME),
    ]
    .map(|(key, value)| Tag::builder().key(key).value(value).build());
    let twin_volume = client
        .create_volume()
        .availability_zone(zone)
        .size(1)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Volume)
                .set_tags(Some(tags.to_vec()))
                .build(),
        )
        .send()
        .await
        .unwrap()
        .volume_id()
        .unwrap()
        .to_string();

    terminated(&ec2, &twin.id).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while describe_volume(&client, &twin_volume).await.is_some() {
        assert!(Instant::now() < deadline, "the twin volume is still there");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        state_of(&ec2, &instance).await,
        InstanceStateName::Running,
        "the queue's own instance stays"
    );
    assert!(describe_volume(&client, &volume).await.is_some());
    let (_, now) = cp.call("GET", &format!("/v1/queues/{id}"), None).await;
    assert_eq!(now["resources"], queue["resources"], "{now}");
    let log = cp.log_text();
    assert!(log.contains("a second instance of a live queue"), "{log}");
    assert!(
        log.contains("a second data volume of a live queue"),
        "{log}"
    );
}

/// Issue 29: a launch EC2 refuses for good (an instance type it does not have) fails the
/// queue at once, with EC2's reason, instead of leaving it `provisioning`.
#[tokio::test]
async fn a_launch_ec2_refuses_for_good_fails_the_queue_with_the_reason() {
    let (_moto, _ec2, config) = cloud().await;
    let cp = ControlPlane::start_with(&config);
    let body = format!(
        r#"{{"tier":"devtest","region":"{REGION}","instance_type":"t3.nonesuch","ipv4":false}}"#
    );
    let (status, created) = cp.call("POST", "/v1/queues", Some(&body)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let failed = cp.wait_for_status(id, "failed").await;
    let reason = failed["failure"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("RunInstances: InvalidInstanceType"),
        "{failed}"
    );
}

/// Issue 29: the reconciler's look at every queue costs EC2 one listing of instances and one
/// of volumes per region, not two calls per queue: with four placed queues, DescribeInstances
/// grows by one per survey (`qe_cloud_requests_total`, `qe_fleet_surveys_total`).
#[tokio::test]
async fn a_look_at_every_queue_lists_the_fleet_once() {
    let (_moto, _ec2, config) = cloud().await;
    let cp = ControlPlane::start_with(&config);
    let body = format!(
        r#"{{"tier":"devtest","region":"{REGION}","instance_type":"t3.small","ipv4":false}}"#
    );
    for _ in 0..4 {
        let (_, created) = cp.call("POST", "/v1/queues", Some(&body)).await;
        placed(&cp, created["id"].as_str().unwrap(), None).await;
    }
    let counts = || async {
        let token = Some(cp.token.as_str());
        let (status, text) = qe_tests::http_text(cp.addr, "GET", "/metrics", token, None).await;
        assert_eq!(status, 200);
        let value = |prefix: &str| -> u64 {
            let line = text.lines().find(|line| line.starts_with(prefix));
            line.and_then(|line| line.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0)
        };
        let listings = value("qe_cloud_requests_total{operation=\"DescribeInstances\"} ");
        (value("qe_fleet_surveys_total "), listings)
    };
    // Once every queue has been surveyed placed, and three looks after.
    let (surveys, listings) = counts().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (later_surveys, later_listings) = loop {
        let (now_surveys, now_listings) = counts().await;
        if now_surveys >= surveys + 3 {
            break (now_surveys, now_listings);
        }
        assert!(Instant::now() < deadline, "no surveys: {now_surveys}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let looks = later_surveys - surveys;
    let listed = later_listings - listings;
    // One listing per survey, and at most one look at a queue on its own in flight.
    assert!(
        listed <= looks + 1,
        "{listed} DescribeInstances for {looks} looks at 4 queues"
    );
}
