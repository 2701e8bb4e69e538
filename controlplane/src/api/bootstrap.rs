//! `POST /v1/nodes/{id}/bootstrap`: a cloud node's first boot trades its bootstrap token for
//! its node token. The user data EC2 keeps for an instance can be read back through EC2's
//! API by anyone allowed `ec2:DescribeInstanceAttribute`, so it carries nothing that is worth
//! anything later: a bootstrap token ([`crate::nodes::NodeTokens::bootstrap_token`]) is good
//! once, for `bootstrap_token_valid_secs` from its launch, and only when the instance its
//! node names is one of the queue's live instances as EC2 says now. Using it spends it and
//! every older one of that queue (the queue's record keeps the newest time spent). The node
//! keeps the node token it gets on its volume, 0600 (`DATA_DIR/node-token`).
//!
//! A refusal of a token this control plane made (spent, expired, another instance) is
//! audited: someone else may hold it. A token it never made is a plain 401, unaudited.

use super::extract::{Json, Path};
use super::{ApiError, AppState};
use crate::model::audit::{self, Actor, Entry, Target};
use crate::model::queue::Slot;
use crate::model::queue::{Queue, Status};
use crate::store::StoreError;
use axum::extract::State;
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exchange {
    /// The instance the node runs on, as its instance metadata says (`i-…`).
    instance_id: String,
}

/// Why a bootstrap token this control plane made is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It, or a newer one of its queue, was used already.
    Spent,
    /// Its time is up.
    Expired,
    /// The instance that presents it is not one of its queue's.
    NotItsInstance,
}

impl Refusal {
    fn reason(self) -> &'static str {
        match self {
            Refusal::Spent => "the bootstrap token was used already",
            Refusal::Expired => "the bootstrap token has expired",
            Refusal::NotItsInstance => "the bootstrap token was presented by another instance",
        }
    }
}

/// Whether a token issued at `issued_ms` may be used at `now_ms`, for `valid_for_ms`, when
/// its queue's newest spent token was issued at `spent_ms` (0: none).
pub fn judge(issued_ms: u64, now_ms: u64, valid_for_ms: u64, spent_ms: u64) -> Result<(), Refusal> {
    if issued_ms <= spent_ms {
        return Err(Refusal::Spent);
    }
    if now_ms >= issued_ms.saturating_add(valid_for_ms) {
        return Err(Refusal::Expired);
    }
    Ok(())
}

pub async fn exchange(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(asked): Json<Exchange>,
) -> Result<Json<Value>, ApiError> {
    let presented = super::bearer(&headers);
    let queue = state.store.get(&id).await?;
    let (mut queue, slot, issued_ms) = match queue {
        Some(queue) if queue.status != Status::Deleted => match issued(&state, &queue, presented) {
            Some((slot, issued_ms)) => (queue, slot, issued_ms),
            None => return Err(super::unauthorized(presented)),
        },
        _ => return Err(super::unauthorized(presented)),
    };
    let valid_for_ms = state.config.bootstrap_token_valid_secs.saturating_mul(1000);
    let judged = judge(
        issued_ms,
        audit::now_ms(),
        valid_for_ms,
        *spent(&mut queue, slot),
    );
    if let Err(refusal) = judged {
        return Err(refuse(&state, &queue, &asked.instance_id, refusal).await);
    }
    let its_own = state
        .fleet
        .is_instance_of(&queue, &asked.instance_id, slot)
        .await;
    if !its_own.map_err(|e| ApiError::Unavailable(e.to_string()))? {
        return Err(refuse(&state, &queue, &asked.instance_id, Refusal::NotItsInstance).await);
    }
    // Spent as one compare-and-swap: of two uses at once, one finds it spent.
    let spend = state.store.update(&id, |queue| {
        let spent = spent(queue, slot);
        judge(issued_ms, audit::now_ms(), valid_for_ms, *spent)?;
        *spent = issued_ms;
        Ok::<_, Spend>(())
    });
    let queue = match spend.await {
        Ok(Some((queue, ()))) => queue,
        Ok(None) => return Err(super::unauthorized(presented)),
        Err(Spend::Refused(refusal)) => {
            return Err(refuse(&state, &queue, &asked.instance_id, refusal).await)
        }
        Err(Spend::Store(error)) => return Err(error.into()),
    };
    let entry = Entry::new(
        node_of(&queue),
        audit::NODE_BOOTSTRAP,
        target_of(&queue),
        200,
    )
    .because(&format!("instance {}", asked.instance_id));
    state.store.record_audit(entry).await;
    tracing::info!(queue = %queue.id, instance = %asked.instance_id, "a node exchanged its bootstrap token");
    let credential = queue.credential_of(slot).0;
    let node_token = state.node_tokens.token_of(&queue.id, slot, credential);
    Ok(Json(json!({ "node_token": node_token })))
}

