//! The tags this crate writes and searches by. AWS is the only record of what was made: after a control-plane
//! restart, these tags are how its instances and volumes are found again.

use aws_sdk_ec2::types::{Filter, ResourceType, Tag, TagSpecification};

/// On everything made: the cluster it belongs to.
pub const CLUSTER_TAG: &str = "qe:cluster";
/// On everything made: the queue it serves.
pub const QUEUE_TAG: &str = "qe:queue";
/// Tells a queue's data volume apart from the root volumes of its instances, which carry the same queue tag.
pub const PURPOSE_TAG: &str = "qe:purpose";
/// The value of [`PURPOSE_TAG`] on a queue's data volume.
pub const DATA_VOLUME: &str = "data";
/// On a queue's standby instance and its volume: [`Role::Standby`]. A node's carry none, as
/// everything made before standbys.
pub const ROLE_TAG: &str = "qe:role";

/// Which of a queue's machines an instance or volume is for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Role {
    /// The queue's node (no [`ROLE_TAG`]).
    #[default]
    Node,
    /// Its standby (`replicas: 2`): in the region's standby subnet, another zone.
    Standby,
}

impl Role {
    const STANDBY: &'static str = "standby";

    /// The role an SDK tag list says.
    pub(crate) fn of(tags: &[Tag]) -> Role {
        match value(tags, ROLE_TAG) {
            Some(Role::STANDBY) => Role::Standby,
            _ => Role::Node,
        }
    }

    /// The tags of a resource of this role, beside the queue's.
    pub(crate) fn tags(self) -> Vec<Tag> {
        match self {
            Role::Node => Vec::new(),
            Role::Standby => vec![tag(ROLE_TAG, Role::STANDBY)],
        }
    }

    /// The name the AWS console shows for a queue's resource of this role.
    pub(crate) fn name(self, queue_id: &str, what: &str) -> String {
        match self {
            Role::Node => format!("qe-{queue_id}{what}"),
            Role::Standby => format!("qe-{queue_id}-standby{what}"),
        }
    }
}

/// Tags every resource of a queue carries; `Name` is what the AWS console shows.
pub(crate) fn queue_tags(cluster: &str, queue_id: &str, name: String) -> Vec<Tag> {
    vec![
        tag(CLUSTER_TAG, cluster),
        tag(QUEUE_TAG, queue_id),
        tag("Name", &name),
    ]
}

pub(crate) fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

/// Applies tags at creation, so nothing exists even briefly without them (an untagged resource would be invisible
/// to every later listing, and leak).
pub(crate) fn on_create(kind: ResourceType, tags: &[Tag]) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(tags.to_vec()))
        .build()
}

pub(crate) fn has_tag(key: &str, value: &str) -> Filter {
    Filter::builder()
        .name(format!("tag:{key}"))
        .values(value)
        .build()
}

/// The value of one tag in an SDK tag list.
pub(crate) fn value<'a>(tags: &'a [Tag], key: &str) -> Option<&'a str> {
    tags.iter()
        .find(|tag| tag.key() == Some(key))
        .and_then(Tag::value)
}
