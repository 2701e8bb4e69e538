//! The queue's settings, as the manual's Reference lists them: one table shared by the node's
//! config loader, `getcfg` and `setcfg`.

/// The service tier. Dev/test differs where the manual says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    #[default]
    Standard,
    Devtest,
}

impl Tier {
    pub fn parse(text: &str) -> Option<Tier> {
        match text {
            "standard" => Some(Tier::Standard),
            "devtest" => Some(Tier::Devtest),
            _ => None,
        }
    }
}

/// A setting an administrator can change with `setcfg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setting {
    MaxWsMsgLen,
    MaxSubscriberCapacity,
    SavedSessionTimeoutSecs,
    NoReplyTimeoutSecs,
    StatsFrequencySecs,
    StatsRetentionPeriodYrs,
    UsageFrequencySecs,
    UsageRetentionPeriodYrs,
    /// Beyond the manual (README, "Delivery rules"): deliveries a message may have before
    /// the last failed one sends it to the dead letter queue; 0, the default, is unlimited.
    MaxReceiveCount,
    /// Beyond the manual: how long a message may stay in the queue, in seconds, before it is
    /// deleted; 0, the default, keeps it until it is handled.
    MessageRetentionSecs,
    /// Beyond the manual: how long a message received through the SQS face stays invisible
    /// when the receive names no timeout (SQS's `VisibilityTimeout` queue attribute).
    VisibilityTimeoutSecs,
    /// Beyond the manual: how long a message sent through the SQS face without a delay of
    /// its own waits before it is delivered (SQS's `DelaySeconds` queue attribute). WebSocket
    /// publishes keep the manual's rule: no `delay`, no wait.
    DelaySecs,
    /// Beyond the manual: how long an SQS receive that names no `WaitTimeSeconds` waits for
    /// a message (SQS's `ReceiveMessageWaitTimeSeconds`).
    ReceiveWaitSecs,
    /// Beyond the manual: 1 makes the queue an SQS FIFO queue (`FifoQueue`, set when
    /// CreateQueue makes it): an SQS send needs a `MessageGroupId` and a deduplication id,
    /// and gets a `SequenceNumber`. WebSocket publishes keep the manual's rules.
    FifoQueue,
    /// Beyond the manual: 1 makes an SQS send to a FIFO queue without a
    /// `MessageDeduplicationId` take the SHA-256 of its body as one
    /// (`ContentBasedDeduplication`).
    ContentBasedDeduplication,
}

impl Setting {
    /// Every writable setting, in the Reference's order (also `getcfg`'s order), then the
    /// ones beyond the manual.
    pub const ALL: [Setting; 15] = [
        Setting::MaxWsMsgLen,
        Setting::MaxSubscriberCapacity,
        Setting::SavedSessionTimeoutSecs,
        Setting::NoReplyTimeoutSecs,
        Setting::StatsFrequencySecs,
        Setting::StatsRetentionPeriodYrs,
        Setting::UsageFrequencySecs,
        Setting::UsageRetentionPeriodYrs,
        Setting::MaxReceiveCount,
        Setting::MessageRetentionSecs,
        Setting::VisibilityTimeoutSecs,
        Setting::DelaySecs,
        Setting::ReceiveWaitSecs,
        Setting::FifoQueue,
        Setting::ContentBasedDeduplication,
    ];

    /// How many of [`Setting::ALL`] the manual's Reference lists (the first ones).
    pub const IN_MANUAL: usize = 8;

