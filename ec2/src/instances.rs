//! A queue's instances: launched with everything the node needs to boot alone (its user data), found again by tags.

use std::net::{Ipv4Addr, Ipv6Addr};

use aws_sdk_ec2::types::{
    self as sdk, Filter, HttpTokensState, InstanceMetadataOptionsRequest,
    InstanceNetworkInterfaceSpecification, InstanceType, ResourceType,
};
use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};

use crate::tags::{self, Slot, CLUSTER_TAG, QUEUE_TAG};
use crate::{Ec2, Ec2Error, RegionSettings};

/// EC2's limit on user data, counted before base64.
const USER_DATA_LIMIT: usize = 16 * 1024;

/// Every state but `terminated`: a terminated instance stays listed for about an hour, but it holds nothing and
/// costs nothing, so it is no longer ours to manage.
const LIVE_STATES: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

/// What to start for a queue.
#[derive(Clone, Copy, Debug)]
pub struct Launch<'a> {
    pub queue_id: &'a str,
    /// An AWS region name; it must be in the settings.
    pub region: &'a str,
    /// An EC2 instance type such as `t4g.small`; its architecture must match the region's image.
    pub instance_type: &'a str,
    /// Whether the node gets a public IPv4 address too. Clients reach nodes by IPv6; public IPv4 is paid by the
    /// hour, so only queues that need IPv4 clients get one.
    pub ipv4: bool,
    /// The text handed to the node at boot (cloud-init); encoded to base64 here.
    pub user_data: &'a str,
    /// The queue's node, or its standby (in the region's standby subnet).
    pub slot: Slot,
    /// Makes a retried launch (after a call with no answer) return the first launch's instance instead of a
    /// second one. AWS keeps it for the instance's life, so a new attempt for the same queue needs a new token.
    pub client_token: &'a str,
}

/// An instance of this cluster, as EC2 describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    pub region: String,
    /// From the `qe:queue` tag; empty if someone removed it.
    pub queue_id: String,
    /// From the `qe:slot` tag.
    pub slot: Slot,
    /// EC2's state name: `pending`, `running`, `shutting-down`, `terminated`, `stopping` or `stopped`.
    pub state: String,
    /// The address clients reach the node at (given by EC2 from the subnet's IPv6 range).
    pub ipv6: Option<Ipv6Addr>,
    pub public_ipv4: Option<Ipv4Addr>,
    pub private_ipv4: Option<Ipv4Addr>,
    pub availability_zone: Option<String>,
    /// Its primary network interface, where its addresses are.
    pub network_interface_id: Option<String>,
}

impl Ec2 {
    /// Starts one instance for a queue. Tags are applied by the launch itself, so an instance is never untagged
    /// (and so never invisible to [`Ec2::instances`]), even if the caller dies right after.
    pub async fn launch(&self, launch: &Launch<'_>) -> Result<Instance, Ec2Error> {
        if launch.user_data.len() > USER_DATA_LIMIT {
            return Err(Ec2Error::UserDataTooLarge(launch.user_data.len()));
        }
        let client = self.client(launch.region)?;
        let place = self.region_settings(launch.region)?;
        let name = launch.slot.name(launch.queue_id, "");
        let mut tags = tags::queue_tags(&self.settings.cluster, launch.queue_id, name);
        tags.extend(launch.slot.tags());
        let subnet = place
            .subnet_for(launch.slot)
            .ok_or(Ec2Error::NoStandbySubnet {
                region: launch.region.to_string(),
            })?;
        self.paced(launch.region, true).await?;
        let reply = client
            .run_instances()
            .image_id(&place.image_id)
            .instance_type(InstanceType::from(launch.instance_type))
            .min_count(1)
            .max_count(1)
            .client_token(launch.client_token)
            .user_data(BASE64.encode(launch.user_data))
            .network_interfaces(network_interface(place, subnet, launch.ipv4))
            .metadata_options(imdsv2())
            .tag_specifications(tags::on_create(ResourceType::Instance, &tags))
            .tag_specifications(tags::on_create(ResourceType::Volume, &tags))
            .tag_specifications(tags::on_create(ResourceType::NetworkInterface, &tags))
            .send()
            .await
            .map_err(Ec2Error::sdk("RunInstances"))?;
        let instance = reply.instances().first().ok_or(Ec2Error::Incomplete {
            operation: "RunInstances",
            field: "instance",
        })?;
        let instance = Instance::from_sdk("RunInstances", launch.region, instance)?;
        tracing::info!(
            queue = launch.queue_id,
            region = launch.region,
            instance = instance.id,
            "launched"
        );
        Ok(instance)
    }

