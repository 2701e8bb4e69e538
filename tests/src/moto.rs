//! A moto server per test (EC2's emulator, on loopback) and the network a region needs before a queue can launch.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Once;
use std::time::{Duration, Instant};

use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};
use qe_ec2::aws_sdk_ec2::error::ProvideErrorMetadata;
use qe_ec2::aws_sdk_ec2::types::{Filter, Instance as SdkInstance, Volume as SdkVolume};
use qe_ec2::aws_sdk_ec2::Client;
use qe_ec2::{Ec2, RegionSettings, Settings};

/// A running `moto_server`, killed on drop; its log is printed if the test failed.
pub struct Moto {
    child: Child,
    /// Holds moto's log and its recording of every request it received.
    dir: tempfile::TempDir,
    pub endpoint: String,
}

impl Moto {
    pub fn start() -> Moto {
        fake_credentials();
        let bin = moto_server();
        let port = free_port();
        let dir = tempfile::tempdir().expect("a directory for moto");
        let log = File::create(dir.path().join("moto.log")).expect("moto's log");
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("MOTO_ENABLE_RECORDING", "true")
            // An instance type EC2 does not have is refused, as AWS refuses it.
            .env("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true")
            .env("MOTO_RECORDER_FILEPATH", dir.path().join("requests.jsonl"))
            .stdout(log.try_clone().expect("moto's stdout"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {}: {err}", bin.display()));
        let mut moto = Moto {
            child,
            dir,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        moto.wait_until_listening(port);
        moto
    }

    /// The form parameters of every request for `action` that moto received, in order: what the SDK really sent,
    /// for the parameters moto accepts but ignores.
    pub fn requests(&self, action: &str) -> Vec<Vec<(String, String)>> {
        let recording =
            std::fs::read_to_string(self.dir.path().join("requests.jsonl")).unwrap_or_default();
        let wanted = format!("Action={action}");
        recording
            .lines()
            .map(|line| form(&body(line)))
            .filter(|params| {
                params
                    .iter()
                    .any(|(key, value)| format!("{key}={value}") == wanted)
            })
            .collect()
    }

    fn wait_until_listening(&mut self, port: u16) {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "moto_server exited ({status}) before listening:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not listen on {address} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("moto.log")).unwrap_or_default()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- moto_server log ---\n{}", self.log_text());
        }
    }
}

/// The body of one recorded request (moto stores binary bodies in base64).
fn body(line: &str) -> String {
    let entry: serde_json::Value = serde_json::from_str(line).expect("a recorded request");
    let body = entry["body"].as_str().unwrap_or_default();
    if entry["body_encoded"].as_bool() == Some(true) {
        String::from_utf8(BASE64.decode(body).expect("base64")).expect("a UTF-8 form")
    } else {
        body.to_owned()
    }
}

/// Splits a form body into pairs; values stay percent-encoded (the ones checked are ids, numbers and booleans).
fn form(body: &str) -> Vec<(String, String)> {
    body.split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}

/// The value of one parameter in a form.
pub fn param<'a>(form: &'a [(String, String)], key: &str) -> Option<&'a str> {
    form.iter()
        .find(|(k, _)| k == key)
        .map(|(_, value)| value.as_str())
}

/// moto lives in the workspace's .venv, installed by scripts/test. A missing moto fails the test: a skipped
/// test would let CI pass without ever talking to EC2's API.
fn moto_server() -> PathBuf {
    let bin = crate::workspace().join(".venv/bin/moto_server");
    assert!(
        bin.exists(),
        "{} is missing: run scripts/test, which installs moto[server] into .venv",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free loopback port");
    listener.local_addr().expect("its address").port()
}

/// The SDK's standard credential chain reads these first; moto accepts any key. Set once, before any test
/// builds a client, as every test starts here.
pub fn fake_credentials() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    });
}

pub fn settings(
    cluster: &str,
    endpoint: &str,
    regions: BTreeMap<String, RegionSettings>,
) -> Settings {
    Settings {
        cluster: cluster.to_owned(),
        endpoint: Some(endpoint.to_owned()),
        regions,
        volume_size_gib: 20,
        volume_type: "gp3".to_owned(),
    }
}

/// Builds, in each region, what the operator makes by hand before queues can run there: a VPC and a subnet
/// with IPv6 ranges, a security group, and an image. Returns the settings that point at them.
pub async fn with_networks(cluster: &str, endpoint: &str, regions: &[&str]) -> Ec2 {
    let bare = regions
        .iter()
        .map(|region| (region.to_string(), placeholder()))
        .collect();
    let bare = Ec2::new(settings(cluster, endpoint, bare)).await;
    let mut made = BTreeMap::new();
    for region in regions {
        made.insert(
            region.to_string(),
            network(bare.client(region).unwrap(), region).await,
        );
    }
    Ec2::new(settings(cluster, endpoint, made)).await
}

