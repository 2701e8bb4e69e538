//! A queue's data volume: made once, in the zone of its region's subnet, and moved from instance to instance, so a
//! replaced node keeps the queue's messages. Found by tags, never remembered here.

use std::time::Duration;

use aws_sdk_ec2::client::Waiters;
use aws_sdk_ec2::error::DisplayErrorContext;
use aws_sdk_ec2::types::{
    self as sdk, Filter, ResourceType, VolumeAttachmentState, VolumeState, VolumeType,
};

use crate::tags::{self, Slot, CLUSTER_TAG, DATA_VOLUME, PURPOSE_TAG, QUEUE_TAG};
use crate::{Ec2, Ec2Error};

/// Every state but `deleting` and `deleted`. A volume in `error` is still listed: `volume_for` must not answer a
/// broken volume with a fresh empty one, which would hide the loss of the queue's messages.
const LIVE_STATES: [&str; 4] = ["creating", "available", "in-use", "error"];

/// How long to wait for a volume to become attachable: creation takes seconds, a detach after its instance is
/// terminated can take a minute or two.
const SETTLE_WAIT: Duration = Duration::from_secs(180);

/// A queue's data volume, as EC2 describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    pub id: String,
    pub region: String,
    pub queue_id: String,
    /// From the `qe:slot` tag: which of the queue's two machines it is for.
    pub slot: Slot,
    /// EC2's state name: `creating`, `available`, `in-use`, `deleting`, `deleted` or `error`.
    pub state: String,
    /// The instance holding it, while attached (or attaching, or detaching).
    pub attached_to: Option<String>,
    /// A volume attaches only to instances in this zone.
    pub availability_zone: String,
}

impl Ec2 {
    /// The queue's data volume in a region: the one already made, or a new one. If two exist (two callers raced),
    /// the oldest is the queue's, so every caller agrees; the other shows up in [`Ec2::volumes`].
    pub async fn volume_for(&self, region: &str, queue_id: &str) -> Result<Volume, Ec2Error> {
        self.volume_in_slot(region, queue_id, Slot::First).await
    }

    /// As [`Ec2::volume_for`], for the queue's volume in `slot` (the second's is made in the
    /// standby subnet's zone).
    pub async fn volume_in_slot(
        &self,
        region: &str,
        queue_id: &str,
        slot: Slot,
    ) -> Result<Volume, Ec2Error> {
        let volumes = self.volumes_of(region, queue_id).await?;
        match volumes.into_iter().find(|volume| volume.slot == slot) {
            Some(oldest) => Ok(oldest),
            None => self.create_volume(region, queue_id, slot).await,
        }
    }

    /// Every data volume of one queue in a region, oldest first: one filtered call. More than one
    /// are twins (two callers raced, one made by hand), all but one of which must go.
    pub async fn volumes_of(&self, region: &str, queue_id: &str) -> Result<Vec<Volume>, Ec2Error> {
        let queue = tags::has_tag(QUEUE_TAG, queue_id);
        let mut found = self.describe_volumes(region, vec![queue]).await?;
        found.sort_by_key(|volume| volume.create_time().copied());
        found
            .iter()
            .map(|volume| Volume::from_sdk("DescribeVolumes", region, volume))
            .collect()
    }

    /// Every data volume of this cluster in every configured region, attached or not: what the control plane
    /// compares with its queues to find volumes left behind.
    pub async fn volumes(&self) -> Result<Vec<Volume>, Ec2Error> {
        let regions = self.clients.keys().map(|region| async move {
            let found = self.describe_volumes(region, Vec::new()).await?;
            found
                .iter()
                .map(|volume| Volume::from_sdk("DescribeVolumes", region, volume))
                .collect::<Result<Vec<_>, _>>()
        });
        let lists = futures::future::try_join_all(regions).await?;
        Ok(lists.into_iter().flatten().collect())
    }

    /// Attaches a volume as `device` (such as `/dev/sdf`). Succeeds at once if it is already attached to that
    /// instance, so a retried step is harmless. A volume still being made, or still held by an instance that is
    /// going away, is waited for; one held by a live instance is refused.
    pub async fn attach(
        &self,
        region: &str,
        volume_id: &str,
        instance_id: &str,
        device: &str,
    ) -> Result<(), Ec2Error> {
        let volume = self.volume(region, volume_id).await?;
        let volume = volume.ok_or_else(|| Ec2Error::NoSuchVolume(volume_id.to_owned()))?;
        match holder(&volume) {
            Some((holder, _)) if holder == instance_id => return Ok(()),
            Some((holder, state)) => self.wait_released(region, volume_id, holder, state).await?,
            None if volume.state() == Some(&VolumeState::Creating) => {
                self.wait_available(region, volume_id).await?
            }
            None => {}
        }
        self.paced(region, false).await?;
        self.client(region)?
            .attach_volume()
            .volume_id(volume_id)
            .instance_id(instance_id)
            .device(device)
            .send()
            .await
            .map(drop)
            .map_err(Ec2Error::sdk("AttachVolume"))
    }

