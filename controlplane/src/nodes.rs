//! Node tokens: how a node proves which queue it runs when it reports.
//!
//! A node's token is HMAC-SHA256(secret, "QUEUE-ID/N"), the secret being 32 random bytes made
//! once in the data directory and N the queue's credential number. Only N is stored, a token
//! is checked by computing it again (in constant time), a token for one queue is worthless for
//! another, a rotation (N moving on) retires the old token, and a deleted queue's token stops
//! working at once.

use crate::model::queue::{Queue, Slot, Status};
use qe_shared::hmac::hmac_sha256;
use std::path::Path;
use subtle::ConstantTimeEq;

pub struct NodeTokens {
    secret: [u8; 32],
}

impl NodeTokens {
    /// Reads the secret from `path`, making it (readable by the owner only) the first time.
    /// A secret that is there but unreadable or damaged is an error naming the file, never
    /// replaced: a new one would silently void every node's credential. It is made whole
    /// beside and linked into place, so two control planes starting at once on one data
    /// directory end up with the same one, and a crash never leaves half of one.
    pub fn open(path: &Path) -> std::io::Result<NodeTokens> {
        let named = |error: std::io::Error| {
            std::io::Error::new(error.kind(), format!("{}: {error}", path.display()))
        };
        match std::fs::read(path) {
            Ok(bytes) => return NodeTokens::from_file(path, bytes),
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(named(error)),
            Err(_) => {}
        }
        let secret = qe_shared::random::bytes::<32>();
        let beside = path.with_extension(format!("new-{}", std::process::id()));
        crate::write_private(&beside, &secret).map_err(named)?;
        let linked = std::fs::hard_link(&beside, path);
        std::fs::remove_file(&beside).map_err(named)?;
        match linked {
            Ok(()) => {
                crate::sync_dir(path).map_err(named)?;
                Ok(NodeTokens { secret })
            }
            // Another made it first: that one is the secret.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                NodeTokens::from_file(path, std::fs::read(path).map_err(named)?)
            }
            Err(error) => Err(named(error)),
        }
    }

    /// The secret every replica on a shared store uses: the store's, made by the first
    /// replica that found none.
    pub async fn shared(store: &crate::store::Store) -> Result<NodeTokens, String> {
        let made = qe_shared::random::bytes::<32>();
        let kept = store
            .node_secret(made.to_vec())
            .await
            .map_err(|e| e.to_string())?;
        let secret = kept.try_into().map_err(|bytes: Vec<u8>| {
            format!(
                "the store's node secret is damaged ({} bytes); restore it from a backup",
                bytes.len()
            )
        })?;
        Ok(NodeTokens { secret })
    }

    fn from_file(path: &Path, bytes: Vec<u8>) -> std::io::Result<NodeTokens> {
        let secret = bytes.try_into().map_err(|bytes: Vec<u8>| {
            let what = format!(
                "{}: damaged: {} bytes where a 32-byte node secret belongs; restore it from a \
                 backup (a new one would void every node's credential)",
                path.display(),
                bytes.len()
            );
            std::io::Error::new(std::io::ErrorKind::InvalidData, what)
        })?;
        Ok(NodeTokens { secret })
    }

    /// The secret of SQS access key `access_key_id` of queue `queue_id`: derived, never kept,
    /// so it can be shown once and given to the node without resting in the store.
    pub fn sqs_secret(&self, queue_id: &str, access_key_id: &str) -> String {
        use base64::Engine;
        let mac = hmac_sha256(
            &self.secret,
            format!("sqs-key/{queue_id}/{access_key_id}").as_bytes(),
        );
        base64::engine::general_purpose::STANDARD.encode(&mac[..30])
    }

    /// The secret of SQS access key `access_key_id` of account `account_id`, derived as
    /// [`NodeTokens::sqs_secret`] (another label: never a queue key's).
    pub fn account_sqs_secret(&self, account_id: &str, access_key_id: &str) -> String {
        use base64::Engine;
        let mac = hmac_sha256(
            &self.secret,
            format!("account-sqs-key/{account_id}/{access_key_id}").as_bytes(),
        );
        base64::engine::general_purpose::STANDARD.encode(&mac[..30])
    }

    /// The key queue `queue_id`'s standby gives its primary on `/replicate`: derived, never
    /// kept, as the SQS secrets are. The primary's config carries only its hash; the provider
    /// hands the key itself to the standby it starts.
    pub fn replication_key(&self, queue_id: &str) -> String {
        qe_shared::hex(&hmac_sha256(
            &self.secret,
            format!("replication/{queue_id}").as_bytes(),
        ))
    }

    /// The token of credential number `credential` of queue `queue_id`.
    pub fn token_for(&self, queue_id: &str, credential: u64) -> String {
        qe_shared::hex(&hmac_sha256(
            &self.secret,
            format!("{queue_id}/{credential}").as_bytes(),
        ))
    }

    /// The token of credential number `credential` of queue `queue_id`'s second machine
    /// ([`Slot::Second`]): another label, so it is never the first's, and one machine's
    /// request is never taken for the other's.
    pub fn second_token_for(&self, queue_id: &str, credential: u64) -> String {
        qe_shared::hex(&hmac_sha256(
            &self.secret,
            format!("second/{queue_id}/{credential}").as_bytes(),
        ))
    }

    /// The token of credential number `credential` of `queue_id`'s machine in `slot`.
    pub fn token_of(&self, queue_id: &str, slot: Slot, credential: u64) -> String {
        match slot {
            Slot::First => self.token_for(queue_id, credential),
            Slot::Second => self.second_token_for(queue_id, credential),
        }
    }

    /// The credential number `presented` is for `queue`: its current one, or the one being
    /// rotated in. None for any other token, and for a queue that is deleted.
    pub fn check(&self, queue: &Queue, presented: &str) -> Option<u64> {
        self.check_in(queue, presented, Slot::First)
    }

    /// Which of `queue`'s machines `presented` is the credential of, and its number: the
    /// first's, or (a queue with a standby) the second's. Which one serves is the record's
    /// ([`Queue::serving`]).
    pub fn check_slot(&self, queue: &Queue, presented: &str) -> Option<(Slot, u64)> {
        let node = self.check_in(queue, presented, Slot::First);
        let standby = match queue.replicas == 2 {
            true => self.check_in(queue, presented, Slot::Second),
            false => None,
        };
        match (node, standby) {
            (Some(credential), _) => Some((Slot::First, credential)),
            (None, Some(credential)) => Some((Slot::Second, credential)),
            (None, None) => None,
        }
    }

    /// The credential of `slot` of `queue` that `presented` is.
    fn check_in(&self, queue: &Queue, presented: &str, slot: Slot) -> Option<u64> {
        if queue.status == Status::Deleted {
            return None;
        }
        let (current_credential, next_credential) = queue.credential_of(slot);
        let matches = |credential: u64| -> bool {
            let expected = self.token_of(&queue.id, slot, credential);
            expected.as_bytes().ct_eq(presented.as_bytes()).into()
        };
        // Both are computed and compared, so the time taken does not tell which one matched.
        let current = matches(current_credential);
        let next = next_credential.map(|next| (next, matches(next)));
        match (current, next) {
            (_, Some((next, true))) => Some(next),
            (true, _) => Some(current_credential),
            _ => None,
        }
    }
}

