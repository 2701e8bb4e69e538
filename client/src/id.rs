//! A message's id: below every other module (errors name ids, messages carry them).

use serde::Serialize;
use std::fmt;

/// A message's id, as the queue gives it (a UUIDv7 in its text form). Ids sort in time order.
///
/// ```
/// use qe_client::MessageId;
/// let earlier = MessageId::from("01a1c09f-62da-7000-a30b-0817c9a42e3f");
/// let later = MessageId::new("01a1c09f-62df-7000-84ba-6bd164337f31");
/// assert!(earlier < later);
/// assert_eq!(later.to_string(), "01a1c09f-62df-7000-84ba-6bd164337f31");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct MessageId(String);

impl MessageId {
    /// An id from its text, as a subscriber or `getmsgs` shows it. It is not checked here:
    /// the queue answers an unknown or malformed id with 301.
    pub fn new(id: impl Into<String>) -> MessageId {
        MessageId(id.into())
    }

    /// Its text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for MessageId {
    fn from(id: String) -> MessageId {
        MessageId(id)
    }
}

impl From<&str> for MessageId {
    fn from(id: &str) -> MessageId {
        MessageId(id.to_string())
    }
}

impl AsRef<str> for MessageId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}