/// Which of `queue`'s instances `presented` is a bootstrap token of (a standby's only for a
/// queue with one), and when it was issued.
fn issued(state: &AppState, queue: &Queue, presented: &str) -> Option<(Slot, u64)> {
    let tokens = &state.node_tokens;
    if let Some(issued_ms) = tokens.bootstrap_issued_in(&queue.id, presented, Slot::First) {
        return Some((Slot::First, issued_ms));
    }
    let standby = tokens.bootstrap_issued_in(&queue.id, presented, Slot::Second);
    standby
        .filter(|_| queue.replicas == 2)
        .map(|issued_ms| (Slot::Second, issued_ms))
}

/// When the newest bootstrap token of `slot` of `queue` exchanged was issued: each instance
/// has its own, so the two may boot in either order.
fn spent(queue: &mut Queue, slot: Slot) -> &mut u64 {
    match slot {
        Slot::First => &mut queue.bootstrap_spent_ms,
        Slot::Second => &mut queue.second_bootstrap_spent_ms,
    }
}

enum Spend {
    Refused(Refusal),
    Store(StoreError),
}

impl From<Refusal> for Spend {
    fn from(refusal: Refusal) -> Spend {
        Spend::Refused(refusal)
    }
}

impl From<StoreError> for Spend {
    fn from(error: StoreError) -> Spend {
        Spend::Store(error)
    }
}

/// Audits and logs a refused token of `queue`, presented as instance `instance_id`.
async fn refuse(state: &AppState, queue: &Queue, instance_id: &str, refusal: Refusal) -> ApiError {
    tracing::warn!(queue = %queue.id, instance = %instance_id, reason = refusal.reason(), "a bootstrap token was refused");
    let reason = format!("{} (instance {instance_id})", refusal.reason());
    let entry = Entry::new(
        node_of(queue),
        audit::NODE_BOOTSTRAP_REFUSED,
        target_of(queue),
        401,
    )
    .because(&reason);
    state.store.record_audit(entry).await;
    ApiError::Unauthorized { token_given: true }
}

fn node_of(queue: &Queue) -> Actor {
    Actor::Node {
        queue: queue.id.clone(),
    }
}

fn target_of(queue: &Queue) -> Target {
    Target {
        id: queue.id.clone(),
        account: queue.account.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bootstrap_token_is_good_once_and_for_its_time() {
        let valid_for = 900_000;
        assert_eq!(judge(1_000, 1_000, valid_for, 0), Ok(()));
        assert_eq!(judge(1_000, 900_999, valid_for, 0), Ok(()));
        assert_eq!(judge(1_000, 901_000, valid_for, 0), Err(Refusal::Expired));
        // Used once: never again, nor any older one of its queue.
        assert_eq!(judge(1_000, 2_000, valid_for, 1_000), Err(Refusal::Spent));
        assert_eq!(judge(999, 2_000, valid_for, 1_000), Err(Refusal::Spent));
        // A newer one (a replacement instance's) still is.
        assert_eq!(judge(1_001, 2_000, valid_for, 1_000), Ok(()));
    }
}