/// A cloud node's bootstrap token: `ISSUED_MS.MAC`, MAC = HMAC-SHA256(secret,
/// "bootstrap/QUEUE-ID/ISSUED_MS"). Nothing is stored when one is made: its queue and time
/// are checked by computing the MAC again, and its one use is kept as a time in the queue's
/// record (`api/bootstrap.rs`).
impl NodeTokens {
    /// The bootstrap token of queue `queue_id` issued at `issued_ms`.
    pub fn bootstrap_token(&self, queue_id: &str, issued_ms: u64) -> String {
        let mac = hmac_sha256(
            &self.secret,
            format!("bootstrap/{queue_id}/{issued_ms}").as_bytes(),
        );
        format!("{issued_ms}.{}", qe_shared::hex(&mac))
    }

    /// The bootstrap token of queue `queue_id`'s second machine issued at `issued_ms`:
    /// another label, so it exchanges only for that machine's credential.
    pub fn second_bootstrap_token(&self, queue_id: &str, issued_ms: u64) -> String {
        let mac = hmac_sha256(
            &self.secret,
            format!("second-bootstrap/{queue_id}/{issued_ms}").as_bytes(),
        );
        format!("{issued_ms}.{}", qe_shared::hex(&mac))
    }

    /// When `presented` was issued, if it is a bootstrap token of queue `queue_id` made with
    /// this secret (compared in constant time).
    pub fn bootstrap_issued(&self, queue_id: &str, presented: &str) -> Option<u64> {
        self.bootstrap_issued_in(queue_id, presented, Slot::First)
    }

    /// When `presented` was issued, if it is a bootstrap token of `slot` of queue `queue_id`.
    pub fn bootstrap_issued_in(&self, queue_id: &str, presented: &str, slot: Slot) -> Option<u64> {
        let (issued, _) = presented.split_once('.')?;
        let issued_ms: u64 = issued.parse().ok()?;
        let expected = match slot {
            Slot::First => self.bootstrap_token(queue_id, issued_ms),
            Slot::Second => self.second_bootstrap_token(queue_id, issued_ms),
        };
        bool::from(expected.as_bytes().ct_eq(presented.as_bytes())).then_some(issued_ms)
    }
}

