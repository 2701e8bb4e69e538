//! The queues' records, in sled.

use crate::queues::Queue;
use std::path::Path;

pub struct Store {
    db: sled::Db,
    /// Queue id → the queue's record (JSON).
    queues: sled::Tree,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store: {0}")]
    Sled(#[from] sled::Error),
    #[error("a stored record does not read back: {0}")]
    Record(#[from] serde_json::Error),
}

impl Store {
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let db = sled::Config::new().path(dir).flush_every_ms(None).open()?;
        let queues = db.open_tree("queues")?;
        Ok(Store { db, queues })
    }

    /// Saves a queue's record, synced.
    pub fn put(&self, queue: &Queue) -> Result<(), StoreError> {
        self.queues.insert(&queue.id, serde_json::to_vec(queue)?)?;
        self.db.flush()?;
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<Option<Queue>, StoreError> {
        match self.queues.get(id)? {
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
            None => Ok(None),
        }
    }

    pub fn list(&self) -> Result<Vec<Queue>, StoreError> {
        self.queues
            .iter()
            .values()
            .map(|value| Ok(serde_json::from_slice(&value?)?))
            .collect()
    }
}
