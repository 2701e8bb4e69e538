//! A node started from a bootstrap whose config names it its queue's standby
//! ([`DesiredReplication::follow`]): the standby instance of a queue with `replicas: 2` on a
//! machine of its own. It serves nothing; it follows the primary the config names, with the
//! key the config gives (never in its user data), and follows anew when the config moves the
//! primary (a node placed again elsewhere). A config that no longer names it a standby (its
//! machine was promoted: it serves now) ends the following: the process starts again, as the
//! queue's node on its copy.

use crate::control_plane::channel::{self, Channel};
use crate::replication::standby::{self, StandbyConfig};
use qe_shared::backoff::Backoff;
use qe_shared::node_channel::{DesiredConfig, DesiredReplication, FollowPrimary};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// What a standby instance was told to follow, if its config names it one.
pub fn told_to_follow(desired: &DesiredConfig) -> Option<&FollowPrimary> {
    desired.replication.as_ref()?.follow.as_ref()
}

/// How following ended.
pub enum Followed {
    /// The disk failed (exit 1) or a config was wrong (exit 2).
    Ended(ExitCode),
    /// Its config no longer names it a standby: it is to start again as what it says now.
    Promoted,
}

/// Follows the primary `desired` names until the disk fails, a config is refused as wrong, or
/// a config no longer names it a standby.
pub async fn follow_as_told(
    channel: Channel,
    desired: DesiredConfig,
    data_dir: PathBuf,
) -> Followed {
    let mut desired = desired;
    loop {
        let (Some(follow), Some(replication)) = (told_to_follow(&desired), &desired.replication)
        else {
            tracing::warn!(
                version = desired.version,
                "its config names it the queue's node now"
            );
            return Followed::Promoted;
        };
        let config = match standby_config(follow, replication, &data_dir) {
            Ok(config) => config,
            Err(error) => {
                eprintln!("dataplane: the standby's config: {error}");
                return Followed::Ended(ExitCode::from(2));
            }
        };
        tracing::info!(primary = %config.primary, connect = ?config.connect, epoch = config.epoch, "a standby by its config");
        tokio::select! {
            stopped = standby::run(config) => {
                eprintln!("dataplane: the standby stops: {stopped}");
                return Followed::Ended(ExitCode::FAILURE);
            }
            // Dropped at an await: what it wrote is on the files (unsynced writes are read
            // back as after a crash when it opens them again).
            newer = moved(&channel, &desired, &data_dir) => desired = newer,
        }
    }
}

/// The next config that changes what this standby follows, or that makes it no standby.
async fn moved(channel: &Channel, desired: &DesiredConfig, data_dir: &Path) -> DesiredConfig {
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let mut after = desired.version;
    loop {
        match channel.desired(Some(after)).await {
            Ok(Some(newer)) => {
                // A rotated credential first: the node's use of it retires the old one.
                if let Some(token) = newer.node_token.as_deref() {
                    if token != channel.token() {
                        if let Err(error) = channel.take_token(token) {
                            let wait = backoff.next_wait();
                            tracing::warn!(%error, retry_in = ?wait, "the rotated credential could not be kept");
                            tokio::time::sleep(wait).await;
                            continue;
                        }
                        tracing::info!("the standby's credential was rotated");
                    }
                }
                if let Err(error) = channel::keep(data_dir, &newer) {
                    tracing::warn!(%error, "the config could not be kept");
                }
                if following(&newer) != following(desired) {
                    return newer;
                }
                after = newer.version;
                backoff.reset();
            }
            Ok(None) => backoff.reset(),
            Err(error) => {
                let wait = backoff.next_wait();
                tracing::warn!(%error, retry_in = ?wait, "watching the standby's config failed");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// What a config makes the standby follow, compared between two versions.
fn following(desired: &DesiredConfig) -> Option<(&FollowPrimary, Option<u64>)> {
    let replication = desired.replication.as_ref()?;
    Some((replication.follow.as_ref()?, replication.epoch))
}

fn standby_config(
    follow: &FollowPrimary,
    replication: &DesiredReplication,
    data_dir: &Path,
) -> Result<StandbyConfig, String> {
    let primary = match url::Url::parse(&follow.url) {
        Ok(url) if matches!(url.scheme(), "ws" | "wss") => url,
        _ => return Err(format!("{}: not a ws:// or wss:// address", follow.url)),
    };
    let roots = match &follow.ca_pem {
        Some(pem) => {
            let roots = qe_tls::roots_from_pem(pem);
            if roots.is_empty() {
                return Err("the primary's CA: no certificate".into());
            }
            roots
        }
        None => rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    Ok(StandbyConfig {
        primary,
        key: follow.key.clone(),
        data_dir: data_dir.to_path_buf(),
        roots,
        connect: follow.connect,
        epoch: replication.epoch.unwrap_or(0),
    })
}
