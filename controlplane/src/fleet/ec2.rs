//! The EC2 provider: each queue's node on an instance of its own, its data on an EBS volume
//! of its own that outlives instances (acknowledged messages survive the loss of one). The
//! instance boots from the cloud-init in `infra/` rendered with the node's bootstrap; the node
//! then takes everything else over the channel. Nothing is remembered here: AWS's tags are the
//! record, so a control plane that crashed anywhere finds what it made.

use super::cloud_init::{Mode, NodeBoot};
use super::{FleetError, Provider, StandbyBoot};
use crate::model::queue::Slot;
use crate::model::queue::{Addresses, NewQueue, Placement, Queue};
use futures::future::BoxFuture;
use futures::FutureExt;
use qe_ec2::{Ec2, Ec2Error, Instance, Launch, Slot as Machine, Volume};
use qe_shared::node_channel::Bootstrap;
use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv6Addr, SocketAddr};
use std::time::Duration;

/// Where a node listens on its own instance: HTTPS's port, every address.
const LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V6(Ipv6Addr::UNSPECIFIED), 443);
/// Where it serves its SQS face (docs/sqs.md), HTTPS with the same certificate: a port of its
/// own (443 is the WebSocket's, which answers anything but an upgrade with 400), every
/// address. The nodes' security group opens it (docs/deploy.md).
const SQS_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V6(Ipv6Addr::UNSPECIFIED), 9443);
/// The device name the queue's volume is attached as (the first-boot script finds it).
const VOLUME_DEVICE: &str = "/dev/sdf";
/// How long a survey of the fleet is trusted: about one look at every queue (30 s by default),
/// so a queue is never judged on what it was two passes ago.
const SURVEY_FRESH: Duration = Duration::from_secs(45);
/// How long to wait for a launched instance to run, and for a terminated one to be gone.
const STATE_WITHIN: Duration = Duration::from_secs(300);
const STATE_CHECK_EVERY: Duration = Duration::from_secs(2);

pub struct Ec2Provider {
    ec2: Ec2,
    /// What the last survey found ([`Provider::survey`]), and which queues changed since.
    surveyed: std::sync::Mutex<Surveyed>,
    /// Surveys taken.
    surveys: std::sync::atomic::AtomicU64,
    /// The node's user data, rendered per queue.
    boot: NodeBoot,
    /// `q.CLUSTER.DOMAIN`: a node is reached by its queue's name there.
    zone: String,
    /// How long a new instance has to boot and report before its silence counts.
    boot_within: Duration,
}

impl Ec2Provider {
    pub fn new(ec2: Ec2, boot: NodeBoot, zone: String, boot_within: Duration) -> Ec2Provider {
        Ec2Provider {
            ec2,
            surveyed: std::sync::Mutex::default(),
            surveys: std::sync::atomic::AtomicU64::new(0),
            boot,
            zone,
            boot_within,
        }
    }

    /// The queue's node as the last survey found it, when that is as it should be and the
    /// survey is fresh: one running instance with an IPv6 address, and one data volume,
    /// attached to it. Anything else is looked at afresh (and mended) by [`Self::ensure_node`].
    fn settled(&self, queue: &Queue) -> Option<Placement> {
        let (instance, volume) = self.settled_as(queue, Part::Node)?;
        self.placement(queue, instance, volume.id).ok()
    }

