//! qe-ec2 against moto, EC2's emulator: what was launched and made is checked through EC2's own Describe calls,
//! and, where moto accepts a parameter without acting on it, in moto's recording of the request.
//!
//! What moto (5.2.5) does not do, and so is checked only as sent:
//! - It ignores `Ipv6AddressCount` inside a network interface spec (it reads only the instance-level parameter,
//!   which EC2 refuses next to an interface spec), so instances get no IPv6 address. Reading an address from
//!   EC2's answer is unit-tested in `src/instances.rs`.
//! - It does not make RunInstances idempotent by client token: a second launch with the same token starts a
//!   second instance. The token is checked to arrive (DescribeInstances shows it), not to deduplicate.
//! - A detach is instant and `Force` is ignored, so the waits for a volume to become available return at once.

use std::collections::BTreeSet;

use qe_ec2::aws_sdk_ec2::types::{HttpTokensState, VolumeType};
use qe_ec2::{Ec2, Ec2Error, Launch, CLUSTER_TAG, QUEUE_TAG};
use qe_tests::moto::{describe_instance, describe_volume, param, volumes_of, with_networks, Moto};

const USER_DATA: &str = "#cloud-config\nwrite_files:\n  - path: /etc/qe/node.toml\n    content: |\n      queue = \"q1\"\n";

fn launch<'a>(queue_id: &'a str, region: &'a str, ipv4: bool, client_token: &'a str) -> Launch<'a> {
    Launch {
        queue_id,
        region,
        instance_type: "t3.small",
        ipv4,
        user_data: USER_DATA,
        client_token,
        slot: qe_ec2::Slot::First,
    }
}

fn tag<'a>(tags: &'a [qe_ec2::aws_sdk_ec2::types::Tag], key: &str) -> Option<&'a str> {
    tags.iter()
        .find(|tag| tag.key() == Some(key))
        .and_then(|tag| tag.value())
}

#[tokio::test]
async fn launch_sends_what_the_node_needs() {
    let moto = Moto::start();
    let ec2 = with_networks("prod", &moto.endpoint, &["eu-west-1", "us-east-1"]).await;

    let with_ipv4 = ec2
        .launch(&launch("q1", "eu-west-1", true, "q1-try-1"))
        .await
        .unwrap();
    let without = ec2
        .launch(&launch("q2", "us-east-1", false, "q2-try-1"))
        .await
        .unwrap();

    assert_eq!(with_ipv4.queue_id, "q1");
    assert_eq!(with_ipv4.region, "eu-west-1");
    assert_eq!(with_ipv4.availability_zone.as_deref(), Some("eu-west-1a"));
    assert!(
        with_ipv4.public_ipv4.is_some(),
        "ipv4: true gives a public IPv4 address"
    );
    assert!(with_ipv4.private_ipv4.is_some());
    assert_eq!(
        without.public_ipv4, None,
        "ipv4: false gives no public IPv4 address"
    );
    assert_eq!(without.region, "us-east-1");

    check_described(&ec2, &with_ipv4.id, "eu-west-1", "q1", "q1-try-1").await;
    check_described(&ec2, &without.id, "us-east-1", "q2", "q2-try-1").await;

    // moto accepts these but does not act on all of them (no IPv6 from an interface spec), so they are checked
    // as the SDK sent them.
    let sent = moto.requests("RunInstances");
    assert_eq!(sent.len(), 2);
    check_sent(&ec2, &sent[0], "eu-west-1", "true");
    check_sent(&ec2, &sent[1], "us-east-1", "false");

    let listed: BTreeSet<_> = ec2
        .instances()
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.region, i.id))
        .collect();
    let launched = BTreeSet::from([
        ("eu-west-1".to_owned(), with_ipv4.id.clone()),
        ("us-east-1".to_owned(), without.id.clone()),
    ]);
    assert_eq!(listed, launched);
}

