//! The embedded backend: sled, in one directory, for one control plane.
//!
//! Keys map onto the trees stores made before the backend trait keep: `queues/ID` in tree
//! `queues` as `ID`, `usage/…` and `stats/…` in trees of those names, everything else in the
//! default tree. Every write is synced before it is answered, with a real fsync after sled's
//! flush ([`qe_shared::synced_sled`]: sled's own flush is `sync_file_range`, not a sync); a
//! failed sync is final, and every write after it is answered as failed until the control
//! plane restarts and reads back what the disk has. sled's calls block, so they
//! run on tokio's blocking threads, never on the runtime's workers: a slow disk delays the
//! requests that wrote, not the rest (health checks, node watches, DNS). Only this process
//! writes, so the changes to follow are its own (the [`super::Store`] wakes its waiters).

use super::{Backend, Fence, Listed, StoreError, Stored, Version};
use async_trait::async_trait;
use qe_shared::synced_sled::SyncedSled;
use std::path::Path;
use std::sync::Arc;

/// The trees that hold keys of one prefix, without it.
const TREES: [&str; 3] = ["queues", "usage", "stats"];

/// Cheap to clone: sled's handles are shared.
#[derive(Clone)]
pub struct SledBackend {
    store: Arc<SyncedSled>,
    /// The trees of [`TREES`], in that order.
    trees: Vec<sled::Tree>,
}

impl SledBackend {
    pub fn open(dir: &Path) -> Result<SledBackend, StoreError> {
        let store = SyncedSled::open(sled::Config::new().flush_every_ms(None), dir)?;
        let trees = TREES
            .iter()
            .map(|name| store.db().open_tree(name))
            .collect::<Result<_, _>>()?;
        Ok(SledBackend {
            store: Arc::new(store),
            trees,
        })
    }

    /// The tree `key` is in, and its key there.
    fn place<'k>(&self, key: &'k str) -> (&sled::Tree, &'k str) {
        for (name, tree) in TREES.iter().zip(&self.trees) {
            if let Some(rest) = key.strip_prefix(name).and_then(|k| k.strip_prefix('/')) {
                return (tree, rest);
            }
        }
        (self.store.db(), key)
    }

    /// The keys from `start` to `end` in the tree `start` is in; an `end` past that tree's
    /// keys (`queues0` after `queues/…`) is its end.
    fn range_of(&self, start: &str, end: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        let (tree, from) = self.place(start);
        let values = match self.place(end) {
            (end_tree, to) if std::ptr::eq(end_tree, tree) => tree.range(from..to),
            _ => tree.range(from..),
        };
        values.values().map(|value| Ok(value?.to_vec())).collect()
    }

    /// Runs `work` on a blocking thread, then syncs if it wrote.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&SledBackend) -> Result<(T, bool), StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let (answer, wrote) = work(&this)?;
            if wrote {
                this.store.sync()?;
            }
            Ok(answer)
        })
        .await
        .expect("sled's calls neither panic nor are cancelled")
    }
}