    /// The queue's instance and volume of `part` as the last survey found them, when that is
    /// as it should be and the survey is fresh: one running instance in its machine's slot
    /// with an IPv6 address, and one volume in that slot, attached to it.
    fn settled_as(&self, queue: &Queue, part: Part) -> Option<(Instance, Volume)> {
        let surveyed = self.surveyed.lock().expect("never poisoned");
        let survey = surveyed
            .survey
            .as_ref()
            .filter(|survey| survey.taken.elapsed() < SURVEY_FRESH)?;
        // Changed since the survey began (fenced, stopped, placed anew): it may show the past.
        if surveyed.changed.contains_key(&queue.id) {
            return None;
        }
        let instances = survey.instances.get(&queue.id)?;
        let volumes = survey.volumes.get(&queue.id)?;
        let slot = machine(queue, part);
        let mut instances = instances.iter().filter(|instance| instance.slot == slot);
        let mut volumes = volumes.iter().filter(|volume| volume.slot == slot);
        let (Some(instance), None) = (instances.next(), instances.next()) else {
            return None;
        };
        let (Some(volume), None) = (volumes.next(), volumes.next()) else {
            return None;
        };
        let in_place = instance.state == "running"
            && instance.region == queue.region
            && volume.attached_to.as_ref() == Some(&instance.id);
        (in_place && instance.ipv6.is_some()).then(|| (instance.clone(), volume.clone()))
    }

    /// Drops what the survey says of queue `queue_id`: its instances or volumes are being
    /// changed (fenced, replaced, stopped), so until the next survey it is looked at afresh.
    fn forget(&self, queue_id: &str) {
        let mut surveyed = self.surveyed.lock().expect("never poisoned");
        surveyed
            .changed
            .insert(queue_id.to_string(), std::time::Instant::now());
    }

