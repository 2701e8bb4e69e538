//! The audit log: who changed what, when, and how it went.
//!
//! Every request that may change something (any method but `GET` and `HEAD`) from a caller
//! whose token was accepted is recorded once it is answered: the time, the actor (the
//! operator, or an account and its key), the action (named by the route), the target and the
//! HTTP status. A refused one (4xx) is counted (`qe_api_refused_changes_total`), not kept, and
//! a request without a valid token is not recorded: no caller can make the log grow by being
//! refused. Entries older than `audit_keep_days` go (`rollup.rs`). Entries are keyed by a cursor that sorts by time, so
//! `GET /v1/audit` pages through them in order.

use serde::{Deserialize, Serialize};

/// Who made a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Actor {
    Operator,
    Account {
        account: String,
        key: String,
    },
    /// A queue's node, with its own credential (it asked for its certificate).
    Node {
        queue: String,
    },
    /// The control plane on its own (a renewal falling due, a silent node replaced).
    #[serde(rename = "control-plane")]
    ControlPlane,
}

/// One change, as kept.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    /// Milliseconds since 1970 (20 digits), `-`, 8 random letters: sorts by time, unique.
    pub cursor: String,
    /// Milliseconds since 1970.
    pub time_ms: u64,
    pub actor: Actor,
    /// What was asked: `queue.create`, `key.revoke` ... ([`action_of`]).
    pub action: String,
    /// What it was done to: a queue, account or key id; empty when there is none.
    pub target: String,
    /// The account the change concerns (the actor's, or the one whose queue or key the
    /// operator changed), which sees the entry.
    pub account: Option<String>,
    /// `ok` for a 2xx status, else `refused` (4xx) or `failed` (5xx).
    pub result: String,
    pub status: u16,
    /// Why the control plane did it on its own (a node restarted: its binary changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Entry {
    pub fn new(actor: Actor, action: &str, target: Target, status: u16) -> Entry {
        let time_ms = now_ms();
        let account = target.account.or_else(|| match &actor {
            Actor::Account { account, .. } => Some(account.clone()),
            _ => None,
        });
        let result = match status {
            200..=299 => "ok",
            400..=499 => "refused",
            _ => "failed",
        };
        Entry {
            cursor: format!("{time_ms:020}-{}", qe_shared::random::label(8)),
            time_ms,
            actor,
            action: action.to_string(),
            target: target.id,
            account,
            result: result.into(),
            status,
            reason: None,
        }
    }

    /// The same, saying why.
    pub fn because(self, reason: &str) -> Entry {
        Entry {
            reason: Some(reason.to_string()),
            ..self
        }
    }
}

/// What a change was done to, as its handler tells the audit (a response extension): a new
/// queue's id is known only once it is made, and the account whose queue the operator
/// changed only once the queue is read.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub id: String,
    pub account: Option<String>,
}

/// The action a route and method stand for; `None` for one that changes nothing.
pub fn action_of(method: &str, route: &str) -> Option<&'static str> {
    let action = match (method, route) {
        ("GET" | "HEAD", _) => return None,
        ("POST", "/v1/queues") => "queue.create",
        ("DELETE", "/v1/queues/{id}") => "queue.delete",
        ("POST", "/v1/queues/{id}/logins/{role}/rotate") => "queue.login.rotate",
        ("POST", "/v1/queues/{id}/node-credential/rotate") => "queue.node-credential.rotate",
        ("POST", "/v1/queues/{id}/console-token") => CONSOLE_TOKEN,
        ("POST", "/v1/queues/{id}/sqs-keys") => "queue.sqs-key.create",
        ("DELETE", "/v1/queues/{id}/sqs-keys/{key}") => "queue.sqs-key.revoke",
        ("POST", "/v1/accounts") => "account.create",
        ("PATCH", "/v1/accounts/{id}") => "account.change",
        ("POST", "/v1/accounts/{id}/keys") => "key.create",
        ("DELETE", "/v1/accounts/{id}/keys/{key}") => "key.revoke",
        ("POST", "/v1/accounts/{id}/sqs-keys") => "account.sqs-key.create",
        ("DELETE", "/v1/accounts/{id}/sqs-keys/{key}") => "account.sqs-key.revoke",
        ("POST", "/v1/certificate/renew") => "certificate.renew",
        ("POST", "/v1/strays/{id}/adopt") => "queue.adopt",
        ("POST", "/v1/builds") => "build.publish",
        ("POST", "/v1/rollouts") => "rollout.start",
        ("POST", "/v1/rollouts/{id}/{action}") => "rollout.act",
        // A method a route does not take, or no route: still an attempt worth knowing of.
        _ => "other",
    };
    Some(action)
}

/// A console token was signed: audited as a change, though a read-only key may ask for one
/// (its token reads only).
pub const CONSOLE_TOKEN: &str = "queue.console-token";

/// A certificate was issued: a node's (for its CSR) or the cluster's wildcard (due, or
/// asked for). No caller's route: recorded where it happens.
pub const CERTIFICATE_ISSUE: &str = "certificate.issue";

/// A new queue failed: it was not running within `provision_within_secs`, or its provider
/// refused it for good (`reason` says which).
pub const QUEUE_FAIL: &str = "queue.fail";

/// A silent node was fenced and replaced by the control plane (`silence.rs`).
pub const NODE_REPLACE: &str = "node.replace";

/// A queue's standby was fenced and replaced by the control plane: its node had gone without
/// it for the silence limit (`reason` says how long).
pub const STANDBY_REPLACE: &str = "standby.replace";

/// A serving node was restarted by the control plane because it had to be: it reaches the
/// control plane otherwise, or runs another binary than the one configured (`reason` says
/// which).
pub const NODE_RESTART: &str = "node.restart";

/// A cloud node exchanged its bootstrap token for its node token (`api/bootstrap.rs`).
pub const NODE_BOOTSTRAP: &str = "node.bootstrap";

/// A bootstrap token of a queue was refused (spent, expired, or not presented by one of the
/// queue's instances): someone else may hold it; `reason` says which.
pub const NODE_BOOTSTRAP_REFUSED: &str = "node.bootstrap-refused";

pub use qe_shared::clock::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_belongs_to_its_actors_account_or_its_targets() {
        let by_account = Actor::Account {
            account: "aone".into(),
            key: "k".into(),
        };
        let entry = Entry::new(by_account, "queue.create", Target::default(), 201);
        assert_eq!(entry.account.as_deref(), Some("aone"));
        assert_eq!(entry.result, "ok");
        let target = Target {
            id: "q".into(),
            account: Some("atwo".into()),
        };
        let entry = Entry::new(Actor::Operator, "queue.delete", target, 404);
        assert_eq!(entry.account.as_deref(), Some("atwo"));
        assert_eq!(entry.result, "refused");
        let later = Entry::new(Actor::Operator, "x", Target::default(), 500);
        assert!(later.cursor > entry.cursor || later.time_ms == entry.time_ms);
        assert_eq!(later.result, "failed");
    }

    #[test]
    fn reads_change_nothing_and_every_change_has_a_name() {
        assert_eq!(action_of("GET", "/v1/queues"), None);
        assert_eq!(action_of("POST", "/v1/queues"), Some("queue.create"));
        assert_eq!(
            action_of("DELETE", "/v1/accounts/{id}/keys/{key}"),
            Some("key.revoke")
        );
        assert_eq!(action_of("PUT", "/v1/queues"), Some("other"));
    }
}