/// The most credentials of one queue tried when a node's credential is looked for: a queue
/// is rotated far fewer times than this in its life.
pub const CREDENTIALS_TRIED: u64 = 4096;
/// After a restore, how many credentials past the one its record knows a known queue's node
/// may present (rotations made after the backup): few, as each refused token costs this many
/// HMACs.
pub const ROTATIONS_AFTER_A_BACKUP: u64 = 64;

impl NodeTokens {
    /// Which machine's credential of queue `queue_id` `presented` is, and which one, among
    /// each slot's first [`CREDENTIALS_TRIED`]: a node whose queue the store does not know (it
    /// was made after the backup the store was restored from) presents one of them, the second
    /// slot's if its standby's machine was promoted. Every candidate is computed and compared
    /// in full.
    pub fn credential_of(&self, queue_id: &str, presented: &str) -> Option<(Slot, u64)> {
        let first = self.credential_among(queue_id, presented, Slot::First, 0..CREDENTIALS_TRIED);
        let second = self.credential_among(queue_id, presented, Slot::Second, 0..CREDENTIALS_TRIED);
        let first = first.map(|credential| (Slot::First, credential));
        first.or(second.map(|credential| (Slot::Second, credential)))
    }

    /// Which of the credentials `among` of `queue_id`'s machine in `slot` `presented` is.
    pub fn credential_among(
        &self,
        queue_id: &str,
        presented: &str,
        slot: Slot,
        among: std::ops::Range<u64>,
    ) -> Option<u64> {
        let mut found = None;
        for credential in among {
            let expected = self.token_of(queue_id, slot, credential);
            if bool::from(expected.as_bytes().ct_eq(presented.as_bytes())) {
                found = Some(credential);
            }
        }
        found
    }
}

/// What nodes are told to start from: the control plane's addresses as nodes reach it, the
/// root they trust for it, and their credentials.
pub struct Bootstraps {
    /// Its base URLs for nodes, one per replica, the preferred first; never empty
    /// (`http://127.0.0.1:PORT` for local nodes, `https://` with `[api_tls]`, or the public
    /// URLs cloud nodes reach).
    pub urls: Vec<String>,
    /// The root that signs its HTTPS certificate, when it is a private one (PEM).
    pub ca_pem: Option<String>,
    pub tokens: std::sync::Arc<NodeTokens>,
}

impl Bootstraps {
    /// The bootstrap of `queue`'s node (the machine that serves, [`Queue::serving`]): its
    /// credential as it is now, and a bootstrap token issued now (for a cloud node's user data,
    /// which carries that one only). The replicas are listed only when there are several: a
    /// bootstrap for one reads as before, also to nodes that know no replicas.
    pub fn for_queue(&self, queue: &Queue) -> qe_shared::node_channel::Bootstrap {
        self.for_slot(queue, queue.serving)
    }

    /// The bootstrap of `queue`'s standby's machine (the one that does not serve).
    pub fn for_standby(&self, queue: &Queue) -> qe_shared::node_channel::Bootstrap {
        self.for_slot(queue, queue.serving.other())
    }