    /// Takes the survey: every instance and volume of the cluster, by queue.
    async fn take_survey(&self) -> Result<(), Ec2Error> {
        let began = std::time::Instant::now();
        let instances = by_queue(self.ec2.instances().await?, |i| &i.queue_id);
        let volumes = by_queue(self.ec2.volumes().await?, |v| &v.queue_id);
        let mut surveyed = self.surveyed.lock().expect("never poisoned");
        // A change made while the survey was being taken may be missing from it: those stay
        // marked until a survey begun after them.
        surveyed.changed.retain(|_, at| *at >= began);
        surveyed.survey = Some(Survey {
            taken: began,
            instances,
            volumes,
        });
        self.surveys
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The queue's data volume: the one its record names, else the one a live instance holds,
    /// else the oldest (or a new one, for a queue that has none yet). Every other is a twin (a
    /// race, a volume made by hand): forced off its instance and deleted, so that no two
    /// nodes ever hold one queue's data and no attach waits on a twin.
    async fn volume_of(&self, queue: &Queue, part: Part) -> Result<Volume, Ec2Error> {
        let slot = machine(queue, part);
        let mut volumes = self.ec2.volumes_of(&queue.region, &queue.id).await?;
        volumes.retain(|volume| volume.slot == slot);
        if volumes.is_empty() {
            return self
                .ec2
                .volume_in_slot(&queue.region, &queue.id, slot)
                .await;
        }
        let recorded = queue.resources.get(recorded_as(part).volume);
        let keep = volumes
            .iter()
            .position(|volume| Some(&volume.id) == recorded)
            .or_else(|| volumes.iter().position(|v| v.attached_to.is_some()))
            .unwrap_or(0);
        let volume = volumes.swap_remove(keep);
        for twin in volumes {
            tracing::warn!(queue = %queue.id, volume = %twin.id, kept = %volume.id, "a second data volume of a live queue: deleted");
            self.ec2.delete_volume(&twin.region, &twin.id).await?;
        }
        Ok(volume)
    }

    /// The queue's live instance, if it has one. One that is stopping or stopped (retired by
    /// AWS, stopped by hand) holds the volume but serves nothing: it is terminated, to be
    /// replaced. Of twins (two live instances of one queue: one made by hand, a launch that
    /// lost its token), the one holding `volume` is kept, else the one the record names, else
    /// the newest; every other is terminated.
    async fn instance_of(
        &self,
        queue: &Queue,
        volume: &Volume,
        part: Part,
    ) -> Result<Option<Instance>, Ec2Error> {
        let slot = machine(queue, part);
        let mut live = Vec::new();
        let instances = self.ec2.instances_of(&queue.region, &queue.id).await?;
        for instance in instances.into_iter().filter(|i| i.slot == slot) {
            match instance.state.as_str() {
                "pending" | "running" => live.push(instance),
                "stopping" | "stopped" => {
                    tracing::warn!(queue = %queue.id, instance = %instance.id, "a stopped instance is replaced");
                    self.ec2.terminate(&instance.region, &instance.id).await?;
                }
                _ => {}
            }
        }
        let recorded = queue.resources.get(recorded_as(part).instance);
        let keep = live
            .iter()
            .position(|instance| volume.attached_to.as_ref() == Some(&instance.id))
            .or_else(|| {
                live.iter()
                    .position(|instance| Some(&instance.id) == recorded)
            })
            .or(live.len().checked_sub(1));
        let Some(keep) = keep else {
            return Ok(None);
        };
        let instance = live.swap_remove(keep);
        for twin in live {
            tracing::warn!(queue = %queue.id, instance = %twin.id, kept = %instance.id, "a second instance of a live queue: terminated");
            self.ec2.terminate(&twin.region, &twin.id).await?;
        }
        Ok(Some(instance))
    }

    /// Fences `part` of the queue (a silent node, or a standby its node has gone without):
    /// its instances terminated and waited for, its data volume then forced off whatever
    /// still holds it (a hung instance can take long to let go). The other machine is left as
    /// it is: a silent node's standby holds the copy that must outlive it, and an absent
    /// standby's node serves on.
    async fn fence_part(&self, queue: &Queue, part: Part) -> Result<(), Ec2Error> {
        let what = match part {
            Part::Node => "a silent node's",
            Part::Standby => "an absent standby's",
        };
        tracing::warn!(queue = %queue.id, "terminating {what} instance");
        self.forget(&queue.id);
        let slot = machine(queue, part);
        self.terminate(&queue.id, Some(slot)).await?;
        for volume in self.ec2.volumes_of(&queue.region, &queue.id).await? {
            if volume.slot == slot {
                self.ec2.free_volume(&volume.region, &volume.id).await?;
            }
        }
        Ok(())
    }

    /// Launches the queue's instance. If EC2 answers with one that is already gone (a token
    /// reused after an instance that died before it was recorded), once more with a token of
    /// its own.
    async fn launch(
        &self,
        queue: &Queue,
        user_data: &str,
        part: Part,
    ) -> Result<Instance, Ec2Error> {
        let after = queue
            .resources
            .get(recorded_as(part).instance)
            .map_or("first", String::as_str);
        let slot = machine(queue, part);
        let mut client_token = match slot {
            Machine::First => format!("{}-{after}", queue.id),
            Machine::Second => format!("{}-second-{after}", queue.id),
        };
        for _ in 0..2 {
            let launch = Launch {
                queue_id: &queue.id,
                region: &queue.region,
                instance_type: &queue.instance_type,
                ipv4: queue.ipv4,
                user_data,
                client_token: &client_token,
                slot,
            };
            let launched = self.ec2.launch(&launch).await?;
            if matches!(launched.state.as_str(), "pending" | "running") {
                tracing::info!(queue = %queue.id, instance = %launched.id, "launched an instance");
                return Ok(launched);
            }
            client_token = format!("{}-{}", queue.id, launched.id);
        }
        Err(Ec2Error::Incomplete {
            operation: "RunInstances",
            field: "a live instance",
        })
    }

    async fn ensure_node(
        &self,
        queue: &Queue,
        bootstrap: &Bootstrap,
    ) -> Result<Placement, Ec2Error> {
        if let Some(placement) = self.settled(queue) {
            return Ok(placement);
        }
        let (instance, volume) = self.ensure_as(queue, bootstrap, Part::Node).await?;
        self.placement(queue, instance, volume.id)
    }

    /// The queue's instance of `part`, running and holding its volume: found,
    /// or launched from `bootstrap` (its data, or its copy, comes back with the volume).
    async fn ensure_as(
        &self,
        queue: &Queue,
        bootstrap: &Bootstrap,
        part: Part,
    ) -> Result<(Instance, Volume), Ec2Error> {
        self.forget(&queue.id);
        let volume = self.volume_of(queue, part).await?;
        let instance = match self.instance_of(queue, &volume, part).await? {
            Some(instance) => instance,
            // The client token is new for each replacement (the instance it follows) and the
            // same for a retry of one launch: a launch whose answer was lost makes no twin.
            None => {
                let user_data = self.boot.render(bootstrap, &volume.id, Mode::Serve);
                self.launch(queue, &user_data, part).await?
            }
        };
        let instance = self.holding(instance, &volume).await?;
        Ok((instance, volume))
    }

    /// The queue's standby's instance (`replicas: 2`), in the other slot's subnet (another
    /// zone), with a volume of its own there: what to record of it.
    async fn ensure_standby_instance(
        &self,
        queue: &Queue,
        bootstrap: &Bootstrap,
    ) -> Result<BTreeMap<String, String>, Ec2Error> {
        let (instance, volume) = match self.settled_as(queue, Part::Standby) {
            Some(settled) => settled,
            None => self.ensure_as(queue, bootstrap, Part::Standby).await?,
        };
        let recorded = recorded_as(Part::Standby);
        Ok(BTreeMap::from([
            (recorded.instance.to_string(), instance.id),
            (recorded.volume.to_string(), volume.id),
        ]))
    }

    /// Where `queue`'s node is, on `instance` with its data on volume `volume_id`.
    fn placement(
        &self,
        queue: &Queue,
        instance: Instance,
        volume_id: String,
    ) -> Result<Placement, Ec2Error> {
        let v6 = instance.ipv6.ok_or(Ec2Error::Incomplete {
            operation: "DescribeInstances",
            field: "an IPv6 address",
        })?;
        Ok(Placement {
            node: format!("wss://{}.{}/", queue.id, self.zone),
            addresses: Addresses {
                v6,
                v4: instance.public_ipv4.filter(|_| queue.ipv4),
            },
            resources: BTreeMap::from([
                ("instance".to_string(), instance.id),
                ("volume".to_string(), volume_id),
                ("region".to_string(), queue.region.clone()),
            ]),
            restarted_because: None,
        })
    }

    /// Boots an instance on the deleted queue's volume whose node only hands over the records
    /// the volume holds, then powers off ([`Mode::ReportLast`]); `false` when there is no
    /// volume. A hand-over instance still live from an earlier try is waited for, not doubled;
    /// one that powered off without the records arriving is replaced by another.
    async fn hand_over(&self, queue: &Queue, bootstrap: &Bootstrap) -> Result<bool, Ec2Error> {
        let volumes = self.ec2.volumes_of(&queue.region, &queue.id).await?;
        let node = machine(queue, Part::Node);
        let Some(volume) = volumes.into_iter().find(|v| v.slot == node) else {
            return Ok(false);
        };
        let mut live = None;
        for instance in self.ec2.instances_of(&queue.region, &queue.id).await? {
            match instance.state.as_str() {
                // Only a node's instance takes the node's volume (a standby's is in another zone).
                "pending" | "running" if live.is_none() && instance.slot == node => {
                    live = Some(instance)
                }
                _ => self.ec2.terminate(&instance.region, &instance.id).await?,
            }
        }
        let instance = match live {
            Some(instance) => instance,
            None => {
                self.ec2.free_volume(&volume.region, &volume.id).await?;
                let user_data = self.boot.render(bootstrap, &volume.id, Mode::ReportLast);
                let instance = self.launch(queue, &user_data, Part::Node).await?;
                tracing::info!(queue = %queue.id, instance = %instance.id, "launched an instance to hand over its last records");
                instance
            }
        };
        self.holding(instance, &volume).await?;
        Ok(true)
    }

    /// `instance` once it runs, with an IPv6 address (its node reaches the control plane over
    /// IPv6, and clients it) and `volume` attached to it.
    async fn holding(&self, instance: Instance, volume: &Volume) -> Result<Instance, Ec2Error> {
        let instance = self.running(&instance.region.clone(), instance).await?;
        let instance = self.ec2.ensure_ipv6(instance).await?;
        if volume.attached_to.as_deref() != Some(instance.id.as_str()) {
            self.ec2
                .attach(&instance.region, &volume.id, &instance.id, VOLUME_DEVICE)
                .await?;
        }
        Ok(instance)
    }

    /// `instance` once it runs (its addresses are then known, and a volume attaches).
    async fn running(&self, region: &str, instance: Instance) -> Result<Instance, Ec2Error> {
        let deadline = tokio::time::Instant::now() + STATE_WITHIN;
        let mut instance = instance;
        while instance.state != "running" {
            if tokio::time::Instant::now() > deadline || instance.state != "pending" {
                return Err(Ec2Error::Incomplete {
                    operation: "DescribeInstances",
                    field: "a running state",
                });
            }
            tokio::time::sleep(STATE_CHECK_EVERY).await;
            match self.ec2.instance(region, &instance.id).await? {
                Some(now) => instance = now,
                None => break,
            }
        }
        Ok(instance)
    }

    /// Terminates the queue's instances and waits until they are gone (a node stopping makes
    /// and reports its last usage record).
    async fn terminate_all(&self, queue_id: &str) -> Result<(), Ec2Error> {
        self.terminate(queue_id, None).await
    }

    /// Terminates the queue's instances in `slot` (None: all of them) and waits until they
    /// are gone.
    async fn terminate(&self, queue_id: &str, slot: Option<Machine>) -> Result<(), Ec2Error> {
        self.forget(queue_id);
        let mine = |instance: &Instance| {
            instance.queue_id == queue_id && slot.is_none_or(|slot| instance.slot == slot)
        };
        let instances: Vec<Instance> = self
            .ec2
            .instances()
            .await?
            .into_iter()
            .filter(mine)
            .collect();
        for instance in &instances {
            self.ec2.terminate(&instance.region, &instance.id).await?;
        }
        for instance in &instances {
            let deadline = tokio::time::Instant::now() + STATE_WITHIN;
            while let Some(now) = self.ec2.instance(&instance.region, &instance.id).await? {
                if now.state == "terminated" || tokio::time::Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(STATE_CHECK_EVERY).await;
            }
        }
        Ok(())
    }

    /// Deletes the queue's volumes.
    async fn delete_volumes(&self, queue_id: &str) -> Result<(), Ec2Error> {
        for volume in self.ec2.volumes().await? {
            if volume.queue_id == queue_id {
                self.ec2.delete_volume(&volume.region, &volume.id).await?;
                tracing::info!(queue = %queue_id, volume = %volume.id, "deleted a volume");
            }
        }
        Ok(())
    }

    async fn holders(&self) -> Result<Vec<String>, Ec2Error> {
        let mut ids: Vec<String> = self
            .ec2
            .instances()
            .await?
            .into_iter()
            .filter(|instance| instance.state != "terminated")
            .map(|instance| instance.queue_id)
            .collect();
        ids.extend(self.ec2.volumes().await?.into_iter().map(|v| v.queue_id));
        ids.sort();
        ids.dedup();
        Ok(ids)
    }
}

/// What a queue's machine is for now: serving, or following as its standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Node,
    Standby,
}

