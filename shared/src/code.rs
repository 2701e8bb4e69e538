//! Failure codes, as the manual's Reference lists them.
//!
//! A code is wire data: its number never changes, and clients are told to branch on it.
//! Internal errors are separate types that say which `Code` they become.

/// One failure code of the manual. The discriminant is the number on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Code {
    // Connecting and logging in
    InvalidJson = 100,
    InvalidContext = 101,
    LoginNotText = 102,
    InvalidUsername = 103,
    InvalidPassword = 104,
    InvalidRole = 105,
    InvalidQueueType = 106,
    AuthenticationFailed = 107,
    AdminNotOnCopy = 108,
    InvalidSessionId = 109,
    InvalidReplay = 110,
    // Publishing
    InvalidBody = 200,
    InvalidType = 201,
    BodyNotBase64 = 202,
    InvalidDelay = 203,
    InvalidDurability = 204,
    InvalidPublisherKey = 205,
    MissingBody = 206,
    DelayOnCopy = 207,
    DurabilityOnCopy = 208,
    PublisherKeyOnCopy = 209,
    MessageCountExceeded = 210,
    MessageMemoryExceeded = 211,
    /// Beyond the manual (README, "Delivery rules"): a publish's `expires`.
    InvalidExpiration = 212,
    ExpirationOnCopy = 213,
    /// Beyond the manual (README, "Exactly-once publish"): a publish's `dedupid`.
    InvalidDeduplicationId = 214,
    DeduplicationOnCopy = 215,
    /// Beyond the manual (README, "Message groups"): a publish's `group`.
    InvalidGroup = 216,
    GroupOnCopy = 217,
    // Subscribers
    InvalidCapacity = 300,
    InvalidMessageId = 301,
    InvalidAck = 302,
    InvalidLogout = 303,
    UnexpectedSubscriberMessage = 304,
    NackDurabilityZero = 305,
    CopySubscriberSent = 306,
    // Administrators
    InvalidCommand = 400,
    InvalidSubscriptionPeriod = 401,
    SubscriptionActive = 402,
    NoSubscription = 403,
    InvalidYear = 404,
    InvalidMonth = 405,
    InvalidDay = 406,
    DateBeforeData = 407,
    InvalidAverage = 408,
    BeforeOrAfter = 409,
    InvalidBefore = 410,
    InvalidAfter = 411,
    InvalidCount = 412,
    MoveDurabilityZero = 413,
    SettingOutOfRange = 414,
    SettingReadOnly = 415,
    NoWritableSetting = 416,
    // The queue's own problems
    Internal = 500,
    OutOfMemory = 501,
    DatabaseDown = 502,
    DatabaseTimeout = 503,
    Unknown = 504,
    SettingsNotSaved = 505,
    SettingsNotSynced = 506,
    SyncFailed = 507,
}

impl Code {
    /// The codes beyond the manual's table, for what is beyond the manual (README).
    pub const BEYOND_MANUAL: [Code; 6] = [
        Code::InvalidExpiration,
        Code::ExpirationOnCopy,
        Code::InvalidDeduplicationId,
        Code::DeduplicationOnCopy,
        Code::InvalidGroup,
        Code::GroupOnCopy,
    ];

    /// Every code of the manual, in the Reference's order.
    pub const ALL: [Code; 55] = [
        Code::InvalidJson,
        Code::InvalidContext,
        Code::LoginNotText,
        Code::InvalidUsername,
        Code::InvalidPassword,
        Code::InvalidRole,
        Code::InvalidQueueType,
        Code::AuthenticationFailed,
        Code::AdminNotOnCopy,
        Code::InvalidSessionId,
        Code::InvalidReplay,
        Code::InvalidBody,
        Code::InvalidType,
        Code::BodyNotBase64,
        Code::InvalidDelay,
        Code::InvalidDurability,
        Code::InvalidPublisherKey,
        Code::MissingBody,
        Code::DelayOnCopy,
        Code::DurabilityOnCopy,
        Code::PublisherKeyOnCopy,
        Code::MessageCountExceeded,
        Code::MessageMemoryExceeded,
        Code::InvalidCapacity,
        Code::InvalidMessageId,
        Code::InvalidAck,
        Code::InvalidLogout,
        Code::UnexpectedSubscriberMessage,
        Code::NackDurabilityZero,
        Code::CopySubscriberSent,
        Code::InvalidCommand,
        Code::InvalidSubscriptionPeriod,
        Code::SubscriptionActive,
        Code::NoSubscription,
        Code::InvalidYear,
        Code::InvalidMonth,
        Code::InvalidDay,
        Code::DateBeforeData,
        Code::InvalidAverage,
        Code::BeforeOrAfter,
        Code::InvalidBefore,
        Code::InvalidAfter,
        Code::InvalidCount,
        Code::MoveDurabilityZero,
        Code::SettingOutOfRange,
        Code::SettingReadOnly,
        Code::NoWritableSetting,
        Code::Internal,
        Code::OutOfMemory,
        Code::DatabaseDown,
        Code::DatabaseTimeout,
        Code::Unknown,
        Code::SettingsNotSaved,
        Code::SettingsNotSynced,
        Code::SyncFailed,
    ];

    /// The number clients see in `code`.
    pub const fn number(self) -> u16 {
        self as u16
    }