/// Checks one RunInstances request as it reached moto.
fn check_sent(ec2: &Ec2, form: &[(String, String)], region: &str, ipv4: &str) {
    let place = &ec2.settings().regions[region];
    let nic = |key: &str| param(form, &format!("NetworkInterface.1.{key}"));
    assert_eq!(nic("DeviceIndex"), Some("0"));
    assert_eq!(nic("SubnetId"), Some(place.subnet_id.as_str()));
    assert_eq!(
        nic("SecurityGroupId.1"),
        Some(place.security_group_ids[0].as_str())
    );
    assert_eq!(nic("Ipv6AddressCount"), Some("1"));
    assert_eq!(nic("AssociatePublicIpAddress"), Some(ipv4));
    assert_eq!(
        param(form, "SubnetId"),
        None,
        "EC2 refuses a subnet on both the instance and its interface"
    );
    assert_eq!(param(form, "MinCount"), Some("1"));
    assert_eq!(param(form, "MaxCount"), Some("1"));
    assert_eq!(param(form, "MetadataOptions.HttpTokens"), Some("required"));
    let tagged: Vec<_> = (1..=3)
        .filter_map(|n| param(form, &format!("TagSpecification.{n}.ResourceType")))
        .collect();
    assert_eq!(tagged, ["instance", "volume", "network-interface"]);
}

/// Checks one launched instance as EC2 describes it.
async fn check_described(ec2: &Ec2, id: &str, region: &str, queue_id: &str, token: &str) {
    let client = ec2.client(region).unwrap();
    let place = &ec2.settings().regions[region];
    let described = describe_instance(client, id).await;
    assert_eq!(described.instance_type().unwrap().as_str(), "t3.small");
    assert_eq!(described.image_id(), Some(place.image_id.as_str()));
    assert_eq!(described.subnet_id(), Some(place.subnet_id.as_str()));
    assert_eq!(described.client_token(), Some(token));
    assert_eq!(tag(described.tags(), CLUSTER_TAG), Some("prod"));
    assert_eq!(tag(described.tags(), QUEUE_TAG), Some(queue_id));
    assert_eq!(
        tag(described.tags(), "Name"),
        Some(format!("qe-{queue_id}").as_str())
    );
    let imds = described.metadata_options().unwrap();
    assert_eq!(
        imds.http_tokens(),
        Some(&HttpTokensState::Required),
        "IMDSv2 only"
    );

    let nics = described.network_interfaces();
    assert_eq!(nics.len(), 1);
    let groups: Vec<_> = nics[0]
        .groups()
        .iter()
        .filter_map(|group| group.group_id())
        .collect();
    assert_eq!(groups, place.security_group_ids);

    assert_eq!(qe_tests::moto::user_data(client, id).await, USER_DATA);

    // The launch tags its root volume too, so it is found by cluster and queue; it must not pass for the
    // queue's data volume.
    let root = volumes_of(client, id).await;
    assert_eq!(root.len(), 1);
    assert_eq!(tag(root[0].tags(), QUEUE_TAG), Some(queue_id));
    assert!(
        ec2.volumes().await.unwrap().is_empty(),
        "a root volume is not a data volume"
    );
    let root_id = root[0].volume_id().unwrap();
    ec2.delete_volume(region, root_id).await.unwrap();
    let kept = describe_volume(client, root_id).await;
    assert!(kept.is_some(), "a root volume is never deleted from here");
}

#[tokio::test]
async fn another_clusters_instances_are_left_alone() {
    let moto = Moto::start();
    let prod = with_networks("prod", &moto.endpoint, &["eu-west-1"]).await;
    let staging = Ec2::new(qe_tests::moto::settings(
        "staging",
        &moto.endpoint,
        prod.settings().regions.clone(),
    ))
    .await;
    let instance = prod
        .launch(&launch("q1", "eu-west-1", false, "q1-try-1"))
        .await
        .unwrap();

    assert!(staging.instances().await.unwrap().is_empty());
    assert_eq!(
        staging.instance("eu-west-1", &instance.id).await.unwrap(),
        None
    );
    staging.terminate("eu-west-1", &instance.id).await.unwrap();
    let still = prod
        .instance("eu-west-1", &instance.id)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(
        still.state, "terminated",
        "a wrong cluster's terminate does nothing"
    );
}

