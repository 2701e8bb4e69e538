//! `bench ec2-pass`: what the reconciler's look at every queue costs in EC2 calls and time
//! with N queues, against moto (EC2's emulator, `.venv/bin/moto_server`, as the tests run it):
//! N queues placed once (an instance and a volume each), then one pass with each queue
//! looked at on its own (what a pass did before the survey, and still does when a survey
//! fails) and one pass after a survey (`Provider::survey`: one paginated listing of
//! instances and one of volumes per region). Each pass drives every queue concurrently, as
//! the reconciler does. See docs/deploy.md §12.

use controlplane::fleet::cloud_init::{NodeBoot, BUILT_IN};
use controlplane::fleet::ec2::Ec2Provider;
use controlplane::fleet::Provider;
use controlplane::queues::{self, NewQueue, Queue, Status, Tier};
use futures::StreamExt;
use qe_shared::node_channel::Bootstrap;
use qe_tests::moto::{self, Moto};
use std::time::{Duration, Instant};

const REGION: &str = "us-east-1";
/// The EC2 calls a look at a placed queue may make.
const READS: [&str; 2] = ["DescribeInstances", "DescribeVolumes"];

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
}

pub async fn ec2_pass(settings: &Settings) {
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
    let zone = "q.bench.example.com".to_string();
    let provider = Ec2Provider::new(ec2.clone(), boot, zone, Duration::from_secs(300));
    let bootstrap = Bootstrap {
        control_plane: "https://cp.bench.example.com:8443".into(),
        control_planes: vec![],
        queue_id: String::new(),
        node_token: "0".repeat(64),
        bootstrap_token: None,
        control_plane_ca_pem: None,
    };
    let mut queues: Vec<Queue> = (0..settings.queues)
        .map(|_| {
            let (mut queue, _) = queues::create(NewQueue {
                tier: Tier::Devtest,
                region: REGION.into(),
                instance_type: "t3.small".into(),
                ipv4: false,
                account: None,
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
    let placed = pass(&provider, &queues, &bootstrap, settings.concurrency).await;
    for (queue, placement) in queues.iter_mut().zip(placed) {
        placement.record_in(queue);
    }
    println!(
        "placing them (a launch, a volume, an attach each): {:.1} s",
        started.elapsed().as_secs_f64()
    );

    println!(
        "{:<26} {:>10} {:>14} {:>12}",
        "pass", "EC2 reads", "reads/queue", "time (s)"
    );
    let sample = settings
        .alone_sample
        .unwrap_or(queues.len())
        .min(queues.len());
    let before = reads(&ec2);
    let started = Instant::now();
    pass(
        &provider,
        &queues[..sample],
        &bootstrap,
        settings.concurrency,
    )
    .await;
    let (read, took) = (reads(&ec2) - before, started.elapsed());
    let whole = queues.len() as f64 / sample as f64;
    let alone = ((read as f64 * whole) as u64, took.mul_f64(whole));
    let name = match sample == queues.len() {
        true => "each queue on its own".to_string(),
        false => format!("each on its own (x{whole:.0})"),
    };
    report(&name, alone, settings.queues);

    let before = reads(&ec2);
    let started = Instant::now();
    provider.survey().await.expect("a survey");
    pass(&provider, &queues, &bootstrap, settings.concurrency).await;
    let surveyed = (reads(&ec2) - before, started.elapsed());
    report("after a survey", surveyed, settings.queues);
    drop(moto);
}

/// Drives every queue once, `concurrency` at a time; where each is.
async fn pass(
    provider: &Ec2Provider,
    queues: &[Queue],
    bootstrap: &Bootstrap,
    concurrency: usize,
) -> Vec<controlplane::queues::Placement> {
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

/// The read requests sent to EC2 so far.
fn reads(ec2: &qe_ec2::Ec2) -> u64 {
    let sent = ec2.requests();
    READS.iter().filter_map(|action| sent.get(*action)).sum()
}

fn report(name: &str, (reads, time): (u64, Duration), queues: usize) {
    println!(
        "{name:<26} {reads:>10} {:>14.3} {:>12.2}",
        reads as f64 / queues as f64,
        time.as_secs_f64()
    );
}