    /// Deletes a data volume of this cluster, forcing it off its instance first. A volume already gone (or
    /// another cluster's) is not an error: the caller wants it gone.
    pub async fn delete_volume(&self, region: &str, volume_id: &str) -> Result<(), Ec2Error> {
        if !self.free_volume(region, volume_id).await? {
            return Ok(());
        }
        self.paced(region, false).await?;
        let deleted = self
            .client(region)?
            .delete_volume()
            .volume_id(volume_id)
            .send()
            .await
            .map_err(Ec2Error::sdk("DeleteVolume"));
        match deleted {
            Err(err) if err.code() == Some("InvalidVolume.NotFound") => Ok(()),
            other => other.map(|_| tracing::info!(region, volume = volume_id, "deleted volume")),
        }
    }

    /// Takes a data volume off whatever instance holds it, forcing it (that instance is
    /// being fenced or removed: it may be hung and never let go), and waits until it is free
    /// to attach. `false` if EC2 does not know it (or it is not this cluster's data volume).
    pub async fn free_volume(&self, region: &str, volume_id: &str) -> Result<bool, Ec2Error> {
        let Some(volume) = self.volume(region, volume_id).await? else {
            return Ok(false);
        };
        if let Some((instance, _)) = holder(&volume) {
            let device = volume.attachments().iter().find_map(|a| a.device());
            self.force_detach(region, volume_id, instance, device)
                .await?;
            self.wait_available(region, volume_id).await?;
        }
        Ok(true)
    }

    async fn create_volume(
        &self,
        region: &str,
        queue_id: &str,
        slot: Slot,
    ) -> Result<Volume, Ec2Error> {
        let zone = self.subnet_zone(region, slot).await?;
        let name = slot.name(queue_id, "-data");
        let mut tags = tags::queue_tags(&self.settings.cluster, queue_id, name);
        tags.push(tags::tag(PURPOSE_TAG, DATA_VOLUME));
        tags.extend(slot.tags());
        self.paced(region, false).await?;
        let made = self
            .client(region)?
            .create_volume()
            .availability_zone(&zone)
            .size(self.settings.volume_size_gib)
            .volume_type(VolumeType::from(self.settings.volume_type.as_str()))
            .encrypted(true)
            .tag_specifications(tags::on_create(ResourceType::Volume, &tags))
            .send()
            .await
            .map_err(Ec2Error::sdk("CreateVolume"))?;
        let id = made.volume_id().ok_or(Ec2Error::Incomplete {
            operation: "CreateVolume",
            field: "volume id",
        })?;
        tracing::info!(queue = queue_id, region, volume = id, "created volume");
        Ok(Volume {
            id: id.to_owned(),
            region: region.to_owned(),
            queue_id: queue_id.to_owned(),
            slot,
            state: made
                .state()
                .map_or("creating", VolumeState::as_str)
                .to_owned(),
            attached_to: None,
            availability_zone: zone,
        })
    }

    /// The data volumes of this cluster in a region that are not being deleted, narrowed by `filters`.
    async fn describe_volumes(
        &self,
        region: &str,
        filters: Vec<Filter>,
    ) -> Result<Vec<sdk::Volume>, Ec2Error> {
        let live = Filter::builder()
            .name("status")
            .set_values(Some(LIVE_STATES.map(String::from).to_vec()))
            .build();
        let mut all = vec![
            tags::has_tag(CLUSTER_TAG, &self.settings.cluster),
            tags::has_tag(PURPOSE_TAG, DATA_VOLUME),
            live,
        ];
        all.extend(filters);
        self.client(region)?
            .describe_volumes()
            .set_filters(Some(all))
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(Ec2Error::sdk("DescribeVolumes"))
    }

    /// One data volume of this cluster; `None` when EC2 does not know it, or it is another cluster's, or it is an
    /// instance's root volume (which must never be force-detached or deleted from here).
    async fn volume(&self, region: &str, volume_id: &str) -> Result<Option<sdk::Volume>, Ec2Error> {
        let reply = self
            .client(region)?
            .describe_volumes()
            .volume_ids(volume_id)
            .filters(tags::has_tag(CLUSTER_TAG, &self.settings.cluster))
            .filters(tags::has_tag(PURPOSE_TAG, DATA_VOLUME))
            .send()
            .await;
        match reply.map_err(Ec2Error::sdk("DescribeVolumes")) {
            Err(err) if err.code() == Some("InvalidVolume.NotFound") => Ok(None),
            Err(err) => Err(err),
            Ok(reply) => Ok(reply.volumes().first().cloned()),
        }
    }