fn placeholder() -> RegionSettings {
    RegionSettings {
        image_id: String::new(),
        subnet_id: String::new(),
        standby_subnet_id: None,
        security_group_ids: Vec::new(),
    }
}

/// The subnet's ranges: private IPv4 and an IPv6 ULA, so every address an instance gets is
/// one a test may give a network namespace of its own (never one on the internet).
pub const SUBNET_V4: &str = "10.213.0.0/18";
pub const SUBNET_V6: &str = "fd71:7e5e:0:100::/64";
/// The host's end of every instance's link, in the subnet's ranges (moto assigns from .4).
pub const HOST_V6: &str = "fd71:7e5e:0:100::1";
/// The standbys' subnet, in another zone: its ranges, and the host's end of their links.
pub const STANDBY_SUBNET_V4: &str = "10.213.64.0/18";
pub const STANDBY_SUBNET_V6: &str = "fd71:7e5e:0:101::/64";
pub const STANDBY_HOST_V6: &str = "fd71:7e5e:0:101::1";

/// What the operator makes by hand before queues can run in `region`: a VPC, a dual-stack
/// subnet in [`SUBNET_V4`] and [`SUBNET_V6`], a security group, and an image.
pub async fn network(client: &Client, region: &str) -> RegionSettings {
    let vpc = client
        .create_vpc()
        .cidr_block("10.213.0.0/16")
        .amazon_provided_ipv6_cidr_block(true)
        .send()
        .await
        .expect("CreateVpc");
    let vpc = vpc.vpc().unwrap();
    let vpc_id = vpc.vpc_id().unwrap();
    let subnet = client
        .create_subnet()
        .vpc_id(vpc_id)
        .cidr_block(SUBNET_V4)
        .ipv6_cidr_block(SUBNET_V6)
        .availability_zone(format!("{region}a"))
        .send()
        .await
        .expect("CreateSubnet");
    let standby_subnet = client
        .create_subnet()
        .vpc_id(vpc_id)
        .cidr_block(STANDBY_SUBNET_V4)
        .ipv6_cidr_block(STANDBY_SUBNET_V6)
        .availability_zone(format!("{region}b"))
        .send()
        .await
        .expect("CreateSubnet");
    let group = client
        .create_security_group()
        .group_name("qe-nodes")
        .description("queue nodes")
        .vpc_id(vpc_id)
        .send()
        .await
        .expect("CreateSecurityGroup");
    RegionSettings {
        image_id: image(client).await,
        subnet_id: subnet.subnet().unwrap().subnet_id().unwrap().to_owned(),
        standby_subnet_id: standby_subnet
            .subnet()
            .and_then(|s| s.subnet_id())
            .map(Into::into),
        security_group_ids: vec![group.group_id().unwrap().to_owned()],
    }
}

/// One of the images moto ships in every region.
async fn image(client: &Client) -> String {
    let images = client
        .describe_images()
        .send()
        .await
        .expect("DescribeImages");
    let mut ids: Vec<_> = images
        .images()
        .iter()
        .filter_map(|image| image.image_id())
        .collect();
    ids.sort();
    ids.first().expect("moto ships images").to_string()
}

/// The user data an instance was launched with, as EC2 keeps it, decoded.
pub async fn user_data(client: &Client, instance: &str) -> String {
    let reply = client
        .describe_instance_attribute()
        .instance_id(instance)
        .attribute(qe_ec2::aws_sdk_ec2::types::InstanceAttributeName::UserData)
        .send()
        .await
        .expect("DescribeInstanceAttribute");
    let encoded = reply
        .user_data()
        .and_then(|v| v.value())
        .expect("user data");
    String::from_utf8(BASE64.decode(encoded).expect("base64")).expect("UTF-8")
}

/// EC2's own description of an instance, to check what was launched rather than what this crate reports.
pub async fn describe_instance(client: &Client, id: &str) -> SdkInstance {
    let reply = client
        .describe_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("DescribeInstances");
    reply.reservations()[0].instances()[0].clone()
}

pub async fn describe_volume(client: &Client, id: &str) -> Option<SdkVolume> {
    let reply = client.describe_volumes().volume_ids(id).send().await;
    match reply {
        Ok(reply) => reply.volumes().first().cloned(),
        Err(err) if err.code() == Some("InvalidVolume.NotFound") => None,
        Err(err) => panic!("DescribeVolumes: {err:?}"),
    }
}

/// Volumes of one instance (its root volume, made by the launch).
pub async fn volumes_of(client: &Client, instance_id: &str) -> Vec<SdkVolume> {
    let attached = Filter::builder()
        .name("attachment.instance-id")
        .values(instance_id)
        .build();
    let reply = client
        .describe_volumes()
        .filters(attached)
        .send()
        .await
        .expect("DescribeVolumes");
    reply.volumes().to_vec()
}
