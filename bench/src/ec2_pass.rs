//! `bench ec2-pass`: what the reconciler's look at every queue costs in EC2 calls and time
//! with N queues, against moto (EC2's emulator, `.venv/bin/moto_server`, as the tests run it):
//! N queues placed once (an instance and a volume each), then one pass with each queue
//! looked at on its own (what a pass did before the survey, and still does when a survey
//! fails) and one pass after a survey (`Provider::survey`: one paginated listing of
//! instances and one of volumes per region). Each pass drives every queue concurrently, as
//! the reconciler does. See docs/deploy.md §12.
//!
//! With `--bulk-setup` the fleet is placed directly in moto, not through the provider (whose
//! launches are paced, 1.5 a second): instances launched `--launch-batch` to a call, then per
//! queue its data volume and the attach (and its tags, when launched with others), as the
//! provider's would be. Each queue's record then says what the provider would have recorded;
//! both passes check that they find just that, and that they change nothing in EC2.
//! `--index-moto-tags` takes moto's time spent scanning tags out of what is measured (the
//! answers are the same).

use controlplane::fleet::cloud_init::{NodeBoot, BUILT_IN};
use controlplane::fleet::ec2::Ec2Provider;
use controlplane::fleet::Provider;
use controlplane::model::queue::{self, Addresses, NewQueue, Placement, Queue, Status, Tier};
use futures::StreamExt;
use qe_ec2::aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification, VolumeType};
use qe_ec2::{CLUSTER_TAG, DATA_VOLUME, PURPOSE_TAG, QUEUE_TAG};
use qe_shared::node_channel::Bootstrap;
use qe_tests::moto::{self, Moto};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const REGION: &str = "us-east-1";
/// The EC2 calls a look at a placed queue may make.
const READS: [&str; 2] = ["DescribeInstances", "DescribeVolumes"];
/// How long the provider trusts a survey (its `SURVEY_FRESH`).
const SURVEY_FRESH: Duration = Duration::from_secs(45);
/// The device a queue's volume is attached as (the provider's `VOLUME_DEVICE`).
const VOLUME_DEVICE: &str = "/dev/sdf";

#[derive(clap::Args)]
pub struct Settings {
    /// Queues in the fleet.
    #[arg(long, default_value_t = 1000)]
    queues: usize,
    /// Queues driven at once (the reconciler drives every queue at once; moto serves a few
    /// requests at a time).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Look at only this many queues each on its own (moto answers a filtered listing in
    /// time that grows with the fleet, so a whole pass of them takes long); the reads are
    /// counted and the time scaled to the whole fleet. Default: every queue.
    #[arg(long)]
    alone_sample: Option<usize>,
    /// Place the fleet directly in moto instead of through the provider (whose launches are
    /// paced): instances launched `--launch-batch` to a call, then per queue a `CreateTags`,
    /// a `CreateVolume` and an `AttachVolume`, `--concurrency` at a time.
    #[arg(long)]
    bulk_setup: bool,
    /// With `--bulk-setup`, instances per `RunInstances`. moto pages `DescribeInstances` by
    /// reservations (100 a page) and each call is one reservation, so the survey's pages depend
    /// on it: 1 makes one reservation per queue, as the provider's launches do.
    #[arg(long, default_value_t = 1)]
    launch_batch: usize,
    /// Start moto with its tag lookup indexed by resource ([`INDEXED_TAGS`]): as it ships, moto
    /// finds one resource's tags by scanning every tag it holds, so each tag-filtered listing
    /// takes time that grows with the square of the fleet, and at 1,000 queues one listing
    /// takes seconds. The answers are the same; only moto's time changes.
    #[arg(long)]
    index_moto_tags: bool,
}

/// Loaded by moto's Python at start (`sitecustomize`, found on `PYTHONPATH`) with
/// `--index-moto-tags`: a resource's tags read from moto's own map of tags by resource id, the
/// same list its `describe_tags(filters={"resource-id": [id]})` returns (an exact match: the
/// id is turned into a pattern with no wildcard), without a scan of every tag held.
const INDEXED_TAGS: &str = r#"
try:
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix
except Exception:
    pass