/// The slot of the machine that is `part` of `queue` now ([`Queue::serving`]).
fn machine(queue: &Queue, part: Part) -> Machine {
    let slot = match part {
        Part::Node => queue.serving,
        Part::Standby => queue.serving.other(),
    };
    machine_in(slot)
}

/// The EC2 tag's name for a machine slot.
fn machine_in(slot: Slot) -> Machine {
    match slot {
        Slot::First => Machine::First,
        Slot::Second => Machine::Second,
    }
}

/// The names a queue's record keeps its node's and its standby's instance and volume under.
struct Recorded {
    instance: &'static str,
    volume: &'static str,
}

fn recorded_as(part: Part) -> Recorded {
    match part {
        Part::Node => Recorded {
            instance: "instance",
            volume: "volume",
        },
        Part::Standby => Recorded {
            instance: "standby_instance",
            volume: "standby_volume",
        },
    }
}

/// `items` by the queue each is of.
fn by_queue<T>(items: Vec<T>, queue_of: impl Fn(&T) -> &String) -> HashMap<String, Vec<T>> {
    let mut by_queue: HashMap<String, Vec<T>> = HashMap::new();
    for item in items {
        by_queue
            .entry(queue_of(&item).clone())
            .or_default()
            .push(item);
    }
    by_queue
}