    /// The manual's reason text. For 407, 414 and 415 the manual's text has a placeholder in
    /// parentheses that the replying module fills in.
    pub const fn reason(self) -> &'static str {
        match self {
            Code::InvalidJson => "Invalid json.",
            Code::InvalidContext => "Invalid context.",
            Code::LoginNotText => "Login message must be of type text, not binary.",
            Code::InvalidUsername => "Invalid username.",
            Code::InvalidPassword => "Invalid password.",
            Code::InvalidRole => "Invalid role.",
            Code::InvalidQueueType => "Invalid queue type.",
            Code::AuthenticationFailed => {
                "Authentication failed. Invalid combination of username, password and role."
            }
            Code::AdminNotOnCopy => "Admin login is only allowed for distribute type queue.",
            Code::InvalidSessionId => "Invalid session id.",
            Code::InvalidReplay => "Invalid \"replay\".",
            Code::InvalidBody => "Invalid message body.",
            Code::InvalidType => "Invalid message type.",
            Code::BodyNotBase64 => "Body must be base64 encoded for binary messages.",
            Code::InvalidDelay => "Invalid delay.",
            Code::InvalidDurability => "Invalid durability.",
            Code::InvalidPublisherKey => "Invalid publisher key.",
            Code::MissingBody => {
                "Cannot publish: a JSON object must have a body field. To send JSON as the \
                 message, put it in body as a string."
            }
            Code::DelayOnCopy => "Delay is only allowed for distribute type queue.",
            Code::DurabilityOnCopy => "Durability is only allowed for distribute type queue.",
            Code::PublisherKeyOnCopy => "Publisher key is only allowed for distribute type queue.",
            Code::MessageCountExceeded => "Max allowed message count exceeded.",
            Code::MessageMemoryExceeded => "Max allowed message memory exceeded.",
            Code::InvalidExpiration => {
                "Invalid expiration. Must be a whole number of seconds from 1 to 1209600."
            }
            Code::ExpirationOnCopy => "Expiration is only allowed for distribute type queue.",
            Code::InvalidDeduplicationId => {
                "Invalid deduplication id. Must be 1 to 128 characters: letters, digits, and - _ . : / + =."
            }
            Code::DeduplicationOnCopy => {
                "Deduplication is only allowed for distribute type queue."
            }
            Code::InvalidGroup => {
                "Invalid group. Must be 1 to 128 characters: letters, digits, and - _ . : / + =."
            }
            Code::GroupOnCopy => "Groups are only allowed for distribute type queue.",
            Code::InvalidCapacity => "Invalid capacity.",
            Code::InvalidMessageId => "Invalid message id.",
            Code::InvalidAck => "Invalid ack.",
            Code::InvalidLogout => "Invalid logout.",
            Code::UnexpectedSubscriberMessage => {
                "Invalid message. Expecting ack or logout or capacity update."
            }
            Code::NackDurabilityZero => {
                "Cannot nack: a message with durability 0 is not on the disk, so it cannot go to \
                 the dead letter queue. Ack it instead."
            }
            Code::CopySubscriberSent => {
                "No incoming messages are allowed after successful login for copy queue \
                 subscribers."
            }
            Code::InvalidCommand => "Invalid command (cmd).",
            Code::InvalidSubscriptionPeriod => {
                "Invalid subscription period. Must be zero, or between 30 and 900 (inclusive)."
            }
            Code::SubscriptionActive => {
                "A subscription is already active. Cancel it first by using value 0 for subscribe."
            }
            Code::NoSubscription => "No active subscription to cancel.",
            Code::InvalidYear => "Invalid year.",
            Code::InvalidMonth => "Invalid month.",
            Code::InvalidDay => "Invalid day.",
            Code::DateBeforeData => "Invalid date, don't have data before (a time).",
            Code::InvalidAverage => {
                "Invalid average (or totals), not specified. Or: must be boolean."
            }
            Code::BeforeOrAfter => "Exactly one of before/after must be specified.",
            Code::InvalidBefore => "Invalid before.",
            Code::InvalidAfter => "Invalid after.",
            Code::InvalidCount => {
                "Invalid message count. Or: Count must be a value between 1 and 1600 (both \
                 inclusive)."
            }
            Code::MoveDurabilityZero => {
                "Cannot move: a message with durability 0 is not on the disk, so it cannot go to \
                 the dead letter queue. Use delmsg instead."
            }
            Code::SettingOutOfRange => "Invalid (setting). Must be between (its limits).",
            Code::SettingReadOnly => "Read only parameter (setting) specified.",
            Code::NoWritableSetting => "No valid parameter with write permission specified.",
            Code::Internal => "Internal error.",
            Code::OutOfMemory => "Out of memory.",
            Code::DatabaseDown => "Database is down.",
            Code::DatabaseTimeout => "Database server did not respond in time.",
            Code::Unknown => "Unknown failure.",
            Code::SettingsNotSaved => "Could not save the settings. Nothing has changed.",
            Code::SettingsNotSynced => {
                "Settings changed, but the save may not survive a machine crash."
            }
            Code::SyncFailed => "Sync to file failed. This operation has eventual durability.",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The manual is the contract: read its Failure codes tables and compare them with ours.
    fn manual_codes() -> BTreeMap<u16, String> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/spec/queue-expert-manual.txt"
        );
        let manual = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("the manual must sit at {path}: {e}"));
        let start = manual
            .find("Failure codes")
            .expect("a Failure codes section");
        let end = manual
            .find("Coming from Amazon SQS")
            .expect("the section after it");
        manual[start..end]
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let number = cells.get(1)?.parse::<u16>().ok()?;
                Some((number, cells.get(2)?.to_string()))
            })
            .collect()
    }

    #[test]
    fn every_code_matches_the_manual() {
        let manual = manual_codes();
        let ours: BTreeMap<u16, String> = Code::ALL
            .iter()
            .map(|code| (code.number(), code.reason().to_string()))
            .collect();
        assert_eq!(manual.len(), 55, "the manual's table changed size");
        assert_eq!(ours, manual);
    }
}
