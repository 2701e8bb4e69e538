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
/// On the instances and volume of a queue's second machine ([`Slot::Second`]): `second`. The
/// first's carry none, as everything made before standbys.
pub const SLOT_TAG: &str = "qe:slot";

/// Which of a queue's two machines (`replicas: 2`) an instance or volume is for. Each keeps its
/// slot for life: which one serves is the control plane's record, and moves with a promotion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The machine a queue starts with (no [`SLOT_TAG`]): in the region's subnet.
    #[default]
    First,
    /// The one placed beside it for a standby: in the region's standby subnet, another zone.
    Second,
}

impl Slot {
    const SECOND: &'static str = "second";

    /// The slot an SDK tag list says.
    pub(crate) fn of(tags: &[Tag]) -> Slot {
        match value(tags, SLOT_TAG) {
            Some(Slot::SECOND) => Slot::Second,
            _ => Slot::First,
        }
    }

    /// The tags of a resource in this slot, beside the queue's.
    pub(crate) fn tags(self) -> Vec<Tag> {
        match self {
            Slot::First => Vec::new(),
            Slot::Second => vec![tag(SLOT_TAG, Slot::SECOND)],
        }
    }

    /// The name the AWS console shows for a queue's resource in this slot.
    pub(crate) fn name(self, queue_id: &str, what: &str) -> String {
        match self {
            Slot::First => format!("qe-{queue_id}{what}"),
            Slot::Second => format!("qe-{queue_id}-second{what}"),
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