    /// Every instance of this cluster that is not terminated, in every configured region: what the control plane
    /// compares with what it wants running.
    pub async fn instances(&self) -> Result<Vec<Instance>, Ec2Error> {
        let regions = self
            .clients
            .keys()
            .map(|region| self.region_instances(region));
        let lists = futures::future::try_join_all(regions).await?;
        Ok(lists.into_iter().flatten().collect())
    }

    /// One instance of this cluster, terminated ones included (they stay visible for about an hour); `None` when
    /// EC2 does not know it or it belongs to another cluster.
    pub async fn instance(&self, region: &str, id: &str) -> Result<Option<Instance>, Ec2Error> {
        let reply = self
            .client(region)?
            .describe_instances()
            .instance_ids(id)
            .filters(tags::has_tag(CLUSTER_TAG, &self.settings.cluster))
            .send()
            .await;
        let reply = match reply.map_err(Ec2Error::sdk("DescribeInstances")) {
            Err(err) if err.code() == Some("InvalidInstanceID.NotFound") => return Ok(None),
            other => other?,
        };
        let mut found = reply.reservations().iter().flat_map(|r| r.instances());
        found
            .next()
            .map(|instance| Instance::from_sdk("DescribeInstances", region, instance))
            .transpose()
    }

    /// Terminates an instance of this cluster. Asking again, or for an instance EC2 no longer knows, succeeds:
    /// the caller wants it gone, and it is. An instance of another cluster is left alone, so a wrong id cannot
    /// take down someone else's machine.
    pub async fn terminate(&self, region: &str, id: &str) -> Result<(), Ec2Error> {
        match self.instance(region, id).await? {
            Some(instance) if instance.state != "terminated" => {}
            _ => return Ok(()),
        }
        self.paced(region, false).await?;
        let sent = self
            .client(region)?
            .terminate_instances()
            .instance_ids(id)
            .send()
            .await
            .map_err(Ec2Error::sdk("TerminateInstances"));
        match sent {
            Err(err) if err.code() == Some("InvalidInstanceID.NotFound") => Ok(()),
            other => other.map(|_| tracing::info!(region, instance = id, "terminating")),
        }
    }

    /// Gives a running instance that has no IPv6 address one from its subnet's range (the
    /// launch asks for one, but an interface can come up without: an emulator, a subnet whose
    /// IPv6 range was added later). Returns the instance as it is then.
    pub async fn ensure_ipv6(&self, instance: Instance) -> Result<Instance, Ec2Error> {
        if instance.ipv6.is_some() {
            return Ok(instance);
        }
        let interface = instance
            .network_interface_id
            .as_deref()
            .ok_or(Ec2Error::Incomplete {
                operation: "DescribeInstances",
                field: "a network interface",
            })?;
        self.paced(&instance.region, false).await?;
        self.client(&instance.region)?
            .assign_ipv6_addresses()
            .network_interface_id(interface)
            .ipv6_address_count(1)
            .send()
            .await
            .map_err(Ec2Error::sdk("AssignIpv6Addresses"))?;
        tracing::info!(instance = instance.id, "gave an IPv6 address");
        let now = self.instance(&instance.region, &instance.id).await?;
        now.ok_or(Ec2Error::Incomplete {
            operation: "DescribeInstances",
            field: "the instance",
        })
    }

    /// The instances of one queue in its region that are not terminated: one filtered call,
    /// so a control plane with many queues does not list them all for each.
    pub async fn instances_of(
        &self,
        region: &str,
        queue_id: &str,
    ) -> Result<Vec<Instance>, Ec2Error> {
        self.region_instances_where(region, Some(queue_id)).await
    }

    async fn region_instances(&self, region: &str) -> Result<Vec<Instance>, Ec2Error> {
        self.region_instances_where(region, None).await
    }

    async fn region_instances_where(
        &self,
        region: &str,
        queue_id: Option<&str>,
    ) -> Result<Vec<Instance>, Ec2Error> {
        let live = Filter::builder()
            .name("instance-state-name")
            .set_values(Some(LIVE_STATES.map(String::from).to_vec()))
            .build();
        let mut request = self
            .client(region)?
            .describe_instances()
            .filters(tags::has_tag(CLUSTER_TAG, &self.settings.cluster))
            .filters(live);
        if let Some(queue_id) = queue_id {
            request = request.filters(tags::has_tag(QUEUE_TAG, queue_id));
        }
        let reservations = request
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(Ec2Error::sdk("DescribeInstances"))?;
        reservations
            .iter()
            .flat_map(|reservation| reservation.instances())
            .map(|instance| Instance::from_sdk("DescribeInstances", region, instance))
            .collect()
    }
}