#[async_trait]
impl Backend for SledBackend {
    async fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        // On a blocking thread like every other call, though it is mostly a read from sled's
        // page cache: a page not in it is read from the disk, and a read that meets a node
        // half split or merged finishes that change itself (sled's `view_for_key`), which
        // writes to sled's log and waits for room in its buffers while the disk is stalled.
        let key = key.to_string();
        self.blocking(move |this| {
            let (tree, key) = this.place(&key);
            let stored = tree.get(key)?.map(|value| Stored {
                value: value.to_vec(),
                version: Version::Value(value.to_vec()),
            });
            Ok((stored, false))
        })
        .await
    }

    async fn range(&self, start: &str, end: &str) -> Result<Listed, StoreError> {
        let (start, end) = (start.to_string(), end.to_string());
        self.blocking(move |this| {
            let values = this.range_of(&start, &end)?;
            let revision = None;
            Ok((Listed { values, revision }, false))
        })
        .await
    }

    async fn count(&self, start: &str, end: &str) -> Result<u64, StoreError> {
        let (start, end) = (start.to_string(), end.to_string());
        self.blocking(move |this| {
            let (tree, from) = this.place(&start);
            let keys = match this.place(&end) {
                (end_tree, to) if std::ptr::eq(end_tree, tree) => tree.range(from..to),
                _ => tree.range(from..),
            };
            let mut count = 0;
            for key in keys.keys() {
                key?;
                count += 1;
            }
            Ok((count, false))
        })
        .await
    }

    async fn range_first(
        &self,
        start: &str,
        end: &str,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let (start, end) = (start.to_string(), end.to_string());
        self.blocking(move |this| {
            let (tree, from) = this.place(&start);
            let (_, to) = this.place(&end);
            let values = tree.range(from..to).values().take(limit);
            let values: Result<Vec<Vec<u8>>, sled::Error> =
                values.map(|value| Ok(value?.to_vec())).collect();
            Ok((values?, false))
        })
        .await
    }

    async fn swap(
        &self,
        key: &str,
        expected: Option<&Version>,
        value: Vec<u8>,
        // One control plane: it always leads.
        _fence: Option<&Fence>,
    ) -> Result<bool, StoreError> {
        let key = key.to_string();
        let expected = match expected {
            Some(Version::Value(old)) => Some(old.clone()),
            Some(Version::Revision(_)) => unreachable!("sled's versions are values"),
            None => None,
        };
        self.blocking(move |this| {
            let (tree, key) = this.place(&key);
            let swapped = tree.compare_and_swap(key, expected, Some(value))?.is_ok();
            Ok((swapped, swapped))
        })
        .await
    }

    async fn put_absent(
        &self,
        entries: Vec<(String, Vec<u8>)>,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        // Flushed even when every key was there: the request that put them may still be
        // waiting for its flush, and this one must not be answered before it.
        self.blocking(move |this| {
            let mut kept = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                let (tree, key) = this.place(&key);
                kept.push(
                    match tree.compare_and_swap(key, None as Option<&[u8]>, Some(value))? {
                        Ok(()) => None,
                        Err(there) => Some(there.current.map(|v| v.to_vec()).unwrap_or_default()),
                    },
                );
            }
            Ok((kept, true))
        })
        .await
    }

    async fn range_last(&self, start: &str, end: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (start, end) = (start.to_string(), end.to_string());
        self.blocking(move |this| {
            let (tree, from) = this.place(&start);
            let (_, to) = this.place(&end);
            let last = tree.range(from..to).values().next_back().transpose()?;
            Ok((last.map(|value| value.to_vec()), false))
        })
        .await
    }

    async fn replace_range(
        &self,
        start: &str,
        end: &str,
        entries: Vec<(String, Vec<u8>)>,
        _fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        // One process writes a sled store (no fence to check): the batch is atomic.
        let (start, end) = (start.to_string(), end.to_string());
        self.blocking(move |this| {
            let (tree, from) = this.place(&start);
            let (_, to) = this.place(&end);
            let mut batch = sled::Batch::default();
            for key in tree.range(from..to).keys() {
                batch.remove(key?);
            }
            for (key, value) in entries {
                let (_, key) = this.place(&key);
                batch.insert(key.as_bytes(), value);
            }
            tree.apply_batch(batch)?;
            Ok(((), true))
        })
        .await
    }

    async fn dump(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.blocking(|this| {
            let mut all = Vec::new();
            for (key, value) in this.store.db().iter().collect::<Result<Vec<_>, _>>()? {
                all.push((String::from_utf8_lossy(&key).into_owned(), value.to_vec()));
            }
            for (name, tree) in TREES.iter().zip(&this.trees) {
                for (key, value) in tree.iter().collect::<Result<Vec<_>, _>>()? {
                    let key = format!("{name}/{}", String::from_utf8_lossy(&key));
                    all.push((key, value.to_vec()));
                }
            }
            Ok((all, false))
        })
        .await
    }

    fn follow_changes(&self, _prefixes: Vec<String>, _changed: super::OnChange) {}

    fn etcd(&self) -> Option<(etcd_client::Client, String)> {
        None
    }
}