/// The last survey, and the queues changed since it began (looked at afresh until the next).
#[derive(Default)]
struct Surveyed {
    survey: Option<Survey>,
    changed: HashMap<String, std::time::Instant>,
}

/// Every instance and volume of the cluster at one moment, by queue.
struct Survey {
    taken: std::time::Instant,
    instances: HashMap<String, Vec<Instance>>,
    volumes: HashMap<String, Vec<Volume>>,
}

impl Provider for Ec2Provider {
    fn can_run(&self, new: &NewQueue) -> Result<(), String> {
        let regions = &self.ec2.settings().regions;
        let Some(region) = regions.get(&new.region) else {
            return Err(format!(
                "region {:?} is not one this cluster runs queues in: {:?}",
                new.region,
                regions.keys().collect::<Vec<_>>()
            ));
        };
        match new.replicas == Some(2) && region.standby_subnet_id.is_none() {
            true => Err(format!(
                "region {:?} has no standby subnet in this cluster's settings: replicas is 1",
                new.region
            )),
            false => Ok(()),
        }
    }

    /// The standby's instance is in another zone, with its own volume.
    fn promotes_standbys(&self) -> bool {
        true
    }

    fn listen(&self, _queue: &Queue) -> Result<Vec<SocketAddr>, FleetError> {
        Ok(vec![LISTEN])
    }

