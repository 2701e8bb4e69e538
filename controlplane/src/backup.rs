//! Backups of the control plane's state, the same for both stores: every key and value,
//! one JSON object per line, after a first line that says what the file is.
//!
//! `GET /v1/backup` (operator) writes one from a running control plane; `controlplane restore
//! --config FILE --from BACKUP` puts one into an empty store (sled or etcd) before the
//! control plane starts. The node secret goes with it (from the store, or from the sled
//! install's `node-secret` file), so the nodes that are running keep their credentials and
//! report to the restored control plane as they did; a backup of a sled install restores
//! into etcd too (the way from one host to several).

use crate::store::{Store, StoreError};
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The first line of a backup.
#[derive(Serialize, Deserialize)]
struct Header {
    /// Always [`FORMAT`].
    backup: String,
    /// When it was made, in seconds since 1970.
    created: u64,
    entries: usize,
    /// The zone's SOA serial then: a restored zone's serials go on past it, so that outside
    /// secondaries take the restored zone as newer.
    #[serde(default)]
    zone_serial: u64,
}

/// One key and its value (base64: values are bytes).
#[derive(Serialize, Deserialize)]
struct Entry {
    key: String,
    value: String,
}

const FORMAT: &str = "the-queue-expert-control-plane/1";
/// Keys and their values, as a backup holds them.
type Entries = Vec<(String, Vec<u8>)>;
/// Where the sled install keeps the node secret; in a backup and on etcd, under this key.
const NODE_SECRET_KEY: &str = "node-secret";

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a backup: line {line}: {why}")]
    Format { line: usize, why: String },
}

/// The whole state as a backup; the node secret from `node_secret_file` when the store does
/// not hold it (sled). `zone_serial`: the serial the zone serves now.
pub async fn make(
    store: &Store,
    node_secret_file: &Path,
    zone_serial: u32,
) -> Result<String, BackupError> {
    let mut entries = store.dump().await?;
    if !entries.iter().any(|(key, _)| key == NODE_SECRET_KEY) {
        if let Ok(secret) = std::fs::read(node_secret_file) {
            entries.push((NODE_SECRET_KEY.into(), secret));
        }
    }
    let header = Header {
        backup: FORMAT.into(),
        created: crate::unix_now(),
        entries: entries.len(),
        zone_serial: zone_serial.into(),
    };
    let mut text = serde_json::to_string(&header).expect("plain fields") + "\n";
    for (key, value) in entries {
        let value = base64::engine::general_purpose::STANDARD.encode(value);
        text += &(serde_json::to_string(&Entry { key, value }).expect("plain fields") + "\n");
    }
    Ok(text)
}

/// Puts `backup` into `store`, which must be empty of its keys; with sled the node secret
/// goes to `node_secret_file` (which must not exist), on etcd into the store. Returns how
/// many entries were restored.
pub async fn restore(
    store: &Store,
    backup: &str,
    node_secret_file: Option<&Path>,
) -> Result<usize, BackupError> {
    let (header, mut entries) = read(backup)?;
    // Checked before the node secret's file is written: a refused restore leaves nothing.
    if !store.is_empty().await? {
        return Err(StoreError::NotEmpty.into());
    }
    if let Some(file) = node_secret_file {
        if let Some(at) = entries.iter().position(|(key, _)| key == NODE_SECRET_KEY) {
            let (_, secret) = entries.remove(at);
            if file.exists() {
                return Err(BackupError::Io(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{}: restore into an empty data directory", file.display()),
                )));
            }
            crate::write_private(file, &secret)?;
        }
    }
    let moved_on = config_versions_past_any_served(&mut entries)?;
    tracing::info!(
        queues = moved_on,
        "config versions moved past any a node may serve"
    );
    let restored = entries.len();
    store
        .restore(entries, header.created, header.zone_serial)
        .await?;
    Ok(restored)
}

