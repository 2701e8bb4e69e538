//! Which DNS-01 values each replica's DNS serves. Every replica serves the zone from the
//! store, following its changes, so a value the leader publishes reaches each replica's zone a
//! moment later, and the CA may ask any of them (the zone's NS records name them all). An
//! order tells the CA to validate only once every live replica says it serves the order's
//! values (`certificates/acme.rs`).
//!
//! Each replica says so under `served/REPLICA` in the store: the values its zone serves, and
//! when it said it. It says it at once when they change and every [`SAY_AGAIN_EVERY`]
//! besides, so a replica that stopped saying (one that died) is not waited for once
//! [`ALIVE_WITHIN`] has passed.

use super::Zone;
pub use crate::model::served::Served;
use crate::store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// How often a replica says what it serves, changed or not: one small write per replica
/// every two seconds.
const SAY_AGAIN_EVERY: Duration = Duration::from_secs(2);
/// A replica that said nothing for this long is taken for gone, and not waited for: an order
/// made just after a replica died waits this long at most.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(5);
/// How often a wait reads what the replicas said.
const LOOK_AGAIN_EVERY: Duration = Duration::from_millis(50);

/// Runs on every replica for the life of the process: says what `zone` serves, as
/// `replica`, whenever that changes and every [`SAY_AGAIN_EVERY`].
pub async fn tell(zone: Arc<Zone>, store: Store, replica: String) {
    let mut built = zone.builds();
    let mut said: Option<Vec<(String, String)>> = None;
    let mut said_at = tokio::time::Instant::now();
    loop {
        let serving = zone.challenges();
        if said.as_ref() != Some(&serving) || said_at.elapsed() >= SAY_AGAIN_EVERY {
            let served = Served {
                replica: replica.clone(),
                at_ms: crate::live::now_ms(),
                challenges: serving.clone(),
            };
            match store.put_served(&served).await {
                Ok(()) => {
                    said = Some(serving);
                    said_at = tokio::time::Instant::now();
                }
                Err(error) => {
                    tracing::warn!(%error, "what this replica's DNS serves could not be said")
                }
            }
        }
        tokio::select! {
            _ = built.changed() => {}
            _ = tokio::time::sleep(SAY_AGAIN_EVERY) => {}
        }
    }
}

/// Why a wait for the values ended without them served everywhere.
#[derive(Debug, thiserror::Error)]
pub enum NotServed {
    #[error("the replicas {0:?} did not serve the DNS-01 values within {1:?}")]
    Missing(Vec<String>, Duration),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Returns once every live replica says it serves all of `values` (the number of live
/// replicas), or fails after `within`.
pub async fn until_served_everywhere(
    store: &Store,
    values: &[(String, String)],
    within: Duration,
) -> Result<usize, NotServed> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let said = store.served().await?;
        let alive = alive(&said, crate::live::now_ms());
        let missing = missing(&alive, values);
        if missing.is_empty() {
            return Ok(alive.len());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(NotServed::Missing(missing, within));
        }
        tokio::time::sleep(LOOK_AGAIN_EVERY).await;
    }
}

/// What the replicas alive at `now_ms` said: those that said it within [`ALIVE_WITHIN`].
fn alive(said: &[Served], now_ms: u64) -> Vec<&Served> {
    let alive_since = now_ms.saturating_sub(ALIVE_WITHIN.as_millis() as u64);
    said.iter()
        .filter(|served| served.at_ms >= alive_since)
        .collect()
}

/// The replicas of `alive` that do not serve all of `values`.
fn missing(alive: &[&Served], values: &[(String, String)]) -> Vec<String> {
    alive
        .iter()
        .filter(|served| !values.iter().all(|v| served.challenges.contains(v)))
        .map(|served| served.replica.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(replica: &str, at_ms: u64, values: &[(&str, &str)]) -> Served {
        let challenges = values
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        Served {
            replica: replica.to_string(),
            at_ms,
            challenges,
        }
    }

    #[test]
    fn every_live_replica_must_serve_every_value_and_a_silent_one_is_not_waited_for() {
        let values = [("a.q".to_string(), "v1".to_string())];
        let now = 100_000;
        let all = [
            said("serves", now - 1_000, &[("a.q", "v1"), ("b.q", "v2")]),
            said("behind", now - 1_000, &[]),
            said("gone", now - 5_001, &[]),
        ];
        let alive = alive(&all, now);
        assert_eq!(alive.len(), 2, "the one silent for 5 s is gone");
        assert_eq!(missing(&alive, &values), ["behind"]);
        assert!(missing(&alive[..1], &values).is_empty());
    }
}
