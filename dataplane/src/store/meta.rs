//! The node's small, rarely written state, kept in sled: the administrator's settings, and
//! the stats and usage history (`history.rs`).
//!
//! Every write here that must last is flushed by sled and then synced with a real fsync
//! ([`qe_shared::synced_sled`]: sled's own flush is not a sync), as the message log syncs its
//! segments (README, "Durability and the data directory"); a failed sync is final, as the
//! log's: nothing written to this store counts as on the disk again until the node restarts.

use qe_shared::settings::{Setting, Settings, Tier};
pub use qe_shared::synced_sled::NotSynced;
use qe_shared::synced_sled::SyncedSled;
use qe_shared::Code;
use std::path::Path;
use std::sync::Arc;

#[derive(Clone)]
pub struct Meta {
    disk: MetaDisk,
    /// Setting name → value (u64, big-endian): only settings an administrator changed.
    settings: sled::Tree,
}

/// sled's database and its real sync; shared by the settings and the history.
#[derive(Clone)]
pub struct MetaDisk(Arc<SyncedSled>);

impl MetaDisk {
    /// The database itself, for its trees.
    pub fn db(&self) -> &sled::Db {
        self.0.db()
    }

    /// Makes everything written so far durable; fails at once after any failure before.
    pub fn sync(&self) -> Result<(), NotSynced> {
        let synced = self.0.sync();
        if synced.is_err() {
            tracing::error!("the settings and history store failed a sync: nothing written to it is trusted to the disk until the node restarts");
        }
        synced
    }
}

/// Why a settings change did not fully take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SaveError {
    #[error("the settings could not be saved; nothing changed")]
    NotSaved,
    #[error("the settings were saved but not synced")]
    NotSynced,
}

impl SaveError {
    pub fn code(self) -> Code {
        match self {
            SaveError::NotSaved => Code::SettingsNotSaved,
            SaveError::NotSynced => Code::SettingsNotSynced,
        }
    }
}

/// The settings saved on a primary, as its standby is sent them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedSettings {
    /// Each saved setting's name and value.
    pub values: Vec<(String, u64)>,
    /// When they last changed (seconds since 1970); None: never.
    pub changed_at: Option<u64>,
}

/// The key, beside the settings' own, of when they last changed (no setting has this name).
const CHANGED_AT: &str = "changed-at";

impl Meta {
    pub fn open(dir: &Path) -> Result<Meta, sled::Error> {
        let config = sled::Config::new()
            // Settings and history are small: a small cache is plenty.
            .cache_capacity(8 << 20)
            // Every save syncs itself; no background flusher thread is needed, and without
            // one a dropped database lets go of its files at once.
            .flush_every_ms(None);
        let disk = MetaDisk(Arc::new(SyncedSled::open(config, dir)?));
        let settings = disk.db().open_tree("settings")?;
        Ok(Meta { disk, settings })
    }

    /// When a setting was last saved (seconds since 1970); None if none ever was.
    pub fn settings_changed_at(&self) -> Option<u64> {
        let saved = self.settings.get(CHANGED_AT).ok().flatten()?;
        Some(u64::from_be_bytes(saved.as_ref().try_into().ok()?))
    }

    /// The database and its sync, for other small state (the history).
    pub fn disk(&self) -> &MetaDisk {
        &self.disk
    }

    /// The tier's defaults with every saved change laid over them. A saved value out of range
    /// (an older build's, say) is ignored rather than trusted.
    pub fn settings(&self, tier: Tier) -> Settings {
        let mut settings = Settings::defaults(tier);
        for setting in Setting::ALL {
            let saved = self.settings.get(setting.name()).ok().flatten();
            let value = saved.and_then(|v| Some(u64::from_be_bytes(v.as_ref().try_into().ok()?)));
            if let Some(value) = value.filter(|v| setting.accepts(*v)) {
                settings.set(setting, value);
            }
        }
        settings
    }

    /// Every setting ever saved, with its value, and when they last changed: what a standby
    /// is sent (`replication`).
    pub fn saved(&self) -> SavedSettings {
        let values = Setting::ALL.iter().filter_map(|setting| {
            let saved = self.settings.get(setting.name()).ok().flatten()?;
            let value = u64::from_be_bytes(saved.as_ref().try_into().ok()?);
            Some((setting.name().to_string(), value))
        });
        SavedSettings {
            values: values.collect(),
            changed_at: self.settings_changed_at(),
        }
    }

    /// Saves what a primary's [`Meta::saved`] gave, on its standby; names or values this
    /// build does not take are left out, as [`Meta::settings`] would ignore them.
    pub fn save_copy(&self, copy: &SavedSettings) -> Result<(), SaveError> {
        let Some(changed_at) = copy.changed_at else {
            return Ok(());
        };
        let taken = copy.values.iter().filter_map(|(name, value)| {
            let setting = Setting::parse(name).filter(|s| s.accepts(*value))?;
            Some((setting, *value))
        });
        self.save(&taken.collect::<Vec<_>>(), changed_at)
    }

    /// Saves `changes` all together, with `now_secs` as when the settings last changed, and
    /// syncs.
    pub fn save(&self, changes: &[(Setting, u64)], now_secs: u64) -> Result<(), SaveError> {
        let mut batch = sled::Batch::default();
        for (setting, value) in changes {
            batch.insert(setting.name(), &value.to_be_bytes());
        }
        batch.insert(CHANGED_AT, &now_secs.to_be_bytes());
        self.settings
            .apply_batch(batch)
            .map_err(|_| SaveError::NotSaved)?;
        self.disk.sync().map_err(|NotSynced| SaveError::NotSynced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sled lets go of its lock file a moment after the last handle drops (its threads wind
    /// down); a node opens it once per process, but this test reopens it in the same one.
    fn reopen(dir: &Path) -> Meta {
        for _ in 0..100 {
            match Meta::open(dir) {
                Ok(meta) => return meta,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
        Meta::open(dir).unwrap()
    }

    #[test]
    fn saved_settings_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let meta = Meta::open(dir.path()).unwrap();
            assert_eq!(
                meta.settings(Tier::Standard),
                Settings::defaults(Tier::Standard)
            );
            let changes = [
                (Setting::SavedSessionTimeoutSecs, 60),
                (Setting::MaxWsMsgLen, 2048),
            ];
            assert_eq!(meta.settings_changed_at(), None);
            meta.save(&changes, 1_790_000_000).unwrap();
        }
        let meta = reopen(dir.path());
        let settings = meta.settings(Tier::Devtest);
        assert_eq!(settings.get(Setting::SavedSessionTimeoutSecs), 60);
        assert_eq!(settings.get(Setting::MaxWsMsgLen), 2048);
        assert_eq!(
            settings.get(Setting::StatsFrequencySecs),
            3600,
            "devtest default kept"
        );
        assert_eq!(meta.settings_changed_at(), Some(1_790_000_000));
        assert_eq!(SaveError::NotSynced.code().number(), 506);
    }
}