    /// Waits out a holder that is letting go (detaching, or its instance is terminating: EC2 then detaches the
    /// volume by itself); refuses a holder that is alive.
    async fn wait_released(
        &self,
        region: &str,
        volume_id: &str,
        holder: &str,
        state: &VolumeAttachmentState,
    ) -> Result<(), Ec2Error> {
        let leaving = match state {
            VolumeAttachmentState::Detaching => true,
            _ => self.instance(region, holder).await?.is_none_or(|instance| {
                matches!(instance.state.as_str(), "shutting-down" | "terminated")
            }),
        };
        if !leaving {
            return Err(Ec2Error::AttachedElsewhere {
                volume: volume_id.to_owned(),
                instance: holder.to_owned(),
            });
        }
        self.wait_available(region, volume_id).await
    }

    async fn wait_available(&self, region: &str, volume_id: &str) -> Result<(), Ec2Error> {
        self.client(region)?
            .wait_until_volume_available()
            .volume_ids(volume_id)
            .wait(SETTLE_WAIT)
            .await
            .map(drop)
            .map_err(|err| Ec2Error::NotAvailable {
                volume: volume_id.to_owned(),
                message: DisplayErrorContext(&err).to_string(),
            })
    }

    /// Forced, because the volume is about to be deleted: its instance may be hung, and there is nothing left to
    /// flush for.
    async fn force_detach(
        &self,
        region: &str,
        volume_id: &str,
        instance_id: &str,
        device: Option<&str>,
    ) -> Result<(), Ec2Error> {
        self.paced(region, false).await?;
        let detached = self
            .client(region)?
            .detach_volume()
            .volume_id(volume_id)
            .instance_id(instance_id)
            .set_device(device.map(str::to_owned))
            .force(true)
            .send()
            .await
            .map_err(Ec2Error::sdk("DetachVolume"));
        match detached {
            // Detached in the meantime (its instance was terminated, say).
            Err(err) if err.code() == Some("IncorrectState") => Ok(()),
            other => other.map(drop),
        }
    }

    /// The zone of the region's subnet for `slot`: a volume attaches only to instances in its own zone, and the
    /// instances of that slot go to that subnet.
    async fn subnet_zone(&self, region: &str, slot: Slot) -> Result<String, Ec2Error> {
        let subnet = self.region_settings(region)?.subnet_for(slot);
        let subnet = subnet.ok_or(Ec2Error::NoStandbySubnet {
            region: region.to_string(),
        })?;
        let reply = self
            .client(region)?
            .describe_subnets()
            .subnet_ids(subnet)
            .send()
            .await
            .map_err(Ec2Error::sdk("DescribeSubnets"))?;
        let zone = reply
            .subnets()
            .first()
            .and_then(|subnet| subnet.availability_zone());
        zone.map(str::to_owned).ok_or(Ec2Error::Incomplete {
            operation: "DescribeSubnets",
            field: "availability zone",
        })
    }
}

/// The instance holding the volume and how, unless it is fully detached.
fn holder(volume: &sdk::Volume) -> Option<(&str, &VolumeAttachmentState)> {
    volume.attachments().iter().find_map(|attachment| {
        let state = attachment.state()?;
        let instance = attachment.instance_id()?;
        (*state != VolumeAttachmentState::Detached).then_some((instance, state))
    })
}

impl Volume {
    fn from_sdk(
        operation: &'static str,
        region: &str,
        sdk: &sdk::Volume,
    ) -> Result<Volume, Ec2Error> {
        let missing = |field| Ec2Error::Incomplete { operation, field };
        Ok(Volume {
            id: sdk.volume_id().ok_or(missing("volume id"))?.to_owned(),
            region: region.to_owned(),
            queue_id: tags::value(sdk.tags(), QUEUE_TAG)
                .unwrap_or_default()
                .to_owned(),
            slot: Slot::of(sdk.tags()),
            state: sdk
                .state()
                .ok_or(missing("volume state"))?
                .as_str()
                .to_owned(),
            attached_to: holder(sdk).map(|(instance, _)| instance.to_owned()),
            availability_zone: sdk
                .availability_zone()
                .ok_or(missing("availability zone"))?
                .to_owned(),
        })
    }
}