/// Moves every queue's config version past any its node may serve: a node that took changes
/// made after the backup serves a version the backup never had, and would wait for a newer
/// one while the restored control plane counted up to it again. From the restore's time in
/// milliseconds, far above any count of changes, every node takes the restored config (its
/// logins as they were at the backup) and every change after it. Returns how many queues.
fn config_versions_past_any_served(
    entries: &mut [(String, Vec<u8>)],
) -> Result<usize, BackupError> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    let mut moved = 0;
    for (key, value) in entries
        .iter_mut()
        .filter(|(key, _)| key.starts_with("queues/"))
    {
        let mut queue: crate::model::queue::Queue =
            serde_json::from_slice(value).map_err(|e| BackupError::Format {
                line: 0,
                why: format!("{key}: {e}"),
            })?;
        queue.config_version = queue.config_version.max(now_ms);
        *value = serde_json::to_vec(&queue).expect("a queue serializes");
        moved += 1;
    }
    Ok(moved)
}

/// A backup's header and entries, checked whole before any is restored.
fn read(backup: &str) -> Result<(Header, Entries), BackupError> {
    let fail = |line: usize, why: String| BackupError::Format { line, why };
    let mut lines = backup.lines();
    let header: Header = serde_json::from_str(lines.next().unwrap_or_default())
        .map_err(|e| fail(1, e.to_string()))?;
    if header.backup != FORMAT {
        return Err(fail(1, format!("{:?} is not {FORMAT:?}", header.backup)));
    }
    // The header's count is the file's word: a bound, not an allocation.
    let mut entries = Vec::with_capacity(header.entries.min(100_000));
    for (n, line) in lines.enumerate() {
        let entry: Entry = serde_json::from_str(line).map_err(|e| fail(n + 2, e.to_string()))?;
        let value = base64::engine::general_purpose::STANDARD
            .decode(&entry.value)
            .map_err(|e| fail(n + 2, e.to_string()))?;
        entries.push((entry.key, value));
    }
    if entries.len() != header.entries {
        let why = format!(
            "{} entries where the header says {}",
            entries.len(),
            header.entries
        );
        return Err(fail(entries.len() + 1, why));
    }
    Ok((header, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sled_backup_restores_whole_and_a_damaged_one_restores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::store::StoreConfig::Sled;
        let store = Store::open(&config, &dir.path().join("a"), "c")
            .await
            .unwrap();
        store
            .put_certificate(&crate::certificates::Issued {
                chain_pem: "chain".into(),
                key_pem: "key".into(),
                issued_at: 7,
                issuer: "ca".into(),
            })
            .await
            .unwrap();
        store
            .keep_reports("q1", vec![(5, b"{}".to_vec())], vec![])
            .await
            .unwrap();
        let secret = dir.path().join("node-secret");
        std::fs::write(&secret, [7u8; 32]).unwrap();
        let backup = make(&store, &secret, 7).await.unwrap();
        assert_eq!(backup.lines().count(), 4, "{backup}");

        let other = Store::open(&config, &dir.path().join("b"), "c")
            .await
            .unwrap();
        let damaged = backup.replacen("\"entries\":3", "\"entries\":4", 1);
        assert!(restore(&other, &damaged, None).await.is_err());
        assert!(other.dump().await.unwrap().is_empty(), "nothing restored");
        let restored_secret = dir.path().join("b-node-secret");
        let restored = restore(&other, &backup, Some(&restored_secret))
            .await
            .unwrap();
        assert_eq!(restored, 2);
        assert!(other.restored().await.unwrap().is_some(), "marked restored");
        assert_eq!(std::fs::read(&restored_secret).unwrap(), [7u8; 32]);
        assert_eq!(other.certificate().await.unwrap().unwrap().issued_at, 7);
        assert_eq!(
            other
                .reports_of("q1", crate::store::Report::Usage)
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(
            restore(&other, &backup, None).await.is_err(),
            "not into a full store"
        );
    }
}