else:
    def _indexed_tags(self):
        if not self.id:
            return []
        tags = self.ec2_backend.tags.get(self.id) or {}
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(self.id), "")
        return [
            {"resource_id": self.id, "key": key, "value": value, "resource_type": kind}
            for key, value in list(tags.items())
        ]

    TaggedEC2Resource.get_tags = _indexed_tags
"#;

pub async fn ec2_pass(settings: &Settings) {
    let python = tempfile::tempdir().expect("a directory");
    if settings.index_moto_tags {
        std::fs::write(python.path().join("sitecustomize.py"), INDEXED_TAGS).expect("a file");
        std::env::set_var("PYTHONPATH", python.path());
        println!("moto's tag lookup indexed by resource (--index-moto-tags)");
    }
    let moto = Moto::start();
    let ec2 = moto::with_networks("bench", &moto.endpoint, &[REGION]).await;
    let dir = tempfile::tempdir().expect("a directory");
    let binary = dir.path().join("dataplane");
    std::fs::write(&binary, b"not a node: nothing boots in this bench").expect("a file");
    let boot = NodeBoot::new(
        BUILT_IN.to_string(),
        &binary,
        &dir.path().join("dataplane-served"),
    )
    .expect("the template");
    let provider = Ec2Provider::new(ec2.clone(), boot, zone_of_nodes(), Duration::from_secs(300));
    let bootstrap = Bootstrap {
        control_plane: "https://cp.bench.example.com:8443".into(),
        control_planes: vec![],
        queue_id: String::new(),
        node_token: "0".repeat(64),
        bootstrap_token: None,
        control_plane_ca_pem: None,
    };
    let queues = placed_fleet(&ec2, &provider, &bootstrap, settings).await;

    println!(
        "{:<26} {:>10} {:>14} {:>12} {:>12}",
        "pass", "EC2 reads", "reads/queue", "time (s)", "EC2 changes"
    );
    let sample = settings
        .alone_sample
        .unwrap_or(queues.len())
        .min(queues.len());
    let (before, changed) = (reads(&ec2), changes(&ec2));
    let started = Instant::now();
    let placed = pass(
        &provider,
        &queues[..sample],
        &bootstrap,
        settings.concurrency,
    )
    .await;
    let (read, took) = (reads(&ec2) - before, started.elapsed());
    let alone_changes = changes(&ec2) - changed;
    let whole = queues.len() as f64 / sample as f64;
    let alone = ((read as f64 * whole) as u64, took.mul_f64(whole));
    let name = match sample == queues.len() {
        true => "each queue on its own".to_string(),
        false => format!("each on its own (x{whole:.0})"),
    };
    report(&name, alone, settings.queues, alone_changes);
    let differ = queues
        .iter()
        .zip(&placed)
        .filter(|(queue, placement)| !placement.recorded_in(queue))
        .count();

    let (before, changed, sent) = (reads(&ec2), changes(&ec2), ec2.requests());
    let started = Instant::now();
    let (survey_reads, survey_took) = survey(&ec2, &provider, before, &sent).await;
    if survey_took >= SURVEY_FRESH {
        println!(
            "the survey took longer than the provider trusts one ({} s): a pass after it \
             would look at each queue on its own; not run",
            SURVEY_FRESH.as_secs()
        );
        return;
    }
    let placed = pass(&provider, &queues, &bootstrap, settings.concurrency).await;
    let surveyed = (reads(&ec2) - before, started.elapsed());
    let surveyed_changes = changes(&ec2) - changed;
    report(
        "after a survey",
        surveyed,
        settings.queues,
        surveyed_changes,
    );
    let differ_after = queues
        .iter()
        .zip(&placed)
        .filter(|(queue, placement)| !placement.recorded_in(queue))
        .count();
    println!(
        "the queues after the survey: {} reads",
        surveyed.0 - survey_reads
    );
    if sample < queues.len() {
        println!(
            "each on its own: {sample} of {} queues looked at ({read} reads, {:.2} s), scaled x{whole:.1}",
            queues.len(),
            took.as_secs_f64()
        );
    }
    println!(
        "placements unlike the record: {differ} of {sample} on their own, {differ_after} of {} after a survey",
        queues.len()
    );
    println!(
        "EC2 changes (launches, terminations, attaches, tags ...): {alone_changes} on their own, {surveyed_changes} after a survey"
    );
    drop(moto);
    assert_eq!(
        (alone_changes, surveyed_changes),
        (0, 0),
        "a pass over a placed fleet changed something in EC2"
    );
}