    pub const fn name(self) -> &'static str {
        match self {
            Setting::MaxWsMsgLen => "max-ws-msg-len",
            Setting::MaxSubscriberCapacity => "max-subscriber-capacity",
            Setting::SavedSessionTimeoutSecs => "saved-session-timeout-secs",
            Setting::NoReplyTimeoutSecs => "no-reply-timeout-secs",
            Setting::StatsFrequencySecs => "stats-frequency-secs",
            Setting::StatsRetentionPeriodYrs => "stats-retention-period-yrs",
            Setting::UsageFrequencySecs => "usage-frequency-secs",
            Setting::UsageRetentionPeriodYrs => "usage-retention-period-yrs",
            Setting::MaxReceiveCount => "max-receive-count",
            Setting::MessageRetentionSecs => "message-retention-secs",
            Setting::VisibilityTimeoutSecs => "visibility-timeout-secs",
            Setting::DelaySecs => "delay-secs",
            Setting::ReceiveWaitSecs => "receive-wait-secs",
            Setting::FifoQueue => "fifo-queue",
            Setting::ContentBasedDeduplication => "content-based-deduplication",
        }
    }

    pub fn parse(name: &str) -> Option<Setting> {
        Setting::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The inclusive range `setcfg` accepts.
    pub const fn range(self) -> (u64, u64) {
        match self {
            Setting::MaxWsMsgLen => (1024, 1_048_576),
            Setting::MaxSubscriberCapacity => (1, 1024),
            Setting::SavedSessionTimeoutSecs => (10, 86_400),
            Setting::NoReplyTimeoutSecs => (1, 300),
            Setting::StatsFrequencySecs => (300, 3600),
            Setting::StatsRetentionPeriodYrs => (1, 10),
            Setting::UsageFrequencySecs => (1800, 86_400),
            Setting::UsageRetentionPeriodYrs => (1, 20),
            Setting::MaxReceiveCount => (0, 1000),
            // 14 days, Amazon SQS's longest retention.
            Setting::MessageRetentionSecs => (0, 1_209_600),
            // 12 hours, as SQS.
            Setting::VisibilityTimeoutSecs => (0, 43_200),
            // SQS's ranges: 15 minutes, and the longest long poll.
            Setting::DelaySecs => (0, 900),
            Setting::ReceiveWaitSecs => (0, 20),
            Setting::FifoQueue | Setting::ContentBasedDeduplication => (0, 1),
        }
    }

    /// The value a new queue starts with on `tier`.
    pub const fn default_for(self, tier: Tier) -> u64 {
        match (self, tier) {
            (Setting::MaxWsMsgLen, _) => 65_536,
            (Setting::MaxSubscriberCapacity, _) => 1024,
            (Setting::SavedSessionTimeoutSecs, Tier::Standard) => 10,
            (Setting::SavedSessionTimeoutSecs, Tier::Devtest) => 3600,
            (Setting::NoReplyTimeoutSecs, _) => 10,
            (Setting::StatsFrequencySecs, Tier::Standard) => 300,
            (Setting::StatsFrequencySecs, Tier::Devtest) => 3600,
            (Setting::StatsRetentionPeriodYrs, Tier::Standard) => 5,
            (Setting::StatsRetentionPeriodYrs, Tier::Devtest) => 1,
            (Setting::UsageFrequencySecs, _) => 1800,
            (Setting::UsageRetentionPeriodYrs, _) => 5,
            (Setting::MaxReceiveCount, _) => 0,
            (Setting::MessageRetentionSecs, _) => 0,
            (Setting::VisibilityTimeoutSecs, _) => 30,
            (Setting::DelaySecs, _) => 0,
            (Setting::ReceiveWaitSecs, _) => 0,
            (Setting::FifoQueue, _) => 0,
            (Setting::ContentBasedDeduplication, _) => 0,
        }
    }

    pub fn accepts(self, value: u64) -> bool {
        let (min, max) = self.range();
        (min..=max).contains(&value)
    }
}

/// A setting `getcfg` shows that only the operator or the machine decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadOnlySetting {
    MaxTasks,
    MaxMessages,
    MaxMessagesMemory,
    MessagesMemoryUsed,
    MaxWriteQueueBytes,
    MessageTimeoutSecs,
    LogLevel,
}

impl ReadOnlySetting {
    /// In the Reference's order.
    pub const ALL: [ReadOnlySetting; 7] = [
        ReadOnlySetting::MaxTasks,
        ReadOnlySetting::MaxMessages,
        ReadOnlySetting::MaxMessagesMemory,
        ReadOnlySetting::MessagesMemoryUsed,
        ReadOnlySetting::MaxWriteQueueBytes,
        ReadOnlySetting::MessageTimeoutSecs,
        ReadOnlySetting::LogLevel,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            ReadOnlySetting::MaxTasks => "max-tasks",
            ReadOnlySetting::MaxMessages => "max-messages",
            ReadOnlySetting::MaxMessagesMemory => "max-messages-memory",
            ReadOnlySetting::MessagesMemoryUsed => "messages-memory-used",
            ReadOnlySetting::MaxWriteQueueBytes => "max-write-queue-bytes",
            ReadOnlySetting::MessageTimeoutSecs => "message-timeout-secs",
            ReadOnlySetting::LogLevel => "log-level",
        }
    }

    pub fn parse(name: &str) -> Option<ReadOnlySetting> {
        ReadOnlySetting::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// The manual's fixed read-only values.
pub mod fixed {
    use super::Tier;

    /// The most messages any queue holds, whatever its memory.
    pub const MAX_MESSAGES_CEILING: u64 = 1_000_000;
    /// Connections on Dev/test.
    pub const DEVTEST_MAX_TASKS: u64 = 100;
    /// A fragmented message must arrive whole within this time.
    pub const MESSAGE_TIMEOUT_SECS: u64 = 30;

    /// Bytes that may wait to be sent to one connection before it is cut off.
    pub const fn max_write_queue_bytes(tier: Tier) -> u64 {
        match tier {
            Tier::Standard => 4 << 20,
            Tier::Devtest => 1 << 20,
        }
    }
}

/// The current value of every writable setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    values: [u64; Setting::ALL.len()],
}