    /// The bootstrap of `queue`'s machine in `slot`: its own credential and bootstrap token,
    /// which the control plane tells from the other's.
    fn for_slot(&self, queue: &Queue, slot: Slot) -> qe_shared::node_channel::Bootstrap {
        let control_planes = if self.urls.len() > 1 {
            self.urls.clone()
        } else {
            Vec::new()
        };
        let (id, issued_ms) = (&queue.id, qe_shared::clock::now_ms());
        let node_token = self.tokens.token_of(id, slot, queue.credential_of(slot).0);
        let bootstrap_token = match slot {
            Slot::First => self.tokens.bootstrap_token(id, issued_ms),
            Slot::Second => self.tokens.second_bootstrap_token(id, issued_ms),
        };
        qe_shared::node_channel::Bootstrap {
            control_plane: self.urls[0].clone(),
            control_planes,
            queue_id: queue.id.clone(),
            node_token,
            bootstrap_token: Some(bootstrap_token),
            control_plane_ca_pem: self.ca_pem.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stray's credential is found whichever of its queue's machines it is: the second's
    /// has its own label, and is told from the first's.
    #[test]
    fn a_strays_credential_is_found_for_either_machine() {
        let tokens = NodeTokens { secret: [9; 32] };
        let first = tokens.token_of("q", Slot::First, 12);
        let second = tokens.token_of("q", Slot::Second, 40);
        assert_eq!(tokens.credential_of("q", &first), Some((Slot::First, 12)));
        assert_eq!(tokens.credential_of("q", &second), Some((Slot::Second, 40)));
        assert_eq!(tokens.credential_of("other", &second), None);
        let past = tokens.token_of("q", Slot::Second, CREDENTIALS_TRIED);
        assert_eq!(tokens.credential_of("q", &past), None, "past those tried");
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2_shape_and_tokens_are_per_queue() {
        // RFC 4231 test case 2 uses a 4-byte key "Jefe"; zero-padded to 32 bytes it is the
        // same HMAC key (keys shorter than the block are zero-padded).
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let mac = hmac_sha256(&key, b"what do ya want for nothing?");
        let hex = qe_shared::hex(&mac);
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let tokens = NodeTokens { secret: [7; 32] };
        let new = crate::model::queue::NewQueue {
            tier: crate::model::queue::Tier::Devtest,
            region: "r".into(),
            instance_type: "t".into(),
            ipv4: false,
            account: None,
            ..Default::default()
        };
        let (mut a, _) = crate::model::queue::create(new.clone());
        let (b, _) = crate::model::queue::create(new);
        let token = tokens.token_for(&a.id, 0);
        assert_eq!(tokens.check(&a, &token), Some(0));
        assert_eq!(tokens.check(&b, &token), None, "another queue's");
        assert_eq!(tokens.check(&a, &token[..63]), None);
        // A rotation: both work until the node uses the new one; then only the new one.
        a.next_node_credential = Some(1);
        let rotated = tokens.token_for(&a.id, 1);
        assert_eq!(tokens.check(&a, &token), Some(0));
        assert_eq!(tokens.check(&a, &rotated), Some(1));
        a.node_credential = 1;
        a.next_node_credential = None;
        assert_eq!(tokens.check(&a, &token), None, "retired");
        a.status = Status::Deleted;
        assert_eq!(tokens.check(&a, &rotated), None, "a deleted queue's");
    }

    #[test]
    fn a_standbys_credentials_are_its_own_and_only_a_replicated_queues() {
        let tokens = NodeTokens { secret: [7; 32] };
        let new = crate::model::queue::NewQueue {
            tier: crate::model::queue::Tier::Standard,
            region: "r".into(),
            instance_type: "t".into(),
            ..Default::default()
        };
        let (mut queue, _) = crate::model::queue::create(new);
        let node = tokens.token_for(&queue.id, 0);
        let standby = tokens.second_token_for(&queue.id, 0);
        assert_ne!(node, standby);
        assert_eq!(
            tokens.check_slot(&queue, &standby),
            None,
            "one replica: no standby"
        );
        queue.replicas = 2;
        assert_eq!(tokens.check_slot(&queue, &node), Some((Slot::First, 0)));
        assert_eq!(tokens.check_slot(&queue, &standby), Some((Slot::Second, 0)));
        assert_eq!(
            tokens.check(&queue, &standby),
            None,
            "never taken for the node's"
        );
        // Bootstrap tokens likewise: a standby's never exchanges for the node's credential.
        let issued = tokens.second_bootstrap_token(&queue.id, 1_700_000_000_000);
        assert_eq!(tokens.bootstrap_issued(&queue.id, &issued), None);
        let standby_issued = tokens.bootstrap_issued_in(&queue.id, &issued, Slot::Second);
        assert_eq!(standby_issued, Some(1_700_000_000_000));
        let node_issued = tokens.bootstrap_token(&queue.id, 1_700_000_000_000);
        assert_eq!(
            tokens.bootstrap_issued_in(&queue.id, &node_issued, Slot::Second),
            None
        );
    }

    #[test]
    fn a_bootstrap_token_names_its_queue_and_time_and_nothing_else() {
        let tokens = NodeTokens { secret: [7; 32] };
        let token = tokens.bootstrap_token("q1", 1_700_000_000_123);
        assert_eq!(
            tokens.bootstrap_issued("q1", &token),
            Some(1_700_000_000_123)
        );
        assert_eq!(
            tokens.bootstrap_issued("q2", &token),
            None,
            "another queue's"
        );
        let later = token.replacen("1700000000123", "1700000000999", 1);
        assert_eq!(
            tokens.bootstrap_issued("q1", &later),
            None,
            "its time is signed"
        );
        assert_eq!(
            tokens.bootstrap_issued("q1", &tokens.token_for("q1", 0)),
            None
        );
        let other = NodeTokens { secret: [8; 32] };
        assert_eq!(
            other.bootstrap_issued("q1", &token),
            None,
            "another secret's"
        );
    }
}
