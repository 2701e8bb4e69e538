//! SIGHUP: the config file read again (a rotated password, a control plane that moved), and
//! the control plane's certificate fetched again if the node serves that one.

use super::report::{self, Reporter};
use super::say;
use crate::config::Config;
use crate::state::Node;
use qe_tls::Certificate;

/// On SIGHUP, reads the config file again: the logins (a rotated password) and where the
/// control plane is (one that moved). Then fetches and loads the control plane's certificate
/// again if it serves that one (a renewal), and says so on stdout, where whoever started the
/// node watches for it.
pub(super) async fn reload_on_hangup(
    node: std::sync::Arc<Node>,
    config: Config,
    tls: Option<std::sync::Arc<Certificate>>,
    reporter: Option<Reporter>,
) {
    let kind = tokio::signal::unix::SignalKind::hangup();
    let mut hangups = tokio::signal::unix::signal(kind).expect("a SIGHUP handler");
    while hangups.recv().await.is_some() {
        let reread = config.reread();
        if let (
            Some(reporter),
            Ok(Config {
                report_to: Some(to),
                ..
            }),
        ) = (&reporter, &reread)
        {
            reporter.retarget(to.clone());
        }
        // A renewed cluster certificate: written to the files the TLS watcher reloads.
        if let (true, Some(reporter), Some(certificate)) =
            (config.tls_from_control_plane, &reporter, &tls)
        {
            let fetched =
                report::fetch_certificate(&reporter.to(), &config.data_dir.join("tls")).await;
            if let Err(error) = fetched
                .map_err(|e| e.to_string())
                .and_then(|()| certificate.reload().map_err(|e| e.to_string()))
            {
                tracing::warn!(%error, "the certificate could not be renewed");
            }
        }
        match reread {
            Ok(reread) => {
                node.replace_logins(reread.logins);
                say("logins reloaded");
            }
            Err(error) => tracing::warn!(%error, "logins not reloaded; the old ones stay"),
        }
    }
}