impl Settings {
    pub fn defaults(tier: Tier) -> Settings {
        Settings {
            values: Setting::ALL.map(|s| s.default_for(tier)),
        }
    }

    pub fn get(&self, setting: Setting) -> u64 {
        self.values[setting as usize]
    }

    /// Sets a value the caller has checked with [`Setting::accepts`].
    pub fn set(&mut self, setting: Setting, value: u64) {
        debug_assert!(setting.accepts(value));
        self.values[setting as usize] = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Reference's settings table, read from the manual: name, default, min, max.
    fn manual_settings() -> Vec<(String, u64, u64, u64)> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/spec/queue-expert-manual.txt"
        );
        let manual = std::fs::read_to_string(path).expect("the manual");
        let start = manual
            .find("Limits and settings")
            .expect("the settings section");
        let number = |s: &str| s.replace(',', "").parse::<u64>().unwrap();
        manual[start..]
            .lines()
            .take_while(|l| !l.starts_with("These can only be read"))
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let name = cells.first()?.to_string();
                let (min, max) = cells.get(2)?.split_once(" to ")?;
                Some((name, number(cells.get(1)?), number(min), number(max)))
            })
            .collect()
    }

    #[test]
    fn writable_settings_match_the_manual() {
        let ours: Vec<(String, u64, u64, u64)> = Setting::ALL
            .iter()
            .map(|s| {
                let (min, max) = s.range();
                (
                    s.name().to_string(),
                    s.default_for(Tier::Standard),
                    min,
                    max,
                )
            })
            .collect();
        assert_eq!(ours[..Setting::IN_MANUAL], manual_settings());
        // Beyond the manual, both off by default: the manual's behaviour is unchanged.
        assert_eq!(
            ours[Setting::IN_MANUAL..],
            [
                ("max-receive-count".to_string(), 0, 0, 1000),
                ("message-retention-secs".to_string(), 0, 0, 1_209_600),
                ("visibility-timeout-secs".to_string(), 30, 0, 43_200),
                ("delay-secs".to_string(), 0, 0, 900),
                ("receive-wait-secs".to_string(), 0, 0, 20),
                ("fifo-queue".to_string(), 0, 0, 1),
                ("content-based-deduplication".to_string(), 0, 0, 1),
            ]
        );
    }

    #[test]
    fn devtest_defaults_follow_the_manual() {
        let devtest = Settings::defaults(Tier::Devtest);
        assert_eq!(devtest.get(Setting::SavedSessionTimeoutSecs), 3600);
        assert_eq!(devtest.get(Setting::StatsFrequencySecs), 3600);
        assert_eq!(devtest.get(Setting::StatsRetentionPeriodYrs), 1);
        assert_eq!(devtest.get(Setting::MaxWsMsgLen), 65_536);
    }

    #[test]
    fn read_only_names_are_the_manuals() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/spec/queue-expert-manual.txt"
        );
        let manual = std::fs::read_to_string(path).expect("the manual");
        let start = manual.find("These can only be read").unwrap();
        let end = manual.find("Why a connection closed").unwrap();
        let names: Vec<&str> = manual[start..end]
            .lines()
            .filter_map(|l| l.split_once(" |").map(|(n, _)| n.trim()))
            .filter(|n| !n.is_empty() && *n != "Setting" && !n.starts_with('|'))
            .collect();
        let ours: Vec<&str> = ReadOnlySetting::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(ours, names);
    }
}
