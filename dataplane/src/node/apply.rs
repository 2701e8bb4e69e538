//! What a running node does with each new config the control plane sends: new logins and SQS
//! keys, a rotated credential, the queue's initial settings and redrive, a certificate of its
//! own renewed or the cluster's fetched again, and the build the config names.

use super::certificate::OwnCertificate;
use super::report::{self, Reporter};
use crate::config::{desired_logins, desired_sqs_keys, Config};
use crate::control_plane::channel::{Apply, Channel};
use crate::state::Node;
use qe_shared::node_channel::{DesiredConfig, NodeTls};
use qe_tls::Certificate;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A running node's [`Apply`]: new logins; a rotated credential; a new certificate of its
/// own, or the cluster's renewed one, when the control plane asks.
pub struct NodeApply {
    node: Arc<Node>,
    channel: Channel,
    /// Told of a rotated credential too.
    reporter: Option<Reporter>,
    own_certificate: Option<OwnCertificate>,
    /// The cluster certificate in service, its files, and the generation last fetched.
    cluster: Option<(Arc<Certificate>, PathBuf, AtomicU64)>,
    /// Told which build the config names.
    upgrader: Option<super::upgrade::Upgrader>,
}

impl NodeApply {
    pub fn new(
        node: Arc<Node>,
        channel: Channel,
        reporter: Option<Reporter>,
        own_certificate: Option<OwnCertificate>,
        served: Option<Arc<Certificate>>,
        config: &Config,
        desired: &DesiredConfig,
    ) -> NodeApply {
        let cluster = match (&desired.tls, served) {
            (NodeTls::Cluster { generation }, Some(served)) => Some((
                served,
                config.data_dir.join("tls"),
                AtomicU64::new(*generation),
            )),
            _ => None,
        };
        NodeApply {
            node,
            channel,
            reporter,
            own_certificate,
            cluster,
            upgrader: None,
        }
    }

    /// Fetches the builds the configs name, with `upgrader`.
    pub fn upgrading_with(self, upgrader: super::upgrade::Upgrader) -> NodeApply {
        NodeApply {
            upgrader: Some(upgrader),
            ..self
        }
    }

    /// Fetches the cluster certificate again if `generation` is past the one fetched; one that
    /// cannot be had now is tried again with the next generation (the old one serves on).
    async fn refetch_cluster_certificate(&self, generation: u64) {
        let Some((served, dir, fetched)) = &self.cluster else {
            return;
        };
        if generation <= fetched.load(Ordering::Relaxed) {
            return;
        }
        let refetched = report::fetch_certificate(&self.channel.report_to(), dir)
            .await
            .map_err(|e| e.to_string())
            .and_then(|()| served.reload().map_err(|e| e.to_string()));
        match refetched {
            Ok(()) => {
                fetched.fetch_max(generation, Ordering::Relaxed);
            }
            Err(error) => tracing::warn!(%error, "the cluster certificate could not be fetched"),
        }
    }

    /// Takes on a rotated credential, for the channel and the reports alike.
    fn take_token(&self, token: &str) -> Result<(), String> {
        if self.channel.token() == token {
            return Ok(());
        }
        self.channel
            .take_token(token)
            .map_err(|e| format!("keeping the new credential: {e}"))?;
        self.node.console.rotate(token);
        if let Some(reporter) = &self.reporter {
            reporter.retarget(self.channel.report_to());
        }
        tracing::info!("the node's credential was rotated");
        Ok(())
    }
}

impl Apply for NodeApply {
    fn apply<'a>(
        &'a self,
        desired: &'a DesiredConfig,
    ) -> futures::future::BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            // The logins and the credential first: they must never wait for a CA.
            let logins = desired_logins(desired)?;
            if let Some(token) = &desired.node_token {
                self.take_token(token)?;
            }
            self.node.replace_logins(logins);
            if let Some(sqs) = &desired.sqs {
                self.node.replace_sqs_keys(desired_sqs_keys(&sqs.keys)?);
            }
            // After the keys: a revoked key must stop working even if the settings cannot
            // be saved now (they are tried again with the next config).
            if let Some(initial) = &desired.initial_settings {
                if let Err(error) = self.node.take_initial_settings(initial) {
                    tracing::warn!(%error, "the queue's initial settings were not taken");
                }
            }
            self.node.set_redrive(desired.redrive.clone());
            // The standby's key is taken at start: a node that started without it (its first
            // config came from a control plane that did not send it) starts again to take it,
            // rather than answer durability 2 on one disk for a queue that has two.
            if desired.replication.is_some() && self.node.standby.is_none() {
                tracing::warn!("the queue has a standby and this node started without one: stopping, to be started again with it");
                self.node.start_again.notify_one();
            }
            if let (Some(standby), Some(replication)) = (&self.node.standby, &desired.replication) {
                let after = replication.step_down_after_ms.map(Duration::from_millis);
                standby.shipping.step_down_after(after);
            }
            // A promoted copy may start before its new epoch is stored: it takes it now.
            let given_epoch = desired.replication.as_ref().and_then(|r| r.epoch);
            let epoch_kept = match (&self.node.standby, given_epoch) {
                (Some(standby), Some(given)) => standby.take_epoch(given),
                _ => Ok(()),
            };
            match (&self.own_certificate, &desired.tls) {
                (Some(own), NodeTls::Queue { generation, .. }) => {
                    own.renew_if_asked(*generation).await
                }
                (_, NodeTls::Cluster { generation }) => {
                    self.refetch_cluster_certificate(*generation).await
                }
                _ => {}
            }
            if let Some(upgrader) = &self.upgrader {
                upgrader.want(desired.build.as_ref());
            }
            // Not kept, the rest applied: it serves at the epoch it has (a standby given the
            // new one does not follow it meanwhile, the safe way), and the config is not
            // confirmed, so the channel applies it again.
            epoch_kept.map_err(|error| format!("the queue's epoch could not be kept: {error}"))
        })
    }
}