/// The bench's queues, created and placed (instances, volumes, attaches) in moto: in bulk,
/// or by a pass of the provider.
async fn placed_fleet(
    ec2: &qe_ec2::Ec2,
    provider: &Ec2Provider,
    bootstrap: &Bootstrap,
    settings: &Settings,
) -> Vec<Queue> {
    let mut queues: Vec<Queue> = (0..settings.queues)
        .map(|_| {
            let (mut queue, _) = queue::create(NewQueue {
                tier: Tier::Devtest,
                region: REGION.into(),
                instance_type: "t3.small".into(),
                ipv4: false,
                account: None,
                ..Default::default()
            });
            queue.status = Status::Running;
            queue
        })
        .collect();

    println!(
        "{} queues, {} at a time, against moto",
        settings.queues, settings.concurrency
    );
    let started = Instant::now();
    if settings.bulk_setup {
        bulk_setup(ec2, &mut queues, &zone_of_nodes(), settings).await;
        println!(
            "placing them in bulk ({} to a launch, then a volume and an attach each): {:.1} s",
            settings.launch_batch.max(1),
            started.elapsed().as_secs_f64()
        );
    } else {
        let placed = pass(provider, &queues, bootstrap, settings.concurrency).await;
        for (queue, placement) in queues.iter_mut().zip(placed) {
            placement.record_in(queue);
        }
        println!(
            "placing them (a launch, a volume, an attach each): {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }

    queues
}

/// One survey of the fleet: its reads (`before`: the count before it; `sent`: each
/// operation's count before it, printed by operation) and how long it took.
async fn survey(
    ec2: &qe_ec2::Ec2,
    provider: &Ec2Provider,
    before: u64,
    sent: &std::collections::BTreeMap<String, u64>,
) -> (u64, Duration) {
    let started = Instant::now();
    provider.survey().await.expect("a survey");
    let (survey_reads, survey_took) = (reads(ec2) - before, started.elapsed());
    let by_operation: Vec<String> = ec2
        .requests()
        .into_iter()
        .map(|(operation, count)| {
            (
                count - sent.get(&operation).copied().unwrap_or(0),
                operation,
            )
        })
        .filter(|(count, _)| *count > 0)
        .map(|(count, operation)| format!("{operation} {count}"))
        .collect();
    println!(
        "the survey: {survey_reads} reads ({}) in {:.2} s",
        by_operation.join(", "),
        survey_took.as_secs_f64()
    );
    (survey_reads, survey_took)
}

/// The zone the bench's nodes are named in.
fn zone_of_nodes() -> String {
    "q.bench.example.com".to_string()
}

/// Places every queue directly in moto, as the provider would have: an instance in the
/// region's subnet with the cluster's and the queue's tags and an IPv6 address, a data
/// volume with the cluster's, the queue's and the purpose tag, attached to it as
/// [`VOLUME_DEVICE`]; and records it in the queue, as `Placement::record_in` does.
async fn bulk_setup(ec2: &qe_ec2::Ec2, queues: &mut [Queue], zone: &str, settings: &Settings) {
    let client = ec2.client(REGION).expect("the region's client");
    let cluster = ec2.settings().cluster.clone();
    let place = ec2.settings().regions[REGION].clone();
    let subnet = client
        .describe_subnets()
        .subnet_ids(&place.subnet_id)
        .send()
        .await
        .expect("DescribeSubnets");
    let availability_zone = subnet
        .subnets()
        .first()
        .and_then(|subnet| subnet.availability_zone())
        .expect("the subnet's zone")
        .to_string();
    let batch = settings.launch_batch.max(1);

    // Launches: one reservation per call. As the provider's, each tags its instance, root volume
    // and interface (with the queue's tags too when the queue is alone in it).
    let started = Instant::now();
    let launches = futures::stream::iter(queues.chunks(batch))
        .map(|chunk| launch(client, &place, &cluster, chunk))
        .buffered(settings.concurrency)
        .collect::<Vec<_>>()
        .await;
    let instances: Vec<(String, std::net::Ipv6Addr)> = launches.into_iter().flatten().collect();
    println!(
        "  {} instances launched in {} calls: {:.1} s",
        instances.len(),
        queues.len().div_ceil(batch),
        started.elapsed().as_secs_f64()
    );

    // Per queue: its tags (when launched with others), its volume, the attach.
    let started = Instant::now();
    let volumes = futures::stream::iter(queues.iter().zip(&instances))
        .map(|(queue, (instance, _))| {
            give_volume(
                ec2,
                client,
                &cluster,
                &availability_zone,
                queue,
                instance,
                batch > 1,
            )
        })
        .buffered(settings.concurrency)
        .collect::<Vec<_>>()
        .await;
    println!(
        "  {} queues tagged, given a volume and attached ({} calls each): {:.1} s",
        volumes.len(),
        if batch > 1 { 3 } else { 2 },
        started.elapsed().as_secs_f64()
    );

    for ((queue, (instance, v6)), volume) in queues.iter_mut().zip(instances).zip(volumes) {
        let placement = Placement {
            node: format!("wss://{}.{zone}/", queue.id),
            addresses: Addresses { v6, v4: None },
            resources: BTreeMap::from([
                ("instance".to_string(), instance),
                ("volume".to_string(), volume),
                ("region".to_string(), queue.region.clone()),
            ]),
            restarted_because: None,
        };
        placement.record_in(queue);
    }
}

/// Launches one instance per queue of `chunk` in one call (one reservation), tagged as the
/// provider tags them; each instance's id and IPv6 address, in the chunk's order.
async fn launch(
    client: &qe_ec2::aws_sdk_ec2::Client,
    place: &qe_ec2::RegionSettings,
    cluster: &str,
    chunk: &[Queue],
) -> Vec<(String, std::net::Ipv6Addr)> {
    let mut tags = vec![tag(CLUSTER_TAG, cluster)];
    if let [queue] = chunk {
        tags.extend(queue_tags(&queue.id));
    }
    let reply = client
        .run_instances()
        .image_id(&place.image_id)
        .instance_type(InstanceType::from(chunk[0].instance_type.as_str()))
        .min_count(chunk.len() as i32)
        .max_count(chunk.len() as i32)
        .subnet_id(&place.subnet_id)
        .set_security_group_ids(Some(place.security_group_ids.clone()))
        .ipv6_address_count(1)
        .tag_specifications(tagged(ResourceType::Instance, tags.clone()))
        .tag_specifications(tagged(ResourceType::Volume, tags.clone()))
        .tag_specifications(tagged(ResourceType::NetworkInterface, tags))
        .send()
        .await
        .expect("RunInstances");
    let mut instances = reply.instances().to_vec();
    instances.sort_by_key(|instance| instance.ami_launch_index());
    assert_eq!(instances.len(), chunk.len(), "RunInstances: every instance");
    instances
        .iter()
        .map(|instance| {
            let id = instance.instance_id().expect("an instance id").to_string();
            let v6 = instance
                .network_interfaces()
                .iter()
                .flat_map(|nic| nic.ipv6_addresses())
                .find_map(|address| address.ipv6_address())
                .or(instance.ipv6_address())
                .and_then(|ip| ip.parse().ok())
                .unwrap_or_else(|| panic!("instance {id}: no IPv6 address"));
            (id, v6)
        })
        .collect::<Vec<_>>()
}

/// Gives the queue on `instance` its data volume and attaches it; first tags the instance
/// with the queue's tags when it was launched with others (`tag_queue`).
async fn give_volume(
    ec2: &qe_ec2::Ec2,
    client: &qe_ec2::aws_sdk_ec2::Client,
    cluster: &str,
    availability_zone: &str,
    queue: &Queue,
    instance: &str,
    tag_queue: bool,
) -> String {
    if tag_queue {
        client
            .create_tags()
            .resources(instance)
            .set_tags(Some(queue_tags(&queue.id)))
            .send()
            .await
            .expect("CreateTags");
    }
    let tags = vec![
        tag(CLUSTER_TAG, cluster),
        tag(QUEUE_TAG, &queue.id),
        tag("Name", &format!("qe-{}-data", queue.id)),
        tag(PURPOSE_TAG, DATA_VOLUME),
    ];
    let volume = client
        .create_volume()
        .availability_zone(availability_zone)
        .size(ec2.settings().volume_size_gib)
        .volume_type(VolumeType::from(ec2.settings().volume_type.as_str()))
        .encrypted(true)
        .tag_specifications(tagged(ResourceType::Volume, tags))
        .send()
        .await
        .expect("CreateVolume");
    let volume = volume.volume_id().expect("a volume id").to_string();
    client
        .attach_volume()
        .volume_id(&volume)
        .instance_id(instance)
        .device(VOLUME_DEVICE)
        .send()
        .await
        .expect("AttachVolume");
    volume
}

/// The queue's own tags on its instance, as a launch writes them.
fn queue_tags(queue_id: &str) -> Vec<Tag> {
    vec![
        tag(QUEUE_TAG, queue_id),
        tag("Name", &format!("qe-{queue_id}")),
    ]
}

fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

fn tagged(kind: ResourceType, tags: Vec<Tag>) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(tags))
        .build()
}

