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
