//! Words of the wire protocol that both sides use.

/// Who a connection logged in as. A queue has one login per role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Publisher,
    Subscriber,
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Publisher, Role::Subscriber, Role::Admin];

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "publisher" => Some(Role::Publisher),
            "subscriber" => Some(Role::Subscriber),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Role::Publisher => "publisher",
            Role::Subscriber => "subscriber",
            Role::Admin => "admin",
        }
    }
}

/// The two queue types that share one address; chosen at each login.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueType {
    /// One subscriber gets each message; stored until acknowledged.
    Distribute,
    /// Every subscriber connected at that moment gets a copy; nothing is stored.
    Copy,
}

impl QueueType {
    pub fn parse(text: &str) -> Option<QueueType> {
        match text {
            "distribute" => Some(QueueType::Distribute),
            "copy" => Some(QueueType::Copy),
            _ => None,
        }
    }
}

/// Longest username and password, in bytes.
pub const MAX_CREDENTIAL_BYTES: usize = 128;
/// Longest text `context`, in bytes.
pub const MAX_CONTEXT_BYTES: usize = 256;
/// Longest publisher key, in characters (all ASCII).
pub const MAX_PUBLISHER_KEY_CHARS: usize = 128;
/// Longest delay: two days, in seconds.
pub const MAX_DELAY_SECS: u64 = 172_800;

/// The characters a publisher key may use besides ASCII letters and digits.
const PUBLISHER_KEY_PUNCTUATION: &[u8] = b"-_.:/+=";

/// Whether `id` is a deduplication id SQS takes (`MessageDeduplicationId`): 1 to 128
/// printable ASCII characters, no space.
pub fn is_valid_dedup_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Whether `key` is a valid publisher key: 1 to 128 of ASCII letters, digits and `- _ . : / + =`.
pub fn is_valid_publisher_key(key: &str) -> bool {
    (1..=MAX_PUBLISHER_KEY_CHARS).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || PUBLISHER_KEY_PUNCTUATION.contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publisher_keys() {
        assert!(is_valid_publisher_key("order-1234"));
        assert!(is_valid_publisher_key("a:b/c+d=e_f.g"));
        assert!(is_valid_publisher_key(&"k".repeat(128)));
        assert!(!is_valid_publisher_key(&"k".repeat(129)));
        assert!(!is_valid_publisher_key(""));
        assert!(!is_valid_publisher_key("has space"));
        assert!(!is_valid_publisher_key("é"));
    }
}