/// The node's only network interface. Subnet and groups go here, not on the instance: EC2 refuses both places in
/// one request, and only an interface spec can choose public IPv4 per launch.
fn network_interface(
    place: &RegionSettings,
    subnet: &str,
    ipv4: bool,
) -> InstanceNetworkInterfaceSpecification {
    InstanceNetworkInterfaceSpecification::builder()
        .device_index(0)
        .subnet_id(subnet)
        .set_groups(Some(place.security_group_ids.clone()))
        .ipv6_address_count(1)
        .associate_public_ip_address(ipv4)
        .delete_on_termination(true)
        .build()
}

/// IMDSv2 only: a metadata request then needs a session token from a PUT, which a server-side request forgery
/// (a plain GET through some proxy on the node) cannot obtain, so it cannot steal the instance role's credentials.
fn imdsv2() -> InstanceMetadataOptionsRequest {
    InstanceMetadataOptionsRequest::builder()
        .http_tokens(HttpTokensState::Required)
        .build()
}

impl Instance {
    fn from_sdk(
        operation: &'static str,
        region: &str,
        sdk: &sdk::Instance,
    ) -> Result<Instance, Ec2Error> {
        let missing = |field| Ec2Error::Incomplete { operation, field };
        let id = sdk.instance_id().ok_or(missing("instance id"))?;
        let state = sdk
            .state()
            .and_then(|state| state.name())
            .ok_or(missing("instance state"))?;
        Ok(Instance {
            id: id.to_owned(),
            region: region.to_owned(),
            queue_id: tags::value(sdk.tags(), QUEUE_TAG)
                .unwrap_or_default()
                .to_owned(),
            slot: Slot::of(sdk.tags()),
            state: state.as_str().to_owned(),
            ipv6: ipv6(sdk),
            public_ipv4: sdk.public_ip_address().and_then(|ip| ip.parse().ok()),
            private_ipv4: sdk.private_ip_address().and_then(|ip| ip.parse().ok()),
            availability_zone: sdk
                .placement()
                .and_then(|placement| placement.availability_zone())
                .map(str::to_owned),
            network_interface_id: primary_interface(sdk)
                .and_then(|nic| nic.network_interface_id())
                .map(str::to_owned),
        })
    }
}

/// The interface at device index 0.
fn primary_interface(sdk: &sdk::Instance) -> Option<&sdk::InstanceNetworkInterface> {
    sdk.network_interfaces()
        .iter()
        .find(|nic| nic.attachment().and_then(|a| a.device_index()) == Some(0))
}

/// The instance's IPv6 address: EC2 fills the instance-level field only for a primary IPv6 address, so the
/// primary interface's first address is the usual source.
fn ipv6(sdk: &sdk::Instance) -> Option<Ipv6Addr> {
    let from_nic = primary_interface(sdk)
        .and_then(|nic| nic.ipv6_addresses().first())
        .and_then(|address| address.ipv6_address());
    from_nic
        .or(sdk.ipv6_address())
        .and_then(|ip| ip.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{
        InstanceIpv6Address, InstanceNetworkInterface, InstanceNetworkInterfaceAttachment,
        InstanceState, InstanceStateName,
    };

    fn described(nic_ipv6: Option<&str>) -> sdk::Instance {
        let attachment = InstanceNetworkInterfaceAttachment::builder()
            .device_index(0)
            .build();
        let addresses =
            nic_ipv6.map(|ip| vec![InstanceIpv6Address::builder().ipv6_address(ip).build()]);
        let nic = InstanceNetworkInterface::builder()
            .attachment(attachment)
            .set_ipv6_addresses(addresses)
            .build();
        sdk::Instance::builder()
            .instance_id("i-1")
            .state(
                InstanceState::builder()
                    .name(InstanceStateName::Running)
                    .build(),
            )
            .tags(tags::tag(QUEUE_TAG, "q1"))
            .network_interfaces(nic)
            .private_ip_address("10.0.0.5")
            .build()
    }

    // moto does not assign IPv6 addresses from an interface spec, so the reading of EC2's answer is checked here.
    #[test]
    fn ipv6_comes_from_the_primary_interface() {
        let instance =
            Instance::from_sdk("Test", "eu-west-1", &described(Some("2001:db8::5"))).unwrap();
        assert_eq!(instance.ipv6, Some("2001:db8::5".parse().unwrap()));
        assert_eq!(instance.queue_id, "q1");
        assert_eq!(instance.state, "running");
        assert_eq!(instance.private_ipv4, Some(Ipv4Addr::new(10, 0, 0, 5)));
        assert_eq!(instance.public_ipv4, None);
    }

    #[test]
    fn no_ipv6_when_the_interface_has_none() {
        let instance = Instance::from_sdk("Test", "eu-west-1", &described(None)).unwrap();
        assert_eq!(instance.ipv6, None);
    }
}