#[tokio::test]
async fn volume_moves_to_the_replacement_instance() {
    let moto = Moto::start();
    let ec2 = with_networks("prod", &moto.endpoint, &["eu-west-1"]).await;
    let client = ec2.client("eu-west-1").unwrap();

    let volume = ec2.volume_for("eu-west-1", "q1").await.unwrap();
    assert_eq!(volume.queue_id, "q1");
    assert_eq!(
        volume.availability_zone, "eu-west-1a",
        "in the zone of the region's subnet"
    );
    assert_eq!(volume.attached_to, None);
    let described = describe_volume(client, &volume.id).await.unwrap();
    assert_eq!(described.size(), Some(20));
    assert_eq!(described.volume_type(), Some(&VolumeType::Gp3));
    assert_eq!(described.encrypted(), Some(true));
    assert_eq!(tag(described.tags(), CLUSTER_TAG), Some("prod"));
    assert_eq!(tag(described.tags(), "Name"), Some("qe-q1-data"));

    let again = ec2.volume_for("eu-west-1", "q1").await.unwrap();
    assert_eq!(
        again.id, volume.id,
        "found again by its tags, not made twice"
    );
    assert_eq!(ec2.volumes().await.unwrap(), vec![again]);

    let first = ec2
        .launch(&launch("q1", "eu-west-1", false, "q1-try-1"))
        .await
        .unwrap();
    ec2.attach("eu-west-1", &volume.id, &first.id, "/dev/sdf")
        .await
        .unwrap();
    ec2.attach("eu-west-1", &volume.id, &first.id, "/dev/sdf")
        .await
        .unwrap();
    assert_attached(&ec2, &volume.id, &first.id).await;

    let second = ec2
        .launch(&launch("q1", "eu-west-1", false, "q1-try-2"))
        .await
        .unwrap();
    let refused = ec2
        .attach("eu-west-1", &volume.id, &second.id, "/dev/sdf")
        .await;
    assert!(
        matches!(refused, Err(Ec2Error::AttachedElsewhere { ref instance, .. }) if *instance == first.id),
        "{refused:?}"
    );

    ec2.terminate("eu-west-1", &first.id).await.unwrap();
    ec2.terminate("eu-west-1", &first.id).await.unwrap();
    ec2.terminate("eu-west-1", "i-0123456789abcdef0")
        .await
        .unwrap();
    let live: Vec<_> = ec2
        .instances()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(live, vec![second.id.clone()]);

    ec2.attach("eu-west-1", &volume.id, &second.id, "/dev/sdf")
        .await
        .unwrap();
    assert_attached(&ec2, &volume.id, &second.id).await;

    ec2.delete_volume("eu-west-1", &volume.id).await.unwrap();
    assert_eq!(describe_volume(client, &volume.id).await, None);
    assert!(ec2.volumes().await.unwrap().is_empty());
    ec2.delete_volume("eu-west-1", &volume.id).await.unwrap();
}

async fn assert_attached(ec2: &Ec2, volume_id: &str, instance_id: &str) {
    let described = describe_volume(ec2.client("eu-west-1").unwrap(), volume_id)
        .await
        .unwrap();
    let attachments = described.attachments();
    assert_eq!(attachments.len(), 1);
    assert_eq!(attachments[0].instance_id(), Some(instance_id));
    assert_eq!(attachments[0].device(), Some("/dev/sdf"));
    let listed = ec2.volumes().await.unwrap();
    assert_eq!(listed[0].attached_to.as_deref(), Some(instance_id));
    assert_eq!(listed[0].state, "in-use");
}

#[tokio::test]
async fn refusals_before_any_call() {
    qe_tests::moto::fake_credentials();
    let ec2 = Ec2::new(qe_tests::moto::settings(
        "prod",
        "http://127.0.0.1:9",
        Default::default(),
    ))
    .await;
    let unknown = ec2.launch(&launch("q1", "eu-west-1", false, "t")).await;
    assert!(
        matches!(unknown, Err(Ec2Error::NoSuchRegion(ref region)) if region == "eu-west-1"),
        "{unknown:?}"
    );

    let big = "x".repeat(16 * 1024 + 1);
    let too_big = ec2
        .launch(&Launch {
            user_data: &big,
            ..launch("q1", "eu-west-1", false, "t")
        })
        .await;
    assert!(
        matches!(too_big, Err(Ec2Error::UserDataTooLarge(16385))),
        "{too_big:?}"
    );
}
