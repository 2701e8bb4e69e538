//! What every connection of the node shares.

use crate::auth::Logins;
use crate::config::Config;
use crate::engine::{CopyQueue, Limits, Queue};
use crate::limits::{usable_memory, NodeLimits};
use crate::store::MemoryStore;
use qe_shared::settings::{Setting, Settings, Tier};
use std::sync::{Arc, RwLock};

pub struct Node {
    /// The distribute queue.
    pub queue: Queue,
    /// The copy queue type at the same address.
    pub copy: Arc<CopyQueue>,
    pub logins: Logins,
    pub tier: Tier,
    pub limits: NodeLimits,
    /// The writable settings; `setcfg` (part 4) changes them while connections read them.
    settings: RwLock<Settings>,
}

impl Node {
    pub fn new(config: &Config) -> Arc<Node> {
        let limits = NodeLimits::derive(
            usable_memory(),
            config.tier,
            config.max_messages,
            config.max_messages_memory,
        );
        let queue_limits = Limits {
            max_messages: limits.max_messages,
            max_memory: limits.max_messages_memory,
        };
        Arc::new(Node {
            queue: Queue::new(Box::new(MemoryStore), queue_limits),
            copy: Arc::default(),
            logins: config.logins.clone(),
            tier: config.tier,
            limits,
            settings: RwLock::new(Settings::defaults(config.tier)),
        })
    }

    pub fn setting(&self, setting: Setting) -> u64 {
        self.settings
            .read()
            .expect("the settings lock is never poisoned")
            .get(setting)
    }
}