    fn sqs_listen(&self, _queue: &Queue) -> Result<Option<SocketAddr>, FleetError> {
        Ok(Some(SQS_LISTEN))
    }

    fn ensure<'a>(
        &'a self,
        queue: &'a Queue,
        bootstrap: &'a Bootstrap,
    ) -> BoxFuture<'a, Result<Placement, FleetError>> {
        async move {
            self.ensure_node(queue, bootstrap)
                .await
                .map_err(|e| match e.mends_nothing() {
                    true => FleetError::Refused(e.to_string()),
                    false => FleetError::Start(e.to_string()),
                })
        }
        .boxed()
    }

    /// One `DescribeInstances` of the queue's instances (by its tag): asked of EC2, not of the
    /// last survey, which a node booting now may have missed.
    fn is_instance_of<'a>(
        &'a self,
        queue: &'a Queue,
        instance_id: &'a str,
        slot: Slot,
    ) -> BoxFuture<'a, Result<bool, FleetError>> {
        let wanted = machine_in(slot);
        async move {
            let instances = self.ec2.instances_of(&queue.region, &queue.id).await;
            let instances = instances.map_err(|e| FleetError::Start(e.to_string()))?;
            Ok(instances.iter().any(|instance| {
                instance.id == instance_id
                    && instance.slot == wanted
                    && matches!(instance.state.as_str(), "pending" | "running")
            }))
        }
        .boxed()
    }

    /// The standby's own instance in the slot that does not serve (its subnet another zone's),
    /// booted from `standby`'s bootstrap: its node asks for its config with that slot's
    /// credential and is told to follow `node` (`api/nodes.rs`), so the key never rests in
    /// user data.
    fn ensure_standby<'a>(
        &'a self,
        queue: &'a Queue,
        _node: &'a Placement,
        standby: &'a StandbyBoot,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, FleetError>> {
        async move {
            self.ensure_standby_instance(queue, &standby.bootstrap)
                .await
                .map_err(|e| match e.mends_nothing() {
                    true => FleetError::Refused(e.to_string()),
                    false => FleetError::Start(e.to_string()),
                })
        }
        .boxed()
    }

    fn fence<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        async move {
            self.fence_part(queue, Part::Node)
                .await
                .map_err(|e| FleetError::Remove(e.to_string()))
        }
        .boxed()
    }

    /// Its instance in the slot that does not serve, terminated; its volume (the copy) kept
    /// and freed for the next, which `ensure_standby` launches.
    fn fence_standby<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, Result<(), FleetError>> {
        async move {
            self.fence_part(queue, Part::Standby)
                .await
                .map_err(|e| FleetError::Remove(e.to_string()))
        }
        .boxed()
    }

    /// What `DescribeInstanceStatus` says of the queue's recorded instance: starting,
    /// checks initializing, or a reboot or maintenance under way (`qe_ec2::InstanceHealth`).
    /// An answer EC2 does not give counts as no: the node is replaced.
    fn recovering<'a>(&'a self, queue: &'a Queue) -> BoxFuture<'a, bool> {
        async move {
            let Some(instance) = queue.resources.get("instance") else {
                return false;
            };
            let now = crate::live::now_ms() as i64 / 1000;
            match self.ec2.health(&queue.region, instance).await {
                Ok(health) => health.is_some_and(|health| health.recovering(now)),
                Err(error) => {
                    tracing::warn!(queue = %queue.id, %error, "whether its instance recovers could not be read");
                    false
                }
            }
        }
        .boxed()
    }

    /// An instance boots, mounts its volume and fetches the node before it reports.
    fn boot_within(&self) -> Duration {
        self.boot_within
    }

    fn stop<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, Result<(), FleetError>> {
        async move {
            self.terminate_all(queue_id)
                .await
                .map_err(|e| FleetError::Remove(e.to_string()))
        }
        .boxed()
    }

    /// An instance on the deleted queue's volume that only hands over its records
    /// ([`Mode::ReportLast`]); `within` is not needed here: the reconciler waits for the
    /// report, and a hand-over instance left running is terminated with the data.
    fn report_last<'a>(
        &'a self,
        queue: &'a Queue,
        bootstrap: &'a Bootstrap,
        _within: Duration,
    ) -> BoxFuture<'a, Result<bool, FleetError>> {
        async move {
            self.hand_over(queue, bootstrap)
                .await
                .map_err(|e| FleetError::Start(e.to_string()))
        }
        .boxed()
    }

    /// Its instances first (a hand-over instance may hold the volume), then its volumes.
    fn requests(&self) -> (BTreeMap<String, u64>, u64) {
        let surveys = self.surveys.load(std::sync::atomic::Ordering::Relaxed);
        (self.ec2.requests(), surveys)
    }

    fn survey(&self) -> BoxFuture<'_, Result<(), FleetError>> {
        async move {
            self.take_survey()
                .await
                .map_err(|e| FleetError::List(e.to_string()))
        }
        .boxed()
    }

    fn remove_data<'a>(&'a self, queue_id: &'a str) -> BoxFuture<'a, Result<(), FleetError>> {
        async move {
            self.terminate_all(queue_id)
                .await
                .map_err(|e| FleetError::Remove(e.to_string()))?;
            self.delete_volumes(queue_id)
                .await
                .map_err(|e| FleetError::Remove(e.to_string()))
        }
        .boxed()
    }

    fn holdings(&self) -> BoxFuture<'_, Result<Vec<String>, FleetError>> {
        async move {
            self.holders()
                .await
                .map_err(|e| FleetError::List(e.to_string()))
        }
        .boxed()
    }
}
