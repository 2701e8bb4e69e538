//! Node builds and their rollouts in the store.
//!
//! - `builds/SHA256`: a published [`Build`] (its file is in `DATA_DIR/builds/` of the
//!   replica it was published to);
//! - `rollouts/ID`: a [`Rollout`], ids in time order, changed only by compare-and-swap.

use super::{end_of, Store, StoreError};
use crate::model::build::Build;
use crate::model::rollout::Rollout;

const BUILDS: &str = "builds/";
const ROLLOUTS: &str = "rollouts/";

impl Store {
    /// Keeps a published build's record (publishing one again replaces it).
    pub async fn put_build(&self, build: &Build) -> Result<(), StoreError> {
        let key = format!("{BUILDS}{}", build.sha256);
        self.put_value(&key, serde_json::to_vec(build)?).await
    }

    pub async fn build(&self, sha256: &str) -> Result<Option<Build>, StoreError> {
        self.get_json(&format!("{BUILDS}{sha256}")).await
    }

    pub async fn builds(&self) -> Result<Vec<Build>, StoreError> {
        self.list_json(BUILDS).await
    }

    /// Saves a new rollout; `false` if one with its id exists.
    pub async fn put_rollout(&self, rollout: &Rollout) -> Result<bool, StoreError> {
        let key = format!("{ROLLOUTS}{}", rollout.id);
        let value = serde_json::to_vec(rollout)?;
        self.kv.swap(&key, None, value, self.fence.as_ref()).await
    }

    pub async fn rollout(&self, id: &str) -> Result<Option<Rollout>, StoreError> {
        self.get_json(&format!("{ROLLOUTS}{id}")).await
    }

    /// The newest rollout: the only one that may be rolling or halted (a new one is refused
    /// while one is), read alone (a rollout holds a step per queue).
    pub async fn newest_rollout(&self) -> Result<Option<Rollout>, StoreError> {
        match self.kv.range_last(ROLLOUTS, &end_of(ROLLOUTS)).await? {
            Some(value) => Ok(Some(serde_json::from_slice(&value)?)),
            None => Ok(None),
        }
    }

    /// Every rollout, oldest first.
    pub async fn rollouts(&self) -> Result<Vec<Rollout>, StoreError> {
        self.list_json(ROLLOUTS).await
    }

    /// Forgets the rollouts older than rollout `id`.
    pub async fn forget_rollouts_before(&self, id: &str) -> Result<(), StoreError> {
        let end = format!("{ROLLOUTS}{id}");
        self.kv
            .replace_range(ROLLOUTS, &end, Vec::new(), self.fence.as_ref())
            .await
    }

    /// Changes rollout `id` with `change` as one compare-and-swap (see [`Store::update`]).
    pub async fn update_rollout<T, E: From<StoreError>>(
        &self,
        id: &str,
        change: impl FnMut(&mut Rollout) -> Result<T, E>,
    ) -> Result<Option<(Rollout, T)>, E> {
        let updated = self.swap_json(&format!("{ROLLOUTS}{id}"), change).await?;
        Ok(updated.map(|(rollout, answer, _)| (rollout, answer)))
    }
}