/// Drives every queue once, `concurrency` at a time; where each is.
async fn pass(
    provider: &Ec2Provider,
    queues: &[Queue],
    bootstrap: &Bootstrap,
    concurrency: usize,
) -> Vec<Placement> {
    futures::stream::iter(queues)
        .map(|queue| async move {
            let bootstrap = Bootstrap {
                queue_id: queue.id.clone(),
                ..bootstrap.clone()
            };
            // Tried again as the reconciler would (moto answers 500 now and then under load).
            let mut tries = 0;
            loop {
                match provider.ensure(queue, &bootstrap).await {
                    Ok(placement) => break placement,
                    Err(error) if tries < 5 => {
                        tries += 1;
                        eprintln!("queue {}: {error}; trying again", queue.id);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(error) => panic!("queue {}: {error}", queue.id),
                }
            }
        })
        .buffered(concurrency)
        .collect()
        .await
}

/// The requests sent to EC2 so far that change something (every operation but a `Describe`).
fn changes(ec2: &qe_ec2::Ec2) -> u64 {
    let sent = ec2.requests();
    sent.iter()
        .filter(|(action, _)| !action.starts_with("Describe"))
        .map(|(_, count)| count)
        .sum()
}

/// The read requests sent to EC2 so far.
fn reads(ec2: &qe_ec2::Ec2) -> u64 {
    let sent = ec2.requests();
    READS.iter().filter_map(|action| sent.get(*action)).sum()
}

fn report(name: &str, (reads, time): (u64, Duration), queues: usize, changes: u64) {
    println!(
        "{name:<26} {reads:>10} {:>14.3} {:>12.2} {changes:>12}",
        reads as f64 / queues as f64,
        time.as_secs_f64()
    );
}
