//! What the control plane tells this crate: which cluster it is and where instances and volumes go.

use std::collections::BTreeMap;

/// Where a queue's instance goes in one region. The network is made outside this crate (by hand or by
/// infrastructure code), so a region is usable only once its subnet and groups exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSettings {
    /// The machine image every node boots; images are per region, so it is set per region.
    pub image_id: String,
    /// The dual-stack subnet (it needs an IPv6 CIDR): it also fixes the availability zone, so a queue's volume is
    /// made in the zone where its instances will run.
    pub subnet_id: String,
    /// A dual-stack subnet in another availability zone, where queues' standbys go (`replicas: 2`), so
    /// that a zone's loss leaves one copy. None: no standbys in this region.
    pub standby_subnet_id: Option<String>,
    /// The groups on the node's network interface: they open the queue's ports.
    pub security_group_ids: Vec<String>,
}

impl RegionSettings {
    /// The subnet an instance or volume in `slot` goes in; None: the second where there is
    /// no standby subnet.
    pub fn subnet_for(&self, slot: crate::Slot) -> Option<&str> {
        match slot {
            crate::Slot::First => Some(&self.subnet_id),
            crate::Slot::Second => self.standby_subnet_id.as_deref(),
        }
    }
}

/// One cluster's EC2 settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The value of the `qe:cluster` tag on everything made, and the only filter when listing: two clusters (say
    /// staging and production) can share an account without seeing each other's instances.
    pub cluster: String,
    /// The EC2 endpoint to call instead of AWS's (the emulator in tests); `None` calls the real regional endpoints.
    pub endpoint: Option<String>,
    /// The regions queues may run in, by AWS region name (`eu-west-1`).
    pub regions: BTreeMap<String, RegionSettings>,
    /// The size of a queue's data volume in GiB.
    pub volume_size_gib: i32,
    /// The EBS type of a queue's data volume, such as `gp3`.
    pub volume_type: String,
}
